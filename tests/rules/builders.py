"""Hand-built facts for judging rules without a run: a CPU run, a DataLoader subject, the facts of a GPU
trace. The per-rule modules (tests/rules/test_pdNNN.py) and the engine's tests build on them."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.catalog import load_rules

RULES = load_rules()


def cpu_run(step_ms=20.0, cpus=2):
    f = Facts()
    f.add("step.time_ms", step_ms, "ms", "run")
    f.add("cpu.count", cpus, "count", "machine")
    f.add("device.type", "cpu", "", "machine")
    f.add("device.amp_available", False, "", "machine", "CPU without AMX")
    f.add("run.loss_scan_steps", 30, "count", "run")
    return f


def target_gpu(f, step_ms, sync_ms=0.046, h2d_bytes_per_ms=1e7):
    """A CPU run's estimate of the step on the reference GPU (facts/trace/target_gpu.py)."""
    f.add("target_gpu.step_ms", step_ms, "ms", "trace")
    f.add("target_gpu.sync_ms", sync_ms, "ms", "trace")
    f.add("target_gpu.h2d_bytes_per_ms", h2d_bytes_per_ms, "number", "trace")


def ids(findings):
    return sorted(f.rule for f in findings)


def loader(f, workers, wait_ms, source="run", pin=False, feeds_cuda=None, line=10, tmp=None):
    s = f.subject("dataloader", f"train.py:{line}")
    s.add("num_workers", workers, "count", source)
    s.add("pin_memory", pin, "", source)
    if wait_ms is not None:
        s.add("wait_ms", wait_ms, "ms", source)
        s.add("wait_fraction", wait_ms / f.value("step.time_ms"), "ratio", source)
    if feeds_cuda is not None:
        s.add("feeds_cuda", feeds_cuda, "", "static")
    s.locations.append(Location(str(tmp / "train.py") if tmp else "train.py", line,
                                "loader = DataLoader(ds, batch_size=64)"))
    return s


def gpu_facts(**kv):
    f = Facts()
    f.add("device.type", "cuda", "", "trace")
    f.add("step.time_ms", 100.0, "ms", "trace")
    if "step__profiled_time_ms" not in kv:  # a trace alone: its steps are the profiled steps
        f.add("step.profiled_time_ms", 100.0, "ms", "trace")
    for k, v in kv.items():
        f.add(k.replace("__", "."), v, "", "trace")
    return f
