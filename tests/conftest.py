"""Shared fixtures and collection. The helpers tests import (paths, `run_cli`, `expected_findings`) are in tests/helpers.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

try:  # pytest's own -m parser (private); without it every module is imported, as pytest does by default
    from _pytest.mark.expression import Expression
except ImportError:  # pragma: no cover
    Expression = None


@pytest.fixture
def fake_cuda(monkeypatch):
    """A fake CUDA layer (tests/fake_cuda.py) in place of torch.cuda for the test: one device;
    set `.count` for more. Imports torch, so only the tests that ask for it pay for that."""
    from tests.fake_cuda import FakeCuda, install

    return install(monkeypatch, FakeCuda())


_MODULE_MARK = re.compile(r"^pytestmark = pytest\.mark\.(\w+)\b", re.M)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave a test module unimported when its module-wide mark (`pytestmark = pytest.mark.slow` or
    `.e2e`) rules out every test in it under `-m` (the fast tier does not pay for importing torch,
    hypothesis or Playwright for tests it deselects). Exact: a test's own marks only add to its
    module's, so the module is left out only if the expression is false for any marks added."""
    expr = config.getoption("markexpr")
    if Expression is None or not expr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    found = _MODULE_MARK.search(collection_path.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return None
    others = [m for m in ("e2e", "slow") if m != found.group(1)]
    try:
        compiled = Expression.compile(expr)
        for added in itertools.product((False, True), repeat=len(others)):
            marks = {found.group(1), *(m for m, on in zip(others, added) if on)}
            if compiled.evaluate(lambda name, /, marks=marks, **_: name in marks):
                return None
    except Exception:  # noqa: BLE001  (another pytest's private parser: import the module, as pytest does)
        return None
    return True
