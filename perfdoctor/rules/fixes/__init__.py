"""Fixes written against the user's own line.

`render_fix(kind, location, params)` reads the user's file, finds the statement that spans
`location.line` (libcst, with positions; a statement may span several lines), rewrites it and
returns `Fix(before, after, note)`: `before` is the statement exactly as written (with its
indentation), `after` the rewritten statement with the user's formatting kept where libcst
allows. When the code at that line does not match the pattern (the file changed, the line is
something else) it returns None: never a made-up fix.

One module per fix kind, named after it (`call_kwargs.py` is the kind "call-kwargs"), each with a
`fix(ctx, params)` function; `context.py` holds what they share. A fixer registers itself by being a
module of this package: `fix_kinds()` lists them without importing any (libcst takes about half a
second to import, and the rule catalog needs only the names), `render_fix` imports the one it runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from perfdoctor.model import Fix, Location

SHARED = frozenset({"context"})  # modules of this package that are not fixers


@lru_cache(maxsize=1)
def fix_kinds() -> tuple[str, ...]:
    """The kinds of perfdoctor's fixers, one per module of this package."""
    return tuple(sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__)
                        if m.name not in SHARED and not m.name.startswith("_")))


def apply_fix(source: str, fix: Fix, line: int | None = None) -> str | None:
    """`source` (the file the fix was rendered against) with the fix applied: its `before`, the
    statement exactly as written, replaced by `after` (a statement removed takes its line with it).
    Where the same text stands at several places (`logits = net(data)` in the training loop and in the
    evaluation after it), the one that holds the flagged `line` (1-based), else the nearest to it; the
    first without a line. None for an example fix, or where `before` is not in the source (the file
    changed)."""
    if fix.example or not fix.before:
        return None
    lines = source.splitlines(keepends=True)
    want = fix.before.splitlines()
    at = [i for i in range(len(lines) - len(want) + 1)
          if [l.rstrip("\r\n") for l in lines[i:i + len(want)]] == want]
    if not at:
        return None
    # the distance of the flagged line to each occurrence's lines (0 inside it)
    i = at[0] if line is None else min(at, key=lambda k: max(k + 1 - line, line - (k + len(want)), 0))
    end = lines[i + len(want) - 1][len(lines[i + len(want) - 1].rstrip("\r\n")):] or "\n"
    new = [l + end for l in fix.after.splitlines()]
    return "".join(lines[:i] + new + lines[i + len(want):])


def render_fix(kind: str, location: Location, params: dict) -> Fix | None:
    """The fix of `kind` rendered at `location`, or None when the code there does not match."""
    if kind not in fix_kinds():
        return None
    from perfdoctor.rules.fixes.context import render

    return render(importlib.import_module(f"{__name__}.{kind.replace('-', '_')}").fix, location, params)
