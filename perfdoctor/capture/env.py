"""The machine a run ran on (meta.json `env`), and the user's files it imported."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import msgspec

from perfdoctor.contracts.run import Env
from perfdoctor.usercode import is_user_file


def _cpuinfo() -> tuple[str, bool]:
    model, amx = "", False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    amx = "amx_tile" in line.split()
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), amx


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def base_env() -> Env:
    """What is known without touching CUDA (the script may still set CUDA_VISIBLE_DEVICES)."""
    model, amx = _cpuinfo()
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    return Env(python=platform.python_version(), platform=platform.platform(), cpu_count=cpus, cpu_amx=amx,
               cpu_model=model, total_memory_bytes=total, cuda_available=False, device="cpu", device_name=model,
               device_count=0, device_capability=None, device_memory_bytes=None)


def cpu_share(usable: int | None, local_ranks: int | None) -> int | None:
    """The CPUs one rank of a distributed job can count on: where a launcher pinned it (its affinity
    is narrower than the machine), its own usable CPUs; else the node's, shared by its local ranks."""
    if usable is None:
        return None
    if not local_ranks or local_ranks < 2 or usable < (os.cpu_count() or usable):
        return usable
    return max(1, usable // local_ranks)


def collect_env(torch: Any) -> Env:
    """The full environment, at the end of the run."""
    env = base_env()
    env.torch = str(torch.__version__)
    env.rocm = bool(getattr(torch.version, "hip", None))
    env.free_memory_bytes = _meminfo("MemAvailable")
    try:
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env = msgspec.structs.replace(env, cuda_available=True, device="cuda", device_name=props.name,
                                          device_count=torch.cuda.device_count(),
                                          device_capability=[props.major, props.minor],
                                          device_memory_bytes=int(props.total_memory))
            if torch.cuda.is_initialized():
                free, _total = torch.cuda.mem_get_info()
                env.free_memory_bytes = int(free)
                env.device_peak_allocated_bytes = int(torch.cuda.max_memory_allocated())
    except Exception as e:  # noqa: BLE001 - a broken driver must not lose the run
        env.cuda_error = f"{type(e).__name__}: {e}"
    return env


def user_files(script: str | None, cwd: str | None, module: str | None = None) -> list[str]:
    """The script (or `-m` module) and the user's own modules it imported (files under its folder)."""
    root = os.path.dirname(os.path.abspath(script)) if script else os.path.abspath(cwd or os.getcwd())
    root = os.path.join(root, "")
    out = [os.path.abspath(script)] if script else []
    if module:
        try:
            import importlib.util

            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin and os.path.isfile(spec.origin):
                out.append(os.path.abspath(spec.origin))
        except (ImportError, ValueError):
            pass
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        if not os.path.isabs(f) or not os.path.isfile(f):  # torch's fake modules have bare names
            continue
        if f.startswith(root) and is_user_file(f) and f not in out:
            out.append(f)
    return out
