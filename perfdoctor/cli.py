"""The `perfdoctor` command line. Never imports torch: only the child process of `run` does."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

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


def _emit(report, fmt: Format, output: Optional[Path]) -> None:
    """Write the report: machine formats to stdout or --output without rich; text to the terminal."""
    if fmt is Format.text:
        if output is not None:
            with output.open("w", encoding="utf-8") as fh:
                from perfdoctor.report import text

                text.render(report, Console(file=fh, width=100, no_color=True, soft_wrap=True))
            Console(stderr=True).print(f"report written to {output}")
        else:
            from perfdoctor.report import text

            text.render(report, Console())
        return
    doc = render_machine(report, fmt)
    if output is not None:
        output.write_text(doc, encoding="utf-8")
    else:
        sys.stdout.write(doc)
        sys.stdout.flush()


def render_machine(report, fmt: Format) -> str:
    if fmt is Format.json:
        from perfdoctor.report import jsonfmt

        return jsonfmt.render(report)
    if fmt is Format.markdown:
        from perfdoctor.report import markdown

        return markdown.render(report)
    if fmt is Format.sarif:
        from perfdoctor.report import sarif
        from perfdoctor.rules.catalog import load_rules

        return sarif.render(report, [r.as_dict() for r in load_rules()])
    from perfdoctor.report import github

    return github.render(report)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="The training script (arguments for it go after --)."),
    module: Optional[str] = typer.Option(None, "-m", "--module", help="Run a module, as `python -m` does."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Stop the script after N optimizer steps."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Report format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="The run folder (default .perfdoctor/runs/...)."),
) -> None:
    """Run a training script under the profiler and print what slows it down."""
    from perfdoctor.capture.runner import run_script
    from perfdoctor.report.build import analyse_run

    if (script is None) == (module is None):
        raise PerfdoctorError("give a script (`perfdoctor run train.py`) or a module (`perfdoctor run -m pkg.train`)")
    target = module if module is not None else script
    if module is None and not Path(script).is_file():
        raise PerfdoctorError(f"{script}: no such script")
    result = run_script(
        target, module=module is not None, script_args=list(ctx.args), out_dir=out_dir, steps=steps,
        script_stdout_to_stderr=fmt is not Format.text and output is None,
        show_status=fmt is Format.text or output is not None,
    )
    report = analyse_run(result.run_dir)
    from perfdoctor.report import jsonfmt

    (result.run_dir / "report.json").write_text(jsonfmt.render(report), encoding="utf-8")
    _emit(report, fmt, output)
    if result.exit_code != 0 and result.reason in ("exception", "sys-exit", "killed"):
        raise typer.Exit(EXIT_SCRIPT_FAILED)
    if result.reason == "interrupted":
        raise typer.Exit(130)


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
        import orjson

        sys.stdout.write(orjson.dumps([r.as_dict() for r in rules], option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.table import Table

    t = Table(show_edge=False)
    for col in ("id", "name", "severity", "what it finds"):
        t.add_column(col)
    for r in rules:
        t.add_row(r.id, r.name, r.severity, r.summary)
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
    Console().print(Markdown("\n\n".join(parts)))


def _err(msg: str) -> None:
    """One line on stderr, never wrapped."""
    sys.stderr.write(f"perfdoctor: {msg}\n")
    sys.stderr.flush()


def main() -> None:
    if len(sys.argv) == 1:
        sys.argv.append("--help")
    try:
        app(standalone_mode=False)
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
