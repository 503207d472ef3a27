"""A loaded trace -> facts (source "trace"): step time and breakdown, GPU idle, syncs, copies,
matmul precision, communication, DataParallel, DataLoader wait, noise-free counters.

Everything is measured per step, then the median across steps is reported.
"""

from __future__ import annotations

import sys

import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from operator import itemgetter
from statistics import median
from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.trace.model import (CPU_OP, GPU_KINDS, KERNEL, MEMCPY, MEMSET, PYFUNC, RUNTIME,
                                    DRIVER, USER_ANN, Trace, gc_paused)
from perfdoctor.trace.steps import launch_map

SRC = "trace"
_COMM = re.compile(r"nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
                   r"|all_?to_?all|sendrecv|c10d::|gloo", re.IGNORECASE)
_MM = re.compile(r"gemm|gemv|conv|xmma|cutlass|884|1688|16816|matmul|cublas|xdlops|mfma|wgrad|dgrad|fprop", re.I)
_TENSOR_CORE = re.compile(r"884|1688|16816|xmma|hmma|tensorop|bf16|fp16|f16|tf32|h\d{3,4}gemm|i8816|wmma", re.I)
_FP32 = re.compile(r"sgemm|scudnn|convolve_sgemm|gemv2T|gemmSN|gemmk1|f32|fp32|float", re.I)
_SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "hipStreamSynchronize",
               "hipDeviceSynchronize", "hipEventSynchronize", "cudaMemcpy", "hipMemcpy", "cuStreamSynchronize",
               "cuCtxSynchronize"}
_FREE_CALLS = {"cudaFree", "hipFree", "cuMemFree", "cuMemFree_v2"}
_FACTORIES = {"aten::tensor", "aten::randn", "aten::rand", "aten::zeros", "aten::ones", "aten::arange", "aten::full",
              "aten::empty", "aten::randint", "aten::from_numpy", "aten::linspace", "aten::eye", "aten::scalar_tensor",
              "aten::lift_fresh", "aten::as_tensor"}
_CPU_MM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
           "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution")
_FRAME = re.compile(r"^(.*?)\((\d+)\): (.*)$")
_DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "int": 4, "long int": 8,
                "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1, "char": 1}
GPU_ORDER = ("gpu kernel", "memcpy", "memset", "communication", "runtime", "data loading", "cpu ops", "other")
CPU_ORDER = ("data loading", "optimizer", "backward", "forward", "cpu ops", "other")
_FACT_OF = {"gpu kernel": "step.gpu_kernel_ms", "memcpy": "step.memcpy_ms", "memset": "step.memset_ms",
            "communication": "step.comm_ms", "runtime": "step.runtime_ms", "data loading": "step.data_ms",
            "cpu ops": "step.cpu_ops_ms", "other": "step.other_ms", "forward": "step.forward_ms",
            "backward": "step.backward_ms", "optimizer": "step.optimizer_ms"}


# ---------------------------------------------------------------------- interval helpers
def _merge(iv: list[tuple[float, float]]) -> list[list[float]]:
    iv.sort()
    out: list[list[float]] = []
    append, last = out.append, None
    for s, e in iv:
        if last is not None and s <= last[1]:
            if e > last[1]:
                last[1] = e
        elif e > s:
            last = [s, e]
            append(last)
    return out


