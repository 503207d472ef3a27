"""The DataLoader probe's records (capture/probes/dataloader.py, cuda_batches.py) -> one `dataloader`
subject per construction site: its settings, its wait per step, where its batches went, the cost of
starting its workers per epoch (PD015), and, for a num_workers=0 loader on a CPU run, what a GPU
would see of its loading (PD002)."""

from __future__ import annotations

import math
import statistics

from perfdoctor.contracts.run import DataLoaderRecord, Probes, Receipt
from perfdoctor.facts.model import Facts, Subject, also_at, site_subject
from perfdoctor.facts.run.context import RunContext

# The GPU projection, the one model of a GPU step from a CPU run (PD002 reads its facts, never the
# constant): how much faster a GPU runs a training step's forward, backward and optimizer than this
# machine's CPU cores. Small CNNs, MLPs and transformers train 10-50x faster on a current GPU than on a
# few CPU cores; the low end is taken, so the projected GPU step is long and a data stall is only
# projected where it is clear. The facts' details (the finding's evidence) say so in GPU_SPEEDUP_BASIS.
GPU_SPEEDUP = 10.0
GPU_SPEEDUP_BASIS = "the low end of a GPU's speed-up over a few CPU cores"

# What a batch made by a DataLoader worker costs the training process to receive (PD002): the result out
# of the worker's queue, unpickled, each tensor's storage rebuilt from shared memory (with the default
# file_descriptor strategy a descriptor fetched from the worker per storage), its pages mapped when the
# step first reads them. A run with num_workers=0, where PD002 fires, never pays it, so it is estimated
# from the batch the run saw (its tensors and bytes) with costs benchmarks/loader_receipt.py measured on
# this 2-core VM (batches of 2-16 tensors, 16 KB-4 MB, from 1 and 2 workers that are always ahead):
# `__next__`'s wall time at load average 0.7-1.9 gave the base and the cost per tensor and per MB
# (least squares), and the first read of the shared pages, over the read of a batch made in-process,
# added 0.24 ms per MB (0.23-0.26 at 1 and 4 MB, 1 and 2 workers, load 7: a short read on the CPU
# whose median the load barely moves). Starting
# workers inside the user's run to time it there would add processes to the program being measured.
RECEIPT_BASE_MS = 0.64
RECEIPT_PER_TENSOR_MS = 0.22
RECEIPT_PER_MB_MS = 0.90
RECEIPT_BASIS = "per batch, benchmarks/loader_receipt.py on a 2-core VM (torch 2.13, load average 0.7-1.9)"
MAX_RECEIPT_MS = 10_000.0  # a receipts.json value beyond it (or negative, or not finite) is not read


def add(ctx: RunContext) -> None:
    facts, env, steady, median = ctx.facts, ctx.env, ctx.steady, ctx.median
    steady_idx = ctx.steady_idx
    for dl in ctx.probes.dataloaders:
        # a loader a library built from the user's is judged at the user's line, its settings' (the
        # library's construction and the moves follow as locations)
        s = site_subject(facts, "dataloader", dl.judged_site)
        if s is None:
            continue
        if dl.origin is not None and dl.site is not None:
            also_at(s, dl.site)
        kw = dl.kwargs
        s.add("num_workers", kw.num_workers, "count")
        s.add("pin_memory", kw.pin_memory)
        s.add("persistent_workers", kw.persistent_workers)
        s.add("batch_size", kw.batch_size, "count")
        s.add("prefetch_factor", kw.prefetch_factor, "count")
        s.add("multiprocessing_context", kw.multiprocessing_context)
        s.add("kwargs_style", dl.kwargs_style)
        s.add("batches", dl.batches, "count")
        if dl.sampler:
            s.add("sampler", dl.sampler)
        if isinstance(dl.sharded, bool):
            s.add("sharded", dl.sharded, detail=f"sampler {dl.sampler}")
        waits = dl.wait_ms_per_step
        ws = [waits[i] for i in steady_idx if 0 <= i < len(waits)]
        if ws and dl.batches:
            w = statistics.median(ws)
            aligned = len(ws) == len(steady)  # a per-step series only where it covers every steady step
            s.add("wait_ms", w, "ms", detail=f"median time in DataLoader __next__ over {len(ws)} steady steps",
                  per_step=tuple(ws) if aligned else ())
            s.add("wait_mean_ms", statistics.fmean(ws), "ms")
            if median:
                s.add("wait_fraction", w / median, "ratio", detail="wait_ms / step.time_ms",
                      per_step=tuple(x / st["wall_ms"] if st["wall_ms"] > 0 else 0.0 for x, st in zip(ws, steady))
                      if aligned else ())
        if dl.batch_tensors and dl.batch_bytes is not None:
            steps = len(ctx.run_steps)
            _receipt(s, dl.batch_tensors, dl.batch_bytes, dl.batches / steps if steps and dl.batches else 1.0,
                     ctx.receipts)
        if ws and dl.batches and kw.num_workers == 0 and median is not None:
            project_to_gpu(facts, s, statistics.fmean(ws), median, env.device)
        if env.device == "cuda":
            s.add("feeds_cuda", dl.to_cuda, detail="a batch was moved to a CUDA device")
            s.add("non_blocking", dl.non_blocking)
    worker_startup(ctx)


