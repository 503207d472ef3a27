"""The `perfdoctor` command line. Never imports torch: only the child process of `run` does."""

from __future__ import annotations

import difflib
import math
import os
import sys
import traceback
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from perfdoctor import __version__
from perfdoctor.errors import EXIT_GATE_FAILED, EXIT_SCRIPT_FAILED, EXIT_USAGE, PerfdoctorError
from perfdoctor.model import SEVERITIES
from perfdoctor.report.escape import error_line
from perfdoctor.report.formats import FORMATS, render

_UsageError: type[Exception]
try:  # typer >= 0.2x vendors click; older typer uses click itself
    from typer import TyperException as _UsageError
except ImportError:  # pragma: no cover
    from click import ClickException as _UsageError

class _Command(typer.core.TyperCommand):
    """Every command's parsing: `--debug` is taken wherever it stands before `--` (the README lists it
    with the common options: `perfdoctor run --debug x.py` as well as `perfdoctor --debug run x.py`).
    A command that passes arguments on (`run`, allow_extra_args) parses only what stands before the
    first `--`; what follows it is kept apart, as it is, in `ctx.meta["after_dashes"]`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        cut = args.index("--") if "--" in args else len(args)
        before, after = args[:cut], args[cut + 1:]
        if "--debug" in before:
            _state["debug"] = True
            before = [a for a in before if a != "--debug"]
        if not ctx.allow_extra_args:
            return super().parse_args(ctx, before + args[cut:])
        ctx.meta["after_dashes"] = list(after)
        return super().parse_args(ctx, before)


app = typer.Typer(
    name="perfdoctor",
    help="A doctor for PyTorch training performance: what is slow, what it costs per step, where, and the fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
_state = {"debug": False}


# one choice per entry of the format registry (perfdoctor/report/formats.py)
Format = Enum("Format", {name: name for name in FORMATS}, type=str)  # type: ignore[misc]  # members from the registry


# the one order, worst first
Severity = Enum("Severity", {name: name for name in SEVERITIES}, type=str)  # type: ignore[misc]  # from SEVERITIES


CO_HELP = ("Under contention, how much slower the same work may run per CPU's worth of other processes' work "
           "beyond the baseline's (default 17%, measured on a 2-vCPU VM whose vCPUs are SMT siblings; "
           "docs/busy-machine.md says how to measure it on your runners). 0 turns the allowance off.")
CONFIG_HELP = "Settings file ([tool.perfdoctor]); default: pyproject.toml in the current directory."
HISTORY_HELP = ("The run history (SQLite) to keep this run in and read from; default .perfdoctor/history.sqlite "
                "here, or PERFDOCTOR_HISTORY; `off` keeps nothing.")


def _version(value: bool) -> None:
    if value:
        print(f"perfdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    _state["debug"] = _state["debug"] or debug or bool(os.environ.get("PERFDOCTOR_DEBUG"))


def _write(body: str, output: Path | None) -> None:
    """A machine document: to --output, or to stdout alone."""
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)  # check_writable made none: nothing left behind on an error
        output.write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
        sys.stdout.flush()


def _print(renderable, output: Path | None) -> None:
    """Human text: rich on the terminal, or plain text into --output."""
    from rich.console import Console  # not imported for machine formats: start-up time counts in CI

    if output is None:
        Console().print(renderable)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as fh:
        Console(file=fh, width=100, no_color=True).print(renderable)
    sys.stderr.write(f"perfdoctor: report written to {output}\n")


def _emit(fmt: Format, output: Path | None, report=None, comparison=None) -> None:
    """A report, a comparison, or both, rendered in the chosen format and written."""
    doc = render(fmt.value, report, comparison)
    if FORMATS[fmt.value].console:
        _print(doc, output)
    else:
        _write(doc, output)


def _step_summary(comparison) -> None:
    """On GitHub Actions, the gate's verdict is appended to the job's summary page too."""
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        from perfdoctor.report import markdown

        markdown.append_step_summary(markdown.render_comparison(comparison))


def parse_fraction(text: str, option: str = "--max-regression", most: float = 10.0) -> float:
    """`10%`, `10` or `0.1` -> 0.1; `--max-regression` above 0, `--co-runner-slowdown` 0 or more, each
    below `most`."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise PerfdoctorError(f"{option} {text!r}: give a percentage such as 10%") from None
    if not t.endswith("%") and v >= 1:
        v /= 100
    if not (0 <= v if option == "--co-runner-slowdown" else 0 < v) or not v < most or math.isnan(v):
        raise PerfdoctorError(f"{option} {text!r}: must be between 0% and {most:.0%}")
    return v


