"""`perfdoctor run`'s orchestration: claim the output folder, run the script (once, repeated, or as a
distributed job), analyse each run and write its reports (perfdoctor.analysis, the pipeline), then
compare the runs with a baseline (adding runs while the step time is undecided) and/or save them as
one. The CLI only parses, renders and maps to exit codes.

Never imports torch: the script runs in the child process that capture.runner starts."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perfdoctor.analysis import analyse_job, analyse_run, is_job_dir, is_run_dir, rules_for, write_run_reports
from perfdoctor.contracts.run import rank_dir_name, rank_dirs, rank_from_env
from perfdoctor.errors import EXIT_SCRIPT_FAILED, InputError, PerfdoctorError
from perfdoctor.gate.adaptive import DEFAULT_MAX_REPEATS, RESOLVE_FACTOR, baseline_resolves, gate_runs
from perfdoctor.gate.baseline import RunRecord, interfered_runs, load_baseline, record_from_run_dir, repeat_dir
from perfdoctor.gate.baseline import save_baseline as write_baseline
from perfdoctor.gate.compare import CO_RUNNER_SLOWDOWN, Comparison
from perfdoctor.history import baseline_from_history, check_store, record_run
from perfdoctor.model import Report, at_or_above

if TYPE_CHECKING:  # imported where used: the runner is not needed to start every command
    from perfdoctor.capture.runner import RunResult
    from perfdoctor.verify import Outcome as VerifyOutcome


GATE_REPEATS = 3  # runs per side when gating: the gate's unit of evidence is a run, it needs several
FAILED_REASONS = ("exception", "sys-exit", "killed")  # the script failed: exit 3


@dataclass
class RunOutcome:
    """What `perfdoctor run` did: the last run's report, every run's result, the gate's comparison
    (None without --baseline, or when the script failed), and lines for stderr (the baseline saved,
    warnings about it), in order."""

    report: Report
    results: list[RunResult]
    comparison: Comparison | None
    messages: list[str] = field(default_factory=list)
    fail_on: str | None = None

    @property
    def result(self) -> RunResult:
        return self.results[-1]

    @property
    def script_failed(self) -> bool:
        return self.result.exit_code != 0 and self.result.reason in FAILED_REASONS

    @property
    def interrupted(self) -> bool:
        return self.result.reason == "interrupted"

    @property
    def gate_failed(self) -> bool:
        """The comparison failed; without one, a finding at or above --fail-on fails."""
        if self.comparison is not None:
            return self.comparison.failed
        return self.fail_on is not None and any(at_or_above(f.severity, self.fail_on) for f in self.report.findings)


def warm_up() -> None:
    """Import the analysis (trace loader, static read, libcst for fixes, the text renderer) in a
    background thread while the script runs in its child process: the parent is idle then, and the
    report comes sooner."""

    def load() -> None:
        for name in ("perfdoctor.facts.run", "perfdoctor.facts.static", "perfdoctor.trace.loader",
                     "perfdoctor.facts.trace", "perfdoctor.rules.fixes.context", "perfdoctor.report.text"):
            try:
                importlib.import_module(name)
            except ImportError:  # reported properly when the analysis imports it for real
                return

    threading.Thread(target=load, name="perfdoctor-warm-up", daemon=True).start()


def check_writable(path: Path, option: str) -> None:
    """`path` (given as `option`: --output, --save-baseline) can be written: checked before anything
    runs, so that a typo does not lose the report after minutes of running. Nothing is created: an
    existing file is opened for appending (never truncated), else the nearest existing folder above
    it must be a writable folder (the missing ones are made when the file is written). One
    InputError line (exit 2) when it cannot be written."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder, give a file name")
    if path.exists():
        try:  # without blocking: a FIFO with no reader is an error, not a hang
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0)))
        except OSError as e:
            raise InputError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
        return
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise InputError(f"{option} {path}: cannot write it ({above} is not a folder)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot write it (no permission to write in {above})")


def _previous_runs(out_dir: Path) -> list[Path]:
    """The run folders a previous `perfdoctor run --out-dir out_dir` left: itself, or its repeat-N,
    and their rank-R (a distributed job's); the job folders' merged reports go with them."""
    out = []
    for d in (out_dir, *sorted(out_dir.glob("repeat-*"))):
        out += [r for _, r in rank_dirs(d)]
        if (d / "meta.json").is_file() or (d / "report.json").is_file():
            out.append(d)
    return out