def _subtract(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Parts of disjoint sorted `a` not covered by disjoint sorted `b` (whose intervals may touch)."""
    out: list[list[float]] = []
    append, j, nb = out.append, 0, len(b)
    for s, e in a:
        while j < nb and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < nb:
            bs, be = b[k]
            if bs >= e:
                break
            if bs > cur:
                append([cur, bs])
            if be > cur:
                cur = be
            k += 1
        if cur < e:
            append([cur, e])
    return out


def _per_window(iv: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    """Length of disjoint sorted intervals inside each (sorted, disjoint) window."""
    starts = [s for s, _ in iv]
    n = len(iv)
    out = []
    for ws, we in windows:
        j, tot = max(bisect_right(starts, ws) - 1, 0), 0.0
        while j < n:
            s, e = iv[j]
            if s >= we:
                break
            d = (e if e < we else we) - (s if s > ws else ws)
            if d > 0:
                tot += d
            j += 1
        out.append(tot)
    return out


def _count_in(times: list[float], windows: list[tuple[float, float]]) -> list[int]:
    times = sorted(times)
    return [bisect_left(times, we) - bisect_left(times, ws) for ws, we in windows]


def _med(xs: list[float]) -> float | None:
    return float(median(xs)) if xs else None


# ---------------------------------------------------------------------- python stacks

def _is_stdlib(path: str) -> bool:
    """torch.profiler names standard-library frames by a short path (`threading.py`,
    `multiprocessing/queues.py`): its first part is a standard-library module."""
    first = path.replace("\\", "/").split("/", 1)[0]
    return first.removesuffix(".py") in sys.stdlib_module_names

class _Stacks:
    """The user's file:line for a CPU event, from python_function events or legacy `Call stack`."""

    def __init__(self, t: Trace):
        self.t = t
        self.by_track: dict[int, list[int]] = defaultdict(list)
        self.by_id: dict[int, int] = {}
        track, ext = t.track, t.ext
        for i in t.indices(PYFUNC):
            self.by_track[track[i]].append(i)
            self.by_id[ext[i]] = i
        for lst in self.by_track.values():
            lst.sort(key=t.ts.__getitem__)
        self.starts = {k: [t.ts[i] for i in v] for k, v in self.by_track.items()}
        self._named: dict[int, tuple[str, int, str] | None] = {}  # string index -> user_frame
        self._legacy: dict[int, tuple[tuple[str, int, str], int] | None] = {}  # call stack index -> frame

    def named_frame(self, si: int) -> tuple[str, int, str] | None:
        """user_frame of t.strings[si], cached (the same frames and stacks repeat every step)."""
        u = self._named.get(si, 0)
        if u == 0:
            u = self._named[si] = self.user_frame(self.t.strings[si])
        return u

    @staticmethod
    def user_frame(frame: str) -> tuple[str, int, str] | None:
        m = _FRAME.match(frame.strip())
        if not m:
            return None
        f = m.group(1)
        if (f.startswith(("torch/", "perfdoctor/", "<", "/usr/lib")) or "site-packages" in f or "dist-packages" in f
                or "/lib/python" in f or "/torch/" in f or _is_stdlib(f)):
            return None
        return f, int(m.group(2)), m.group(3)

    def frame(self, i: int) -> tuple[tuple[str, int, str], int] | None:
        """(file, line, function) of the innermost user frame around event i, and an id of that
        frame's invocation (python event index, or -1 for legacy call stacks)."""
        t = self.t
        cs = t.call_stack.get(i)
        if cs is not None:
            if cs not in self._legacy:
                self._legacy[cs] = next(((u, -1) for fr in t.strings[cs].split(";") if (u := self.user_frame(fr))),
                                        None)
            return self._legacy[cs]
        lst = self.by_track.get(t.track[i])
        if not lst:
            return None
        ts = t.ts[i]
        j = bisect_right(self.starts[t.track[i]], ts) - 1
        for _ in range(5000):  # the latest-starting python event that contains ts is the innermost
            if j < 0:
                return None
            p = lst[j]
            if t.ts[p] + t.dur[p] >= ts:
                break
            j -= 1
        else:
            return None
        while p is not None:
            u = self.named_frame(t.name[p])
            if u:
                return u, p
            p = self.by_id.get(t.corr[p])
        return None


def _loc(u: tuple[str, int, str]) -> tuple[str, Location]:
    return f"{u[0]}:{u[1]}", Location(file=u[0], line=u[1], function=u[2])


# ---------------------------------------------------------------------- main entry
def add_trace_facts(trace: Trace, facts: Facts) -> dict[str, Any]:
    """Measure the trace, add facts (source "trace", never overwriting), return the summary dict."""
    with gc_paused():
        return _add_trace_facts(trace, facts)


def _add_trace_facts(t: Trace, facts: Facts) -> dict[str, Any]:

    def put(name: str, value: Any, unit: str = "", detail: str = "") -> None:
        if value is not None and name not in facts:
            facts.add(name, round(value, 4) if isinstance(value, float) else value, unit, SRC, detail)

    name, ts, dur, strings = t.name, t.ts, t.dur, t.strings
    windows = [(s, e) for _, s, e in t.steps]
    nsteps = len(windows)
    step_ms = [(e - s) / 1000 for s, e in windows]
    dev_type = t.device_type
    gpu = dev_type != "cpu" and t.has_gpu_events
    launches = launch_map(t) if gpu else {}
    stacks = _Stacks(t)
    comm_name = {}

    def is_comm(ni: int) -> bool:
        v = comm_name.get(ni)
        if v is None:
            v = comm_name[ni] = bool(_COMM.search(strings[ni]))
        return v

    # -- collect intervals per category (kind by kind; names classified once each) --------
    cats: dict[str, list[tuple[float, float]]] = defaultdict(list)
    gpu_ev = t.indices(*GPU_KINDS)
    main_track = _main_track(t)
    track = t.track

    def spans(idx: list[int]) -> list[tuple[float, float]]:
        return [(ts[i], ts[i] + dur[i]) for i in idx]

    kernels = t.indices(KERNEL)
    cats["communication"] = spans([i for i in kernels if is_comm(name[i])])
    cats["gpu kernel"] = spans([i for i in kernels if not is_comm(name[i])])
    cats["memcpy"] = spans(t.indices(MEMCPY))
    cats["memset"] = spans(t.indices(MEMSET))
    cats["runtime"] = spans(t.indices(RUNTIME, DRIVER))
    for k in (USER_ANN, CPU_OP, PYFUNC):
        idx = t.indices(k)
        keys = [name[i] * 2 + (track[i] == main_track) for i in idx]  # name index * 2 + (on the main track)
        cat_of = {key: _cpu_category(k, strings[key >> 1], bool(key & 1)) for key in dict.fromkeys(keys)}
        found = [c for c in dict.fromkeys(cat_of.values()) if c is not None]
        if len(found) == 1 and len(cat_of) == 1:
            cats[found[0]] += spans(idx)
        elif found:
            of = [cat_of[key] for key in keys]
            for c in found:
                cats[c] += [(ts[i], ts[i] + dur[i]) for i, ci in zip(idx, of) if ci == c]
    order = GPU_ORDER if gpu else CPU_ORDER
    covered: list[list[float]] = []
    per_cat: dict[str, list[float]] = {}
    for c in order[:-1]:
        if gpu and c in ("optimizer", "backward", "forward"):
            continue
        own = _subtract(_merge(cats.get(c, [])), covered)
        per_cat[c] = _per_window(own, windows)
        # own and covered are disjoint: sorting the two runs by start (linear for timsort) keeps covered
        # disjoint and sorted, as _subtract needs (touching intervals need not be joined)
        covered = sorted(covered + own, key=itemgetter(0))
    in_cats = [sum(v[j] for v in per_cat.values()) / 1000 for j in range(nsteps)]
    per_cat["other"] = [max(0.0, step_ms[j] * 1000 - in_cats[j] * 1000) for j in range(nsteps)]
    # medians per category, rescaled so that they add up to the median step
    step_med = _med(step_ms) or 0.0
    med = {c: (_med(v) or 0.0) / 1000 for c, v in per_cat.items()}
    known = sum(v for c, v in med.items() if c != "other")
    if known > step_med > 0:
        med = {c: v * step_med / known for c, v in med.items()}
        med["other"] = 0.0
    else:
        med["other"] = step_med - known
    breakdown = [{"category": c, "ms": round(med[c], 3), "fraction": round(med[c] / step_med, 4) if step_med else 0.0}
                 for c in order if c in med and med[c] > 0]

    # -- global step facts ---------------------------------------------------------------
    clock = {"profiler-step": "profiler-step", "annotation": "annotation"}.get(t.step_source, "whole-run")
    put("run.steps_profiled", nsteps, "count", f"steps in the trace ({t.step_source})")
    put("run.step_clock", clock)
    if step_ms:
        put("step.time_ms", step_med, "ms", "median step (CPU span + the GPU work it launched)")
        put("step.time_p90_ms", _pctl(step_ms, 0.9), "ms")
    for c, v in med.items():
        if c in _FACT_OF and (c in per_cat):
            put(_FACT_OF[c], v, "ms", "median per step, each microsecond counted once in priority order")

    # -- device ---------------------------------------------------------------------------
    put("device.type", dev_type)
    if t.device_properties:
        p = t.device_properties[0]
        put("device.name", str(p.get("name", "")) or None)
        put("device.count", len(t.device_properties), "count", "deviceProperties entries")
        cap = None
        if isinstance(p.get("computeMajor"), int) and isinstance(p.get("computeMinor"), int):
            cap = float(f"{p['computeMajor']}.{p['computeMinor']}")
        put("device.capability", cap)
        if isinstance(p.get("totalGlobalMem"), int):
            put("device.memory_bytes", p["totalGlobalMem"], "bytes")
        if cap is not None:
            put("device.amp_available", cap >= 7.0 if dev_type == "cuda" else cap >= 9.0)

    summary_extra: dict[str, Any] = {}
    if gpu:
        summary_extra.update(_gpu_facts(t, put, windows, step_ms, gpu_ev, launches, is_comm))
    cpu_w = t.cpu_steps or windows  # counts of CPU-side events go by the steps' CPU spans
    data_us = _per_window(_merge(list(cats.get("data loading", []))), cpu_w)
    _sync_facts(t, facts, put, cpu_w, stacks, gpu, launches)
    _matmul_facts(t, put, windows, gpu, gpu_ev)
    _comm_facts(t, put, cpu_w, gpu, gpu_ev, is_comm)
    _dataparallel(t, facts)
    _dataloader(t, facts, put, windows, step_ms, data_us, stacks)
    _counters(t, put, cpu_w, launches)

    return {
        "steps_observed": nsteps + (1 if t.dropped_last_step else 0),
        "steps_profiled": nsteps,
        "step_clock": clock,
        "step_time_ms": {"median": round(step_med, 3), "p90": round(_pctl(step_ms, 0.9), 3) if step_ms else 0.0,
                         "mean": round(sum(step_ms) / nsteps, 3) if nsteps else 0.0,
                         "min": round(min(step_ms), 3) if step_ms else 0.0,
                         "max": round(max(step_ms), 3) if step_ms else 0.0, "n": nsteps},
        "breakdown": breakdown,
        # each step's time, for the charts (the shape of run_facts.step_series: every step of a trace
        # is profiled and every one counts in the statistics)
        "step_series": {"ms": [round(v, 3) for v in step_ms], "steady": [[1, nsteps]] if nsteps else [],
                        "window": None},
        **summary_extra,
    }


def _cpu_category(k: int, nm: str, on_main: bool) -> str | None:
    """The breakdown category of a CPU-side event (annotation, op, python function), or None."""
    if nm.startswith("ProfilerStep#"):
        return None
    if nm.startswith("enumerate(DataLoader)"):
        return "data loading"
    if nm.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) or nm == "## optimizer ##":
        return "optimizer"
    if nm.startswith("autograd::engine::evaluate_function") or nm == "## backward ##" or (
            k == CPU_OP and not on_main and nm.startswith("autograd::")):
        return "backward"
    if nm == "## forward ##" or (k == PYFUNC and nm.startswith("nn.Module:") and on_main):
        return "forward"
    return "cpu ops" if k == CPU_OP else None


