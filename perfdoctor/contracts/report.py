"""report.json (schema "perfdoctor/report/v1"): the JSON report `perfdoctor run` writes into every run
folder and `--format json` prints.

The writer is `Report.as_dict()` (perfdoctor/model.py) through report/jsonfmt.py, which keeps the
document's key order and rounding; these Structs are the contract it follows, and what the gate
reads back (a report.json beside its run folder, or alone for a summary-only comparison). Only the
schema, `summary` and `findings` are required: everything else has a default, so a report.json
written by hand for a test or a tool still reads. A test checks that every golden report decodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.files import Count, Ms, StepMs, check_schema, decode, read_bytes, schema_of
from perfdoctor.model import SCHEMA as REPORT_SCHEMA
from perfdoctor.model import identity_of


class ToolDoc(msgspec.Struct):
    name: str = "perfdoctor"
    version: str = ""


class ThresholdDoc(msgspec.Struct):
    rule: str
    name: str
    default: Any = None
    value: Any = None


class ProjectRuleDoc(msgspec.Struct):
    id: str
    file: str = ""


class ConfigDoc(msgspec.Struct):
    """What the project's `[tool.perfdoctor]` changed: rules turned off, thresholds moved, rules added."""

    file: str | None = None
    rules_off: list[str] = []
    thresholds: list[ThresholdDoc] = []
    project_rules: list[ProjectRuleDoc] = []


class RunInfoDoc(msgspec.Struct):
    """`run`: what was analysed; a run folder (kind "run") or a trace (kind "trace")."""

    kind: str = "run"
    script: str | None = None
    module: str | None = None
    argv: list[str] | None = None  # None: unknown
    run_dir: str | None = None
    trace_file: str | None = None
    trace: str | None = None
    files: list[str] = []
    steps_observed: int | None = None
    steps_profiled: int | None = None
    step_clock: str | None = None
    device: str | None = None
    torch: str | None = None
    exit: dict[str, Any] = {}
    settings: str | None = None
    # present when the project's config changed what is checked (rules.config.check_settings)
    config: ConfigDoc | None = None
    # present when the loader dropped or repaired trace events: how many, by reason
    dropped_events: dict[str, int] = {}


class StepTimeDoc(msgspec.Struct):
    median: StepMs | None = None
    p90: StepMs | None = None
    mean: StepMs | None = None
    min: StepMs | None = None
    max: StepMs | None = None
    n: Count | None = None


class BreakdownDoc(msgspec.Struct):
    category: str
    ms: Ms | None = None
    fraction: float | None = None


class SummaryDoc(msgspec.Struct):
    steps_observed: int | None = None
    steps_profiled: int | None = None
    step_clock: str | None = None
    step_time_ms: StepTimeDoc | None = None
    breakdown: list[BreakdownDoc] = []
    gpu_breakdown: list[BreakdownDoc] = []
    rank: int | None = None  # a folder of per-rank traces: the slowest rank's summary


class LocationDoc(msgspec.Struct):
    file: str = ""
    line: int = 0
    code: str = ""
    function: str = ""


class SavingDoc(msgspec.Struct):
    ms_per_step: float
    fraction_of_step: float | None = None
    range_ms: list[float] | None = None  # [p25, p75] of the saving evaluated step by step


class FixDoc(msgspec.Struct):
    before: str = ""
    after: str = ""
    note: str = ""
    example: bool = False


class FactDoc(msgspec.Struct):
    fact: str = ""
    value: Any = None  # int, float, bool or str
    unit: str = ""
    source: str = ""
    detail: str = ""


class FindingDoc(msgspec.Struct):
    rule: str
    name: str = ""
    severity: str | None = None
    title: str = ""
    message: str = ""
    why: str = ""
    estimated_saving: SavingDoc | None = None
    saving_basis: str = ""
    confidence: str = ""
    locations: list[LocationDoc] = []
    evidence: list[FactDoc] = []
    fix: FixDoc | None = None
    references: list[str] = []
    fingerprint: str = ""

    def identity(self) -> str:
        """`perfdoctor.model.finding_identity` of this finding (the gate's and SARIF's key)."""
        return identity_of(msgspec.to_builtins(self))


class HotspotDoc(msgspec.Struct):
    function: str
    file: str
    line: int
    ms_per_step: float
    calls_per_step: float
    lines: list[dict[str, Any]] = []
    process: str = "main"


class ReportDoc(msgspec.Struct):
    schema: str
    summary: SummaryDoc
    findings: list[FindingDoc]
    tool: ToolDoc = msgspec.field(default_factory=ToolDoc)
    run: RunInfoDoc = msgspec.field(default_factory=RunInfoDoc)
    hotspots: list[HotspotDoc] = []
    notes: list[str] = []
    ranks: list[dict[str, Any]] = []
    facts: dict[str, FactDoc] = {}

    def fact(self, name: str) -> Any:
        """The value of a global fact, None where the report has none."""
        f = self.facts.get(name)
        return None if f is None else f.value


def is_report(path: Path, raw: bytes) -> bool:
    """A report.json of any version (`decode_report` refuses the ones this perfdoctor cannot read)."""
    schema = schema_of(path, raw)
    return isinstance(schema, str) and schema.startswith("perfdoctor/report/")


def decode_report(path: Path, raw: bytes) -> ReportDoc:
    """A report.json's bytes, validated (InputError naming the file and the bad field otherwise)."""
    check_schema(path, schema_of(path, raw), REPORT_SCHEMA, "perfdoctor report.json")
    return decode(path, raw, ReportDoc, f"perfdoctor report ({REPORT_SCHEMA})")


def read_report(path: Path) -> ReportDoc:
    return decode_report(path, read_bytes(path))
