"""What the history keeps of one run folder: the gate's run record (per-step series, counters,
findings, environment identity), the step-time summary, the contention figure, the findings with their
savings, and where the code stood (git commit, branch, a dirty tree)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.files import printable_data
from perfdoctor.contracts.report import read_report
from perfdoctor.gate.baseline import RunRecord, meta_and_steps, record_from_run_dir
from perfdoctor.history.store import HistoryRun
from perfdoctor.stats import quantile

# The environment that must match for two runs' timings to be compared (the gate's identity, less the
# script and its arguments, which the history filters on by themselves, plus the threads).
ENV_KEYS = ("torch", "device", "device_name", "device_count", "cpu_count", "cpu_model", "python", "threads")
GIT_TIMEOUT_S = 5.0
# CI systems name the commit and branch in their environment where a checkout has no branch (detached)
CI_COMMIT = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "CIRCLE_SHA1", "GIT_COMMIT")
CI_BRANCH = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH", "CIRCLE_BRANCH",
             "GIT_BRANCH")


def environment_key(env: dict[str, Any]) -> str:
    """A short fingerprint of the comparable environment (ENV_KEYS)."""
    ident = {k: env.get(k) for k in ENV_KEYS}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _git(folder: Path, *args: str) -> str | None:
    # GIT_OPTIONAL_LOCKS=0: `git status` must not refresh (write) the user's index
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(folder: Path | None) -> tuple[str | None, str | None, bool | None]:
    """(commit, branch, dirty) of the repository holding `folder`; the CI's variables where git has no
    branch (a detached checkout) or no repository; Nones where nothing says."""
    commit = branch = None
    dirty: bool | None = None
    if folder is not None and folder.is_dir():
        commit = _git(folder, "rev-parse", "--verify", "-q", "HEAD")
        if commit:
            branch = _git(folder, "symbolic-ref", "--short", "-q", "HEAD")
            status = _git(folder, "status", "--porcelain", "--untracked-files=no")
            dirty = None if status is None else bool(status)
    commit = commit or next((os.environ[k] for k in CI_COMMIT if os.environ.get(k)), None)
    branch = branch or next((os.environ[k] for k in CI_BRANCH if os.environ.get(k)), None)
    return commit, branch, dirty


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def entry_from_run_dir(run_dir: Path, kind: str, threads: str | None = None,
                       record: RunRecord | None = None) -> HistoryRun:
    """The history entry of a run folder (or a job folder) that has its report.json. `threads`: the
    OMP_NUM_THREADS the run was given, where known."""
    run_dir = Path(os.path.abspath(run_dir))
    meta, steps = meta_and_steps(run_dir)
    record = record or record_from_run_dir(run_dir)
    report = read_report(run_dir / "report.json") if (run_dir / "report.json").is_file() else None
    env = {**{k: v for k, v in msgspec.to_builtins(meta.env).items() if k in ENV_KEYS}, "threads": threads}
    script_path = meta.script or meta.module
    folder = Path(meta.script).parent if meta.script else (Path(meta.cwd) if meta.cwd else None)
    commit, branch, dirty = git_state(folder)
    findings = []
    for f in (report.findings if report is not None else []):
        loc = f.locations[0] if f.locations else None
        saving = f.estimated_saving.ms_per_step if f.estimated_saving is not None else None
        findings.append({"rule": f.rule, "fingerprint": f.identity(), "severity": f.severity, "title": f.title,
                         "file": loc.file if loc else None, "line": loc.line if loc else None, "saving_ms": saving})
    steady = record.step_ms
    source = str(run_dir)
    run = HistoryRun(
        key=hashlib.sha256(f"{source}\0{meta.started}".encode("utf-8", "surrogateescape")).hexdigest()[:20],
        kind=kind, source=source, started=meta.started, script=script_path,
        script_name=Path(meta.script).name if meta.script else meta.module,
        args=[str(a) for a in (record.env.get("args") or [])],  # type: ignore[union-attr]
        env_key=environment_key(env), env=env, record=record.to_doc(),
        recorded_at=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        git_commit=commit, git_branch=branch, git_dirty=dirty, steps=len(steps),
        median_ms=record.median_ms, p90_ms=quantile(steady, 0.9) if steady else None, gate_ms=record.gate_ms,
        cpu_wait_ms=_number(report.fact("cpu.wait_ms")) if report is not None else None,
        exit_code=meta.exit.code, findings=findings)
    # a non-UTF-8 name (surrogateescape) with its bytes as \xNN: text the store can hold
    return msgspec.convert(printable_data(msgspec.to_builtins(run)), HistoryRun)


def record_of(run: HistoryRun) -> RunRecord:
    """The gate's run record of a stored run (a baseline made from history)."""
    return RunRecord.from_doc(run.record)