# a distributed job's launch (torch.distributed.run's options), for `run` and `verify` alike
NPROC_PER_NODE = typer.Option(
    None, "--nproc-per-node", "--nproc_per_node",
    help="Distributed: processes (ranks) per node, launched by torch.distributed.run, every rank profiled.")
NNODES = typer.Option(None, "--nnodes", help="Distributed: nodes (N or MIN:MAX), as torchrun.")
NODE_RANK = typer.Option(None, "--node-rank", "--node_rank", help="Distributed: this node's rank.")
RDZV_ENDPOINT = typer.Option(None, "--rdzv-endpoint", "--rdzv_endpoint", help="Distributed: rendezvous HOST:PORT, as torchrun.")
RDZV_BACKEND = typer.Option(None, "--rdzv-backend", "--rdzv_backend", help="Distributed: as torchrun.")
RDZV_ID = typer.Option(None, "--rdzv-id", "--rdzv_id", help="Distributed: as torchrun.")
MASTER_ADDR = typer.Option(None, "--master-addr", "--master_addr", help="Distributed: as torchrun.")
MASTER_PORT = typer.Option(None, "--master-port", "--master_port", help="Distributed: as torchrun.")


def _launcher(target: str, module: str | None, script_args: list[str], nproc_per_node: str | None,
              **more: object) -> tuple[list[str] | None, str, str | None, list[str]]:
    """torch.distributed.run's options from the launch options (`--nproc-per-node` and `more`, by their
    parameter names), or from a `torchrun ... train.py` command line given as the target (the job,
    every rank profiled, never the launcher alone): (the options, None for a plain run; the target, the
    module or None, the script's arguments)."""
    from perfdoctor.capture.runner import is_launcher, split_launcher_args

    launcher: list[str] | None = None
    for name, value in (("nproc_per_node", nproc_per_node), *more.items()):
        if value is not None:
            launcher = (launcher or []) + ["--" + name.replace("_", "-"), str(value)]
    if is_launcher(target, module is not None):
        extra, target, is_module, script_args = split_launcher_args(script_args)
        return (launcher or []) + extra, target, target if is_module else None, script_args
    if launcher is not None and nproc_per_node is None:
        raise PerfdoctorError("--nnodes, --node-rank and the rendezvous options need --nproc-per-node N")
    return launcher, target, module, script_args


