"""Trace facts on real traces, checked against independent readings of the raw JSON."""

import gzip
import json
import os
import textwrap
from statistics import median

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.facts.ranks import cross_rank
from perfdoctor.facts.trace import add_trace_facts, summarise_trace
from perfdoctor.trace import load_trace, load_traces
from tests.helpers import CPU, DLRM, HTA, KINETO, MI300, TRACES

DATA = TRACES


def facts_of(path):
    f = Facts()
    return f, add_trace_facts(load_trace(path), f)


@pytest.mark.slow
def test_resnet50_dataloader_share_matches_independent_reading():
    ev = json.load(gzip.open(KINETO))["traceEvents"]
    steps = [e for e in ev if e.get("name", "").startswith("ProfilerStep#")]
    loads = [e for e in ev if e.get("name", "").startswith("enumerate(DataLoader)")]
    share = median(sum(d["dur"] for d in loads if s["ts"] <= d["ts"] < s["ts"] + s["dur"]) / s["dur"] for s in steps)
    f, summary = facts_of(KINETO)
    (dl,) = f.of_kind("dataloader")
    assert abs(dl.facts["dataloader.wait_fraction"].value - share) < 0.02, (dl.facts, share)
    assert dl.facts["dataloader.num_workers"].value == 0 and dl.key.endswith(".py:42")
    assert f.value("copies.h2d_pageable_per_step") == 2
    assert f.value("matmul.fp32_share") > 0.95 and f.value("device.capability") == 7.0
    assert f.value("device.amp_available") is True
    # HTA: idle 39 %, 97 % of it waiting on the host
    idle = f.value("step.idle_ms") / f.value("step.time_ms")
    assert 0.33 < idle < 0.47
    assert f.value("gpu.idle_host_wait_ms") / f.value("step.idle_ms") > 0.9
    assert not f.of_kind("dataparallel")
    total = sum(b.ms for b in summary.breakdown)
    assert abs(total - summary.step_time_ms.median) < 0.01


def test_hta_ns_resolution_utilization_and_no_dataparallel():
    f, summary = facts_of(HTA)
    assert f.value("gpu.utilization") > 0.95  # HTA: compute 96.8 %, idle 2.6 %
    assert f.value("step.idle_ms") / f.value("step.time_ms") < 0.04
    assert 90 < f.value("step.time_ms") < 100  # steady-state period (CPU ProfilerSteps are ~95.6 ms)
    assert not f.of_kind("dataparallel")  # DDP trace
    assert f.value("comm.allreduce_per_step") == 5
    assert f.value("device.count") == 8 and f.value("device.type") == "cuda"
    assert all(x.source == "trace" for x in f)


def test_rocm_comm_and_bf16():
    f, _ = facts_of(MI300)
    assert f.value("device.type") == "rocm"
    assert f.value("comm.share") > 0.6  # RCCL all-reduce dominates GPU busy time
    assert f.value("step.comm_ms") > f.value("step.gpu_kernel_ms")
    assert f.value("matmul.fp32_share") < 0.05  # bf16 igemm kernels
    assert f.value("comm.allreduce_bytes_median") > 0
    assert f.value("ops.calls_per_step") > 0 and f.value("kernels.launches_per_step") > 0


def test_cpu_trace():
    f, summary = facts_of(CPU)
    cats = {b.category for b in summary.breakdown}
    assert {"data loading", "forward", "backward", "optimizer"} <= cats
    assert f.value("device.type") == "cpu" and "gpu.utilization" not in f
    assert f.value("dataloader.num_workers") == 0
    assert f.value("matmul.fp32_share") == 1.0  # fp32 addmm recorded with shapes
    assert f.value("ops.calls_per_step") > 10


def test_cpu_matmul_time_counts_nested_ops_once():
    """aten::linear calls aten::addmm (conv2d calls convolution): the CPU trace's matmul time is the
    outermost ops' time, read here by brute force over the trace's own events, not their sum."""
    from perfdoctor.facts.trace.matmul import _CPU_MM
    ev = [e for e in json.load(gzip.open(CPU))["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") in _CPU_MM]
    nested = [e for e in ev if e["name"] == "aten::addmm"]
    assert nested, "the trace's Linear layers record aten::linear around aten::addmm"

    def inside(e, o):
        return o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]

    outer = sum(e["dur"] for e in ev if not any(inside(e, o) for o in ev))
    f, _ = facts_of(CPU)
    steps = 4  # the trace's 5 ProfilerStep spans less the last, partial one: what per_step divides by
    assert f.value("matmul.ms") == pytest.approx(outer / 1000 / steps, rel=1e-3)
    assert f.value("matmul.ms") < sum(e["dur"] for e in ev) / 1000 / steps * 0.9


