"""The output formats, written once: `run`, `report` and `compare` all pick their renderer here.

Each format is one entry naming a renderer module that defines `render_report(report)`,
`render_comparison(comparison)` and `render_both(report, comparison)` (the report, then the gate's
verdict, as one document). Machine formats return the document's text; a `console` format (text)
returns rich renderables, which the CLI prints on the terminal or as plain text into a file.
Modules are imported on first use, so a machine format never imports rich (start-up time counts
in CI).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from perfdoctor.model import Report

if TYPE_CHECKING:  # annotations only: `--version`, `rules`, `explain` start without the gate
    from perfdoctor.gate.compare import Comparison


@dataclass(frozen=True)
class OutputFormat:
    module: str  # the renderer module (render_report, render_comparison, render_both)
    console: bool = False  # renders rich renderables for a terminal, not a document's text

    def renderer(self) -> ModuleType:
        return importlib.import_module(self.module)


FORMATS: dict[str, OutputFormat] = {
    "text": OutputFormat("perfdoctor.report.text", console=True),
    "json": OutputFormat("perfdoctor.report.jsonfmt"),
    "markdown": OutputFormat("perfdoctor.report.markdown"),
    "sarif": OutputFormat("perfdoctor.report.sarif"),
    "github": OutputFormat("perfdoctor.report.github"),
    "html": OutputFormat("perfdoctor.report.html"),
}


def render(fmt: str, report: Report | None = None, comparison: Comparison | None = None) -> Any:
    """A report, a comparison, or both (one document), in format `fmt`: text for a machine format,
    rich renderables for a console format."""
    r = FORMATS[fmt].renderer()
    if report is not None and comparison is not None:
        return r.render_both(report, comparison)
    if report is not None:
        return r.render_report(report)
    if comparison is not None:
        return r.render_comparison(comparison)
    raise ValueError("nothing to render")
