"""Every mechanical fix holds: apply the fix perfdoctor prints for a sample's finding to a copy of
the sample, run the fixed copy under perfdoctor, and check that it runs and the finding is gone.

PD001's fix (DataParallel -> DistributedDataParallel) needs a torchrun launch and rank-aware code:
perfdoctor shows it, it does not claim it can be applied mechanically, and it is left out here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perfdoctor.model import Fix
from perfdoctor.rules.fixes import apply_fix
from tests.helpers import SAMPLES, run_cli

pytestmark = pytest.mark.e2e  # runs real training scripts under perfdoctor

STEPS = 12
# (sample, rule): one per mechanical fix kind and rule that applies it
CASES = [
    ("pd002_dataloader_workers.py", "PD002"),   # call-kwargs: num_workers
    ("pd003_pin_memory.py", "PD003"),           # call-kwargs: pin_memory
    ("pd004_cpu_tensor_to_device.py", "PD004"),  # factory-device
    ("pd005_empty_cache.py", "PD005"),          # remove-call
    ("pd006_loss_graph_retained.py", "PD006"),  # detach-loss (a list)
    ("pd006_running_sum.py", "PD006"),          # detach-loss (a running sum)
    ("pd007_fp32_without_amp.py", "PD007"),     # wrap-autocast
]


def run(script: Path, out: Path) -> dict:
    p = run_cli("run", str(script), "--steps", str(STEPS), "--format", "json", "--out-dir", str(out),
                cwd=script.parent, timeout=300)
    assert p.returncode == 0, f"{script.name}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def findings_of(doc: dict, rule: str, file: Path) -> list[dict]:
    return [f for f in doc["findings"] if f["rule"] == rule
            and any(Path(l["file"]).name == file.name for l in f["locations"])]


@pytest.mark.parametrize("sample,rule", CASES, ids=[f"{r}-{s}" for s, r in CASES])
def test_fix_applies_runs_and_the_finding_goes(sample: str, rule: str, tmp_path: Path) -> None:
    script = tmp_path / sample
    shutil.copy(SAMPLES / sample, script)
    (finding,) = findings_of(run(script, tmp_path / "before"), rule, script)
    fix = finding["fix"]
    assert fix and not fix["example"], f"{rule} has no fix written against the sample's own line"
    fixed = apply_fix(script.read_text(), Fix(fix["before"], fix["after"], fix["note"], fix["example"]))
    assert fixed is not None, f"{rule}: the fix's `before` is not in the sample:\n{fix['before']}"
    script.write_text(fixed)
    compile(fixed, str(script), "exec")
    after = run(script, tmp_path / "after")
    assert findings_of(after, rule, script) == [], f"{rule} still reported after its fix:\n{fix['after']}"
