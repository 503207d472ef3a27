"""A run folder (written by `perfdoctor run`) -> facts, summary, hotspots and notes. Never imports torch."""

from __future__ import annotations

import ast
import os
import re
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from perfdoctor.contracts.files import TOO_DEEP, check_schema, read_bytes, read_source
from perfdoctor.contracts.run import (
    SCHEMA,
    Env,
    ForwardRecord,
    Hotspots,
    Meta,
    Probes,
    Rank,
    Site,
    Step,
    Steps,
    Window,
    Workers,
    decode,
)
from perfdoctor.errors import InputError
from perfdoctor.facts import run_checklist, run_distributed
from perfdoctor.facts.model import Facts, Subject, site_subject
from perfdoctor.model import Hotspot, Location
from perfdoctor.stats import (
    breakdown,
    breakdown_rows,
    profiler_steps,
    quantile,
    steady_steps,
    step_series,
    step_time_summary,
)
from perfdoctor.stats import median as median_of

# How much faster a GPU runs a training step's forward, backward and optimizer than this machine's
# CPU cores, for projecting a CPU run of a CUDA script onto a GPU (PD002). Small CNNs, MLPs and
# transformers train 10-50x faster on a current GPU than on a few CPU cores; the low end is taken,
# so the projected GPU step is long and a data stall is only projected where it is clear.
GPU_SPEEDUP = 10.0
LOSS_SCAN_STEPS = 30  # capture looks for retained losses on the first steps only (capture/recorder.py)
CLOCKS = {"optimizer": "optimizer", "backward": "backward", "dataloader": "dataloader", "none": "whole-run"}
CATEGORIES = (("data loading", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
              ("optimizer", "optimizer_ms"))


T = TypeVar("T")


@dataclass
class RunData:
    meta: dict[str, Any]  # meta.json as written (checked against contracts.run.Meta)
    facts: Facts
    summary: dict[str, Any]
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    user_files: list[Path] = field(default_factory=list)
    trace_path: Path | None = None
    # the user-defined classes of the models the run called ("<file>:<qualname>"); None where the
    # run saw no model called (then nothing is known of which ran)
    model_classes: set[str] | None = None


def _bytes(path: Path) -> bytes | None:
    """The file's contents (regular files only, capped: contracts.files.read_bytes), None if there is no such file."""
    if not path.exists() and not path.is_symlink():
        return None
    return read_bytes(path)


def _read(path: Path, type: type[T]) -> T:
    """A run file as its contract; a missing file reads as an empty one."""
    data = _bytes(path)
    return type() if data is None else decode(data, type, path)


def _read_meta(run_dir: Path) -> tuple[Meta, dict[str, Any]]:
    """meta.json as its contract, and as written; InputError if the folder is not a run folder."""
    path = run_dir / "meta.json"
    data = _bytes(path)
    try:
        raw = None if data is None else msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise InputError(f"{path} is not readable JSON ({e}); run `perfdoctor run` again") from None
    except RecursionError:
        raise InputError(f"{path}: {TOO_DEEP}") from None
    if data is None or not isinstance(raw, dict):
        raise InputError(f"{run_dir} is not a perfdoctor run folder (no meta.json); "
                         "give a folder that `perfdoctor run` wrote, or a trace file")
    schema = raw.get("schema")
    check_schema(path, schema if isinstance(schema, str) else None, SCHEMA, "perfdoctor run folder's meta.json")
    return decode(data, Meta, path), raw


def _known(v: Any) -> Any:
    """None for a key the file does not have (msgspec.UNSET)."""
    return None if v is msgspec.UNSET else v


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and R^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return sxy / sxx, sxy * sxy / (sxx * syy)


def memory_growth(steady: list[dict]) -> float | None:
    """Bytes per step when memory grows clearly and linearly over the steady steps, else None."""
    pts = [(s["i"], s["mem_bytes"]) for s in steady if s.get("mem_bytes") is not None]
    if len(pts) < 8:
        return None
    slope, r2 = _slope([p[0] for p in pts], [p[1] for p in pts])
    total = slope * (pts[-1][0] - pts[0][0])
    if slope > 0 and r2 >= 0.7 and total >= 1 << 20:
        return slope
    return None


def _part(step: dict[str, Any], key: str) -> float:
    """A step's time in one part (ms), never more than the step."""
    return min(step.get(key) or 0.0, step["wall_ms"])


def composition(steady: list[dict[str, Any]], median: float) -> dict[str, float]:
    """Where the median step goes: each part's mean share of the steady steps (every step's parts
    as shares of its own time, scaled down where a step's parts exceed it), times the median step;
    "other" is the rest. Shares add up step by step, so the parts add up to the median step and
    "other" is only the time no part measured, also when a part is bimodal (a loader that delivers
    every few steps: per-part medians miss it and do not add up). Each step weighs the same, so a
    single slow step (a checkpoint, a collection) moves the shares by 1/n at most."""
    shares = dict.fromkeys((cat for cat, _ in CATEGORIES), 0.0)
    n = 0
    for s in steady:
        wall = s["wall_ms"]
        if wall <= 0:
            continue
        parts = {cat: _part(s, k) / wall for cat, k in CATEGORIES}
        scale = min(1.0, 1.0 / (sum(parts.values()) or 1.0))
        for cat, v in parts.items():
            shares[cat] += v * scale
        n += 1
    return breakdown({cat: median * v / n if n else 0.0 for cat, v in shares.items()}, median)


def _project_to_gpu(facts: Facts, s: Subject, load: float, step: float, env: Env) -> None:
    """A loader with num_workers=0: the loop's wait in its __next__ is the cost of loading the batch
    (`load_ms`, the mean: every step pays it). On a CPU run, what a GPU would see: the step's
    compute (the step less that loading) divided by GPU_SPEEDUP, and the share of such a GPU step
    the loading would take (PD002 judges it for scripts that target CUDA)."""
    s.add("load_ms", load, "ms", detail="mean wait in DataLoader __next__ with num_workers=0 over the steady steps")
    if env.device != "cpu":
        return
    gpu = max(0.0, step - load) / GPU_SPEEDUP
    facts.add("step.gpu_compute_ms", gpu, "ms",
              detail=f"(median step {step:.1f} ms - data loading {load:.1f} ms) on this CPU / {GPU_SPEEDUP:g}, "
                     "the low end of a GPU's speed-up over a few CPU cores")
    if load + gpu > 0:
        s.add("gpu_wait_fraction", load / (load + gpu), "ratio",
              detail=f"load_ms / (load_ms + projected GPU compute {gpu:.1f} ms)")
def _span(idx: list[int]) -> str:
    """The steps `idx` (sorted step numbers) in words: "steps 3..4, 14..40"."""
    if not idx:
        return "no steps"
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return "step" + ("s " if len(idx) > 1 else " ") + ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs)


