"""Time perfdoctor's trace loading + trace facts on the largest test trace and on ~60 MB and
~500 MB traces synthesised by repeating it (temp dir, never committed). Prints wall time and the
peak RSS of a child process that does the work.

    python benchmarks/trace_speed.py [TRACE] [--sizes 60,500]
"""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests/data/traces/kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
CHILD = """
import sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from perfdoctor.trace import load_traces
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace_facts import add_trace_facts
ts = load_traces(sys.argv[1]); t1 = time.perf_counter()
for t in ts:
    s = add_trace_facts(t, Facts())
print(f"{{t1 - t0:.2f}} {{time.perf_counter() - t1:.2f}} {{sum(len(t) for t in ts)}}")
"""


def synthesise(src: Path, mb: int, out: Path) -> Path:
    d = json.load(gzip.open(src) if src.name.endswith(".gz") else open(src))
    ev = d.pop("traceEvents")
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in ev if isinstance(e.get("ts"), (int, float))) - min(
        e["ts"] for e in ev if isinstance(e.get("ts"), (int, float))) + 1000
    one = len(json.dumps(ev))
    with open(out, "w") as f:
        f.write('{"traceEvents": [')
        for k in range(max(1, round(mb * 1e6 / one))):
            if k:
                f.write(",")
            shifted = [dict(e, ts=e["ts"] + k * span) if isinstance(e.get("ts"), (int, float)) else e for e in ev]
            for e in shifted:  # keep ids unique per copy
                a = e.get("args")
                if isinstance(a, dict) and "correlation" in a:
                    e["args"] = dict(a, correlation=a["correlation"] + k * 10_000_000)
                if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
                    e["id"] += k * 10_000_000
                if isinstance(e.get("name"), str) and e["name"].startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{k * 100 + int(e['name'][13:])}"
            f.write(json.dumps(shifted)[1:-1])
        f.write("], " + json.dumps(d)[1:])
    return out


def measure(path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), str(path)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if r.returncode:
        print(r.stderr)
        return
    load_s, facts_s, n = r.stdout.split()
    size = path.stat().st_size / 1e6
    note = "" if peak > before else " (peak not above an earlier child's)"
    print(f"{path.name[:50]:50s} {size:7.1f} MB  {n:>9s} events  load {load_s}s  facts {facts_s}s  "
          f"wall {wall:.2f}s  peak RSS {peak / 1024:.0f} MB{note}")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sizes = [60, 500]
    if "--sizes" in sys.argv:
        sizes = [int(x) for x in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
        args = [a for a in args if a != sys.argv[sys.argv.index("--sizes") + 1]]
    src = Path(args[0]) if args else DEFAULT
    measure(src)
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sorted(sizes):  # ascending, so each child's peak RSS shows (RUSAGE_CHILDREN is a max)
            measure(synthesise(src, mb, Path(tmp) / f"synth_{mb}MB.pt.trace.json"))


if __name__ == "__main__":
    main()
