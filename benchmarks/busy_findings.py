"""Findings beside a loaded host (issue 20): does load alone make timing rules fire, and is a real stall
still found?

    python benchmarks/busy_findings.py [--runs 10] [--load sustained|bursty|quiet] [--steps 150] [--keep DIR]

Runs `perfdoctor run` `--runs` times on each of benchmarks/steady_train.py (nothing to find: PD020,
PD002, PD012 and PD014 must not fire) and benchmarks/checkpoint_train.py (a torch.save every 15 steps:
PD020 must fire at the torch.save line), taken in turn, each beside the co-tenant of
benchmarks/gate_reliability.py (`sustained`: one busy process per core for the whole run). Prints per
run the rule ids found, the training thread's wait for a CPU and the load average, then the counts.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate_reliability import Load  # noqa: E402

STEADY, CHECKPOINT = ROOT / "benchmarks" / "steady_train.py", ROOT / "benchmarks" / "checkpoint_train.py"
LOAD_RULES = ("PD020", "PD002", "PD012", "PD014")


def save_line() -> int:
    return next(i for i, t in enumerate(CHECKPOINT.read_text().splitlines(), 1) if "torch.save(" in t)


def one_run(script: Path, steps: int, out: Path, load: str, seed: int) -> dict:
    cli = [sys.executable, "-m", "perfdoctor", "run", str(script), "--steps", str(steps), "--format", "json",
           "--overwrite", "--out-dir", str(out)]
    env = dict(os.environ, PERFDOCTOR_BENCH_STEPS="100000")
    before = os.getloadavg()[0]
    with Load(load, seed=seed):
        p = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, text=True)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    for big in ("trace.json.gz", "profile.pstats"):
        (out / big).unlink(missing_ok=True)
    findings = report.get("findings", [])
    contention = (report.get("summary") or {}).get("contention") or {}
    return {"exit": p.returncode, "error": (p.stderr.strip().splitlines() or [""])[-1] if p.returncode else "",
            "load": (before, os.getloadavg()[0]), "wait_share": contention.get("share"),
            "rules": [f["rule"] for f in findings],
            "pd020_lines": [loc.get("line") for f in findings if f["rule"] == "PD020"
                            for loc in f.get("locations", []) if Path(str(loc.get("file", ""))).name == CHECKPOINT.name]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--load", choices=("quiet", "sustained", "bursty"), default="sustained")
    p.add_argument("--keep", help="keep the run folders here")
    a = p.parse_args()
    line = save_line()
    t0 = time.time()
    steady_hits, ckpt_hits = 0, 0
    with tempfile.TemporaryDirectory() as d:
        root = Path(a.keep or d)
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, a.runs + 1):
            for name, script in (("steady", STEADY), ("checkpoint", CHECKPOINT)):
                r = one_run(script, a.steps, root / f"{a.load}-{name}-{n}", a.load, seed=n)
                if name == "steady":
                    bad = [x for x in r["rules"] if x in LOAD_RULES]
                    steady_hits += bool(bad)
                    verdict = f"load rules fired: {bad}" if bad else "no PD020/PD002/PD012/PD014"
                else:
                    found = line in r["pd020_lines"]
                    ckpt_hits += found
                    verdict = f"PD020 at line {line}: {'found' if found else 'MISSED'} (PD020 lines {r['pd020_lines']})"
                share = "?" if r["wait_share"] is None else f"{r['wait_share']:.0%}"
                if r["exit"]:
                    verdict += f"; perfdoctor said: {r['error']}"
                print(f"[findings] {a.load} {name} run {n}: exit {r['exit']}, rules {r['rules']}, CPU wait {share} "
                      f"of the step, load average {r['load'][0]:.1f}->{r['load'][1]:.1f}: {verdict}", flush=True)
    print(f"[findings] {a.load}: steady script with a load-only finding in {steady_hits}/{a.runs} runs; "
          f"checkpoint script's PD020 at line {line} in {ckpt_hits}/{a.runs} runs; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