def _memory(facts: Facts, run_steps: list[Step], steady: list[dict[str, Any]], env: Env,
            held: range) -> float | None:
    """The memory facts, from one source for the whole run, named in each fact's detail with the
    steps it read: CUDA memory per device where the script used CUDA (each device's allocated
    bytes at step ends, its peak within each step), else the process RSS. The device reported is
    the one that grows (or peaks) most; returns the growth per step, None if none is clear.
    The RSS peak leaves out the steps the profiler held (`held`: its warm-up and recorded steps
    and the step that carries the trace export): their RSS holds the profiler's event buffers,
    tens of MB that vary from run to run and are not the script's (CUDA memory does not)."""
    by_dev: dict[int, list[tuple[int, int, int]]] = {}  # device -> (step, allocated, peak)
    for st in run_steps:
        for c in st.cuda_mem or []:
            by_dev.setdefault(c.device, []).append((st.i, c.allocated, c.peak))
    steady_i = {x["i"] for x in steady}
    if not by_dev:
        rows = [(st.i, st.mem_bytes) for st in run_steps if st.mem_bytes is not None]
        rows = [r for r in rows if r[0] not in held] or rows
        if rows:
            facts.add("memory.peak_bytes", max(m for _, m in rows), "bytes",
                      detail=f"max process RSS at step ends ({_span([i for i, _ in rows])})")
        facts.add("memory.total_bytes", env.total_memory_bytes, "bytes", "machine")
        free = _known(env.free_memory_bytes)
        facts.add("memory.free_bytes", free, "bytes", "machine", "free at the end of the run")
        pts = [x for x in steady if x.get("mem_bytes") is not None]
        growth = memory_growth(pts)
        if growth is not None:
            facts.add("memory.growth_bytes_per_step", growth, "bytes", detail="least-squares slope of process RSS "
                      f"over {len(steady)} steady steps ({_span([x['i'] for x in pts])})")
            if free:
                facts.add("memory.steps_to_oom", int(free / growth), "count", detail="free memory at the end / growth")
        return growth
    info = {d.index: d for d in env.devices or []}
    peak_dev = max(by_dev, key=lambda d: max(r[2] for r in by_dev[d]))
    peak_rows = by_dev[peak_dev]
    facts.add("memory.peak_bytes", max(r[2] for r in peak_rows), "bytes",
              detail=f"highest CUDA memory allocated within a step (max_memory_allocated, reset every step) on "
                     f"cuda:{peak_dev}, {_span([r[0] for r in peak_rows])}")
    best: tuple[int, float, list[int]] | None = None
    for d, dev_rows in by_dev.items():
        pts = [{"i": i, "mem_bytes": a} for i, a, _ in dev_rows if i in steady_i]
        g = memory_growth(pts)
        if g is not None and (best is None or g > best[1]):
            best = (d, g, [x["i"] for x in pts])
    dev = best[0] if best is not None else peak_dev
    d_info = info.get(dev)
    total = d_info.total_memory_bytes if d_info is not None else env.device_memory_bytes
    free = d_info.free_memory_bytes if d_info is not None else None
    facts.add("memory.total_bytes", total, "bytes", "machine", f"cuda:{dev}")
    facts.add("memory.free_bytes", free, "bytes", "machine", f"free on cuda:{dev} at the end of the run")
    if best is None:
        return None
    facts.add("memory.growth_bytes_per_step", best[1], "bytes",
              detail=f"least-squares slope of CUDA memory allocated at step ends on cuda:{dev} over "
                     f"{len(best[2])} steady steps ({_span(best[2])})")
    if free:
        facts.add("memory.steps_to_oom", int(free / best[1]), "count",
                  detail=f"free memory on cuda:{dev} at the end / growth")
    return best[1]


