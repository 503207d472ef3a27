"""Issue 25, a user's first hour, end to end: what perfdoctor leaves behind when a script fails,
and the scripted walkthrough (two scripts of a user's own, every command, Ctrl-C at three moments,
the CI recipe)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TERMINAL_JOB, run_cli

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the child subreaper are Linux's")
def test_a_failing_script_leaves_no_process_behind(tmp_path: Path) -> None:
    # a helper that ignores SIGINT and SIGTERM, left behind by a script that then fails: re-parented to
    # PID 1 and sleeping on, before
    (tmp_path / "train.py").write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        " signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "open('helper.pid', 'w').write(str(p.pid))\n"
        "time.sleep(0.5)\n"
        "raise RuntimeError('boom')\n")
    p = run_cli("run", "train.py", "--out-dir", "run", cwd=tmp_path, timeout=120)
    helper = int((tmp_path / "helper.pid").read_text())
    try:
        assert p.returncode == 3, p.stderr[-2000:]
        assert not _alive(helper), "the script's helper outlived perfdoctor"
    finally:
        if _alive(helper):
            os.kill(helper, signal.SIGKILL)


# -- the walkthrough: two scripts of a user's own, every command, Ctrl-C at three moments, the CI recipe --

TRAIN = """
import argparse, time
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()
torch.set_num_threads(1)


class Slow(Dataset):
    def __len__(self):
        return 1_000_000  # one epoch outlasts a Ctrl-C test of a long run

    def __getitem__(self, i):
        time.sleep(0.0005)  # reading the sample
        return torch.randn(32), i % 4


device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Slow(), batch_size=32, num_workers=args.workers)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    acc = (model(x).argmax(1) == y).float().mean().item()
    if step + 1 >= args.steps:
        break
