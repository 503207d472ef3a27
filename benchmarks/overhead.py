"""What does `perfdoctor run` cost? Runs benchmarks/train_300.py bare and under perfdoctor,
alternately, and prints each wall time and the median ratio (target: <= 1.2x).

    python benchmarks/overhead.py [--pairs 3] [--script benchmarks/train_300.py] [--fail-above 1.2]

Two numbers per run: the whole command's wall time (start-up, the run, perfdoctor's analysis and
report), and the training loop's own time as the script prints it (`train_loop_s=`), which shows
the cost of the probes and the profiled window inside the loop.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOOP = re.compile(r"train_loop_s=([0-9.]+)")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    m = LOOP.search(p.stdout + p.stderr)
    return wall, float(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--script", type=Path, default=REPO / "benchmarks" / "train_300.py")
    ap.add_argument("--omp-threads", type=int, default=None,
                    help="set OMP_NUM_THREADS for both runs (on a shared 2-core box, 1 keeps the noise down)")
    ap.add_argument("--fail-above", type=float, default=None, help="exit 1 if the median wall ratio is above this")
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if args.omp_threads:
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    py = sys.executable
    ratios, loop_ratios = [], []
    with tempfile.TemporaryDirectory(prefix="perfdoctor-overhead-") as tmp:
        timed([py, str(args.script)], env)  # warm the file cache once, not counted
        for i in range(1, args.pairs + 1):
            bare, bare_loop = timed([py, str(args.script)], env)
            run_dir = Path(tmp) / f"run{i}"
            pd, pd_loop = timed([py, "-m", "perfdoctor", "run", str(args.script), "--format", "json",
                                 "--output", str(Path(tmp) / f"report{i}.json"), "--out-dir", str(run_dir)], env)
            ratios.append(pd / bare)
            line = f"pair {i}: bare {bare:6.2f} s   perfdoctor {pd:6.2f} s   ratio {pd / bare:4.2f}x"
            if bare_loop and pd_loop:
                loop_ratios.append(pd_loop / bare_loop)
                line += f"   (loop: {bare_loop:5.2f} s vs {pd_loop:5.2f} s, {pd_loop / bare_loop:4.2f}x)"
            print(line, flush=True)
    med = statistics.median(ratios)
    print(f"median wall ratio: {med:.2f}x" + (f"   median loop ratio: {statistics.median(loop_ratios):.2f}x"
                                               if loop_ratios else "") + "   (target <= 1.20x)")
    return 1 if args.fail_above is not None and med > args.fail_above else 0


if __name__ == "__main__":
    sys.exit(main())
