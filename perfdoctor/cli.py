"""The `perfdoctor` command line. Never imports torch: only the child process of `run` does."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

try:  # typer >= 0.2x vendors click; older typer uses click itself
    from typer import TyperException as _UsageError
except ImportError:  # pragma: no cover
    from click import ClickException as _UsageError

from perfdoctor import __version__
from perfdoctor.errors import EXIT_GATE_FAILED, EXIT_SCRIPT_FAILED, EXIT_USAGE, PerfdoctorError

app = typer.Typer(
    name="perfdoctor",
    help="A doctor for PyTorch training performance: what is slow, what it costs per step, where, and the fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
_state = {"debug": False}


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    sarif = "sarif"
    github = "github"


class Severity(str, Enum):
    high = "high"
    medium = "medium"
    low = "low"


def _version(value: bool) -> None:
    if value:
        print(f"perfdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    _state["debug"] = debug or bool(os.environ.get("PERFDOCTOR_DEBUG"))


def _write(body: str, output: Optional[Path]) -> None:
    """A machine document: to --output, or to stdout alone."""
    if output is not None:
        output.write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
        sys.stdout.flush()


def _text(draw, output: Optional[Path]) -> None:
    """Human text: rich on the terminal, or plain text into --output."""
    from rich.console import Console  # not imported for machine formats: start-up time counts in CI

    if output is None:
        draw(Console())
        return
    with output.open("w", encoding="utf-8") as fh:
        draw(Console(file=fh, width=100, no_color=True))
    sys.stderr.write(f"perfdoctor: report written to {output}\n")


def _emit(report, fmt: Format, output: Optional[Path]) -> None:
    if fmt is Format.text:
        from perfdoctor.report import text

        _text(lambda console: text.render(report, console), output)
    else:
        _write(render_machine(report, fmt), output)


def render_machine(report, fmt: Format) -> str:
    if fmt is Format.json:
        from perfdoctor.report import jsonfmt

        return jsonfmt.render(report)
    if fmt is Format.markdown:
        from perfdoctor.report import markdown

        return markdown.render(report)
    if fmt is Format.sarif:
        from perfdoctor.report import sarif

        return sarif.render(report)
    from perfdoctor.report import github

    return github.render(report)


def parse_fraction(text: str) -> float:
    """`10%`, `10` or `0.1` -> 0.1."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise PerfdoctorError(f"--max-regression {text!r}: give a percentage such as 10%") from None
    if not t.endswith("%") and v >= 1:
        v /= 100
    if not 0 < v < 10:
        raise PerfdoctorError(f"--max-regression {text!r}: must be between 0% and 1000%")
    return v


def _gate_output(report, comparison, fmt: Format, output: Optional[Path]) -> None:
    """The report, then the gate's verdict, in the chosen format (one document for machine formats)."""
    from perfdoctor.report import markdown

    if comparison is not None and os.environ.get("GITHUB_STEP_SUMMARY"):
        markdown.append_step_summary(markdown.render(comparison))
    if comparison is None:
        _emit(report, fmt, output)
        return
    if fmt is Format.text:
        from perfdoctor.report import text

        def draw(console) -> None:
            text.render(report, console)
            text.render_comparison(comparison.as_dict(), console)

        _text(draw, output)
        return
    if fmt is Format.json:
        from perfdoctor.report import jsonfmt

        _write(jsonfmt.dumps({**report.as_dict(), "gate": comparison.as_dict()}), output)
    elif fmt is Format.markdown:
        _write(markdown.render(report) + "\n" + markdown.render(comparison), output)
    elif fmt is Format.github:
        from perfdoctor.report import github

        _write(github.render(report) + github.render(comparison), output)
    else:  # sarif: the findings, each marked new or unchanged since the baseline; the verdict in properties
        from perfdoctor.report import sarif

        _write(sarif.render(report, comparison=comparison), output)


