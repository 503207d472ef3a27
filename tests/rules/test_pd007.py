"""PD007 (rules/PD007-fp32-without-amp.toml), judged on hand-built facts: the hardware judged, a CPU run of a CUDA script.

Its sample: sample_scripts/pd007_fp32_without_amp.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd007_fp32_without_amp.* (tests/report/test_golden.py)."""

from __future__ import annotations

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run


def test_pd007_on_a_cpu_run_of_a_cuda_script():
    def run(uses_amp, targets=True, autocast=False, params=5_000_000):
        f = cpu_run()
        f.add("script.targets_cuda", targets, "", "static")
        f.add("script.uses_amp", uses_amp, "", "static")
        f.add("autocast.enabled", autocast, "", "run")
        f.add("model.param_dtype", "float32", "", "run")
        m = f.subject("model", "train.py:40")
        m.add("autocast", autocast, "", "run")
        m.add("params", params, "count", "run")
        m.locations.append(Location("train.py", 40, "out = model(x)"))
        return judge(f, RULES)
    (finding,) = run(uses_amp=False)  # a CPU without AMX: still a GPU problem of a CUDA script
    assert finding.rule == "PD007" and finding.ms_per_step is None
    assert finding.saving_basis.startswith("GPU-only") and "n/a" not in finding.title
    assert "CUDA-targeting" in finding.title
    assert run(uses_amp=True) == []  # nanoGPT: autocast on the CUDA path only counts as autocast
    assert run(uses_amp=False, targets=False) == []  # a CPU script on a CPU without AMX
    assert run(uses_amp=False, autocast=True) == []
    assert run(uses_amp=False, params=500_000) == []  # a tiny MLP: launch-bound on a GPU


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
