"""The JSON report (schema "perfdoctor/report/v1", DESIGN.md "Contracts")."""

from __future__ import annotations

import orjson

from perfdoctor.report.model import Report


def render(report: Report) -> str:
    return orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n"
