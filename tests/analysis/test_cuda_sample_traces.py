"""`perfdoctor report` on CUDA traces of this project's own samples, recorded by `perfdoctor run` on an
NVIDIA H200 (torch 2.11.0+cu130, 2026-11-26; tests/data/README.md). Each sample's model is tiny, so on
that GPU every step is bound by kernel launches: the GPU waits for the host most of each step. What the
samples plant must be found at the user's line, and nothing the samples do right may be flagged."""

import pytest

from perfdoctor.analysis import analyse_path
from tests.helpers import TESTS

DATA = TESTS / "data" / "traces"
SAMPLES = ["clean", "pd002_dataloader_workers", "pd003_pin_memory", "pd004_cpu_tensor_to_device",
           "pd005_empty_cache", "pd007_fp32_without_amp", "pd017_copy_not_async", "pd021_optimizer_not_fused",
           # recorded by a second GPU session (2026-11-26, 23:37 UTC)
           "pd013_anomaly_detection", "pd016_cudnn_benchmark", "pd022_tf32_disabled"]


def trace(sample: str):
    return DATA / f"h200__{sample}.pt.trace.json.gz"


def rules_of(report):
    return [f.rule for f in report.findings]


@pytest.fixture(scope="module")
def reports():
    return {s: analyse_path(trace(s)) for s in SAMPLES}


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_real_cuda_timeline(reports, sample):
    r = reports[sample]
    assert r.facts["device.type"].value == "cuda"
    assert r.facts["kernels.launches_per_step"].value >= 20
    assert r.facts["step.gpu_kernel_ms"].value > 0 and 0 < r.facts["gpu.utilization"].value < 0.5


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s != "pd002_dataloader_workers"])
def test_tiny_models_on_an_h200_wait_for_kernel_launches(reports, sample):
    r = reports[sample]
    f = next(f for f in r.findings if f.rule == "PD009")
    assert f.severity == "high" and r.facts["gpu.idle_host_wait_ms"].value > 0.5 * r.facts["step.time_ms"].value


def test_the_clean_sample_gets_no_planted_rule(reports):
    # AdamW's own `torch.tensor(1.0)` step counts run under `optimizer.step()` and the batch's pinned
    # `.to(device)` in the same function: not a host tensor made to be copied (PD004, once, before)
    assert not {"PD001", "PD002", "PD003", "PD004", "PD005", "PD006", "PD007"} & set(rules_of(reports["clean"]))


@pytest.mark.parametrize("sample", ["pd003_pin_memory", "pd017_copy_not_async", "pd021_optimizer_not_fused"])
def test_library_factories_beside_a_batch_copy_are_not_pd004(reports, sample):
    assert "PD004" not in rules_of(reports[sample])


def test_a_host_tensor_copied_every_step_is_pd004_in_the_users_function(reports):
    f = next(f for f in reports["pd004_cpu_tensor_to_device"].findings if f.rule == "PD004")
    assert f.locations[0].file == "pd004_cpu_tensor_to_device.py" and f.locations[0].function == "main"
    assert any(e.name == "cpu_to_device.factory" and e.value == "aten::randn" for e in f.evidence)


def test_empty_cache_under_perfdoctors_probe_counts_once(reports):
    # the run's trace holds the probe's wrapper and torch's own `empty_cache` frame for each call
    found = [f for f in reports["pd005_empty_cache"].findings if f.rule == "PD005"]
    assert len(found) == 1, found
    assert found[0].locations[0].line == 27
    assert any(e.name == "empty_cache.calls_per_step" and e.value == 1.0 for e in found[0].evidence)


def test_the_data_wait_is_pd002_on_a_gpu_too(reports):
    r = reports["pd002_dataloader_workers"]
    assert rules_of(r)[0] == "PD002"
    assert r.findings[0].fraction_of_step > 0.5


def test_anomaly_modes_nan_checks_on_cuda(reports):
    # each gradient's check is isnan, any and a device-to-host read inside the engine's node evaluation
    share = reports["pd013_anomaly_detection"].facts["autograd.nan_check_fraction"].value
    assert 0.01 < share < 0.5
    assert all("autograd.nan_check_fraction" not in reports[s].facts for s in SAMPLES if s != "pd013_anomaly_detection")


def test_a_per_tensor_optimizer_step_is_timed_only_where_it_runs_per_tensor(reports):
    assert reports["pd021_optimizer_not_fused"].facts["optimizer_loop.saving_share"].value > 0.1
    assert all("optimizer_loop.saving_share" not in reports[s].facts for s in SAMPLES if s != "pd021_optimizer_not_fused")
