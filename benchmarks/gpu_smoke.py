"""perfdoctor on a GPU, end to end, in one command: every training sample script bare and under
`perfdoctor run`, on CUDA, with one row per sample: the median step bare and under perfdoctor,
their ratio, the findings, the trace's size, and the device the run used.

    python benchmarks/gpu_smoke.py [--steps 40] [--only pd002] [--keep DIR] [--rows F]  # on a machine with a GPU
    python benchmarks/gpu_smoke.py --dry-run [--steps 12] [--only clean]      # here: the same, on the CPU

The samples pick their device with the usual idiom (`"cuda" if torch.cuda.is_available()`), so on
a GPU machine they run on CUDA; `--dry-run` hides the GPUs (CUDA_VISIBLE_DEVICES="") and checks the
harness itself on the CPU. `--keep DIR` keeps each run folder (its trace.json.gz is the test data a
GPU session should commit, e.g. under tests/data/). Without a GPU and without `--dry-run` it stops.

The bare step time is taken by a one-hook wrapper (`STEP_TIMER`: an optimizer step post hook that
notes the time, and stops the script after `--steps` steps as `perfdoctor run --steps` does); the
perfdoctor step time is the report's median over its steady steps. Both drop the first steps
(warm-up). The samples that test exit paths (crash_midway, exits_early, needs_args) are left out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_scripts"
EXIT_PATH_SAMPLES = {"crash_midway.py", "exits_early.py", "needs_args.py"}

# run a script bare, timing its optimizer steps; prints `bare_step_ms=[...]` and stops after N steps
STEP_TIMER = r"""
import os, runpy, sys, time, torch.optim.optimizer as o
N, SCRIPT, ts = int(sys.argv[1]), sys.argv[2], []
def done():
    sys.stdout.flush()
    print("bare_step_ms=" + repr([round((b - a) * 1e3, 4) for a, b in zip(ts, ts[1:])]), file=sys.stderr, flush=True)
def post(opt, args, kwargs):
    ts.append(time.perf_counter())
    if len(ts) > N:
        done()
        os._exit(0)
o.register_optimizer_step_post_hook(post)
ts.append(time.perf_counter())
sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(SCRIPT))
try:
    runpy.run_path(SCRIPT, run_name="__main__")
finally:
    done()
"""


def samples(only: list[str]) -> list[Path]:
    """The training samples (pd*.py, clean.py, no_optimizer.py), filtered by name substrings."""
    out = [p for p in sorted(SAMPLES.glob("*.py")) if p.name not in EXIT_PATH_SAMPLES]
    return [p for p in out if not only or any(o in p.name for o in only)]


def steady_median(ms: list[float]) -> float | None:
    """The median step after the warm-up (the first max(2, 10%) steps)."""
    drop = max(2, -(-len(ms) // 10))
    rest = ms[drop:] or ms
    return statistics.median(rest) if rest else None


def bare(script: Path, steps: int, env: dict[str, str]) -> float | None:
    p = subprocess.run([sys.executable, "-c", STEP_TIMER, str(steps), str(script)], cwd=script.parent, env=env,
                       capture_output=True, text=True, timeout=1800)
    line = next((x for x in reversed(p.stderr.splitlines()) if x.startswith("bare_step_ms=")), None)
    if line is None:
        return None
    return steady_median(json.loads(line.split("=", 1)[1]))


def under_perfdoctor(script: Path, steps: int, env: dict[str, str], run_dir: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "run", str(script), "--steps", str(steps),
                        "--format", "json", "--out-dir", str(run_dir)], cwd=script.parent, env=env,
                       capture_output=True, text=True, timeout=1800)
    row: dict = {"exit": p.returncode}
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        row["error"] = (p.stderr.strip().splitlines() or ["no report"])[-1][:120]
        return row
    st = (doc.get("summary") or {}).get("step_time_ms") or {}
    row["step_ms"] = st.get("median")
    row["findings"] = sorted({f["rule"] for f in doc.get("findings", [])})
    row["device"] = (doc.get("run") or {}).get("device")
    trace = run_dir / "trace.json.gz"
    row["trace_bytes"] = trace.stat().st_size if trace.is_file() else None
    if trace.is_file():
        with gzip.open(trace, "rb") as f:
            row["trace_json_bytes"] = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    meta = json.loads((run_dir / "meta.json").read_text())
    row["device_type"] = (meta.get("env") or {}).get("device")
    return row


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def table(rows: list[dict]) -> str:
    head = f"{'sample':<34} {'bare ms':>9} {'pd ms':>9} {'ratio':>6} {'device':>6} {'trace gz':>9} {'trace json':>10}  findings"
    out = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['step_ms'] / r['bare_ms']:.2f}x" if r.get("step_ms") and r.get("bare_ms") else "-"
        findings = r.get("error") or (", ".join(r.get("findings") or []) or "none")
        out.append(f"{r['sample']:<34} {_ms(r.get('bare_ms')):>9} {_ms(r.get('step_ms')):>9} {ratio:>6} "
                   f"{r.get('device_type') or '-':>6} {fmt_bytes(r.get('trace_bytes')):>9} "
                   f"{fmt_bytes(r.get('trace_json_bytes')):>10}  {findings}")
    return "\n".join(out)


def _ms(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def cuda_available(env: dict[str, str]) -> bool:
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], env=env,
                       capture_output=True, text=True)
    return p.stdout.strip() == "True"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 40, 12 with --dry-run)")
    ap.add_argument("--only", action="append", default=[], help="samples whose name contains this (repeatable)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run folders (and their traces) here")
    ap.add_argument("--dry-run", action="store_true", help="run on the CPU (GPUs hidden): checks the harness")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    ap.add_argument("--rows", type=Path, default=None,
                    help="also append each row to this JSON-lines file as soon as it is measured (a device "
                         "call's time limit then keeps the rows done)")
    args = ap.parse_args(argv)
    steps = args.steps or (12 if args.dry_run else 40)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if args.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif not cuda_available(env):
        print("gpu_smoke: no CUDA device here; use --dry-run to check the harness on the CPU", file=sys.stderr)
        return 2
    chosen = samples(args.only)
    if not chosen:
        print(f"gpu_smoke: no sample matches {args.only}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfdoctor-gpu-smoke-") as tmp:
        root = args.keep or Path(tmp)
        for script in chosen:
            row = {"sample": script.name, "bare_ms": bare(script, steps, env)}
            row.update(under_perfdoctor(script, steps, env, root / script.stem))
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            if args.rows:
                with args.rows.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"gpu_smoke: {script.name} done", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    wrong_device = [r["sample"] for r in rows if not args.dry_run and r.get("device_type") != "cuda"]
    if wrong_device:
        print(f"gpu_smoke: these ran without CUDA: {', '.join(wrong_device)}", file=sys.stderr)
    return 1 if wrong_device or any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
