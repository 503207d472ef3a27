"""The host-read probe and the step clock's attribution, on real scripts under `perfdoctor run`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from perfdoctor.capture import run_script
from perfdoctor.facts.run import load_run

pytestmark = pytest.mark.e2e  # runs real training scripts under perfdoctor

SMALL = (1, 1, 2)

READS = """
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
device = "cuda" if torch.cuda.is_available() else "cpu"

class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 64 * 40
    def __getitem__(self, i):
        k = torch.randint(0, 3, (1,)).item()  # dataset code: CPU work, not a host read of the step
        return torch.randn(16) * k, torch.tensor(float(i % 2))

def accuracy(out, y):
    return float(((out.squeeze(1) > 0.5) == (y > 0.5)).sum()) / len(y)  # a metrics helper reads

model = nn.Linear(16, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Noisy(), batch_size=64)
total, seen = 0.0, []
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = ((model(x).squeeze(1) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss.item()
    acc = accuracy(model(x), y)
    seen.append(model.weight.detach().cpu().numpy().sum())
    if bool(loss > 100):
        break
    if step % 10 == 0:
        print(f"step {step} loss {loss}")
print("total", round(total, 3))
"""

CLOSURE = """
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
x, y = torch.randn(8192, 64), torch.randn(8192, 1)  # a large batch: the closures dominate the step
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4, history_size=2)
for step in range(30):
    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss
    opt.step(closure)
"""


def _write(d: Path, src: str) -> Path:
    p = d / "train.py"
    p.write_text(textwrap.dedent(src).lstrip())
    return p


def _line(p: Path, text: str) -> int:
    return next(i for i, l in enumerate(p.read_text().splitlines(), 1) if text in l)


def item_locations(data, line):
    return [loc.line for s in data.facts.of_kind("host_read") if s.locations[0].line == line for loc in s.locations]


def test_host_reads_counted_per_step_at_the_users_line(tmp_path):
    script = _write(tmp_path, READS)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert r.exit_code == 0
    probes = json.loads((r.run_dir / "probes.json").read_text())
    lines = {(h["site"]["line"], h["kind"]) for h in probes["host_reads"]}
    assert (_line(script, "total += loss.item()"), "item") in lines
    assert (_line(script, "seen.append"), "cpu") in lines and (_line(script, "seen.append"), "numpy") in lines
    assert (_line(script, "if bool(loss > 100)"), "bool") in lines
    assert (_line(script, 'print(f"step'), "print") in lines
    assert not any(ln == _line(script, "torch.randint") for ln, _ in lines)  # the dataset's own reads
    data = load_run(r.run_dir)
    subj = {s.locations[0].line: s.facts for s in data.facts.of_kind("host_read")}
    item = subj[_line(script, "total += loss.item()")]
    assert item["host_read.kind"].value == "item" and item["host_read.count_per_step"].value == pytest.approx(1.0)
    both = subj[_line(script, "seen.append")]  # .cpu().numpy(): one value read once per step
    assert both["host_read.count_per_step"].value == pytest.approx(1.0)
    # the helper's read, and the training loop's line that called it (where a fix would go)
    helper = next(s for s in data.facts.of_kind("host_read") if s.locations[0].line == _line(script, "return float("))
    assert [loc.line for loc in helper.locations] == [_line(script, "return float("), _line(script, "acc = accuracy(")]
    assert item_locations(data, _line(script, "total += loss.item()")) == [_line(script, "total += loss.item()")]
    printed = subj[_line(script, 'print(f"step')]
    assert printed["host_read.kind"].value == "print" and printed["host_read.count_per_step"].value < 0.2


def test_closure_time_is_forward_and_backward_not_optimizer(tmp_path):
    script = _write(tmp_path, CLOSURE)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert r.exit_code == 0
    steps = json.loads((r.run_dir / "steps.json").read_text())["steps"]
    assert len(steps) == 30
    late = steps[10:]
    fwd_bwd = sum(s["forward_ms"] + s["backward_ms"] for s in late)
    opt = sum(s["optimizer_ms"] for s in late)
    wall = sum(s["wall_ms"] for s in late)
    # LBFGS runs up to 4 closures (forward + backward on 8192 rows) inside each optimizer step: that
    # time is forward and backward; the optimizer keeps only its own work (the step counted it all)
    assert fwd_bwd + opt <= wall * 1.01
    assert fwd_bwd > 2 * opt and fwd_bwd > 0.5 * wall
    parts = {b.category: b.fraction for b in load_run(r.run_dir).summary.breakdown}
    assert parts["forward"] + parts["backward"] > 2 * parts["optimizer"]


PREFETCH = """
import queue, threading, time
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 16 * 60
    def __getitem__(self, i):
        time.sleep(0.0005)  # the prefetching thread is inside a batch's fetch most of the time
        return torch.randn(16), torch.tensor(float(i % 2))

batches = queue.Queue(maxsize=2)

def prefetch():
    for b in torch.utils.data.DataLoader(Slow(), batch_size=16):
        batches.put(b)
    batches.put(None)

threading.Thread(target=prefetch, daemon=True).start()
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0.0
while (b := batches.get()) is not None:
    x, y = b
    loss = ((model(x).squeeze(1) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss.item()
print("total", round(total, 3))
"""


def test_a_prefetching_threads_fetch_hides_none_of_the_main_threads_reads_or_forwards(tmp_path):
    """Reads and forwards inside a batch's fetch are data loading, not the step's; but only the training
    thread's own fetch: a thread that prefetches batches fetches while the training thread reads
    `loss.item()` and calls the model, and those still count, every step."""
    script = _write(tmp_path, PREFETCH)
    r = run_script(str(script), out_dir=tmp_path / "run", window=SMALL)
    assert r.exit_code == 0
    probes = json.loads((r.run_dir / "probes.json").read_text())
    steps = json.loads((r.run_dir / "steps.json").read_text())["steps"]
    item = next(h for h in probes["host_reads"] if h["site"]["line"] == _line(script, "total += loss.item()"))
    assert len(steps) == 60 and item["counts_per_step"][5:55] == [1] * 50
    assert [f["calls"] for f in probes["forward"]] == [60]
