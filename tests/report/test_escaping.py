"""Input text stays text in every output format (issue 9, "Injection into CI output").

A report and a gate comparison are built with a hostile string in every field that comes from input
(device and torch names, script path, frame file names, the user's code lines, finding titles,
messages and notes, hot spot names, a baseline's script name and finding file names), and each
format is checked for what a CI log or a rendered step summary would do with it: a line the GitHub
runner reads as a workflow command (`::` at a line start, `##[` anywhere), raw HTML, a heading,
a code span cut short, rich markup, terminal escape sequences, a line break that splits one line
into several. The hostile content must still be there, in escaped form.
"""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from rich.console import Console
from typer.testing import CliRunner

from perfdoctor import cli
from perfdoctor.contracts.baseline import GateFinding
from perfdoctor.contracts.report import BreakdownDoc, ExitDoc, HotLineDoc, RankRowDoc, RunInfoDoc, StepTimeDoc, SummaryDoc
from perfdoctor.gate import RunRecord, compare
from perfdoctor.gate.baseline import save_baseline
from perfdoctor.gate.compare import Comparison
from perfdoctor.model import Fact, Finding, Fix, Hotspot, Location, Report
from perfdoctor.report import escape, github, html, markdown, sarif
from perfdoctor.report.formats import render

# every injection class of the issue in one string: a workflow command on a line of its own (LF and
# CR), raw HTML, a backtick that ends a code span, a fake heading, ANSI colour and OSC (title,
# hyperlink) sequences, a C1 CSI, rich markup, a legacy `##[` command, a table pipe, a bidi override
HOSTILE = ("GPU\n::error title=X::y <img src=x onerror=alert(1)> tr`ain <script>alert(2)</script>\r::warning::cr"
           "\n# ✅ perfdoctor gate: passed\n\x1b[31mred\x1b]0;pwned\x07 \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\"
           " \x9b31m [bold red]markup[/] ##[error]legacy a|b \u202eevil\u202c\x00 ![i](http://t/p.png) [l](http://e)")
FILE = "/repo/src/tr`ain\n::error file=x::f.py"
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
ROOT = Path("/repo")


def _finding(rule: str = "PD002") -> Finding:
    return Finding(rule=rule, name="dataloader-workers", severity="high", title=f"title {HOSTILE}",
                   message=f"message {HOSTILE}\n{HOSTILE}", why=f"why {HOSTILE}", ms_per_step=12.0,
                   fraction_of_step=0.4, saving_basis=HOSTILE, confidence="high",
                   locations=[Location(FILE, 12, f"loader = DataLoader(ds)  # {HOSTILE}", HOSTILE)],
                   evidence=[Fact("dataloader.wait_ms", HOSTILE, "ms", "run", HOSTILE)],
                   fix=Fix(before=f"x = 1  # {HOSTILE}", after=f"x = 2  # {HOSTILE}", note=HOSTILE),
                   references=[f"https://example.com/{HOSTILE}"])


def hostile_report() -> Report:
    return Report(
        run=RunInfoDoc(script=f"/repo/{HOSTILE}.py", argv=[HOSTILE], device=HOSTILE, torch=HOSTILE,
                       step_clock=HOSTILE, run_dir=f"/runs/{HOSTILE}", exit=ExitDoc(reason=HOSTILE, code=1)),
        summary=SummaryDoc(step_time_ms=StepTimeDoc(median=50.0, p90=60.0, n=20), steps_observed=25, steps_profiled=5,
                           breakdown=[BreakdownDoc(HOSTILE, 20.0, 0.4), BreakdownDoc("forward", 30.0, 0.6)]),
        findings=[_finding()],
        hotspots=[Hotspot(function=HOSTILE, file=FILE, line=3, ms_per_step=5.0, calls_per_step=1.0,
                          lines=[HotLineDoc(line=4, code=HOSTILE, share=0.5)]),
                  Hotspot(function=HOSTILE, file=FILE, line=3, ms_per_step=1.0, calls_per_step=1.0,
                          process="dataloader-workers")],
        notes=[HOSTILE], ranks=[RankRowDoc(rank=0, file=HOSTILE, step_ms=50.0, idle_fraction=0.1)],
        facts={"device.name": Fact("device.name", HOSTILE, "", "trace", HOSTILE)})


def _records(script: str, n: int, mean: float, findings: list[GateFinding]) -> list[RunRecord]:
    env = {"torch": "2.13.0", "device": "cpu", "cpu_count": 2, "script": script, "args": [], "python": HOSTILE}
    return [RunRecord(HOSTILE, dict(env), [mean * (1 + 0.001 * (i % 7)) for i in range(40)], mean,
                      findings=list(findings), notes=[HOSTILE]) for _ in range(n)]


def _gate_finding(severity: str = "high") -> GateFinding:
    return GateFinding(rule="PD005", fingerprint=f"PD005:{HOSTILE}", severity=severity, title=HOSTILE, file=FILE,
                       line=7, code=HOSTILE)


