"""A run folder (written by `perfdoctor run`) -> facts, the summary, hot spots and notes.

Reads JSON only (meta.json, steps.json, probes.json, hotspots.json); never the pstats dump.
"""

from __future__ import annotations

import ast
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts, Location
from perfdoctor.report.model import Hotspot

LOSS_SCAN_STEPS = 30  # the capture probes look for retained losses on the first steps only
MIN_STEADY = 6


@dataclass
class RunData:
    meta: dict[str, Any]
    facts: Facts
    summary: dict[str, Any]
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    user_files: list[Path] = field(default_factory=list)
    trace_path: Path | None = None


def _read(path: Path, default: Any = None) -> Any:
    if not path.is_file():
        return default
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise InputError(f"{path}: unreadable run record ({e}); rerun `perfdoctor run`") from None


def warmup_steps(n_total: int) -> int:
    """Steps dropped at the start of a run: the first max(2, 10%) (allocator, autotuning, caches,
    lazy imports and the first DataLoader batches all land there)."""
    return max(2, math.ceil(0.10 * n_total))


def steady_steps(steps: list[dict[str, Any]], window: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The steady-state steps: warm-up dropped, and the profiler window (plus the step after it, which
    carries the trace export) left out so profiling overhead does not count. With too few left, all
    steps after warm-up; with fewer still, all steps. Returns the steps and a note ("" if none)."""
    n = len(steps)
    if n <= 2:
        return list(steps), ""
    first, last = window.get("first_step"), window.get("last_step")
    drop = warmup_steps(n)

    def in_window(i: int) -> bool:
        return first is not None and last is not None and first <= i <= last + 1

    steady = [s for s in steps if s["i"] > drop and not in_window(s["i"])]
    if len(steady) >= MIN_STEADY:
        return steady, ""
    steady = [s for s in steps if s["i"] > min(drop, n // 2)]
    return steady, (f"only {n} steps: step times include warm-up effects and the profiled steps; "
                    "run more steps for steadier figures")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _loc(site: dict[str, Any] | None) -> Location | None:
    if not site or not site.get("file"):
        return None
    return Location(str(Path(site["file"]).resolve()) if Path(site["file"]).exists() else site["file"],
                    int(site.get("line") or 0), str(site.get("code") or "").strip(), str(site.get("function") or ""))


def _key(loc: Location) -> str:
    return f"{loc.file}:{loc.line}"


def _machine_facts(facts: Facts, env: dict[str, Any]) -> None:
    facts.add("cpu.count", env.get("cpu_count"), "count", "machine", "usable CPUs")
    facts.add("cpu.amx", env.get("cpu_amx"), "", "machine")
    cuda = bool(env.get("cuda_available")) and env.get("device") == "cuda"
    facts.add("device.type", "cuda" if cuda else "cpu", "", "machine")
    facts.add("device.name", env.get("device_name"), "", "machine")
    facts.add("device.count", env.get("device_count"), "count", "machine")
    cap = env.get("device_capability")
    if cuda and cap:
        capability = float(f"{cap[0]}.{cap[1]}")
        facts.add("device.capability", capability, "", "machine")
        facts.add("device.memory_bytes", env.get("device_memory_bytes"), "bytes", "machine")
        ok = capability >= 7.0
        basis = (f"CUDA capability {capability:.1f} >= 7.0: tensor cores" if ok
                 else f"CUDA capability {capability:.1f} < 7.0: no tensor cores, autocast brings little")
        facts.add("device.amp_available", ok, "", "machine", basis)
        facts.add("device.amp_basis", basis, "", "machine")
    elif not cuda:
        amx = bool(env.get("cpu_amx"))
        basis = "CPU with AMX: bf16 matmuls run on AMX tiles" if amx else "CPU without AMX: autocast brings little"
        facts.add("device.amp_available", amx, "", "machine", basis)
        facts.add("device.amp_basis", basis, "", "machine")


def _memory_facts(facts: Facts, steady: list[dict[str, Any]], steps: list[dict[str, Any]], env: dict[str, Any]) -> None:
    mems = [int(s["mem_bytes"]) for s in steps if s.get("mem_bytes") is not None]
    if mems:
        facts.add("memory.peak_bytes", max(mems), "bytes", "run",
                  "torch.cuda.memory_allocated" if env.get("device") == "cuda" else "process RSS")
    cuda = env.get("device") == "cuda"
    total = env.get("device_memory_bytes") if cuda else env.get("total_memory_bytes")
    facts.add("memory.total_bytes", total, "bytes", "machine")
    pts = [(s["i"], s["mem_bytes"]) for s in steady if s.get("mem_bytes") is not None]
    if len(pts) < 5:
        return
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    syy = sum((y - my) ** 2 for _, y in pts)
    if sxx == 0 or syy == 0:
        return
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    r2 = slope * slope * sxx / syy
    # a steady, clearly linear climb only: allocator caching and RSS jitter are not growth
    if slope <= 0 or r2 < 0.7 or slope * (pts[-1][0] - pts[0][0]) < 1 << 20:
        return
    facts.add("memory.growth_bytes_per_step", slope, "bytes", "run",
              f"least-squares slope of {'allocated CUDA memory' if cuda else 'process RSS'} over {n} steps (R²={r2:.2f})")
    free = (total - pts[-1][1]) if (cuda and total) else env.get("free_memory_bytes")
    if free and free > 0:
        facts.add("memory.free_bytes", free, "bytes", "run")
        facts.add("memory.steps_to_oom", free / slope, "count", "run", "free memory / growth per step")


def _function_end(file: str, line: int, cache: dict[str, ast.Module | None]) -> int | None:
    if file not in cache:
        try:
            cache[file] = ast.parse(Path(file).read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            cache[file] = None
    tree = cache[file]
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == line:
            return node.end_lineno
    return None


def _source_line(file: str, line: int) -> str:
    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, 1):
                if i == line:
                    return text.strip()
    except OSError:
        pass
    return ""


def _hotspots(data: dict[str, Any], median_step_ms: float | None) -> list[Hotspot]:
    steps = data.get("steps") or 0
    if not steps:
        return []
    window_s = (median_step_ms or 0) * steps / 1000
    samples = data.get("lines") or []
    trees: dict[str, ast.Module | None] = {}
    out: list[Hotspot] = []
    for fn in data.get("functions") or []:
        name, file, line = fn.get("function", ""), fn.get("file", ""), int(fn.get("line") or 0)
        cum = float(fn.get("cumtime_s") or 0)
        # the module body and the loop's own function span the whole window: not a hot spot
        if name == "<module>" or (window_s and cum >= 0.9 * window_s):
            continue
        end = _function_end(file, line, trees)
        lines = []
        if end is not None:
            inside = [s for s in samples if s.get("file") == file and line < int(s["line"]) <= end]
            total = sum(int(s["samples"]) for s in inside)
            for s in sorted(inside, key=lambda s: -int(s["samples"]))[:5]:
                lines.append({"line": int(s["line"]), "code": _source_line(file, int(s["line"])),
                              "share": round(int(s["samples"]) / total, 3) if total else 0.0})
        out.append(Hotspot(function=name, file=file, line=line, ms_per_step=cum * 1000 / steps,
                           calls_per_step=float(fn.get("ncalls") or 0) / steps, lines=lines))
    out.sort(key=lambda h: -h.ms_per_step)
    return [h for h in out if h.ms_per_step >= 0.01][:10]


def _probe_subjects(facts: Facts, probes: dict[str, Any], steady_idx: list[int], n_steps: int,
                    step_ms: float | None, env: dict[str, Any]) -> None:
    cuda = env.get("device") == "cuda"
    for dl in probes.get("dataloaders") or []:
        loc = _loc(dl.get("site"))
        if loc is None:
            continue
        s = facts.subject("dataloader", _key(loc))
        s.locations[:0] = [loc] if loc not in s.locations else []
        kw = dl.get("kwargs") or {}
        for name in ("num_workers", "pin_memory", "persistent_workers", "batch_size", "prefetch_factor"):
            s.add(name, kw.get(name), "count" if name in ("num_workers", "batch_size") else "", "run")
        s.add("kwargs_style", dl.get("kwargs_style"), "", "run")
        waits = dl.get("wait_ms_per_step") or []
        steady_waits = [waits[i - 1] for i in steady_idx if 0 < i <= len(waits)]
        if dl.get("batches") and steady_waits:
            w = statistics.median(steady_waits)
            s.add("wait_ms", w, "ms", "run", f"median time inside the DataLoader's __next__ per step over {len(steady_waits)} steps")
            if step_ms:
                s.add("wait_fraction", w / step_ms, "ratio", "run")
        if cuda:  # on the CPU, whether batches would go to a GPU is for the source to say
            s.add("feeds_cuda", bool(dl.get("to_cuda")), "", "run")
            s.add("non_blocking", dl.get("non_blocking"), "", "run")
    for dp in probes.get("dataparallel") or []:
        loc = _loc(dp.get("site"))
        if loc is None:
            continue
        s = facts.subject("dataparallel", _key(loc))
        s.locations[:0] = [loc] if loc not in s.locations else []
        s.add("constructed", True, "", "run")
        s.add("device_count", dp.get("device_count"), "count", "run")
    for ec in probes.get("empty_cache") or []:
        loc = _loc(ec.get("site"))
        if loc is None or not n_steps:
            continue
        s = facts.subject("empty_cache", _key(loc))
        s.locations[:0] = [loc] if loc not in s.locations else []
        in_steps = int(ec.get("calls_in_steps") or 0)
        s.add("calls_per_step", in_steps / n_steps, "count", "run", f"{in_steps} calls during {n_steps} steps")
        s.add("in_loop", in_steps > 0, "", "run")
    for an in probes.get("anomaly") or []:
        loc = _loc(an.get("site"))
        if loc is None:
            continue
        s = facts.subject("anomaly", _key(loc))
        s.locations[:0] = [loc] if loc not in s.locations else []
        s.add("enabled", bool(an.get("enabled")), "", "run")
    forwards = sorted(probes.get("forward") or [], key=lambda f: -int(f.get("calls") or 0))
    if forwards:
        top = forwards[0]
        loc = _loc(top.get("site"))
        calls = int(top.get("calls") or 0)
        autocast = bool(top.get("autocast")) or (calls > 0 and int(top.get("autocast_calls") or 0) * 2 >= calls)
        facts.add("autocast.enabled", autocast, "", "run", f"autocast state in {calls} top-level forward calls")
        facts.add("model.param_dtype", top.get("param_dtype"), "", "run")
        if loc is not None:
            s = facts.subject("model", _key(loc))
            s.locations.append(loc)
            s.add("autocast", autocast, "", "run")
            s.add("param_dtype", top.get("param_dtype"), "", "run")
            s.add("module", top.get("module"), "", "run")
    growth = facts.value("memory.growth_bytes_per_step")
    for h in probes.get("loss_holders") or []:
        loc = _loc(h.get("site"))
        if loc is None:
            continue
        s = facts.subject("loss_holder", _key(loc))
        s.locations[:0] = [loc] if loc not in s.locations else []
        s.add("graphs_per_step", h.get("graphs_per_step"), "count", "run",
              f"{h.get('graphs_retained')} graphs kept from step {h.get('first_step')} to {h.get('last_step')}")
        for name in ("kind", "holder", "tensor_name", "numel"):
            s.add(name, h.get(name), "", "run")
        s.add("growth_bytes_per_step", growth, "bytes", "run")


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    meta = _read(run_dir / "meta.json")
    if not isinstance(meta, dict):
        raise InputError(f"{run_dir}: not a perfdoctor run folder (no meta.json)")
    env = meta.get("env") or {}
    steps = [s for s in (_read(run_dir / "steps.json", {}) or {}).get("steps", []) if s.get("wall_ms") is not None]
    probes = _read(run_dir / "probes.json", {}) or {}
    window = meta.get("window") or {}
    facts = Facts()
    notes: list[str] = []
    _machine_facts(facts, env)

    steady, note = steady_steps(steps, window)
    if note:
        notes.append(note)
    clock = meta.get("step_clock") or "none"
    facts.add("run.step_clock", clock, "", "run")
    facts.add("run.steps_observed", len(steps), "count", "run")
    facts.add("run.steps_profiled", window.get("steps_profiled"), "count", "run")
    if len(steps) >= 3:
        facts.add("run.loss_scan_steps", min(len(steps), LOSS_SCAN_STEPS), "count", "run")

    summary: dict[str, Any] = {"steps_observed": len(steps), "steps_profiled": window.get("steps_profiled") or 0,
                               "step_clock": clock}
    walls = [float(s["wall_ms"]) for s in steady]
    median = _median(walls)
    if median is not None:
        summary["step_time_ms"] = {"median": round(median, 4), "p90": round(_pct(walls, 0.9), 4),
                                   "mean": round(statistics.fmean(walls), 4), "min": round(min(walls), 4),
                                   "max": round(max(walls), 4), "n": len(walls)}
        facts.add("step.time_ms", median, "ms", "run", f"median wall time of {len(walls)} steady-state steps")
        facts.add("step.time_p90_ms", _pct(walls, 0.9), "ms", "run")
        # the breakdown: each part's mean share of the step, scaled to the median step, so the parts
        # add up to the median exactly
        mean_wall = statistics.fmean(walls)
        parts = []
        for key, label in (("data_ms", "data loading"), ("forward_ms", "forward"), ("backward_ms", "backward"),
                           ("optimizer_ms", "optimizer")):
            vals = [float(s.get(key) or 0.0) for s in steady]
            parts.append((key, label, statistics.fmean(vals) if vals else 0.0))
        other = max(0.0, mean_wall - sum(p[2] for p in parts))
        parts.append(("other_ms", "other", other))
        scale = median / mean_wall if mean_wall > 0 else 0.0
        breakdown = []
        for key, label, mean in parts:
            ms = mean * scale
            if key != "other_ms" and not any(s.get(key) for s in steady):
                continue  # never measured in this run (e.g. no DataLoader): leave the part out
            facts.add(f"step.{key}", ms, "ms", "run", "mean share of the step, scaled to the median step")
            breakdown.append({"category": label, "ms": round(ms, 4), "fraction": round(ms / median, 4) if median else 0})
        summary["breakdown"] = breakdown

    _memory_facts(facts, steady, steps, env)
    _probe_subjects(facts, probes, [s["i"] for s in steady], len(steps), median, env)

    exit_info = meta.get("exit") or {}
    reason = exit_info.get("reason")
    if clock == "backward":
        notes.append("no optimizer step seen: steps counted by backward() calls")
    elif clock == "dataloader":
        notes.append("no optimizer step or backward() seen: steps counted by DataLoader batches")
    elif clock == "none":
        notes.append("no training steps seen (no optimizer step, backward() or DataLoader batch): "
                     "the whole run is one span")
    if reason == "exception":
        notes.append(f"the script raised after {len(steps)} step(s); the report covers what ran")
    elif reason == "killed":
        notes.append(f"the script was killed (exit code {exit_info.get('code')}) after {len(steps)} step(s)")
    elif reason == "interrupted":
        notes.append(f"interrupted after {len(steps)} step(s); the report covers what ran")
    if window and not window.get("completed") and clock != "none":
        notes.append("the profiler window was not completed (the run ended early): "
                     + ("a partial trace was saved" if window.get("trace") else "no trace was recorded"))
    for err in meta.get("probe_errors") or []:
        notes.append(f"a probe failed: {err}")

    trace = run_dir / "trace.json.gz"
    return RunData(meta=meta, facts=facts, summary=summary,
                   hotspots=_hotspots(_read(run_dir / "hotspots.json", {}) or {}, median),
                   notes=notes, user_files=[Path(p) for p in meta.get("user_files") or []],
                   trace_path=trace if trace.is_file() else None)
