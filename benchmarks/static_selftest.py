"""The static read is total: every Python file of large public repositories goes through the source
index and every static detector (`perfdoctor.facts.static.analyse_files`) without an exception and
within a per-file bound on its CPU time (issue 19): CPU time, not wall time, so that a busy machine
does not fail a file.

The repositories are git snapshots (bare git directories, e.g. those the session's `fetch` tool
puts under /work/.mirror/OWNER+NAME/repo); each one's HEAD is unpacked (`git archive`) into a
temporary folder, read, and deleted. Nothing of theirs is kept or committed.

    python benchmarks/static_selftest.py GITDIR [GITDIR ...] [--bound 10] [--limit N] [--json OUT]

Prints, per repository and in all: the files read, those Python could not parse (not counted as
failures: the static read skips them as it does a user's broken file), the failures (an exception
out of the read, a family of facts that failed inside it, `Facts.failures`, or a file past the
bound), and the slowest file. Exits 1 where any file failed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from perfdoctor.facts.model import Facts  # noqa: E402
from perfdoctor.facts.static import analyse_files  # noqa: E402


class PastBound(BaseException):
    """Raised by the alarm: a BaseException, so that no family of facts takes it for its own error."""


def _alarm(_sig: int, _frame: Any) -> None:
    raise PastBound


def _unpack(gitdir: Path, into: Path) -> None:
    """HEAD's Python files of a bare git directory, written under `into` (only those: a snapshot may lack
    its largest files)."""
    with subprocess.Popen(["git", "--git-dir", str(gitdir), "archive", "--format=tar", "HEAD", "--", ":(glob)**/*.py"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as p:
        assert p.stdout is not None
        with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".py"):
                    tar.extract(member, into, filter="data")


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_bytes())
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def check_repo(gitdir: Path, bound: float, limit: int | None) -> dict[str, Any]:
    name = gitdir.parent.name if gitdir.name == "repo" else gitdir.name
    out: dict[str, Any] = {"repo": name, "files": 0, "unparsed": 0, "failures": [], "slowest": None, "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="pd-selftest-") as tmp:
        root = Path(tmp)
        _unpack(gitdir, root)
        files = sorted(root.rglob("*.py"))[:limit]
        for path in files:
            rel = str(path.relative_to(root))
            if not _parses(path):
                out["unparsed"] += 1
                continue
            facts = Facts()
            signal.setitimer(signal.ITIMER_PROF, bound)  # the process's CPU time (user and system)
            t0 = time.process_time()
            error = None
            try:
                analyse_files([path], facts)
            except PastBound:
                error = f"past the bound of {bound:g} CPU s"
            except Exception as e:  # noqa: BLE001 - the point is to find them
                error = "".join(traceback.format_exception_only(e)).strip()[:300]
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            took = time.process_time() - t0
            out["files"] += 1
            out["seconds"] += took
            if out["slowest"] is None or took > out["slowest"][1]:
                out["slowest"] = (f"{name}/{rel}", round(took, 3), sum(1 for _ in path.open("rb")))
            for why in ([error] if error else []) + facts.failures:
                out["failures"].append({"file": rel, "error": why})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdirs", nargs="+", type=Path)
    ap.add_argument("--bound", type=float, default=10.0, help="CPU seconds per file (default 10)")
    ap.add_argument("--limit", type=int, default=None, help="at most N files per repository")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    signal.signal(signal.SIGPROF, _alarm)
    results = []
    for gitdir in args.gitdirs:
        r = check_repo(gitdir, args.bound, args.limit)
        results.append(r)
        slow = r["slowest"]
        print(f"{r['repo']:<45} {r['files']:>5} files  {r['unparsed']:>3} unparsed  {len(r['failures']):>3} failed  "
              f"{r['seconds']:7.1f} CPU s  slowest {slow[0] if slow else '-'} ({slow[1] if slow else 0} s, "
              f"{slow[2] if slow else 0} lines)", flush=True)
        for f in r["failures"]:
            print(f"    FAILED {f['file']}: {f['error']}", flush=True)
    files = sum(r["files"] for r in results)
    failed = [f for r in results for f in r["failures"]]
    slow = max((r["slowest"] for r in results if r["slowest"]), key=lambda s: s[1], default=None)
    print(f"\nload average {os.getloadavg()[0]:.1f}; {len(results)} repositories, {files} files read, {sum(r['unparsed'] for r in results)} unparsed, "
          f"{len(failed)} failures, {sum(r['seconds'] for r in results):.1f} CPU s in all"
          + (f"; slowest file {slow[0]}: {slow[1]} CPU s ({slow[2]} lines)" if slow else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
