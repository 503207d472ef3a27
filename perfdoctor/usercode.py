"""What counts as the user's own code, and how the user's code wrote a call (stdlib only).

One definition for every layer that asks: the capture child (call sites, the line sampler,
cProfile rows, py-spy frames, the user's imported modules) and the trace's Python stacks.

A file is the user's unless it belongs to torch, perfdoctor, an installed package or the standard
library. Two kinds of paths are judged:

- paths of this machine (the capture child's frames): excluded by where this interpreter keeps
  its standard library and packages (`sysconfig`), where perfdoctor lives, where torch lives
  once it is imported, and a package installed into another folder of sys.path (`pip install
  --target DIR` on PYTHONPATH: its distribution's metadata lies in that folder);
- paths recorded elsewhere (a torch.profiler trace from another machine): excluded by their shape,
  since the other machine's folders are unknown: `site-packages` / `dist-packages`, a
  `/lib/python` or `/usr/lib` folder, a `/torch/` folder (not for a file of this machine outside
  torch's own folder: a project may keep its code in a folder named `torch`, `PPO/torch/main.py`),
  and the short names torch.profiler
  gives to frames it knows the module of (`torch/nn/modules/module.py`, `threading.py`,
  `multiprocessing/queues.py`: their first part is torch, perfdoctor or a standard-library module).
"""

from __future__ import annotations

import ast
import os
import sys
import sysconfig
from pathlib import Path

_PERFDOCTOR_DIR = os.path.dirname(os.path.abspath(__file__))
_SHORT_NOT_USER = frozenset({"torch", "perfdoctor"})

_prefixes: tuple[str, ...] | None = None
_cache: dict[str, bool] = {}


def _excluded_prefixes() -> tuple[str, ...]:
    dirs = {_PERFDOCTOR_DIR + os.sep, "/usr/lib"}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.join(p, ""))
            dirs.add(os.path.join(os.path.realpath(p), ""))
    torch_dir = _torch_dir()
    if torch_dir:
        dirs.add(torch_dir)
    return tuple(dirs)


def _torch_dir() -> str | None:
    """The folder torch is installed in (with a trailing separator), from the imported module, else
    found without importing it (never imported here: only where the caller has it); None when none."""
    torch_mod = sys.modules.get("torch")
    torch_file = getattr(torch_mod, "__file__", None) if torch_mod is not None else None
    if not torch_file:
        try:
            from importlib.util import find_spec

            spec = find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        torch_file = spec.origin if spec is not None else None
    return os.path.dirname(os.path.abspath(torch_file)) + os.sep if torch_file else None


def _local_file_outside_torch(path: str) -> bool:
    """A file of this machine (the capture's frames, the files it ran) that is not in torch's own
    folder: judged by where things are installed here, not by the shape of a recorded path."""
    if not os.path.isabs(path) or not os.path.isfile(path):
        return False
    torch_dir = _torch_dir()
    real = os.path.realpath(path)
    return torch_dir is not None and not (path.startswith(torch_dir) or real.startswith(os.path.realpath(torch_dir)))


def _judge(path: str) -> bool:
    global _prefixes
    if not path or path.startswith("<") or path == "~":  # <string>, <frozen ...>, cProfile's builtins
        return False
    if "site-packages" in path or "dist-packages" in path or "/lib/python" in path:
        return False
    if "/torch/" in path and not _local_file_outside_torch(path):
        return False
    if not os.path.isabs(path):
        first = path.replace("\\", "/").split("/", 1)[0]
        if first in _SHORT_NOT_USER or first.removesuffix(".py") in sys.stdlib_module_names:
            return False
    if _prefixes is None:
        _prefixes = _excluded_prefixes()
    if path.startswith(_prefixes) or os.path.abspath(path).startswith(_prefixes):
        return False
    return not (os.path.isabs(path) and _in_installed_package(os.path.abspath(path)))


_installed: dict[str, frozenset[str]] = {}  # sys.path folder -> the top-level names pip installed there


def _in_installed_package(path: str) -> bool:
    """The file is part of a package that pip installed into a folder of sys.path other than the
    standard ones: `pip install --target DIR` on PYTHONPATH, a vendored site folder. Its top-level
    name is listed by a wheel's metadata in that same folder (`*.dist-info`): the user's own code on
    PYTHONPATH has none there, and a project installed in editable mode keeps its `*.dist-info` in
    site-packages (an old `setup.py develop` leaves `*.egg-info` in the source tree: not read)."""
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        if not path.startswith(folder + os.sep):
            continue
        top = path[len(folder) + 1:].split(os.sep, 1)[0]
        if top.removesuffix(".py") in _top_levels(folder):
            return True
    return False


def _top_levels(folder: str) -> frozenset[str]:
    got = _installed.get(folder)
    if got is None:
        names: set[str] = set()
        try:
            infos = [n for n in os.listdir(folder) if n.endswith(".dist-info")]
        except OSError:
            infos = []
        if infos:
            from importlib import metadata  # only for a folder that holds installed distributions

            for info in infos:
                dist = metadata.PathDistribution(Path(folder, info))
                top = dist.read_text("top_level.txt")
                if top:
                    names.update(t.strip() for t in top.splitlines() if t.strip())
                else:  # no top_level.txt: the first part of every installed file's path
                    names.update(f.parts[0].removesuffix(".py") for f in dist.files or ()
                                 if f.parts and not f.parts[0].endswith((".dist-info", ".egg-info", "..")))
        got = _installed[folder] = frozenset(names)
    return got


def is_user_file(path: str) -> bool:
    """True for the user's own source files (not torch, perfdoctor, installed packages, stdlib)."""
    r = _cache.get(path)
    if r is None:
        r = _cache[path] = _judge(path)
    return r


def reset_cache() -> None:
    """Judge again from now on: call it once torch is imported (its folder joins the excluded ones)."""
    global _prefixes
    _prefixes = None
    _cache.clear()
    _installed.clear()


def kwargs_style(call: ast.Call) -> str:
    """How a call passed its keyword arguments: `literal` (each written out), `dict` (only through
    `**cfg`) or `mixed` (both). Positional `*args` are not keyword arguments and do not count: the
    static read sees `DataLoader(*args)` as literal, and so does the capture."""
    star = any(k.arg is None for k in call.keywords)
    named = any(k.arg is not None for k in call.keywords)
    if star and named:
        return "mixed"
    return "dict" if star else "literal"
