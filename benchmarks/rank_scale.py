"""Speed and memory of `perfdoctor report` on a folder of many ranks (the map-reduce over ranks).

Synthesises one ~30 MB trace from the largest test trace (trace_speed.synthesise: its events
repeated with shifted timestamps, ids and step numbers), copies it to N rank files that differ in
their `distributedInfo` rank (under --out, default a temp dir deleted afterwards; benchmarks/out is
git-ignored), then runs, each in a fresh process:

- `perfdoctor report RANK_FILE --format json` on one rank's trace (the single-trace time);
- `perfdoctor report FOLDER --format json` on the folder of N ranks,

and prints for each: wall time; CPU time of the whole process tree (user + system: unlike the wall
time, independent of what else the machine runs), from which the folder's time on C idle CPUs is
estimated; the parent's peak RSS and the largest worker's peak RSS (getrusage
SELF and CHILDREN of the process that runs the CLI: RUSAGE_CHILDREN is the peak of the largest
worker the pool joined); and the total RSS of the process tree sampled every 20 ms from /proc (the
parent and all its workers at once: what the machine had to hold).

    python benchmarks/rank_scale.py [--ranks 64] [--mb 30] [--workers N] [--out DIR] [--keep]

Targets (issue 10): 64 ranks of ~30 MB within a few times the single-trace time (with as many
CPUs as that takes) and under 1 GB.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# runs the CLI in this process, then prints its own and its largest child's peak RSS (MB)
CLI = """
import resource, runpy, sys
sys.path.insert(0, {root!r})
sys.argv = ["perfdoctor", "report", *sys.argv[1:], "--format", "json", "--output", "/dev/null"]
try:
    runpy.run_module("perfdoctor", run_name="__main__")
except SystemExit as e:
    if e.code not in (0, 1, None):
        raise
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"{{own:.0f}} {{kids:.0f}}", file=sys.stderr)
"""


def tree_rss_mb(pid: int) -> float:
    """RSS of `pid` and its children (one level: the pool's workers), MB, from /proc."""
    total = 0
    pids = [pid]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        pids.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's reaped children and their reaped descendants."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run(target: Path, workers: int | None) -> tuple[float, float, float, float, float]:
    """Wall s, parent peak MB, largest worker peak MB, sampled peak of the whole tree MB, CPU s of
    the whole tree (the CLI and its workers)."""
    env = dict(os.environ)
    cmd = [sys.executable, "-c", CLI.format(root=str(ROOT)), str(target)]
    if workers is not None:  # taskset: the workers follow the usable CPUs
        cmd = ["taskset", "-c", f"0-{workers - 1}", *cmd]
    peak = [0.0]
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env)

    def sample() -> None:
        while p.poll() is None:
            peak[0] = max(peak[0], tree_rss_mb(p.pid))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    err = p.stderr.read().decode()
    p.wait()
    wall = time.perf_counter() - t0
    th.join()
    if p.returncode != 0:
        raise RuntimeError(f"{target} exited {p.returncode}: {err[-2000:]}")
    own, kids = (float(x) for x in err.strip().splitlines()[-1].split())
    return wall, own, kids, peak[0], _children_cpu() - cpu0


def make_ranks(src: Path, mb: int, n: int, out: Path) -> list[Path]:
    """One synthesised trace of `mb` MB, copied to `n` rank files (`distributedInfo.rank` 0..n-1)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import trace_speed

    base = out / "base.json"
    trace_speed.synthesise(src, mb, base, top={"distributedInfo": {"backend": "nccl", "rank": 987654321,
                                                                    "world_size": n}})
    data = base.read_bytes()
    base.unlink()
    head, tail = data[:-65536], data[-65536:]
    assert tail.count(b'"rank": 987654321') == 1
    files = []
    for r in range(n):
        p = out / f"rank-{r}.pt.trace.json"
        p.write_bytes(head + tail.replace(b'"rank": 987654321', f'"rank": {r}'.encode()))
        files.append(p)
    return files


def main() -> None:
    argv = sys.argv[1:]
    opts = {"--ranks": "64", "--mb": "30", "--workers": "", "--out": "", "--src": ""}
    keep = "--keep" in argv
    if keep:
        argv.remove("--keep")
    for k in opts:
        if k in argv:
            i = argv.index(k)
            opts[k] = argv[i + 1]
            del argv[i:i + 2]
    if argv[:1] == ["--make"]:  # in a child: this process stays small (Linux carries the peak across fork + exec)
        make_ranks(Path(argv[1]), int(opts["--mb"]), int(opts["--ranks"]), Path(argv[2]))
        return
    n, mb = int(opts["--ranks"]), int(opts["--mb"])
    workers = int(opts["--workers"]) if opts["--workers"] else None
    src = opts["--src"] or subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
         "import trace_speed; print(trace_speed.largest_trace())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = Path(opts["--out"]) if opts["--out"] else Path(tempfile.mkdtemp(prefix="pd-ranks-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # children reuse bytecode, as an installed perfdoctor does
    os.environ["PYTHONPYCACHEPREFIX"] = str(out / ".pycache")
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--make", src, str(out), "--mb", str(mb), "--ranks", str(n)],
                       check=True)
        files = sorted(out.glob("rank-*.pt.trace.json"))
        cpus = workers or len(os.sched_getaffinity(0))
        print(f"{n} ranks x {files[0].stat().st_size / 1e6:.1f} MB from {Path(src).name} "
              f"(made in {time.perf_counter() - t0:.0f} s); {cpus} usable CPUs", flush=True)
        run(files[0], workers)  # compile the bytecode once
        w1, own1, _, tree1, cpu1 = run(files[0], workers)
        print(f"one rank:  {w1:6.2f} s, peak {own1:.0f} MB, CPU {cpu1:.2f} s", flush=True)
        w, own, kids, tree, cpu = run(out, workers)
        print(f"{n} ranks: {w:6.2f} s ({w / w1:.1f}x one rank; {n * w1 / w:.1f} ranks' work per rank-time), "
              f"parent peak {own:.0f} MB, largest worker peak {kids:.0f} MB, "
              f"process tree peak {tree:.0f} MB (sampled every 20 ms)", flush=True)
        # CPU time does not depend on what else the machine runs (the wall time here does). The folder's
        # CPU = start-up + n x one rank's work; one rank alone = start-up + one rank's work. With C CPUs
        # to itself, the folder takes about start-up + ceil(n / C) x one rank's work (a worker per CPU)
        work = (cpu - cpu1) / (n - 1) if n > 1 else cpu1
        start = max(cpu1 - work, 0.0)
        print(f"CPU time: one rank {cpu1:.2f} s, {n} ranks {cpu:.1f} s: one rank's work {work:.2f} s, start-up "
              f"{start:.2f} s; on C idle CPUs about start-up + ceil({n} / C) x work: "
              + ", ".join(f"{c} CPUs {start + -(-n // c) * work:.1f} s = {(start + -(-n // c) * work) / cpu1:.1f}x one rank"
                          for c in (2, 16, 64)), flush=True)
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
