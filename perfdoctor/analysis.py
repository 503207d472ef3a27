"""The pipeline, one module for every command: a run folder, a job folder or a trace -> facts (run,
trace, static) -> rules -> one ranked Report, written into a run folder as report.json and
report.html; and `compare`'s sides. `run` (through perfdoctor.orchestrate), `report`, `compare` and
the gate all come through here; the CLI only parses, renders and maps to exit codes, and report/
only renders.

Never imports torch."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from perfdoctor.contracts.report import ExitDoc, RankRowDoc, RunInfoDoc, SummaryDoc, looks_like_report, read_report
from perfdoctor.contracts.run import rank_dirs
from perfdoctor.errors import InputError, PerfdoctorError
from perfdoctor.facts.merge import add_missing, drop_subjects_only_from, merge_findings, resolve_trace_files
from perfdoctor.facts.model import Facts
from perfdoctor.gate.baseline import (
    record_from_run_dir,
    repeat_dirs,
)
from perfdoctor.gate.compare import CO_RUNNER_SLOWDOWN, Comparison, compare_files
from perfdoctor.model import Finding, Report, RuleDoc, from_doc
from perfdoctor.report import jsonfmt
from perfdoctor.rules.catalog import Rule, load_rules
from perfdoctor.rules.config import Settings, check_settings, describe_changes, load_settings
from perfdoctor.rules.engine import gpu_only_context, judge
from perfdoctor.rules.expr import names_in

if TYPE_CHECKING:  # imported where used: the trace layer is not needed to start every command
    from perfdoctor.facts.ranks import RankSummary


def rules_for(config: Path | None) -> tuple[Settings, list[Rule], dict[str, Any]]:
    """The settings (`config`, else pyproject.toml in the current directory: never the analysed
    folder's), the rules, and what the settings change (rules.config.check_settings)."""
    settings = load_settings(config)
    rules = load_rules(settings.extra_rule_dirs, settings.project)
    return settings, rules, check_settings(settings, rules)


def rule_docs(rules: list[Rule], findings: list[Finding]) -> list[RuleDoc]:
    """What the report carries of the rules its findings come from (its renderers never load the
    catalog), by id."""
    fired = {f.rule for f in findings}
    return sorted((r.report_doc() for r in rules if r.id in fired), key=lambda d: d.id)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").is_file()


def is_job_dir(path: Path) -> bool:
    """A folder of rank run folders (`rank-<R>/meta.json`): a distributed job's."""
    return path.is_dir() and not (path / "meta.json").exists() and bool(rank_dirs(path))


def _run_info(kind: str, what: dict[str, Any], summary: SummaryDoc, *, step_clock: str | None,
              device: str | None, torch: str | None, settings: Settings, changes: dict[str, Any],
              dropped: dict[str, int], **extra: Any) -> RunInfoDoc:
    """`Report.run`, one shape for a run folder and a trace: what was analysed (`what`), the step
    counts of its summary, the step clock, device and torch, anything `extra` (a run's exit), the
    settings file used, `config`, what it changed (only where it changed something), and
    `dropped_events`, the trace events dropped or repaired by reason (only where there are any).
    `what`, `extra` and `changes` are meta.json's and the config's: validated as report.json's
    RunInfoDoc here."""
    return msgspec.convert(
        {"kind": kind, **what, "steps_observed": summary.steps_observed, "steps_profiled": summary.steps_profiled,
         "step_clock": step_clock, "device": device, "torch": torch, **extra,
         "settings": str(settings.source) if settings.source else None,
         **({"config": changes} if changes else {}), **({"dropped_events": dropped} if dropped else {})}, RunInfoDoc)


def _input_notes(changes: dict[str, Any], dropped: dict[str, int]) -> list[str]:
    """Notes on the input every format shows: what the config changed, the trace events dropped or repaired."""
    notes = [describe_changes(changes)] if changes else []
    if dropped:
        notes.append("trace events dropped or repaired: "
                     + ", ".join(f"{n} {why}" for why, n in sorted(dropped.items())))
    return notes


def _failure_notes(*facts: Facts) -> list[str]:
    """One note per family of facts that failed with an internal error (`Facts.family`): the report
    says what it lacks instead of being lost."""
    failed = dict.fromkeys(f for fs in facts for f in fs.failures)
    return [f"perfdoctor's own analysis failed in {f}; what that part would have found is missing, the rest "
            "of this report stands (a bug in perfdoctor: please report it with this line)" for f in failed]


def analyse_run(run_dir: Path, config: Path | None = None) -> Report:
    """The report of a run folder written by `perfdoctor run`; `config`: `--config`."""
    return _run_report(run_dir, *rules_for(config))[0]


def _run_report(run_dir: Path, settings: Settings, rules: list[Rule], changes: dict[str, Any]
                ) -> tuple[Report, Facts]:
    """A run folder's report, and the facts it was judged on."""
    from perfdoctor.facts.run import load_run
    from perfdoctor.facts.run.memory import cpu_estimates
    from perfdoctor.facts.run.notes import needs_a_gpu
    from perfdoctor.facts.static import analyse_files

    data = load_run(run_dir)
    facts: Facts = data.facts
    notes = list(data.notes)
    user_files = [Path(p) for p in data.user_files if Path(p).is_file()]
    script = data.meta.get("script")
    analyse_files(user_files, facts, data.model_classes, data.decided, data.step_chain,
                  script=Path(script) if isinstance(script, str) and script else None,
                  factory_lines=data.factory_lines, functions_called=data.functions_called,
                  move_lines=data.move_lines, loader_draws=data.loader_draws,
                  function_shares=data.function_shares, model_calls=data.model_calls)
    trace_summary: SummaryDoc | None = None
    dropped: dict[str, int] = {}
    if data.trace_path is not None and Path(data.trace_path).is_file():
        from perfdoctor.facts.trace import add_trace_facts
        from perfdoctor.trace.loader import load_trace

        run_kinds = facts.kinds_from("run")
        win = data.meta.get("window") or {}
        try:
            # GPU time from the profiled steps, host time from the run's unprofiled ones (the profiler
            # inflates the host's): the GPU's idle time is the run's step less the GPU's busy time.
            # Each trace fact names the run's steps it comes from.
            trace = load_trace(Path(data.trace_path))
            dropped = trace.dropped
            trace_summary = add_trace_facts(
                trace, facts, run_step_ms=facts.value("step.time_ms"),
                modules=data.summary.compute.modules if data.summary.compute else None, user_files=user_files,
                steps_label=f"profiled steps {win['first_step']}..{win['first_step'] + win['steps_profiled'] - 1}"
                if win.get("first_step") is not None and win.get("steps_profiled") else "")
        except InputError as e:
            notes.append(f"the profiler trace could not be read: {e.message}")
        # where the run's probes measured a kind of thing (its DataLoaders, say), the trace's coarser
        # view of the same thing is not a second finding
        drop_subjects_only_from(facts, "trace", run_kinds)
        resolve_trace_files(facts, user_files)
    script = data.meta.get("script")
    findings = judge(facts, rules, settings, user_files)
    notes += _input_notes(changes, dropped) + _failure_notes(facts)
    needs_gpu = needs_a_gpu(data.meta, data.summary)
    if needs_gpu:
        notes.append(needs_gpu)
    # why PD007 is quiet on an fp32 model: this GPU has no fast low-precision math, or the script never
    # leaves the CPU. Not where PD007 spoke, nor where it judged the GPU the script targets
    # (`gpu_only_context`) rather than this machine
    amp = facts.get("device.amp_available")
    why = ("the script runs on the CPU only (PD007 judges GPUs)" if facts.value("device.type") == "cpu"
           else amp.detail if amp is not None and amp.value is False else None)
    if (why and facts.value("autocast.enabled") is False
            and not any(f.rule == "PD007" for f in findings) and gpu_only_context(facts) is None):
        notes.append(f"the model trains in fp32 without autocast, not flagged (PD007): {why}")
    env = data.meta.get("env", {})
    summary = msgspec.structs.replace(data.summary)
    if trace_summary is not None and trace_summary.breakdown and env.get("device") == "cuda":
        summary.gpu_breakdown = trace_summary.breakdown
    cpu_estimates(facts, summary)  # a CPU run's activations and batch-that-fits, from the trace's allocator
    if trace_summary is not None and trace_summary.compute and summary.compute:  # the trace timed the modules
        summary.compute = msgspec.structs.replace(summary.compute, modules=trace_summary.compute.modules)
    rank = data.meta.get("rank")
    label = {}
    if rank:
        label = {"rank": rank, "label": f"rank {rank['rank']}" + (f" of {rank['world_size']}" if rank.get("world_size") else "")
                 + (f" (node {rank['node_rank']})" if rank.get("node_rank") else "")}
    run = _run_info("run", {"script": script, "module": data.meta.get("module"), "argv": data.meta.get("argv", []),
                            "run_dir": str(run_dir), "trace_file": str(data.trace_path) if data.trace_path else None,
                            **label},
                    summary, step_clock=summary.step_clock or data.meta.get("step_clock"),
                    device=env.get("device_name") or env.get("device"), torch=env.get("torch"), settings=settings,
                    changes=changes, dropped=dropped, exit=data.meta.get("exit", {}))
    report = Report(run=run, summary=summary, findings=findings, hotspots=list(data.hotspots), notes=notes,
                    facts=facts.as_mapping(), rules=rule_docs(rules, findings))
    return report, facts


def _merge_ranks(ranks: list[tuple[int, str]], per_rank: list[tuple[Facts, SummaryDoc, list[Finding]]],
                 rules: list[Rule], settings: Settings, source: str
                 ) -> tuple[Facts, SummaryDoc, list[Finding], list[RankRowDoc], int]:
    """One view of a distributed run from its ranks ((rank, label), and each rank's facts, summary
    and findings): the cross-rank facts and table (facts.ranks), each finding once (the costliest
    rank's, with the ranks it was found on where not all), the cross-rank rules' findings, and the
    summary and step facts of the straggler (else the rank with the slowest step), which sets the
    pace of a synchronous step. Returns (facts, summary, findings, rank rows, index of that rank)."""
    from perfdoctor.facts.ranks import cross_rank

    facts, rows = cross_rank(ranks, [f for f, _, _ in per_rank], source)
    findings = merge_findings([rank for rank, _ in ranks], [fs for _, _, fs in per_rank])
    straggler = facts.value("ranks.straggler")
    slowest = next((i for i, (rank, _) in enumerate(ranks) if rank == straggler), None)
    if slowest is None:
        slowest = max(range(len(ranks)), key=lambda i: _median_step(per_rank[i][1]))
    summary = msgspec.structs.replace(per_rank[slowest][1], rank=ranks[slowest][0])
    add_missing(facts, per_rank[slowest][0])
    # cross-rank rules only (those that read the ranks.* facts): per-rank rules were judged on each
    # rank, with that rank's subjects and facts; the merged facts hold the pace rank's globals alone
    cross = [r for r in rules if any(n.startswith("ranks.") for n in r.reads(names_in(r.when)))]
    seen = {f.fingerprint() for f in findings}
    findings += [f for f in judge(facts, cross, settings) if f.fingerprint() not in seen]
    findings.sort(key=Finding.sort_key)
    return facts, summary, findings, rows, slowest


def _median_step(summary: SummaryDoc) -> float:
    return (summary.step_time_ms.median if summary.step_time_ms is not None else None) or 0.0


def _failed_exit(report: Report) -> ExitDoc | None:
    """How a rank's script ended, where it failed (an exit code)."""
    ex = report.run.exit
    return ex if ex and ex.code else None


def _failed_first(report: Report) -> tuple[int, float]:
    """The order of a job's ranks in its notes: the failed ones first, by when they ended."""
    ex = _failed_exit(report)
    return (0, ex.at or 0.0) if ex is not None else (1, 0.0)


def analyse_job(job_dir: Path, config: Path | None = None, write_rank_reports: bool = False) -> Report:
    """The merged report of a job folder: one run folder per rank (`rank-<R>`, written by `perfdoctor
    run --nproc-per-node N`, by every rank under an outside launcher, or gathered from every node).
    Each rank is analysed as a run folder (its report.json and report.html written into it where
    `write_rank_reports`), then merged as a folder of per-rank traces is: the rank table, the
    straggler and its cause, each finding once; the summary, hot spots and step facts are the
    straggler's (`_merge_ranks`)."""
    settings, rules, changes = rules_for(config)
    dirs = rank_dirs(job_dir)
    if not dirs:
        raise InputError(f"{job_dir}: no rank folders (rank-<R>/meta.json) in it")
    reports: list[Report] = []
    per_rank: list[tuple[Facts, SummaryDoc, list[Finding]]] = []
    for _, d in dirs:
        report, facts = _run_report(d, settings, rules, changes)
        if write_rank_reports:
            write_run_reports(report, d)
        reports.append(report)
        per_rank.append((facts, report.summary, list(report.findings)))
    ranks = [(rank, d.name) for rank, d in dirs]
    facts, summary, findings, rows, slowest = _merge_ranks(ranks, per_rank, rules, settings, "run")
    pace = reports[slowest]
    notes: list[str] = []
    # the rank whose failure started it first (it ended first: the others' errors follow from it,
    # a collective's peer gone), then the other failed ranks in the order they ended, then the rest
    by_failure = sorted(reports, key=_failed_first)
    for r in by_failure:
        notes += [n for n in r.notes if n not in notes]
    world = max((int(r.run.rank.world_size or 0) if r.run.rank else 0 for r in reports), default=0)
    if world > len(dirs):
        missing = sorted(set(range(world)) - {rank for rank, _ in dirs})
        notes.append(f"{len(dirs)} of {world} ranks found; missing: rank {', '.join(map(str, missing))} "
                     f"(gather the rank folders of every node into one folder)")
    failed = next((ex for r in by_failure if (ex := _failed_exit(r)) is not None), None)
    label = (f"job of {len(ranks)} ranks; summary, hot spots and step facts from rank {ranks[slowest][0]}, "
             f"the {'straggler' if facts.value('ranks.straggler') == ranks[slowest][0] else 'slowest'}")
    run = msgspec.structs.replace(
        pace.run, kind="job", job_dir=str(job_dir), run_dir=str(job_dir), ranks=[rank for rank, _ in ranks],
        rank_dirs=[str(d) for _, d in dirs], exit=failed or pace.run.exit or ExitDoc(), label=label, rank=UNSET,
        trace_file=UNSET)
    return Report(run=run, summary=summary, findings=findings, hotspots=list(pace.hotspots), notes=notes,
                  ranks=rows, facts=facts.as_mapping(), rules=rule_docs(rules, findings))


def usable_cpus() -> int:
    """CPUs this process may run on (sched_getaffinity: a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _summarise_and_judge(path: Path, settings: Settings, rules: list[Rule]) -> tuple[RankSummary, list[Finding]]:
    """The map step over ranks: one trace file -> its RankSummary and its own findings (small and
    picklable; the trace itself is freed before this returns)."""
    from perfdoctor.facts.trace import summarise_trace

    rank = summarise_trace(path)
    return rank, judge(rank.facts, rules, settings)


_worker_rules: tuple[Settings, list[Rule]] | None = None  # a rank worker's settings and rules (_init_rank_worker)


def _init_rank_worker(settings: Settings, rules: list[Rule]) -> None:
    global _worker_rules
    _worker_rules = (settings, rules)


def _summarise_or_why(path: Path, settings: Settings, rules: list[Rule]) -> tuple[RankSummary, list[Finding]] | InputError:
    """A rank's summary and findings, or why its trace could not be read."""
    try:
        return _summarise_and_judge(path, settings, rules)
    except InputError as e:
        return e


def _rank_worker(path: Path) -> tuple[RankSummary, list[Finding]] | InputError:
    assert _worker_rules is not None  # set by the pool's initializer
    return _summarise_or_why(path, *_worker_rules)


def _readable_ranks(files: list[Path], ranked: list[tuple[RankSummary, list[Finding]] | InputError]
                    ) -> tuple[list[tuple[RankSummary, list[Finding]]], list[str]]:
    """The ranks whose trace could be read, and a note for each one left out (a truncated rank file
    costs that rank, not the folder); the first error where none could be read."""
    good = [r for r in ranked if not isinstance(r, InputError)]
    bad = [(p, r) for p, r in zip(files, ranked) if isinstance(r, InputError)]
    if not good:
        raise bad[0][1]
    return good, [f"rank trace {p.name} left out: {e.message}" for p, e in bad]


def _summarise_ranks(files: list[Path], settings: Settings, rules: list[Rule],
                     workers: int | None) -> list[tuple[RankSummary, list[Finding]] | InputError]:
    """`_summarise_and_judge` for every file, in file order: in this process for one file or one
    worker, else in a pool of `workers` processes (default: the usable CPUs, at most one per file).
    A worker holds one trace at a time and sends back only its summary, so memory is this process's
    plus, per worker, what one trace takes to load and measure, however many ranks there are. The
    files that cannot be read give their InputError in their place (`_readable_ranks`)."""
    n = min(workers or usable_cpus(), len(files))
    if n <= 1:
        return [_summarise_or_why(p, settings, rules) for p in files]
    from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor  # 16 ms: only when used

    import perfdoctor.facts.trace  # noqa: F401  # the merge needs it too: imported once, before the workers fork
    pool = ProcessPoolExecutor(max_workers=n, initializer=_init_rank_worker, initargs=(settings, rules))
    try:
        return list(pool.map(_rank_worker, files))
    except BrokenProcessPool:
        raise PerfdoctorError(f"a process measuring the rank traces died (out of memory?); "
                              f"{len(files)} traces, {n} processes") from None
    finally:
        pool.shutdown(cancel_futures=True)


def analyse_trace(path: Path, config: Path | None = None, workers: int | None = None) -> Report:
    """The report of one trace file, or of a folder of per-rank traces (one distributed run): each
    rank's trace measured and judged on its own, in parallel processes (`workers`, default the
    usable CPUs: `_summarise_ranks`), then merged (the cross-rank view, each finding once with the
    ranks it holds on, the slowest rank's summary); `config`: `--config`."""
    from perfdoctor.trace import settle_ranks, trace_files

    files = trace_files(path)
    settings, rules, changes = rules_for(config)
    per_rank, left_out = _readable_ranks(files, _summarise_ranks(files, settings, rules, workers))
    for (r, _), (rank, source) in zip(per_rank, settle_ranks([(r.rank, r.rank_source) for r, _ in per_rank])):
        r.rank, r.rank_source = rank, source
    per_rank.sort(key=lambda x: x[0].rank)
    notes: list[str] = list(left_out)
    first = per_rank[0][0]
    if first.step_source != "profiler-step":
        notes.append("no ProfilerStep annotations: steps taken from "
                     + ("other step annotations" if first.step_source == "annotation" else "the whole trace as one span"))
    if first.dropped_last_step:
        notes.append("the last step was cut off by the end of profiling and is left out")
    dropped: dict[str, int] = {}
    for r, _ in per_rank:
        for why, n in r.dropped.items():
            dropped[why] = dropped.get(why, 0) + n
    notes += _input_notes(changes, dropped) + _failure_notes(*(r.facts for r, _ in per_rank))

    if len(per_rank) == 1:
        facts, summary = first.facts, first.summary
        findings = per_rank[0][1]
        ranks: list[RankRowDoc] = []
    else:
        facts, summary, findings, ranks, _ = _merge_ranks(
            [(r.rank, r.path.name) for r, _ in per_rank], [(r.facts, r.summary, fs) for r, fs in per_rank],
            rules, settings, "trace")
    run = _run_info("trace", {"trace": str(path), "files": [str(r.path) for r, _ in per_rank]}, summary,
                    step_clock=first.step_source, device=facts.value("device.name") or facts.value("device.type"),
                    torch=None, settings=settings, changes=changes, dropped=dropped)
    lacking = _machine_facts_lacking(findings, rules, facts)
    if lacking:
        notes.append(lacking)
    return Report(run=run, summary=summary, findings=findings, notes=notes, ranks=ranks,
                  facts=facts.as_mapping(), rules=rule_docs(rules, findings))


def _machine_facts_lacking(findings: list[Finding], rules: list[Rule], facts: Facts) -> str | None:
    """A trace alone does not hold the machine's facts (its usable CPUs, its memory): a note naming
    those the findings' rules read and this report lacks, so that a number or a fix that falls back
    on a rule's default (PD002's num_workers = max_workers) is not read as this machine's."""
    from perfdoctor.facts.registry import spec
    from perfdoctor.rules.catalog import TEMPLATE_RE, split_placeholder

    by_id = {r.id: r for r in rules}
    missing: dict[str, list[str]] = {}
    for f in findings:
        rule = by_id.get(f.rule)
        if rule is None:
            continue
        texts = [str(v) for v in _flat(rule.fix_params)]  # what decides and what is advised, not the words
        names = names_in(rule.when) | (names_in(rule.saving_ms) if rule.saving_ms else set())
        for text in texts:
            for m in TEMPLATE_RE.finditer(text):
                names |= names_in(split_placeholder(m.group(1))[0])
        names = rule.reads(names)
        for n in sorted(names):
            fs = spec(n)
            # the machine's sizes (CPUs, memory) a rule scales its advice by; not its descriptions
            if fs is not None and fs.producers == ("machine",) and fs.unit in ("count", "bytes") and facts.get(n) is None:
                missing.setdefault(n, []).append(f.rule)
    if not missing:
        return None
    return ("a trace alone does not hold these facts of the machine it ran on: "
            + "; ".join(f"{n} ({spec(n).doc.split(';')[0]}), read by {', '.join(dict.fromkeys(r))}"  # type: ignore[union-attr]
                        for n, r in missing.items())
            + ". Where a rule needs one, its number and fix take the rule's default instead (PD002's num_workers "
              "is its max_workers threshold); a run folder (`perfdoctor run`) measures them")


def _flat(params: Any) -> list[Any]:
    if isinstance(params, dict):
        return [x for v in params.values() for x in _flat(v)]
    if isinstance(params, list):
        return [x for v in params for x in _flat(v)]
    return [params]


def analyse_repeats(folder: Path, runs: list[Path], config: Path | None = None) -> Report:
    """The report of a repeated run's --out-dir (`perfdoctor run --repeats` or a gate: repeat-1..N
    run folders): the last run's report, the one `perfdoctor run` printed, with a note naming every
    run and its median step time, so a run that differs is seen; `perfdoctor compare` judges them all."""
    report = analyse_run(runs[-1], config)
    medians = []
    for d in runs:
        try:
            median = record_from_run_dir(d).median_ms
        except PerfdoctorError:
            median = None
        medians.append(f"{d.name} {'unreadable' if median is None else f'{median:,.2f} ms'}")
    report.notes.insert(0, f"{folder} holds {len(runs)} runs of one `perfdoctor run` ({runs[0].name}..{runs[-1].name}); "
                           f"this is the report of the last, {runs[-1].name}. Median step time per run: "
                           + ", ".join(medians) + f". `perfdoctor report {runs[0]}` shows another run; "
                           f"`perfdoctor compare BASELINE {folder}` judges them all against a baseline.")
    return report


def missing(path: Path) -> None:
    """InputError when `path` cannot be reached: no such file or folder, or a loop of symbolic links
    (which `exists()` reports as missing)."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: a loop of symbolic links (it leads back to itself); give the file or folder "
                             f"itself") from None
        if not path.exists():
            raise InputError(f"{path}: no such file or folder") from None
        raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None


def analyse_path(path: Path, config: Path | None = None) -> Report:
    """`perfdoctor report PATH`: a run folder, a job folder of rank run folders, a repeated run's folder
    of repeat-N run folders (the last run, noted), a saved report.json (as it was judged: `config` does
    not apply), a trace file, or a folder of per-rank traces."""
    missing(path)
    if is_run_dir(path):
        return analyse_run(path, config)
    if is_job_dir(path):
        return analyse_job(path, config)
    runs = repeat_dirs(path) if path.is_dir() else []
    if runs:
        return analyse_repeats(path, runs, config)
    try:
        if looks_like_report(path):
            return from_doc(read_report(path))  # a saved report, rendered again as it was judged
        return analyse_trace(path, config)
    except InputError as e:
        if path.is_file() and is_run_dir(path.parent):  # steps.json, a broken report.json...: the folder was meant
            raise InputError(f"{e.message}. {path.name} is a file of the run folder {path.parent}: give the folder, "
                             f"`perfdoctor report {path.parent}`") from None
        raise
    except PerfdoctorError:
        raise
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None


def write_run_reports(report: Report, run_dir: Path) -> None:
    """report.json (contracts/report.py) and report.html, always written into the run folder whatever
    --format."""
    from perfdoctor.report import html  # imports rich: not on `report`'s path

    (run_dir / "report.json").write_text(jsonfmt.render_report(report), encoding="utf-8")
    (run_dir / "report.html").write_text(html.render_report(report), encoding="utf-8")


def compare_paths(base: Path, current: Path, max_regression: float, fail_on: str | None,
                  strict: bool = False, allow_different_args: bool = False,
                  co_runner_slowdown: float = CO_RUNNER_SLOWDOWN) -> Comparison:
    """`perfdoctor compare BASE CURRENT`: each side a baseline file, a run folder, a gate's --out-dir
    (its repeat-N run folders) or a report.json; `allow_different_args`: script arguments that
    differ do not make the pair not comparable."""
    for p in (base, current):
        missing(p)
    return compare_files(base, current, max_regression, fail_on, strict=strict,
                         allow_different_args=allow_different_args, co_runner_slowdown=co_runner_slowdown)
