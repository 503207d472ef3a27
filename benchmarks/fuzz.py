"""A longer fuzz run of `perfdoctor report` than the suite's (tests/trace/test_trace_fuzz.py): the big hostile
inputs of issue 9 (a 200 MB operator name, a 600 MB file without `traceEvents`, a gzip bomb, 100,000
levels of nesting, a frame naming /dev/zero, python events that are their own parents), then random
structure-aware mutations of the real traces in tests/data, each run as its own `perfdoctor report`
process. Prints the cases, the exit codes seen, the slowest case and the largest peak RSS.

    python benchmarks/fuzz.py [--seconds 240] [--seed 0] [--no-big]

A case fails when perfdoctor exits with anything but 0, 1 or 2, prints an "internal error" or a
traceback, writes more than one line to stderr on exit 2, or runs past --timeout (a hang).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "traces"
SOURCES = sorted(p for p in DATA.glob("*.json.gz"))


# Runs perfdoctor in a grandchild and writes its peak RSS (KB) to the file argv[1]. The fuzzer's own
# memory would otherwise count: Linux carries a process's peak RSS across fork and exec.
_LAUNCH = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "perfdoctor", *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_rss(args: list[str], cwd: Path, timeout: float) -> tuple[int, float, int, str]:
    """(exit code, seconds, peak RSS in MB, stderr) of `perfdoctor ARGS` (124 on a timeout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rss_file = cwd / "rss.txt"
    rss_file.unlink(missing_ok=True)
    start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(rss_file), *args], cwd=cwd, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        code = 124
    secs = time.monotonic() - start
    rss = int(rss_file.read_text()) // 1024 if rss_file.exists() else 0
    return code, secs, rss, err.decode(errors="replace")


