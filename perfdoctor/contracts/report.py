"""report.json (schema "perfdoctor/report/v1"): the JSON report `perfdoctor run` writes into every run
folder and `--format json` prints.

These Structs are report.json, written and read by the same types: report/jsonfmt.py writes
`to_doc(report)` (`Report.as_dict()`'s rounding, these Structs' key order), the gate reads it back
(a report.json beside its run folder, or alone for a summary-only comparison), and `perfdoctor
report report.json` renders it again in any format (`from_doc`). A field the Structs do not declare
is refused both ways (`forbid_unknown_fields`). Only the schema, `summary` and `findings` are
required: everything else has a default, so a report.json written by hand for a test or a tool
still reads. Tests decode every golden report.json and check that it encodes back to the same bytes,
and that a report rendered from its saved report.json is the report rendered from the analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from perfdoctor.contracts import files
from perfdoctor.contracts.files import Count, Ms, StepMs, check_schema, decode, read_bytes, schema_of
from perfdoctor.contracts.run import Stuck

SCHEMA = "perfdoctor/report/v1"


def finding_identity(rule: str, file: str | None, code: str | None, fallback: str = "") -> str:
    """A finding's identity across checkouts, runs and line moves: its rule, its file's name and its
    code line's text (whitespace-normalised); not the absolute path (CI workspaces differ between
    machines) nor the line number (lines move). Without a location, the rule and `fallback` (the
    subject key). The one definition behind `Finding.fingerprint`, baselines and SARIF."""
    if file:
        return f"{rule}:{Path(file).name}:{' '.join(str(code or '').split())}"
    return f"{rule}:{fallback}"

# Every Struct of report.json forbids fields it does not declare: a key the writer adds without a
# field here fails the writer's own encode (report/jsonfmt.py goes through ReportDoc) and the reader.
# A key that is only sometimes written is UNSET by default (and then not written at all).


class Doc(msgspec.Struct, forbid_unknown_fields=True):
    pass


class ToolDoc(Doc):
    name: str = "perfdoctor"
    version: str = ""


class ThresholdDoc(Doc):
    rule: str
    name: str
    default: Any = None
    value: Any = None


class ProjectRuleDoc(Doc):
    id: str
    file: str = ""


class ConfigDoc(Doc):
    """What the project's `[tool.perfdoctor]` changed: rules turned off, thresholds moved, rules added."""

    file: str | None = None
    rules_off: list[str] = []
    thresholds: list[ThresholdDoc] = []
    project_rules: list[ProjectRuleDoc] = []


class ExitDoc(Doc):
    """How the script ended (meta.json's exit, contracts.run.Exit)."""

    code: int | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    traceback: str | None | UnsetType = UNSET
    at: float | None | UnsetType = UNSET  # when the script ended (Unix time)


class RankDoc(Doc):
    """A rank of a distributed job (meta.json's rank, contracts.run.Rank)."""

    rank: int
    local_rank: int | None | UnsetType = UNSET
    world_size: int | None | UnsetType = UNSET
    local_world_size: int | None | UnsetType = UNSET
    node_rank: int | None | UnsetType = UNSET
    cpu_share: int | None | UnsetType = UNSET


class RunInfoDoc(Doc):
    """`run`: what was analysed: a run folder (kind "run": script... trace_file, a rank's rank and
    label), a trace or a folder of per-rank traces (kind "trace": trace, files), or a job folder of
    rank run folders (kind "job": a run's keys less rank and trace_file, and job_dir, ranks,
    rank_dirs). Fields in the order they are written."""

    kind: str = "run"
    trace: str | UnsetType = UNSET
    files: list[str] | UnsetType = UNSET
    script: str | None | UnsetType = UNSET
    module: str | None | UnsetType = UNSET
    argv: list[str] | UnsetType = UNSET
    run_dir: str | None | UnsetType = UNSET
    trace_file: str | None | UnsetType = UNSET
    rank: RankDoc | UnsetType = UNSET
    label: str | UnsetType = UNSET  # a rank's "rank 1 of 4", a job's summary of which rank is shown
    steps_observed: int | None = None
    steps_profiled: int | None = None
    step_clock: str | None = None
    device: str | None = None
    torch: str | None = None
    exit: ExitDoc | UnsetType = UNSET  # a run's and a job's
    settings: str | None = None
    # present when the project's config changed what is checked (rules.config.check_settings)
    config: ConfigDoc | UnsetType = UNSET
    # present when the loader dropped or repaired trace events: how many, by reason
    dropped_events: dict[str, int] | UnsetType = UNSET
    job_dir: str | UnsetType = UNSET
    ranks: list[int] | UnsetType = UNSET
    rank_dirs: list[str] | UnsetType = UNSET


class StepTimeDoc(Doc):
    median: StepMs | None = None
    p90: StepMs | None = None
    mean: StepMs | None = None
    min: StepMs | None = None
    max: StepMs | None = None
    n: Count | None = None


