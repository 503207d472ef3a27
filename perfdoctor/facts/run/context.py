"""What every family of run facts reads: the run folder's typed files (contracts/run.py: meta.json,
steps.json, probes.json, hotspots.json), its steady-state steps, and what the families hand on to the
report (the summary, the notes, the hot spots). Built once per run folder (`RunContext.read`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from perfdoctor.contracts.files import TOO_DEEP, check_schema, read_bytes
from perfdoctor.contracts.report import SummaryDoc
from perfdoctor.contracts.run import (
    SCHEMA,
    Env,
    Exit,
    Hotspots,
    Meta,
    Probes,
    Rank,
    Receipt,
    Receipts,
    Step,
    Steps,
    Stuck,
    Window,
    decode,
)
from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.model import Hotspot
from perfdoctor.stats import median as median_of
from perfdoctor.stats import profiler_steps, steady_steps

CLOCKS = {"optimizer": "optimizer", "backward": "backward", "dataloader": "dataloader", "none": "whole-run"}

T = TypeVar("T")


@dataclass
class RunContext:
    """One run folder, read once, shared by the families of run facts (perfdoctor.facts.run.*).

    Every field has a default, so that a test can build one from a probe's records alone
    (`RunContext(facts, Probes(...), steady)`). `steady`: the steady-state steps as
    perfdoctor.stats takes them (dicts of steps.json's Step, `i` from 1), shared with the gate."""

    facts: Facts = field(default_factory=Facts)
    probes: Probes = field(default_factory=Probes)
    steady: list[dict[str, Any]] = field(default_factory=list)
    meta: Meta = field(default_factory=Meta)
    raw_meta: dict[str, Any] = field(default_factory=dict)  # meta.json as written
    run_steps: list[Step] = field(default_factory=list)
    hotspot_file: Hotspots = field(default_factory=Hotspots)
    # what the families hand on: the report's summary, notes and hot spots
    summary: SummaryDoc = field(default_factory=SummaryDoc)
    notes: list[str] = field(default_factory=list)
    hotspots: list[Hotspot] = field(default_factory=list)
    # the process's memory growth per step where it is clear (memory.py), which the loss holders share
    growth: float | None = None
    # where the script was while no step had ended (stuck.json), for a run that ended no step
    stuck: Stuck | None = None
    # what a batch from a worker cost to receive on the run's host, timed after the run (receipts.json)
    receipts: list[Receipt] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path) -> RunContext:
        """The run folder's files as their contracts; InputError if it is not a run folder, or a file
        does not hold what its contract says."""
        meta, raw_meta = _read_meta(run_dir)
        run_steps = _read(run_dir / "steps.json", Steps).steps
        stuck = None
        if _ended_early(meta):  # the span up to where the script stopped is no step (`ended_early`)
            run_steps = []
            try:
                stuck = _read(run_dir / "stuck.json", Stuck) if (run_dir / "stuck.json").exists() else None
            except InputError:  # a dump cut short: the run's other files still tell what they can
                stuck = None
        steps: list[dict[str, Any]] = msgspec.to_builtins(run_steps)
        window: dict[str, Any] = msgspec.to_builtins(meta.window) if meta.window is not None else {}
        try:  # a measurement beside the run: one that does not read leaves the estimate, not the report, undone
            receipts = _read(run_dir / "receipts.json", Receipts).receipts
        except InputError:
            receipts = []
        return cls(probes=_read(run_dir / "probes.json", Probes), steady=steady_steps(steps, window), meta=meta,
                   raw_meta=raw_meta, run_steps=run_steps, hotspot_file=_read(run_dir / "hotspots.json", Hotspots),
                   stuck=stuck, receipts=receipts)

    @property
    def ended_early(self) -> bool:
        """The script stopped (failed, was interrupted or killed) before any step ended: the span up
        to there is no step, and nothing of it is reported as one (a syntax error's "1 step, 6.5 ms")."""
        return _ended_early(self.meta)

    @property
    def env(self) -> Env:
        return self.meta.env

    @property
    def window(self) -> Window | None:
        return self.meta.window

    @property
    def exit(self) -> Exit:
        return self.meta.exit

    @property
    def rank(self) -> Rank | None:
        """This run's rank in a distributed job, None for a run on its own."""
        return self.meta.rank if isinstance(self.meta.rank, Rank) else None

    @property
    def clock(self) -> str:
        """What counted the steps: optimizer, backward, dataloader or whole-run."""
        return CLOCKS.get(self.meta.step_clock or "none", "whole-run")

    @property
    def profiled(self) -> int:
        """The steps the profiler recorded."""
        return (self.window.steps_profiled or 0) if self.window is not None else 0

    @cached_property
    def held(self) -> range:
        """The steps the profiler held: its window and the export step after it (empty where it recorded none)."""
        window = msgspec.to_builtins(self.window) if self.window is not None else {}
        return profiler_steps(window) if self.profiled else range(0)

    @cached_property
    def median(self) -> float | None:
        """The median steady step (ms), None where there is none."""
        return median_of([s["wall_ms"] for s in self.steady])

    @property
    def steady_idx(self) -> list[int]:
        """The steady steps as indices into per-step series (step i at i - 1)."""
        return [s["i"] - 1 for s in self.steady]


def _ended_early(meta: Meta) -> bool:
    return CLOCKS.get(meta.step_clock or "none", "whole-run") == "whole-run" and \
        meta.exit.reason not in ("completed", "steps-reached")


def _bytes(path: Path) -> bytes | None:
    """The file's contents (regular files only, capped: contracts.files.read_bytes), None if there is no such file."""
    if not path.exists() and not path.is_symlink():
        return None
    return read_bytes(path)


def _read(path: Path, type: type[T]) -> T:
    """A run file as its contract; a missing file reads as an empty one."""
    data = _bytes(path)
    return type() if data is None else decode(data, type, path)


def _read_meta(run_dir: Path) -> tuple[Meta, dict[str, Any]]:
    """meta.json as its contract, and as written; InputError if the folder is not a run folder."""
    path = run_dir / "meta.json"
    data = _bytes(path)
    try:
        raw = None if data is None else msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise InputError(f"{path} is not readable JSON ({e}); run `perfdoctor run` again") from None
    except RecursionError:
        raise InputError(f"{path}: {TOO_DEEP}") from None
    if data is None or not isinstance(raw, dict):
        raise InputError(f"{run_dir} is not a perfdoctor run folder (no meta.json); "
                         "give a folder that `perfdoctor run` wrote, or a trace file")
    schema = raw.get("schema")
    check_schema(path, schema if isinstance(schema, str) else None, SCHEMA, "perfdoctor run folder's meta.json")
    return decode(data, Meta, path), raw


def span(idx: list[int]) -> str:
    """The steps `idx` (sorted step numbers) in words: "steps 3..4, 14..40"."""
    if not idx:
        return "no steps"
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return "step" + ("s " if len(idx) > 1 else " ") + ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs)
