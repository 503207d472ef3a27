"""Memory over the run (issue 22): the growth fit and its interval, the parameters, gradients and
optimizer state measured exactly from the objects the run saw, the leak's growth, every format."""

from __future__ import annotations

import json
import random

import pytest

from perfdoctor.facts.run.memory import growth_fit


def test_the_growth_fit_finds_the_slope_and_its_interval_holds_it():
    rng = random.Random(0)
    steps = [{"i": i, "mem_bytes": 300e6 + 2e6 * i + rng.gauss(0, 1e6)} for i in range(10, 60)]
    slope, lo, hi = growth_fit(steps)
    assert lo < 2e6 < hi and abs(slope - 2e6) < 0.1e6 and hi - lo < 0.5e6
    flat = [{"i": i, "mem_bytes": 300e6 + rng.gauss(0, 1e6)} for i in range(10, 60)]
    _, lo, hi = growth_fit(flat)
    assert lo < 0 < hi
    assert growth_fit(steps[:7]) is None  # too few steps to fit


@pytest.mark.e2e
def test_params_grads_and_adam_state_are_exact_and_a_leak_grows_by_what_it_keeps(tmp_path):
    from tests.helpers import REPO, run_cli

    # glibc's mmap threshold fixed: each kept 2 MiB tensor is its own mapping, so the process RSS grows
    # by what the script keeps (with the dynamic threshold, heap fragmentation adds about half again)
    p = run_cli("run", str(REPO / "tests" / "data" / "scripts" / "memory_known.py"), "--out-dir", str(tmp_path / "run"),
                "--history", "off", "-f", "json", env={"LEAK": "1", "MALLOC_MMAP_THRESHOLD_": "131072"},
                cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    facts = {k: v["value"] for k, v in doc["facts"].items()}
    params = 2 * (1024 * 1024 + 1024) * 4  # two Linear(1024, 1024) in fp32; the frozen layer is no optimizer's
    assert facts["memory.params_bytes"] == params
    assert facts["memory.grads_bytes"] == params
    assert facts["memory.optimizer_state_bytes"] == 2 * params  # Adam: exp_avg and exp_avg_sq
    kept = 524_288 * 4
    mem = doc["summary"]["memory"]
    assert abs(mem["growth_bytes_per_step"] - kept) < 0.1 * kept
    assert mem["growth_interval"][0] <= mem["growth_bytes_per_step"] <= mem["growth_interval"][1]
    parts = dict(mem["parts"])
    assert parts.pop("activations") > 0  # a CPU run: the allocator's within-step peak above the step's start
    assert parts == {"params": params, "grads": params, "optimizer_state": 2 * params}
    # the leak rule: what the profiler saw allocated and never freed, at the line that creates it
    assert facts["memory.kept_bytes_per_step"] == kept  # the allocator's blocks: exactly what the script keeps
    (leak,) = [f for f in doc["findings"] if f["rule"] == "PD035"]
    assert leak["locations"][0]["code"] == "kept.append(torch.ones(524_288))"
    assert "PD006" not in {f["rule"] for f in doc["findings"]}  # no loss kept with its graph
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'id="memory"' in page and "by what holds it" in page
    md = run_cli("report", str(tmp_path / "run"), "-f", "markdown", "--history", "off", cwd=tmp_path).stdout
    assert "**Memory** process RSS" in md and "optimizer state 16.0 MiB" in md


def test_a_known_accelerator_peak_by_name_and_dtype():
    from perfdoctor.facts.trace.flops import device_peak

    assert device_peak("NVIDIA H100 80GB HBM3", "16-bit")[0] == 989e12
    assert device_peak("NVIDIA A100-SXM4-40GB", "fp32")[0] == 19.5e12
    assert device_peak("NVIDIA A10", "16-bit")[0] == 125e12  # not the A100's
    assert device_peak("NVIDIA L40S", "16-bit") is None  # not an L4
    assert device_peak("AMD Instinct MI300X", "16-bit")[0] == 1307.4e12
    assert device_peak("Tesla T4", "tf32") is None and device_peak(None, "fp32") is None


@pytest.mark.e2e
def test_flops_of_matmuls_of_known_shapes_and_the_mfu_against_the_cpus_measured_rate(tmp_path):
    from tests.helpers import REPO, run_cli

    p = run_cli("run", str(REPO / "tests" / "data" / "scripts" / "known_flops.py"), "--out-dir", str(tmp_path / "run"),
                "--history", "off", "-f", "json", cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    facts = {k: v for k, v in doc["facts"].items()}
    hand = 5 * 2 * 64 * 1024 * 1024  # forward 2 addmm, backward 3 mm
    assert abs(facts["compute.flops_per_step"]["value"] - hand) <= 0.01 * hand
    assert facts["compute.flops_per_step"]["source"] == "run" and "FlopCounterMode on step 2" in \
        facts["compute.flops_per_step"]["detail"]
    compute = doc["summary"]["compute"]
    assert compute["source"].startswith("torch.utils.flop_counter.FlopCounterMode")
    rows = {r["module"]: r for r in compute["modules"]}
    assert set(rows) == {"Sequential.0", "Sequential.1"}  # the leaves, not the Sequential holding them
    assert rows["Sequential.1"]["flops"] == 3 * hand // 5 and rows["Sequential.0"]["forward_flops"] == hand // 5
    for r in rows.values():  # timed from the trace's "nn.Module: Linear_k" spans
        assert r["forward_ms"] > 0 and r["achieved_flops"] == pytest.approx(r["forward_flops"] / r["forward_ms"] * 1e3, rel=1e-3)
    # the trace alone: its recorded matmul shapes give the same count
    trace = run_cli("report", str(tmp_path / "run" / "trace.json.gz"), "-f", "json", "--history", "off", cwd=tmp_path)
    tf = json.loads(trace.stdout)["facts"]["compute.flops_per_step"]
    assert tf["source"] == "trace" and abs(tf["value"] - hand) <= 0.01 * hand
    peak = facts["compute.peak_flops"]["value"]
    achieved = facts["compute.achieved_flops"]["value"]
    assert 0 < achieved and peak > 1e8 and "measured" in facts["compute.peak_flops"]["detail"]
    assert abs(facts["compute.mfu"]["value"] - achieved / peak) < 1e-3
    assert "MFU = FLOPs per step / step time / peak" in facts["compute.mfu"]["detail"]
    assert "PD035" not in {f["rule"] for f in doc["findings"]}  # nothing kept: no leak
    assert facts["memory.kept_bytes_per_step"]["value"] < 4096


def test_a_cpu_run_gets_activations_from_the_allocator_and_a_batch_that_fits_as_an_estimate():
    from perfdoctor.contracts.report import MemoryDoc, SummaryDoc
    from perfdoctor.facts.model import Facts
    from perfdoctor.facts.run.memory import cpu_estimates

    facts = Facts()
    facts.add("memory.step_transient_bytes", 64 * 2**20, "bytes", "trace")
    facts.add("memory.headroom_bytes", 1024 * 2**20, "bytes")
    summary = SummaryDoc(memory=MemoryDoc(source="process RSS", batch=32, parts={"params": 1}))
    cpu_estimates(facts, summary)
    assert summary.memory.parts == {"params": 1, "activations": 64 * 2**20}
    assert facts.value("memory.batch_that_fits") == 32 + 32 * 1024 // 64  # 2 MiB per sample in 1 GiB more
    assert "an estimate" in facts.get("memory.batch_that_fits").detail
    cuda = SummaryDoc(memory=MemoryDoc(source="cuda allocated", batch=32, parts={}))
    cpu_estimates(Facts(), cuda)  # CUDA's activations come from its allocator's peak, not from here
    assert cuda.memory.parts == {}