@contextlib.contextmanager
def claim_out_dir(out_dir: Path | None, overwrite: bool = False) -> Iterator[Path | None]:
    """`--out-dir` for the whole of one `perfdoctor run` (every repeat): made absolute (the script may
    change directory) and created, then locked (flock on the folder, released when the run ends or
    perfdoctor dies), so that a second perfdoctor on the same folder stops with one line instead of
    writing over the first one's files. Under an outside launcher (RANK set) the folder is the job
    folder and each rank claims its own `rank-<R>` in it. A folder that holds a previous run is refused, unless
    `overwrite`: then that run's files (perfdoctor's own, nothing else) are removed first. Without
    --out-dir every run gets a fresh folder of its own: nothing to claim."""
    if out_dir is None:
        yield None
        return
    out_dir = Path(os.path.abspath(out_dir))
    rank = rank_from_env()
    if rank is not None:  # a rank under an outside launcher: every rank claims its own rank-<R> of the job folder
        out_dir = out_dir / rank_dir_name(rank.rank)
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # removed again if the run never starts
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir, os.O_RDONLY)
    except OSError as e:
        raise InputError(f"--out-dir {out_dir}: cannot create it ({e.strerror or e})") from None
    started = False
    try:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, the previous-run check still holds
            pass
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(f"--out-dir {out_dir}: another perfdoctor run is writing there; "
                                 f"give each run its own folder") from None
        previous = _previous_runs(out_dir)
        if not previous and any(out_dir.iterdir()):  # the user's own files: perfdoctor writes nothing there
            names = sorted(p.name for p in out_dir.iterdir())
            raise InputError(f"--out-dir {out_dir}: holds files that are not a perfdoctor run ("
                             f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); give a new or empty folder")
        if previous and not overwrite:
            raise InputError(f"--out-dir {out_dir}: holds a previous run; give another folder, "
                             f"or --overwrite to replace it")
        from perfdoctor.capture.runner import clear_run_files

        for d in previous:
            clear_run_files(d)
            if d != out_dir:
                with contextlib.suppress(OSError):  # a repeat folder is removed when nothing else is in it
                    d.rmdir()
        started = True
        yield out_dir
    except BaseException:
        if not started or not any(out_dir.iterdir()):  # a bad setting found before anything was written
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
        raise
    finally:
        os.close(fd)


def run_and_gate(target: str, *, module: bool, script_args: list[str], out_dir: Path | None, steps: int | None,
                 script_stdout_to_stderr: bool, show_status: bool, repeats: int | None = None,
                 save_baseline: Path | None = None, baseline: Path | None = None, max_regression: float = 0.10,
                 fail_on: str | None = None, config: Path | None = None, max_repeats: int | None = None,
                 strict: bool = False, launcher_args: list[str] | None = None, history: Path | None = None,
                 history_baseline: int | None = None, base_branch: str | None = None,
                 co_runner_slowdown: float = CO_RUNNER_SLOWDOWN) -> RunOutcome:
    """`perfdoctor run`: run the script `repeats` times (default: GATE_REPEATS with a baseline to save
    or to compare with, else once; a failed or interrupted run is not repeated), analyse each run and
    write its report.json, then, unless the script failed, compare the runs with `baseline` (adding
    runs while the step time is undecided, up to `max_repeats`: gate.adaptive) and/or save them as a
    baseline (adding runs, up to `max_repeats`, while they disagree too much for a gate against them to
    decide: gate.adaptive.baseline_resolves). With more than one run possible, the n-th run's folder is `out_dir/repeat-n`. With
    `launcher_args` (torch.distributed.run's options: --nproc-per-node N...) each run is a distributed
    job (capture.runner.run_job): a job folder of rank run folders, each with its own report, and the
    merged report (analyse_job) in the job folder. Every run is kept in the `history` store (None: off);
    with `history_baseline` N, the baseline is the newest N recorded runs of the same script and
    arguments (on `base_branch` where given) instead of a file."""
    from perfdoctor.capture.runner import run_job, run_script  # not on `report`'s path (start-up time)

    gating = baseline is not None or history_baseline is not None
    if repeats is None:
        repeats = GATE_REPEATS if (save_baseline is not None or gating) else 1
    # a gate adds runs of the current side while undecided; a baseline to save, runs while its runs disagree
    # too much for a gate against it to decide (gate.adaptive.baseline_resolves); one run disagrees with none
    adds = gating or (save_baseline is not None and repeats >= 2)
    most = max(repeats, DEFAULT_MAX_REPEATS if max_repeats is None else max_repeats) if adds else repeats
    warm_up()
    rules_for(config)  # a bad config fails now, before minutes of running
    check_store(history)  # a damaged store fails now, not after minutes of running
    base = load_baseline(baseline) if baseline is not None else None  # fail early, before minutes of running
    if history_baseline is not None:
        base = baseline_from_history(history, Path(target).name if not module else target, list(script_args),
                                     runs=history_baseline, branch=base_branch)
    results: list[RunResult] = []
    reports: list[Report] = []
    messages: list[str] = []

    def next_run(n: int) -> RunRecord | None:
        """The n-th run: run, analyse, write its reports; its record, or None when it failed or
        was interrupted (not repeated, not judged)."""
        run_out = repeat_dir(out_dir, n) if out_dir is not None and most > 1 else out_dir
        # the status line says which run it counts the steps of: each run counts from 1
        label = "" if most == 1 else f"run {n} of {repeats}" if most == repeats else f"run {n} of up to {most}"
        if launcher_args is not None:
            result = run_job(target, module=module, script_args=script_args, launcher_args=launcher_args,
                             out_dir=run_out, steps=steps, script_stdout_to_stderr=script_stdout_to_stderr,
                             show_status=show_status, label=label)
            report = analyse_job(result.run_dir, config, write_rank_reports=True)
        else:
            result = run_script(target, module=module, script_args=script_args, out_dir=run_out, steps=steps,
                                script_stdout_to_stderr=script_stdout_to_stderr, show_status=show_status,
                                label=label)
            if result.reason == "not-started":  # nothing ran: no report of an empty run
                raise PerfdoctorError(f"{target} did not start: {result.detail}", EXIT_SCRIPT_FAILED)
            report = analyse_run(result.run_dir, config)
        results.append(result)
        reports.append(report)
        write_run_reports(report, result.run_dir)
        record = None if result.exit_code != 0 or result.reason == "interrupted" else record_from_run_dir(result.run_dir)
        try:
            record_run(history, result.run_dir, "gate" if base is not None else "run", record)
        except PerfdoctorError as e:  # the run and its report stand; only its place in the history is lost
            messages.append(f"warning: the run was not kept in the history: {e.message}")
        return record

    records: list[RunRecord] = []
    comparison: Comparison | None = None
    if base is not None:
        gated = gate_runs(base, next_run, repeats=repeats, max_repeats=most, max_regression=max_regression,
                          fail_on=fail_on, strict=strict, co_runner_slowdown=co_runner_slowdown)
        records, comparison = gated.records, gated.comparison
    else:
        n = 0
        while n < repeats or (save_baseline is not None and n < most
                              and not baseline_resolves(records, max_regression, DEFAULT_MAX_REPEATS)):
            n += 1
            record = next_run(n)
            if record is None:
                break
            records.append(record)
        if save_baseline is not None and len(records) > repeats:
            messages.append(f"the baseline's first {repeats} runs disagreed more than a gate against them could "
                            f"tell a {RESOLVE_FACTOR * max_regression:.0%} change from {max_regression:.0%}: "
                            f"{len(records) - repeats} run(s) added ({len(records)} in all, --max-repeats {most})")
    outcome = RunOutcome(report=reports[-1], results=results, comparison=comparison, fail_on=fail_on,
                         messages=messages)
    if len(records) < len(results):  # the last run failed or was interrupted: nothing saved or judged
        return outcome
    if save_baseline is not None:
        write_baseline(records, save_baseline)
        outcome.messages.append(f"baseline of {len(records)} run(s) saved to {save_baseline}")
        for i, frac in interfered_runs(records, max_regression):
            outcome.messages.append(
                f"warning: run {i + 1} of {len(records)} was {frac:.0%} slower than the others, even in its fastest "
                f"steps: something outside the script held the machine. Gates against this baseline set it "
                f"aside; with fewer runs left they are less decisive (or record it again).")
    return outcome


