"""Compute efficiency beyond the FLOP count (issue 22): PD034, Linear and convolution dimensions that
are not multiples of 8 under 16-bit, from the module trees the run called, at the line that built
the layer, with its share of the step's FLOPs (FlopCounterMode) and never on an fp32 or CPU-only script."""

from __future__ import annotations

from perfdoctor.contracts.run import FlopRecord, ForwardRecord, LayerGroup, ModuleTree, Probes, Site
from perfdoctor.facts.run import modules
from perfdoctor.facts.run.context import RunContext
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge

PD034 = [r for r in load_rules() if r.id == "PD034"]


def _ctx(*, autocast=True, dtype="float32", head_flops=700, device="cpu", targets_cuda=True, uses_amp=True,
         counted=True, params=None):
    group = LayerGroup(site=Site(file="/p/model.py", line=18, code="self.head = nn.Linear(dim, vocab)", function="__init__"),
                       direct=True, layer="Linear", count=1, params=5003 * 129, dims=["out_features 5003"],
                       names=["TinyLM.head"])
    fwd = ForwardRecord(site=Site(file="/p/train.py", line=30, code="model(idx)", function="main"), module="TinyLM",
                        calls=25, autocast=autocast, param_dtype=dtype, params=params,
                        tree=ModuleTree(modules=6, layers={"Linear": 3}, misaligned=[group]))
    flops = FlopRecord(step=2, flops=1000, modules={"TinyLM": 1000, "TinyLM.head": head_flops, "TinyLM.mlp.0": 150})
    ctx = RunContext(probes=Probes(forward=[fwd], flops=flops if counted else None))
    modules.add(ctx)
    ctx.facts.add("device.type", device, source="machine")
    ctx.facts.add("script.targets_cuda", targets_cuda, "bool", source="static")
    ctx.facts.add("script.uses_amp", uses_amp, "bool", source="static")
    return ctx


def test_a_misaligned_layer_under_autocast_is_found_at_the_line_that_built_it_with_its_flops_share():
    ctx = _ctx()
    (s,) = ctx.facts.subjects["misaligned"]
    assert s.key == "/p/model.py:18" and s.facts["misaligned.flops_share"].value == 0.7
    (f,) = judge(ctx.facts, PD034)
    assert f.rule == "PD034" and f.locations[0].line == 18 and "out_features 5003" in f.title and "70%" in f.title
    assert f.ms_per_step is None  # a CPU run: the cost is an estimate only on a GPU run
    assert f.fix is not None and "multiple of 8" in (f.fix.note or "")


def test_bf16_parameters_on_a_gpu_run_and_a_cpu_run_of_a_cuda_script_with_amp_in_the_source():
    assert judge(_ctx(autocast=False, dtype="bfloat16", device="cuda", uses_amp=False).facts, PD034)
    assert judge(_ctx(autocast=False, uses_amp=True).facts, PD034)  # CUDA autocast does nothing on a CPU run


def test_never_on_fp32_or_cpu_only_scripts_nor_for_a_small_share_of_the_flops():
    assert not judge(_ctx(autocast=False, uses_amp=False).facts, PD034)  # fp32 throughout
    assert not judge(_ctx(targets_cuda=False).facts, PD034)  # CPU bf16 autocast: no tensor cores
    assert not judge(_ctx(head_flops=10).facts, PD034)  # 1 % of the step's FLOPs


def test_without_a_counted_step_a_linear_is_judged_by_its_share_of_the_weights():
    """No step counted (compiled code, an early window): a Linear's FLOPs per token are twice its weights,
    so its share of the model's parameters stands in; a 10-way classifier head of a wide MLP is not flagged."""
    ctx = _ctx(counted=False, params=5003 * 129 * 4)
    (s,) = ctx.facts.subjects["misaligned"]
    assert "misaligned.flops_share" not in s.facts and s.facts["misaligned.weight_share"].value == 0.25
    assert judge(ctx.facts, PD034)
    assert not judge(_ctx(counted=False, params=5003 * 129 * 100).facts, PD034)  # 1 % of the weights
    assert judge(_ctx(counted=False).facts, PD034)  # the model's size unknown: flagged as before
