"""perfdoctor's CUDA paths, run for real against a fake CUDA layer (tests/fake_cuda.py): the step
clock's memory per step and device, the batch probe, the machine facts, and the run folder's
facts and rules, so that none of it waits for a GPU machine to be exercised.

The capture runs in this process (the Recorder the child builds, installed, a training loop, the
run folder finalised and read back); a profiled GPU trace, where a test needs one, is written into
the run folder as torch.profiler would (`gpu_trace`)."""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perfdoctor.analysis import analyse_run  # noqa: E402
from perfdoctor.capture.env import base_env  # noqa: E402
from perfdoctor.capture.recorder import Recorder  # noqa: E402
from perfdoctor.contracts.run import SCHEMA, Meta  # noqa: E402
from perfdoctor.facts.run import load_run  # noqa: E402
from tests.fake_cuda import FORBIDDEN, GIB, STUBS  # noqa: E402
from tests.helpers import REPO  # noqa: E402

pytestmark = pytest.mark.slow  # torch in this process: run by CI, not in the fast tier

PKG = REPO / "perfdoctor"
MB = 1 << 20
NEVER = (10**6, 1, 1)  # a profiler window the tests never reach


# -- the fake is honest -------------------------------------------------------------------------------

def _is_cuda(n: ast.AST, aliases: set[str]) -> bool:
    """`torch.cuda`, `self.torch.cuda`, or a name the file bound to one of those."""
    if isinstance(n, ast.Attribute) and n.attr == "cuda":
        v = n.value
        return (isinstance(v, ast.Name) and v.id == "torch") or (isinstance(v, ast.Attribute) and v.attr == "torch")
    return (isinstance(n, ast.Name) and n.id in aliases) or (isinstance(n, ast.Attribute) and n.attr in aliases)


