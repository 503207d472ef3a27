"""What a batch costs the training process when a DataLoader worker made it (PD002's receipt cost).

    python benchmarks/loader_receipt.py [--workers 1 2] [--batches 120] [--compute-ms 8] [--json PATH]
    python benchmarks/loader_receipt.py --train [--pairs 3] [--batch-size 64]   # the receipt in a training loop

With `num_workers=0` the training process pays the whole loading of a batch; with workers it still pays
its receipt: the result's bytes out of the worker's queue (a pipe), the unpickling, and for every tensor
its storage rebuilt from shared memory (with the default `file_descriptor` sharing strategy, one
descriptor fetched from the worker per storage: a round trip to the worker's resource-sharer thread),
then the pages touched. None of it shows in a run with `num_workers=0`, which is where PD002 fires, so
the rule estimates it from the batch the run saw (its tensors and bytes,
`perfdoctor/capture/probes/dataloader.py`) with the costs this benchmark measures, where `perfdoctor run`
could not time batches of the run's own shape on its host after the run (`perfdoctor/capture/receipt.py`,
whose `per_batch_ms` this benchmark uses: one measurement for both).

For each batch shape (tensors per batch x bytes per batch), synthetic batches of ITEMS items each come
from a map-style dataset whose worker does next to nothing but collate them (into shared memory, as every
worker does), and the training process spins `--compute-ms` between batches, so that the workers are
always ahead and never make it wait for a batch that is not ready. Per batch the training process takes
it (`__next__`), reads every tensor once (`sum()`: what its compute does, page faults on the shared
memory included) and drops it (the storages unmapped). The receipt is the median of that with workers,
less the median reading and dropping of the same batch made in the training process (`num_workers=0`,
whose `__next__` is the loading the workers take over). Then a least-squares fit of the worker rows:
ms per batch = base + per_tensor x tensors + per_mb x MB. The load average is printed beside every row:
on a shared 2-core machine the receipt waits for the worker's threads to be scheduled.

`--train` checks the model where it matters, in a training loop: a small CNN on MNIST-shaped items
(28 x 28 bytes, converted and normalised per item as torchvision's ToTensor and Normalize do), batches of
`--batch-size`, `num_workers=0` and `num_workers=2` (persistent) alternated `--pairs` times, each run's
mean step after 10 warm-up steps, the median time in `__next__` and the median compute per step. Where
the workers keep up, PD002's model says the step falls by the time in `__next__` with 0 workers less the
receipt, and that the time in `__next__` with workers is the receipt; the compute's change is what the
workers took from the training thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from perfdoctor.capture.receipt import per_batch_ms

SHAPES = [(2, 16 << 10), (2, 200 << 10), (2, 1 << 20), (2, 4 << 20), (4, 200 << 10), (8, 200 << 10),
          (16, 200 << 10), (16, 1 << 20)]


class MnistLike(Dataset):
    """28 x 28 bytes per item, made a normalised float tensor per item (ToTensor + Normalize's work)."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple:
        return self.x[i].float().div(255).sub(0.1307).div(0.3081).unsqueeze(0), int(self.y[i])


def train_run(workers: int, batch_size: int, steps: int = 70) -> dict:
    """One training run: mean step after 10 warm-up steps, median __next__ and median compute (ms)."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(MnistLike(batch_size * (steps + 5)), batch_size=batch_size, shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0)
    it = iter(loader)
    take, compute, step = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        take.append((t1 - t0) * 1e3)
        compute.append((t2 - t1) * 1e3)
        step.append((t2 - t0) * 1e3)
    del it
    return {"workers": workers, "step_ms": round(statistics.fmean(step[10:]), 3),
            "next_ms": round(statistics.median(take[10:]), 3), "compute_ms": round(statistics.median(compute[10:]), 3),
            "load": round(os.getloadavg()[0], 2)}


def train(pairs: int, batch_size: int) -> dict:
    """0 and 2 workers alternated: the saving, and the parts PD002's model names."""
    runs = [train_run(w, batch_size) for _ in range(pairs) for w in (0, 2)]
    for r in runs:
        print(json.dumps(r), flush=True)

    def mean(w: int, k: str) -> float:
        return statistics.fmean(r[k] for r in runs if r["workers"] == w)

    item = MnistLike(1)[0][0]
    nbytes = batch_size * (item.nelement() * item.element_size() + 8)
    out = {"batch_size": batch_size, "batch_bytes": nbytes, "saving_ms": mean(0, "step_ms") - mean(2, "step_ms"),
           "wait_0_ms": mean(0, "next_ms"), "wait_2_ms (the receipt, where the workers keep up)": mean(2, "next_ms"),
           "compute_change_ms": mean(2, "compute_ms") - mean(0, "compute_ms"), "runs": runs}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    return out


def fit(rows: list[dict], key: str = "receipt_ms") -> dict:
    """ms = base + per_tensor x tensors + per_mb x MB, least squares over the worker rows."""
    x = torch.tensor([[1.0, r["tensors"], r["bytes"] / 2**20] for r in rows], dtype=torch.float64)
    y = torch.tensor([[r[key]] for r in rows], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y).solution.flatten().tolist()
    pred = (x @ torch.tensor(coef, dtype=torch.float64)).tolist()
    resid = [abs(p - r[key]) for p, r in zip(pred, rows)]
    return {"base_ms": coef[0], "per_tensor_ms": coef[1], "per_mb_ms": coef[2], "max_abs_residual_ms": max(resid)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, default=120)
    ap.add_argument("--compute-ms", type=float, default=8.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--train", action="store_true", help="the receipt in a small training loop, 0 and 2 workers")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.train:
        got = train(args.pairs, args.batch_size)
        if args.json:
            args.json.write_text(json.dumps(got, indent=1))
        return 0
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, sharing strategy "
          f"{torch.multiprocessing.get_sharing_strategy()}, load {os.getloadavg()[0]:.2f}")
    rows = []
    for tensors, nbytes in SHAPES:
        load0, use0, _ = per_batch_ms(tensors, nbytes, 0, args.batches // 2, args.compute_ms)
        for w in args.workers:
            take, use, cpu = per_batch_ms(tensors, nbytes, w, args.batches, args.compute_ms)
            row = {"tensors": tensors, "bytes": nbytes, "workers": w, "receipt_ms": round(take + use - use0, 4),
                   "receipt_cpu_ms": round(cpu - use0, 4), "next_ms": round(take, 4), "use_ms": round(use, 4),
                   "zero_workers_next_ms": round(load0, 4), "zero_workers_use_ms": round(use0, 4),
                   "load": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"rows": rows, "fit": {w: fit([r for r in rows if r["workers"] == w]) for w in args.workers},
              "fit_all": fit(rows), "fit_all_cpu": fit(rows, "receipt_cpu_ms")}
    print(json.dumps(result["fit"], indent=1), "\nall:", json.dumps(result["fit_all"]),
          "\nall, the training thread's CPU:", json.dumps(result["fit_all_cpu"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
