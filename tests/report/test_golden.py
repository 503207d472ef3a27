"""Golden outputs: the report of every recorded run folder and real trace, in every format, is what it was.

A refactoring must leave these unchanged. A change that means to change a report rewrites them with
`python tests/golden/record.py reports` and its commit says why; `git diff tests/golden/expected` shows
what changed. See tests/golden/record.py for how the inputs were recorded.
"""

from __future__ import annotations

import difflib
import sys

import pytest

from tests.helpers import TESTS

sys.path.insert(0, str(TESTS / "golden"))
import record  # noqa: E402

INPUTS = record.golden_inputs()


def test_every_input_has_its_golden_files() -> None:
    assert len(INPUTS) >= 18
    want = {f"{ident}.{fmt}" for ident, _ in INPUTS for fmt in record.FORMATS}
    have = {p.name for p in record.EXPECTED.iterdir()}
    assert want == have, f"missing {sorted(want - have)}, stale {sorted(have - want)}"


@pytest.mark.parametrize("ident,kind", INPUTS, ids=[i for i, _ in INPUTS])
def test_report_is_unchanged(ident: str, kind: str) -> None:
    """Every format is what it was; and `perfdoctor report report.json`, the report read back from its
    JSON, renders exactly as the analysis's own report, in every format and in HTML."""
    formats = (*record.FORMATS, "html")
    outputs, reread = record.outputs_and_reread(ident, kind, formats)
    for fmt, got in outputs.items():
        if fmt == "html":
            continue
        want = (record.EXPECTED / f"{ident}.{fmt}").read_text()
        if got != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "now", n=1))
            pytest.fail(f"{ident} --format {fmt} changed:\n{diff[:6000]}")
    assert reread == outputs, [fmt for fmt in formats if reread[fmt] != outputs[fmt]]

