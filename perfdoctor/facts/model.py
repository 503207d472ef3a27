"""Facts: named measurements with units and provenance.

A fact that could not be measured is absent, never zero. Rules read facts by name
(`step.time_ms`, `dataloader.wait_ms`, ...). Facts about one thing in the user's program
(one DataLoader, one `empty_cache` call site, one list that keeps losses) live on a
`Subject` of a kind; a rule with `subject = "dataloader"` is judged once per such subject,
with the subject's facts and the global facts both in scope.

Every name is declared in `perfdoctor.facts.registry` (an undeclared one raises UndeclaredFact), and
every add follows one precedence rule, `perfdoctor.facts.merge.supersedes`: a fact once set stays,
except that its own source may set it again and run evidence replaces static evidence (facts/merge.py
holds every rule of how evidence for one thing is merged).

Each family of facts (a trace module, a static detector on one file, a run family) runs inside
`Facts.family`: an internal error in it (a bug of perfdoctor's, not bad input) takes back what that
family added and becomes one line of `Facts.failures`, which the report shows as a note; the other
families' facts are judged as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfdoctor.errors import PerfdoctorError
from perfdoctor.facts.merge import supersedes
from perfdoctor.facts.registry import GLOBAL, SOURCES, check_declared, check_kind
from perfdoctor.model import Fact, Location

if TYPE_CHECKING:
    from perfdoctor.contracts.run import Site


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise ValueError(f"fact source {source!r} is not one of {', '.join(SOURCES)}")


@dataclass
class Subject:
    """One thing in the user's program that rules judge: a DataLoader, a call site, a holder."""

    kind: str  # a subject kind of perfdoctor.facts.registry: "dataloader", "empty_cache", "loss_holder", ...
    key: str  # stable identity within a run, e.g. "train.py:42"
    facts: dict[str, Fact] = field(default_factory=dict)
    locations: list[Location] = field(default_factory=list)

    def add(self, name: str, value: Any, unit: str = "", source: str = "run", detail: str = "",
            per_step: tuple[float, ...] = ()) -> None:
        """Record a fact of this subject (`name` with or without the kind's prefix), unless a fact of
        that name from a source it does not supersede is already there. `None` records nothing.
        `per_step`: its value at each steady-state step (`Fact.per_step`)."""
        if value is None:
            return
        if not name.startswith(self.kind + "."):
            name = f"{self.kind}.{name}"
        check_declared(name, self.kind)
        _check_source(source)
        old = self.facts.get(name)
        if old is None or supersedes(source, old.source):
            self.facts[name] = Fact(name, value, unit, source, detail, tuple(per_step))

    @property
    def sources(self) -> set[str]:
        return {f.source for f in self.facts.values()}


class Facts:
    """All facts of one analysed run or trace."""

    def __init__(self) -> None:
        self._facts: dict[str, Fact] = {}
        self.subjects: dict[str, list[Subject]] = {}
        self.failures: list[str] = []  # families that failed: "<family>: <error>" (`family`)

    @contextmanager
    def family(self, name: str) -> Iterator[None]:
        """Run one family of facts, `name` saying which ("static cpu_to_device on train.py"). An
        exception out of it that is not a PerfdoctorError (bad input keeps its exit code) is an
        analysis bug: the facts and subjects it added or changed are taken back, the error is kept
        in `failures`, and the analysis goes on without that family."""
        saved = (dict(self._facts), {k: [(s, dict(s.facts), list(s.locations)) for s in subs]
                                     for k, subs in self.subjects.items()})
        try:
            yield
        except PerfdoctorError:
            raise
        except Exception as e:  # RecursionError and MemoryError included: one family's bug, not the run's
            self._facts = saved[0]
            self.subjects = {k: [s for s, _, _ in subs] for k, subs in saved[1].items()}
            for subs in saved[1].values():
                for s, kept, locations in subs:
                    s.facts, s.locations = kept, locations
            message = " ".join(str(e).split())[:200]
            self.failures.append(f"{name}: {type(e).__name__}" + (f": {message}" if message else ""))

    # -- global facts --------------------------------------------------------------------
    def add(self, name: str, value: Any, unit: str = "", source: str = "run", detail: str = "",
            per_step: tuple[float, ...] = ()) -> None:
        """Record a global fact, unless a fact of that name from a source it does not supersede is
        already there. `None` means "not measured" and records nothing. `per_step`: its value at
        each steady-state step (`Fact.per_step`)."""
        if value is None:
            return
        check_declared(name, GLOBAL)
        _check_source(source)
        old = self._facts.get(name)
        if old is None or supersedes(source, old.source):
            self._facts[name] = Fact(name, value, unit, source, detail, tuple(per_step))

    def get(self, name: str) -> Fact | None:
        return self._facts.get(name)

    def value(self, name: str, default: Any = None) -> Any:
        f = self._facts.get(name)
        return default if f is None else f.value

    def __contains__(self, name: str) -> bool:
        return name in self._facts

    def __iter__(self) -> Iterator[Fact]:
        return iter(self._facts.values())

    def as_mapping(self) -> dict[str, Fact]:
        return dict(self._facts)

    # -- subjects ------------------------------------------------------------------------
    def subject(self, kind: str, key: str) -> Subject:
        """The subject of this kind and key, created on first use (so evidence from the run,
        the trace and the static read of the same call site merges into one subject)."""
        check_kind(kind)
        for s in self.subjects.setdefault(kind, []):
            if s.key == key:
                return s
        s = Subject(kind, key)
        self.subjects[kind].append(s)
        return s

    def of_kind(self, kind: str) -> list[Subject]:
        return list(self.subjects.get(kind, []))

    def kinds_from(self, source: str) -> set[str]:
        """The subject kinds of which some subject holds a fact from `source`."""
        return {k for k, subs in self.subjects.items() if any(source in s.sources for s in subs)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "facts": {n: f.as_dict() for n, f in sorted(self._facts.items())},
            "subjects": {
                k: [{"key": s.key, "locations": [l.as_dict() for l in s.locations],
                     "facts": {n: f.as_dict() for n, f in sorted(s.facts.items())}} for s in v]
                for k, v in sorted(self.subjects.items())
            },
        }


def site_subject(facts: Facts, kind: str, site: Site | None) -> Subject | None:
    """The subject of `kind` at a probe's site (file:line), its location recorded once; None for no site."""
    if site is None or not site.file:
        return None
    s = facts.subject(kind, f"{site.file}:{site.line}")
    also_at(s, site)
    return s


def also_at(s: Subject, site: Site) -> None:
    """Record a probe's site among the subject's locations, once (after those it has)."""
    loc = Location(site.file, site.line, site.code, site.function)
    if loc not in s.locations:
        s.locations.append(loc)
