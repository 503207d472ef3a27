"""How evidence for one thing is merged, in one place: the precedence of sources (`supersedes`), a
second view of the same line taken into a subject (`merge_subject`), the trace's coarser view of a
kind of thing the run measured left out (`drop_subjects_only_from`), the trace's file-name-only
frames given the run's paths and merged into the run's or the source's subject of that line
(`resolve_trace_files`), and the ranks of a distributed run merged into one view (`merge_findings`:
each finding once; `add_missing`: the pace rank's global facts).

The rule: a fact, once set, stays, except that the layer that set it may set it again (a later
measurement of its own, e.g. the trace summing a subject's copy time over the copies) and that run
evidence replaces static evidence (what ran beats what the source suggests). So the trace never
overwrites the run's, the static read's or the machine's facts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from perfdoctor.contracts.source import read_source
from perfdoctor.model import Finding, Location

if TYPE_CHECKING:
    from perfdoctor.facts.model import Facts, Subject


def supersedes(new: str, old: str) -> bool:
    """Whether evidence from source `new` replaces a fact of the same name already set by source `old`
    (every add of every layer follows it: Facts.add, Subject.add)."""
    return new == old or (new == "run" and old == "static")


def merge_subject(into: Subject, other: Subject) -> None:
    """Take into `into` the facts of `other`, a second view of the same site (the trace's, found to be
    on this subject's line): facts `into` lacks, and run facts over its static ones. Its own facts of
    the same source stay (a second view is not a later measurement)."""
    for name, fact in other.facts.items():
        old = into.facts.get(name)
        if old is None or (fact.source != old.source and supersedes(fact.source, old.source)):
            into.facts[name] = fact


def drop_subjects_only_from(facts: Facts, source: str, kinds: set[str]) -> None:
    """Leave out the subjects of `kinds` that hold no fact from another source than `source`. Where
    the run's probes measured a kind of thing (its DataLoaders, say), the trace's coarser view of the
    same thing is not a second subject: `drop_subjects_only_from(facts, "trace", facts.kinds_from("run")
    taken before the trace was added)`."""
    for kind in kinds:
        if kind in facts.subjects:
            facts.subjects[kind] = [s for s in facts.subjects[kind] if s.sources - {source}]


def resolve_trace_files(facts: Facts, user_files: list[Path]) -> None:
    """torch.profiler names the user's frames by file name only (`train.py(42): main`). In a run folder
    the user's files are known: give such locations their full path, and merge a subject into the one
    the run or the source already has for that line."""
    for kind, subjects in facts.subjects.items():
        kept: list[Subject] = []
        for s in subjects:
            for i, loc in enumerate(s.locations):
                if Path(loc.file).is_absolute():
                    continue
                match = [p for p in user_files if str(p).endswith("/" + loc.file.lstrip("./"))]
                if len(match) == 1:
                    s.locations[i] = Location(str(match[0]), loc.line, loc.code or _line(match[0], loc.line),
                                              loc.function)
            if s.locations:
                key = f"{s.locations[0].file}:{s.locations[0].line}"
                twin = next((o for o in kept if o.key == key), None)
                if twin is not None:
                    merge_subject(twin, s)
                    continue
                s.key = key
            kept.append(s)
        facts.subjects[kind] = kept


def _line(path: Path, line: int) -> str:
    """The code of line `line` of `path` (a user file: contracts.source reads it)."""
    sf = read_source(path)
    return "" if sf is None else sf.line(line).strip()


def merge_findings(ranks: list[int], per_rank: list[list[Finding]]) -> list[Finding]:
    """Each finding of a distributed run's ranks once (by its fingerprint): the costliest rank's, its
    message naming the ranks it was found on where not all."""
    by_print: dict[str, tuple[Finding, list[int]]] = {}
    for rank, rank_findings in zip(ranks, per_rank):
        for finding in rank_findings:
            key = finding.fingerprint()
            if key not in by_print or (finding.ms_per_step or 0) > (by_print[key][0].ms_per_step or 0):
                by_print[key] = (finding, by_print.get(key, (finding, []))[1])
            by_print[key][1].append(rank)
    findings = []
    for finding, rank_list in by_print.values():
        if len(rank_list) < len(ranks):
            finding.message += f" (ranks {', '.join(map(str, sorted(rank_list)))})"
        findings.append(finding)
    return findings


def add_missing(into: Facts, other: Facts) -> None:
    """The global facts of `other` (the rank that sets a synchronous step's pace) that `into` (the
    cross-rank view) lacks."""
    for fact in other:
        if fact.name not in into:
            into.add(fact.name, fact.value, fact.unit, fact.source, fact.detail)
