"""Does `perfdoctor history` find a real step change, and only that one?

Runs benchmarks/steady_train.py N times (default 30) under `perfdoctor run --history STORE`, the
runs from --change-at on (default 20) slowed by --slowdown (default 15 %: the script sleeps that
fraction of each step's work), then reads `perfdoctor history --format json` and prints the change
points found and whether they match: one change, within 2 runs of the planted one. Prints the load
average beside the figures (the machine is shared).

    python benchmarks/history_changepoint.py [--runs 30] [--change-at 20] [--slowdown 0.15] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--change-at", type=int, default=20, help="the first slowed run (1-based)")
    ap.add_argument("--slowdown", type=float, default=0.15)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="perfdoctor-history-"))
    store = work / "history.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "PERFDOCTOR_BENCH_STEPS": "100000"}
    loads = []
    t0 = time.time()
    for n in range(1, args.runs + 1):
        delay = args.slowdown if n >= args.change_at else 0.0
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", str(REPO / "benchmarks" / "steady_train.py"),
                            "--steps", str(args.steps), "--history", str(store), "--out-dir", str(work / f"run-{n}"),
                            "--format", "json", "--output", str(work / f"run-{n}.json")],
                           env={**env, "PERFDOCTOR_BENCH_DELAY_FRACTION": str(delay)}, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"run {n} failed ({p.returncode}): {p.stderr[-400:]}", file=sys.stderr)
            return 1
        loads.append(os.getloadavg()[0])
        print(f"run {n}/{args.runs} done (delay {delay:.2f}, load {loads[-1]:.1f})", file=sys.stderr)
    out = subprocess.run([sys.executable, "-m", "perfdoctor", "history", "--history", str(store), "--format", "json"],
                         env=env, capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    found = [c["run"] for c in doc["change_points"]]
    ok = len(found) == 1 and abs(found[0] - args.change_at) <= 2
    print(json.dumps({
        "runs": args.runs, "planted_at": args.change_at, "slowdown": args.slowdown, "change_points": doc["change_points"],
        "one_offs": [r["n"] for r in doc["runs"] if r["one_off"]],
        "step_ms": [r["step_ms"] for r in doc["runs"]], "noise_rel_sd": doc["noise_rel_sd"],
        "matches": ok, "load_avg_min_max": [round(min(loads), 1), round(max(loads), 1)],
        "minutes": round((time.time() - t0) / 60, 1)}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
