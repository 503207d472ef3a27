"""Shared test helpers: the repository's paths, the perfdoctor CLI in a subprocess, the `# expect:` lines of a
sample. Tests import them as `from tests.helpers import ...`; conftest.py holds the fixtures."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# the recorded traces the trace tests read
TRACES = TESTS / "data" / "traces"
HTA = TRACES / "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
KINETO = TRACES / "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
MI300 = TRACES / "tracelens__mi300__resnet_act_checkpoint.json.gz"
DLRM = TRACES / "param__dlrm_kineto_8ranks"
CPU = TRACES / "torch213_cpu_mlp_dataloader.pt.trace.json.gz"
SAMPLES = REPO / "sample_scripts"
EXPECT = re.compile(r"#\s*expect:\s*((?:PD\d{3}[,\s]*)+)")


def expected_findings(script: Path) -> set[tuple[str, int]]:
    """{(rule, line)} from the trailing `# expect: PD00N` comments of a sample script."""
    out = set()
    for n, text in enumerate(script.read_text().splitlines(), 1):
        m = EXPECT.search(text)
        if m:
            out |= {(rule, n) for rule in re.findall(r"PD\d{3}", m.group(1))}
    return out


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Popen arguments for a process started as a terminal's foreground job: a session of its own, and
# SIGINT at its default even where the tests inherited it ignored (a CI job started with `&` by a
# shell without job control, or under nohup: its children ignore Ctrl-C, as perfdoctor rightly keeps)
TERMINAL_JOB: dict = {"start_new_session": True, "preexec_fn": _sigint_default}


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 180,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m perfdoctor ARGS` from the repo's sources; text stdout/stderr.

    One OpenMP thread unless the caller's environment says otherwise: the 2-core CI box is shared
    with pytest and other jobs, and two spinning OpenMP threads there inflate compute up to 30x at
    random, which would turn the data-bound PD002 sample compute-bound and the timings into noise.
    """
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": path, "COLUMNS": "200", "NO_COLOR": "1",
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "perfdoctor", *args], cwd=cwd or REPO,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
