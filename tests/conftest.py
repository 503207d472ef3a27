"""Shared fixtures. The helpers tests import (paths, `run_cli`, `expected_findings`) are in tests/helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_cuda(monkeypatch):
    """A fake CUDA layer (tests/fake_cuda.py) in place of torch.cuda for the test: one device;
    set `.count` for more. Imports torch, so only the tests that ask for it pay for that."""
    from tests.fake_cuda import FakeCuda, install

    return install(monkeypatch, FakeCuda())
