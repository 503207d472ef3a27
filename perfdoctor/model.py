"""The neutral model every layer shares: where a thing is in the user's code (Location), a measured
fact (Fact), and the one internal result every renderer draws from (Finding, Fix, Hotspot, Report),
with the severity order and a finding's identity. Imports nothing of perfdoctor's layers (only the
neutral contracts: the report's run, summary and rank table ARE report.json's Structs,
perfdoctor/contracts/report.py, built by the analysis and read by the renderers as they are written).

Renderers never measure; the analysis never formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UnsetType

from perfdoctor import __version__
from perfdoctor.contracts.report import (
    SCHEMA,
    FactDoc,
    HotLineDoc,
    LocationDoc,
    RankRowDoc,
    ReportDoc,
    RunInfoDoc,
    SummaryDoc,
    VerificationDoc,
    finding_identity,
)

__all__ = ["SCHEMA", "finding_identity", "from_doc", "to_doc"]


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    code: str = ""  # the user's source line, stripped
    function: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "code": self.code, "function": self.function}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Location:
        return cls(file=str(d.get("file", "")), line=int(d.get("line") or 0),
                   code=str(d.get("code") or ""), function=str(d.get("function") or ""))


@dataclass(frozen=True)
class Fact:
    name: str
    value: Any  # int, float, bool or str
    unit: str = ""  # "ms", "bytes", "count", "ratio", "" for plain values
    source: str = "run"  # one of SOURCES
    detail: str = ""  # how it was measured, in a few words
    # the value at each steady-state step, aligned on the same steps as its source's other series (a
    # run's: its steady steps; a trace's: its profiled steps): a rule's saving evaluated step by step
    # gives the saving's spread, and the rank table's test of a straggler reads a rank's work step by
    # step (facts.ranks); never written out
    per_step: tuple[float, ...] = field(default=(), compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"fact": self.name, "value": self.value, "unit": self.unit,
                "source": self.source, "detail": self.detail}



SEVERITIES = ("high", "medium", "low")  # worst first
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}


def severity_rank(severity: str | None) -> int:
    """0 for high, 1 for medium, 2 for low; anything else ranks after them."""
    return SEVERITY_ORDER.get(severity or "", len(SEVERITIES))


def at_or_above(severity: str | None, floor: str) -> bool:
    """Whether a finding of `severity` is at least as severe as `floor` (`--fail-on floor`)."""
    return severity_rank(severity) <= severity_rank(floor)


@dataclass
class Fix:
    before: str
    after: str
    note: str = ""  # one line: what else to change (e.g. "launch with torchrun")
    example: bool = False  # True: an illustration of the fix, not a rewrite of the user's own line

    def as_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "note": self.note, "example": self.example}


VERDICTS = ("verified", "smaller", "larger", "no-saving-here", "did-not-hold", "not-verifiable-here")


@dataclass
class Verification:
    """What `perfdoctor verify` measured for a finding: its fix (or, where there is none, an ablation:
    an upper bound on the saving, not a fix) applied in a scratch copy of the project, and the script
    run against the copy without it, alternately."""

    verdict: str  # one of VERDICTS
    kind: str  # "fix" | "ablation"
    why: str  # one sentence: what was done and what the numbers say
    measured_ms_per_step: float | None = None  # the original's median (or mean) step less the changed copy's
    interval_ms: tuple[float, float] | None = None  # its 90% interval
    runs: int = 0  # runs made, both sides
    step_ms: float | None = None  # the original's median (or mean) step, the scale of the saving

    def sentence(self) -> str:
        """One line for every report: the verdict, the kind, and why (the numbers are in `why`)."""
        runs = f", {self.runs} runs" if self.runs else ""
        return f"verify: {self.verdict} ({self.kind}{runs}): {self.why}"

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "kind": self.kind, "why": self.why,
                "measured_ms_per_step": None if self.measured_ms_per_step is None else round(self.measured_ms_per_step, 3),
                "interval_ms": None if self.interval_ms is None else [round(v, 3) for v in self.interval_ms],
                "runs": self.runs, "step_ms": None if self.step_ms is None else round(self.step_ms, 3)}


@dataclass
class Finding:
    rule: str  # "PD002"
    name: str  # "dataloader-workers"
    severity: str  # high | medium | low
    title: str
    message: str
    why: str
    ms_per_step: float | None  # estimated saving; None where it cannot be estimated here
    fraction_of_step: float | None
    saving_basis: str  # "measured" (from this run/trace) or why there is no number
    confidence: str  # high | medium | low
    locations: list[Location] = field(default_factory=list)
    evidence: list[Fact] = field(default_factory=list)
    fix: Fix | None = None
    references: list[str] = field(default_factory=list)
    subject: str = ""  # the subject key the rule was judged on
    saving_range: tuple[float, float] | None = None  # p25..p75 of the saving evaluated step by step
    verification: Verification | None = None  # `perfdoctor verify`'s measurement, where it ran


    @property
    def minor(self) -> bool:
        """A measured finding worth too little to list with the others: the rules engine rates a
        measured saving under its floor low, and the text and Markdown reports collapse it."""
        return self.severity == "low" and self.ms_per_step is not None

    def sort_key(self) -> tuple:
        measured = self.ms_per_step is not None
        return (0 if measured else 1, -(self.ms_per_step or 0.0), severity_rank(self.severity), self.rule)

    def fingerprint(self) -> str:
        """`finding_identity`: stable across checkouts and line moves."""
        loc = self.locations[0] if self.locations else None
        return finding_identity(self.rule, loc.file if loc else None, loc.code if loc else None, self.subject)

    def as_dict(self) -> dict[str, Any]:
        saving: dict[str, Any] | None = None
        if self.ms_per_step is not None:
            saving = {"ms_per_step": round(self.ms_per_step, 3),
                      "fraction_of_step": None if self.fraction_of_step is None else round(self.fraction_of_step, 4)}
            if self.saving_range is not None:
                saving["range_ms"] = [round(self.saving_range[0], 3), round(self.saving_range[1], 3)]
        out = {
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity,
            "title": self.title,
            "message": self.message,
            "why": self.why,
            "estimated_saving": saving,
            "saving_basis": self.saving_basis,
            "confidence": self.confidence,
            "locations": [l.as_dict() for l in self.locations],
            "evidence": [f.as_dict() for f in self.evidence],
            "fix": self.fix.as_dict() if self.fix else None,
            "references": list(self.references),
            "fingerprint": self.fingerprint(),
        }
        if self.verification is not None:  # only where verify ran: reports without it are as they were
            out["verification"] = self.verification.as_dict()
        return out


@dataclass
class Hotspot:
    function: str
    file: str
    line: int
    ms_per_step: float
    calls_per_step: float
    lines: list[HotLineDoc] = field(default_factory=list)  # its hottest lines
    process: str = "main"  # "main" (cProfile and the line sampler) or "dataloader-workers" (py-spy)

    def as_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line,
                "ms_per_step": round(self.ms_per_step, 3), "calls_per_step": round(self.calls_per_step, 2),
                "lines": msgspec.to_builtins(self.lines), "process": self.process}


# The rank table's columns (Report.ranks, built by facts/ranks.py) after rank and file, in the order
# the reports draw them: (key, label, kind), kind "ms" (per step), "share" (0..1), "count" (per step),
# "MHz", "MiB" or "str". A report draws a column where some rank has a value.
RANK_COLUMNS = (("step_ms", "step", "ms"), ("data_ms", "data wait", "ms"), ("compute_ms", "compute", "ms"),
                ("comm_ms", "communication", "ms"), ("idle_ms", "GPU idle", "ms"),
                ("idle_fraction", "idle share", "share"), ("sync_ms", "host syncs", "ms"), ("gc_ms", "GC", "ms"),
                ("cpu_wait_ms", "CPU wait", "ms"), ("cpu_wait_share", "CPU wait share", "share"),
                ("busy_share", "own work share", "share"), ("cpu_throttled_ms", "CPU throttled", "ms"),
                ("cpu_throttled_periods", "throttled periods", "count"), ("gpu_clock_mhz", "SM clock", "MHz"),
                ("gpu_throttled_share", "GPU throttled share", "share"), ("gpu_throttle", "GPU throttle reasons", "str"),
                ("memory_peak_mib", "memory peak", "MiB"), ("headroom_mib", "memory headroom", "MiB"))


def rank_header(label: str, kind: str) -> str:
    """A rank table column's heading in text and Markdown: its label, with the unit where the cells
    are bare numbers (ms, MHz)."""
    return label + (f" ({kind})" if kind in ("ms", "MHz", "MiB") else "")


@dataclass
class RuleDoc:
    """What a report says of a rule that found something (the rule catalog's, carried in the report
    so that renderers never load the catalog: `perfdoctor explain` one click away in HTML, SARIF's
    rule descriptors)."""

    id: str
    name: str
    severity: str
    summary: str
    what: str = ""
    why: str = ""
    example: str = ""
    use_instead: str = ""
    fix_safety: str = ""
    references: list[str] = field(default_factory=list)
    when: str = ""
    thresholds: dict[str, Any] = field(default_factory=dict)
    lets: dict[str, str] = field(default_factory=dict)  # the rule's [let]: names `when` reads as let.NAME

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "severity": self.severity, "summary": self.summary,
                "doc": {"what": self.what, "why": self.why, "example": self.example, "use_instead": self.use_instead,
                        "fix_safety": self.fix_safety, "references": list(self.references)},
                "when": self.when, "thresholds": dict(self.thresholds), "let": dict(self.lets)}


NO_FINDINGS = "No problems found by the rules."
NOTHING_MEASURED = ("No problems found in the source; the script stopped before its first profiled step, "
                    "so nothing was measured.")


@dataclass
class Report:
    run: RunInfoDoc  # what was analysed: script, argv, steps_observed, steps_profiled, device, torch, ...
    summary: SummaryDoc  # step time statistics and breakdown
    findings: list[Finding]
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # things the user should know (no steps found, ...)
    ranks: list[RankRowDoc] = field(default_factory=list)  # the rank table, distributed runs (facts.ranks)
    facts: dict[str, Fact] = field(default_factory=dict)  # the global facts behind the findings
    rules: list[RuleDoc] = field(default_factory=list)  # the rules of the findings, by id

    @property
    def measured_nothing(self) -> bool:
        """The script failed or was stopped before its first profiled step: only its source was
        judged, and a report without findings says so (NOTHING_MEASURED) instead of NO_FINDINGS."""
        ex = self.run.exit
        stopped = not isinstance(ex, UnsetType) and ex.reason in ("exception", "sys-exit", "killed", "interrupted")
        return stopped and not self.summary.steps_profiled

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": {"name": "perfdoctor", "version": __version__},
            "run": msgspec.to_builtins(self.run),  # report.json's Structs, as they are written
            "summary": msgspec.to_builtins(self.summary),
            "findings": [f.as_dict() for f in self.findings],
            "hotspots": [h.as_dict() for h in self.hotspots],
            "notes": list(self.notes),
            "ranks": msgspec.to_builtins(self.ranks),
            "facts": {n: f.as_dict() for n, f in sorted(self.facts.items())},
            "rules": [r.as_dict() for r in self.rules],
        }

def to_doc(report: Report) -> ReportDoc:
    """The report as report.json's contract (report/jsonfmt.py writes it), every value validated
    against the Structs' constraints (a step of 0 ms, a negative count: a test failure, not a file)."""
    return msgspec.convert(report.as_dict(), ReportDoc)