"""

STUCK = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        time.sleep(600)  # a network read that never returns
        return torch.zeros(4)


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Stuck(), batch_size=4, num_workers=2):
    model(x).sum().backward()
    opt.step()
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "COLUMNS": "120"}


def _tree_pids(root_pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(e))
    out, todo = set(), [root_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _ctrl_c(tmp_path: Path, args: list[str], when) -> tuple[subprocess.CompletedProcess, set[int]]:
    """`perfdoctor ARGS` in a session of its own (as a terminal's foreground job), Ctrl-C to its whole
    process group once `when(stderr so far)` holds; every process seen in its tree meanwhile."""
    err = tmp_path / f"stderr-{len(list(tmp_path.glob('stderr-*')))}.txt"
    with open(err, "w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "perfdoctor", *args], cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=fh, text=True, **TERMINAL_JOB)
        seen: set[int] = set()
        t0 = time.monotonic()
        while not when(err.read_text()):
            assert p.poll() is None and time.monotonic() - t0 < 120, err.read_text()[-3000:]
            seen |= _tree_pids(p.pid)
            time.sleep(0.2)
        seen |= _tree_pids(p.pid)
        os.killpg(p.pid, signal.SIGINT)  # the terminal's Ctrl-C reaches the whole foreground group
        out, _ = p.communicate(timeout=90)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err.read_text()), seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, process groups")
def test_a_users_first_hour(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    (tmp_path / "stuck.py").write_text(textwrap.dedent(STUCK))

    def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=tmp_path, timeout=timeout)

    # the help, the rules, a rule's documentation
    assert cli("--version").stdout.startswith("perfdoctor ")
    assert "run" in cli("--help").stdout
    assert cli("rules", "--format", "html").returncode == 2
    assert any(r["id"] == "PD002" for r in json.loads(cli("rules", "--format", "json").stdout))
    assert "num_workers" in cli("explain", "PD002").stdout
    # a typo and the script's own option before `--`: refused, with the way to write it
    p = cli("run", "train.py", "--workers", "2")
    assert p.returncode == 2 and "-- --workers 2" in p.stderr
    p = cli("--debug", "run", "nothere.py")
    assert p.returncode == 2 and "Traceback" in p.stderr

    # the first run: the planted mistakes at their lines, fixes that fit the code
    p = cli("run", "--debug", "train.py", "--out-dir", "runs/first", "--format", "json", "--", "--workers", "0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "perfdoctor: running train.py: starting" in p.stderr  # from the start, without a terminal
    doc = json.loads(p.stdout)
    by_rule = {f["rule"]: f for f in doc["findings"]}
    assert {"PD002", "PD008"} <= set(by_rule), [(f["rule"], f["title"]) for f in doc["findings"]]
    # the data wait: its fix is the --workers option's default, never a constant over args.workers
    fix = by_rule["PD002"]["fix"]
    assert fix["before"].startswith("parser.add_argument(\"--workers\"") and "default=" in fix["after"], fix
    # the host read every step: the fix is the flagged line itself, kept on the device
    fix = by_rule["PD008"]["fix"]
    assert fix["before"].strip().startswith("acc = ") and fix["after"].rstrip().endswith(".detach()"), fix
    # the report of the run folder, again and as a page; its saved report.json renders as it was judged,
    # another of its files points at the folder
    assert cli("report", "runs/first", "--format", "html", "--output", "first.html").returncode == 0
    assert 'id="summary"' in (tmp_path / "first.html").read_text() or not doc["findings"]
    assert cli("report", "runs/first/report.json").returncode == 0
    p = cli("report", "runs/first/steps.json")
    assert p.returncode == 2 and "give the folder" in p.stderr

    # the CI recipe: a baseline, then the gate (fewer runs than the README's three: a test's time)
    p = cli("run", "train.py", "--save-baseline", "base.json", "--repeats", "2", "--out-dir", "runs/base")
    assert p.returncode == 0 and (tmp_path / "base.json").is_file(), p.stderr[-3000:]
    # which repeat the status counts: a baseline adds runs while its own disagree (up to --max-repeats)
    assert "(run 1 of up to 8)" in p.stderr and "(run 2 of up to 8)" in p.stderr
    p = cli("run", "train.py", "--baseline", "base.json", "--repeats", "1", "--max-repeats", "1",
            "--max-regression", "50%", "--format", "github", "--out-dir", "runs/gate")
    assert p.returncode in (0, 1), p.stderr[-3000:]
    # compare: the first run had other arguments; judged only when told that was on purpose
    p = cli("compare", "runs/first", "runs/gate")
    assert p.returncode == 0 and "--allow-different-args" in p.stdout.replace("\n", " ")
    p = cli("compare", "runs/first", "runs/gate", "--allow-different-args", "--max-regression", "50%")
    assert p.returncode in (0, 1) and "judged anyway" in " ".join(p.stdout.split())

    # Ctrl-C at three moments; nothing of the script's is left running after any of them
    for args, when, check in (
            # while it starts (torch still importing)
            (["run", "train.py", "--out-dir", "runs/c1"], lambda e: "starting" in e, None),
            # in the middle of training
            (["run", "train.py", "--out-dir", "runs/c2", "--", "--steps", "100000"], lambda e: ": step " in e,
             lambda d: d["summary"]["steps_observed"] > 0),
            # stuck before its first step, in a DataLoader: the report says where
            (["run", "stuck.py", "--out-dir", "runs/c3"], lambda e: "waiting for the first step: 2" in e,
             lambda d: "stuck.py:" in d["notes"][0] and "DataLoader" in d["notes"][0])):
        p, seen = _ctrl_c(tmp_path, args, when)
        assert p.returncode == 130, p.stderr[-3000:]
        time.sleep(0.5)
        left = [pid for pid in seen if os.path.exists(f"/proc/{pid}") and _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"{args}: processes left running: {left}"
        if check is not None:
            d = json.loads((tmp_path / args[3] / "report.json").read_text())
            assert check(d), d["notes"]
    assert "No problems found by the rules" not in p.stdout  # the stuck run is no clean bill

    # a script with a syntax error: the error and its line, exit 3, nothing pretending to be a measurement
    (tmp_path / "broken.py").write_text("import torch\nx = (1,\ndef f(:\n")
    p = cli("run", "broken.py", "--out-dir", "runs/broken")
    assert p.returncode == 3 and "SyntaxError" in p.stderr
    text = " ".join(p.stdout.split())
    assert "(broken.py:3)" in text and "step time" not in text and "median" not in text
