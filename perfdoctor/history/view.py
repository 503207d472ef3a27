"""A script's runs over time, as `perfdoctor history` shows them: each run's judged step time, the
change points and one-offs among them (changepoints.py), and what else changed at each change: the
environment (torch, CPU, device, threads) or the commit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfdoctor.errors import InputError
from perfdoctor.gate.baseline import MIN_STEPS, RunRecord
from perfdoctor.gate.stats import GATE_QUANTILE
from perfdoctor.history.changepoints import Segmentation, segment
from perfdoctor.history.entry import ENV_KEYS
from perfdoctor.history.store import HistoryRun, Store
from perfdoctor.stats import quantile

WALL = f"p{round(GATE_QUANTILE * 100)} of the steady steps"
WORK = f"p{round(GATE_QUANTILE * 100)} of the steady steps less the training thread's wait for a CPU"
NEAR = 2  # an environment change this many runs or fewer from a change point is named as its likely cause


@dataclass
class Shift:
    """A change point, with what changed around it."""

    index: int  # the first run (0-based, in the view's runs) at the new level
    before_ms: float
    after_ms: float
    env_changes: list[str]  # "torch 2.12.0 -> 2.13.0", near the change
    commits: tuple[str | None, str | None]  # the last commit before and the first at the new level

    @property
    def ratio(self) -> float:
        return self.after_ms / self.before_ms - 1


@dataclass
class HistoryView:
    store: str
    script: str | None
    branch: str | None
    runs: list[HistoryRun]  # oldest first
    values_ms: list[float | None]  # each run's judged step time (the gate's statistic, else the median)
    shifts: list[Shift] = field(default_factory=list)
    one_offs: list[int] = field(default_factory=list)  # runs (0-based) far from their level
    sigma: float | None = None  # run-to-run noise of log step time
    scripts: list[tuple[str, int]] = field(default_factory=list)  # every script stored, where none was chosen
    statistic: str = ""  # what values_ms is (WALL or WORK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": "perfdoctor/history/v1",
            "store": self.store, "script": self.script, "branch": self.branch,
            "scripts": [{"script": s, "runs": n} for s, n in self.scripts],
            "noise_rel_sd": None if self.sigma is None else round(self.sigma, 6), "statistic": self.statistic,
            "runs": [{"n": i + 1, "started": r.started, "kind": r.kind, "source": r.source,
                      "commit": r.git_commit, "branch": r.git_branch, "dirty": r.git_dirty, "args": r.args,
                      "environment": r.env, "environment_key": r.env_key, "steps": r.steps,
                      "step_ms": None if v is None else round(v, 4),
                      "median_ms": r.median_ms, "p90_ms": r.p90_ms, "cpu_wait_ms": r.cpu_wait_ms,
                      "exit_code": r.exit_code, "one_off": i in self.one_offs,
                      "findings": [{k: f.get(k) for k in ("rule", "severity", "title", "file", "line", "saving_ms")}
                                   for f in r.findings]}
                     for i, (r, v) in enumerate(zip(self.runs, self.values_ms))],
            "change_points": [{"run": s.index + 1, "before_ms": round(s.before_ms, 4), "after_ms": round(s.after_ms, 4),
                               "change": round(s.ratio, 4), "environment_changes": s.env_changes,
                               "commits": list(s.commits)} for s in self.shifts],
        }


def _values(runs: list[HistoryRun]) -> tuple[list[float | None], str]:
    """Each run's judged step time, and what it is. Where every run measured its training thread's
    wait for a CPU, the gate's statistic of the steps less that wait (what the gate judges on a busy
    host, gate.baseline.RunRecord.work_ms: a neighbour's load then moves no run); else of the steps."""
    records = [RunRecord.from_doc(r.record) for r in runs]
    if records and all(rec.work_ms and len(rec.work_ms) >= MIN_STEPS for rec in records):
        return [quantile(rec.work_ms, GATE_QUANTILE) for rec in records], WORK
    out: list[float | None] = []
    for r in runs:
        v = r.gate_ms if r.gate_ms else r.median_ms
        out.append(v if v and v > 0 else None)
    return out, WALL


def env_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two runs' environments, as "key old -> new"."""
    return [f"{k} {a.get(k)} -> {b.get(k)}" for k in ENV_KEYS if a.get(k) != b.get(k)]


def build(store: Store, *, script: str | None = None, branch: str | None = None, env: str = "all",
          last: int | None = None) -> HistoryView:
    """The view of one script's runs (`script`, or the only script stored); with several scripts and
    none chosen, only the list of scripts. `env`: `all`, `latest` (the newest run's environment) or
    an environment key."""
    scripts = store.scripts()
    if script is None:
        if len(scripts) != 1:
            return HistoryView(store=str(store.path), script=None, branch=branch, runs=[], values_ms=[], scripts=scripts)
        script = scripts[0][0]
    env_key = None
    if env == "latest":
        newest = store.runs(script=script, branch=branch, limit=1)
        env_key = newest[0].env_key if newest else None
    elif env != "all":
        env_key = env
    runs = store.runs(script=script, branch=branch, env_key=env_key, limit=last)
    if not runs and not any(s == script for s, _ in scripts):
        known = ", ".join(s for s, _ in scripts[:10]) or "none yet"
        raise InputError(f"history store {store.path}: no runs of {script!r} (scripts stored: {known})")
    values, statistic = _values(runs)
    timed = [i for i, v in enumerate(values) if v is not None]
    seg: Segmentation = segment([values[i] for i in timed])  # type: ignore[misc]  # timed: not None
    shifts = []
    for c in seg.changes:
        at = timed[c.index]
        prev = timed[c.index - 1] if c.index > 0 else at
        near = range(max(1, at - NEAR), min(len(runs), at + NEAR + 1))
        changes = [d for j in near for d in env_diff(runs[j - 1].env, runs[j].env)]
        shifts.append(Shift(index=at, before_ms=c.before_ms, after_ms=c.after_ms, env_changes=list(dict.fromkeys(changes)),
                            commits=(runs[prev].git_commit, runs[at].git_commit)))
    return HistoryView(store=str(store.path), script=script, branch=branch, runs=runs, values_ms=values,
                       shifts=shifts, one_offs=[timed[j] for j in seg.outliers], sigma=seg.sigma, scripts=scripts,
                       statistic=statistic)