def draw_sites(probes: Probes) -> dict[str, list[tuple[str, int]]]:
    """Per DataLoader subject key (its judged site, as `add` keys it), the user lines that drew an epoch's
    first batch from it: where the loops over it are, for the static read to judge what those loops do
    with its batches (`perfdoctor.facts.static.dataloader.drawn_moves`)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for dl in probes.dataloaders:
        site = dl.judged_site
        if site is not None and site.file and dl.draw_sites:
            out.setdefault(f"{site.file}:{site.line}", []).extend((d.file, d.line) for d in dl.draw_sites)
    return out


def _receipt(s: Subject, tensors: int, nbytes: int, per_step: float, measured: list[Receipt]) -> None:
    """A batch's tensors and bytes, and what receiving such batches from workers would cost the training
    process per step (`receipt_ms`, times the batches the loader delivered per training step): per batch
    as timed on the run's host right after the run for this shape (receipts.json, capture/receipt.py),
    else RECEIPT_* (measured on this kind of machine, not in this run)."""
    s.add("batch_tensors", tensors, "count", detail="tensors in one batch, the largest of the first batches")
    s.add("batch_bytes", nbytes, "bytes", detail="their bytes")
    mine = next((r for r in measured if r.tensors == tensors and r.bytes == nbytes
                 and math.isfinite(r.ms) and 0 <= r.ms < MAX_RECEIPT_MS), None)
    if mine is not None:
        load = f", load average {mine.load_avg:g}" if mine.load_avg is not None else ""
        s.add("receipt_ms", mine.ms * per_step, "ms",
              detail=f"{mine.ms:.2f} ms per batch x {per_step:.2f} batches per step; timed on this host after the run "
                     f"(one worker, {mine.batches or 0} batches of this shape{load}: capture/receipt.py)")
        return
    mb = nbytes / 2**20
    one = RECEIPT_BASE_MS + RECEIPT_PER_TENSOR_MS * tensors + RECEIPT_PER_MB_MS * mb
    s.add("receipt_ms", one * per_step, "ms",
          detail=f"({RECEIPT_BASE_MS:g} + {RECEIPT_PER_TENSOR_MS:g} x {tensors} tensors + {RECEIPT_PER_MB_MS:g} x "
                 f"{mb:.2f} MB) per batch x {per_step:.2f} batches per step; {RECEIPT_BASIS}")


def project_to_gpu(facts: Facts, s: Subject, load: float, step: float, device: str | None,
                   basis: str = "mean wait in DataLoader __next__ with num_workers=0 over the steady steps") -> None:
    """A loader with num_workers=0 (or a batch source of the user's on the training thread,
    `facts.static.batch_source`): the loop's wait for it is the cost of loading the batch (`load_ms`,
    the mean: every step pays it; `basis` says how it was measured). On a CPU run, what a GPU would
    see: the step's compute (the step less that loading) divided by GPU_SPEEDUP (`step.gpu_compute_ms`),
    the GPU step PD002 projects the loading onto where the run recorded no trace to estimate it from
    (target_gpu.step_ms, facts/trace/target_gpu.py)."""
    s.add("load_ms", load, "ms", detail=basis)
    if device != "cpu":
        return
    gpu = max(0.0, step - load) / GPU_SPEEDUP
    facts.add("step.gpu_speedup", GPU_SPEEDUP, "number", detail=GPU_SPEEDUP_BASIS)
    facts.add("step.gpu_compute_ms", gpu, "ms",
              detail=f"(median step {step:.1f} ms - data loading {load:.1f} ms) on this CPU / {GPU_SPEEDUP:g}, "
                     f"{GPU_SPEEDUP_BASIS}")


def _refill_ms(ctx: RunContext, dl: DataLoaderRecord) -> tuple[float, str] | None:
    """What the first batch of a pass waits for even with persistent workers (PD015's fix keeps the
    processes, not the batches: at a pass's start every worker loads its first batch of the new pass at
    once while the training loop waits). One worker's time on a CPU for one batch, estimated as the
    workers' time on a CPU over the steady steps per batch this loader delivered in them (over whole steps,
    not the steps between passes only: the workers may have loaded a short pass's batches ahead, in its
    first step), x workers / CPUs where more workers than CPUs share them. Only for a loader that delivers
    on most training steps (the one the steps draw from: the workers busy then are its own); None
    otherwise (an evaluation loader's workers are not busy on the training steps), or without the
    workers' CPU times. Loading that waits on storage rather than a CPU is not in it; a new worker's own
    start (its `worker_init_fn`'s CPU time) is."""
    w, per_step, batches = ctx.probes.cpu_wait, dl.wait_ms_per_step, dl.batches or 0
    if w is None or not w.workers_run_ms or not per_step or not ctx.run_steps or batches <= 0:
        return None
    steps = [int(x["i"]) for x in ctx.steady if 0 < int(x["i"]) <= min(len(per_step), len(w.workers_run_ms))]
    delivered = [i for i in steps if per_step[i - 1] > 0]
    if len(delivered) < max(3, 0.8 * len(steps)):
        return None
    per_batch = max(1.0, batches / len(ctx.run_steps))  # this loader's batches per training step
    one = sum(w.workers_run_ms[i - 1] for i in steps) / (len(steps) * per_batch)
    cpus = (ctx.rank.cpu_share if ctx.rank is not None and ctx.rank.cpu_share else None) or ctx.env.cpu_count or 1
    workers = dl.kwargs.num_workers or 1
    share = max(1.0, workers / cpus)
    return one * share, (f"the workers' time on a CPU over {len(steps)} steady steps per batch ({per_batch:.2g} a "
                         f"step), {one:.1f} ms, x {share:.2g} ({workers} workers loading at once on {cpus} CPUs): "
                         "one worker's time for a pass's first batch")


def _own_at_starts(dl: DataLoaderRecord, walls: dict[int, float]) -> dict[int, float]:
    """A loader's own time in each steady step where a pass over it began (the call that ended its last
    pass, `iter()` and the workers' start, the first batch), beyond its wait on its other steady steps.
    Its first pass too: an evaluation loader's first pass, after some training steps, is its own time in
    the step where the training loader's next epoch starts (seqlabel-lmlstmcrf, development half: without
    it the training loader took the whole evaluation as its restart)."""
    starts = set(dl.first_batch_step)
    waits = dl.wait_ms_per_step
    steady = [waits[i - 1] for i in walls if i not in starts and 0 < i <= len(waits)]
    wait0 = statistics.median(steady) if steady else 0.0
    return {i: max(0.0, waits[i - 1] - wait0) for i in starts if i in walls and i <= len(waits)}


def _left_passes(dl: DataLoaderRecord) -> set[int]:
    """The passes (their index) that delivered fewer batches than the loader's length before the next pass
    began: left early, not run to the end. Empty where the run did not count a pass's batches."""
    idx = dl.first_batch_index
    if not dl.length or len(idx) != len(dl.first_batch_step):
        return set()
    return {k for k, (a, b) in enumerate(zip(idx, idx[1:])) if b - a < dl.length}


def _whole_passes(dl: DataLoaderRecord, walls: dict[int, float]) -> set[int]:
    """The steady steps a pass over the loader began in, where it delivers batches on no steady step
    where none of its passes begins: each pass is run whole inside one step, between two training steps
    (an evaluation loader's), not drawn by the training steps. Empty for a loader the steps draw from."""
    waits, starts = dl.wait_ms_per_step, set(dl.first_batch_step)
    if any(waits[j - 1] > 0 for j in walls if j not in starts and 0 < j <= len(waits)):
        return set()
    return {i for i in starts if 0 < i <= len(waits)}


def worker_startup(ctx: RunContext) -> None:
    """PD015: what a DataLoader's epoch start costs beyond a steady step, and that cost per step.

    Measured on the step each epoch's first batch arrived in: its time less the median of the other
    steady steps. That holds the wait for the new workers (`iter()` and the first batch) and what
    starting them costs the training process besides (the last epoch's workers shut down, copy-on-write
    page faults after the fork, which slow the step's forward and backward: srresnet, development half).
    Where other loaders start a pass in the same step (a test loader's evaluation between two training
    epochs), the step's extra time is shared by each loader's own time in it (`_own_at_starts`); an
    evaluation's compute is no restart's cost: where a loader runs a whole pass inside the step (an
    evaluation loader's, `_whole_passes`), each loader's start-up there is its own time in the step (a
    lower bound: the fork's page faults in the forward are left out). The first epoch pays it whatever the settings: the later ones are what persistent workers
    save. Where no epoch start is a steady step, the time to the first batch less the steady wait stands
    in (the wait alone)."""
    walls = {x["i"]: x["wall_ms"] for x in ctx.steady}
    owns = {id(dl): _own_at_starts(dl, walls) for dl in ctx.probes.dataloaders}
    evaluated = set().union(*(_whole_passes(dl, walls) for dl in ctx.probes.dataloaders))  # steps holding an evaluation
    for dl in ctx.probes.dataloaders:
        s = site_subject(ctx.facts, "dataloader", dl.judged_site)
        if s is None:
            continue
        s.add("constructed", dl.constructed, "count")
        first = dl.first_batch_ms
        s.add("epochs", len(first), "count")
        s.add("batches_per_epoch", dl.length, "count")
        if len(first) < 2 or not dl.length or not walls:
            continue
        starts = set(dl.first_batch_step[1:])
        others = [w for i, w in walls.items() if i not in starts]
        on = [i for i in dl.first_batch_step[1:] if i in walls]
        if on and others:
            base = statistics.median(others)
            # a step where several loaders start a pass (a test loader's beside the train loader's next) has
            # their restarts together: each loader takes the step's extra time in the share of its own time
            extra = []
            for i in on:
                if i in evaluated:
                    # a loader ran a whole pass in this step (an evaluation): the step's extra time holds its
                    # batches and the model's work on them; each loader's own wait is its restart
                    extra.append(owns[id(dl)].get(i, 0.0))
                    continue
                total = sum(o.get(i, 0.0) for o in owns.values())
                share = owns[id(dl)].get(i, 0.0) / total if total > 0 else 1.0
                extra.append(max(0.0, walls[i] - base) * share)
            startup = statistics.median(extra)
            detail = (f"median over {len(on)} steady epoch-start steps of their time less the other steady steps' "
                      f"median ({base:.1f} ms), shared with any other loader starting a pass in the same step "
                      "by each one's own time in it")
        else:
            waits = [dl.wait_ms_per_step[i - 1] for i in walls if 0 < i <= len(dl.wait_ms_per_step)]
            if not waits:
                continue
            extra = [max(0.0, x - statistics.median(waits)) for x in first[1:]]
            startup = statistics.median(extra)
            detail = f"median time to the first batch of epochs 2..{len(first)} less the median steady wait"
        s.add("startup_ms", startup, "ms", detail=detail, per_step=tuple(extra))
        refill = _refill_ms(ctx, dl)
        if refill is not None:
            s.add("refill_ms", refill[0], "ms", detail=refill[1])
        # per training step of the run, not per batch of this loader: an evaluation loader of 10 batches
        # restarted once per 1000-step epoch costs a training step startup_ms / 1000, not / 10. A pass is
        # the training steps between two passes' first batches (the last pass of a run cut short is only
        # partly watched: the run's steps over its passes would make passes too short and each restart
        # dearer); where those steps are not known, the run's steps over its passes
        # A pass left short of the loader's length (`next(iter(loader))` to peek at a batch, a `break`) is not
        # the cadence of the restarts: the steps after it say nothing of how often a pass starts
        firsts, left = dl.first_batch_step, _left_passes(dl)
        gaps = ([b - a for k, (a, b) in enumerate(zip(firsts, firsts[1:])) if b > a and k not in left]
                if len(firsts) == len(first) else [])
        steps = len(ctx.run_steps)
        if gaps:
            per_pass = statistics.median(gaps)
            s.add("steps_per_pass", per_pass, "count",
                  detail=f"median training steps between the first batches of {len(firsts)} passes over this loader"
                  + (f" (less {len(left)} left short of its {dl.length} batches)" if left else ""))
            s.add("startup_ms_per_step", startup / per_pass, "ms", detail="startup_ms, once every steps_per_pass training steps")
        elif left and dl.length and dl.batches and steps:
            per_pass = max(1.0, dl.length * steps / dl.batches)
            s.add("steps_per_pass", per_pass, "count",
                  detail=f"no watched pass ran to its end before the next ({len(left)} left short of its {dl.length} "
                  f"batches): a pass is its {dl.length} batches at the run's {dl.batches / steps:.2g} a training step")
            s.add("startup_ms_per_step", startup / per_pass, "ms", detail="startup_ms, once every steps_per_pass training steps")
        elif steps:
            s.add("steps_per_pass", steps / len(first), "count",
                  detail=f"{steps} training steps over {len(first)} passes over this loader")
            s.add("startup_ms_per_step", startup * (len(first) - 1) / steps, "ms",
                  detail=f"startup_ms x {len(first) - 1} restarts / {steps} training steps")