def _warm_up_analysis() -> None:
    """Import the analysis (trace loader, static read, libcst for fixes) in a background thread while
    the script runs in its child process: the parent is idle then, and the report comes sooner."""
    import importlib
    import threading

    def load() -> None:
        for name in ("perfdoctor.facts.run_facts", "perfdoctor.facts.static", "perfdoctor.trace.loader",
                     "perfdoctor.facts.trace", "perfdoctor.rules.fixes", "perfdoctor.report.text"):
            try:
                importlib.import_module(name)
            except ImportError:  # reported properly when the analysis imports it for real
                return

    threading.Thread(target=load, name="perfdoctor-warm-up", daemon=True).start()


def _fails_on(report, fail_on: Optional[Severity]) -> bool:
    from perfdoctor.model import at_or_above

    return fail_on is not None and any(at_or_above(f.severity, fail_on.value) for f in report.findings)


GATE_REPEATS = 3


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="The training script (arguments for it go after --)."),
    module: Optional[str] = typer.Option(None, "-m", "--module", help="Run a module, as `python -m` does."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Stop the script after N optimizer steps."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Report format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="The run folder (default .perfdoctor/runs/...)."),
    save_baseline: Optional[Path] = typer.Option(None, "--save-baseline", help="Record a baseline to this file."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Compare with this baseline (CI gate)."),
    max_regression: str = typer.Option("10%", "--max-regression", help="Slowdown that fails the gate."),
    repeats: Optional[int] = typer.Option(
        None, "--repeats", min=1, max=50,
        help="Run the script this many times (default: 3 with --save-baseline or --baseline, else 1)."),
    fail_on: Optional[Severity] = typer.Option(None, "--fail-on", help="Fail on (new) findings of this severity or worse."),
) -> None:
    """Run a training script under the profiler and print what slows it down."""
    from perfdoctor.capture.runner import run_script
    from perfdoctor.report import jsonfmt
    from perfdoctor.report.build import analyse_run

    script_args = list(ctx.args)
    if module is not None and script is not None:
        script_args.insert(0, script)  # `run -m pkg -- args`: the first argument belongs to the module
        script = None
    if script is None and module is None:
        raise PerfdoctorError("give a script (`perfdoctor run train.py`) or a module (`perfdoctor run -m pkg.train`)")
    target = module if module is not None else script
    if module is None and not Path(script).is_file():
        raise PerfdoctorError(f"{script}: no such script")
    threshold = parse_fraction(max_regression)
    if repeats is None:  # the gate's unit of evidence is a run: it needs several to know their noise
        repeats = GATE_REPEATS if (save_baseline is not None or baseline is not None) else 1
    _warm_up_analysis()
    base = None
    if baseline is not None:
        from perfdoctor.gate.baseline import load_baseline

        base = load_baseline(baseline)  # fail early on a bad baseline, before minutes of running
    results, report = [], None
    for i in range(repeats):
        run_out = out_dir / f"repeat-{i + 1}" if out_dir is not None and repeats > 1 else out_dir
        result = run_script(
            target, module=module is not None, script_args=script_args, out_dir=run_out, steps=steps,
            script_stdout_to_stderr=fmt is not Format.text and output is None,
            show_status=fmt is Format.text or output is not None,
        )
        results.append(result)
        report = analyse_run(result.run_dir)
        (result.run_dir / "report.json").write_text(jsonfmt.render(report), encoding="utf-8")
        if result.exit_code != 0 or result.reason == "interrupted":
            break  # a failed or interrupted run is not repeated
    result = results[-1]
    comparison = None
    if result.reason not in ("exception", "sys-exit", "killed", "interrupted") or result.exit_code == 0:
        if save_baseline is not None or base is not None:
            from perfdoctor.gate.baseline import record_from_run_dir, save_baseline as save

            records = [record_from_run_dir(r.run_dir) for r in results]
            if save_baseline is not None:
                save(records, save_baseline)
                sys.stderr.write(f"perfdoctor: baseline of {len(records)} run(s) saved to {save_baseline}\n")
                from perfdoctor.gate.baseline import slow_outlier_runs

                for n, frac in slow_outlier_runs(records, threshold / 2):
                    sys.stderr.write(f"perfdoctor: warning: run {n} of {len(records)} was {frac:.0%} slower than the "
                                     f"others, even in its fastest steps: another job may have held the machine. "
                                     f"Gates against this baseline will be less decisive; record it again.\n")
            if base is not None:
                from perfdoctor.gate.compare import compare

                comparison = compare(base, records, threshold, fail_on.value if fail_on else None)
    _gate_output(report, comparison, fmt, output)
    if result.exit_code != 0 and result.reason in ("exception", "sys-exit", "killed"):
        raise typer.Exit(EXIT_SCRIPT_FAILED)
    if result.reason == "interrupted":
        raise typer.Exit(130)
    if comparison is not None and comparison.failed:
        raise typer.Exit(EXIT_GATE_FAILED)
    if comparison is None and _fails_on(report, fail_on):
        raise typer.Exit(EXIT_GATE_FAILED)


@app.command()
def compare(
    base: Path = typer.Argument(..., help="The baseline: a baseline file, a run folder or a report.json."),
    current: Path = typer.Argument(..., help="The current run: a baseline file, a run folder or a report.json."),
    max_regression: str = typer.Option("10%", "--max-regression", help="Slowdown that fails the gate."),
    fail_on: Optional[Severity] = typer.Option(None, "--fail-on", help="Fail on new findings of this severity or worse."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Output format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the comparison to this file."),
) -> None:
    """Compare two baselines or run reports; exit 1 on a regression."""
    from perfdoctor.gate.compare import compare_files

    for p in (base, current):
        if not p.exists():
            raise PerfdoctorError(f"{p}: no such file or folder")
    c = compare_files(base, current, parse_fraction(max_regression), fail_on.value if fail_on else None)
    if fmt is Format.text:
        from perfdoctor.report import text

        _text(lambda console: text.render_comparison(c.as_dict(), console), output)
    elif fmt is Format.json:
        from perfdoctor.report import jsonfmt

        _write(jsonfmt.dumps(c.as_dict()), output)
    elif fmt is Format.markdown:
        from perfdoctor.report import markdown

        _write(markdown.render(c), output)
    elif fmt is Format.github:
        from perfdoctor.report import github

        _write(github.render(c), output)
    else:
        from perfdoctor.report import sarif

        _write(sarif.render(None, comparison=c), output)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        from perfdoctor.report import markdown

        markdown.append_step_summary(markdown.render(c))
    if c.failed:
        raise typer.Exit(EXIT_GATE_FAILED)


@app.command()
def report(
    path: Path = typer.Argument(..., help="A trace (.json / .json.gz), a folder of per-rank traces, or a run folder."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Report format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
) -> None:
    """Analyse an existing torch.profiler trace or a run folder."""
    from perfdoctor.report.build import analyse_path

    _emit(analyse_path(path), fmt, output)


@app.command("rules")
def rules_cmd(fmt: Format = typer.Option(Format.text, "--format", "-f", help="text or json.")) -> None:
    """List every rule."""
    from perfdoctor.rules.catalog import load_rules

    rules = load_rules()
    if fmt is Format.json:
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


@app.command()
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
    if r.thresholds:
        parts += ["## Options", "Set in `pyproject.toml` under `[tool.perfdoctor.thresholds." + r.id + "]`:",
                  "\n".join(f"- `{k}` = {v!r}" for k, v in r.thresholds.items())]
    if d.references:
        parts += ["## References", "\n".join(f"- <{u}>" for u in d.references)]
    from rich.console import Console

    Console().print(Markdown("\n\n".join(parts)))


def _err(msg: str) -> None:
    """One line on stderr, never wrapped."""
    sys.stderr.write(f"perfdoctor: {msg}\n")
    sys.stderr.flush()


def main() -> None:
    if len(sys.argv) == 1:
        sys.argv.append("--help")
    try:
        code = app(standalone_mode=False)  # an Exit inside a command comes back as its code
        sys.exit(code if isinstance(code, int) else 0)
    except PerfdoctorError as e:
        if _state["debug"]:
            raise
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
    except Exception as e:  # anything unexpected: one line, unless --debug
        if _state["debug"]:
            raise
        _err(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback, and please report it)")
        sys.exit(EXIT_USAGE)


__all__ = ["app", "main", "EXIT_GATE_FAILED"]
