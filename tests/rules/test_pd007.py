"""PD007 (rules/PD007-fp32-without-amp.toml), judged on hand-built facts: the hardware judged, a CPU run of a CUDA script.

Its sample: sample_scripts/pd007_fp32_without_amp.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd007_fp32_without_amp.* (tests/report/test_golden.py)."""

from __future__ import annotations

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run


def _cuda_script_on_cpu(uses_amp=False, targets=True, autocast=False, params=5_000_000, share=0.2, math_params=None):
    f = cpu_run()
    f.add("script.targets_cuda", targets, "", "static")
    f.add("script.uses_amp", uses_amp, "", "static")
    f.add("autocast.enabled", autocast, "", "run")
    f.add("model.param_dtype", "float32", "", "run")
    if share is not None:  # the step estimated for the reference GPU (facts/trace/target_gpu.py)
        f.add("target_gpu.reference", "NVIDIA A100 (datasheet)", "str", "trace")
        f.add("target_gpu.math_ms", 2.0 * share / (1 - share), "ms", "trace")
        f.add("target_gpu.step_ms", 2.0 / (1 - share), "ms", "trace")
        f.add("target_gpu.math_share", share, "ratio", "trace")
        f.add("target_gpu.amp_saving_ms", 1.5 * share / (1 - share), "ms", "trace")
    m = f.subject("model", "train.py:40")
    m.add("autocast", autocast, "", "run")
    m.add("params", params, "count", "run")
    if math_params is not None:
        m.add("math_params", math_params, "count", "run")
    m.locations.append(Location("train.py", 40, "out = model(x)"))
    return judge(f, RULES)


def test_pd007_on_a_cpu_run_of_a_cuda_script():
    (finding,) = _cuda_script_on_cpu()  # a CPU without AMX: still a GPU problem of a CUDA script
    assert finding.rule == "PD007" and finding.ms_per_step is None
    assert finding.saving_basis.startswith("GPU-only") and "n/a" not in finding.title
    assert "CUDA-targeting" in finding.title
    assert _cuda_script_on_cpu(uses_amp=True) == []  # nanoGPT: autocast on the CUDA path only counts as autocast
    assert _cuda_script_on_cpu(targets=False) == []  # a CPU script on a CPU without AMX
    assert _cuda_script_on_cpu(autocast=True) == []


def test_pd007_judges_a_cpu_run_by_the_model_or_the_step_estimated_for_the_reference_gpu():
    """A 0.27 M-parameter conv net whose fp32 math is a fifth of the estimated GPU step is flagged (the
    2 M floor alone missed it). A model of 2 M parameters or more is flagged whatever the estimate at
    this run's scale says: a CPU run is given smaller batches and images than the GPU run (unet-carvana
    2 %, timm-train 1.5 % of the estimated step in the corpus's CPU runs, both labelled). A small model
    whose estimated step is bound by its launches is not."""
    (small,) = _cuda_script_on_cpu(params=270_000, share=0.2)
    assert small.ms_per_step is None  # GPU-only: the estimate is said, not measured
    assert "Estimated for a reference GPU, NVIDIA A100" in small.saving_basis and "(20%;" in small.saving_basis
    assert {e.name for e in small.evidence} >= {"target_gpu.math_share", "target_gpu.amp_saving_ms"}
    assert _cuda_script_on_cpu(params=270_000, share=0.02) == []
    assert _cuda_script_on_cpu(params=270_000, share=None) == []  # no estimate, a small model: nothing says
    assert len(_cuda_script_on_cpu(params=270_000, share=0.05)) == 1  # the GPU run's material share, 5 %
    assert len(_cuda_script_on_cpu(params=5_000_000, share=0.02)) == 1
    assert len(_cuda_script_on_cpu(params=50_000_000, share=None)) == 1


def test_pd007_weighs_a_model_by_the_parameters_that_multiply():
    """A 5 M-parameter word model whose vocabulary table holds all but 0.2 M of them does little math:
    its size says nothing of its GPU step; the estimate's share decides, as for any small model."""
    assert _cuda_script_on_cpu(params=5_000_000, math_params=200_000, share=0.02) == []
    assert len(_cuda_script_on_cpu(params=5_000_000, math_params=200_000, share=0.2)) == 1
    assert len(_cuda_script_on_cpu(params=5_000_000, math_params=4_000_000, share=0.02)) == 1


@pytest.mark.parametrize("amp,autocast,fires", [(False, False, False), (True, True, False), (True, False, True)])
def test_pd007_judges_the_hardware(amp, autocast, fires):
    f = Facts()
    f.add("step.time_ms", 100.0, "ms", "run")
    f.add("device.type", "cuda", "", "machine")
    f.add("device.amp_available", amp, "", "machine", "CUDA capability 8.0 >= 7.0")
    f.add("autocast.enabled", autocast, "", "run")
    f.add("model.param_dtype", "float32", "", "run")
    f.add("matmul.fp32_share", 0.9, "ratio", "trace")
    f.add("matmul.ms", 40.0, "ms", "trace")
    found = [x for x in judge(f, RULES) if x.rule == "PD007"]
    assert bool(found) == fires
    if fires:
        assert found[0].ms_per_step == pytest.approx(40.0 * 0.9 * 0.5)


@pytest.mark.parametrize("flops", [212_480.0, 30e9])
def test_pd007_is_quiet_on_a_cpu_only_script_even_with_amx(flops):
    """A script that never leaves the CPU, on an AMX CPU: like every GPU-only rule, PD007 does not judge
    it, however much of its step is matmul arithmetic (30 GFLOP at 60 GFLOP/s was flagged before: the
    corpus's CPU-only tutorials, nlp-tutorial's Transformer and BERT, are labelled not a problem)."""
    f = cpu_run(step_ms=1500.0)
    f.add("device.amp_available", True, "", "machine", "CPU with AMX (bf16 autocast)")
    f.add("autocast.enabled", False, "", "run")
    f.add("model.param_dtype", "float32", "", "run")
    f.add("matmul.fp32_share", 1.0, "ratio", "trace")
    f.add("matmul.ms", 600.0, "ms", "trace")
    f.add("compute.flops_per_step", flops, "number", "trace")
    f.add("compute.peak_flops", 60e9, "number", "run")
    assert [x for x in judge(f, RULES) if x.rule == "PD007"] == []
