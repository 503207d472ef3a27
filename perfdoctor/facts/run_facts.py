"""A run folder (written by `perfdoctor run`) -> facts, summary, hotspots and notes. Never imports torch."""

from __future__ import annotations

import ast
import json
import linecache
import re
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.model import Hotspot, Location
from perfdoctor.stats import breakdown, breakdown_rows, median as median_of, quantile, steady_steps, step_time_summary

LOSS_SCAN_STEPS = 30  # capture looks for retained losses on the first steps only (capture/holders.py)
CLOCKS = {"optimizer": "optimizer", "backward": "backward", "dataloader": "dataloader", "none": "whole-run"}
CATEGORIES = (("data loading", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
              ("optimizer", "optimizer_ms"))


@dataclass
class RunData:
    meta: dict[str, Any]
    facts: Facts
    summary: dict[str, Any]
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    user_files: list[Path] = field(default_factory=list)
    trace_path: Path | None = None


def _read(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not readable JSON ({e}); run `perfdoctor run` again") from None


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


def _machine(facts: Facts, env: dict) -> None:
    m = "machine"
    facts.add("cpu.count", env.get("cpu_count"), "count", m)
    facts.add("cpu.amx", env.get("cpu_amx"), "", m, "amx_tile in /proc/cpuinfo flags")
    dev = "rocm" if env.get("rocm") and env.get("device") == "cuda" else env.get("device")
    facts.add("device.type", dev, "", m)
    facts.add("device.name", env.get("device_name"), "", m)
    if env.get("device") == "cuda":
        facts.add("device.count", env.get("device_count"), "count", m)
        cap = env.get("device_capability")
        facts.add("device.memory_bytes", env.get("device_memory_bytes"), "bytes", m)
        if cap:
            c = f"{cap[0]}.{cap[1]}"
            facts.add("device.capability", float(c), "", m)
            ok = (cap[0], cap[1]) >= (7, 0) or dev == "rocm"
            basis = ("ROCm device (matrix cores)" if dev == "rocm" else
                     f"CUDA capability {c} >= 7.0: tensor cores" if ok else
                     f"CUDA capability {c} < 7.0: no tensor cores, autocast brings little")
            facts.add("device.amp_available", ok, "", m, basis)
            facts.add("device.amp_basis", basis, "", m)
    elif env.get("device") == "cpu" and env.get("cpu_amx") is not None:
        amx = bool(env.get("cpu_amx"))
        basis = "CPU with AMX (bf16 autocast)" if amx else "CPU without AMX: autocast brings little"
        facts.add("device.amp_available", amx, "", m, basis)
        facts.add("device.amp_basis", basis, "", m)


def _site_key(site: dict | None) -> tuple[str, Location] | None:
    if not site or not site.get("file"):
        return None
    loc = Location.from_dict(site)
    return f"{loc.file}:{loc.line}", loc


def _subject(facts: Facts, kind: str, site: dict | None):
    k = _site_key(site)
    if k is None:
        return None
    s = facts.subject(kind, k[0])
    if k[1] not in s.locations:
        s.locations.append(k[1])
    return s


def _function_spans(file: str) -> list[tuple[int, int, int]]:
    """(def line, first body line, end line) of every function in `file`, outer ones first."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
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
    return [{"line": x["line"], "code": linecache.getline(file, x["line"]).strip(),
             "share": round(x["samples"] / total, 3), "samples": x["samples"]}
            for x in sorted(rows, key=lambda x: -x["samples"])[:5] if x["samples"] / total >= 0.05]


_INNER_FRAME = re.compile(r"(\.<locals>)?\.<(listcomp|dictcomp|setcomp|genexpr|lambda)>")


def worker_hotspots(workers: dict | None) -> list[Hotspot]:
    """User functions in the DataLoader worker processes (py-spy samples through the window), by
    worker CPU time per step summed over the workers, with their hot lines."""
    if not workers or not workers.get("samples") or not workers.get("steps"):
        return []
    per_sample_ms = 1000.0 / (workers.get("rate_hz") or 100) / workers["steps"]
    spans: dict[str, list[tuple[int, int, int]]] = {}  # each file parsed once
    groups: dict[tuple[str, str, int], dict[int, int]] = {}  # (file, function, def line) -> samples per line
    for x in workers.get("lines") or []:
        fs = spans.get(x["file"])
        if fs is None:
            fs = spans[x["file"]] = _function_spans(x["file"])
        start = _enclosing_start(fs, x["line"]) or x["line"]
        # a comprehension or lambda is a frame of its own (`collate.<locals>.<listcomp>`): its time
        # belongs to the function written around it
        per_line = groups.setdefault((x["file"], _INNER_FRAME.sub("", x["function"]), start), {})
        per_line[x["line"]] = per_line.get(x["line"], 0) + x["samples"]
    out = []
    for (file, func, start), per_line in groups.items():
        rows = [{"line": ln, "samples": n} for ln, n in per_line.items()]
        out.append(Hotspot(function=func, file=file, line=start,
                           ms_per_step=sum(per_line.values()) * per_sample_ms, calls_per_step=0.0,
                           lines=_hot_lines(file, rows), process="dataloader-workers"))
    out.sort(key=lambda h: -h.ms_per_step)
    return [h for h in out if h.ms_per_step >= 0.01][:5]


def _worker_hotspot_subject(facts: Facts, workers: dict, h: Hotspot, steps: list[dict], window: dict) -> None:
    """The hottest user function in the DataLoader workers, located at its hottest line (PD014)."""
    rate, top = workers.get("rate_hz") or 100, h.lines[0]
    s = facts.subject("worker_hotspot", f"{h.file}:{top['line']}")
    s.locations.append(Location(h.file, top["line"], top.get("code", ""), h.function))
    s.add("function", h.function)
    s.add("ms_per_step", h.ms_per_step, "ms", detail="worker CPU time per step in this function, summed over "
          f"the workers (py-spy, {rate} Hz, {workers['steps']} profiled steps)")
    all_ms = workers["samples"] * 1000.0 / rate / workers["steps"]
    s.add("share", h.ms_per_step / all_ms, "ratio", detail="of all the workers' sampled time")
    n_workers = len(workers.get("pids") or [])
    s.add("workers", n_workers, "count")
    # py-spy samples only running threads (not a worker blocked on a full queue), so samples over
    # what the window's wall time allows say how saturated the workers were
    skip, last = int(window.get("skip") or 0), window.get("last_step")
    window_s = sum(x["wall_ms"] for x in steps if last is not None and skip < x["i"] <= int(last)) / 1000
    if window_s > 0 and n_workers:
        s.add("busy", min(1.0, workers["samples"] / (rate * window_s * n_workers)),
              "ratio", detail=f"sampled running time of the workers over the window's {window_s:.2f} s")


def _hotspots(hs: dict) -> list[Hotspot]:
    """User functions by time per profiled step (cProfile records no frame entered before it was
    enabled, so the training loop and `main` do not appear), with their hot lines."""
    steps = hs.get("steps") or 0
    if not steps:
        return []
    out = []
    for f in hs.get("functions") or []:
        if f["function"] == "<module>":
            continue
        ms = f["cumtime_s"] * 1e3 / steps
        if ms < 0.01:
            continue
        h = Hotspot(function=f["function"], file=f["file"], line=int(f["line"]), ms_per_step=ms,
                    calls_per_step=f["ncalls"] / steps)
        end = _function_end(_function_spans(h.file), h.line)
        if end:
            lines = [x for x in hs.get("lines", []) if x["file"] == h.file and h.line <= x["line"] <= end]
            if lines:
                h.lines = _hot_lines(h.file, lines)
        out.append(h)
        if len(out) >= 10:
            break
    return out


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    meta = _read(run_dir / "meta.json", None)
    if not isinstance(meta, dict) or meta.get("schema") != "perfdoctor/run/v1":
        raise InputError(f"{run_dir} is not a perfdoctor run folder (no meta.json); "
                         "give a folder that `perfdoctor run` wrote, or a trace file")
    steps = _read(run_dir / "steps.json", {}).get("steps", [])
    probes = _read(run_dir / "probes.json", {})
    hs = _read(run_dir / "hotspots.json", {})
    env = meta.get("env") or {}
    window = meta.get("window") or {}
    exit_ = meta.get("exit") or {}
    clock = CLOCKS.get(meta.get("step_clock") or "none", "whole-run")
    facts = Facts()
    notes: list[str] = []
    profiled = int(window.get("steps_profiled") or 0)

    facts.add("run.steps_observed", len(steps), "count")
    facts.add("run.steps_profiled", profiled, "count")
    facts.add("run.step_clock", clock)
    if len(steps) >= 3:  # the probes looked for retained losses on these steps (PD006 trusts them)
        facts.add("run.loss_scan_steps", min(len(steps), LOSS_SCAN_STEPS), "count")
    _machine(facts, env)

    # -- step time and breakdown -----------------------------------------------------------------
    steady = steady_steps(steps, window)
    summary: dict[str, Any] = {"steps_observed": len(steps), "steps_profiled": profiled, "step_clock": clock,
                               "step_time_ms": None, "breakdown": []}
    median = None
    if steady:
        walls = [s["wall_ms"] for s in steady]
        median = median_of(walls)
        p90 = quantile(walls, 0.9)
        summary["step_time_ms"] = step_time_summary(walls)
        summary["steady_steps"] = [steady[0]["i"], steady[-1]["i"]]
        facts.add("step.time_ms", median, "ms", detail=f"median of {len(walls)} steady-state steps")
        facts.add("step.time_p90_ms", p90, "ms", detail=f"p90 of {len(walls)} steady-state steps")
        # per-part medians (robust to noisy steps), scaled down if together they exceed the median step
        split = breakdown({cat: median_of([min(s.get(k) or 0.0, s["wall_ms"]) for s in steady])
                           for cat, k in CATEGORIES}, median)
        summary["breakdown"] = breakdown_rows(split, median)
        for cat, k in CATEGORIES:
            facts.add(f"step.{k}", split[cat], "ms", detail="median over steady-state steps")
        facts.add("step.other_ms", split["other"], "ms", detail="step time not in data, forward, backward, optimizer")

    # -- memory -------------------------------------------------------------------------------------
    mems = [s["mem_bytes"] for s in steps if s.get("mem_bytes") is not None]
    on_cuda = env.get("device") == "cuda"
    mem_kind = "CUDA memory_allocated" if on_cuda else "process RSS"
    if mems:
        facts.add("memory.peak_bytes", max(mems), "bytes", detail=f"max {mem_kind} at step ends")
    facts.add("memory.total_bytes", env.get("device_memory_bytes") if on_cuda else env.get("total_memory_bytes"),
              "bytes", "machine")
    facts.add("memory.free_bytes", env.get("free_memory_bytes"), "bytes", "machine", "free at the end of the run")
    growth = memory_growth(steady)
    if growth is not None:
        facts.add("memory.growth_bytes_per_step", growth, "bytes",
                  detail=f"least-squares slope of {mem_kind} over {len(steady)} steady steps")
        free = env.get("free_memory_bytes")
        if free:
            facts.add("memory.steps_to_oom", int(free / growth), "count", detail="free memory at the end / growth")

    # -- probes -> facts and subjects -----------------------------------------------------------
    steady_idx = [s["i"] - 1 for s in steady]
    for dl in probes.get("dataloaders", []):
        s = _subject(facts, "dataloader", dl.get("site"))
        if s is None:
            continue
        kw = dl.get("kwargs") or {}
        for name in ("num_workers", "pin_memory", "persistent_workers", "batch_size", "prefetch_factor"):
            s.add(name, kw.get(name), "count" if name in ("num_workers", "batch_size", "prefetch_factor") else "")
        s.add("multiprocessing_context", kw.get("multiprocessing_context"))
        s.add("kwargs_style", dl.get("kwargs_style"))
        s.add("batches", dl.get("batches"), "count")
        waits = dl.get("wait_ms_per_step") or []
        ws = [waits[i] for i in steady_idx if 0 <= i < len(waits)]
        if ws and dl.get("batches"):
            w = statistics.median(ws)
            s.add("wait_ms", w, "ms", detail=f"median time in DataLoader __next__ over {len(ws)} steady steps")
            s.add("wait_mean_ms", statistics.fmean(ws), "ms")
            if median:
                s.add("wait_fraction", w / median, "ratio", detail="wait_ms / step.time_ms")
        if on_cuda:
            s.add("feeds_cuda", bool(dl.get("to_cuda")), detail="a batch was moved to a CUDA device")
            s.add("non_blocking", dl.get("non_blocking"))
    for dp in probes.get("dataparallel", []):
        s = _subject(facts, "dataparallel", dp.get("site"))
        if s is not None:
            s.add("constructed", True)
            s.add("device_count", dp.get("device_count"), "count")
    n_loop = max(1, len(steps) - 1)
    for ec in probes.get("empty_cache", []):
        s = _subject(facts, "empty_cache", ec.get("site"))
        if s is not None:
            s.add("calls_per_step", ec.get("calls_in_steps", 0) / n_loop, "count")
            s.add("in_loop", ec.get("calls_in_steps", 0) > 0)
            s.add("calls", ec.get("calls"), "count")
    for an in probes.get("anomaly", []):
        if an.get("enabled"):
            facts.add("autograd.anomaly_enabled", True, detail="set_detect_anomaly/detect_anomaly seen")
            s = _subject(facts, "anomaly", an.get("site"))
            if s is not None:
                s.add("enabled", True)
    models = [f for f in probes.get("forward", []) if f.get("params")]
    for f in models:
        s = _subject(facts, "model", f.get("site"))
        if s is not None:
            s.add("autocast", bool(f.get("autocast")))
            s.add("param_dtype", f.get("param_dtype"))
            s.add("device", f.get("device"))
            s.add("params", f.get("params"), "count")
    if models:
        main = max(models, key=lambda f: (f.get("params") or 0, f.get("calls") or 0))
        facts.add("autocast.enabled", bool(main.get("autocast")), detail=f"at the forward of {main.get('module')}")
        facts.add("model.param_dtype", main.get("param_dtype"), detail=f"parameters of {main.get('module')}")
    holders = probes.get("loss_holders", [])
    for h in holders:
        s = _subject(facts, "loss_holder", h.get("site"))
        if s is None:
            continue
        s.add("kind", h.get("kind"))
        s.add("holder", h.get("holder"))
        s.add("tensor_name", h.get("tensor_name"))
        s.add("numel", h.get("numel"), "count")
        s.add("graphs_retained", h.get("graphs_retained"), "count")
        s.add("graphs_per_step", h.get("graphs_per_step"), "count",
              detail=f"steps {h.get('first_step')}..{h.get('last_step')}")
        if growth is not None:
            s.add("growth_bytes_per_step", growth, "bytes",
                  detail="memory slope of the whole process" + (" (shared by all holders)" if len(holders) > 1 else ""))

    # -- notes --------------------------------------------------------------------------------------
    n = len(steps) if clock != "whole-run" else 0
    if clock == "backward":
        notes.append("no optimizer step seen: steps counted by backward() calls")
    elif clock == "dataloader":
        notes.append("no optimizer step or backward() seen: steps counted by DataLoader batches")
    elif clock == "whole-run":
        notes.append("no steps found (no optimizer step, backward() or DataLoader batch): the whole run is one span")
    reason, code = exit_.get("reason"), exit_.get("code")
    if reason == "exception":
        last = (exit_.get("traceback") or "").strip().splitlines()[-1:] or ["an exception"]
        notes.append(f"the script failed after {n} steps: {last[0]}")
    elif reason == "sys-exit" and code:
        notes.append(f"the script exited with code {code} after {n} steps")
    elif reason == "killed":
        notes.append(f"the script was killed (exit code {code}) after about {n} steps: "
                     "probes and profile were not saved")
    elif reason == "interrupted":
        notes.append(f"interrupted after {n} steps")
    if window and clock != "whole-run":
        if not profiled and not window.get("trace"):
            notes.append(f"profiler window not reached: the run ended after {n} steps, the window starts "
                         f"after step {window.get('skip')}")
        elif not window.get("completed"):
            notes.append(f"profiler window incomplete: {profiled} of {window.get('active')} steps recorded")
    if window.get("error"):
        notes.append(f"the profiler failed: {window['error']}")
    if steady and len(steady) < 5 and clock != "whole-run":
        notes.append(f"only {len(steady)} steady-state steps: timings are rough")

    trace = run_dir / "trace.json.gz"
    users = [Path(p) for p in meta.get("user_files") or []]
    if not users and meta.get("script"):
        users = [Path(meta["script"])]
    workers = hs.get("workers")
    worker_hot = worker_hotspots(workers)
    if worker_hot and worker_hot[0].lines:
        _worker_hotspot_subject(facts, workers, worker_hot[0], steps, window)
    if workers and workers.get("error"):
        notes.append(f"py-spy could not sample every DataLoader worker ({workers['error']}); "
                     f"hot spots in the workers are {'partial' if workers.get('samples') else 'missing'}")
    return RunData(meta=meta, facts=facts, summary=summary, hotspots=_hotspots(hs) + worker_hot, notes=notes,
                   user_files=[p for p in users if p.is_file()], trace_path=trace if trace.exists() else None)
