"""The run history (issue 23): every run remembered in one SQLite store (store.py), what is kept of a
run (entry.py), change points over a script's runs (changepoints.py), the view `perfdoctor history`
renders (view.py), and a gate baseline made of recorded runs (`baseline_from_history`)."""

from __future__ import annotations

import os
from pathlib import Path

from perfdoctor.errors import InputError
from perfdoctor.gate.baseline import Baseline, RunRecord, noise_floor
from perfdoctor.history.entry import entry_from_run_dir, record_of
from perfdoctor.history.store import Store, resolve_path

__all__ = ["Store", "resolve_path", "record_run", "baseline_from_history", "check_store"]


def check_store(path: Path | None) -> None:
    """Open an existing store once, before minutes of running: a damaged or foreign one fails now
    (exit 2), not after the run. A store that does not exist yet is made when the first run is kept."""
    if path is not None and os.path.lexists(path):
        Store(path, create=False).close()


def record_run(path: Path | None, run_dir: Path, kind: str, record: RunRecord | None = None) -> None:
    """Keep a finished run (its report.json written) in the store at `path` (None: history off)."""
    if path is None:
        return
    entry = entry_from_run_dir(run_dir, kind, threads=os.environ.get("OMP_NUM_THREADS"), record=record)
    with Store(path) as store:
        store.add(entry)


def baseline_from_history(path: Path | None, script_name: str, args: list[str], *, runs: int,
                          branch: str | None) -> Baseline:
    """A gate baseline of the newest `runs` recorded runs of the same script and arguments (on `branch`
    where given) that completed, in the environment of the newest of them: the gate itself then says
    where the current run's environment differs."""
    if path is None:
        raise InputError("--history-baseline needs the history store (it is off)")
    with Store(path, create=False) as store:
        found = [r for r in store.runs(script=script_name, branch=branch, kinds=("run", "gate"))
                 if r.args == args and r.exit_code == 0 and r.record.step_ms]
    if not found:
        where = f" on branch {branch}" if branch else ""
        raise InputError(f"history store {path}: no completed run of {script_name} with these arguments{where} "
                         f"to make a baseline from; record some with `perfdoctor run` first")
    newest_env = found[-1].env_key
    chosen = [r for r in found if r.env_key == newest_env][-runs:]
    records = [record_of(r) for r in chosen]
    return Baseline(records=records, noise=noise_floor(records),
                    created=chosen[-1].started or "", source=f"{path} ({len(records)} recorded run(s){' on ' + branch if branch else ''})")