@app.command(cls=_Command, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    script: str | None = typer.Argument(None, help="The training script (arguments for it go after --)."),
    module: str | None = typer.Option(None, "-m", "--module", help="Run a module, as `python -m` does."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Stop the script after N optimizer steps."),
    fmt: Format = typer.Option(Format("text"), "--format", "-f", help="Report format."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="The run folder (default .perfdoctor/runs/...)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the previous run in --out-dir."),
    save_baseline: Path | None = typer.Option(None, "--save-baseline", help="Record a baseline to this file."),
    baseline: Path | None = typer.Option(None, "--baseline", help="Compare with this baseline (CI gate)."),
    max_regression: str = typer.Option("10%", "--max-regression", help="Slowdown that fails the gate."),
    repeats: int | None = typer.Option(
        None, "--repeats", min=1, max=50,
        help="Run the script this many times (default: 3 with --save-baseline or --baseline, else 1)."),
    max_repeats: int | None = typer.Option(
        None, "--max-repeats", min=1, max=50,
        help="With --baseline: while the step time is undecided (unstable or inconclusive), add runs of the "
             "current script up to this many in all (default: 8). With --save-baseline: while the baseline's "
             "runs disagree too much for a gate to decide a change of 1.5x --max-regression, add runs up to "
             "this many."),
    strict: bool = typer.Option(False, "--strict", help="With --baseline: fail when the gate stays undecided."),
    co_runner_slowdown: str = typer.Option("17%", "--co-runner-slowdown", help=CO_HELP),
    fail_on: Severity | None = typer.Option(None, "--fail-on", help="Fail on (new) findings of this severity or worse."),
    config: Path | None = typer.Option(None, "--config", help=CONFIG_HELP),
    nproc_per_node: str | None = NPROC_PER_NODE,
    nnodes: str | None = NNODES,
    node_rank: int | None = NODE_RANK,
    rdzv_endpoint: str | None = RDZV_ENDPOINT,
    rdzv_backend: str | None = RDZV_BACKEND,
    rdzv_id: str | None = RDZV_ID,
    master_addr: str | None = MASTER_ADDR,
    master_port: int | None = MASTER_PORT,
    history: str | None = typer.Option(None, "--history", help=HISTORY_HELP),
    history_baseline: int | None = typer.Option(
        None, "--history-baseline", min=1, max=50,
        help="Gate against the newest N recorded runs of this script and its arguments (see --base-branch) "
             "instead of a baseline file."),
    base_branch: str | None = typer.Option(
        None, "--base-branch",
        help="With --history-baseline: only runs recorded on this git branch (default: the CI's base branch, "
             "GITHUB_BASE_REF or CI_MERGE_REQUEST_TARGET_BRANCH_NAME, where set; else any branch)."),
    verify: bool = typer.Option(False, "--verify", help="Then measure each finding's fix on a copy (perfdoctor verify)."),
    write_patch: Path | None = typer.Option(None, "--write-patch", help="With --verify: the verified fixes as one diff."),
) -> None:
    """Run a training script under the profiler and print what slows it down."""
    from perfdoctor.capture.runner import is_launcher
    from perfdoctor.orchestrate import check_writable, claim_out_dir, run_and_gate

    after = list(ctx.meta.get("after_dashes", []))
    if script is None and module is None and after:
        script = after.pop(0)  # `run --steps 5 -- train.py --lr 1`
    target = module if module is not None else script
    if target is not None and not is_launcher(target, module is not None):
        _no_unknown_options(ctx, list(ctx.args), target)
    script_args = list(ctx.args) + after
    if module is not None and script is not None:
        script_args.insert(0, script)  # `run -m pkg -- args`: the first argument belongs to the module
        script = None
    target = module if module is not None else script
    if target is None:
        raise PerfdoctorError("give a script (`perfdoctor run train.py`) or a module (`perfdoctor run -m pkg.train`)")
    # `perfdoctor run torchrun ... train.py` or `run -m torch.distributed.run -- ... train.py`: the job
    launcher, target, module, script_args = _launcher(
        target, module, script_args, nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend, rdzv_id=rdzv_id, master_addr=master_addr, master_port=master_port)
    if module is None and not Path(target).is_file():
        raise PerfdoctorError(f"{target}: no such script")
    fraction = parse_fraction(max_regression)
    output = _rank_output(output) if launcher is None else output
    for path, option in ((output, "--output"), (save_baseline, "--save-baseline")):
        if path is not None:
            check_writable(path, option)  # before minutes of running, not after
    if baseline is not None and history_baseline is not None:
        raise PerfdoctorError("give --baseline FILE or --history-baseline N, not both")
    # beside perfdoctor's own run folders; runs written where the user said are kept where the user says
    from perfdoctor.history.store import DEFAULT_PATH

    store = _history_path(history, None if out_dir is not None else DEFAULT_PATH)
    if base_branch is None and history_baseline is not None:
        base_branch = os.environ.get("GITHUB_BASE_REF") or os.environ.get("CI_MERGE_REQUEST_TARGET_BRANCH_NAME") or None
    human = FORMATS[fmt.value].console
    with claim_out_dir(out_dir, overwrite) as run_root:
        outcome = run_and_gate(
            target, module=module is not None, script_args=script_args,
            out_dir=run_root, steps=steps, script_stdout_to_stderr=not human and output is None,
            show_status=True, repeats=repeats, save_baseline=save_baseline, baseline=baseline,
            max_regression=fraction, fail_on=fail_on.value if fail_on else None, config=config,
            max_repeats=max_repeats, strict=strict, launcher_args=launcher, history=store,
            history_baseline=history_baseline, base_branch=base_branch,
            co_runner_slowdown=parse_fraction(co_runner_slowdown, "--co-runner-slowdown", 1.0))
    for line in outcome.messages:
        _err(line)
    if outcome.comparison is not None:
        _step_summary(outcome.comparison)
    checked = None
    if verify and not (outcome.script_failed or outcome.interrupted):
        from perfdoctor.orchestrate import verify_report

        checked = verify_report(outcome.report, outcome.result.run_dir, config=config, steps=steps)
        _write_patch(checked, write_patch)
    _emit(fmt, output, outcome.report, outcome.comparison)
    if checked is not None and checked.interrupted:
        raise typer.Exit(130)
    if outcome.script_failed:
        raise typer.Exit(EXIT_SCRIPT_FAILED)
    if outcome.interrupted:  # the script's own code: 130 after a KeyboardInterrupt, 0 where its handler exited 0
        raise typer.Exit(outcome.result.exit_code)
    if outcome.gate_failed:
        raise typer.Exit(EXIT_GATE_FAILED)


def _no_unknown_options(ctx: typer.Context, extra: list[str], target: str) -> None:
    """An option `run` does not know, standing before `--`, is a typo or the script's own: one error
    line with the nearest perfdoctor option and where the script's arguments go."""
    unknown = next((a for a in extra if a.startswith("-") and a != "-"), None)
    if unknown is None:
        return
    name = unknown.split("=", 1)[0]
    known = [o for p in ctx.command.params for o in getattr(p, "opts", []) if o.startswith("--")]
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f"did you mean {near[0]}? " if near else ""
    at = extra.index(unknown)
    raise PerfdoctorError(f"no such option: {name}; {hint}arguments for the script go after --: "
                          f"perfdoctor run [options] {target} -- {' '.join(extra[at:])}")


@app.command(cls=_Command, context_settings={"allow_extra_args": True})
def verify(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="A run folder, or a training script (its arguments after --)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Steps per run (default: the run's limit, else 30)."),
    repeats: int | None = typer.Option(None, "--repeats", min=1, max=20, help="Runs of each side before judging (3)."),
    max_repeats: int | None = typer.Option(None, "--max-repeats", min=1, max=20,
                                           help="Runs of each side at most, while undecided (6)."),
    write_patch: Path | None = typer.Option(None, "--write-patch", help="Write the verified fixes as one unified diff."),
    fmt: Format = typer.Option(Format("text"), "--format", "-f", help="Report format."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="A script's run folder (default .perfdoctor/runs/...)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the previous run in --out-dir."),
    config: Path | None = typer.Option(None, "--config", help=CONFIG_HELP),
    nproc_per_node: str | None = NPROC_PER_NODE,
    nnodes: str | None = NNODES,
    node_rank: int | None = NODE_RANK,
    rdzv_endpoint: str | None = RDZV_ENDPOINT,
    rdzv_backend: str | None = RDZV_BACKEND,
    rdzv_id: str | None = RDZV_ID,
    master_addr: str | None = MASTER_ADDR,
    master_port: int | None = MASTER_PORT,
) -> None:
    """Apply each finding's fix in a scratch copy of the project and measure what it saves."""
    from perfdoctor.analysis import is_job_dir
    from perfdoctor.orchestrate import check_writable, claim_out_dir, run_and_gate, verify_path, verify_report

    for p, option in ((output, "--output"), (write_patch, "--write-patch")):
        if p is not None:
            check_writable(p, option)
    opts: dict = {"config": config, "steps": steps, "pairs": repeats, "max_pairs": max_repeats}
    launcher, target, module, script_args = _launcher(
        path, None, list(ctx.args) + list(ctx.meta.get("after_dashes", [])), nproc_per_node, nnodes=nnodes,
        node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend, rdzv_id=rdzv_id,
        master_addr=master_addr, master_port=master_port)
    if (Path(path) / "meta.json").is_file() or is_job_dir(Path(path)):
        if launcher is not None:  # the folder knows its launch
            raise PerfdoctorError(f"{path}: a run folder is verified as it was launched; give no launch options")
        report, checked = verify_path(Path(path), **opts)
    elif Path(target).is_file() or module is not None:
        with claim_out_dir(out_dir, overwrite) as run_root:
            outcome = run_and_gate(target, module=module is not None, script_args=script_args, out_dir=run_root,
                                   steps=steps, script_stdout_to_stderr=True, show_status=True, config=config,
                                   launcher_args=launcher)
        if outcome.script_failed or outcome.interrupted:
            _emit(fmt, output, outcome.report)
            raise typer.Exit(EXIT_SCRIPT_FAILED if outcome.script_failed else 130)
        report, checked = outcome.report, verify_report(outcome.report, outcome.result.run_dir, **opts)
    else:
        raise PerfdoctorError(f"{path}: neither a run folder nor a script")
    _write_patch(checked, write_patch)
    _emit(fmt, output, report)
    if checked.interrupted:
        raise typer.Exit(130)