def cuda_uses() -> set[str]:
    """Every torch.cuda function perfdoctor's source names: `torch.cuda.X` (also through a name a
    file bound to torch.cuda), and `getattr`/`hasattr`/`replace` of torch.cuda with a literal name."""
    out: set[str] = set()
    for f in PKG.rglob("*.py"):
        tree = ast.parse(f.read_text())
        aliases: set[str] = set()
        for _ in range(2):  # an alias of an alias
            for n in ast.walk(tree):
                if isinstance(n, ast.Assign) and _is_cuda(n.value, aliases):
                    for t in n.targets:
                        if isinstance(t, (ast.Name, ast.Attribute)):
                            aliases.add(t.id if isinstance(t, ast.Name) else t.attr)
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _is_cuda(n.value, aliases):
                out.add(n.attr)
            elif (isinstance(n, ast.Call) and len(n.args) >= 2 and _is_cuda(n.args[0], aliases)
                  and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
                out.add(n.args[1].value)
    return {u for u in out if not isinstance(getattr(torch.cuda, u, None), type(torch))}  # submodules


def test_fake_stubs_exactly_the_cuda_calls_perfdoctor_makes():
    used = cuda_uses()
    assert used == set(STUBS), f"perfdoctor uses {sorted(used - set(STUBS))} the fake lacks, " \
                               f"the fake stubs {sorted(set(STUBS) - used)} perfdoctor does not use"
    assert not used & set(FORBIDDEN)


def test_forbidden_calls_fail(fake_cuda):
    with pytest.raises(AssertionError, match="never"):
        torch.cuda.synchronize()


# -- the capture, in process -------------------------------------------------------------------------

def capture(tmp_path: Path, loop, window=NEVER, name: str = "run") -> Path:
    """Run `loop()` under a Recorder as the child would; the run folder."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    script = tmp_path / "train.py"
    script.write_text("# the loop runs in the test\n")
    meta = Meta(schema=SCHEMA, script=str(script), argv=[str(script)], cwd=str(tmp_path), env=base_env())
    rec = Recorder(torch, run_dir, meta, window=window)
    rec.install()
    try:
        loop()
        rec.finalise("completed", 0)
    finally:
        rec.uninstall()
    return run_dir


def steps_of(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "steps.json").read_text())["steps"]


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "meta.json").read_text())


def train(n: int, device: str = "cuda", *, fake=None, step_alloc: int = 0, leak: int = 0, cuda_from: int = 0,
          loader=None, move=None):
    """A loop of `n` optimizer steps on a small model, its batches from `loader()` (built inside
    the capture, as a script builds its DataLoader) or random ones. Batches go to `device` from step
    `cuda_from` on (CUDA first touched there); `step_alloc` bytes are allocated and freed inside
    every step (activations), `leak` bytes more kept every step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []

    def loop():
        batches = loader() if loader is not None else ((torch.randn(4, 8), torch.randn(4, 1)) for _ in range(n))
        for i, (x, y) in enumerate(batches):
            if i >= n:
                break
            if i >= cuda_from and device.startswith("cuda"):
                x = move(x) if move is not None else x.to(device)
                if fake is not None and step_alloc:
                    d = x.device.index
                    fake.alloc(d, step_alloc)
                    fake.alloc(d, -step_alloc)
                if fake is not None and leak:
                    fake.alloc(x.device.index, leak)
                kept.append(x)  # the script keeps its device tensors alive, as a model's would be
            loss = torch.nn.functional.mse_loss(model(x.as_subclass(torch.Tensor)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    return loop


# -- 1: one memory series, one meaning, the whole run ------------------------------------------------

def test_memory_series_keeps_its_meaning_past_the_batch_probe(tmp_path, fake_cuda):
    fake_cuda.alloc(0, 100 * MB)  # the model's weights: constant
    run_dir = capture(tmp_path, train(40, fake=fake_cuda, step_alloc=50 * MB))
    steps = steps_of(run_dir)
    assert len(steps) == 40
    mems = [s["cuda_mem"] for s in steps]
    assert all(m and [c["device"] for c in m] == [0] for m in mems)
    alloc = [m[0]["allocated"] for m in mems]
    assert max(alloc) - min(alloc) < MB  # constant from step 1 to 40: no switch at step 30
    assert all(m[0]["peak"] >= alloc[i] + 50 * MB for i, m in enumerate(mems))  # peak inside the step
    assert all(s["mem_bytes"] > 10 * MB for s in steps)  # the RSS, always, under its own name
    assert "synchronize" not in fake_cuda.names()
    assert fake_cuda.names().count("reset_peak_memory_stats") >= 40  # a reset per step

    facts = load_run(run_dir).facts
    assert "memory.growth_bytes_per_step" not in facts and "memory.steps_to_oom" not in facts
    peak = facts.get("memory.peak_bytes")
    assert 150 * MB <= peak.value < 152 * MB and "cuda:0" in peak.detail and "steps 1..40" in peak.detail
    assert facts.value("memory.total_bytes") == 80 * GIB


def test_growth_on_the_device_is_found_with_its_steps(tmp_path, fake_cuda):
    fake_cuda.alloc(0, 100 * MB)
    run_dir = capture(tmp_path, train(40, fake=fake_cuda, leak=4 * MB))
    facts = load_run(run_dir).facts
    g = facts.get("memory.growth_bytes_per_step")
    assert g is not None and 3.9 * MB < g.value < 4.2 * MB and "cuda:0" in g.detail
    free = meta_of(run_dir)["env"]["devices"][0]["free_memory_bytes"]
    assert facts.value("memory.steps_to_oom") == int(free / g.value)


def test_user_peak_readings_are_not_cut_by_the_per_step_reset(tmp_path, fake_cuda):
    seen = {}

    def loop():
        torch.cuda.reset_peak_memory_stats(0)
        train(6, fake=fake_cuda)()
        fake_cuda.alloc(0, 300 * MB)
        fake_cuda.alloc(0, -300 * MB)
        train(6, fake=fake_cuda)()
        seen["peak"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        seen["after_reset"] = torch.cuda.max_memory_allocated(0)

    capture(tmp_path, loop)
    assert seen["peak"] >= 300 * MB  # reached in step 7, reset by perfdoctor since
    assert seen["after_reset"] < 300 * MB
    assert torch.cuda.max_memory_allocated is not None and not hasattr(torch.cuda.max_memory_allocated,
                                                                        "__wrapped__")  # put back


# -- 5: CUDA first touched late -------------------------------------------------------------------------

def test_cuda_touched_late_gets_the_batch_probe_and_a_clean_series(tmp_path, fake_cuda):
    from torch.utils.data import DataLoader, TensorDataset

    def loader():
        return DataLoader(TensorDataset(torch.randn(400, 8), torch.randn(400, 1)), batch_size=4)

    run_dir = capture(tmp_path, train(40, loader=loader, cuda_from=10, fake=fake_cuda))
    steps = steps_of(run_dir)
    assert all("cuda_mem" not in s for s in steps[:10])  # no CUDA memory exists yet: none written
    assert all(s["cuda_mem"] for s in steps[10:])
    probes = json.loads((run_dir / "probes.json").read_text())
    assert probes["dataloaders"][0]["to_cuda"] is True and probes["dataloaders"][0]["non_blocking"] is False
    data = load_run(run_dir)
    assert data.facts.value("device.type") == "cuda"
    peak = data.facts.get("memory.peak_bytes")
    assert "steps 11..40" in peak.detail
    assert "memory.growth_bytes_per_step" not in data.facts  # 0 -> batches at step 11 is not growth


def test_cpu_script_on_a_gpu_machine_is_a_cpu_run(tmp_path, fake_cuda):
    run_dir = capture(tmp_path, train(12, device="cpu"))
    env = meta_of(run_dir)["env"]
    assert env["cuda_available"] is True and env["device"] == "cpu" and "devices" not in env
    assert not fake_cuda.initialized and not fake_cuda.contexts  # perfdoctor did not initialise CUDA
    assert all("cuda_mem" not in s for s in steps_of(run_dir))
    facts = load_run(run_dir).facts
    assert "process RSS" in facts.get("memory.peak_bytes").detail


# -- 6: batches that reach the GPU without Tensor.to ----------------------------------------------------

@pytest.mark.parametrize("how", ["as_tensor", "copy_", "cuda"])
def test_batch_moves_other_than_to_are_seen(tmp_path, fake_cuda, how):
    from torch.utils.data import DataLoader, TensorDataset

    def loader():
        return DataLoader(TensorDataset(torch.randn(200, 8), torch.randn(200, 1)), batch_size=4)

    fake_cuda.init()
    buf = torch.empty(4, 8).to("cuda")
    moves = {"as_tensor": lambda x: torch.as_tensor(x, device="cuda"),
             "copy_": lambda x: buf.copy_(x, non_blocking=True), "cuda": lambda x: x.cuda()}
    run_dir = capture(tmp_path, train(20, loader=loader, move=moves[how], fake=fake_cuda))
    dl = json.loads((run_dir / "probes.json").read_text())["dataloaders"][0]
    assert dl["to_cuda"] is True
    assert dl["non_blocking"] is (how == "copy_")


# -- 7: several GPUs ----------------------------------------------------------------------------------------

def test_rank_on_its_own_device_without_set_device(tmp_path, fake_cuda):
    fake_cuda.count = 4
    run_dir = capture(tmp_path, train(20, device="cuda:3", fake=fake_cuda, step_alloc=10 * MB))
    steps = steps_of(run_dir)
    assert all([c["device"] for c in s["cuda_mem"]] == [3] for s in steps)
    assert steps[-1]["cuda_mem"][0]["peak"] >= 10 * MB
    env = meta_of(run_dir)["env"]
    assert env["device"] == "cuda" and [d["index"] for d in env["devices"]] == [3]
    assert env["devices"][0]["free_memory_bytes"] > 0
    assert fake_cuda.contexts == {3}  # no context created on device 0 (or any other)
    assert ("mem_get_info", 0) not in fake_cuda.calls
    assert "cuda:3" in load_run(run_dir).facts.get("memory.peak_bytes").detail


def test_dataparallel_style_run_reports_every_device(tmp_path, fake_cuda):
    fake_cuda.count = 2

    def loop():
        for _ in range(12):
            a = torch.randn(64, 8).to("cuda:0")
            b = torch.randn(256, 8).to("cuda:1")
            fake_cuda.alloc(1, 30 * MB)
            fake_cuda.alloc(1, -30 * MB)
            model = torch.nn.Linear(8, 1)
            model(a.as_subclass(torch.Tensor) + 0).sum().backward()
            del a, b
            torch.optim.SGD(model.parameters(), lr=0.1).step()

    run_dir = capture(tmp_path, loop)
    steps = steps_of(run_dir)
    assert [c["device"] for c in steps[-1]["cuda_mem"]] == [0, 1]
    assert [d["index"] for d in meta_of(run_dir)["env"]["devices"]] == [0, 1]
    peak = load_run(run_dir).facts.get("memory.peak_bytes")
    assert peak.value >= 30 * MB and "cuda:1" in peak.detail


# -- 2, 4, 7, 8: a profiled GPU trace in the run folder -----------------------------------------------

def gpu_trace(path: Path, steps: list[tuple[float, float]], kernels: list[tuple[float, float, int]],
              launches: dict[int, float] | None = None, h2d_pageable: int = 0, devices: int = 1) -> None:
    """A torch.profiler Chrome trace: ProfilerStep annotations (µs spans), kernels (start, dur,
    device) each launched by a cudaLaunchKernel at `launches[k]` (default: its start), and
    `h2d_pageable` pageable host-to-device copies per step."""
    ev: list[dict] = []
    for n, (s, e) in enumerate(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 1, "tid": 1,
                   "ts": s, "dur": e - s})
        for c in range(h2d_pageable):
            corr = 90000 + n * 100 + c
            # a copy from pageable memory holds the CPU in its call while the driver stages it (real
            # traces: Kineto's ResNet-50, 2.02 ms for a 1.94 ms copy; an H200's, 97 us for 7 us)
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                       "ts": s + 1 + 150 * c, "dur": 100, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                       "tid": 7, "ts": s + 2 + 150 * c, "dur": 98, "args": {"correlation": corr, "device": 0,
                                                                      "stream": 7, "bytes": 1 << 20}})
    for k, (s, d, dev) in enumerate(kernels):
        lts = (launches or {}).get(k, s - 1)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": lts, "dur": 1, "args": {"correlation": k + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": dev, "tid": 7,
                   "ts": s, "dur": d, "args": {"correlation": k + 1, "device": dev, "stream": 7}})
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3 (fake)",
                                                     "totalGlobalMem": 80 * GIB, "computeMajor": 9,
                                                     "computeMinor": 0} for i in range(devices)],
           "traceEvents": ev}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def with_trace(run_dir: Path, **kw) -> Path:
    gpu_trace(run_dir / "trace.json.gz", **kw)
    return run_dir


