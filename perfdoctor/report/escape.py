"""Escaping at the output boundary: one function per output format, applied to every string that came
from input (trace text such as device and frame file names, script paths, baseline contents, config
and project rules, the user's source lines, and the finding titles and messages that embed them).

perfdoctor writes into terminals, CI logs and GitHub step summaries, where input text must stay text:

- every format: C0 and C1 control characters (ESC and so ANSI/OSC sequences among them), DEL and
  the bidirectional overrides are dropped (`clean`); a single-line field also loses its line breaks
  (CR, LF, U+2028/U+2029 become a space), so a value can never print a line of its own.
- a CI log (text, markdown, the error line): the GitHub runner reads a line that starts with `::`
  (after leading whitespace) as a workflow command, and `##[` anywhere in a line as a legacy one.
  `##[` in input becomes `#\\#[` (`defuse`); a line that would start with `::` gets a backslash in
  front (markdown: at the start of input text; text: after rich wrapped the lines, in
  `perfdoctor.report.text`).
- `text`: also no rich markup from input (the renderer passes `Text` objects, never markup strings).
- `markdown`: no raw HTML (`<` becomes `&lt;` outside code spans), no block structure (a heading,
  quote, list, table or fence) started by input, no link or image; code spans and fences from input
  are delimited by a backtick run longer than any inside them (`markdown_code`, `markdown_fence`);
  text inside a `<details>` block is HTML-escaped (`markdown_html`).
- `github`: workflow-command data and properties escaped by the runner's rules (and `##[` defused,
  though the runner, having read the line as a `::` command, would not look for one).
- JSON and SARIF: the JSON encoder escapes; `json_doc` drops the control characters first, so a
  consumer that prints a field (`jq -r`) never writes them to a terminal, and `json_text` writes the
  `#` of a `##[` as `\u0023` (the same string once decoded, inert in a log).
- HTML: `html.escape` of the cleaned text, its line breaks and the `#` of a `##[` as character
  references (the same page, and no line of the file starts with input: `html_text`).
- the stderr error line (`error_line`): one line, whatever the message holds: controls are shown as
  visible escapes (`\\n`, `\\x1b`).

Each function is the identity on ordinary text, so benign reports are byte for byte what they were.
"""

from __future__ import annotations

import html
import re
from typing import Any

from perfdoctor.contracts.files import printable

# C0 controls but TAB and LF, DEL, C1 controls (with ESC this covers ANSI CSI and OSC sequences,
# whose printable rest is left as harmless text), and the bidirectional embeddings, overrides and
# isolates that make text display in another order than it reads
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAK = re.compile("\r\n?|[\u2028\u2029]")  # the line breaks splitlines knows besides LF and C0/C1


def clean(value: Any, multiline: bool = False) -> str:
    """`value` as text without control characters; single-line unless `multiline` (line breaks,
    normalised to LF, are kept, as are tabs)."""
    s = _CONTROL.sub("", _LINE_BREAK.sub("\n", printable("" if value is None else str(value))))
    return s if multiline else s.replace("\n", " ").replace("\t", " ")


def defuse(s: str) -> str:
    """A legacy workflow command (`##[name]`, read by the runner anywhere in a line) made inert."""
    return s.replace("##[", "#\\#[")


def command_line_start(line: str) -> bool:
    """Whether the runner would read this line as a workflow command (`::` after leading whitespace)."""
    return line.lstrip().startswith("::")


# --- text (rich) ---------------------------------------------------------------------------------

def text(value: Any, multiline: bool = False) -> str:
    """An input string for the text report: put into a rich `Text` (never parsed as markup). Lines
    that rich's wrapping starts with `::` are guarded after wrapping (`perfdoctor.report.text`)."""
    return defuse(clean(value, multiline))


# --- markdown ------------------------------------------------------------------------------------

_BACKTICKS = re.compile("`+")
# what starts a block at the beginning of a line: ATX heading, quote, HTML block, reference definition,
# workflow command, bullet item, setext underline, thematic break or fence (a backslash before its
# first character makes it text), and an ordered item (a backslash before its `.` or `)`)
_BLOCK_START = re.compile(r"^([ \t]*)(?:([#><\[]|::|[-+*](?=[ \t]|$)|[-*_=](?=[-*_= \t]*$)|~~~)|(\d{1,9})([.)])(?=[ \t]|$))",
                          re.MULTILINE)


def _block_escape(m: re.Match[str]) -> str:
    if m.group(2) is not None:
        return f"{m.group(1)}\\{m.group(2)}"
    return f"{m.group(1)}{m.group(3)}\\{m.group(4)}"


