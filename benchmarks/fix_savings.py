"""Do perfdoctor's savings add up? For each fix perfdoctor can apply mechanically, the saving it
predicted against the saving measured by running the fixed sample.

    python benchmarks/fix_savings.py [--steps 40] [--repeats 1] [--only PD003 ...] [--json PATH]

For each (sample, rule) below: run `perfdoctor run SAMPLE --steps N --format json` on a copy of the
sample, take the finding's fix (written against the sample's own line) and its predicted saving
(`estimated_saving.ms_per_step`; none where the cost cannot be measured on this machine, e.g. a
GPU-only problem on a CPU run), apply the fix to the copy (`perfdoctor.rules.fixes.apply_fix`), run
the fixed copy the same way, and measure the saving as the median step time before minus after
(steady-state steps, as the report's summary gives it). With `--repeats R` each side runs R times
and the medians of the R medians are compared. Prints one row per fix: predicted, measured, the two
step times, and whether the finding is gone after the fix.

PD001's fix (DistributedDataParallel) needs a torchrun launch and is not mechanical: left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_scripts"
sys.path.insert(0, str(REPO))

from perfdoctor.model import Fix  # noqa: E402
from perfdoctor.rules.fixes import apply_fix  # noqa: E402

CASES = [
    ("pd002_dataloader_workers.py", "PD002"),
    ("pd003_pin_memory.py", "PD003"),
    ("pd004_cpu_tensor_to_device.py", "PD004"),
    ("pd005_empty_cache.py", "PD005"),
    ("pd006_loss_graph_retained.py", "PD006"),
    ("pd006_running_sum.py", "PD006"),
    ("pd007_fp32_without_amp.py", "PD007"),
]


def run(script: Path, out: Path, steps: int) -> dict:
    env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", str(script), "--steps", str(steps),
                        "--format", "json", "--out-dir", str(out)], cwd=script.parent, env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{script.name}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def finding(doc: dict, rule: str, script: Path) -> dict | None:
    for f in doc["findings"]:
        if f["rule"] == rule and any(Path(l["file"]).name == script.name for l in f["locations"]):
            return f
    return None


def step_ms(doc: dict) -> float:
    return float(doc["summary"]["step_time_ms"]["median"])


def one(sample: str, rule: str, steps: int, repeats: int, work: Path) -> dict:
    script = work / sample
    shutil.copy(SAMPLES / sample, script)
    docs = [run(script, work / f"before{i}", steps) for i in range(repeats)]
    found = finding(docs[0], rule, script)
    row: dict = {"rule": rule, "sample": sample, "predicted_ms": None, "basis": "",
                 "before_ms": statistics.median(step_ms(d) for d in docs)}
    if found is None or not found.get("fix") or found["fix"]["example"]:
        row["error"] = "no finding with a mechanical fix"
        return row
    saving = found.get("estimated_saving")
    row["predicted_ms"] = saving["ms_per_step"] if saving else None
    row["basis"] = found["saving_basis"]
    fx = found["fix"]
    line = (found.get("locations") or [{}])[0].get("line")
    fixed = apply_fix(script.read_text(), Fix(fx["before"], fx["after"], fx["note"], fx["example"]), line)
    if fixed is None:
        row["error"] = "the fix's `before` is not in the sample"
        return row
    script.write_text(fixed)
    after = [run(script, work / f"after{i}", steps) for i in range(repeats)]
    row["after_ms"] = statistics.median(step_ms(d) for d in after)
    row["measured_ms"] = row["before_ms"] - row["after_ms"]
    row["gone"] = finding(after[0], rule, script) is None
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", action="append", help="a rule id (repeatable)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    rows = []
    for sample, rule in CASES:
        if args.only and rule not in args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="pd-fix-") as tmp:
            try:
                rows.append(one(sample, rule, args.steps, args.repeats, Path(tmp)))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rows.append({"rule": rule, "sample": sample, "error": str(e).splitlines()[0]})
        print(f"{rule} {sample}: done", file=sys.stderr, flush=True)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(f"{'rule':6} {'sample':32} {'predicted':>10} {'measured':>10} {'before':>9} {'after':>9}  gone  basis")
    for r in rows:
        if "error" in r and "after_ms" not in r:
            print(f"{r['rule']:6} {r['sample']:32} {'':>10} {'':>10} {'':>9} {'':>9}        {r['error']}")
            continue
        print(f"{r['rule']:6} {r['sample']:32} {ms(r['predicted_ms']):>10} {ms(r['measured_ms']):>10} "
              f"{ms(r['before_ms']):>9} {ms(r['after_ms']):>9}  {'yes ' if r['gone'] else 'NO  '}  "
              f"{'' if r['predicted_ms'] is not None else r['basis'][:90]}")
    print("ms per step; predicted: perfdoctor's estimated saving (- where it cannot be measured on this machine); "
          "measured: median step before the fix minus after")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all("error" not in r and r.get("gone") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