def test_host_bound_idle_is_measured_against_the_run_not_the_profiled_steps(tmp_path, fake_cuda):
    """Profiled steps take 10 ms of host time (profiling doubles it), the GPU works 5 ms of each;
    the real (unprofiled) steps are whatever the run measured. The idle waiting on the host is the
    run's step less the GPU's busy time, not the profiled step's idle."""
    run_dir = capture(tmp_path, train(30, fake=fake_cuda))
    run_ms = load_run(run_dir).facts.value("step.time_ms")
    steps = [(i * 10_000.0, (i + 1) * 10_000.0) for i in range(5)]
    kernels = [(s + 5_000.0 + j * 1000.0, 1000.0, 0) for s, _ in steps for j in range(5)]  # 5 ms busy, late
    with_trace(run_dir, steps=steps, kernels=kernels)
    rep = analyse_run(run_dir)
    f = rep.facts
    busy = f["gpu.busy_ms"].value
    assert busy == pytest.approx(5.0, abs=0.01)
    idle = f["step.idle_ms"].value
    assert idle == pytest.approx(max(0.0, run_ms - busy), abs=0.01)  # the run's step less the GPU's work
    assert f["gpu.idle_host_wait_ms"].value <= idle + 1e-6
    assert "profiled steps" in f["gpu.busy_ms"].detail and "steady steps" in f["step.idle_ms"].detail
    assert rep.summary.gpu_breakdown