def _md_inline(s: str) -> str:
    """Markdown escapes outside code spans: backslash, pipe, raw HTML, links and images."""
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return s.replace("](", "\\](").replace("![", "!\\[")


def markdown(value: Any, multiline: bool = False, table: bool = False) -> str:
    """Input text in markdown prose, or in a table cell with `table` (rule titles, messages and
    notes may carry their own code spans: these are kept; anything else that markdown would read as
    structure, HTML, a link or a workflow command is escaped)."""
    s = clean(value, multiline)
    out, i = [], 0
    while i < len(s):
        m = _BACKTICKS.search(s, i)
        if m is None:
            out.append(_md_inline(s[i:]))
            break
        out.append(_md_inline(s[i:m.start()]))
        # a code span runs to the next backtick run of the same length (CommonMark); else literal
        close = next((c for c in _BACKTICKS.finditer(s, m.end()) if len(c.group()) == len(m.group())), None)
        if close is None:
            out.append("\\`" * len(m.group()))
            i = m.end()
        else:
            span = s[m.start():close.end()]
            out.append(span.replace("|", "\\|") if table else span)  # GFM: a pipe ends a cell even in code
            i = close.end()
    return defuse(_BLOCK_START.sub(_block_escape, "".join(out)))


def markdown_code(value: Any, table: bool = False) -> str:
    """Input text as one inline code span (a file name, `file:line`): delimited by a backtick run
    longer than any inside it; in a table cell, pipes escaped as GFM requires."""
    s = defuse(clean(value))
    ticks = "`" * (max((len(r) for r in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    if table:
        s = s.replace("|", "\\|")
    return f"{ticks}{pad}{s}{pad}{ticks}"


def markdown_fence(value: Any, lang: str = "") -> str:
    """Input text as a fenced code block: fenced by a backtick run longer than any inside it, and no
    line of it a workflow command (such a line gets a backslash in front)."""
    s = defuse(clean(value, multiline=True))
    s = "\n".join("\\" + line if command_line_start(line) else line for line in s.split("\n"))
    ticks = "`" * max(3, max((len(r) for r in _BACKTICKS.findall(s)), default=0) + 1)
    return f"{ticks}{lang}\n{s}\n{ticks}"


def markdown_html(value: Any) -> str:
    """Input text inside an HTML block of the markdown (the `<summary>` line of a finding)."""
    return defuse(html.escape(clean(value), quote=False))


# --- GitHub workflow commands --------------------------------------------------------------------

def github_data(value: Any) -> str:
    """A workflow command's message: % CR LF become %25 %0D %0A (the runner's rules)."""
    s = _CONTROL.sub(lambda m: m.group() if m.group() == "\r" else "", "" if value is None else str(value))
    s = defuse(s.replace("\u2028", "\n").replace("\u2029", "\n"))
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_property(value: Any) -> str:
    """A workflow command's property value: as the message, and : , become %3A %2C."""
    return github_data(value).replace(":", "%3A").replace(",", "%2C")


# --- JSON and SARIF ------------------------------------------------------------------------------

def json_doc(doc: Any) -> Any:
    """A JSON document (dicts, lists, scalars) with every string, keys included, `clean`ed (line
    breaks and tabs kept: the encoder escapes them)."""
    if isinstance(doc, str):
        return clean(doc, multiline=True)
    if isinstance(doc, dict):
        return {json_doc(k) if isinstance(k, str) else k: json_doc(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_doc(v) for v in doc]
    return doc


def json_text(encoded: str) -> str:
    """Encoded JSON with no `##[` in it (`##[` occurs only inside strings, where `\u0023` is `#`)."""
    return encoded.replace("##[", "#\\u0023[")


# --- HTML ----------------------------------------------------------------------------------------

def html_text(value: Any) -> str:
    """Input text in the HTML page, in element content or a quoted attribute."""
    s = html.escape(clean(value, multiline=True), quote=True)
    return s.replace("\n", "&#10;").replace("##[", "#&#35;[")


# --- the stderr error line -----------------------------------------------------------------------

_VISIBLE = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def error_line(value: Any) -> str:
    """A message for perfdoctor's one error line on stderr: controls and line breaks shown as
    visible escapes, so the line stays one line and reaches the terminal inert."""
    s = "" if value is None else str(value)
    s = re.sub("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]",
               lambda m: _VISIBLE.get(m.group(), f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                      else f"\\u{ord(m.group()):04x}"), s)
    return defuse(s)