def _pctl(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _main_track(t: Trace) -> int:
    """The CPU track with the ProfilerStep (else the most CPU ops)."""
    ops = t.indices(CPU_OP, USER_ANN)
    steps = t.names_where(lambda s: s.startswith("ProfilerStep#"))
    name, track = t.name, t.track
    first = next((i for i in ops if name[i] in steps), None)
    if first is not None:
        return track[first]
    counts = Counter(track[i] for i in ops)  # ties: the track seen first, as max() keeps the first
    return max(counts, key=counts.get) if counts else -1


def _gpu_facts(t, put, windows, step_ms, gpu_ev, launches, is_comm) -> dict[str, Any]:
    """GPU utilization and idle split: host wait (the next GPU event was launched after the gap
    began) vs gaps between kernels (launched in time, waiting on something else)."""
    ts, dur, corr = t.ts, t.dur, t.corr
    evs = sorted(gpu_ev, key=ts.__getitem__)
    blocks: list[list[float]] = []  # [start, end, launch ts of the block's first event]
    for i in evs:
        s, e = ts[i], ts[i] + dur[i]
        if blocks and s <= blocks[-1][1]:
            if e > blocks[-1][1]:
                blocks[-1][1] = e
        else:
            r = launches.get(corr[i])
            blocks.append([s, e, t.ts[r] if r is not None else s])
    busy, host, gap, util = [], [], [], []
    starts = [b[0] for b in blocks]
    for (ws, we), sm in zip(windows, step_ms):
        j = max(bisect_right(starts, ws) - 1, 0)
        cur, b_ms, h_ms, g_ms = ws, 0.0, 0.0, 0.0
        while j < len(blocks) and blocks[j][0] < we:
            s, e, launched = blocks[j]
            if e > ws:
                s2 = max(s, ws)
                if s2 > cur:
                    if launched > cur:
                        h_ms += s2 - cur
                    else:
                        g_ms += s2 - cur
                b_ms += min(e, we) - s2
                cur = max(cur, min(e, we))
            j += 1
        if we > cur:  # tail of the step with nothing on the GPU: the host has not launched more
            h_ms += we - cur
        busy.append(b_ms / 1000)
        host.append(h_ms / 1000)
        gap.append(g_ms / 1000)
        util.append(b_ms / 1000 / sm if sm else 0.0)
    if not windows:
        return {}
    idle = [sm - b for sm, b in zip(step_ms, busy)]
    put("gpu.utilization", _med(util), "ratio", "GPU busy (kernels, copies, memsets) / step")
    put("step.idle_ms", _med(idle), "ms", "GPU idle per step")
    put("gpu.idle_host_wait_ms", _med(host), "ms", "GPU idle while the next work was not launched yet")
    put("gpu.idle_gap_ms", _med(gap), "ms", "GPU idle although the next work was already launched")
    tot_idle = sum(host) + sum(gap)
    return {"gpu": {"utilization": round(_med(util), 4), "idle_ms": round(_med(idle), 3),
                    "idle_host_wait_fraction": round(sum(host) / tot_idle, 4) if tot_idle else 0.0}}


def _sync_facts(t, facts, put, windows, stacks, gpu, launches) -> None:
    if not gpu:
        return
    name, strings, ts, dur = t.name, t.strings, t.ts, t.dur
    sync_ts, sync_ms, free_ts, h2d, h2d_pageable, h2d_ms, h2d_pg_ms = [], 0.0, [], [], [], 0.0, 0.0
    sites: dict[str, list] = {}
    sync_names = t.names_where(_SYNC_CALLS.__contains__)
    free_names = t.names_where(_FREE_CALLS.__contains__)
    starts = [a for a, _ in windows]
    for i in t.indices(RUNTIME, DRIVER):
        if name[i] in sync_names:
            j = bisect_right(starts, ts[i]) - 1
            if j < 0 or ts[i] >= windows[j][1]:  # not inside a step
                continue
            sync_ts.append(ts[i])
            sync_ms += dur[i]
            u = stacks.frame(i)
            if u:
                key, loc = _loc(u[0])
                sites.setdefault(key, [loc, 0, 0.0])
                sites[key][1] += 1
                sites[key][2] += dur[i]
        elif name[i] in free_names:
            free_ts.append(ts[i])
    htod = t.names_where(lambda s: "HtoD" in s)
    for i in t.indices(MEMCPY):
        if name[i] in htod:
            nm = strings[name[i]]
            r = launches.get(t.corr[i])
            when = ts[r] if r is not None else ts[i]
            h2d.append(when)
            h2d_ms += dur[i]
            if "Pageable" in nm:
                h2d_pageable.append(when)
                h2d_pg_ms += dur[i]
    lsd_names = t.names_where("aten::_local_scalar_dense".__eq__)
    lsd = [i for i in t.indices(CPU_OP) if name[i] in lsd_names]
    # an .item() whose sync call the trace did not record (blocklisted runtime) still syncs
    st = sorted(sync_ts)
    for i in lsd:
        if bisect_left(st, ts[i]) == bisect_right(st, ts[i] + dur[i]):
            sync_ts.append(ts[i])
    ns = max(len(windows), 1)
    put("sync.count_per_step", _med(_count_in(sync_ts, windows)), "count", "host-device syncs per step")
    put("sync.ms", sync_ms / 1000 / ns, "ms", "time the CPU spent blocked in sync calls, per step")
    for key, (loc, cnt, ms) in sites.items():
        s = facts.subject("sync", key)
        s.locations.append(loc) if loc not in s.locations else None
        s.add("count_per_step", cnt / ns, "count", SRC)
        s.add("ms", ms / 1000 / ns, "ms", SRC)
    put("copies.h2d_per_step", _med(_count_in(h2d, windows)), "count")
    put("copies.h2d_pageable_per_step", _med(_count_in(h2d_pageable, windows)), "count")
    put("copies.h2d_ms", h2d_ms / 1000 / ns, "ms")
    put("copies.h2d_pageable_ms", h2d_pg_ms / 1000 / ns, "ms")
    put("empty_cache.free_calls_per_step", _med(_count_in(free_ts, windows)), "count", "cudaFree/hipFree calls")
    _cpu_to_device(t, facts, windows, stacks, launches, ns)
    _empty_cache(t, facts, windows, stacks, ns, len(free_ts))


def _cpu_to_device(t, facts, windows, stacks, launches, ns) -> None:
    """A tensor made by a CPU factory op, then copied HtoD from the same python frame."""
    name, strings = t.name, t.strings
    factory_frames: dict[Any, str] = {}
    factories = t.names_where(_FACTORIES.__contains__)
    cpu_ops = t.indices(CPU_OP)
    for i in cpu_ops:
        if name[i] in factories:
            u = stacks.frame(i)
            if u:
                factory_frames[(u[1], u[0][:2]) if u[1] >= 0 else u[0][:2]] = strings[name[i]]
    if not factory_frames:
        return
    cpu_ops_by_track: dict[int, list[int]] = defaultdict(list)
    for i in cpu_ops:
        cpu_ops_by_track[t.track[i]].append(i)
    op_starts = {k: [t.ts[i] for i in v] for k, v in cpu_ops_by_track.items()}  # already in ts order
    htod = t.names_where(lambda s: "HtoD" in s)
    for i in t.indices(MEMCPY):
        if name[i] not in htod:
            continue
        r = launches.get(t.corr[i])
        if r is None:
            continue
        u = stacks.frame(r) if t.call_stack.get(r) is not None or stacks.by_track else None
        if u is None:  # legacy: the stack is on the innermost cpu op around the runtime call
            ops = cpu_ops_by_track.get(t.track[r], [])
            k = bisect_right(op_starts.get(t.track[r], []), t.ts[r]) - 1
            while k >= 0 and u is None and k > len(ops) - 10_000_000:
                j = ops[k]
                if t.ts[r] <= t.ts[j] + t.dur[j] and j in t.call_stack:
                    u = stacks.frame(j)
                k -= 1
                if k >= 0 and t.ts[r] - t.ts[ops[k]] > 1e6:  # no op runs longer than a second here
                    break
        if u is None:
            continue
        fk = (u[1], u[0][:2]) if u[1] >= 0 else u[0][:2]
        if fk in factory_frames:
            key, loc = _loc(u[0])
            s = facts.subject("cpu_to_device", key)
            if loc not in s.locations:
                s.locations.append(loc)
            s.add("factory", factory_frames[fk], "", SRC)
            s.add("target", "cuda", "", SRC)
            s.add("in_loop", True, "", SRC)
            prev = s.facts.get("cpu_to_device.ms")
            s.add("ms", (prev.value if prev else 0.0) + t.dur[i] / 1000 / ns, "ms", SRC)


def _empty_cache(t, facts, windows, stacks, ns, frees) -> None:
    calls = t.names_where(lambda s: s.endswith(": empty_cache"))
    for i in t.indices(PYFUNC):
        if t.name[i] in calls:
            p = stacks.by_id.get(t.corr[i])
            u = stacks.user_frame(t.strings[t.name[p]]) if p is not None else None
            key, loc = _loc(u) if u else ("trace:empty_cache", None)
            s = facts.subject("empty_cache", key)
            if loc and loc not in s.locations:
                s.locations.append(loc)
            prev = s.facts.get("empty_cache.calls_per_step")
            s.add("calls_per_step", (prev.value if prev else 0.0) + 1 / ns, "count", SRC)
            s.add("in_loop", any(a <= t.ts[i] <= b for a, b in windows), "", SRC)
            s.add("free_calls_per_step", frees / ns, "count", SRC)


def _matmul_facts(t, put, windows, gpu, gpu_ev) -> None:
    strings, name, dur = t.strings, t.name, t.dur
    ns = max(len(windows), 1)
    mm = fp32 = 0.0
    if gpu:
        cache: dict[int, tuple[bool, bool]] = {}
        for i in gpu_ev:
            if t.kind[i] != KERNEL:
                continue
            c = cache.get(name[i])
            if c is None:
                nm = strings[name[i]]
                is_mm = bool(_MM.search(nm)) and not _COMM.search(nm)
                c = cache[name[i]] = (is_mm, is_mm and bool(_FP32.search(nm)) and not _TENSOR_CORE.search(nm))
            if c[0]:
                mm += dur[i]
                if c[1]:
                    fp32 += dur[i]
    else:  # CPU trace: the ops' recorded input types
        for i in t.shapes:
            if strings[name[i]] in _CPU_MM and t.kind[i] == CPU_OP:
                types = t.shape(i)[0]
                mm += dur[i]
                if types and types[0] == "float":
                    fp32 += dur[i]
    if mm > 0:
        put("matmul.ms", mm / 1000 / ns, "ms", "GEMM/conv time per step")
        put("matmul.fp32_share", fp32 / mm, "ratio", "fp32 (no tensor core) share of GEMM/conv time")


def _comm_facts(t, put, windows, gpu, gpu_ev, is_comm) -> None:
    ns = max(len(windows), 1)
    comm, compute = [], []
    for i in gpu_ev:
        if t.kind[i] == KERNEL:
            (comm if is_comm(t.name[i]) else compute).append((t.ts[i], t.ts[i] + t.dur[i], t.stream[i]))
    ar_ts: dict[str, list[float]] = defaultdict(list)
    sizes = []
    ar_names = t.names_where(lambda s: "all_reduce" in s.lower() or "allreduce" in s.lower())
    ops = [i for i in t.indices(CPU_OP, USER_ANN) if t.name[i] in ar_names]
    ops += [i for i, c in t.comm.items() if t.name[i] not in ar_names and "all_reduce" in str(c.get("collective"))]
    for i in ops:  # all-reduce ops (t.comm holds cpu ops and annotations only)
        nm = t.strings[t.name[i]].lower()
        c = t.comm.get(i)
        group = nm.split(":")[0]
        ar_ts[group].append(t.ts[i])
        sh = t.shape(i)
        if c and c.get("in_nelems"):
            sizes.append(c["in_nelems"] * _DTYPE_BYTES.get(str(c.get("dtype")), 4))
        elif sh[1] and isinstance(sh[1][0], list) and all(isinstance(d, int) for d in sh[1][0]):
            nel = 1
            for d in sh[1][0]:
                nel *= d
            sizes.append(nel * _DTYPE_BYTES.get(str(sh[0][0]) if sh[0] else "float", 4))
    if ar_ts:
        put("comm.allreduce_per_step", max(_med(_count_in(v, windows)) for v in ar_ts.values()), "count")
    if sizes:
        put("comm.allreduce_bytes_median", int(median(sizes)), "bytes")
    if not comm:
        return
    cm = _merge([(s, e) for s, e, _ in comm])
    comm_total = sum(e - s for s, e in cm)
    busy = _merge([(s, e) for s, e, _ in comm + compute])
    put("comm.share", comm_total / sum(e - s for s, e in busy), "ratio", "communication / GPU busy time")
    comm_streams = {st for _, _, st in comm}
    other = _merge([(s, e) for s, e, st in compute if st not in comm_streams])
    over = comm_total - sum(e - s for s, e in _subtract(cm, other))
    put("comm.overlap", over / comm_total if comm_total else 0.0, "ratio",
        "comm time overlapped by compute kernels on other streams")


def _dataparallel(t, facts) -> None:
    dp = ddp = False
    for i in range(len(t.strings)):
        s = t.strings[i]
        if "DistributedDataParallel" in s or s.startswith(("c10d::", "nccl:all_reduce")) or "Reducer" in s:
            ddp = True
        elif s in ("DataParallel.forward", "nn.Module: DataParallel") or s.startswith("nn.Module: DataParallel_"):
            dp = True
    if dp and not ddp:
        s = facts.subject("dataparallel", "trace:dataparallel")
        s.add("device_count", len(t.device_properties) or None, "count", SRC)


def _dataloader(t, facts, put, windows, step_ms, data_us, stacks) -> None:
    single = multi = False
    site = None
    loaders = t.names_where(lambda s: s.startswith("enumerate(DataLoader)"))
    for i in t.indices(USER_ANN, CPU_OP):
        if t.name[i] in loaders:
            nm = t.strings[t.name[i]]
            single |= "_SingleProcessDataLoaderIter" in nm
            multi |= "_MultiProcessingDataLoaderIter" in nm
            if site is None:
                u = stacks.frame(i)
                site = u[0] if u else None
    if not (single or multi) or not windows:
        return
    key, loc = _loc(site) if site else ("trace:dataloader", None)
    s = facts.subject("dataloader", key)
    if loc and loc not in s.locations:
        s.locations.append(loc)
    wait = [x / 1000 for x in data_us] if data_us else []
    if wait:
        s.add("wait_ms", round(median(wait), 4), "ms", SRC, "DataLoader __next__ time per step (median)")
        fr = [w / sm for w, sm in zip(wait, step_ms) if sm]
        s.add("wait_fraction", round(median(fr), 4) if fr else None, "ratio", SRC)
    if single and not multi:
        s.add("num_workers", 0, "count", SRC, "_SingleProcessDataLoaderIter in the trace")
        put("dataloader.num_workers", 0, "count", "_SingleProcessDataLoaderIter in the trace")
    elif multi:
        s.add("multiprocess", True, "", SRC, "_MultiProcessingDataLoaderIter in the trace")


def _counters(t, put, windows, launches) -> None:
    """Top-level aten ops and kernel launches per step: independent of machine noise."""
    ts, dur, name, corr = t.ts, t.dur, t.name, t.corr
    by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        by_track[t.track[i]].append(i)
    kernels = [ts[r] if (r := launches.get(corr[i])) is not None else ts[i] for i in t.indices(KERNEL)]
    aten = t.names_where(lambda s: s.startswith("aten::"))
    top = []
    for lst in by_track.values():
        lst.sort(key=dur.__getitem__, reverse=True)  # by start, the longest first (two stable sorts)
        lst.sort(key=ts.__getitem__)
        end = float("-inf")
        for i in lst:
            if ts[i] >= end:
                end = ts[i] + dur[i]
                if name[i] in aten:
                    top.append(ts[i])
    if windows:
        put("ops.calls_per_step", _med(_count_in(top, windows)), "count", "top-level aten ops per step")
        if kernels:
            put("kernels.launches_per_step", _med(_count_in(kernels, windows)), "count")


def cross_rank(traces: list[Trace], per_rank: list[Facts]) -> tuple[Facts, list[dict[str, Any]]]:
    """Per-rank step, compute and idle time; the straggler and the imbalance across ranks."""
    out = Facts()
    rows = []
    for t, f in zip(traces, per_rank):
        step = f.value("step.time_ms")
        compute = f.value("step.gpu_kernel_ms")
        idle = f.value("step.idle_ms")
        rows.append({"rank": t.rank, "file": t.path.name, "step_ms": step, "compute_ms": compute, "idle_ms": idle,
                     "idle_fraction": round(idle / step, 4) if step and idle is not None else None})
    out.add("ranks.count", len(traces), "count", SRC)
    key = "compute_ms" if all(r["compute_ms"] for r in rows) else "step_ms"
    vals = [r[key] for r in rows if r[key] is not None]
    if len(vals) >= 2 and median(vals) > 0:
        out.add("ranks.imbalance_ratio", round(max(vals) / median(vals), 4), "ratio", SRC, f"max/median {key}")
        out.add("ranks.straggler", max(rows, key=lambda r: r[key] or 0)["rank"], "", SRC, f"rank with most {key}")
    idles = [r["idle_fraction"] for r in rows if r["idle_fraction"] is not None]
    if len(idles) >= 2:
        out.add("ranks.idle_spread", round(max(idles) - min(idles), 4), "ratio", SRC, "max - min idle fraction")
    return out, rows