def test_dataparallel_idle_is_per_device(tmp_path, fake_cuda):
    """Two devices, each busy half of every step at different times: merged, the GPU looks busy
    all the time; per device, each idles half the step."""
    run_dir = capture(tmp_path, train(20, fake=fake_cuda))
    steps = [(i * 10_000.0, (i + 1) * 10_000.0) for i in range(5)]
    kernels = [k for s, _ in steps for k in ((s + 100.0, 4_900.0, 0), (s + 5_000.0, 4_900.0, 1))]
    gpu_trace(tmp_path / "dp.json.gz", steps=steps, kernels=kernels, devices=2)
    from perfdoctor.analysis import analyse_trace

    rep = analyse_trace(tmp_path / "dp.json.gz")
    assert rep.facts["gpu.utilization"].value == pytest.approx(0.49, abs=0.01)
    assert rep.facts["step.idle_ms"].value == pytest.approx(5.1, abs=0.05)
    per_dev = rep.summary.gpu.devices
    assert [d.device for d in per_dev] == [0, 1]
    assert all(d.utilization == pytest.approx(0.49, abs=0.01) for d in per_dev)
    assert run_dir.is_dir()


def test_data_wait_that_overlaps_queued_gpu_work_is_not_lost_time(tmp_path, fake_cuda):
    """The loop waits for data 30% of the step, but the GPU queue is full (busy 100% of the run's
    step): PD002 must not count the wait as lost; with an idle GPU it does."""
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            s = 0
            for k in range(25_000):
                s += k
            return torch.randn(8), torch.randn(1)

    def run(name: str) -> Path:
        return capture(tmp_path, train(25, loader=lambda: DataLoader(Slow(), batch_size=8), fake=fake_cuda),
                       name=name)

    full = run("full")
    data = load_run(full)
    step_ms = data.facts.value("step.time_ms")
    assert data.facts.value("step.data_ms") >= 0.2 * step_ms  # the loop does wait for data
    span = (int(step_ms) + 1) * 1000.0  # profiled steps, the GPU busy all through: longer than the run's
    steps = [(i * span, (i + 1) * span) for i in range(5)]
    with_trace(full, steps=steps, kernels=[(s, span, 0) for s, _ in steps])
    rep = analyse_run(full)
    assert rep.facts["gpu.busy_ms"].value >= step_ms
    assert rep.facts["step.idle_ms"].value == 0
    assert "PD002" not in {x.rule for x in rep.findings}

    idle = run("idle")
    with_trace(idle, steps=steps, kernels=[(s + 100.0, 100.0, 0) for s, _ in steps])
    rep = analyse_run(idle)
    assert "PD002" in {x.rule for x in rep.findings}