class BreakdownDoc(Doc):
    category: str
    ms: Ms | None = None
    fraction: float | None = None


class StepSeriesDoc(Doc):
    """Every step's time (step i at index i - 1), the runs of steady steps, the profiler's window
    (perfdoctor.stats.step_series): the charts' data."""

    ms: list[float] = []
    steady: list[list[int]] = []
    window: list[int] | None = None


class GpuDeviceDoc(Doc):
    device: int
    utilization: float
    busy_ms: float
    idle_ms: float


class GpuDoc(Doc):
    """The GPU's share of the step (facts.trace.gpu): the busiest device's, and each device's where
    several were used."""

    utilization: float
    idle_ms: float
    idle_host_wait_fraction: float
    devices: list[GpuDeviceDoc] | UnsetType = UNSET


class MemoryDoc(Doc):
    """The memory at each step's end, its growth over the steady steps with the 90 % interval of the
    slope, and the peak's parts (facts/run/memory.py)."""

    source: str = ""  # "process RSS" or "cuda allocated"
    bytes: list[int | float | None] = []  # step i at index i - 1
    growth_bytes_per_step: float | None = None
    growth_interval: list[float] | None = None
    peak_bytes: int | float | None = None
    total_bytes: int | float | None = None
    parts: dict[str, int | float] = {}  # params, grads, optimizer_state, activations
    # CUDA: each device the process allocated on: {"device", "peak_bytes", "total_bytes", "headroom_bytes"}
    devices: list[dict[str, int | None]] | UnsetType = UNSET
    batch: int | None | UnsetType = UNSET  # the batch size of the loader that fed the steps (the what-if's)


class ComputeModuleDoc(Doc):
    """A module with the most FLOPs in the counted step (facts/run/compute.py), its forward's time in the
    run's trace and rate where the trace has its span (facts/trace/flops.py `module_rates`)."""

    module: str = ""  # FlopCounterMode's name, e.g. "Net.fc1"
    layer: str | None = None  # "Class_k", the trace's "nn.Module: Class_k"
    flops: int | float = 0  # forward and backward
    share: float = 0.0  # of the step's FLOPs
    forward_flops: int | float = 0
    forward_ms: float | UnsetType = UNSET
    time_source: str | UnsetType = UNSET
    achieved_flops: float | UnsetType = UNSET  # forward FLOPs / forward time


class ComputeDoc(Doc):
    """Where a run's FLOPs per step were counted and its modules with the most (facts/run/compute.py)."""

    source: str = ""
    flops_per_step: int | float = 0
    modules: list[ComputeModuleDoc] = []


class ContentionDoc(Doc):
    """How long the training thread waited for a CPU per steady step, and whether that inflated the
    step times (facts/run/cpu_wait.py: contention); the keys after `inflated` where measured."""

    wait_ms: float
    share: float
    inflated: bool
    run_ms: float | UnsetType = UNSET
    tree_ms: float | UnsetType = UNSET
    host_pressure: float | UnsetType = UNSET
    steal_ms: float | UnsetType = UNSET
    loadavg: list[float] | UnsetType = UNSET  # the 1-minute load average at the run's start (and end)
    sentence: str | UnsetType = UNSET  # where inflated: the note that says so


class SummaryDoc(Doc):
    steps_observed: int | None = None
    steps_profiled: int | None = None
    step_clock: str | None = None
    step_time_ms: StepTimeDoc | None = None
    breakdown: list[BreakdownDoc] = []
    steady_steps: list[int] | UnsetType = UNSET  # a run's first and last steady step
    step_series: StepSeriesDoc | UnsetType = UNSET
    gpu: GpuDoc | UnsetType = UNSET  # a trace's (or a run's trace's) GPU
    gpu_breakdown: list[BreakdownDoc] | UnsetType = UNSET  # a CUDA run's step on the GPU
    rank: int | UnsetType = UNSET  # several ranks: the rank whose summary this is
    memory: MemoryDoc | UnsetType = UNSET  # a run's memory over its steps
    compute: ComputeDoc | UnsetType = UNSET  # a run's FLOPs counted on one step, by module
    stuck: Stuck | UnsetType = UNSET  # a run where no step ended: where it was (the run folder's stuck.json)
    contention: ContentionDoc | UnsetType = UNSET  # a run: its wait for a CPU


class LocationDoc(Doc):
    file: str = ""
    line: int = 0
    code: str = ""
    function: str = ""


class SavingDoc(Doc):
    ms_per_step: float
    fraction_of_step: float | None = None
    range_ms: list[float] | UnsetType = UNSET  # [p25, p75] of the saving evaluated step by step


class FixDoc(Doc):
    before: str = ""
    after: str = ""
    note: str = ""
    example: bool = False


class FactDoc(Doc):
    fact: str = ""
    value: Any = None  # int, float, bool or str
    unit: str = ""
    source: str = ""
    detail: str = ""