def keep_in_history(store: Path | None, path: Path) -> list[str]:
    """`perfdoctor report RUN_FOLDER` keeps the run folder in the history (a run kept before is updated,
    never doubled); a trace alone is not a run. Lines for stderr where it could not be kept."""
    if store is None or not (is_run_dir(path) or is_job_dir(path)) or not (path / "report.json").is_file():
        return []
    try:
        record_run(store, path, "report")
    except PerfdoctorError as e:  # the report stands; only its place in the history is lost
        return [f"warning: the run was not kept in the history: {e.message}"]
    return []


# -- `perfdoctor verify`: each finding's fix measured on a copy of the project ------------------------

def verify_report(report: Report, run_dir: Path, *, config: Path | None = None, steps: int | None = None,
                  pairs: int | None = None, max_pairs: int | None = None) -> VerifyOutcome:
    """Verify the findings of `report`, the analysis of `run_dir` (perfdoctor.verify): each finding gets
    its `verification`, the report its notes, and the run folder's report.json and report.html are
    written again with them."""
    from perfdoctor import verify

    _, rules, _ = rules_for(config)
    outcome = verify.verify(report, run_dir, rules, steps=steps, pairs=pairs or verify.PAIRS,
                            max_pairs=max(pairs or verify.PAIRS, max_pairs or verify.MAX_PAIRS))
    report.notes.extend(outcome.notes)
    write_run_reports(report, run_dir)
    return outcome


def verify_path(path: Path, *, config: Path | None = None, **kwargs: int | None) -> tuple[Report, VerifyOutcome]:
    """`perfdoctor verify RUN_FOLDER`: the run folder's analysis (a job folder's: the merged one), verified
    (a job's runs launched as it was: verify.launch_of)."""
    if is_job_dir(path):
        report = analyse_job(path, config)
    elif (path / "meta.json").is_file():
        report = analyse_run(path, config)
    else:
        raise InputError(f"{path}: not a run folder (no meta.json) nor a job folder (rank-<R>/meta.json); "
                         f"give a run folder or a script")
    return report, verify_report(report, path, config=config, **kwargs)
