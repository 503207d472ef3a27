"""Static evidence: an `ast` read of the user's files (never imported, never run).

It finds what a run on a CPU-only machine cannot show: a `.cuda()` path, a branch not taken,
a DataLoader that feeds a GPU. Every fact it adds has source "static". It is conservative:
a pattern it is not sure of is left out (a wrong finding costs more than a missed one).

Each file is read and indexed once (`index.SourceIndex`: its nodes, parents, imports, loops,
source text); then each detector of `DETECTORS`, one module per subject kind, reads the index
and adds its own subjects or facts. Subjects use the contract's key `"<absolute file>:<line>"`
(the line of the call or statement), so that the run's probes and the static read of the same
line merge into one subject.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from perfdoctor.contracts.run import Site
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run.hotspots import FunctionShare
from perfdoctor.facts.static import (
    backend_flags,
    batch_copy,
    batch_source,
    conv_bias,
    conv_net,
    cpu_to_device,
    dataloader,
    dataparallel,
    empty_cache,
    eval_grad,
    host_read,
    loader_model,
    loss_holder,
    optimizer,
    periodic_stall,
    targets_cuda,
    tf32,
    uses_amp,
    worker_io,
    zero_grad,
)
from perfdoctor.facts.static.index import SourceIndex, read

# Every detector is a `detect(index, facts)` that adds what it finds in one file.
DETECTORS = (
    dataparallel.detect,
    empty_cache.detect,
    dataloader.detect,
    cpu_to_device.detect,
    loss_holder.detect,
    host_read.detect,
    targets_cuda.detect,
    uses_amp.detect,
    backend_flags.detect,
    conv_net.detect,
    conv_bias.detect,
    tf32.detect,
    optimizer.detect,
    zero_grad.detect,
    batch_copy.detect,
    worker_io.detect,
    periodic_stall.detect,
    loader_model.detect,
    eval_grad.detect,
)


def analyse_files(paths: list[Path], facts: Facts, model_classes: set[str] | None = None,
                  decided: frozenset[str] = frozenset(), step_chain: Sequence[Site] = (),
                  script: Path | None = None, factory_lines: dict[str, frozenset[int]] | None = None,
                  functions_called: dict[str, frozenset[int]] | None = None,
                  move_lines: dict[str, frozenset[int]] | None = None,
                  loader_draws: dict[str, list[tuple[str, int]]] | None = None,
                  function_shares: dict[str, dict[int, FunctionShare]] | None = None,
                  model_calls: Sequence[tuple[str, int]] = ()) -> None:
    """Add static subjects and facts for the user's files. Unreadable or unparsable files are skipped.
    `model_classes`: the classes of the models a run called ("<absolute file>:<qualname>", their
    bases included), where a run knows them: the detectors of model code judge only those
    (`SourceIndex.model_ran`); None: every class in the files. `decided`: the subject kinds a run
    decided from what it observed (`perfdoctor.facts.run.modules.decided`): their detectors (the
    module of that name) stand down. `step_chain`: the user's frames the run saw at its first optimizer
    step, innermost first: the loops around the calls that lead into the training loop run once per
    training run, not per step (`outer_calls`). `script`: the file the run started as `__main__`, where
    it is known; every other file the run imported, so its `if __name__ == "__main__":` blocks are
    left out (`index.read`). `factory_lines`: per file (its real path), the lines where the run saw a
    torch factory make a host tensor in the steps it watched (`index.factories_ran`); None where the
    run cannot say. `functions_called`: per file, the first lines of the functions the run's profiled
    steps called (`index.functions_called`, with `index.chain_lines`: the step chain's lines in the
    file); None where the run cannot say. `move_lines`: per file, the lines that moved a tensor to a
    device in the steps the host-tensor probe watched (`index.moves_ran`); None where the run cannot say.
    `loader_draws`: per DataLoader subject key, the user lines that drew an epoch's first batch from it
    (`dataloader.drawn_moves`). `function_shares`: per file, per function's first line, its cumulative
    time's share of the profiled steps and its calls per step (cProfile): a batch source of the user's
    on the training thread (`batch_source`); None where the run cannot say. `model_calls`: the (file,
    line) where the run saw the script call its models (`batch_source`: a function whose result the
    model's call takes). Each file's read and each detector on it is one family
    of facts (`Facts.family`): a bug in one leaves the others' facts."""
    detectors = [d for d in DETECTORS if d.__module__.rsplit(".", 1)[-1] not in decided]
    indexes = []
    for path in paths:
        index = None
        with facts.family(f"the static read of {Path(path).name}"):
            index = read(Path(path), imported=script is not None and not _same_file(path, script))
        if index is not None:
            indexes.append(index)
    # each file's loops see the others': a function called only from another file is judged where it is
    # called (a replay buffer's `sample` in the agent's update: in the step; a model file's `sample`
    # after each epoch: not)
    loops = []
    for index in indexes:
        with facts.family(f"the loops of {Path(index.file).name}"):
            loops.append(index.loops)
    for each in loops:
        each.peers = [other for other in loops if other is not each]
    with facts.family("the training step's call chain"):
        outer, into = outer_calls(step_chain, indexes)
        for index in indexes:
            index.loops.outer_lines = outer.get(str(index.file), frozenset())
            index.loops.set_step_calls(into.get(str(index.file), frozenset()))
    for index in indexes:
        if factory_lines is not None:
            index.factories_ran = factory_lines.get(os.path.realpath(index.file), frozenset())
        if move_lines is not None:
            index.moves_ran = move_lines.get(os.path.realpath(index.file), frozenset())
        if functions_called is not None:
            real = os.path.realpath(index.file)
            index.functions_called = functions_called.get(real, frozenset())
            index.chain_lines = frozenset(s.line for s in step_chain if os.path.realpath(s.file) == real)
        if model_classes is not None:
            prefix = f"{index.file}:"
            index.ran_classes = {c[len(prefix):] for c in model_classes if c.startswith(prefix)}
    # every file's run facts before any detector: a detector follows calls into the other files
    # (`cpu_to_device._returns_drawn`: which replay buffer's `sample` the steps called)
    for index in indexes:
        for detect in detectors:
            with facts.family(f"the static {detect.__module__.rsplit('.', 1)[-1]} detector on {Path(index.file).name}"):
                detect(index, facts)
    if loader_draws and "dataloader" not in decided:
        with facts.family("the loops that drew the loaders' batches"):
            dataloader.drawn_moves(indexes, facts, loader_draws)
    if function_shares and "dataloader" not in decided:
        with facts.family("the batch sources of the user's on the training thread"):
            batch_source.add_sources(indexes, facts, function_shares, loader_draws or {}, model_calls)
    with facts.family("the evaluation's default batch"):
        loader_model.eval_batch(facts)  # every file's loaders read: the one beside an evaluation may be in another
    with facts.family("the periodic stall's line"):
        periodic_stall.choose(facts)  # every file read: the run's candidate lines may lie in several


def _same_file(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def outer_calls(step_chain: Sequence[Site], indexes: Sequence[SourceIndex]
                ) -> tuple[dict[str, frozenset[int]], dict[str, frozenset[int]]]:
    """The lines, per file, of the calls on the training step's chain that sit outside the training
    loop, and of the call in it that leads to the step. The run's frames at its first optimizer step,
    innermost first; the first whose line is in a loop of its function holds the training loop (`for
    batch in loader: ... optimizer.step()`, or `for batch in loader: train_step(batch)`, or MAML's
    `accs = maml(x_spt, y_spt, x_qry, y_qry)`, whose module's forward steps the meta-optimizer): where
    that line is a call, it takes the step (`Loops.step_calls`); the frames that called that one
    (`exp.train(setting)` in `for ii in range(args.itr):`, a sweep over experiments in another file)
    are outer calls: a loop around one of them runs once per training run, not per step."""
    by_file = {os.path.realpath(index.file): index for index in indexes}
    lines: dict[str, set[int]] = {}
    into: dict[str, frozenset[int]] = {}
    looped = False
    for site in step_chain:
        index = by_file.get(os.path.realpath(site.file))
        if looped:
            if index is not None:
                lines.setdefault(str(index.file), set()).add(site.line)
            continue
        if index is not None and any(c.lineno <= site.line <= (c.end_lineno or c.lineno)
                                     and index.loops.enclosing_loop(c) is not None
                                     for c in index.calls if c.lineno == site.line):
            looped = True
            into[str(index.file)] = frozenset({site.line})
    return {f: frozenset(v) for f, v in lines.items()}, into
