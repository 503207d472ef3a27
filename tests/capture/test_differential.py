"""perfdoctor must not change the program it measures: each script runs bare (`python script.py`)
and under `perfdoctor run` (`--format json --output`, so that stdout is the script's alone), and
the two runs must agree on the exit code, stdout, and every file the script wrote (byte for byte,
or, for a torch file whose bytes differ, tensor for tensor).

The scripts of tests/data/scripts/ (pickling and copying the user's objects, torch.compile (dynamo),
torch.jit.trace / torch.fx / torch.export before training, signal handlers, output files, an LBFGS
step of 20 closure evaluations) run to their end. The
sample scripts are seeded but long (a full epoch each): they run `--steps N` under perfdoctor, and
bare under a stopper that ends the script the way `--steps` does (SystemExit at the N-th optimizer
step), so that both print the same N steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, SAMPLES, run_cli

pytestmark = pytest.mark.e2e  # runs real training scripts, bare and under perfdoctor

SCRIPTS = REPO / "tests" / "data" / "scripts"
STEPS = 6
# the stopper: `--steps N` for a bare run (perfdoctor ends the script at the N-th optimizer step)
STOPPER = """
import runpy, sys
import torch.optim.optimizer as o
n = [0]
def post(opt, args, kwargs):
    n[0] += 1
    if n[0] >= {steps}:
        raise SystemExit(0)
o.register_optimizer_step_post_hook(post)
sys.argv = sys.argv[1:]
sys.path[0] = {folder!r}
{run}
"""

# (script or module, arguments, stop at N optimizer steps, compare through the stopper)
CASES: list[tuple[str, list[str], bool]] = [
    *[(p.name, [], True) for p in sorted(SAMPLES.glob("pd0*.py")) + [SAMPLES / "clean.py"]],
    ("crash_midway.py", [], False),
    ("exits_early.py", [], False),
    ("no_optimizer.py", [], False),
    ("needs_args.py", ["--epochs", "1", "--batches-per-epoch", "5"], False),
    ("pkg_entry", [], True),
]
OWN = ["pickling.py", "compiled.py", "signals_and_files.py", "lbfgs_long.py", "own_profiler.py", "traced.py",
       "grad_penalty.py"]


def _env() -> dict:
    return {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}


def _bare(target: Path, args: list[str], cwd: Path, steps: int | None) -> subprocess.CompletedProcess:
    module = target.is_dir()
    if steps is None:
        cmd = [sys.executable, *(["-m", target.name] if module else [str(target)]), *args]
    else:
        run = (f"runpy.run_module({target.name!r}, run_name='__main__', alter_sys=True)" if module
               else f"runpy.run_path({str(target)!r}, run_name='__main__')")
        code = STOPPER.format(steps=steps, folder=str(target.parent), run=run)
        cmd = [sys.executable, "-c", code, str(target), *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600,
                          check=False)


def _doctor(target: Path, args: list[str], cwd: Path, steps: int | None) -> subprocess.CompletedProcess:
    out = cwd.parent / f"{cwd.name}-perfdoctor"
    module = target.is_dir()
    cli = ["run", *(["-m", target.name] if module else [str(target)]), "--format", "json",
           "--output", str(out / "report.json"), "--out-dir", str(out / "run")]
    if steps is not None:
        cli += ["--steps", str(steps)]
    if args:
        cli += ["--", *args]
    # a package runs from its parent folder, as `python -m` needs
    return run_cli(*cli, cwd=target.parent if module else cwd, timeout=600, env={"PYTHONHASHSEED": "0"})


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _same_torch_file(a: bytes, b: bytes) -> bool:
    """Two torch.save files with the same tensors (bytes may differ only where torch's own are)."""
    import io

    import torch

    def flat(obj, pre=""):
        if isinstance(obj, torch.Tensor):
            return {pre: obj}
        if isinstance(obj, dict):
            return {k2: v2 for k, v in obj.items() for k2, v2 in flat(v, f"{pre}.{k}").items()}
        if isinstance(obj, (list, tuple)):
            return {k2: v2 for i, v in enumerate(obj) for k2, v2 in flat(v, f"{pre}[{i}]").items()}
        return {pre: obj}

    x, y = (flat(torch.load(io.BytesIO(d), weights_only=True)) for d in (a, b))
    return x.keys() == y.keys() and all(
        torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x)


def _compare(bare: subprocess.CompletedProcess, doc: subprocess.CompletedProcess, bare_dir: Path,
             doc_dir: Path) -> None:
    assert doc.stdout == bare.stdout, f"stdout differs\n--- bare\n{bare.stdout}\n--- perfdoctor\n{doc.stdout}\n{doc.stderr[-3000:]}"
    # perfdoctor's own exit code is the script's, except 3 for a script that failed (its report is written)
    expected = 3 if bare.returncode not in (0,) and "Traceback" in bare.stderr else bare.returncode
    assert doc.returncode == expected, f"exit {doc.returncode} != {expected}\n{doc.stderr[-3000:]}"
    a, b = _files(bare_dir), _files(doc_dir)
    assert a.keys() == b.keys(), f"files written differ: {sorted(a)} != {sorted(b)}"
    for name in a:
        if a[name] != b[name]:
            assert name.endswith((".pt", ".pth")) and _same_torch_file(a[name], b[name]), f"{name} differs"


def _run_pair(target: Path, args: list[str], tmp_path: Path, steps: int | None) -> None:
    bare_dir, doc_dir = tmp_path / "bare", tmp_path / "doc"
    bare_dir.mkdir()
    doc_dir.mkdir()
    bare = _bare(target, [a.replace("{out}", str(bare_dir)) for a in args], bare_dir, steps)
    doc = _doctor(target, [a.replace("{out}", str(doc_dir)) for a in args], doc_dir, steps)
    _compare(bare, doc, bare_dir, doc_dir)


@pytest.mark.parametrize("name", OWN)
def test_own_scripts_behave_as_bare(name: str, tmp_path: Path) -> None:
    # compiled.py's argv[1] is its dynamo backend (it writes no file): no folder for it
    args = {"lbfgs_long.py": ["40", "{out}/pred.pt"], "compiled.py": []}.get(name, ["{out}"])
    _run_pair(SCRIPTS / name, args, tmp_path, None)


@pytest.mark.parametrize(("name", "args", "stopped"), CASES, ids=[c[0] for c in CASES])
def test_samples_behave_as_bare(name: str, args: list[str], stopped: bool, tmp_path: Path) -> None:
    _run_pair(SAMPLES / name, args, tmp_path, STEPS if stopped else None)


def test_the_flop_probe_counts_one_step_and_leaves_the_program_as_it_is(tmp_path: Path) -> None:
    """FlopCounterMode runs over step 2 of the script (capture/probes/flops.py): the losses, the random
    numbers drawn after each step (dropout's RNG) and the saved weights are a bare run's, bit for bit,
    and the count is the hand count of the convolution and the Linear (tests/data/scripts/flop_step.py)."""
    import json

    _run_pair(SCRIPTS / "flop_step.py", ["{out}"], tmp_path, None)
    rec = json.loads((tmp_path / "doc-perfdoctor" / "run" / "probes.json").read_text())["flops"]
    assert rec["step"] == 2 and rec["flops"] == 2 * 442_368 + 3 * 491_520
    assert rec["ops"]["aten.convolution"] == 442_368