def ev(name, cat, ts, dur, **args) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def loader_steps(frame: str, n: int = 4, py_args: dict | None = None) -> list[dict]:
    events = []
    for i in range(n):
        t = i * 10_000
        events += [ev(f"ProfilerStep#{i}", "user_annotation", t, 10_000),
                   ev(frame, "python_function", t + 10, 9_000, **(py_args or {})),
                   ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", t + 20, 8_000)]
    return events


def big_cases(d: Path) -> list[tuple[str, Path]]:
    """The hostile inputs of issue 9, full size."""
    out = []

    def put(name: str, data: bytes) -> None:
        (d / name).write_bytes(data)
        out.append((name, d / name))

    put("self-parent.json", json.dumps({"traceEvents": loader_steps("threading.py(1): run")}).encode())
    put("equal-ids.json", json.dumps({"traceEvents": loader_steps("threading.py(1): run",
                                                                  py_args={"Python id": 5, "Python parent id": 5})}).encode())
    put("dev-zero.json", json.dumps({"traceEvents": loader_steps("/dev/zero(22): <module>")}).encode())
    put("deep.json", b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    name = b"step " + b"1" * (200 << 20) + b"x"
    put("name-200MB.json", b'{"traceEvents": [' + json.dumps(ev("x", "cpu_op", 0, 1)).encode()
        + b',{"ph":"X","cat":"user_annotation","name":"' + name + b'","ts":1,"dur":1}]}')
    del name
    with open(d / "no-events-600MB.json", "wb") as f:
        f.write(b'{"other": "')
        chunk = b"x" * (1 << 20)
        for _ in range(600):
            f.write(chunk)
        f.write(b'"}')
    out.append(("no-events-600MB.json", d / "no-events-600MB.json"))
    with gzip.open(d / "bomb.json.gz", "wb", compresslevel=9) as g:
        g.write(b'{"traceEvents": [')
        for _ in range(1024):
            g.write(b" " * (1 << 20))
        g.write(b"]}")
    out.append(("gzip-bomb-1GB.json.gz", d / "bomb.json.gz"))
    with gzip.open(d / "tiny-events.json.gz", "wb", compresslevel=9) as g:
        g.write(b'{"traceEvents": [')
        for _ in range(400):
            g.write(b'{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1},' * 20_000)
        g.write(b"{}]}")
    out.append(("tiny-events-8M.json.gz", d / "tiny-events.json.gz"))
    return out


HOSTILE = [None, True, 0, -1, 2**63, 2**70, 1e308, -1e308, 1e20, "", "12", "/dev/zero(22): <module>",
           "threading.py(1): run", "ProfilerStep#3", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
           "step 1" + "1" * 5000 + "x", "x" * 70_000, [], {}, [[[[[]]]]]]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARGS = ["External id", "correlation", "Python id", "Python parent id", "stream", "device", "bytes", "Bytes",
        "Input Dims", "Input type", "Call stack", "In msg nelems", "Collective name"]


def mutate(rng: random.Random, doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 40)):
        if not events:
            events.append({"ph": "X"})
        i = rng.randrange(len(events))
        e = events[i]
        if not isinstance(e, dict):
            continue
        op = rng.choice(["set", "arg", "del", "self-parent", "dup", "drop", "value"])
        if op == "set":
            e[rng.choice(FIELDS)] = rng.choice(HOSTILE)
        elif op == "value":
            e[rng.choice(["ts", "dur"])] = rng.uniform(-1e6, 1e12)
        elif op == "arg":
            if not isinstance(e.get("args"), dict):
                e["args"] = {}
            e["args"][rng.choice(ARGS)] = rng.choice(HOSTILE)
        elif op == "del":
            e.pop(rng.choice(FIELDS), None)
        elif op == "self-parent":
            e.update(cat="python_function", args={"Python id": 7, "Python parent id": rng.choice([7, 8])})
            events.append({**e, "args": {"Python id": 8, "Python parent id": 7}})
        elif op == "dup":
            events.insert(i, copy.deepcopy(e))
        else:
            del events[i]
    return doc


def sample(path: Path, rng: random.Random, n: int) -> dict:
    doc = json.loads(gzip.open(path).read())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    start = rng.randrange(max(1, len(xs) - n))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"][:50] + xs[start: start + n]
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=240, help="time for the random mutations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120, help="a case running longer is a hang")
    ap.add_argument("--no-big", action="store_true", help="skip the full-size hostile inputs")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    codes: Counter[int] = Counter()
    failures: list[str] = []
    slowest = (0.0, "")
    biggest = (0, "")
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cases = [] if a.no_big else big_cases(d)

        def check(label: str, path: Path) -> tuple[int, float, int, str]:
            nonlocal n, slowest, biggest
            code, secs, rss, err = run_rss(["report", str(path), "--format", "json"], d, a.timeout)
            n += 1
            codes[code] += 1
            slowest = max(slowest, (secs, label))
            biggest = max(biggest, (rss, label))
            bad = (code not in (0, 1, 2) or "internal error" in err or "Traceback" in err
                   or code == 2 and len(err.splitlines()) != 1)
            if bad:
                failures.append(f"{label}: exit {code}: {err.strip()[:300]}")
            return code, secs, rss, err

        for label, path in cases:
            code, secs, rss, err = check(label, path)
            print(f"{label:28s} exit {code}  {secs:6.2f} s  {rss:6d} MB  {err.strip()[:110]}", flush=True)
            path.unlink()
        docs = {p.name: sample(p, rng, 400) for p in SOURCES}
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            src = rng.choice(sorted(docs))
            data = json.dumps(mutate(rng, docs[src])).encode()
            gz = rng.random() < 0.5
            p = d / ("m.json.gz" if gz else "m.json")
            if rng.random() < 0.1:  # a truncated file
                data = data[: rng.randrange(len(data))]
            p.write_bytes(gzip.compress(data, 1) if gz else data)
            check(f"mutation {n} of {src[:30]}", p)
            p.unlink()
    print(f"\ncases: {n} ({len(cases)} full-size hostile inputs, {n - len(cases)} mutations of real traces)")
    print("exit codes: " + ", ".join(f"{c}: {k}" for c, k in sorted(codes.items())))
    print(f"max time: {slowest[0]:.2f} s ({slowest[1]})")
    print(f"max peak RSS: {biggest[0]} MB ({biggest[1]})")
    print(f"failures: {len(failures)}")
    for f in failures[:20]:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
