"""The host-read probe in process (real torch): a library's read of a tensor that the user's call
handed it counts at the user's line (capture/probes/host_reads.py, `_through`)."""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from perfdoctor.capture.patches import ErrorLog  # noqa: E402
from perfdoctor.capture.probes.host_reads import HostReadProbe  # noqa: E402

pytestmark = pytest.mark.slow  # torch in this process: run by CI, not in the fast tier

LIBRARY = """\
import torch

_own = torch.ones(2)

def make_np(x):
    return x.detach().cpu().numpy()  # TensorBoard's way: a detached copy of what it was handed

def add_scalar(tag, scalar_value, global_step=None):
    return float(make_np(scalar_value))

def log_dict(metrics, step=None):
    return {k: v.item() for k, v in metrics.items()}

def own():
    return _own.sum().item()  # the library's own tensor: not the user's read
"""


def _line(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def _steps(lib, probe, loss):
    for step in range(3):
        lib.add_scalar("loss", loss, step)  # TensorBoard reads the tensor
        lib.log_dict({"loss": loss * 1}, step)  # a new tensor in a dict: read too
        lib.own()
        probe.end_step()


def test_a_librarys_read_of_a_tensor_the_users_call_handed_it_counts_at_the_users_line(tmp_path):
    folder = tmp_path / "site-packages"  # an installed package: not the user's code
    folder.mkdir()
    (folder / "fake_logger_lib.py").write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(folder))
    try:
        lib = importlib.import_module("fake_logger_lib")
        clock = SimpleNamespace(pc=time.perf_counter, exclude=lambda t0: None, steps=[], step_codes=None, in_batch=0)
        err = ErrorLog()
        probe = HostReadProbe(torch, clock, err)
        probe.install()
        try:
            _steps(lib, probe, torch.tensor(1.5, requires_grad=True) * 2)
        finally:
            probe.uninstall()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("fake_logger_lib", None)
    assert not err.items
    got = {(r.site.line, r.kind): r.counts_per_step for r in probe.records()}
    assert got == {(_line(_steps, "lib.add_scalar"), "cpu"): [1, 1, 1],
                   (_line(_steps, "lib.add_scalar"), "numpy"): [1, 1, 1],
                   (_line(_steps, "lib.log_dict"), "item"): [1, 1, 1]}