def _machine(facts: Facts, env: Env, rank: Rank | None = None) -> None:
    m = "machine"
    if rank is not None and rank.cpu_share is not None and rank.cpu_share != env.cpu_count:
        local = rank.local_world_size
        facts.add("cpu.count", rank.cpu_share, "count", m,
                  f"this rank's share: {env.cpu_count} usable CPUs / {local} ranks on this node")
        facts.add("cpu.local_ranks", local, "count", m)
    else:
        facts.add("cpu.count", env.cpu_count, "count", m)
    facts.add("cpu.amx", env.cpu_amx, "", m, "amx_tile in /proc/cpuinfo flags")
    dev = "rocm" if env.rocm and env.device == "cuda" else env.device
    facts.add("device.type", dev, "", m)
    facts.add("device.name", env.device_name, "", m)
    if env.device == "cuda":
        facts.add("device.count", env.device_count, "count", m)
        cap = env.device_capability
        facts.add("device.memory_bytes", env.device_memory_bytes, "bytes", m)
        if cap:
            c = f"{cap[0]}.{cap[1]}"
            facts.add("device.capability", float(c), "", m)
            ok = (cap[0], cap[1]) >= (7, 0) or dev == "rocm"
            basis = ("ROCm device (matrix cores)" if dev == "rocm" else
                     f"CUDA capability {c} >= 7.0: tensor cores" if ok else
                     f"CUDA capability {c} < 7.0: no tensor cores, autocast brings little")
            facts.add("device.amp_available", ok, "", m, basis)
            facts.add("device.amp_basis", basis, "", m)
    elif env.device == "cpu" and env.cpu_amx is not None:
        amx = bool(env.cpu_amx)
        basis = "CPU with AMX (bf16 autocast)" if amx else "CPU without AMX: autocast brings little"
        facts.add("device.amp_available", amx, "", m, basis)
        facts.add("device.amp_basis", basis, "", m)


