"""The JSON report (schema "perfdoctor/report/v1", DESIGN.md "Contracts") and other JSON documents."""

from __future__ import annotations

from typing import Any

import orjson

from perfdoctor.model import Report


def dumps(doc: Any) -> str:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def render(report: Report) -> str:
    return dumps(report.as_dict())
