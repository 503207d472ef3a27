"""benchmarks/gpu_smoke.py: the harness a GPU session runs first. Its pieces here; its dry run
(the same harness on the CPU, GPUs hidden) end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "benchmarks" / "gpu_smoke.py")
assert _spec is not None and _spec.loader is not None
gpu_smoke = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_smoke)


def test_every_training_sample_is_run_and_exit_path_samples_are_not():
    names = [p.name for p in gpu_smoke.samples([])]
    assert "clean.py" in names and "pd002_dataloader_workers.py" in names and "pd014_slow_dataset_fixed.py" in names
    assert not {"crash_midway.py", "exits_early.py", "needs_args.py"} & set(names)
    assert [p.name for p in gpu_smoke.samples(["pd003"])] == ["pd003_pin_memory.py", "pd003_pin_memory_fixed.py"]


def test_steady_median_drops_the_warm_up():
    assert gpu_smoke.steady_median([500.0, 300.0] + [10.0] * 8) == 10.0
    assert gpu_smoke.steady_median([]) is None


def test_table_has_a_row_per_sample_with_ratio_findings_and_trace_size():
    rows = [{"sample": "a.py", "bare_ms": 10.0, "step_ms": 11.0, "findings": ["PD002"], "device_type": "cuda",
             "trace_bytes": 2048, "trace_json_bytes": 3 << 20},
            {"sample": "b.py", "bare_ms": None, "error": "Traceback: boom"}]
    out = gpu_smoke.table(rows).splitlines()
    assert "1.10x" in out[2] and "PD002" in out[2] and "2.0 KB" in out[2] and "3.0 MB" in out[2] and "cuda" in out[2]
    assert "boom" in out[3] and " - " in out[3]


@pytest.mark.e2e
def test_dry_run_runs_a_sample_bare_and_under_perfdoctor(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_smoke.py"), "--dry-run", "--steps", "10",
                        "--only", "clean", "--json", "--keep", str(tmp_path), "--rows", str(tmp_path / "rows.jsonl")],
                       cwd=REPO,
                       capture_output=True, text=True, timeout=600,
                       env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = json.loads(p.stdout)
    assert row["sample"] == "clean.py" and row["exit"] == 0 and row["device_type"] == "cpu"
    assert row["bare_ms"] > 0 and row["step_ms"] > 0 and row["findings"] == []
    assert row["trace_bytes"] > 0 and (tmp_path / "clean" / "trace.json.gz").is_file()
    # --rows: the same row, appended as soon as it was measured, with the load beside it
    (kept,) = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert kept == row and kept["load"] >= 0
