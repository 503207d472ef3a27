"""Speed and memory of `perfdoctor report` on big traces.

For the largest test trace (tests/data/traces, by uncompressed size) and for ~60 MB and ~500 MB
traces synthesised from it (its events repeated with shifted timestamps, correlation ids and step
numbers, written to a temp dir and deleted afterwards), print:

- the whole command (`python -m perfdoctor report TRACE --format json > /dev/null` in a fresh
  process: interpreter start, imports, load, facts, rules, rendering): wall time and peak RSS;
- the load / facts split measured inside a fresh process (and that process's peak RSS);
- with `--hta PYTHON` (the interpreter of a separate environment that has Holistic Trace Analysis,
  PyPI `traceinsight`, installed; never perfdoctor's own), side by side on the same files: HTA's
  load + temporal breakdown + idle time breakdown in a fresh process (import included, as the
  perfdoctor command's start is), its wall time and peak RSS, and how many times faster
  `perfdoctor report` is.

    python benchmarks/trace_speed.py [TRACE] [--sizes 60,1000] [--repeat 3] [--cold-bytecode] [--hta PYTHON]

    python -m venv /tmp/hta && /tmp/hta/bin/pip install traceinsight==0.6.1 pandas==3.1.1 numpy==2.4.6

HTA's speed is mostly pandas': the figures in the README were taken with the pandas and numpy pinned
above (what pip chose for traceinsight 0.6.1 on Python 3.11 on 2026-11-23).

The children run as an installed perfdoctor does: with its bytecode cached (pip compiles .pyc
files at install). An editable install in an environment with PYTHONDONTWRITEBYTECODE=1 instead
compiles every perfdoctor module on every start (about 0.1 s here); --cold-bytecode measures that.

Targets (issues 3, 10): 60 MB in < 1 s and < 120 MB, >= 10x faster than HTA 0.6.1; 1 GB in < 30 s
and < 1 GB, on 2 cores.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests/data/traces"
CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from perfdoctor.trace import load_traces
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace import add_trace_facts
t1 = time.perf_counter()
ts = load_traces(sys.argv[1]); t2 = time.perf_counter()
for t in ts:
    add_trace_facts(t, Facts())
t3 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{{t2 - t1:.2f}} {{t3 - t2:.2f}} {{sum(len(t) for t in ts)}} {{rss:.0f}}")
"""

# Holistic Trace Analysis on the one trace in the folder argv[1]: what its README's first steps run
HTA = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(visualize=False)
"""


def _open(p: Path):
    return gzip.open(p) if p.name.endswith(".gz") else open(p, "rb")


def largest_trace() -> Path:
    files = [p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz"))]
    return max(files, key=lambda p: sum(len(chunk) for chunk in iter(lambda f=_open(p): f.read(1 << 20), b"")))


def synthesise(src: Path, mb: int, out: Path, top: dict | None = None) -> Path:
    """A trace of about `mb` MB at `out`: `src`'s events repeated, each copy shifted in time with
    fresh correlation/flow ids and step numbers; `top` replaces top-level keys (distributedInfo...)."""
    with _open(src) as f:
        d = json.load(f)
    ev = d.pop("traceEvents")
    d.update(top or {})
    times = [e["ts"] for e in ev if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in ev if isinstance(e.get("ts"), (int, float))) - min(times) + 1000
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


def run(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) of this one child (os.wait4, not the max over all children), stdout."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = code = os.waitstatus_to_exitcode(status)
        p.stdout.close()
        if code not in (0, 1):  # 1: a finding at or above --fail-on; still a full report
            err.seek(0)
            raise RuntimeError(f"{cmd[-3:]} exited {code}: {err.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out.decode()


def _range(xs: list[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return format(lo, fmt) if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def measure(path: Path, repeat: int, hta: str | None = None) -> None:
    cmd_wall, cmd_rss, load, facts, rss, hta_wall, hta_rss = [], [], [], [], [], [], []
    n = "?"
    for _ in range(repeat):
        w, r, _ = run([sys.executable, "-m", "perfdoctor", "report", str(path), "--format", "json"])
        cmd_wall.append(w)
        cmd_rss.append(r)
        if hta:  # alternating with perfdoctor's runs: the host's load falls on both alike
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / path.name).symlink_to(path.resolve())
                w, r, _ = run([hta, "-c", HTA, d])
            hta_wall.append(w)
            hta_rss.append(r)
        _, _, out = run([sys.executable, "-c", CHILD.format(root=str(ROOT)), str(path)])
        lo, fa, n, rs = out.split()
        load.append(float(lo))
        facts.append(float(fa))
        rss.append(float(rs))
    size = (path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())) / 1e6
    print(f"{path.name[:46]:46s} {size:6.1f} MB {n:>8s} events | command {_range(cmd_wall, '.2f')} s, "
          f"{_range(cmd_rss, '.0f')} MB | load {_range(load, '.2f')} s + facts {_range(facts, '.2f')} s, "
          f"{_range(rss, '.0f')} MB", flush=True)
    if hta:
        print(f"{'':46s} {'':9s} {'':8s} | HTA     {_range(hta_wall, '.2f')} s, {_range(hta_rss, '.0f')} MB: "
              f"perfdoctor {_range([h / c for h, c in zip(hta_wall, cmd_wall)], '.1f')}x faster", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--synth"]:
        synthesise(Path(argv[1]), int(argv[2]), Path(argv[3]))
        return
    cold = "--cold-bytecode" in argv
    if cold:
        argv.remove("--cold-bytecode")
    opts = {"--sizes": "60,1000", "--repeat": "1", "--hta": ""}
    for k in opts:
        if k in argv:
            i = argv.index(k)
            opts[k] = argv[i + 1]
            del argv[i:i + 2]
    sizes = [int(x) for x in opts["--sizes"].split(",") if x]
    repeat = int(opts["--repeat"])
    hta = opts["--hta"] or None
    src = Path(argv[0]) if argv else Path(subprocess.run(  # found by a child, for the same reason
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
         "import trace_speed; print(trace_speed.largest_trace())"], capture_output=True, text=True, check=True
    ).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        if not cold:  # children compile once into a private bytecode cache, then reuse it
            os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
            os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
            run([sys.executable, "-m", "perfdoctor", "report", str(src), "--format", "json"])
        print(f"{repeat} run(s) each; ranges are min-max; bytecode {'compiled on every start' if cold else 'cached'}",
              flush=True)
        measure(src, repeat, hta)
        for mb in sizes:
            # written by a child: this process stays small, so that its children's peak RSS is theirs
            # (Linux carries the peak across fork + exec)
            out = Path(tmp) / f"synth_{mb}MB.pt.trace.json"
            subprocess.run([sys.executable, __file__, "--synth", str(src), str(mb), str(out)], check=True)
            measure(out, repeat, hta if mb <= 200 else None)  # the comparison is at ~60 MB
            out.unlink()


if __name__ == "__main__":
    main()
