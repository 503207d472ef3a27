"""A steady, small CPU training loop for the gate reliability benchmark.

PERFDOCTOR_BENCH_DELAY_FRACTION=0.15 makes every step 15% slower: after the real work of a step
it sleeps that fraction of the step's measured time. PERFDOCTOR_BENCH_WORK_FRACTION=0.15 adds 15% of
CPU work instead: after the real work it computes (small matrix products) until its thread has
spent that fraction more of the step's CPU time, so the extra is work, not waiting, on a loaded host too. PERFDOCTOR_BENCH_STEPS sets the number of
steps (default 200; `perfdoctor run --steps N` stops it earlier). PERFDOCTOR_BENCH_OUT=path writes
the per-step wall times (ms) as JSON, for runs made without perfdoctor.
"""

import json
import os
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
delay = float(os.environ.get("PERFDOCTOR_BENCH_DELAY_FRACTION", "0") or 0)
work = float(os.environ.get("PERFDOCTOR_BENCH_WORK_FRACTION", "0") or 0)
steps = int(os.environ.get("PERFDOCTOR_BENCH_STEPS", "200"))
out = os.environ.get("PERFDOCTOR_BENCH_OUT")

model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(1024, 256)
y = torch.randint(0, 10, (1024,))
loss_fn = nn.CrossEntropyLoss()
a = torch.randn(64, 64)

times = []
for _ in range(steps):
    t0, c0 = time.perf_counter(), time.thread_time()
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if work:  # the slowdown: more CPU work, a fraction of the CPU time this step just took
        until = time.thread_time() + work * (time.thread_time() - c0)
        while time.thread_time() < until:
            a = torch.tanh(a @ a)
    if delay:  # the slowdown: sleep a fraction of the work this step just did
        time.sleep(delay * (time.perf_counter() - t0))
    times.append((time.perf_counter() - t0) * 1000)

if out:
    with open(out, "w") as f:
        json.dump({"step_ms": times, "delay_fraction": delay}, f)