def _write_patch(checked, path: Path | None) -> None:
    if path is None:
        return
    path.write_text(checked.patch, encoding="utf-8")
    _err(f"the verified fixes written to {path} (git apply {path})" if checked.patch
         else f"no fix saved time measurably; {path} is empty")


def _rank_output(output: Path | None) -> Path | None:
    """Under an outside launcher (RANK set: torchrun or SLURM running perfdoctor on every rank), each
    rank writes --output with its rank in the name (`report.rank-1.json`), not over the others';
    `perfdoctor report JOB_FOLDER` merges the ranks."""
    from perfdoctor.contracts.run import rank_from_env

    rank = rank_from_env()
    if output is None or rank is None:
        return output
    return output.with_name(f"{output.stem}.rank-{rank.rank}{output.suffix}")


@app.command(cls=_Command)
def compare(
    base: Path = typer.Argument(..., help="The baseline: a baseline file, a run folder or a report.json."),
    current: Path = typer.Argument(
        ..., help="The current run: a baseline file, a run folder, a gate's --out-dir (all its runs) or a report.json."),
    max_regression: str = typer.Option("10%", "--max-regression", help="Slowdown that fails the gate."),
    fail_on: Severity | None = typer.Option(None, "--fail-on", help="Fail on new findings of this severity or worse."),
    strict: bool = typer.Option(False, "--strict", help="Fail when the step time is undecided."),
    co_runner_slowdown: str = typer.Option("17%", "--co-runner-slowdown", help=CO_HELP),
    fmt: Format = typer.Option(Format("text"), "--format", "-f", help="Output format."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the comparison to this file."),
    allow_different_args: bool = typer.Option(
        False, "--allow-different-args",
        help="Judge the pair although the script's arguments differ (you changed them on purpose)."),
) -> None:
    """Compare two baselines, run folders, gate --out-dirs or run reports; exit 1 on a regression."""
    from perfdoctor.analysis import compare_paths
    from perfdoctor.orchestrate import check_writable

    if output is not None:
        check_writable(output, "--output")
    c = compare_paths(base, current, parse_fraction(max_regression), fail_on.value if fail_on else None, strict,
                      allow_different_args=allow_different_args,
                      co_runner_slowdown=parse_fraction(co_runner_slowdown, "--co-runner-slowdown", 1.0))
    _emit(fmt, output, comparison=c)
    _step_summary(c)
    if c.failed:
        raise typer.Exit(EXIT_GATE_FAILED)


@app.command(cls=_Command)
def report(
    path: Path = typer.Argument(
        ..., help="A trace (.json / .json.gz), a folder of per-rank traces, a run folder, a repeated run's "
                  "--out-dir (its last run, with every run's step time noted), or a saved report.json."),
    fmt: Format = typer.Option(Format("text"), "--format", "-f", help="Report format."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    config: Path | None = typer.Option(None, "--config", help=CONFIG_HELP),
    history: str | None = typer.Option(None, "--history", help=HISTORY_HELP),
) -> None:
    """Analyse an existing torch.profiler trace or a run folder."""
    from perfdoctor.analysis import analyse_path
    from perfdoctor.orchestrate import check_writable, keep_in_history

    if output is not None:
        check_writable(output, "--output")
    store = _history_path(history, _beside_runs(path))
    report = analyse_path(path, config)
    for line in keep_in_history(store, path):
        _err(line)
    _emit(fmt, output, report)


@app.command("history", cls=_Command)
def history_cmd(
    script: str | None = typer.Option(None, "--script", help="The script's file name (or module) whose runs to show."),
    branch: str | None = typer.Option(None, "--branch", help="Only runs recorded on this git branch."),
    env: str = typer.Option("all", "--env",
                            help="all, latest (the newest run's environment only) or an environment key."),
    last: int | None = typer.Option(None, "--last", min=1, help="Only the newest N runs."),
    history: str | None = typer.Option(None, "--history", help=HISTORY_HELP),
    fmt: Format = typer.Option(Format("text"), "--format", "-f", help="text, json, markdown or html."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write it to this file."),
) -> None:
    """Show a script's recorded runs over time, with the change points in its step time."""
    from perfdoctor.history import Store
    from perfdoctor.history.view import build
    from perfdoctor.orchestrate import check_writable
    from perfdoctor.report.history import HISTORY_FORMATS, render_history

    if fmt.value not in HISTORY_FORMATS:
        raise PerfdoctorError(f"--format {fmt.value}: history is written as {', '.join(HISTORY_FORMATS)}")
    from perfdoctor.history.store import DEFAULT_PATH

    store = _history_path(history, DEFAULT_PATH)
    if store is None:
        raise PerfdoctorError("the history is off (--history off or PERFDOCTOR_HISTORY=off): nothing to show")
    if output is not None:
        check_writable(output, "--output")
    with Store(store, create=False) as s:
        view = build(s, script=script, branch=branch, env=env, last=last)
    doc = render_history(fmt.value, view)
    if FORMATS[fmt.value].console:
        _print(doc, output)
    else:
        _write(doc, output)


def _history_path(option: str | None, default: Path | None) -> Path | None:
    """The history store: --history, PERFDOCTOR_HISTORY, else `default`; None: no history."""
    from perfdoctor.history.store import resolve_path

    path = resolve_path(option, default)
    return None if path is None else Path(os.path.abspath(path))


def _beside_runs(path: Path) -> Path | None:
    """The store beside the default run folders a reported run folder lives in
    (`X/.perfdoctor/runs/RUN` -> `X/.perfdoctor/history.sqlite`); None elsewhere."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "runs" and parts[i - 1] == ".perfdoctor":
            return Path(*parts[:i]) / "history.sqlite"
    return None


# `rules` writes a table or a JSON list, nothing else: any other format is refused, not printed as text
RulesFormat = Enum("RulesFormat", {"text": "text", "json": "json"}, type=str)


@app.command("rules", cls=_Command)
def rules_cmd(fmt: RulesFormat = typer.Option(RulesFormat("text"), "--format", "-f", help="text or json.")) -> None:
    """List every rule."""
    from perfdoctor.rules.catalog import load_rules

    rules = load_rules()
    if fmt is RulesFormat("json"):
        from perfdoctor.report import jsonfmt

        sys.stdout.write(jsonfmt.dumps([r.as_dict() for r in rules]))
        return
    from rich.table import Table

    t = Table(show_edge=False)
    for col in ("id", "name", "severity", "what it finds"):
        t.add_column(col)
    for r in rules:
        t.add_row(r.id, r.name, r.severity, r.summary)
    from rich.console import Console

    Console().print(t)


@app.command(cls=_Command)
def explain(rule: str = typer.Argument(..., help="A rule id (PD002) or name (dataloader-workers).")) -> None:
    """Show a rule's documentation: what it does, why it is slow, an example and the fix."""
    from rich.markdown import Markdown

    from perfdoctor.rules.catalog import find_rule, load_rules

    r = find_rule(load_rules(), rule)
    if r is None:
        raise PerfdoctorError(f"no rule {rule!r}; `perfdoctor rules` lists them")
    d = r.doc
    parts = [f"# {r.id} {r.name}", f"*{r.summary}* (severity: {r.severity})", "## What it does", d.what,
             "## Why is this bad?", d.why]
    if d.example:
        parts += ["## Example", f"```python\n{d.example}\n```"]
    if d.use_instead:
        parts += ["## Use instead", f"```python\n{d.use_instead}\n```"]
    if d.fix_safety:
        parts += ["## Fix safety", d.fix_safety]
    parts += ["## When it fires", f"```\n{r.when}\n```"]
    if r.lets:
        parts += ["where", "```\n" + "\n".join(f"let.{k} = {v}" for k, v in r.lets.items()) + "\n```"]
    if r.thresholds:
        parts += ["## Options", "Set in `pyproject.toml` under `[tool.perfdoctor.thresholds." + r.id + "]`:",
                  "\n".join(f"- `{k}` = {v!r}" for k, v in r.thresholds.items())]
    if d.references:
        parts += ["## References", "\n".join(f"- <{u}>" for u in d.references)]
    from rich.console import Console

    Console().print(Markdown("\n\n".join(parts)))


def _err(msg: str) -> None:
    """One line on stderr, never wrapped: line breaks and control characters in `msg` (a file name
    from input, say) are shown as escapes (`escape.error_line`)."""
    sys.stderr.write(f"perfdoctor: {error_line(msg)}\n")
    sys.stderr.flush()


def main() -> None:
    if len(sys.argv) == 1:
        sys.argv.append("--help")
    try:
        code = app(standalone_mode=False)  # an Exit inside a command comes back as its code
        sys.exit(code if isinstance(code, int) else 0)
    except PerfdoctorError as e:
        if _state["debug"]:
            traceback.print_exc()
        _err(f"error: {e.message}")
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _err("aborted")
        sys.exit(130)
    except _UsageError as e:  # bad options or arguments
        code = getattr(e, "exit_code", EXIT_USAGE)
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        _err(f"error: {msg}")
        sys.exit(code if code else EXIT_USAGE)
    except Exception as e:  # anything unexpected: one line, with the traceback before it under --debug
        if _state["debug"]:
            traceback.print_exc()
        _err(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback, and please report it)")
        sys.exit(EXIT_USAGE)


__all__ = ["app", "main", "EXIT_GATE_FAILED"]
