"""Do the checklist rules' predicted savings hold? For each rule, runs its sample and its fixed twin
under `perfdoctor run` (alternately, a few repeats) and prints the saving the rule predicts on the
sample against the measured one: the sample's mean steady step less the twin's.

    python benchmarks/checklist_savings.py [--repeats 3] [--steps 40] [--rules PD015,PD018,PD020,PD027]

The mean, not the median, step: PD015's and PD020's costs land on some steps only (an epoch's
first, every N-th), and their saving is that cost spread over every step. Exit 1 when a rule did
not fire on its sample or a prediction is off by more than 25 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_scripts"
PAIRS = {
    "PD015": "pd015_persistent_workers",
    "PD018": "pd018_too_many_workers",
    "PD020": "pd020_periodic_stall",
    "PD027": "pd027_gc_in_loop",
}
TOLERANCE = 0.25


def run(script: Path, steps: int, out: Path, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "perfdoctor", "run", str(script), "--steps", str(steps), "--format", "json",
           "--out-dir", str(out), "--overwrite"]
    p = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rules", default=",".join(PAIRS))
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for rule in args.rules.split(","):
            stem = PAIRS[rule]
            predicted, measured = [], []
            for k in range(args.repeats):
                doc = run(SAMPLES / f"{stem}.py", args.steps, Path(tmp) / f"{stem}-{k}", env)
                twin = run(SAMPLES / f"{stem}_fixed.py", args.steps, Path(tmp) / f"{stem}-fixed-{k}", env)
                f = next((f for f in doc["findings"] if f["rule"] == rule), None)
                if f is not None and f["estimated_saving"] is not None:
                    predicted.append(f["estimated_saving"]["ms_per_step"])
                if any(x["rule"] == rule for x in twin["findings"]):
                    print(f"{rule}: fired on its fixed twin (repeat {k + 1})", file=sys.stderr)
                    ok = False
                measured.append(doc["summary"]["step_time_ms"]["mean"] - twin["summary"]["step_time_ms"]["mean"])
                print(f"{rule} repeat {k + 1}: predicted {predicted[-1] if len(predicted) > k else None} ms, "
                      f"measured {measured[-1]:.1f} ms", file=sys.stderr)
            pred = statistics.median(predicted) if predicted else None
            meas = statistics.median(measured)
            ratio = pred / meas if pred is not None and meas > 0 else None
            within = ratio is not None and abs(ratio - 1) <= TOLERANCE
            ok &= within and len(predicted) == args.repeats
            rows.append((rule, len(predicted), pred, meas, ratio, within))
    print(f"{'rule':6} {'fired':>5} {'predicted ms/step':>18} {'measured ms/step':>17} {'ratio':>6}  within 25 %")
    for rule, fired, pred, meas, ratio, within in rows:
        print(f"{rule:6} {fired:>3}/{args.repeats} {pred if pred is None else f'{pred:.1f}':>18} {meas:>17.1f} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>6}  {'yes' if within else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
