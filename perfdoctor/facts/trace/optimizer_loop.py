"""An optimizer step that runs tensor by tensor on a GPU (`foreach=False`, or torch's own fallback): its
update function, `torch/optim/<name>.py(N): _single_tensor_<name>` in the trace's Python frames, runs
each operator once per parameter tensor, and each of those ops launches its own kernels. The foreach
form (CUDA's default) runs each operator once over a group of tensors; the fused form once a step.

`optimizer_loop.saving_share`: the median over the profiled steps of the share of the step that the
per-tensor update spends on repeats, the update function's time times (N - D) / N, where N counts its
ops (the aten ops no other op encloses) and D the distinct operators among them: the ops a foreach step
would not run, with the Python between them. A share, not the profiled milliseconds (as anomaly's NaN
checks): the profiler inflates the update's many small ops and calls about as much as the rest of the
step. Each optimizer subject of the step's class built per tensor (`optimizer.foreach` False, not
fused) gets its class's share, split evenly where several are (`optimizer.loop_saving_share`): PD021's
saving. On the H200 (pd021's sample, six tensors, 60 ops of 8 operators a step): 0.22 of the profiled
step, 0.76 ms of the run's 3.5 ms step; `perfdoctor verify` measured 0.82 ms (90 % interval 0.20-1.46).

That share, a GPU trace only: on a CPU the per-tensor form is torch's default and launches nothing.

A hand-written optimizer (a class whose step is not torch.optim's own: no `torch/optim/<name>.py(N): step`
frame inside its `Optimizer.step#<class>.step` range, and a class name torch.optim does not have or a step
function outside torch seen inside that range: a repository's own RAdam) that
loops over its parameters runs the same way on any device: each profiled step of it shows its operators
repeated tensor by tensor (`hand_written_loops`). It is a per-tensor loop where its operators repeat
(the count most of those that repeat share in one optimizer step, `optimizer.loop_tensors`, is about
the tensors it loops over: some operators run twice a tensor), any `_foreach_*` / `_fused_*` op of it
runs about as often (one tensor a call: BertAdam clips each gradient alone), and it handles no sparse gradient (a coalesce, a
sparse tensor's values or indices): torch's foreach and fused forms take dense gradients only, so such an
optimizer (GRU4Rec's IndexedAdagradM, SparseAdam) has no foreach replacement. Its optimizer subject
(the construction of that class, facts/static/optimizer.py) gets `optimizer.loop_class`,
`optimizer.loop_ops_per_step` (its outermost ops per step), `optimizer.loop_repeats_per_step` (those
less one per operator and optimizer step: what one foreach op per operator would not launch) and
`optimizer.loop_tensors`; on a GPU trace its share of the step as above (`optimizer.loop_saving_share`).
A CPU run prices the repeats on the GPU the script targets (PD021's `gpu_share`, with target_gpu's
launch floor, which counts such an optimizer's ops one by one)."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from perfdoctor.facts.model import Subject
from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import outermost
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, PYFUNC, USER_ANN, Trace

UPDATE = re.compile(r"^torch/optim/\w+\.py\(\d+\): _single_tensor_\w+$")
STEP = "Optimizer.step#"  # `Optimizer.step#AdamW.step`: the class whose step encloses the update
# torch.optim's own step functions (not the Optimizer base class's wrappers, nor a scheduler's)
TORCH_STEP = re.compile(r"^torch/optim/(?!optimizer\.py|lr_scheduler\.py)\w+\.py\(\d+\): step$")
# a step function outside torch (`optimizers.py(39): step`, a repository's own RAdam)
USER_STEP = re.compile(r"^(?!torch/)\S+\.py\(\d+\): step$")
# the optimizers torch.optim has: a class of such a name is torch's unless the trace shows a step of the
# user's inside it (the profiler may record no Python frame of the step: srgan's Adam)
TORCH_OPTIMIZERS = frozenset({"Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS",
                              "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam"})
# ops that handle a sparse gradient: torch's foreach and fused optimizers take dense gradients only
SPARSE = re.compile(r"^aten::(coalesce|_coalesce|_values|_indices|values|indices|sparse_\w+|_sparse_\w+|"
                    r"_sparse_coo_tensor\w*|sparse_mask|to_dense)$")
MULTI = ("aten::_foreach_", "aten::_fused_")


@dataclass
class Loop:
    """A hand-written optimizer class's per-tensor loop, from its steps in the trace's step windows."""
    cls: str
    ops_per_step: float  # its outermost aten ops per training step
    repeats_per_step: float  # those less one per operator and optimizer step
    tensors: int  # the count its repeated operators share most in one optimizer step
    spans: list[tuple[float, float, int]]  # (start, end, track) of its optimizer steps


def _outer_ops(t: Trace, a: float, b: float, track: int, ops_by_track: dict[int, list[int]],
               starts: dict[int, list[float]]) -> list[int]:
    lst, at = ops_by_track.get(track, []), starts.get(track, [])
    inside = [i for i in lst[bisect_left(at, a):bisect_right(at, b)] if t.ts[i] + t.dur[i] <= b]
    return outermost(inside, t.ts, t.dur)


def _aten_by_track(t: Trace) -> tuple[dict[int, list[int]], dict[int, list[float]]]:
    aten = t.names_where(lambda s: s.startswith("aten::"))
    ops_by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        if t.name[i] in aten:
            ops_by_track[t.track[i]].append(i)
    starts: dict[int, list[float]] = {}
    for k, lst in ops_by_track.items():
        lst.sort(key=t.ts.__getitem__)
        starts[k] = [t.ts[i] for i in lst]
    return ops_by_track, starts


def hand_written_loops(t: Trace, windows: list[tuple[float, float]]) -> dict[str, Loop]:
    """The hand-written optimizer classes whose steps the trace shows looping over their parameters,
    by class (see the module's doc)."""
    steps = t.names_where(lambda s: s.startswith(STEP))
    if not steps or not windows:
        return {}
    ts, dur, name, track = t.ts, t.dur, t.name, t.track
    spans = [(ts[i], ts[i] + dur[i], track[i], t.strings[name[i]][len(STEP):].split(".", 1)[0])
             for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps]
    pyfuncs = t.indices(PYFUNC)
    torch_steps = t.names_where(TORCH_STEP.match)
    own = sorted(ts[i] for i in pyfuncs if name[i] in torch_steps)
    user_steps = t.names_where(USER_STEP.match)
    users = sorted(ts[i] for i in pyfuncs if name[i] in user_steps)
    ops_by_track, starts = _aten_by_track(t)
    rows: dict[str, list[tuple[float, float, int, Counter[int]]]] = defaultdict(list)
    for a, b, k, cls in spans:
        if bisect_left(own, a) < bisect_right(own, b):
            continue  # torch.optim's own step (its per-tensor form is PD021's static foreach=False)
        if cls in TORCH_OPTIMIZERS and not bisect_left(users, a) < bisect_right(users, b):
            continue  # torch's name and no step of the user's seen: torch's own, its frames not recorded
        rows[cls].append((a, b, k, Counter(name[i] for i in _outer_ops(t, a, b, k, ops_by_track, starts))))
    out: dict[str, Loop] = {}
    for cls, lst in rows.items():
        ops: Counter[int] = Counter()
        for *_, c in lst:
            ops.update(c)
        if not ops or any(SPARSE.match(t.strings[n]) for n in ops):
            continue
        # the count its repeated operators share most (the smaller on a tie): an op once per tensor
        counts = Counter(v for *_, c in lst for v in c.values() if v > 1)
        tensors = min(counts, key=lambda v: (-counts[v], v)) if counts else None
        if tensors is None:
            continue  # nothing repeats over the tensors: one op per operator (a foreach form)
        multi = [n for n in ops if t.strings[n].startswith(MULTI)]
        if any(max(c.get(n, 0) for *_, c in lst) < tensors / 2 for n in multi):
            continue  # a foreach or fused op over many tensors at once
        n_in = [sum(sum(c.values()) for a, _, _, c in lst if s <= a < e) for s, e in windows]
        r_in = [sum(sum(c.values()) - len(c) for a, _, _, c in lst if s <= a < e) for s, e in windows]
        ops_step, rep_step = median(n_in), median(r_in)
        if not ops_step or not rep_step:
            continue
        out[cls] = Loop(cls, ops_step, rep_step, tensors, [(a, b, k) for a, b, k, _ in lst])
    return out


def loops(ctx: TraceContext) -> dict[str, Loop]:
    """`hand_written_loops` of the context's trace over its CPU step windows, worked out once per trace
    (this family and target_gpu's launch floor both read it)."""
    if "hand_written_loops" not in ctx.derived:
        ctx.derived["hand_written_loops"] = hand_written_loops(ctx.trace, ctx.cpu_windows)
    found: dict[str, Loop] = ctx.derived["hand_written_loops"]
    return found


def _subjects_of(ctx: TraceContext, cls: str) -> list[Subject]:
    """The optimizer subjects built of `cls`: its constructions by name, else the one construction through
    a variable (`optim_class(model.parameters(), ...)`, a class a factory returned) where it is the only one."""
    mine = [s for s in ctx.facts.of_kind("optimizer") if _value(s, "optimizer.name") == cls]
    if mine:
        return mine
    through = [s for s in ctx.facts.of_kind("optimizer") if _value(s, "optimizer.custom") is True
               and _value(s, "optimizer.through_variable") is True]
    return through if len(through) == 1 else []


def _value(s: Subject, name: str) -> Any:
    f = s.facts.get(name)
    return None if f is None else f.value


def add_hand_written(ctx: TraceContext) -> None:
    """Each hand-written per-tensor optimizer's loop on the subjects built of its class (any device)."""
    for cls, loop in loops(ctx).items():
        for s in _subjects_of(ctx, cls):
            s.add("loop_class", cls, "str", SRC, "the class whose step the trace shows looping over its parameters")
            s.add("loop_ops_per_step", round(loop.ops_per_step, 1), "count", SRC,
                  f"{cls}.step's outermost aten ops per step, median over the profiled steps")
            s.add("loop_repeats_per_step", round(loop.repeats_per_step, 1), "count", SRC,
                  f"{cls}.step's ops per step less one per operator and optimizer step: the launches one foreach "
                  "op per operator would not make")
            s.add("loop_tensors", loop.tensors, "count", SRC,
                  f"the count most of {cls}.step's repeated operators share in one optimizer step: about the "
                  "parameter tensors it loops over")


def add(ctx: TraceContext) -> None:
    add_hand_written(ctx)
    if not ctx.gpu or not ctx.windows:
        return
    t = ctx.trace
    updates = t.names_where(UPDATE.match)
    looping = loops(ctx)
    if not updates and not looping:
        return
    ts, dur, name, track = t.ts, t.dur, t.name, t.track
    frames = sorted((i for i in t.indices(PYFUNC) if name[i] in updates), key=ts.__getitem__)
    steps = t.names_where(lambda s: s.startswith(STEP))
    spans = [(ts[i], ts[i] + dur[i], t.strings[name[i]][len(STEP):].split(".", 1)[0])
             for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps]
    ops_by_track, starts = _aten_by_track(t)
    # per class: (start, repeats' time) of each per-tensor update: torch's update frames, and the steps of
    # a hand-written class that loops
    updates_at = [(ts[f], ts[f] + dur[f], track[f], next((c for s, e, c in spans if s <= ts[f] and ts[f] + dur[f] <= e), ""))
                  for f in frames]
    updates_at += [(a, b, k, loop.cls) for loop in looping.values() for a, b, k in loop.spans]
    saved: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b, k, cls in updates_at:
        outer = _outer_ops(t, a, b, k, ops_by_track, starts)
        if not outer:
            continue
        n, d = len(outer), len(Counter(name[i] for i in outer))
        saved[cls].append((a, (b - a) * (n - d) / n))
    if not saved:
        return
    share: dict[str, float] = {}
    for cls, rows in saved.items():
        per = [sum(x for a, x in rows if s <= a < e) / ((e - s) or 1.0) for s, e in ctx.windows]
        m = median(per)
        if m is not None:
            share[cls] = m
    if not share:
        return
    total = sum(share.values())
    ctx.put("optimizer_loop.saving_share", total, "ratio",
            "share of the profiled step that a per-tensor optimizer update spends on repeating its operators "
            "tensor by tensor (" + ", ".join(f"{c or '?'} {v:.3f}" for c, v in sorted(share.items())) + ")")
    for cls, v in share.items():
        if cls in looping:
            mine = _subjects_of(ctx, cls)
        else:
            mine = [s for s in ctx.facts.of_kind("optimizer")
                    if _value(s, "optimizer.foreach") is False and not _value(s, "optimizer.fused")
                    and (not cls or _value(s, "optimizer.name") in (None, cls))]
        for s in mine:
            s.add("loop_saving_share", round(v / len(mine), 4), "ratio", SRC,
                  f"{cls or 'the'} step's per-tensor update: its repeated operators' share of the profiled step"
                  + (f", split over {len(mine)} such optimizers" if len(mine) > 1 else ""))