def test_never_overwrites_existing_facts():
    f = Facts()
    f.add("step.time_ms", 1.0, "ms", "run")
    add_trace_facts(load_trace(HTA), f)
    assert f.get("step.time_ms").source == "run" and f.value("step.time_ms") == 1.0


def test_dlrm_rank_imbalance():
    per = [summarise_trace(t.path) for t in load_traces(DLRM)]
    g, rows = cross_rank([(r.rank, r.path.name) for r in per], [r.facts for r in per])
    assert g.value("ranks.count") == 8 and len(rows) == 8
    assert g.value("ranks.idle_spread") > 0.3  # README: per-rank idle 34-76 %
    steps = [r.step_ms for r in rows]
    assert max(steps) / min(steps) > 1.4
    assert g.value("ranks.imbalance_ratio") > 1.1
    assert all(not r.facts.of_kind("dataparallel") for r in per)


@pytest.mark.slow
def test_interval_helpers_match_a_brute_force_reading():
    """merge, subtract and per_window (hand-tuned loops) against a unit-grid reading."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from perfdoctor.facts.trace.intervals import merge, per_window, subtract

    ivs = st.lists(st.tuples(st.integers(0, 40), st.integers(-2, 8)).map(lambda p: (p[0], p[0] + p[1])), max_size=25)

    def cells(iv):  # the unit cells [x, x + 1) an interval list covers
        return {x for s, e in iv for x in range(s, e)}

    @settings(max_examples=300, deadline=None)
    @given(ivs, ivs, st.lists(st.integers(0, 50), max_size=8))
    def check(a, b, cuts):
        ma, mb = merge(list(a)), merge(list(b))
        assert cells(ma) == cells(a)
        assert all(s < e for s, e in ma) and all(x[1] < y[0] for x, y in zip(ma, ma[1:]))  # disjoint, apart
        # b as disjoint runs that may touch (as the breakdown's `covered` list is)
        touching = [[x, x + 1] for x in sorted(cells(b))]
        for cover in (mb, touching):
            diff = subtract(ma, cover)
            assert cells(diff) == cells(ma) - cells(b)
            assert all(s < e for s, e in diff)
        pts = sorted(set(cuts))
        windows = list(zip(pts, pts[1:]))
        assert per_window(ma, windows) == [len({x for x in cells(ma) if s <= x < e}) for s, e in windows]

    check()


def test_anomaly_nan_checks_share_of_the_step(tmp_path):
    """autograd.nan_check_fraction: the NaN-check ops (isnan, _is_any_true) inside the autograd engine's
    node evaluations, as a share of each profiled step; a user's own isnan outside backward is not one."""
    def x(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    ev = []
    for k in range(4):  # 4 steps of 1000 µs: a user isnan (50 µs), then a node evaluation with 2 checks (30 + 20 µs)
        s = 10_000 * k
        ev += [x("user_annotation", f"ProfilerStep#{k}", s, 1000), x("cpu_op", "aten::isnan", s + 10, 50),
               x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", s + 500, 300),
               x("cpu_op", "aten::isnan", s + 600, 30), x("cpu_op", "aten::ne", s + 605, 20),
               x("cpu_op", "aten::_is_any_true", s + 640, 20), x("cpu_op", "aten::any", s + 641, 18)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    f = Facts()
    add_trace_facts(load_trace(p), f)
    assert f.value("autograd.nan_check_fraction") == pytest.approx(50 / 1000)
    p.write_text(json.dumps({"traceEvents": [e for e in ev if not e["name"].startswith("autograd::")]}))
    f = Facts()
    add_trace_facts(load_trace(p), f)
    assert "autograd.nan_check_fraction" not in f


def test_empty_cache_cost_is_torchs_call_and_the_steps_allocations(tmp_path):
    """empty_cache.cost_share: torch's own empty_cache frame (not a wrapper's) and the step's cudaMalloc /
    cudaFree calls outside it, as a share of each profiled step; nothing where no call is in a step."""
    def x(cat, name, ts, dur, **kw):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, **kw}

    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 1, "args": {"device": 0}}]
    for k in range(4):  # steps of 1000 µs: a wrapper (100 µs) around torch's call (60 µs, a 20 µs cudaFree
        s = 10_000 * k  # inside), then a 40 µs cudaMalloc later in the step
        ev += [x("user_annotation", f"ProfilerStep#{k}", s, 1000),
               x("python_function", "wrap.py(3): empty_cache", s + 100, 100),
               x("python_function", "torch/cuda/memory.py(212): empty_cache", s + 120, 60),
               x("cuda_runtime", "cudaFree", s + 130, 20), x("cuda_runtime", "cudaMalloc", s + 500, 40),
               x("cuda_runtime", "cudaLaunchKernel", s + 600, 5)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    f = Facts()
    f.subject("empty_cache", "train.py:27").add("calls_per_step", 1.0, "count", "run")
    add_trace_facts(load_trace(p), f)
    assert f.value("empty_cache.cost_share") == pytest.approx(100 / 1000)
    subs = [s for s in f.of_kind("empty_cache") if "empty_cache.cost_share" in s.facts]
    assert sum(s.facts["empty_cache.cost_share"].value for s in subs) == pytest.approx(0.1, abs=1e-4)
    p.write_text(json.dumps({"traceEvents": [e for e in ev if "empty_cache" not in e["name"]],
                             "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    f = Facts()
    add_trace_facts(load_trace(p), f)
    assert "empty_cache.cost_share" not in f  # allocations alone are not empty_cache's


def _cuda_script_facts(flops=4e9, convs=1e9, **static):
    f = Facts()
    f.add("script.targets_cuda", True, "bool", "static")
    for name, value in static.items():
        f.add(f"script.{name}", value, "bool", "static")
    f.add("compute.flops_per_step", flops, "number", "run")
    f.add("compute.conv_flops_per_step", convs, "number", "run")
    f.add("compute.sixteen_bit_share", 0.0, "ratio", "run")
    return f


def test_target_gpu_estimate_of_a_cpu_trace_of_a_cuda_script():
    """A CPU run of a CUDA script: its GPU step on the reference GPU (A100: fp32 19.5, TF32 156, 16-bit
    312 TFLOP/s) is its ops' launch floor plus its FLOPs at the rate of the precision they run in."""
    from perfdoctor.facts.trace.flops import HOST_US_PER_OP

    f = _cuda_script_facts()
    add_trace_facts(load_trace(CPU), f)
    ops = f.value("target_gpu.ops_per_step")
    # the DataLoader's own ops (its collate in the main thread: num_workers=0) launch nothing on a GPU
    assert 0 < ops < f.value("ops.calls_per_step")
    assert f.value("target_gpu.launch_ms") == pytest.approx(ops * HOST_US_PER_OP / 1000, rel=1e-3)
    # convolutions at TF32 (cuDNN's default), matmuls at fp32 (torch's default)
    assert f.value("target_gpu.math_ms") == pytest.approx((1e9 / 156e12 + 3e9 / 19.5e12) * 1000, abs=1e-4)
    share = f.value("target_gpu.math_share")
    assert share == pytest.approx(f.value("target_gpu.math_ms") / f.value("target_gpu.step_ms"), abs=1e-3)
    assert f.value("target_gpu.amp_saving_ms") == pytest.approx(f.value("target_gpu.math_ms") - 4e9 / 312e12 * 1000,
                                                                abs=2e-4)
    # all of it at the fp32 rate, the slowest: what PD025 asks to be under the launch floor
    assert f.value("target_gpu.slowest_math_ms") == pytest.approx(4e9 / 19.5e12 * 1000, abs=1e-4)
    tf32 = _cuda_script_facts(tf32_matmul=True)  # the script lets matmuls use TF32: faster math
    add_trace_facts(load_trace(CPU), tf32)
    assert tf32.value("target_gpu.math_ms") == pytest.approx(4e9 / 156e12 * 1000, abs=1e-4)
    cpu_only = Facts()  # a script that never leaves the CPU is not judged for a GPU
    cpu_only.add("compute.flops_per_step", 4e9, "number", "run")
    add_trace_facts(load_trace(CPU), cpu_only)
    assert not [n for n in cpu_only.as_mapping() if n.startswith("target_gpu.")]


def test_target_gpu_estimate_at_the_scripts_own_batch():
    """timm's train.py runs at `--batch-size 128` by default; the corpus's CPU run passes 8. The GPU
    step it is judged for runs 128: 16 times the FLOPs, the same launches. A loader only evaluation
    uses, or a run at the default batch, scales nothing."""
    def facts(ran, default, trains=True):
        f = _cuda_script_facts()
        s = f.subject("dataloader", "train.py:40")
        s.add("batch_size", ran, "count", "run")
        s.add("default_batch_size", default, "count", "static")
        s.add("trains", trains, "", "static")
        add_trace_facts(load_trace(CPU), f)
        return f
    base = _cuda_script_facts()
    add_trace_facts(load_trace(CPU), base)
    scaled = facts(8, 128)
    assert scaled.value("target_gpu.batch_scale") == 16
    assert scaled.value("target_gpu.math_ms") == pytest.approx(16 * base.value("target_gpu.math_ms"), rel=1e-3)
    assert scaled.value("target_gpu.launch_ms") == base.value("target_gpu.launch_ms")
    assert scaled.value("target_gpu.math_share") > base.value("target_gpu.math_share")
    for same in (facts(128, 128), facts(256, 128), facts(8, 128, trains=False)):
        assert "target_gpu.batch_scale" not in same
        assert same.value("target_gpu.math_ms") == pytest.approx(base.value("target_gpu.math_ms"), rel=1e-3)


def test_a_cpu_runs_ops_are_the_ops_its_cuda_step_launches():
    """The ops a CPU run counts for the GPU step are those a CUDA trace of the same script shows: the
    optimizer's per-parameter loop on the CPU counts once per operator (CUDA's foreach form)."""
    from perfdoctor.facts.trace import breakdown
    from perfdoctor.facts.trace.context import TraceContext
    from perfdoctor.facts.trace.target_gpu import gpu_ops_per_step

    ctx = TraceContext(load_trace(TRACES / "h200__pd007_fp32_without_amp.pt.trace.json.gz"), Facts(), None, "",
                       None, None)
    breakdown.add(ctx)
    assert gpu_ops_per_step(ctx) == 89  # AdamW's foreach ops, the forward's and the backward's
    gpu = Facts()  # a GPU trace measures its step: no estimate
    add_trace_facts(load_trace(TRACES / "h200__pd007_fp32_without_amp.pt.trace.json.gz"), gpu)
    assert "target_gpu.math_ms" not in gpu


def test_convolution_flops_from_their_backward_shapes():
    """The pd003 sample's two convolutions (batch 32 of 1x40x40: 1->32 channels 3x3 at 40x40, pooled,
    32->64 3x3 at 20x20), counted from aten::convolution_backward's grad_output and weight shapes,
    3x the forward as FlopCounterMode counts them. Before, the trace left them out: no conv net had
    FLOPs where the run's FLOP probe had not counted a step."""
    f, _ = facts_of(TRACES / "h200__pd003_pin_memory.pt.trace.json.gz")
    forward = 2 * 32 * 32 * 40 * 40 * 1 * 9 + 2 * 32 * 64 * 20 * 20 * 32 * 9
    assert f.value("compute.conv_flops_per_step") == 3 * forward
    assert f.value("compute.flops_per_step") > 3 * forward and "compute.uncounted_convs_per_step" not in f


def test_convolutions_without_a_backward_leave_a_lower_bound_not_no_estimate():
    """A momentum encoder's or an evaluation's convolutions run without a backward: the trace cannot
    count them, and the counted FLOPs are a lower bound on the step's math, still an estimate (BYOL's
    target network left the corpus's BYOL without one)."""
    f = _cuda_script_facts()
    f.add("compute.uncounted_convs_per_step", 4.0, "count", "trace")
    add_trace_facts(load_trace(CPU), f)
    assert f.value("target_gpu.math_ms") == pytest.approx((1e9 / 156e12 + 3e9 / 19.5e12) * 1000, abs=1e-4)


def test_a_matmul_with_a_sparse_operand_is_not_counted_as_dense(tmp_path):
    """A graph net's `torch.sparse.mm(adjacency, x)` is recorded (torch 2.13's CPU profiler) as
    aten::addmm with the dense product's dims ([1000, 1000] x [1000, 64]) and the sparse operand's
    strides empty: counted as dense it was 128 MFLOP a step where 3 non-zeros do 384 FLOPs (lightgcn:
    a false PD007 on 56 GFLOP a step). Only the dense linear's matmul counts; a trace without strides
    (an older profiler) counts as before."""
    def x(name, ts, dur, dims=None, strides=None):
        e = {"ph": "X", "cat": "user_annotation" if name.startswith("ProfilerStep") else "cpu_op", "name": name,
             "pid": 1, "tid": 1, "ts": ts, "dur": dur}
        if dims is not None:
            e["args"] = {"Input type": ["float", "float", "float", "Scalar", "Scalar"], "Input Dims": dims}
            if strides is not None:
                e["args"]["Input Strides"] = strides
        return e

    def trace(strides: bool):
        ev = []
        for k in range(4):
            s = 10_000 * k
            ev += [x(f"ProfilerStep#{k}", s, 1000),
                   x("aten::addmm", s + 10, 100, [[1000, 64], [1000, 1000], [1000, 64], [], []],
                     [[64, 1], [], [64, 1], [], []] if strides else None),  # sparse x dense
                   x("aten::mm", s + 200, 100, [[1000, 64], [64, 32]],
                     [[64, 1], [1, 64]] if strides else None)]  # the dense linear
        p = tmp_path / f"t{strides}.json"
        p.write_text(json.dumps({"traceEvents": ev}))
        f = Facts()
        add_trace_facts(load_trace(p), f)
        return f.value("compute.flops_per_step")

    assert trace(strides=True) == 2 * 1000 * 64 * 32
    assert trace(strides=False) == 2 * 1000 * 64 * 32 + 2 * 1000 * 1000 * 64


def test_kept_blocks_of_a_line_whose_frees_the_trace_lost_are_not_a_leak(tmp_path):
    """memory.kept_bytes_per_step and kept_alloc: a block allocated in a recorded step and alive at the
    trace's end is kept, unless its line's blocks lost their free in the trace (the same address
    allocated again with no free between): then what is alive may be freed blocks not reused yet."""
    ids = iter(range(2, 1000))

    def x(name, ts, dur, cat="python_function", parent=1):  # a Python frame under the module's (id 1)
        args = {"Python id": next(ids), "Python parent id": parent} if cat == "python_function" else {}
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    def call(name, ts, caller):  # a built-in the frame `caller` calls
        return x(name, ts, 50, parent=caller["args"]["Python id"])

    def mem(ts, addr, nbytes):
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 0, "Total Reserved": 0,
                         "Device Type": 0, "Device Id": -1}}

    def trace(lose_frees: bool):
        top = {"ph": "X", "cat": "python_function", "name": "train.py(1): <module>", "pid": 1, "tid": 1, "ts": 0,
               "dur": 50_000, "args": {"Python id": 1}}
        ev = [top]
        for k in range(4):
            s = 10_000 * k
            keep, churn = x("train.py(5): keep", s + 100, 100), x("train.py(9): churn", s + 300, 400)
            ev += [x(f"ProfilerStep#{k}", s, 9_000, "user_annotation"),
                   keep, call("<built-in method ones of type object at 0x1>", s + 110, keep),
                   mem(s + 120, 1_000 + k, 4096),  # kept: never freed
                   churn, call("<built-in method zeros of type object at 0x1>", s + 310, churn)]
            # churn's block, freed within the step, at two addresses in turn; where the trace loses the
            # frees, steps 2 and 3 allocate again at a live address, and step 2's block looks kept
            ev.append(mem(s + 320, 9_000 + k % 2, 8192))
            if not lose_frees:
                ev.append(mem(s + 600, 9_000 + k % 2, -8192))
        p = tmp_path / f"t{lose_frees}.json"
        p.write_text(json.dumps({"traceEvents": ev}))
        f = Facts()
        add_trace_facts(load_trace(p), f)
        return f

    f = trace(lose_frees=False)
    kept = {s.key.rsplit("/", 1)[-1]: s.facts["kept_alloc.bytes_per_step"].value for s in f.of_kind("kept_alloc")}
    assert kept == {"train.py:5": 4096.0} and "memory.lost_frees" not in f
    f = trace(lose_frees=True)
    assert f.value("memory.lost_frees") == 2  # churn's addresses allocated again in steps 2 and 3
    kept = {s.key.rsplit("/", 1)[-1] for s in f.of_kind("kept_alloc")}
    assert kept == {"train.py:5"}  # keep's blocks still count; churn's alive ones do not
    assert f.value("memory.kept_bytes_per_step") == 4096.0


def _profiled_steps(tmp_path, step, steps=3):
    """A real CPU torch.profiler trace of `step()` run `steps` times (Python frames recorded, as
    perfdoctor's window records them), loaded, in a TraceContext with its steps."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.context import TraceContext

    out = tmp_path / "t.json"
    sched = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                record_shapes=True, with_stack=True) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    prof.export_chrome_trace(str(out))
    return TraceContext(load_trace(out), Facts(), None, "", None, None)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["GRU", "LSTM"])
def test_a_recurrent_layers_backward_is_one_launch_however_long_the_sequence(tmp_path, layer):
    """On a CPU a GRU runs as its gates' ops, one set per time step, and autograd differentiates each
    (an LSTM may run as oneDNN's layer: one backward either way); on CUDA cuDNN runs the layer forward
    and backward as one call each. The ops counted for the GPU step do not grow with the sequence."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.target_gpu import gpu_ops_per_step

    torch.manual_seed(0)
    lstm, head = getattr(torch.nn, layer)(8, 16, num_layers=2), torch.nn.Linear(16, 1)
    opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)

    def step_of(length):
        x = torch.randn(length, 4, 8)

        def step():
            out, _ = lstm(x)
            loss = head(out[-1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    short = gpu_ops_per_step(_profiled_steps(tmp_path, step_of(1)))
    long = gpu_ops_per_step(_profiled_steps(tmp_path, step_of(20)))
    assert short is not None and long == short


@pytest.mark.slow
def test_a_batch_written_element_by_element_on_the_host_launches_nothing(tmp_path):
    """charrnn's random_training_set writes each character's index into a host tensor (a select, a
    scalar tensor and a copy per element): the batch source's work stays on the host on a GPU too,
    as a DataLoader's does (`dataloader.source_def`, the profiler's name of its frame)."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.target_gpu import gpu_ops_per_step

    model = torch.nn.Linear(50, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def make_batch():
        x = torch.zeros(4, 50)
        for i in range(4):
            for j in range(50):
                x[i, j] = (i * j) % 7
        return x

    def step():
        loss = model(make_batch()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    ctx = _profiled_steps(tmp_path, step)
    frame = f"test_trace_facts.py({make_batch.__code__.co_firstlineno}): make_batch"
    every = gpu_ops_per_step(ctx)
    model_only = gpu_ops_per_step(ctx, (frame,))
    assert every is not None and model_only is not None
    assert every > 4 * 50 * 2 > 40 > model_only > 5
    # the run saw make_batch write the host's values into the step's tensor (facts/run/host_tensors.py)
    from perfdoctor.facts.trace import target_gpu

    # a step function that builds its batch by hand and takes the step itself keeps its backward's and its
    # optimizer's ops: only the batch's writes are the host's
    def step_filling():
        x = torch.zeros(4, 50)
        for i in range(4):
            for j in range(50):
                x[i, j] = (i * j) % 7
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    filling = _profiled_steps(tmp_path, step_filling)
    kept = gpu_ops_per_step(filling, (f"test_trace_facts.py({step_filling.__code__.co_firstlineno}): step_filling",))
    assert kept is not None and model_only - 5 <= kept < every  # what the model, backward and optimizer launch
    ctx.facts = _cuda_script_facts()
    ctx.facts.add("device.type", "cpu", "", "machine")
    ctx.facts.subject("host_fill", frame).add("frame", frame, "str", "run")
    target_gpu.add(ctx)
    assert ctx.facts.value("target_gpu.ops_per_step") == model_only


def _mse_step(model, x, opt):
    """One training step of `model` on `x` with `opt`, as a callable for `_profiled_steps`."""
    def step():
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _loop_adam():
    """A hand-written Adam that loops over its parameters in Python (BertAdam's pattern)."""
    torch = pytest.importorskip("torch")

    class LoopAdam(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3):
            super().__init__(params, dict(lr=lr))

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    st = self.state[p]
                    if not st:
                        st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
                    st["m"].mul_(0.9).add_(p.grad, alpha=0.1)
                    st["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                    p.addcdiv_(st["m"], st["v"].sqrt().add_(1e-8), value=-group["lr"])
    return LoopAdam


@pytest.mark.slow
def test_a_hand_written_per_tensor_optimizer_is_a_loop_whose_ops_launch_one_by_one(tmp_path):
    """BertAdam (bertcls-thucnews) loops over BERT's tensors in Python, about ten ops each: on CUDA too
    each op is a launch. The trace shows its class's step repeating its operators once per tensor
    (`hand_written_loops`), and the GPU step's launch floor counts them one by one, where torch's own
    optimizers (their foreach form on CUDA) count once per operator."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.optimizer_loop import add_hand_written, hand_written_loops
    from perfdoctor.facts.trace.target_gpu import gpu_ops_per_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])  # 12 tensors
    x = torch.randn(4, 8)


    loop = _profiled_steps(tmp_path, _mse_step(model, x, _loop_adam()(model.parameters())))
    found = hand_written_loops(loop.trace, loop.cpu_windows)
    assert list(found) == ["LoopAdam"]
    adam = found["LoopAdam"]
    assert adam.tensors == 12
    assert adam.ops_per_step == 7 * 12 and adam.repeats_per_step == 7 * 12 - 5  # 5 operators, 7 ops a tensor
    torch_sgd = _profiled_steps(tmp_path, _mse_step(model, x, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)))
    assert hand_written_loops(torch_sgd.trace, torch_sgd.cpu_windows) == {}  # torch's own: foreach on CUDA
    # the launch floor: the loop's ops one by one, torch's optimizer's once per operator
    looped, once = gpu_ops_per_step(loop), gpu_ops_per_step(torch_sgd)
    assert looped is not None and once is not None
    assert looped - once >= adam.repeats_per_step - 12
    # the construction's subject gets the loop
    s = loop.facts.subject("optimizer", "train.py:9")
    s.add("name", "LoopAdam", "str", "static")
    s.add("custom", True, "bool", "static")
    add_hand_written(loop)
    assert s.facts["optimizer.loop_tensors"].value == 12
    assert s.facts["optimizer.loop_repeats_per_step"].value == pytest.approx(adam.repeats_per_step, abs=0.1)


@pytest.mark.slow
def test_an_optimizer_of_sparse_gradients_is_no_loop_to_replace(tmp_path):
    """GRU4Rec's IndexedAdagradM updates its embeddings' sparse gradients row by row (coalesce, index_add_):
    torch's foreach and fused optimizers take dense gradients only, so there is no loop to replace."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.optimizer_loop import hand_written_loops

    class SparseLoop(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=0.1))

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    g = p.grad.coalesce() if p.grad.is_sparse else p.grad
                    if g.is_sparse:
                        p.index_add_(0, g._indices()[0], g._values(), alpha=-0.1)
                    else:
                        p.add_(g, alpha=-0.1)

    emb, emb2 = torch.nn.Embedding(50, 8, sparse=True), torch.nn.Embedding(50, 8, sparse=True)
    opt = SparseLoop([*emb.parameters(), *emb2.parameters()])
    idx = torch.tensor([1, 2, 3])

    def step():
        loss = (emb(idx) * emb2(idx)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ctx = _profiled_steps(tmp_path, step)
    assert hand_written_loops(ctx.trace, ctx.cpu_windows) == {}


@pytest.mark.slow
def test_a_step_under_torchs_class_name_is_hand_written_only_where_the_users_step_shows(tmp_path):
    """mvts-regression's RAdam is the repository's own, under torch.optim's class name: its step's frame
    (`optimizers.py(39): step`) shows inside `Optimizer.step#RAdam.step`. srgan's torch.optim.Adam, whose
    trace recorded no Python frame of its step, is torch's (per tensor on a CPU, foreach on CUDA)."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace.optimizer_loop import hand_written_loops
    from perfdoctor.trace.loader import load_trace as load

    base = _loop_adam()

    class Adam(base):  # type: ignore[misc, valid-type]
        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)

    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    x = torch.randn(4, 8)

    own = _profiled_steps(tmp_path, _mse_step(model, x, Adam(model.parameters())))
    assert list(hand_written_loops(own.trace, own.cpu_windows)) == ["Adam"]
    torchs = _profiled_steps(tmp_path, _mse_step(model, x, torch.optim.Adam(model.parameters(), foreach=False)))
    assert hand_written_loops(torchs.trace, torchs.cpu_windows) == {}
    # the same trace with no Python frame of the step (srgan's): still torch's
    path = tmp_path / "t.json"
    trace = json.loads(path.read_text())
    trace["traceEvents"] = [e for e in trace["traceEvents"]
                            if not (e.get("cat") == "python_function" and e["name"].endswith(": step"))]
    path.write_text(json.dumps(trace))
    stripped = load(path)
    from perfdoctor.facts.trace.context import TraceContext
    assert hand_written_loops(stripped, TraceContext(stripped, Facts(), None, "", None, None).cpu_windows) == {}


@pytest.mark.slow
def test_selections_whose_size_the_device_decides_are_syncs_of_the_gpu_step(tmp_path):
    """PointNet++'s farthest point sampling: `distance[mask] = dist[mask]` with `mask = dist < distance`,
    once per sampled point. On CUDA a boolean-mask index, `torch.nonzero` and `masked_select` wait for
    the device to count the selected elements. A CPU run's trace shows the ops that would (`aten::nonzero`
    under the indexing): one `selection` subject per line, located at the mask subscripts of the frame's
    function (the profiler names a frame by its first line) or at the call the frame made. `x[x < 0] = 0`
    (masked_fill_ underneath) selects nothing; a batch made by hand on the host (`host_fill.frame`) keeps
    its masks on the host on a GPU too; a GPU trace counts the syncs themselves."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace import mask_sync

    model = torch.nn.Linear(8, 8)

    def sample(xyz, n):
        distance = torch.full((xyz.shape[0],), 1e10)
        for _ in range(n):
            dist = (xyz - xyz[0]).pow(2).sum(-1)
            mask = dist < distance
            distance[mask] = dist[mask]
        return distance

    def make_batch():
        x = torch.randn(16, 8)
        return x[x.abs().sum(-1) > 0]

    def step():
        x = make_batch()
        out = model(x)
        out[out < 0] = 0
        keep = torch.nonzero(out.sum(-1) > -1)
        d = sample(out.detach(), 3)
        (out[keep.squeeze(-1)].sum() + d.sum()).backward()

    ctx = _profiled_steps(tmp_path, step)
    ctx.facts = _cuda_script_facts()
    ctx.facts.add("device.type", "cpu", "", "machine")
    frame = f"test_trace_facts.py({make_batch.__code__.co_firstlineno}): make_batch"
    ctx.facts.subject("host_fill", frame).add("frame", frame, "str", "run")
    mask_sync.add(ctx)
    got = {(os.path.basename(s.locations[0].file), s.locations[0].line): (
        s.facts["selection.count_per_step"].value, s.facts["selection.step_share"].value, s.facts["selection.ops"].value)
        for s in ctx.facts.of_kind("selection")}
    first = sample.__code__.co_firstlineno
    stepline = step.__code__.co_firstlineno
    assert got == {("test_trace_facts.py", first + 5): (6.0, 1.0, "aten::nonzero"),  # two selections, 3 points
                   ("test_trace_facts.py", stepline + 4): (1.0, 1.0, "aten::nonzero")}
    # a script that never leaves the CPU, or a GPU trace, adds none
    cpu_only = _profiled_steps(tmp_path, step)
    cpu_only.facts.add("script.targets_cuda", False, "bool", "static")
    mask_sync.add(cpu_only)
    assert not cpu_only.facts.of_kind("selection")


def test_mask_lines_are_subscripts_by_a_boolean_mask():
    """The comparisons, complements, boolean ops and bool-returning calls a subscript may select by,
    directly or through a name the function binds; an index by position is no mask."""
    import ast

    from perfdoctor.facts.trace.mask_sync import mask_lines

    src = textwrap.dedent("""\
        def f(x, idx, m):
            a = x[x > 0]
            b = x[~m]
            c = x[(x > 0) & (x < 1)]
            keep = torch.isfinite(x)
            d = x[:, keep]
            e = x[idx]
            g = x[0, 1:]
            x[m.type(torch.bool)] = 0
            h = x[x.eq(1)]
        def other(x):
            return x[x > 0]
        """)
    assert mask_lines(ast.parse(src), 1, "f") == [2, 3, 4, 6, 9, 10]
    assert mask_lines(ast.parse(src), 11, "other") == [12]
