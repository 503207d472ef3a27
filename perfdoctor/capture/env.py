"""The machine a run ran on (meta.json `env`), and the user's files it imported."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import msgspec

from perfdoctor.contracts.run import DeviceInfo, Env
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


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`), None where
    there is none or it cannot be read. A container's limit is what runs out first, not the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # "max", or v1's "no limit" (a huge number)
            return int(text)
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
    limit = cgroup_memory_limit()
    if limit is not None and (total is None or limit < total):
        total = limit  # the container's limit: where the process runs out of memory
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


def collect_env(torch: Any, used: set[int] | None = None, peaks: dict[int, int] | None = None) -> Env:
    """The full environment, at the end of the run. `used`: the CUDA devices the process allocated
    on, `peaks` their highest step peaks (capture/clock.py `DeviceMemory`).

    The device is "cuda" only where the script initialised CUDA (a CPU script on a GPU machine is a
    CPU run). No CUDA context is created: properties are read without one, and free memory
    (`cudaMemGetInfo`, which needs a context on the device it asks) only on the devices the process
    allocated on, which have one already; never on device 0 for a rank that uses another.
    """
    env = base_env()
    env.torch = str(torch.__version__)
    env.backends = backend_flags(torch)
    env.rocm = bool(getattr(torch.version, "hip", None))
    env.free_memory_bytes = _meminfo("MemAvailable")
    used, peaks = used or set(), peaks or {}
    try:
        env.cuda_available = bool(torch.cuda.is_available())
        if env.cuda_available and torch.cuda.is_initialized():
            devices = []
            for d in sorted(used) or [int(torch.cuda.current_device())]:
                props = torch.cuda.get_device_properties(d)
                free = int(torch.cuda.mem_get_info(d)[0]) if d in used else None
                devices.append(DeviceInfo(index=d, name=props.name, capability=[props.major, props.minor],
                                          total_memory_bytes=int(props.total_memory), free_memory_bytes=free,
                                          peak_allocated_bytes=peaks.get(d)))
            first = devices[0]
            env = msgspec.structs.replace(env, device="cuda", device_name=first.name,
                                          device_count=int(torch.cuda.device_count()),
                                          device_capability=first.capability,
                                          device_memory_bytes=first.total_memory_bytes)
            env.devices = devices
            if first.free_memory_bytes is not None:
                env.free_memory_bytes = first.free_memory_bytes
    except Exception as e:  # noqa: BLE001 - a broken driver must not lose the run
        env.cuda_error = f"{type(e).__name__}: {e}"
    return env


# the flags a script (or a library it runs) sets for the GPU, readable on any build of torch
BACKEND_FLAGS = {
    "cudnn.benchmark": lambda torch: torch.backends.cudnn.benchmark,
    "cudnn.deterministic": lambda torch: torch.backends.cudnn.deterministic,
    "deterministic_algorithms": lambda torch: torch.are_deterministic_algorithms_enabled(),
}


def backend_flags(torch: Any) -> dict[str, bool]:
    """torch's backend flags as they are now (at the end of the run: as the script left them)."""
    out: dict[str, bool] = {}
    for name, read in BACKEND_FLAGS.items():
        try:
            out[name] = bool(read(torch))
        except Exception:  # noqa: BLE001 - an old or stripped torch: that flag is unknown
            continue
    return out


MATMUL_N = 512  # the CPU's matmul rate is measured on N x N fp32 matrices
MATMUL_S = 0.2  # for about this long


def cpu_matmul_flops(torch: Any) -> float | None:
    """The fp32 matmul FLOP/s this CPU reaches with torch's threads as the script left them: N x N
    matrices multiplied for about MATMUL_S seconds, after the script ended (the MFU's denominator on a
    CPU run: a rate measured here, not a datasheet peak). No random numbers: the script's RNG state is
    left as it was."""
    import time

    try:
        with torch.no_grad():
            a = torch.full((MATMUL_N, MATMUL_N), 0.5)
            b = torch.full((MATMUL_N, MATMUL_N), 0.25)
            torch.mm(a, b)
            n, t0 = 0, time.perf_counter()
            while True:
                torch.mm(a, b)
                n += 1
                dt = time.perf_counter() - t0
                if dt >= MATMUL_S:
                    return 2 * MATMUL_N ** 3 * n / dt
    except Exception:  # noqa: BLE001 - a measurement that fails is only left out
        return None


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
