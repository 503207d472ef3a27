"""What a batch from a DataLoader worker costs the training process to receive, measured on this host
right after the run (PD002's receipt: `perfdoctor.facts.run.dataloader`).

A run with `num_workers=0`, where PD002 fires, never pays the receipt (the result out of the worker's
queue, unpickled, each tensor's storage rebuilt from shared memory, its pages mapped when the step
reads it), so the run cannot show it. A constant measured once on one machine is wrong on another, and
on the same machine under another load: on this project's 2-core VM the receipt of a batch of two small
tensors measured 1.1 ms one evening and 4-5 ms the next morning, when the VM's steps ran 2.5 times
slower. So after a run whose loaders loaded in the training process, perfdoctor times batches of the
shapes the run saw (their tensors and bytes, capture/probes/dataloader.py), made by one worker that is
always ahead, as `benchmarks/loader_receipt.py` does: the receipt is the median `__next__` plus the
first read of the batch (`sum()`, the shared pages mapped), less the read of the same batch made
in-process. It writes `receipts.json` into the run folder. The user's program is not touched: the
timing starts after it ended, in a process of perfdoctor's own.

- A single-process run (`measure_in_child`): perfdoctor's child, once the script has ended and its run
  folder is written, forks a copy of itself that times the receipt (torch is imported there already:
  about 1 s a shape, where a fresh interpreter spends 3 s importing torch first) and waits for it; the
  copy cannot change the child's exit, and is killed past TIMEOUT_S.
- A distributed job (`measure_after_run`): its ranks may end apart, and a rank timing while another
  still trains would slow that one's steps; so the parent, once every rank has ended, starts this module
  in a fresh process (`python -c`, `main`) for the shapes of all its ranks, and writes the same
  receipts.json into each rank's folder.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from perfdoctor.capture.writer import write
from perfdoctor.contracts.run import SCHEMA, Probes, Receipt, Receipts, encode, read
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


def measure_in_child(run_dir: Path) -> None:
    """In perfdoctor's child of a single-process run, after the script ended and the run folder was
    written: a forked copy times the receipts of the shapes the run saw and writes receipts.json; this
    process waits for it (at most TIMEOUT_S, then kills it; Ctrl-C kills it too). Nothing of the copy's
    can reach the child's exit or the script's output: it ends by `os._exit`, its stdio not flushed."""
    shapes = _shapes([run_dir])
    if not shapes or not hasattr(os, "fork"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:  # no process to be had (EAGAIN, ENOMEM): PD002 keeps its estimate
        return
    if pid == 0:  # the copy: only this thread; signals as bare Python's, none reported to the parent
        code = 1
        try:
            quiet = os.open(os.devnull, os.O_WRONLY)  # a warning torch prints here is not the script's output
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            sys.stdout = sys.stderr = open(quiet, "w", closefd=False)  # noqa: SIM115 - ends with the copy
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _write([run_dir], Receipts(schema=SCHEMA, receipts=[_measure(t, b) for t, b in shapes]))
            code = 0
        finally:
            os._exit(code)
    end = time.monotonic() + TIMEOUT_S
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > end:
                raise TimeoutError
            time.sleep(0.02)
    except BaseException:  # noqa: BLE001 - past the time, or Ctrl-C: only the timing ends, the run stands
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass


def measure_after_run(run_dirs: list[Path]) -> None:
    """In perfdoctor's parent, after every rank of a job ended: measure the receipt of the batch
    shapes its ranks saw in a fresh process (one measurement: they share a host) and write it into
    each rank's folder as receipts.json. Nothing is written where none loaded in the training process,
    or where the measurement failed or ran out of time (the rule then keeps its estimate, and says so)."""
    shapes = _shapes(run_dirs)
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
        doc = Receipts(schema=SCHEMA, receipts=msgspec.json.decode(p.stdout, type=list[Receipt])) if p.returncode == 0 else None
    # Ctrl-C while it ran (subprocess.run killed it) ends only the timing: the run's analysis still follows
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyboardInterrupt):  # a DecodeError is a ValueError
        doc = None
    if doc is not None:
        _write(run_dirs, doc)


def _shapes(run_dirs: list[Path]) -> list[tuple[int, int]]:
    """The shapes to time: those of the runs' loaders that loaded in the training process."""
    loaders = []
    for d in run_dirs:
        try:
            probes = read(d / "probes.json", Probes)
        except InputError:  # a run file the child could not finish: the analysis reports it
            continue
        loaders += probes.dataloaders if probes is not None else []
    return shapes_to_measure(Probes(dataloaders=loaders))


def _write(run_dirs: list[Path], doc: Receipts) -> None:
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

    # forked workers whatever start method the script set (the dataset is local: spawn could not pickle
    # it); a worker that hangs (a lock a thread held at the fork) ends the timing, not the process
    fork = {"multiprocessing_context": "fork", "timeout": 30.0} if workers and "fork" in mp.get_all_start_methods() else {}
    loader = DataLoader(Synthetic(batches * ITEMS), batch_size=ITEMS, num_workers=workers, **fork)  # type: ignore[arg-type]
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


def _measure(tensors: int, nbytes: int) -> Receipt:
    """One shape's receipt (ms per batch): `__next__` and the first read with one worker, less the read
    of a batch made in-process; the medians, and the load average beside them."""
    import torch

    torch.set_num_threads(1)
    take, read_ms, _ = per_batch_ms(tensors, nbytes, 1)
    _, inproc, _ = per_batch_ms(tensors, nbytes, 0)
    return Receipt(tensors=tensors, bytes=nbytes, ms=round(max(0.0, take + read_ms - inproc), 4),
                   take_ms=round(take, 4), read_ms=round(read_ms, 4), inproc_read_ms=round(inproc, 4),
                   batches=BATCHES - _warm_up(1), load_avg=round(os.getloadavg()[0], 2))


def main(argv: list[str]) -> int:
    values = [int(v) for v in argv]
    if not values or len(values) % 2:
        print("usage: TENSORS BYTES [TENSORS BYTES ...]", file=sys.stderr)
        return 2
    pairs = list(zip(values[::2], values[1::2]))
    print(encode([_measure(t, b) for t, b in pairs]).decode())
    return 0