def hostile_comparison() -> Comparison:
    """The baseline's script name differs (not comparable, so the note names both), a new finding
    with a hostile file name and title fails the gate, a resolved one from the baseline."""
    old = GateFinding(rule="PD003", fingerprint="PD003:old", severity="low", title=HOSTILE, file=FILE, line=1)
    return compare(_records(f"{HOSTILE}.py", 2, 10.0, [old]), _records("train.py", 1, 10.0, [_gate_finding()]),
                   fail_on="high")


# -- what every log-bound output must hold -----------------------------------------------------------------

def assert_log_safe(out: str, own_commands: int = 0) -> None:
    """No control character but LF and TAB, no legacy command, and no line the runner reads as a
    workflow command beyond perfdoctor's own `own_commands`."""
    assert not CONTROLS.search(out), repr(CONTROLS.search(out))
    assert "##[" not in out
    commands = [line for line in out.split("\n") if line.lstrip().startswith("::")]
    assert len(commands) == own_commands, commands


def _console_text(renderable: Any, width: int = 100) -> str:
    """As `--output FILE` writes a console format (and as a non-terminal CI log gets it)."""
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True).print(renderable)
    return buf.getvalue()


def _ansi_text(renderable: Any, width: int = 80) -> str:
    """As a colour terminal gets it: perfdoctor's own SGR sequences, nothing else."""
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system="standard").print(renderable)
    return buf.getvalue()


ANSI_OWN = re.compile(r"\x1b\[[0-9;]*m")  # rich's styles (SGR); no OSC, no title, no cursor moves


# -- text ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["report", "comparison", "both"])
def test_text_has_no_command_line_markup_or_escape_sequence(what: str) -> None:
    doc = render("text", hostile_report() if what != "comparison" else None,
                 hostile_comparison() if what != "report" else None)
    for width in (60, 80, 100, 137):
        out = _console_text(doc, width)
        assert_log_safe(out)
        assert "[bold red]markup[/]" in out  # shown as written, not read as markup
        assert "img src=x onerror=alert(1)" in out and "error title=X" in out
        coloured = _ansi_text(doc, width)
        assert_log_safe(ANSI_OWN.sub("", coloured))
        assert "pwned" in coloured and "\x1b]" not in coloured


def test_text_title_with_a_newline_stays_on_its_line() -> None:
    f = _finding()
    f.title = "slow loader\nsecond line"
    out = _console_text(render("text", Report(run=RunInfoDoc(), summary=SummaryDoc(), findings=[f])))
    assert "slow loader second line" in out


def test_text_guards_lines_that_word_wrap_starts_with_a_command() -> None:
    """Whatever the offset, rich's word wrap never leaves `::error` at a line start unguarded; the
    guard is what does it (some offsets do wrap right before `::`)."""
    guarded = 0
    for k in range(60):
        f = _finding()
        f.title = "w " * k + "::error title=X::wrapped"  # indented: the runner trims leading spaces
        report = Report(run=RunInfoDoc(script="train.py"), summary=SummaryDoc(), findings=[f], notes=["w " * k + "::error title=X::n"])
        out = _console_text(render("text", report), 80)
        assert_log_safe(out)
        assert all(len(line) <= 80 for line in out.split("\n"))
        guarded += sum(1 for line in out.split("\n") if line.lstrip().startswith("\\::error"))
    assert guarded > 0


# -- markdown, and the step summary ---------------------------------------------------------------------------

OWN_HEADINGS = re.compile(r"^(## perfdoctor: |### Findings \(\d+\)$|## (❌|✅|⚠️) perfdoctor gate: |### New findings$"
                          r"|### Resolved findings$)")


def assert_markdown_safe(md: str) -> None:
    assert_log_safe(md)
    for line in md.split("\n"):
        if line.startswith("#"):
            assert OWN_HEADINGS.match(line), line
    page = MarkdownIt("commonmark").enable("table").render(md)  # html on, as GitHub renders (then sanitises)
    for tag in ("<img", "<script", "<h1", "<a "):
        assert tag not in page, tag
    assert "&lt;img src=x onerror=alert(1)&gt;" in page or "&lt;img src=x onerror=alert(1)>" in page
    assert "# ✅ perfdoctor gate: passed" in page  # the fake heading, as text
    tables = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    for row in tables:  # each table keeps its columns: a pipe from input did not add one
        assert row.count("<td") in (0, 3, 6), row


@pytest.mark.parametrize("what", ["report", "comparison", "both"])
def test_markdown_has_no_command_line_html_or_heading(what: str) -> None:
    md = render("markdown", hostile_report() if what != "comparison" else None,
                hostile_comparison() if what != "report" else None)
    assert_markdown_safe(md)


def test_markdown_code_spans_hold_a_backtick_file_name() -> None:
    md = markdown.render_report(Report(run=RunInfoDoc(), summary=SummaryDoc(), findings=[_finding()]))
    page = MarkdownIt("commonmark").enable("table").render(md)
    assert "<code>tr`ain ::error file=x::f.py:12</code>" in page  # the whole name in one span
    assert escape.markdown_code("a`b") == "``a`b``" and escape.markdown_code("`x") == "`` `x ``"
    assert escape.markdown_code("plain.py:3") == "`plain.py:3`"