def _verification(v: VerificationDoc | UnsetType) -> Verification | None:
    if isinstance(v, UnsetType):
        return None
    iv = v.interval_ms
    return Verification(v.verdict, v.kind, v.why, v.measured_ms_per_step,
                        (iv[0], iv[1]) if iv is not None and len(iv) == 2 else None, v.runs, v.step_ms)


def from_doc(doc: ReportDoc) -> Report:
    """A saved report.json as the Report every renderer draws (`perfdoctor report report.json`):
    everything it shows is in the document (a finding's per-step saving range as written, no per-step
    facts, which nothing renders)."""

    def fact(name: str, f: FactDoc) -> Fact:
        return Fact(name or f.fact, f.value, f.unit, f.source, f.detail)

    def location(l: LocationDoc) -> Location:
        return Location(l.file, l.line, l.code, l.function)

    findings = []
    for f in doc.findings:
        saving = f.estimated_saving
        spread = saving.range_ms if saving is not None and not isinstance(saving.range_ms, UnsetType) else None
        subject = f.fingerprint[len(f.rule) + 1:] if f.fingerprint.startswith(f.rule + ":") else ""
        findings.append(Finding(
            rule=f.rule, name=f.name, severity=f.severity or "", title=f.title, message=f.message, why=f.why,
            ms_per_step=saving.ms_per_step if saving is not None else None,
            fraction_of_step=saving.fraction_of_step if saving is not None else None,
            saving_basis=f.saving_basis, confidence=f.confidence, locations=[location(l) for l in f.locations],
            evidence=[fact(e.fact, e) for e in f.evidence],
            fix=Fix(f.fix.before, f.fix.after, f.fix.note, f.fix.example) if f.fix is not None else None,
            references=list(f.references), subject=subject,
            saving_range=(spread[0], spread[1]) if spread is not None and len(spread) == 2 else None,
            verification=_verification(f.verification)))
    hotspots = [Hotspot(function=h.function, file=h.file, line=h.line, ms_per_step=h.ms_per_step,
                        calls_per_step=h.calls_per_step, lines=list(h.lines), process=h.process)
                for h in doc.hotspots]
    return Report(run=doc.run, summary=doc.summary, findings=findings,
                  hotspots=hotspots, notes=list(doc.notes), ranks=list(doc.ranks),
                  facts={n: fact(n, f) for n, f in doc.facts.items()},
                  rules=[RuleDoc(id=r.id, name=r.name, severity=r.severity, summary=r.summary, what=r.doc.what,
                                 why=r.doc.why, example=r.doc.example, use_instead=r.doc.use_instead,
                                 fix_safety=r.doc.fix_safety, references=list(r.doc.references), when=r.when,
                                 thresholds=dict(r.thresholds), lets=dict(r.let)) for r in doc.rules])
