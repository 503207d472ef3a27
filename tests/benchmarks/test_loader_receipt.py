"""benchmarks/loader_receipt.py: PD002's receipt cost per batch, and the fit that gives RECEIPT_* its numbers."""

import importlib.util
import sys

import pytest

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("loader_receipt", REPO / "benchmarks" / "loader_receipt.py")
assert _spec and _spec.loader
receipt = importlib.util.module_from_spec(_spec)
sys.modules["loader_receipt"] = receipt
_spec.loader.exec_module(receipt)


def test_the_fit_recovers_a_linear_cost():
    rows = [{"tensors": n, "bytes": b, "receipt_ms": 0.5 + 0.2 * n + 0.9 * b / 2**20}
            for n, b in receipt.SHAPES]
    got = receipt.fit(rows)
    assert got["base_ms"] == pytest.approx(0.5) and got["per_tensor_ms"] == pytest.approx(0.2)
    assert got["per_mb_ms"] == pytest.approx(0.9) and got["max_abs_residual_ms"] < 1e-9


def test_a_batch_from_a_worker_is_timed_apart_from_one_made_in_process():
    # one worker, a few small batches: the three medians are times, the worker's receipt more than nothing
    take, use, cpu = receipt.per_batch_ms(2, 64 << 10, 1, 8, 2.0)
    assert take > 0 and use >= 0 and cpu > 0
    zero = receipt.per_batch_ms(2, 64 << 10, 0, 6, 0.0)
    assert all(x >= 0 for x in zero)


@pytest.mark.slow  # a few seconds of training
def test_the_training_loop_times_its_parts():
    r = receipt.train_run(0, 8, steps=12)
    assert r["workers"] == 0 and r["step_ms"] > 0 and r["compute_ms"] > 0 and r["next_ms"] > 0
