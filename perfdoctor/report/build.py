"""From a run folder or a trace to one Report: facts (run, trace, static) -> rules -> ranked findings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfdoctor.errors import InputError, PerfdoctorError
from perfdoctor.facts.model import Facts
from perfdoctor.model import Finding, Location, Report
from perfdoctor.rules.catalog import Rule, load_rules
from perfdoctor.rules.config import Settings, load_settings
from perfdoctor.rules.engine import judge


def _rules_for(start: Path | None) -> tuple[Settings, list[Rule]]:
    settings = load_settings(start)
    return settings, load_rules(settings.extra_rule_dirs)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").is_file()


def _resolve_trace_files(facts: Facts, user_files: list[Path]) -> None:
    """torch.profiler names the user's frames by file name only (`train.py(42): main`). In a run folder
    the user's files are known: give such locations their full path, and merge a subject into the one
    the run or the source already has for that line."""
    for kind, subjects in facts.subjects.items():
        kept = []
        for s in subjects:
            for i, loc in enumerate(s.locations):
                if Path(loc.file).is_absolute():
                    continue
                match = [p for p in user_files if str(p).endswith("/" + loc.file.lstrip("./"))]
                if len(match) == 1:
                    s.locations[i] = Location(str(match[0]), loc.line, loc.code or _line(match[0], loc.line),
                                              loc.function)
            if s.locations:
                key = f"{s.locations[0].file}:{s.locations[0].line}"
                twin = next((o for o in kept if o.key == key), None)
                if twin is not None:
                    for name, fact in s.facts.items():
                        twin.facts.setdefault(name, fact)
                    continue
                s.key = key
            kept.append(s)
        facts.subjects[kind] = kept


def _line(path: Path, line: int) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    except OSError:
        return ""


def analyse_run(run_dir: Path) -> Report:
    """The report of a run folder written by `perfdoctor run`."""
    from perfdoctor.facts.run_facts import load_run
    from perfdoctor.facts.static import analyse_files

    data = load_run(run_dir)
    facts: Facts = data.facts
    notes = list(data.notes)
    user_files = [Path(p) for p in data.user_files if Path(p).is_file()]
    analyse_files(user_files, facts)
    trace_summary: dict[str, Any] = {}
    if data.trace_path is not None and Path(data.trace_path).is_file():
        from perfdoctor.facts.trace import add_trace_facts
        from perfdoctor.trace.loader import load_trace

        run_kinds = {k for k, subs in facts.subjects.items() if any("run" in s.sources for s in subs)}
        try:
            trace_summary = add_trace_facts(load_trace(Path(data.trace_path)), facts)
        except InputError as e:
            notes.append(f"the profiler trace could not be read: {e.message}")
        # where the run's probes measured a kind of thing (its DataLoaders, say), the trace's coarser
        # view of the same thing is not a second finding
        for kind in run_kinds:
            facts.subjects[kind] = [s for s in facts.subjects[kind] if s.sources - {"trace"}]
        _resolve_trace_files(facts, user_files)
    script = data.meta.get("script")
    settings, rules = _rules_for(Path(script).parent if script else Path.cwd())
    findings = judge(facts, rules, settings)
    amp = facts.get("device.amp_available")
    if amp is not None and amp.value is False and facts.value("autocast.enabled") is False:
        notes.append(f"the model trains in fp32 without autocast, not flagged (PD007): {amp.detail}")
    env = data.meta.get("env", {})
    summary = dict(data.summary)
    if trace_summary.get("breakdown") and env.get("device") == "cuda":
        summary["gpu_breakdown"] = trace_summary["breakdown"]
    run = {
        "kind": "run",
        "script": script,
        "module": data.meta.get("module"),
        "argv": data.meta.get("argv", []),
        "run_dir": str(run_dir),
        "trace_file": str(data.trace_path) if data.trace_path else None,
        "steps_observed": summary.get("steps_observed"),
        "steps_profiled": summary.get("steps_profiled"),
        "step_clock": summary.get("step_clock") or data.meta.get("step_clock"),
        "device": env.get("device_name") or env.get("device"),
        "torch": env.get("torch"),
        "exit": data.meta.get("exit", {}),
        "settings": str(settings.source) if settings.source else None,
    }
    return Report(run=run, summary=summary, findings=findings, hotspots=list(data.hotspots), notes=notes,
                  facts=facts.as_mapping())


def analyse_trace(path: Path) -> Report:
    """The report of one trace file, or of a folder of per-rank traces (one distributed run)."""
    from perfdoctor.facts.trace import add_trace_facts, cross_rank
    from perfdoctor.trace.loader import load_traces

    traces = load_traces(path)
    settings, rules = _rules_for(path if path.is_dir() else path.parent)
    per_rank: list[tuple[Facts, dict[str, Any]]] = []
    for t in traces:
        f = Facts()
        per_rank.append((f, add_trace_facts(t, f)))
    notes: list[str] = []
    first = traces[0]
    if first.step_source != "profiler-step":
        notes.append("no ProfilerStep annotations: steps taken from "
                     + ("other step annotations" if first.step_source == "annotation" else "the whole trace as one span"))
    if first.dropped_last_step:
        notes.append("the last step was cut off by the end of profiling and is left out")

    if len(traces) == 1:
        facts, summary = per_rank[0]
        findings = judge(facts, rules, settings)
        ranks: list[dict[str, Any]] = []
    else:
        facts, ranks = cross_rank(traces, [f for f, _ in per_rank])
        by_print: dict[str, tuple[Finding, list[int]]] = {}
        for t, (f, _) in zip(traces, per_rank):
            for finding in judge(f, rules, settings):
                key = finding.fingerprint()
                if key not in by_print or (finding.ms_per_step or 0) > (by_print[key][0].ms_per_step or 0):
                    by_print[key] = (finding, by_print.get(key, (finding, []))[1])
                by_print[key][1].append(t.rank)
        findings = []
        for finding, rank_list in by_print.values():
            if len(rank_list) < len(traces):
                finding.message += f" (ranks {', '.join(map(str, sorted(rank_list)))})"
            findings.append(finding)
        # the summary and step facts are the slowest rank's: it sets the pace of a synchronous step
        slowest = max(range(len(traces)), key=lambda i: per_rank[i][1].get("step_time_ms", {}).get("median") or 0)
        summary = dict(per_rank[slowest][1])
        summary["rank"] = traces[slowest].rank
        for fact in per_rank[slowest][0]:
            if fact.name not in facts:
                facts.add(fact.name, fact.value, fact.unit, fact.source, fact.detail)
        # cross-rank rules only: per-rank rules were judged on each rank above
        seen = {f.fingerprint() for f in findings}
        findings += [f for f in judge(facts, rules, settings) if f.fingerprint() not in seen]
        findings.sort(key=Finding.sort_key)
    run = {
        "kind": "trace",
        "trace": str(path),
        "files": [str(t.path) for t in traces],
        "steps_observed": summary.get("steps_observed"),
        "steps_profiled": summary.get("steps_profiled"),
        "step_clock": first.step_source,
        "device": facts.value("device.name") or facts.value("device.type"),
        "torch": None,
        "settings": str(settings.source) if settings.source else None,
    }
    return Report(run=run, summary=summary, findings=findings, notes=notes, ranks=ranks,
                  facts=facts.as_mapping())


def analyse_path(path: Path) -> Report:
    """`perfdoctor report PATH`: a run folder, a trace file, or a folder of per-rank traces."""
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if is_run_dir(path):
        return analyse_run(path)
    try:
        return analyse_trace(path)
    except PerfdoctorError:
        raise
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None
