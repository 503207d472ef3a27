"""Where in the user's code something happened (torch-free; used by the child's probes).

A call site is the first frame of the user's code (`perfdoctor.usercode.is_user_file`: outside
torch, perfdoctor, installed packages and the standard library).
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
from typing import Any

from perfdoctor import usercode
from perfdoctor.contracts.run import Site
from perfdoctor.usercode import is_user_file


def user_frame(frame: Any) -> Any:
    """The first frame, from `frame` outwards, that is user code (None if there is none)."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def site_of(frame: Any, line: int | None = None) -> Site | None:
    """The frame's file, line (or `line`), source text and function."""
    if frame is None:
        return None
    fn = os.path.abspath(frame.f_code.co_filename)
    ln = line or frame.f_lineno or 0
    return Site(file=fn, line=ln, code=linecache.getline(fn, ln).strip(), function=frame.f_code.co_name)


def caller_site(depth: int = 1) -> Site | None:
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
    line = frame.f_lineno or 0
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
    """How the call at `frame` passed its keyword arguments (`perfdoctor.usercode.kwargs_style`)."""
    node = call_node_at(frame)
    return "literal" if node is None else usercode.kwargs_style(node)


_LOADER_FILES = ("torch/utils/data/", "torch\\utils\\data\\")
_MAX_LOADER_DEPTH = 60  # frames walked to see whether a line runs inside the DataLoader's fetch


def loader_frames(frame: Any) -> list[Any] | None:
    """The frames from `frame` up to the DataLoader's own (not included) where `frame` runs inside the
    DataLoader (a dataset's __getitem__, a collate_fn); None where it does not."""
    below: list[Any] = []
    f = frame
    while f is not None and len(below) < _MAX_LOADER_DEPTH:
        name = f.f_code.co_filename
        if any(p in name for p in _LOADER_FILES):
            return below
        below.append(f)
        f = f.f_back
    return None


def in_loader(frame: Any) -> bool:
    """Whether `frame` runs inside the DataLoader (a dataset's __getitem__, a collate_fn)."""
    return loader_frames(frame) is not None