def test_unpinned_loader_fed_through_compiled_code_is_flagged_from_the_trace(tmp_path, fake_cuda):
    """The probe cannot see the move (compiled code: here, a move it is not told about), so the
    run's DataLoader says nothing of CUDA; the trace's pageable host-to-device copies speak for it."""
    from torch.utils.data import DataLoader, TensorDataset

    def loader():
        return DataLoader(TensorDataset(torch.randn(400, 8), torch.randn(400, 1)), batch_size=4)

    hidden = torch.Tensor.to  # taken before the probe wraps it: the probe does not see these moves
    run_dir = capture(tmp_path, train(30, loader=loader, move=lambda x: hidden(x, "cuda"), fake=fake_cuda))
    assert json.loads((run_dir / "probes.json").read_text())["dataloaders"][0]["to_cuda"] is False
    steps = [(i * 10_000.0, (i + 1) * 10_000.0) for i in range(5)]
    with_trace(run_dir, steps=steps, kernels=[(s + 200.0, 9_000.0, 0) for s, _ in steps], h2d_pageable=2)
    rep = analyse_run(run_dir)
    pd003 = [x for x in rep.findings if x.rule == "PD003"]
    assert pd003 and pd003[0].locations[0].file.endswith("test_fake_cuda.py")


def test_gradient_accumulation_counts_optimizer_steps(tmp_path, fake_cuda):
    """8 micro-batches per optimizer step: a step is an optimizer step, its data wait and memory
    peak cover all its micro-batches, and the trace's per-step facts divide by optimizer steps."""
    def loop():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(12):
            for m in range(8):
                x = torch.randn(4, 8).to("cuda")
                fake_cuda.alloc(0, (m + 1) * MB)  # activations grow over the micro-batches
                fake_cuda.alloc(0, -(m + 1) * MB)
                torch.nn.functional.mse_loss(model(x.as_subclass(torch.Tensor)), torch.zeros(4, 1)).backward()
                del x
            opt.step()
            opt.zero_grad()

    run_dir = capture(tmp_path, loop)
    steps = steps_of(run_dir)
    assert len(steps) == 12 and meta_of(run_dir)["step_clock"] == "optimizer"
    assert all(s["cuda_mem"][0]["peak"] >= 8 * MB for s in steps)
    trace_steps = [(i * 20_000.0, (i + 1) * 20_000.0) for i in range(4)]
    kernels = [(s + m * 2_000.0 + 100.0, 1_000.0, 0) for s, _ in trace_steps for m in range(8)]
    with_trace(run_dir, steps=trace_steps, kernels=kernels)
    rep = analyse_run(run_dir)
    assert rep.facts["gpu.busy_ms"].value == pytest.approx(8.0, abs=0.01)  # 8 micro-batches per step
    assert rep.facts["kernels.launches_per_step"].value == 8

