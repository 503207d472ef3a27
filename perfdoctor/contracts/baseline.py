"""Baseline files (schema "perfdoctor/baseline/v1"): what `perfdoctor run --save-baseline` writes and
`--baseline` / `perfdoctor compare` read back. One Struct shared by the writer (gate/baseline.py
builds it, then writes its builtins as JSON with sorted keys, indent 2: one number per line, so a
baseline reads in a diff) and the reader (validated here; a bad file is one InputError line)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from perfdoctor.contracts.files import Count, Ms, StepMs, check_schema, decode, read_bytes, schema_of
from perfdoctor.errors import InputError

BASELINE_SCHEMA = "perfdoctor/baseline/v1"

# The environment identity of a run: torch, device, device_name, device_count, cpu_count, cpu_model,
# python, platform, script (its file name), script_sha256, args (the script's own; None: unknown).
Environment = dict[str, str | int | list[str] | None]
Rate = Annotated[float, msgspec.Meta(gt=0, le=1e12)]  # steps or samples per second
Counter = Annotated[float, msgspec.Meta(ge=0, le=1e15)]  # a per-step count
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1e6)]  # a relative spread or error


class ToolDoc(msgspec.Struct):
    name: str = "perfdoctor"
    version: str = ""


class GateFinding(msgspec.Struct):
    """What the gate keeps of a finding: enough to tell new from resolved (its identity,
    `perfdoctor.model.finding_identity`) and to show it."""

    rule: str
    fingerprint: str
    severity: str | None = None
    title: str = ""
    file: str = ""
    line: int = 0
    code: str = ""


class RunDoc(msgspec.Struct):
    """One run of a baseline (gate.baseline.RunRecord on disk)."""

    source: str = ""
    env: Environment = {}
    median_ms: StepMs | None = None
    steps_per_s: Rate | None = None
    samples_per_s: Rate | None = None
    batch_size: Rate | None = None
    peak_memory_bytes: Count | None = None
    counters: dict[str, Counter] = {}
    findings: list[GateFinding] = []
    notes: list[str] = []
    warmup_dropped: Count = 0
    step_ms: list[StepMs] = []
    # per steady step, aligned with step_ms (absent from baselines recorded before they were kept): the
    # training thread's wait for a CPU, the script's CPU time (the training thread's plus its DataLoader
    # workers'); the host's 1-min load average at the run's start and end. (`cpu_ms`, the process tree's
    # CPU time with perfdoctor's own threads in it, was kept before script_cpu_ms: no longer read.)
    wait_ms: list[Ms] = []
    script_cpu_ms: list[Ms] = []
    loadavg: list[Annotated[float, msgspec.Meta(ge=0, le=1e6)]] = []
    # how busy the machine's other CPUs were over the steady steps, 0..2 (gate.baseline.others_busy)
    others_busy: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None


class SummaryDoc(msgspec.Struct):
    step_time_ms: StepMs | None = None
    steps_per_s: Rate | None = None
    peak_memory_bytes: Count | None = None
    counters: dict[str, Counter] = {}


class NoiseDoc(msgspec.Struct):
    """The noise floor measured when the baseline was recorded (gate.baseline.noise_floor)."""

    runs: Count = 0
    statistic: str = ""
    run_values_ms: list[StepMs] = []
    within_run_rel_se: Ratio | None = None
    between_run_rel_sd: Ratio | None = None
    spread: Ratio | None = None
    single_run_halfwidth: Ratio | None = None
    block_lengths: list[Count | None] = []
    method: str = ""


class BaselineDoc(msgspec.Struct):
    schema: str
    runs: list[RunDoc]
    tool: ToolDoc = msgspec.field(default_factory=ToolDoc)
    created: str = ""
    environment: Environment = {}
    summary: SummaryDoc = msgspec.field(default_factory=SummaryDoc)
    noise: NoiseDoc = msgspec.field(default_factory=NoiseDoc)
    findings: list[GateFinding] = []


def is_baseline(path: Path, raw: bytes) -> bool:
    """A baseline of any version (`read_baseline` refuses the ones this perfdoctor cannot read)."""
    schema = schema_of(path, raw)
    return isinstance(schema, str) and schema.startswith("perfdoctor/baseline/")


def read_baseline(path: Path) -> BaselineDoc:
    """A baseline file, validated: InputError (exit 2) naming the file and what is wrong otherwise."""
    raw = read_bytes(path)
    schema = schema_of(path, raw)
    if not is_baseline(path, raw):
        raise InputError(f"{path}: not a perfdoctor baseline (expected schema {BASELINE_SCHEMA!r}); "
                         f"record one with `perfdoctor run SCRIPT --save-baseline {path.name}`")
    check_schema(path, schema, BASELINE_SCHEMA, "perfdoctor baseline")
    doc = decode(path, raw, BaselineDoc, f"perfdoctor baseline ({BASELINE_SCHEMA})")
    if not doc.runs:
        raise InputError(f"{path}: the baseline holds no runs")
    return doc
