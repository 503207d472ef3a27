"""Where in the user's code something happened (torch-free; used by the child's probes).

A call site is the first frame outside torch, perfdoctor, site-packages and the standard library.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
import sysconfig
from typing import Any

_PERFDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _excluded_prefixes() -> tuple[str, ...]:
    dirs = {_PERFDOCTOR_DIR + os.sep}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.join(p, ""))
            dirs.add(os.path.join(os.path.realpath(p), ""))
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        dirs.add(os.path.dirname(os.path.abspath(torch_mod.__file__)) + os.sep)
    return tuple(dirs)


_prefixes: tuple[str, ...] | None = None
_user_cache: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """True for the user's own source files (not torch, perfdoctor, site-packages, stdlib)."""
    r = _user_cache.get(filename)
    if r is None:
        global _prefixes
        if _prefixes is None:
            _prefixes = _excluded_prefixes()
        fn = filename
        r = not (not fn or fn.startswith("<") or fn == "~" or "site-packages" in fn or "dist-packages" in fn
                 or fn.startswith(_prefixes) or os.path.abspath(fn).startswith(_prefixes))
        _user_cache[filename] = r
    return r


def reset_cache() -> None:
    global _prefixes
    _prefixes = None
    _user_cache.clear()


def user_frame(frame: Any) -> Any:
    """The first frame, from `frame` outwards, that is user code (None if there is none)."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def site_of(frame: Any, line: int | None = None) -> dict[str, Any] | None:
    if frame is None:
        return None
    fn = os.path.abspath(frame.f_code.co_filename)
    ln = line or frame.f_lineno or 0
    return {"file": fn, "line": ln, "code": linecache.getline(fn, ln).strip(),
            "function": frame.f_code.co_name}


def caller_site(depth: int = 1) -> dict[str, Any] | None:
    """The user call site of whoever called our probe."""
    return site_of(user_frame(sys._getframe(depth + 1)))


# -- AST helpers ---------------------------------------------------------------------------------

_ast_cache: dict[str, ast.Module | None] = {}


def file_ast(filename: str) -> ast.Module | None:
    if filename not in _ast_cache:
        try:
            _ast_cache[filename] = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            _ast_cache[filename] = None
    return _ast_cache[filename]


def code_ast(code: Any) -> ast.AST | None:
    """The AST node of a code object's function (the module for module-level code)."""
    tree = file_ast(code.co_filename)
    if tree is None or code.co_name == "<module>":
        return tree
    first = code.co_firstlineno
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lines = {node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))}
            if first in lines and getattr(node, "name", "<lambda>") == code.co_name:
                return node
    return None


def call_node_at(frame: Any) -> ast.Call | None:
    """The ast.Call the frame is executing (exact on 3.11+ via co_positions, else by line)."""
    tree = file_ast(frame.f_code.co_filename)
    if tree is None:
        return None
    pos = None
    if hasattr(frame.f_code, "co_positions") and frame.f_lasti >= 0:
        try:
            pos = list(frame.f_code.co_positions())[frame.f_lasti // 2]
        except (IndexError, ValueError):
            pos = None
    line = frame.f_lineno
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if pos and pos[0] is not None and pos[2] is not None:
            if (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset) == tuple(pos):
                return node
        elif node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or (node.lineno, -node.col_offset) >= (best.lineno, -best.col_offset):
                best = node
    return best


def kwargs_style(frame: Any) -> str:
    """How the call at `frame` passed its keyword arguments: literal, dict (**cfg) or mixed."""
    node = call_node_at(frame)
    if node is None:
        return "literal"
    star = any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args)
    named = any(k.arg is not None for k in node.keywords)
    if star and named:
        return "mixed"
    return "dict" if star else "literal"
