"""Issue 25, a user's first hour, end to end: what perfdoctor leaves behind when a script fails,
and the scripted walkthrough (two scripts of a user's own, every command, Ctrl-C at three moments,
the CI recipe)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import run_cli

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
