"""Selections whose size the device must report to the host, seen in a CPU run of a CUDA-targeting
script (PD008's `selection` subjects).

`x[mask]` and `x[mask] = y` with a boolean mask, `torch.nonzero`, `masked_select`, `torch.unique`:
the result's size depends on the values, so on CUDA the host waits for the device to count them (a
`cudaStreamSynchronize` each) before it can allocate the result, and the GPU then idles until the
next launch. A GPU trace counts those syncs itself (`sync.py`); a CPU run cannot, but its trace shows
the ops that would pay them: the aten ops `SYNC_OPS` (indexing with a boolean mask runs
`aten::nonzero`; `x[mask] = 0`, which torch turns into `masked_fill_`, runs none, and is not counted).
Counted per profiled step, outermost only (`masked_select` runs `nonzero` inside), at the user's
own frame (a library's, torchmetrics' `unique` under Lightning, is not the user's line to change), not in a
DataLoader's fetch or a batch source of the user's outside the modules it calls (`target_gpu.host_work`:
their tensors stay on the host on a GPU too), by the innermost user frame around the op.

The profiler names a frame by its function's first line. The line is the call in that function's
source to what the frame called (`torch.nonzero(...)`, `x.masked_select(...)`: `allocations.site`);
where no Python call stands between (indexing is no call), the function's subscripts with a boolean
mask (`mask_lines`: a comparison, `~m`, `m & n`, `.eq()`/`isnan()`/`.bool()`..., or a name the function
binds to one), every one a location; the function's first line where the source shows none.

One `selection` subject per line (a function's mask lines: one subject, each line a location): `ops`,
`count_per_step` (the mean over the profiled steps) and `step_share` (the share of them that ran one)."""

from __future__ import annotations

import ast
from bisect import bisect_right

from perfdoctor.facts import registry
from perfdoctor.facts.static.index.syntax import called_name
from perfdoctor.facts.trace.allocations import SourceCache, function_body, read_tree, site
from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import outermost
from perfdoctor.facts.trace.stacks import location
from perfdoctor.facts.trace.target_gpu import data_path_frames, host_work
from perfdoctor.model import Location
from perfdoctor.trace.model import CPU_OP

# the aten ops whose output size the device decides: on CUDA each waits for the device's count
SYNC_OPS = frozenset({"aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
                      "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
                      "aten::unique_dim_consecutive"})
# methods and functions whose result is a boolean tensor: a subscript with one selects by mask
_BOOL_CALLS = frozenset({"eq", "ne", "gt", "ge", "lt", "le", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
                         "logical_and", "logical_or", "logical_not", "logical_xor", "bool", "isin"})
MAX_SUBJECTS = 20


def add(ctx: TraceContext) -> None:
    facts = ctx.facts
    if ctx.gpu or not registry.derive("run.cuda_on_cpu", facts.value) or not ctx.cpu_windows:
        return  # a GPU trace counts the syncs themselves (sync.py); a CPU script's selections cost nothing
    t, windows = ctx.trace, ctx.cpu_windows
    ts, dur, name = t.ts, t.dur, t.name
    ops = t.names_where(SYNC_OPS.__contains__)
    if not ops:
        return
    on_host = host_work(ctx, data_path_frames(facts))
    by_track: dict[int, list[int]] = {}
    for i in t.indices(CPU_OP):
        if name[i] in ops:
            by_track.setdefault(t.track[i], []).append(i)
    starts = [a for a, _ in windows]
    sources: SourceCache = {}
    per_line: dict[str, tuple[list[Location], list[int], set[str]]] = {}  # key -> (locations, count per step, ops)
    for i in sorted((i for lst in by_track.values() for i in outermost(lst, ts, dur)), key=ts.__getitem__):
        w = bisect_right(starts, ts[i]) - 1
        if w < 0 or ts[i] >= windows[w][1]:
            continue  # outside the steps
        if on_host(ts[i]):
            continue  # the DataLoader's fetch or a batch source's: host work on a GPU too
        where = _locations(ctx, i, sources)
        if where is None:
            continue
        key, locs = where
        entry = per_line.setdefault(key, (locs, [0] * len(windows), set()))
        entry[1][w] += 1
        entry[2].add(t.strings[name[i]])
    n = len(windows)
    for key, (locs, counts, names) in sorted(per_line.items(), key=lambda kv: -sum(kv[1][1]))[:MAX_SUBJECTS]:
        s = facts.subject("selection", key)
        for loc in locs:
            if loc not in s.locations:
                s.locations.append(loc)
        s.add("ops", ", ".join(sorted(names)), "", SRC, "ops whose output size the device decides")
        s.add("count_per_step", sum(counts) / n, "count", SRC, f"mean over {n} profiled steps")
        s.add("step_share", sum(1 for c in counts if c) / n, "ratio", SRC,
              f"selected on {sum(1 for c in counts if c)} of {n} profiled steps")


def _locations(ctx: TraceContext, i: int, sources: SourceCache) -> tuple[str, list[Location]] | None:
    """The subject key and the locations of op i: the call that made it (`allocations.site`), or the
    mask subscripts of its function where no call stands between, else the function's first line."""
    found = site(ctx, i, sources)
    if found is None:
        return None
    key, loc, called, frame = found
    if called:
        return key, [loc]
    got = read_tree(frame[0], sources)
    lines = mask_lines(got[0], frame[1], frame[2]) if got is not None else []
    if not lines:
        return key, [loc]
    text = got[1] if got is not None else []
    locs = [Location(frame[0], ln, text[ln - 1].strip() if 0 < ln <= len(text) else "", frame[2]) for ln in lines]
    return location((frame[0], lines[0], frame[2]))[0], locs


def mask_lines(tree: ast.Module, first: int, func: str) -> list[int]:
    """The lines of the function `func` (first line `first`; the top level for `<module>`) that
    subscript with a boolean mask: a comparison or a boolean op (`x[y > 0]`, `x[~m]`, `x[m & n]`), a
    call that returns one (`x[y.eq(0)]`, `x[torch.isnan(y)]`), or a name the function binds to one
    (`mask = dist < distance; distance[mask] = dist[mask]`), alone or in a tuple of indices."""
    nodes = [n for b in function_body(tree, first, func) for n in ast.walk(b)]
    masks = {tgt.id for n in nodes if isinstance(n, ast.Assign) and _boolean(n.value, set())
             for tgt in n.targets if isinstance(tgt, ast.Name)}
    lines = set()
    for n in nodes:
        if isinstance(n, ast.Subscript):
            parts = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
            if any(_boolean(p, masks) for p in parts):
                lines.add(n.lineno)
    return sorted(lines)


def _boolean(e: ast.expr, masks: set[str]) -> bool:
    """An expression whose value is a boolean tensor, as far as its form says."""
    if isinstance(e, ast.Compare):
        return True
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Invert):
        return True  # `~m`: a mask's complement
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        return _boolean(e.left, masks) or _boolean(e.right, masks)
    if isinstance(e, ast.Call):
        called = called_name(e)
        return called in _BOOL_CALLS or called in ("type", "to") and any(
            isinstance(a, ast.Attribute) and a.attr == "bool" for a in e.args)  # `.type(torch.bool)`
    return isinstance(e, ast.Name) and e.id in masks