@lru_cache(maxsize=128)
def _source_lines(file: str) -> list[str]:
    """The lines of a user file the run names (regular files only, capped: contracts.files.read_source)."""
    data = read_source(file)
    return [] if data is None else data.decode("utf-8", "replace").splitlines(keepends=True)


def _function_spans(file: str) -> list[tuple[int, int, int]]:
    """(def line, first body line, end line) of every function in `file`, outer ones first."""
    try:
        tree = ast.parse("".join(_source_lines(file)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [(n.lineno, n.body[0].lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _function_end(spans: list[tuple[int, int, int]], def_line: int) -> int | None:
    """The end line of the function whose header holds `def_line` (cProfile's first line)."""
    return next((end for start, body, end in spans if start <= def_line <= body), None)


def _enclosing_start(spans: list[tuple[int, int, int]], line: int) -> int | None:
    """The def line of the innermost function around `line`."""
    return max((start for start, _, end in spans if start <= line <= end), default=None)


def _hot_lines(file: str, rows: list[dict]) -> list[dict[str, Any]]:
    """A function's hottest lines (up to 5, each at least 5% of its samples) with their code."""
    total = sum(x["samples"] for x in rows)
    lines = _source_lines(file)
    return [{"line": x["line"], "code": lines[x["line"] - 1].strip() if 0 < x["line"] <= len(lines) else "",
             "share": round(x["samples"] / total, 3), "samples": x["samples"]}
            for x in sorted(rows, key=lambda x: -x["samples"])[:5] if x["samples"] / total >= 0.05]


_INNER_FRAME = re.compile(r"(\.<locals>)?\.<(listcomp|dictcomp|setcomp|genexpr|lambda)>")


def worker_hotspots(workers: Workers | None) -> list[Hotspot]:
    """User functions in the DataLoader worker processes (py-spy samples through the window), by
    worker CPU time per step summed over the workers, with their hot lines."""
    if workers is None or not workers.samples or not workers.steps:
        return []
    per_sample_ms = 1000.0 / (workers.rate_hz or 100) / workers.steps
    spans: dict[str, list[tuple[int, int, int]]] = {}  # each file parsed once
    groups: dict[tuple[str, str, int], dict[int, int]] = {}  # (file, function, def line) -> samples per line
    for x in workers.lines or []:
        fs = spans.get(x.file)
        if fs is None:
            fs = spans[x.file] = _function_spans(x.file)
        start = _enclosing_start(fs, x.line) or x.line
        # a comprehension or lambda is a frame of its own (`collate.<locals>.<listcomp>`): its time
        # belongs to the function written around it
        per_line = groups.setdefault((x.file, _INNER_FRAME.sub("", x.function), start), {})
        per_line[x.line] = per_line.get(x.line, 0) + x.samples
    out = []
    for (file, func, start), per_line in groups.items():
        rows = [{"line": ln, "samples": n} for ln, n in per_line.items()]
        out.append(Hotspot(function=func, file=file, line=start,
                           ms_per_step=sum(per_line.values()) * per_sample_ms, calls_per_step=0.0,
                           lines=_hot_lines(file, rows), process="dataloader-workers"))
    out.sort(key=lambda h: -h.ms_per_step)
    return [h for h in out if h.ms_per_step >= 0.01][:5]


def _worker_hotspot_subject(facts: Facts, workers: Workers, h: Hotspot, steps: list[Step],
                            window: Window | None) -> None:
    """The hottest user function in the DataLoader workers, located at its hottest line (PD014)."""
    rate, top = workers.rate_hz or 100, h.lines[0]
    samples, n_steps = workers.samples, workers.steps
    assert isinstance(samples, int) and n_steps  # worker_hotspots found h: both are known and non-zero
    s = facts.subject("worker_hotspot", f"{h.file}:{top['line']}")
    s.locations.append(Location(h.file, top["line"], top.get("code", ""), h.function))
    s.add("function", h.function)
    s.add("ms_per_step", h.ms_per_step, "ms", detail="worker CPU time per step in this function, summed over "
          f"the workers (py-spy, {rate} Hz, {n_steps} profiled steps)")
    all_ms = samples * 1000.0 / rate / n_steps
    s.add("share", h.ms_per_step / all_ms, "ratio", detail="of all the workers' sampled time")
    n_workers = len(workers.pids)
    s.add("workers", n_workers, "count")
    # py-spy samples only running threads (not a worker blocked on a full queue), so samples over
    # what the window's wall time allows say how saturated the workers were
    skip, last = (window.skip or 0, window.last_step) if window is not None else (0, None)
    window_s = sum(x.wall_ms for x in steps if last is not None and skip < x.i <= last) / 1000
    if window_s > 0 and n_workers:
        s.add("busy", min(1.0, samples / (rate * window_s * n_workers)),
              "ratio", detail=f"sampled running time of the workers over the window's {window_s:.2f} s")


def _hotspots(hs: Hotspots) -> list[Hotspot]:
    """User functions by time per profiled step (cProfile records no frame entered before it was
    enabled, so the training loop and `main` do not appear), with their hot lines."""
    steps = hs.steps
    if not steps:
        return []
    out = []
    for f in hs.functions:
        if f.function == "<module>":
            continue
        ms = f.cumtime_s * 1e3 / steps
        if ms < 0.01:
            continue
        h = Hotspot(function=f.function, file=f.file, line=f.line, ms_per_step=ms, calls_per_step=f.ncalls / steps)
        end = _function_end(_function_spans(h.file), h.line)
        if end:
            lines = [{"line": x.line, "samples": x.samples} for x in hs.lines
                     if x.file == h.file and h.line <= x.line <= end]
            if lines:
                h.lines = _hot_lines(h.file, lines)
        out.append(h)
        if len(out) >= 10:
            break
    return out


HOST_READ_ORDER = ("item", "cpu", "tolist", "numpy", "float", "int", "bool", "print")


def _host_reads(facts: Facts, probes: Probes, steady_idx: list[int]) -> None:
    """One `host_read` subject per line of the user's code that read tensors on the host in the
    steady steps: its reads per step (the mean over the steady steps) and how. Several kinds on one
    line (`loss.cpu().numpy()`) are one value read once: the line counts its most frequent kind."""
    per_line: dict[tuple[str, int], list[tuple[float, str, Site]]] = {}
    for r in probes.host_reads:
        if r.site is None or not r.kind or not steady_idx:
            continue
        counts = r.counts_per_step
        mean = sum(counts[i] for i in steady_idx if 0 <= i < len(counts)) / len(steady_idx)
        if mean > 0:
            per_line.setdefault((r.site.file, r.site.line), []).append((mean, r.kind, r.site))
    for rows in per_line.values():
        mean, kind, site = max(rows, key=lambda x: (x[0], -HOST_READ_ORDER.index(x[1])
                                                      if x[1] in HOST_READ_ORDER else -99))
        s = site_subject(facts, "host_read", site)
        if s is not None:
            s.add("kind", kind)
            s.add("count_per_step", mean, "count", detail=f"mean over {len(steady_idx)} steady steps")


def _model_classes(forward: list[ForwardRecord]) -> set[str] | None:
    """The user-defined classes of the models the run called; None where it called none, or where
    its run folder predates the record."""
    if not forward or any(fw.classes is None for fw in forward):
        return None
    return {c for fw in forward for c in fw.classes or ()}


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    meta, raw_meta = _read_meta(run_dir)
    run_steps = _read(run_dir / "steps.json", Steps).steps
    probes = _read(run_dir / "probes.json", Probes)
    hs = _read(run_dir / "hotspots.json", Hotspots)
    env, win, exit_ = meta.env, meta.window, meta.exit
    # the steps and the window as perfdoctor.stats takes them (shared with the gate)
    steps: list[dict[str, Any]] = msgspec.to_builtins(run_steps)
    window: dict[str, Any] = msgspec.to_builtins(win) if win is not None else {}
    clock = CLOCKS.get(meta.step_clock or "none", "whole-run")
    facts = Facts()
    notes: list[str] = []
    profiled = (win.steps_profiled or 0) if win is not None else 0

    facts.add("run.steps_observed", len(steps), "count")
    facts.add("run.steps_profiled", profiled, "count")
    facts.add("run.step_clock", clock)
    if isinstance(meta.rank, Rank):
        facts.add("run.world_size", meta.rank.world_size, "count", detail=f"this is rank {meta.rank.rank}")
    elif (world := max((d.world_size for d in probes.ddp), default=0)) > 1:
        # the script started the other ranks itself (Lightning's launcher, mp.spawn): they ran bare
        notes.append(f"the script started a distributed job of {world} processes itself (DistributedDataParallel "
                     f"over {world} ranks; Lightning's and mp.spawn's launchers do so): this report measures "
                     "the process perfdoctor ran, the other ranks ran without perfdoctor"
                     + (", and --steps ended this process alone (the others then lose their peer)"
                        if exit_.reason == "steps-reached" else "")
                     + f". To measure every rank, launch them with perfdoctor: `perfdoctor run --nproc-per-node "
                     f"{world} SCRIPT` (Lightning then runs under torchrun's ranks).")
    if len(steps) >= 3:  # the probes looked for retained losses on these steps (PD006 trusts them)
        facts.add("run.loss_scan_steps", min(len(steps), LOSS_SCAN_STEPS), "count")
    _machine(facts, env, meta.rank if isinstance(meta.rank, Rank) else None)

    # -- step time and breakdown -----------------------------------------------------------------
    steady = steady_steps(steps, window)
    summary: dict[str, Any] = {"steps_observed": len(steps), "steps_profiled": profiled, "step_clock": clock,
                               "step_time_ms": None, "breakdown": []}
    walls = [s["wall_ms"] for s in steady]
    median = median_of(walls)
    if median is not None:
        p90 = quantile(walls, 0.9)
        summary["step_time_ms"] = step_time_summary(walls)
        summary["steady_steps"] = [steady[0]["i"], steady[-1]["i"]]
        which = f"{len(walls)} steady-state steps ({_span([x['i'] for x in steady])}, unprofiled)"
        facts.add("step.time_p90_ms", p90, "ms", detail=f"p90 of {which}")
        split = composition(steady, median)
        summary["breakdown"] = breakdown_rows(split, median)
        facts.add("step.time_ms", median, "ms", detail=f"median of {which}", per_step=tuple(walls))
        for cat, k in CATEGORIES:
            facts.add(f"step.{k}", split[cat], "ms", detail=f"mean share of {which} x the median step",
                      per_step=tuple(_part(s, k) for s in steady))
        facts.add("step.other_ms", split["other"], "ms",
                  detail=f"step time not in data, forward, backward, optimizer; {which}")
    held = profiler_steps(window) if profiled else range(0)  # its window and the export step after it
    if steps:  # every step of the run, for the charts: which were steady, which the profiler held
        summary["step_series"] = step_series([s["wall_ms"] for s in steps], [s["i"] for s in steady],
                                             [held.start, held.stop - 2] if held else None)

    # -- memory -------------------------------------------------------------------------------------
    growth = _memory(facts, run_steps, steady, env, held)

    # -- probes -> facts and subjects -----------------------------------------------------------
    steady_idx = [s["i"] - 1 for s in steady]
    for dl in probes.dataloaders:
        s = site_subject(facts, "dataloader", dl.site)
        if s is None:
            continue
        kw = dl.kwargs
        s.add("num_workers", kw.num_workers, "count")
        s.add("pin_memory", kw.pin_memory)
        s.add("persistent_workers", kw.persistent_workers)
        s.add("batch_size", kw.batch_size, "count")
        s.add("prefetch_factor", kw.prefetch_factor, "count")
        s.add("multiprocessing_context", kw.multiprocessing_context)
        s.add("kwargs_style", dl.kwargs_style)
        s.add("batches", dl.batches, "count")
        if dl.sampler:
            s.add("sampler", dl.sampler)
        if isinstance(dl.sharded, bool):
            s.add("sharded", dl.sharded, detail=f"sampler {dl.sampler}")
        waits = dl.wait_ms_per_step
        ws = [waits[i] for i in steady_idx if 0 <= i < len(waits)]
        if ws and dl.batches:
            w = statistics.median(ws)
            aligned = len(ws) == len(steady)  # a per-step series only where it covers every steady step
            s.add("wait_ms", w, "ms", detail=f"median time in DataLoader __next__ over {len(ws)} steady steps",
                  per_step=tuple(ws) if aligned else ())
            s.add("wait_mean_ms", statistics.fmean(ws), "ms")
            if median:
                s.add("wait_fraction", w / median, "ratio", detail="wait_ms / step.time_ms",
                      per_step=tuple(x / st["wall_ms"] if st["wall_ms"] > 0 else 0.0 for x, st in zip(ws, steady))
                      if aligned else ())
        if ws and dl.batches and kw.num_workers == 0 and median is not None:
            _project_to_gpu(facts, s, statistics.fmean(ws), median, env)
        if env.device == "cuda":
            s.add("feeds_cuda", dl.to_cuda, detail="a batch was moved to a CUDA device")
            s.add("non_blocking", dl.non_blocking)
    for dp in probes.dataparallel:
        s = site_subject(facts, "dataparallel", dp.site)
        if s is not None:
            s.add("constructed", True)
            s.add("device_count", dp.device_count, "count")
    n_loop = max(1, len(run_steps) - 1)
    for ec in probes.empty_cache:
        s = site_subject(facts, "empty_cache", ec.site)
        if s is not None:
            s.add("calls_per_step", ec.calls_in_steps / n_loop, "count")
            s.add("in_loop", ec.calls_in_steps > 0)
            s.add("calls", ec.calls, "count")
    for an in probes.anomaly:
        if an.enabled:
            facts.add("autograd.anomaly_enabled", True, detail="set_detect_anomaly/detect_anomaly seen")
            s = site_subject(facts, "anomaly", an.site)
            if s is not None:
                s.add("enabled", True)
    models = [f for f in probes.forward if f.params]
    for f in models:
        s = site_subject(facts, "model", f.site)
        if s is not None:
            s.add("autocast", f.autocast)
            s.add("param_dtype", f.param_dtype)
            s.add("device", f.device)
            s.add("params", f.params, "count")
    if models:
        main = max(models, key=lambda f: (f.params or 0, f.calls))
        facts.add("autocast.enabled", main.autocast, detail=f"at the forward of {main.module}")
        facts.add("model.param_dtype", main.param_dtype, detail=f"parameters of {main.module}")
    holders = probes.loss_holders
    for h in holders:
        s = site_subject(facts, "loss_holder", h.site)
        if s is None:
            continue
        s.add("kind", h.kind)
        s.add("holder", h.holder)
        s.add("tensor_name", h.tensor_name)
        s.add("numel", h.numel, "count")
        s.add("graphs_retained", h.graphs_retained, "count")
        s.add("graphs_per_step", h.graphs_per_step, "count", detail=f"steps {h.first_step}..{h.last_step}")
        if growth is not None:
            s.add("growth_bytes_per_step", growth, "bytes",
                  detail="memory slope of the whole process" + (" (shared by all holders)" if len(holders) > 1 else ""))

    _host_reads(facts, probes, steady_idx)
    run_checklist.worker_startup(facts, probes, steady)
    run_checklist.gc_calls(facts, probes, steady)
    run_checklist.periodic_stall(facts, probes, steady)
    run_checklist.eval_grad(facts, probes, steady)
    run_checklist.compile_breaks(facts, probes, steady)
    run_checklist.worker_contention(facts, probes, steady)
    run_distributed.ddp(facts, probes, steady)
    run_distributed.gc_time(facts, probes, steady)
    run_distributed.throttling(facts, probes, steady)

    # -- notes --------------------------------------------------------------------------------------
    n = len(run_steps) if clock != "whole-run" else 0
    if clock == "backward":
        notes.append("no optimizer step seen: steps counted by backward() calls")
    elif clock == "dataloader":
        notes.append("no optimizer step or backward() seen: steps counted by DataLoader batches")
    elif clock == "whole-run":
        notes.append("no steps found (no optimizer step, backward() or DataLoader batch): the whole run is one span")
    reason, code = exit_.reason, exit_.code
    if reason == "exception":
        last = (exit_.traceback or "").strip().splitlines()[-1:] or ["an exception"]
        notes.append(f"the script failed after {n} steps: {last[0]}")
    elif reason == "sys-exit" and code:
        notes.append(f"the script exited with code {code} after {n} steps")
    elif reason == "killed":
        notes.append(f"the script was killed (exit code {code}) after about {n} steps: "
                     "probes and profile were not saved")
    elif reason == "interrupted":
        notes.append(f"interrupted after {n} steps")
    if win is not None and clock != "whole-run":
        if win.stopped_by == "time":
            notes.append(f"profiler window stopped at its time budget ({win.budget_s or 0:g} s) in step {win.last_step}: "
                         f"{profiled} of {win.active} steps recorded, the run went on unprofiled")
        elif win.stopped_by == "user-profiler":
            notes.append(f"the script started a torch.profiler of its own after step {win.last_step}: perfdoctor's "
                         f"profiler window stepped aside there (one profiler runs at a time), {profiled} of "
                         f"{win.active} steps recorded")
        elif win.stopped_by == "events":
            notes.append(f"profiler window shortened to its event budget ({win.budget_events or 0:,} trace events, "
                         f"about {win.events_per_step or 0:,} per step estimated): {profiled} of {win.active} steps recorded")
        elif not profiled and not win.trace:
            notes.append(f"profiler window not reached: the run ended after {n} steps, the window starts "
                         f"after step {win.skip}")
        elif not win.completed:
            notes.append(f"profiler window incomplete: {profiled} of {win.active} steps recorded")
    if win is not None and win.error:
        notes.append(f"the profiler failed: {win.error}")
    if steady and len(steady) < 5 and clock != "whole-run":
        notes.append(f"only {len(steady)} steady-state steps: timings are rough")

    trace = run_dir / "trace.json.gz"
    users = [Path(p) for p in meta.user_files or []]
    if not users and meta.script:
        users = [Path(meta.script)]
    # meta.json's user files are those under the script's folder; the user's own package imported
    # from elsewhere in the project (minGPT's projects/adder/adder.py driving mingpt/trainer.py) is
    # read too where the training loop lives there: the files that built a DataLoader or called the model
    for site in [dl.site for dl in probes.dataloaders] + [fw.site for fw in probes.forward]:
        if site is not None and site.file and os.path.isabs(site.file) and Path(site.file) not in users:
            users.append(Path(site.file))
    workers = hs.workers
    worker_hot = worker_hotspots(workers)
    if workers is not None and worker_hot and worker_hot[0].lines:
        _worker_hotspot_subject(facts, workers, worker_hot[0], run_steps, win)
    if workers is not None and workers.error:
        notes.append(f"py-spy could not sample every DataLoader worker ({workers.error}); "
                     f"hot spots in the workers are {'partial' if workers.samples else 'missing'}")
    return RunData(meta=raw_meta, facts=facts, summary=summary, hotspots=_hotspots(hs) + worker_hot, notes=notes,
                   user_files=[p for p in users if p.is_file()], trace_path=trace if trace.exists() else None,
                   model_classes=_model_classes(probes.forward))
