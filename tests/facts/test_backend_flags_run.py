"""torch's backend flags as the run left them (capture/env.py `backend_flags`, meta.json's
`env.backends`) -> `cudnn.benchmark` / `cudnn.deterministic` from the run (facts/run/machine.py):
a flag set by a library the script runs, which no file of the user's shows."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from perfdoctor.capture.env import backend_flags
from perfdoctor.contracts.run import Env
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run import machine
from perfdoctor.facts.static import analyse_files
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge


def test_the_flags_are_read_as_the_script_left_them():
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        assert backend_flags(torch)["cudnn.benchmark"] is True
        torch.backends.cudnn.benchmark = False
        flags = backend_flags(torch)
        assert flags["cudnn.benchmark"] is False and flags["deterministic_algorithms"] is False
    finally:
        torch.backends.cudnn.benchmark = before


def _facts(tmp_path, backends):
    facts = Facts()
    env = Env(cpu_count=2, device="cpu", backends=backends)
    machine.add(SimpleNamespace(facts=facts, env=env, rank=None))  # type: ignore[arg-type]
    path = tmp_path / "train.py"  # a conv net for the GPU, the flag set nowhere in the user's files
    path.write_text("import torch\nimport torch.nn as nn\ndevice = torch.device('cuda')\n"
                    "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)).to(device)\n")
    analyse_files([path], facts)
    return facts


def test_a_flag_the_run_saw_on_is_set_though_no_user_file_sets_it(tmp_path):
    """A framework's trainer (Lightning's Trainer(benchmark=True) inside a helper package, a config
    system) turns cudnn.benchmark on: PD016 must not say it was never set."""
    on = _facts(tmp_path, {"cudnn.benchmark": True, "cudnn.deterministic": False})
    assert on.value("cudnn.benchmark") is True and on.get("cudnn.benchmark").source == "run"
    assert [f for f in judge(on, load_rules()) if f.rule == "PD016"] == []
    off = _facts(tmp_path, {"cudnn.benchmark": False, "cudnn.deterministic": False})
    assert off.get("cudnn.benchmark") is None  # off is torch's default: the GPU path may still set it
    assert [f.rule for f in judge(off, load_rules()) if f.rule == "PD016"] == ["PD016"]
    det = _facts(tmp_path, {"cudnn.benchmark": False, "deterministic_algorithms": True})
    assert det.value("cudnn.deterministic") is True
