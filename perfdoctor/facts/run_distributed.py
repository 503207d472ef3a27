"""The facts of a run that a distributed job needs: DistributedDataParallel (PD031-PD033), from the DDP
probe's records (`capture/probes/ddp.py`): one `ddp` subject per DDP construction site, and one
`ddp_sync` subject at the backward line of a DDP that all-reduced on several backward passes of one
optimizer step; and the causes beyond data, compute and host syncs that the rank table can name for
a straggler (`facts/trace/ranks.py`): the time in Python's garbage collector per step
(`capture/probes/gc_time.py`), the training thread's wait for a CPU and its CPU cgroup's throttling
(`capture/probes/cpu_wait.py`), and its GPU's clock and throttle reasons (`capture/probes/gpu_clock.py`)."""

from __future__ import annotations

import ast
import statistics
from typing import Any

from perfdoctor.contracts.run import DdpRecord, Probes
from perfdoctor.facts.model import Facts, site_subject


def ddp(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    idx = [int(x["i"]) for x in steady]
    for r in probes.ddp:
        s = site_subject(facts, "ddp", r.site)
        if s is None:
            continue
        s.add("module", r.module)
        if r.built_by:
            s.add("built_by", r.built_by)
        s.add("find_unused_parameters", r.find_unused_parameters)
        s.add("gradient_as_bucket_view", r.gradient_as_bucket_view)
        s.add("static_graph", r.static_graph)
        s.add("params", r.params, "count")
        s.add("grad_bytes", r.grad_bytes, "bytes")
        rows = {int(row[0]): row for row in r.by_step if len(row) >= 4}
        synced = [int(min(rows[i][1], rows[i][3])) if i in rows else 0 for i in idx]
        if not idx:
            continue
        s.add("synced_steps", sum(1 for n in synced if n), "count", detail=f"of {len(idx)} steady steps")
        if r.steps_checked:
            s.add("steps_checked", r.steps_checked, "count", detail="steps whose used map (all-reduced by DDP) was read")
            s.add("unused_steps", r.unused_steps, "count",
                  detail=f"steps with a parameter some of the {r.world_size} ranks did not use")
        if r.find_unused_parameters and not r.static_graph:
            walk = tuple(float(rows[i][2]) if i in rows else 0.0 for i in idx)
            s.add("traversal_ms", statistics.fmean(walk), "ms",
                  detail=f"DDP's _post_forward with find_unused_parameters, mean over {len(idx)} steady steps",
                  per_step=walk)
        _accumulation(facts, r, idx, rows, synced)


def gc_time(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """`gc.ms`: the mean time per steady step in Python's garbage collections (0 on a step without
    one); `gc.compute_ms`: the part of it inside forward, backward and the optimizer step."""
    rec = probes.gc_time
    if rec is None or not steady:
        return
    per = {int(row[0]): row for row in rec.ms_by_step if len(row) >= 4}
    series = tuple(float(per[int(x["i"])][1]) if int(x["i"]) in per else 0.0 for x in steady)
    inner = tuple(float(per[int(x["i"])][3]) if int(x["i"]) in per else 0.0 for x in steady)
    which = f"mean over {len(series)} steady steps, {sum(1 for v in series if v)} with a collection"
    facts.add("gc.ms", statistics.fmean(series), "ms", detail=which, per_step=series)
    facts.add("gc.compute_ms", statistics.fmean(inner), "ms", detail=which, per_step=inner)


# NVML's clock throttle reasons that slow a busy GPU down (nvmlClocksEventReasons): power and heat.
# The others (idle, application clocks, sync boost, display clock) are not a slowdown of its work.
GPU_THROTTLE_REASONS = ((0x4, "power cap"), (0x8, "hardware slowdown"), (0x20, "thermal (software)"),
                        (0x40, "thermal (hardware)"), (0x80, "power brake"))


def throttling(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """The CPU cgroup's quota (`cpu.throttled_ms`, `cpu.throttled_periods`, where cpu.stat was
    readable) and the GPU's clock (`gpu.sm_clock_mhz`, `gpu.throttled_share`, `gpu.throttle_reasons`,
    where NVML was) on the steady steps: a straggler rank's "CPU throttling" or "GPU throttling"."""
    w = probes.cpu_wait
    at = [int(x["i"]) - 1 for x in steady]
    if w is not None and w.cgroup and at and all(0 <= k < len(w.throttled_ms) for k in at):
        series = tuple(w.throttled_ms[k] for k in at)
        facts.add("cpu.throttled_ms", statistics.fmean(series), "ms",
                  detail=f"the CPU cgroup's throttled time (cpu.stat), mean over {len(at)} steady steps", per_step=series)
        if len(w.throttled_periods) == len(w.throttled_ms):
            facts.add("cpu.throttled_periods", statistics.fmean(w.throttled_periods[k] for k in at), "number",
                      detail=f"nr_throttled (cpu.stat), mean over {len(at)} steady steps")
    g = probes.gpu_clock
    if g is None or not g.by_step:
        return
    idx = {int(x["i"]) for x in steady}
    rows = [r for r in g.by_step if int(r[0]) in idx]
    which = f"{len(rows)} readings (NVML) at steady step ends"
    if not rows:  # readings a few times a second: a short run may have none on its steady steps
        rows, which = g.by_step, f"{len(g.by_step)} readings (NVML) at step ends, none on a steady step"
    facts.add("gpu.sm_clock_mhz", statistics.median(r[1] for r in rows), "number",
              detail=f"median of {which}" + (f", of at most {g.max_mhz:.0f} MHz" if g.max_mhz else ""))
    if g.max_mhz:
        facts.add("gpu.sm_clock_max_mhz", g.max_mhz, "number", detail="the device's maximum SM clock (NVML)")
    slow = [r for r in rows if int(r[2]) & sum(bit for bit, _ in GPU_THROTTLE_REASONS)]
    facts.add("gpu.throttled_share", len(slow) / len(rows), "ratio",
              detail=f"of {which}, those with a power or thermal clock throttle reason")
    seen = 0
    for r in slow:
        seen |= int(r[2])
    names = [name for bit, name in GPU_THROTTLE_REASONS if seen & bit]
    if names:
        facts.add("gpu.throttle_reasons", ", ".join(names), "str", detail=f"set on {len(slow)} of {which}")


def _accumulation(facts: Facts, r: DdpRecord, idx: list[int], rows: dict[int, list[float]], synced: list[int]) -> None:
    """`ddp_sync` at the backward line: the synchronising backward passes and all backward passes per
    optimizer step. Only for a run whose steps have more than one backward (gradient accumulation)."""
    backs = [int(rows[i][3]) if i in rows else 0 for i in idx]
    if not backs or statistics.median(backs) <= 1 or r.backward_site is None:
        return
    s = site_subject(facts, "ddp_sync", r.backward_site)
    if s is None:
        return
    s.add("syncs_per_step", statistics.median(synced), "count",
          detail=f"backward passes that all-reduced, median over {len(idx)} steady steps", per_step=tuple(synced))
    s.add("backwards_per_step", statistics.median(backs), "count", detail=f"median over {len(idx)} steady steps")
    if r.comm_ms is not None:
        over = f", {r.comm_overlap_ms:.2f} ms of it overlapped by backward compute" if r.comm_overlap_ms else ""
        s.add("comm_ms", r.comm_ms, "ms", detail=f"DDP's own timing of a backward's all-reduces{over}")
    s.add("model", _target(r.site.code if r.site else "") or "model")
    s.add("statement", r.backward_site.code)


def _target(code: str) -> str | None:
    """The name a `name = DDP(...)` statement assigns (`self.model` too), else None."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    stmt = tree.body[0] if len(tree.body) == 1 else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        t = stmt.targets[0]
    elif isinstance(stmt, ast.AnnAssign):
        t = stmt.target
    else:
        return None
    return ast.unparse(t) if isinstance(t, (ast.Name, ast.Attribute)) else None
