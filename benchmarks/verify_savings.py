"""Do perfdoctor's predicted savings hold? `perfdoctor verify` on every sample that has a fixed twin
(sample_scripts/X.py and X_fixed.py), and the predicted / measured saving per rule.

    python benchmarks/verify_savings.py [--steps 20] [--only pd027 ...] [--twin] [--json PATH]

For each sample: `perfdoctor verify SAMPLE --steps N --format json` on a copy of the sample (in a
temporary folder), one row per finding of the sample's expected rules (its `# expect:` lines) with its
verification: the verdict, predicted and measured ms per step, the measured saving's 90% interval,
the runs, and the load average (1 min) before and after. With `--twin`, the hand-written fixed twin is
measured too, as an independent check of verify's number: the sample and its twin alternated under the
same capture and the same statistic (perfdoctor.verify.saving_interval), `--twin-pairs` pairs.

Then per rule: the median of predicted / measured over its rows where both are positive, and whether it
lies inside 0.75..1.33 (a rule outside needs its model fixed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_scripts"
sys.path.insert(0, str(REPO))

EXPECT = re.compile(r"#\s*expect:\s*((?:PD\d{3}[,\s]*)+)")
ENV = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}


def expected(script: Path) -> set[str]:
    return {r for line in script.read_text().splitlines() for m in [EXPECT.search(line)] if m
            for r in re.findall(r"PD\d{3}", m.group(1))}


def load() -> float:
    return os.getloadavg()[0]


def twin_saving(sample: Path, twin: Path, steps: int, pairs: int, work: Path) -> tuple[float, float, float] | None:
    """The sample less its fixed twin, alternated under perfdoctor's capture: (point, lo, hi) ms/step."""
    from perfdoctor.capture.runner import run_script
    from perfdoctor.verify import saving_interval, steady

    sides: dict[str, list[list[float]]] = {"a": [], "b": []}
    for k in range(2 * pairs):
        side, script = ("a", sample) if k % 2 == 0 else ("b", twin)
        r = run_script(str(script), out_dir=work / f"twin-{side}-{k}", steps=steps, window=(steps - 1, 0, 1),
                       cwd=script.parent, quiet=True)
        if r.exit_code != 0:
            return None
        sides[side].append(steady(r.run_dir))
    _, point, lo, hi = saving_interval(sides["a"], sides["b"])
    return point, lo, hi


def one(sample: Path, steps: int, twin: bool, twin_pairs: int, work: Path) -> list[dict]:
    script = work / sample.name
    shutil.copy(sample, script)
    fixed = work / sample.name.replace(".py", "_fixed.py")
    shutil.copy(sample.with_name(sample.stem + "_fixed.py"), fixed)
    l0 = load()
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "verify", str(script), "--steps", str(steps), "--format",
                        "json", "--out-dir", str(work / "run")], cwd=work, env=ENV, capture_output=True, text=True,
                       timeout=3600)
    l1 = load()
    if p.returncode != 0 or not p.stdout.strip():
        return [{"sample": sample.name, "rule": "-", "error": (p.stderr.strip().splitlines() or ["?"])[-1][:160]}]
    doc = json.loads(p.stdout)
    want = expected(sample)
    rows = []
    independent = twin_saving(script, fixed, steps, twin_pairs, work) if twin else None
    for f in doc["findings"]:
        if f["rule"] not in want or not any(Path(l["file"]).name == script.name for l in f["locations"]):
            continue
        v = f.get("verification") or {}
        saving = f.get("estimated_saving") or {}
        rows.append({"sample": sample.name, "rule": f["rule"], "verdict": v.get("verdict"), "kind": v.get("kind"),
                     "predicted_ms": saving.get("ms_per_step"), "measured_ms": v.get("measured_ms_per_step"),
                     "interval_ms": v.get("interval_ms"), "step_ms": v.get("step_ms"), "runs": v.get("runs"),
                     "why": v.get("why"), "load": [round(l0, 2), round(l1, 2)],
                     "twin_ms": list(independent) if independent else None})
    if not rows:
        rows.append({"sample": sample.name, "rule": ",".join(sorted(want)), "error": "no expected finding reported"})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", action="append", help="a sample name's start, e.g. pd027 (repeatable)")
    ap.add_argument("--twin", action="store_true", help="also measure the fixed twin (independent check)")
    ap.add_argument("--twin-pairs", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the rows here (appended to what is there)")
    args = ap.parse_args()
    samples = sorted(p for p in SAMPLES.glob("pd*.py") if not p.stem.endswith("_fixed")
                     and p.with_name(p.stem + "_fixed.py").exists())
    rows: list[dict] = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    for s in samples:
        if args.only and not any(s.name.startswith(o) for o in args.only):
            continue
        with tempfile.TemporaryDirectory(prefix="pd-verify-") as tmp:
            try:
                got = one(s, args.steps, args.twin, args.twin_pairs, Path(tmp))
            except subprocess.TimeoutExpired:
                got = [{"sample": s.name, "rule": "-", "error": "timed out"}]
        rows += got
        for r in got:
            print(json.dumps(r), file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = ["| sample | rule | kind | verdict | predicted | measured (90% interval) | twin | runs | load |",
           "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['sample']} | {r['rule']} | | {r['error']} | | | | | |")
            continue
        iv = r.get("interval_ms")
        meas = ms(r.get("measured_ms")) + (f" ({iv[0]:.1f} .. {iv[1]:.1f})" if iv else "")
        tw = r.get("twin_ms")
        out.append(f"| {r['sample']} | {r['rule']} | {r.get('kind') or ''} | {r.get('verdict')} | "
                   f"{ms(r.get('predicted_ms'))} | {meas} | {ms(tw[0]) if tw else '-'} | {r.get('runs') or ''} | "
                   f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    by_rule: dict[str, list[float]] = {}
    for r in rows:
        p, m = r.get("predicted_ms"), r.get("measured_ms")
        if p and m and p > 0 and m > 0 and r.get("verdict") != "did-not-hold":
            by_rule.setdefault(r["rule"], []).append(p / m)
    out += ["", "| rule | predicted / measured (median) | rows | inside 0.75-1.33 |", "|---|---:|---:|---|"]
    for rule, ratios in sorted(by_rule.items()):
        med = statistics.median(ratios)
        out.append(f"| {rule} | {med:.2f} | {len(ratios)} | {'yes' if 0.75 <= med <= 1.33 else 'NO'} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
