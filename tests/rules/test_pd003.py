"""PD003 (rules/PD003-dataloader-pin-memory.toml), judged on hand-built facts: only where batches go to CUDA, measured on a GPU trace, never for an evaluation loader.

Its sample: sample_scripts/pd003_pin_memory.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd003_pin_memory.* (tests/report/test_golden.py)."""

from __future__ import annotations

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run, ids, loader


def test_pd003_only_where_batches_go_to_cuda():
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=False)
    assert "PD003" not in ids(judge(f, RULES))
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=True, feeds_cuda=True)
    assert "PD003" not in ids(judge(f, RULES))
    # a CPU run's pin_memory=False says nothing of the GPU path: only the source's value there counts
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True)
    assert "PD003" not in ids(judge(f, RULES))
    for on_cuda, fires in ((True, False), (False, True)):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True).add("pin_memory_on_cuda", on_cuda, "", "static")
        assert ("PD003" in ids(judge(f, RULES))) is fires
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD003" and finding.ms_per_step is None
    assert finding.saving_basis.startswith("GPU-only, not measured on this run: this run had no GPU")
    assert "no number" in finding.saving_basis and finding.confidence == "medium"
    # on a GPU run the run's own value decides
    f = cpu_run()
    f.add("device.type", "cuda", "", "machine")
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True).add("pin_memory_on_cuda", True, "", "static")
    assert "PD003" in ids(judge(f, RULES))


def test_pd003_not_where_the_script_names_no_cuda_device():
    """torch-rechub's criteo example: `--device` defaults to 'cpu', no file names a CUDA device, and the
    source moves its batches with `.to(self.device)` (dataloader.feeds_cuda from the source). Judged as
    the CPU-only script it is by default, as every other GPU-only rule judges it."""
    for targets, fires in ((False, False), (True, True)):
        f = cpu_run()
        f.add("script.targets_cuda", targets, "", "static")
        loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True).add("pin_memory_on_cuda", False, "", "static")
        assert ("PD003" in ids(judge(f, RULES))) is fires


def test_pd003_measured_on_gpu_trace():
    f = Facts()
    f.add("step.time_ms", 50.0, "ms", "trace")
    f.add("copies.h2d_pageable_per_step", 2, "count", "trace")
    f.add("copies.h2d_pageable_ms", 4.0, "ms", "trace")
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD003"]
    assert finding.ms_per_step == pytest.approx(2.0)
    assert finding.saving_basis == "measured in this trace"


def test_pd003_not_for_an_evaluation_loader():
    for trains, fires in ((False, False), (True, True)):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        s = loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True)
        s.add("pin_memory_on_cuda", False, "", "static")
        s.add("trains", trains, "", "static")
        assert ("PD003" in ids(judge(f, RULES))) is fires


def test_pd003_saves_the_time_the_cpu_waits_in_pageable_copies():
    # as on an H200 (docs/gpu.md): small pageable copies take microseconds on the GPU and hold the CPU
    # in cudaMemcpyAsync over ten times as long; pinned and non_blocking, the call returns at once
    f = Facts()
    f.add("step.time_ms", 8.0, "ms", "trace")
    f.add("device.type", "cuda", "", "trace")
    f.add("copies.h2d_pageable_per_step", 2, "count", "trace")
    f.add("copies.h2d_pageable_ms", 0.02, "ms", "trace")
    f.add("copies.h2d_pageable_host_ms", 0.3, "ms", "trace")
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD003"]
    assert finding.ms_per_step == pytest.approx(0.3)
    f = Facts()  # the same copies holding the CPU under the threshold: nothing worth a finding
    f.add("device.type", "cuda", "", "trace")
    f.add("copies.h2d_pageable_per_step", 2, "count", "trace")
    f.add("copies.h2d_pageable_ms", 0.2, "ms", "trace")
    f.add("copies.h2d_pageable_host_ms", 0.05, "ms", "trace")
    assert "PD003" not in ids(judge(f, RULES))