class VerificationDoc(Doc):
    """`perfdoctor verify`'s measurement of a finding (perfdoctor.model.Verification)."""
    verdict: str
    kind: str = "fix"
    why: str = ""
    measured_ms_per_step: float | None = None
    interval_ms: list[float] | None = None
    runs: int = 0
    step_ms: float | None = None


class FindingDoc(Doc):
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
    verification: VerificationDoc | UnsetType = UNSET  # only where `perfdoctor verify` ran

    def identity(self) -> str:
        """`perfdoctor.model.finding_identity` of this finding (the gate's and SARIF's key)."""
        loc = self.locations[0] if self.locations else None
        if loc is not None and loc.file:
            return finding_identity(self.rule, loc.file, loc.code)
        return self.fingerprint or finding_identity(self.rule, None, None)


class HotLineDoc(Doc):
    line: int
    code: str = ""
    share: float = 0.0
    samples: int = 0


class HotspotDoc(Doc):
    function: str
    file: str
    line: int
    ms_per_step: float
    calls_per_step: float
    lines: list[HotLineDoc] = []
    process: str = "main"


class RankRowDoc(Doc):
    """One rank's row of the rank table (facts.ranks; the columns are perfdoctor.model.RANK_COLUMNS):
    step, compute and idle always there, the others where measured."""

    rank: int
    file: str = ""
    step_ms: float | None = None
    data_ms: float | UnsetType = UNSET
    compute_ms: float | None = None
    comm_ms: float | UnsetType = UNSET
    idle_ms: float | None = None
    idle_fraction: float | None = None
    sync_ms: float | UnsetType = UNSET
    gc_ms: float | UnsetType = UNSET
    cpu_wait_ms: float | UnsetType = UNSET
    cpu_wait_share: float | UnsetType = UNSET
    cpu_throttled_ms: float | UnsetType = UNSET
    cpu_throttled_periods: float | UnsetType = UNSET
    gpu_clock_mhz: float | UnsetType = UNSET
    gpu_throttled_share: float | UnsetType = UNSET
    gpu_throttle: str | UnsetType = UNSET
    busy_share: float | UnsetType = UNSET
    memory_peak_mib: float | UnsetType = UNSET  # the rank's memory peak (its device's, else its RSS)
    headroom_mib: float | UnsetType = UNSET  # its device's (else the machine's) memory less that peak

    def value(self, column: str, unset: Any = None) -> Any:
        """The cell of `column` (a key of perfdoctor.model.RANK_COLUMNS, or rank or file); `unset`
        where this row has no such cell."""
        v = getattr(self, column)
        return unset if v is UNSET else v


class RuleTextDoc(Doc):
    what: str = ""
    why: str = ""
    example: str = ""
    use_instead: str = ""
    fix_safety: str = ""
    references: list[str] = []


class RuleInfoDoc(Doc):
    """A rule its findings come from, as the catalog documents it (perfdoctor.model.RuleDoc): the
    renderers' explanations and SARIF's rule descriptors, without the catalog."""

    id: str
    name: str = ""
    severity: str = ""
    summary: str = ""
    doc: RuleTextDoc = msgspec.field(default_factory=RuleTextDoc)
    when: str = ""
    thresholds: dict[str, Any] = {}
    let: dict[str, str] = {}


class ReportDoc(Doc, kw_only=True):
    schema: str
    tool: ToolDoc = msgspec.field(default_factory=ToolDoc)
    run: RunInfoDoc = msgspec.field(default_factory=RunInfoDoc)
    summary: SummaryDoc
    findings: list[FindingDoc]
    hotspots: list[HotspotDoc] = []
    notes: list[str] = []
    ranks: list[RankRowDoc] = []
    facts: dict[str, FactDoc] = {}
    rules: list[RuleInfoDoc] = []

    def fact(self, name: str) -> Any:
        """The value of a global fact, None where the report has none."""
        f = self.facts.get(name)
        return None if f is None else f.value


def is_report(path: Path, raw: bytes) -> bool:
    """A report.json of any version (`decode_report` refuses the ones this perfdoctor cannot read)."""
    schema = schema_of(path, raw)
    return isinstance(schema, str) and schema.startswith("perfdoctor/report/")


def looks_like_report(path: Path) -> bool:
    """Whether `path` is a file that opens as a report.json does (its schema first): a cheap look at
    its first bytes, not a read of what may be a trace of gigabytes."""
    head = files.read_head(path, 256)
    return head.lstrip().startswith(b"{") and b'"schema"' in head and b'"perfdoctor/report/' in head


def decode_report(path: Path, raw: bytes) -> ReportDoc:
    """A report.json's bytes, validated (InputError naming the file and the bad field otherwise)."""
    check_schema(path, schema_of(path, raw), SCHEMA, "perfdoctor report.json")
    return decode(path, raw, ReportDoc, f"perfdoctor report ({SCHEMA})")


def read_report(path: Path) -> ReportDoc:
    return decode_report(path, read_bytes(path))
