"""What a batch from a DataLoader worker costs the training process to receive, measured on this host
right after the run (PD002's receipt: `perfdoctor.facts.run.dataloader`).

A run with `num_workers=0`, where PD002 fires, never pays the receipt (the result out of the worker's
queue, unpickled, each tensor's storage rebuilt from shared memory, its pages mapped when the step
reads it), so the run cannot show it. A constant measured once on one machine is wrong on another, and
on the same machine under another load: on this project's 2-core VM the receipt of a batch of two small
tensors measured 1.1 ms one evening and 4-5 ms the next morning, when the VM's steps ran 2.5 times
slower. So after a run whose loaders loaded in the training process, the parent starts this module in
a process of its own (torch only there, never in the parent: docs/ARCHITECTURE.md) and times batches
of the shapes the run saw (their tensors and bytes, capture/probes/dataloader.py), made by one worker
that is always ahead, as `benchmarks/loader_receipt.py` does: the receipt is the median `__next__`
plus the first read of the batch (`sum()`, the shared pages mapped), less the read of the same batch
made in-process. The user's program is not touched: the measurement starts after it ended, in
perfdoctor's own process, and writes `receipts.json` into the run folder.

`main(["TENSORS", "BYTES", ...])` prints the receipts as JSON (the parent runs it with `python -c`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from perfdoctor.capture.writer import write
from perfdoctor.contracts.run import SCHEMA, Probes, Receipt, Receipts, read
from perfdoctor.errors import InputError

ITEMS = 8  # items per synthetic batch
BATCHES = 40  # batches timed per shape and way (the first 2 x workers + 2 left out)
COMPUTE_MS = 8.0  # the training process's spin between batches: the worker is always ahead
MAX_SHAPES = 4  # distinct batch shapes measured per run (a run's loaders mostly share one)
TIMEOUT_S = 90.0  # the measurement's process, torch's import included; past it the run keeps the model's estimate
RECEIPTS = "receipts.json"


def shapes_to_measure(probes: Probes) -> list[tuple[int, int]]:
    """The batch shapes (tensors, bytes) of the loaders that loaded in the training process and
    delivered batches: those PD002 judges with a receipt (a loader with workers already pays it)."""
    out: list[tuple[int, int]] = []
    for dl in probes.dataloaders:
        if dl.kwargs.num_workers or not dl.batches or not dl.batch_tensors or dl.batch_bytes is None:
            continue
        shape = (dl.batch_tensors, dl.batch_bytes)
        if shape not in out:
            out.append(shape)
    return out[:MAX_SHAPES]


def measure_after_run(run_dirs: list[Path]) -> None:
    """Measure the receipt of the batch shapes the runs in `run_dirs` saw (a job's ranks share a host:
    one measurement) and write it into each as receipts.json. Nothing is written where none loaded in
    the training process, or where the measurement failed or ran out of time (the rule then keeps
    its estimate, and says so)."""
    loaders = []
    for d in run_dirs:
        try:
            probes = read(d / "probes.json", Probes)
        except InputError:  # a run file the child could not finish: the analysis reports it
            continue
        loaders += probes.dataloaders if probes is not None else []
    shapes = shapes_to_measure(Probes(dataloaders=loaders))
    if not shapes:
        return
    cmd = [sys.executable, "-c", "import sys; from perfdoctor.capture.receipt import main; sys.exit(main(sys.argv[1:]))",
           *(str(v) for s in shapes for v in s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        # in the run folder, perfdoctor's own (`python -c` puts its working folder first on sys.path: a
        # user's torch.py or statistics.py beside their script must not be what it imports)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                           cwd=next(d for d in run_dirs if d.is_dir()),
                           stdin=subprocess.DEVNULL)
        doc = Receipts(schema=SCHEMA, receipts=[Receipt(**r) for r in json.loads(p.stdout)]) if p.returncode == 0 else None
    # Ctrl-C while it ran (subprocess.run killed it) ends only the timing: the run's analysis still follows
    except (subprocess.TimeoutExpired, OSError, ValueError, TypeError, KeyboardInterrupt):
        doc = None
    if doc is None:
        return
    for d in run_dirs:
        if d.is_dir():
            write(d / RECEIPTS, doc)


def per_batch_ms(tensors: int, nbytes: int, workers: int, batches: int = BATCHES,
                 compute_ms: float = COMPUTE_MS) -> tuple[float, float, float]:
    """Batches of `tensors` float tensors, `nbytes` in all, ITEMS items each from a map-style dataset
    whose `workers` (0: the training process) do next to nothing but collate them, the training thread
    spinning `compute_ms` between batches so that the workers are always ahead: the medians of
    `__next__` and of reading and dropping the batch (ms, wall), and of both on the training thread's
    CPU clock, the first `2 x workers + 2` batches left out. torch is imported here: only in the
    measurement's own process (and benchmarks/loader_receipt.py)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):
        def __init__(self, n: int):
            self.n = n
            self.numel = max(1, nbytes // 4 // tensors // ITEMS)

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> tuple:
            return tuple(torch.zeros(self.numel) for _ in range(tensors))

    loader = DataLoader(Synthetic(batches * ITEMS), batch_size=ITEMS, num_workers=workers)
    take, use, cpu = [], [], []
    it = iter(loader)
    for _ in range(batches):
        end = time.perf_counter() + compute_ms / 1e3
        while time.perf_counter() < end:
            pass
        c0, t0 = time.thread_time(), time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        for x in batch:
            x.sum()
        del batch
        t2, c2 = time.perf_counter(), time.thread_time()
        take.append((t1 - t0) * 1e3)
        use.append((t2 - t1) * 1e3)
        cpu.append((c2 - c0) * 1e3)
    del it
    skip = _warm_up(workers)
    return statistics.median(take[skip:]), statistics.median(use[skip:]), statistics.median(cpu[skip:])


def _warm_up(workers: int) -> int:
    """The first batches `per_batch_ms` leaves out: each worker's first two, and two more."""
    return 2 * workers + 2


def _measure(tensors: int, nbytes: int) -> dict[str, float | int]:
    """One shape's receipt (ms per batch): `__next__` and the first read with one worker, less the read
    of a batch made in-process; the medians, and the load average beside them."""
    import torch

    torch.set_num_threads(1)
    take, read_ms, _ = per_batch_ms(tensors, nbytes, 1)
    _, inproc, _ = per_batch_ms(tensors, nbytes, 0)
    return {"tensors": tensors, "bytes": nbytes, "ms": round(max(0.0, take + read_ms - inproc), 4),
            "take_ms": round(take, 4), "read_ms": round(read_ms, 4), "inproc_read_ms": round(inproc, 4),
            "batches": BATCHES - _warm_up(1), "load_avg": round(os.getloadavg()[0], 2)}


def main(argv: list[str]) -> int:
    values = [int(v) for v in argv]
    if not values or len(values) % 2:
        print("usage: TENSORS BYTES [TENSORS BYTES ...]", file=sys.stderr)
        return 2
    pairs = list(zip(values[::2], values[1::2]))
    print(json.dumps([_measure(t, b) for t, b in pairs]))
    return 0
