"""A run folder (written by `perfdoctor run`) -> facts, summary, hot spots and notes. Never imports torch.

One module per family of facts, each an `add(ctx)` over one shared `RunContext` (`context.py`: the
run folder's typed files, read once, and its steady-state steps), like the trace's families
(perfdoctor.facts.trace). The families after the step time and the machine are named after the probe
whose records they read (capture/probes/<name>.py -> facts/run/<name>.py): a new probe's facts go in
a module of its own here, added to FAMILIES, with its names declared in facts/registry.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfdoctor.contracts.report import SummaryDoc
from perfdoctor.contracts.run import Site
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run import (
    anomaly,
    compile,
    compute,
    cpu_wait,
    dataloader,
    dataparallel,
    ddp,
    empty_cache,
    forward,
    gc_calls,
    gc_time,
    gpu_clock,
    holders,
    host_reads,
    host_tensors,
    hotspots,
    machine,
    memory,
    modules,
    notes,
    stalls,
    steps,
)
from perfdoctor.facts.run.context import RunContext
from perfdoctor.facts.run.hotspots import FunctionShare
from perfdoctor.model import Hotspot

__all__ = ["FAMILIES", "RunContext", "RunData", "load_run"]

# In order: the step time first (the others read its steady steps), the memory before the loss
# holders (they share its growth), the notes before the hot spots' note.
FAMILIES = (steps, machine, memory, dataloader, dataparallel, empty_cache, anomaly, forward, modules, holders, host_reads,
            host_tensors, gc_calls, stalls, compile, compute, cpu_wait, ddp, gc_time, gpu_clock, notes, hotspots)


@dataclass
class RunData:
    meta: dict[str, Any]  # meta.json as written (checked against contracts.run.Meta)
    facts: Facts
    summary: SummaryDoc
    hotspots: list[Hotspot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    user_files: list[Path] = field(default_factory=list)
    trace_path: Path | None = None
    # the user-defined classes of the models the run called ("<file>:<qualname>"); None where the
    # run saw no model called (then nothing is known of which ran)
    model_classes: set[str] | None = None
    # the subject kinds the run decided (their static detectors stand down), e.g. conv_net
    decided: frozenset[str] = frozenset()
    # the user's call chain to the first optimizer step, innermost first (probes.json `step_chain`)
    step_chain: list[Site] = field(default_factory=list)
    # per user file (its real path), the lines where a torch factory made a host tensor in the steps the
    # host-tensor probe watched; None where the run cannot say which ran (`host_tensors.factory_lines`)
    factory_lines: dict[str, frozenset[int]] | None = None
    # per user file (its real path), the lines that moved a tensor to a device in those steps; None
    # where the run cannot say (`host_tensors.move_lines`)
    move_lines: dict[str, frozenset[int]] | None = None
    # per user file (its real path), the first lines of the functions cProfile saw called in the
    # window's profiled steps; None where the run cannot say (`hotspots.functions_called`)
    functions_called: dict[str, frozenset[int]] | None = None
    # per user file (its real path), per function's first line: its cumulative time's share of the
    # profiled steps' wall time, its calls per profiled step, its own time's share; None where the run cannot say
    # (`hotspots.function_shares`)
    function_shares: dict[str, dict[int, FunctionShare]] | None = None
    # where the run saw the script call its models: (file, line) of each top-level model's call site
    model_calls: list[tuple[str, int]] = field(default_factory=list)
    # per DataLoader subject key ("<file>:<line>" of its judged site), the user lines (file, line) that
    # drew an epoch's first batch from it: the loops over it, in whatever file (`dataloader.draw_sites`)
    loader_draws: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    ctx = RunContext.read(run_dir)
    steps.add(ctx)  # the steady steps every other family reads: not contained
    for family in FAMILIES[1:]:
        with ctx.facts.family(f"the run's {family.__name__.rsplit('.', 1)[-1]} facts"):  # a bug in one leaves the others
            family.add(ctx)
    trace = run_dir / "trace.json.gz"
    return RunData(meta=ctx.raw_meta, facts=ctx.facts, summary=ctx.summary, hotspots=ctx.hotspots, notes=ctx.notes,
                   user_files=[p for p in _user_files(ctx) if p.is_file()], trace_path=trace if trace.exists() else None,
                   model_classes=forward.model_classes(ctx.probes.forward),
                   decided=modules.decided(ctx.probes.forward), step_chain=list(ctx.probes.step_chain),
                   factory_lines=host_tensors.factory_lines(ctx.probes),
                   move_lines=host_tensors.move_lines(ctx.probes),
                   functions_called=hotspots.functions_called(ctx),
                   function_shares=hotspots.function_shares(ctx),
                   model_calls=[(fw.site.file, fw.site.line) for fw in ctx.probes.forward
                                if fw.site is not None and fw.site.file],
                   loader_draws=dataloader.draw_sites(ctx.probes))


def _user_files(ctx: RunContext) -> list[Path]:
    """meta.json's user files (those under the script's folder), and the user's own package imported
    from elsewhere in the project (minGPT's projects/adder/adder.py driving mingpt/trainer.py) where
    the training loop lives there: the files that built a DataLoader or called the model, and those of
    the step's call chain (test_gym/dqn.py calling common/utils.py's `mini_batch_train`, whose loop
    steps the environment and the agent: `StepClock.step_codes`, probes.step_chain), that read a
    tensor on the host in the steps, that define the classes of the models the run called (their
    forward: `ForwardRecord.classes`, the user's classes only), or whose functions cProfile saw the
    profiled steps call (a replay buffer's `sample` in common/replay_buffers.py)."""
    users = [Path(p) for p in ctx.meta.user_files or []]
    if not users and ctx.meta.script:
        users = [Path(ctx.meta.script)]
    sites = ([dl.site for dl in ctx.probes.dataloaders] + [fw.site for fw in ctx.probes.forward]
             + list(ctx.probes.step_chain) + [r.site for r in ctx.probes.host_reads])
    files = [s.file for s in sites if s is not None and s.file] + [
        c.rsplit(":", 1)[0] for fw in ctx.probes.forward for c in fw.classes or ()] + [
        f.file for f in ctx.hotspot_file.functions]
    seen = {os.path.realpath(u) for u in users}
    for file in files:
        if os.path.isabs(file) and (real := os.path.realpath(file)) not in seen:
            seen.add(real)
            users.append(Path(file))
    return users
