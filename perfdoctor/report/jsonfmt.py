"""The JSON report (schema "perfdoctor/report/v1", perfdoctor/contracts/report.py), the gate's
comparison ("perfdoctor/compare/v1"), and other JSON documents."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from perfdoctor.gate.compare import Comparison
from perfdoctor.model import Report, to_doc
from perfdoctor.report import escape


def dumps(doc: Any) -> str:
    """The document as indented JSON, its strings without control characters (`escape.json_doc`,
    `escape.json_text`)."""
    return escape.json_text(orjson.dumps(escape.json_doc(doc), option=orjson.OPT_INDENT_2).decode()) + "\n"


def _doc(report: Report) -> dict[str, Any]:
    """report.json's document, through its contract (contracts/report.py: its types, its key order)."""
    return msgspec.to_builtins(to_doc(report))


def render_report(report: Report) -> str:
    return dumps(_doc(report))


def render_comparison(comparison: Comparison) -> str:
    return dumps(comparison.as_dict())


def render_both(report: Report, comparison: Comparison) -> str:
    """One document: the report, with the gate's comparison under "gate"."""
    return dumps({**_doc(report), "gate": comparison.as_dict()})
