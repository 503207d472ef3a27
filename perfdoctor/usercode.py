"""What counts as the user's own code, and how the user's code wrote a call (stdlib only).

One definition for every layer that asks: the capture child (call sites, the line sampler,
cProfile rows, py-spy frames, the user's imported modules) and the trace's Python stacks.

A file is the user's unless it belongs to torch, perfdoctor, an installed package or the standard
library. Two kinds of paths are judged:

- paths of this machine (the capture child's frames): excluded by where this interpreter keeps
  its standard library and packages (`sysconfig`), where perfdoctor lives, and where torch lives
  once it is imported;
- paths recorded elsewhere (a torch.profiler trace from another machine): excluded by their shape,
  since the other machine's folders are unknown: `site-packages` / `dist-packages`, a
  `/lib/python` or `/usr/lib` folder, a `/torch/` folder, and the short names torch.profiler
  gives to frames it knows the module of (`torch/nn/modules/module.py`, `threading.py`,
  `multiprocessing/queues.py`: their first part is torch, perfdoctor or a standard-library module).
"""

from __future__ import annotations

import ast
import os
import sys
import sysconfig

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
    torch_mod = sys.modules.get("torch")  # never imported here: only where the caller has it
    torch_file = getattr(torch_mod, "__file__", None) if torch_mod is not None else None
    if torch_file:
        dirs.add(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    return tuple(dirs)


def _judge(path: str) -> bool:
    global _prefixes
    if not path or path.startswith("<") or path == "~":  # <string>, <frozen ...>, cProfile's builtins
        return False
    if "site-packages" in path or "dist-packages" in path or "/lib/python" in path or "/torch/" in path:
        return False
    if not os.path.isabs(path):
        first = path.replace("\\", "/").split("/", 1)[0]
        if first in _SHORT_NOT_USER or first.removesuffix(".py") in sys.stdlib_module_names:
            return False
    if _prefixes is None:
        _prefixes = _excluded_prefixes()
    return not (path.startswith(_prefixes) or os.path.abspath(path).startswith(_prefixes))


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


def kwargs_style(call: ast.Call) -> str:
    """How a call passed its keyword arguments: `literal` (each written out), `dict` (only through
    `**cfg`) or `mixed` (both). Positional `*args` are not keyword arguments and do not count: the
    static read sees `DataLoader(*args)` as literal, and so does the capture."""
    star = any(k.arg is None for k in call.keywords)
    named = any(k.arg is not None for k in call.keywords)
    if star and named:
        return "mixed"
    return "dict" if star else "literal"