def test_step_summary_of_compare_escapes_the_baseline(tmp_path: Path) -> None:
    """`perfdoctor compare BASE CURRENT` on GitHub Actions: the baseline's script name (in the
    not-comparable note) and its findings' file names reach $GITHUB_STEP_SUMMARY escaped; the text
    on stdout is log-safe too."""
    base, cur = tmp_path / "base.json", tmp_path / "cur.json"
    old = GateFinding(rule="PD003", fingerprint="PD003:old", severity="low", title=HOSTILE, file=FILE, line=1)
    save_baseline(_records(f"{HOSTILE}.py", 2, 10.0, [old]), base)
    save_baseline(_records("train.py", 2, 10.0, [_gate_finding()]), cur)
    summary = tmp_path / "summary.md"
    for fmt in ("text", "github", "markdown"):
        result = CliRunner().invoke(cli.app, ["compare", str(base), str(cur), "--fail-on", "high", "--format", fmt],
                                    env={"GITHUB_STEP_SUMMARY": str(summary), "COLUMNS": "80"})
        assert result.exit_code == 1, result.output  # the new high finding fails the gate
        if fmt == "github":
            assert_github_safe(result.output)
        elif fmt == "markdown":
            assert_markdown_safe(result.output)
        else:
            assert_log_safe(result.output)
    written = summary.read_text()
    assert written.count("perfdoctor gate: failed") == 3
    assert_markdown_safe(written)
    assert "### New findings" in written and "### Resolved findings" in written
    assert "NOT COMPARABLE" in written and "&lt;script>" in written


# -- github ---------------------------------------------------------------------------------------------

COMMAND = re.compile(r"^::(error|warning|notice)( [^:]*)?::(.*)$")


def assert_github_safe(out: str) -> None:
    lines = out.rstrip("\n").split("\n")
    assert_log_safe(out, own_commands=len(lines))
    for line in lines:
        m = COMMAND.match(line)
        assert m, line
        for prop in (m.group(2) or "").strip().split(","):
            if prop:
                key, _, value = prop.partition("=")
                assert key in ("file", "line", "title") and "," not in value and ":" not in value, prop


def test_github_commands_escape_data_and_properties() -> None:
    out = github.render_both(hostile_report(), hostile_comparison(), root=ROOT)
    assert_github_safe(out)
    assert "GPU%0A::error title=X::y" in out and "%0D::warning::cr" in out  # the breaks, as the runner wants them
    assert "file=src/tr`ain%0A%3A%3Aerror file=x%3A%3Af.py" in out
    assert escape.github_property("a:b,c%\r\n\x1b") == "a%3Ab%2Cc%25%0D%0A"


# -- JSON, SARIF ------------------------------------------------------------------------------------------

def _strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in _strings(k) + _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_json_and_sarif_strings_carry_no_control_characters(fmt: str) -> None:
    out = render(fmt, hostile_report(), hostile_comparison())
    assert_log_safe(out)
    doc = json.loads(out)
    strings = _strings(doc)
    assert not any(CONTROLS.search(s) for s in strings)
    assert any("##[error]legacy" in s for s in strings)  # `\u0023` decodes back: the data is intact
    assert any("<script>alert(2)</script>" in s for s in strings)


def test_sarif_of_a_hostile_comparison() -> None:
    out = sarif.render_comparison(hostile_comparison(), rules=[], root=ROOT)
    assert_log_safe(out)
    json.loads(out)


# -- HTML -----------------------------------------------------------------------------------------------

class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_escapes_every_field() -> None:
    out = html.render_report(hostile_report(), hostile_comparison())
    assert_log_safe(out)
    parser = _Tags()
    parser.feed(out)
    assert "img" not in parser.tags and parser.tags.count("script") == 1  # perfdoctor's own toggle script
    page_text = "".join(parser.text)
    assert "<img src=x onerror=alert(1)>" in page_text and "[bold red]markup[/]" in page_text


# -- the error line ---------------------------------------------------------------------------------------

def test_error_line_stays_one_inert_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["perfdoctor", "report", "/nonexistent/a\n::error title=X::y\x1b[31m.json"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith("perfdoctor: error: /nonexistent/a\\n::error title=X::y\\x1b[31m.json")
    assert escape.error_line("##[error]x\r") == "#\\#[error]x\\r"


# -- benign text is left alone ----------------------------------------------------------------------------

def test_escapes_leave_ordinary_text_unchanged() -> None:
    """The golden reports hold for benign input (tests/report/test_golden.py); here, the escapes themselves."""
    for s in ("The loop waits 22.1 ms per step (39% of the step) with num_workers=0", "aten::mm",
              "set `num_workers` to the CPU cores; see https://pytorch.org/docs/stable/data.html#x",
              "torch.cuda.synchronize() in train.py:42", "device_ids=[0, 1]"):
        assert escape.text(s) == s and escape.markdown(s) == s and escape.clean(s) == s
        assert escape.error_line(s) == s and json.loads(escape.json_text(json.dumps(escape.json_doc(s)))) == s
    assert escape.markdown("a | b", table=True) == "a \\| b"
    assert escape.markdown_fence("x = 1", "python") == "```python\nx = 1\n```"

