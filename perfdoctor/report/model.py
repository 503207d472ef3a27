"""The one internal result every renderer draws from (text, json, markdown, sarif, github).

Renderers never measure; the analysis never formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor import __version__
from perfdoctor.facts.model import Fact, Location

SCHEMA = "perfdoctor/report/v1"
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Fix:
    before: str
    after: str
    note: str = ""  # one line: what else to change (e.g. "launch with torchrun")
    example: bool = False  # True: an illustration of the fix, not a rewrite of the user's own line

    def as_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "note": self.note, "example": self.example}


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

    def sort_key(self) -> tuple:
        measured = self.ms_per_step is not None
        return (0 if measured else 1, -(self.ms_per_step or 0.0), SEVERITY_ORDER.get(self.severity, 3), self.rule)

    def fingerprint(self) -> str:
        """Stable across checkouts and line moves: the rule, the file's name and the code line's text."""
        loc = self.locations[0] if self.locations else None
        where = f"{Path(loc.file).name}:{' '.join(loc.code.split())}" if loc else self.subject
        return f"{self.rule}:{where}"

    def as_dict(self) -> dict[str, Any]:
        saving = None
        if self.ms_per_step is not None:
            saving = {"ms_per_step": round(self.ms_per_step, 3),
                      "fraction_of_step": None if self.fraction_of_step is None else round(self.fraction_of_step, 4)}
        return {
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


@dataclass
class Hotspot:
    function: str
    file: str
    line: int
    ms_per_step: float
    calls_per_step: float
    lines: list[dict[str, Any]] = field(default_factory=list)  # [{"line": n, "code": s, "share": f}]
    process: str = "main"  # "main" (cProfile and the line sampler) or "dataloader-workers" (py-spy)

    def as_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line,
                "ms_per_step": round(self.ms_per_step, 3), "calls_per_step": round(self.calls_per_step, 2),
                "lines": self.lines, "process": self.process}


@dataclass
class Report:
    run: dict[str, Any]  # script, argv, steps_observed, steps_profiled, device, torch, ...
    summary: dict[str, Any]  # step time statistics and breakdown
    findings: list[Finding]
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # things the user should know (no steps found, ...)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # per-rank summaries, distributed traces
    facts: dict[str, Fact] = field(default_factory=dict)  # the global facts behind the findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": {"name": "perfdoctor", "version": __version__},
            "run": self.run,
            "summary": self.summary,
            "findings": [f.as_dict() for f in self.findings],
            "hotspots": [h.as_dict() for h in self.hotspots],
            "notes": list(self.notes),
            "ranks": list(self.ranks),
            "facts": {n: f.as_dict() for n, f in sorted(self.facts.items())},
        }
