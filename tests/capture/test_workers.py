"""py-spy on DataLoader workers: parsing its collapsed stacks, hot spots per worker function, and a
real run whose slow `__getitem__` runs only in worker processes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import msgspec
import pytest

from perfdoctor.capture.workers import find_py_spy, parse_collapsed
from perfdoctor.contracts.run import WorkerLine, Workers
from perfdoctor.facts.run.hotspots import worker_hotspots
from tests.helpers import run_cli

pytestmark = pytest.mark.e2e  # runs real training scripts under perfdoctor: minutes, not seconds

DATASET = textwrap.dedent("""\
    import math
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset


    class SlowDataset(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            s = 0.0
            for k in range(30000):
                s += math.sin(k * i)
            return torch.randn(32) + s * 0, i % 10


    def main():
        model = nn.Linear(32, 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(SlowDataset(), batch_size=16, num_workers=2)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


    if __name__ == "__main__":
        main()
""")


def test_parse_collapsed_keeps_the_innermost_user_frame(tmp_path: Path) -> None:
    user = str(tmp_path / "my data" / "ds.py")  # a space in the path
    raw = "\n".join([
        f"_worker_loop (/venv/torch/utils/data/_utils/worker.py:308);fetch (/venv/torch/fetch.py:52);"
        f"__getitem__ ({user}:12);transform ({user}:30);sin (/usr/lib/python3.11/math.py:1) 40",
        f"_worker_loop (/venv/torch/utils/data/_utils/worker.py:308);__getitem__ ({user}:13) 10",
        "_worker_loop (/venv/torch/utils/data/_utils/worker.py:308);get (/usr/lib/python3.11/queues.py:100) 5",
        # a forked worker's stack begins with the parent's training loop: that is not worker work
        f"main ({user}:80);_bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314);"
        f"_worker_loop (/venv/torch/utils/data/_utils/worker.py:308);put (/usr/lib/python3.11/queues.py:90) 7",
        "garbage line",
    ])
    out = parse_collapsed(raw, is_user=lambda f: f == user)
    assert out.samples == 62 and out.other_samples == 12
    assert out.lines == [WorkerLine(file=user, line=30, function="transform", samples=40),
                         WorkerLine(file=user, line=13, function="__getitem__", samples=10)]


def test_worker_hotspots_group_lines_by_function(tmp_path: Path) -> None:
    src = tmp_path / "ds.py"
    src.write_text("class D:\n    def __getitem__(self, i):\n        a = slow(i)\n        b = fast(i)\n        return a + b\n")
    workers = msgspec.convert({"rate_hz": 200, "steps": 10, "samples": 100, "other_samples": 20,
                               "lines": [{"file": str(src), "line": 3, "function": "D.__getitem__", "samples": 60},
                                         {"file": str(src), "line": 4, "function": "D.__getitem__", "samples": 20}]},
                              Workers)
    (h,) = worker_hotspots(workers)
    assert h.process == "dataloader-workers" and h.function == "D.__getitem__" and h.line == 2
    assert h.ms_per_step == pytest.approx(80 * 5.0 / 10)  # 80 samples of 5 ms over 10 steps
    assert [(l.line, l.share) for l in h.lines] == [(3, 0.75), (4, 0.25)]
    assert h.lines[0].code == "a = slow(i)"
    assert worker_hotspots(None) == [] and worker_hotspots(msgspec.structs.replace(workers, samples=0)) == []


def test_comprehension_frames_count_for_the_function_around_them(tmp_path: Path) -> None:
    src = tmp_path / "text.py"
    src.write_text("def collate(batch):\n    ids = [[t for t in s] for s in batch]\n    return ids\n")
    workers = msgspec.convert({"rate_hz": 100, "steps": 4, "samples": 50, "other_samples": 0,
                               "lines": [{"file": str(src), "line": 2, "function": "collate.<locals>.<listcomp>.<listcomp>",
                                          "samples": 30},
                                         {"file": str(src), "line": 2, "function": "collate.<locals>.<listcomp>",
                                          "samples": 10},
                                         {"file": str(src), "line": 3, "function": "collate", "samples": 10}]},
                              Workers)
    (h,) = worker_hotspots(workers)
    assert (h.function, h.line) == ("collate", 1) and h.ms_per_step == pytest.approx(50 * 10.0 / 4)
    assert [(l.line, l.share) for l in h.lines] == [(2, 0.8), (3, 0.2)]


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_run_finds_the_slow_getitem_in_the_workers(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(DATASET)
    p = run_cli("run", "train.py", "--steps", "30", "--format", "json", "--out-dir", "run", cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    workers = json.loads((tmp_path / "run" / "hotspots.json").read_text())["workers"]
    if workers.get("error") and not workers.get("samples"):
        if any(w in workers["error"] for w in ("ermission", "not permitted", "ptrace")):
            pytest.skip(f"py-spy may not attach here: {workers['error']}")
    assert len(workers["pids"]) == 2 and workers["samples"] >= 10, workers
    report = json.loads(p.stdout)
    hot = [h for h in report["hotspots"] if h["process"] == "dataloader-workers"]
    assert hot and hot[0]["function"].endswith("__getitem__") and hot[0]["file"].endswith("train.py"), hot
    assert hot[0]["line"] == 11 and {l["line"] for l in hot[0]["lines"]} <= {12, 13, 14, 15}
    assert all(h["function"] != "main" for h in hot)  # the parent's frames above a forked worker's loop
    assert not (tmp_path / "run" / "py-spy").exists()  # its scratch files are gone
