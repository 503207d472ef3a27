"""Facts: named measurements with units and provenance.

A fact that could not be measured is absent, never zero. Rules read facts by name
(`step.time_ms`, `dataloader.wait_ms`, ...). Facts about one thing in the user's program
(one DataLoader, one `empty_cache` call site, one list that keeps losses) live on a
`Subject` of a kind; a rule with `subject = "dataloader"` is judged once per such subject,
with the subject's facts and the global facts both in scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from perfdoctor.model import Fact, Location

# Where a fact comes from, strongest evidence first. A finding's confidence follows its sources.
SOURCES = ("run", "trace", "static", "machine")


@dataclass
class Subject:
    """One thing in the user's program that rules judge: a DataLoader, a call site, a holder."""

    kind: str  # "dataloader", "dataparallel", "empty_cache", "cpu_to_device", "loss_holder", "model", "worker_hotspot", ...
    key: str  # stable identity within a run, e.g. "train.py:42"
    facts: dict[str, Fact] = field(default_factory=dict)
    locations: list[Location] = field(default_factory=list)

    def add(self, name: str, value: Any, unit: str = "", source: str = "run", detail: str = "") -> None:
        if value is None:
            return
        if not name.startswith(self.kind + "."):
            name = f"{self.kind}.{name}"
        self.facts[name] = Fact(name, value, unit, source, detail)

    @property
    def sources(self) -> set[str]:
        return {f.source for f in self.facts.values()}


class Facts:
    """All facts of one analysed run or trace."""

    def __init__(self) -> None:
        self._facts: dict[str, Fact] = {}
        self.subjects: dict[str, list[Subject]] = {}

    # -- global facts --------------------------------------------------------------------
    def add(self, name: str, value: Any, unit: str = "", source: str = "run", detail: str = "") -> None:
        """Record a fact. `None` means "not measured" and records nothing."""
        if value is None:
            return
        self._facts[name] = Fact(name, value, unit, source, detail)

    def get(self, name: str) -> Fact | None:
        return self._facts.get(name)

    def value(self, name: str, default: Any = None) -> Any:
        f = self._facts.get(name)
        return default if f is None else f.value

    def __contains__(self, name: str) -> bool:
        return name in self._facts

    def __iter__(self) -> Iterable[Fact]:
        return iter(self._facts.values())

    def as_mapping(self) -> dict[str, Fact]:
        return dict(self._facts)

    # -- subjects ------------------------------------------------------------------------
    def subject(self, kind: str, key: str) -> Subject:
        """The subject of this kind and key, created on first use (so evidence from the run,
        the trace and the static read of the same call site merges into one subject)."""
        for s in self.subjects.setdefault(kind, []):
            if s.key == key:
                return s
        s = Subject(kind, key)
        self.subjects[kind].append(s)
        return s

    def of_kind(self, kind: str) -> list[Subject]:
        return list(self.subjects.get(kind, []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "facts": {n: f.as_dict() for n, f in sorted(self._facts.items())},
            "subjects": {
                k: [{"key": s.key, "locations": [l.as_dict() for l in s.locations],
                     "facts": {n: f.as_dict() for n, f in sorted(s.facts.items())}} for s in v]
                for k, v in sorted(self.subjects.items())
            },
        }
