"""Do perfdoctor's predicted savings hold? `perfdoctor verify` on every sample that has a fixed twin
(sample_scripts/X.py and X_fixed.py, tests/data/X.py and X_fixed.py) and on scripts of the labelled
corpus, and the predicted / measured saving per finding and per rule.

    python benchmarks/verify_savings.py [--steps 20] [--only pd027 ...] [--corpus dev|test|none]
                                        [--corpus-only ID ...] [--site DIR ...] [--twin] [--json PATH]

For each script: `perfdoctor verify SCRIPT --steps N --format json` on a copy (samples: in a temporary
folder; corpus scripts: materialised by benchmarks/corpus.py under --work), one row per finding with its
verification: the verdict, predicted and measured ms per step, the measured saving's 90% interval, the
runs, and the load average (1 min) before and after. Samples give rows for their expected rules (their
`# expect:` lines); corpus scripts for every finding verify changed something for. The frozen test half
(`--corpus test`) is run, never read: rows give the script id, the rule and the numbers, no code.

A sample names its own perfdoctor options on a `# perfdoctor-run: ...` line (tests/analysis/test_e2e_samples
reads the same line): its `--steps` replaces --steps, and its launch options (`--nproc-per-node 2`: a DDP
sample, whose `init_process_group` needs a launcher) are given to `perfdoctor verify`, which then verifies
the job with every verify run launched the same way; its bare twin runs go through the same launcher
(torch.distributed.run --standalone with those options) and a step is the slowest rank's, as verify's.

With `--twin`, each fix's saving is also measured independently: the original and its fixed twin (the
sample's hand-written `_fixed` file; for a corpus script, a copy with the finding's own fix applied)
run bare (`benchmarks/bare_steps.py`: plain Python, no perfdoctor capture, an optimizer step hook notes
the time), alternated, `--twin-pairs` pairs, each run's value its mean step after the warm-up
(perfdoctor.stats.warmup_steps); the saving is the original's mean less the twin's. The table gives
verify's measured saving over it (agreement: within 0.8-1.2) and the prediction over it (0.75-1.25).

Then per rule: the median of predicted / measured over its rows where both are positive, and whether it
lies inside 0.75..1.33 (a rule outside needs its model fixed); beside it, over all its rows, the sum of the
predictions over the sum of the measured savings, how many predictions lie inside the measured interval
and how many savings are real (a median over the positive rows alone hides the rows measured negative).
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
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DIRS = (REPO / "sample_scripts", REPO / "tests" / "data")
BARE = Path(__file__).resolve().parent / "bare_steps.py"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

EXPECT = re.compile(r"#\s*expect:\s*((?:PD\d{3}[,\s]*)+)")
# the repo first, then whatever PYTHONPATH the caller set (where perfdoctor's own dependencies may live)
ENV = {"OMP_NUM_THREADS": "1", **os.environ, "NO_COLOR": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@dataclass
class Target:
    """One script to verify: its copy, how it runs, and the rows wanted."""

    name: str
    script: Path
    cwd: Path
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    steps: int = 20
    twin: Path | None = None  # a hand-written fixed twin (samples); corpus twins are made from each fix
    rules: set[str] | None = None  # the rules to report (None: every finding verify changed something for)
    timeout: float = 3600
    launch: list[str] = field(default_factory=list)  # perfdoctor's launch options (--nproc-per-node N), torchrun's names


def expected(script: Path) -> set[str]:
    return {r for line in script.read_text().splitlines() for m in [EXPECT.search(line)] if m
            for r in re.findall(r"PD\d{3}", m.group(1))}


def run_options(script: Path) -> list[str]:
    """The options of the script's `# perfdoctor-run: ...` line (none where it has none)."""
    return next((line.split(":", 1)[1].split() for line in script.read_text().splitlines()
                 if line.startswith("# perfdoctor-run:")), [])


def load() -> float:
    return os.getloadavg()[0]


# -- the independent measurement: bare runs, alternated ------------------------------------------------------
def bare_mean_step(script: Path, args: list[str], cwd: Path, env: dict[str, str], steps: int, out: Path,
                   timeout: float, launch: list[str] | None = None) -> float | None:
    """One bare run's mean step after the warm-up (ms), None where it failed or made too few steps. With
    `launch` (torch.distributed.run's options) the job, every rank bare (bare_steps.py writes rank R's
    times to OUT.rank-R), step i being the slowest rank's (as verify and the gate take a job's steps)."""
    from perfdoctor.stats import warmup_steps

    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", *launch] if launch else [sys.executable]
    p = subprocess.run([*launcher, str(BARE), str(out), str(steps), str(script), *args], cwd=cwd, env=env,
                       capture_output=True, timeout=timeout, check=False)
    files = sorted(out.parent.glob(out.name + ".rank-*")) if launch else [out]
    per_rank = []
    try:
        for f in files:
            ends = json.loads(f.read_text())["step_end_s"]
            per_rank.append([(b - a) * 1e3 for a, b in zip(ends, ends[1:])])
    except (OSError, ValueError, KeyError):
        return None
    if not per_rank:
        return None
    gaps = [max(g) for g in zip(*per_rank)]
    gaps = gaps[warmup_steps(len(gaps)):]
    if p.returncode != 0 or len(gaps) < 3:
        return None
    return statistics.fmean(gaps)


def bare_saving(t: Target, original: Path, fixed: Path, fixed_cwd: Path, pairs: int, work: Path) -> dict | None:
    """The original less its twin, run bare and alternated: the mean of each side's run means."""
    sides: dict[str, list[float]] = {"original": [], "fixed": []}
    for k in range(2 * pairs):
        side = "original" if k % 2 == 0 else "fixed"
        script, cwd = (original, t.cwd) if side == "original" else (fixed, fixed_cwd)
        m = bare_mean_step(script, t.args, cwd, t.env, t.steps, work / f"bare-{side}-{k}.json", t.timeout, t.launch)
        if m is None:
            return None
        sides[side].append(m)
    o, f = statistics.fmean(sides["original"]), statistics.fmean(sides["fixed"])
    per_pair = [a - b for a, b in zip(sides["original"], sides["fixed"])]
    return {"ms": o - f, "step_ms": o, "pairs_ms": [round(x, 2) for x in per_pair]}


def twin_of(t: Target, finding: dict) -> tuple[Path, Path] | None:
    """A copy of a corpus script's folder with the finding's own fix applied: (the script, the cwd) in it.
    The copy is a sibling of the folder (`NAME-twin`), so that paths leaving it (`../../data`) still hold."""
    from perfdoctor.model import Fix
    from perfdoctor.rules.fixes import apply_fix

    fix = finding.get("fix")
    loc = (finding.get("locations") or [{}])[0]
    if not fix or fix.get("example") or not loc.get("file"):
        return None
    root = Path(os.path.commonpath([t.script.parent, t.cwd, Path(loc["file"]).parent]))
    dest = root.with_name(root.name + "-twin")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(root, dest, symlinks=True)
    target = dest / Path(loc["file"]).relative_to(root)
    new = apply_fix(target.read_text(), Fix(fix["before"], fix["after"], fix.get("note", ""), False), loc.get("line"))
    if new is None:
        return None
    target.write_text(new)
    return dest / t.script.relative_to(root), dest / t.cwd.relative_to(root)


# -- verify -------------------------------------------------------------------------------------------------
def one(t: Target, twin: bool, twin_pairs: int, work: Path, budget: list[str] | None = None) -> list[dict]:
    l0 = load()
    # verify's progress lines ("verifying PD021 2/2: run 3 of 6") pass through as they come: a call cut
    # off by a time limit still shows how far each fix got
    out, tail = work / "verify.json", []
    with out.open("w") as stdout, subprocess.Popen(
            [sys.executable, "-m", "perfdoctor", "verify", *t.launch, str(t.script), "--steps", str(t.steps),
             *(budget or []), "--format", "json", "--out-dir", str(work / "run"), "--", *t.args],
            cwd=t.cwd, env=t.env, stdout=stdout, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr is not None
        for line in p.stderr:
            tail = (tail + [line.rstrip()])[-5:]
            if line.startswith("perfdoctor: verifying"):
                print(f"{t.name}: {line.rstrip()}", file=sys.stderr, flush=True)
        rc = p.wait(timeout=t.timeout * 20)
    l1 = load()
    text = out.read_text()
    if rc not in (0, 1) or not text.strip():
        return [{"script": t.name, "rule": "-", "error": (tail or ["?"])[-1][:160]}]
    doc = json.loads(text)
    rows = []
    for f in doc["findings"]:
        v = f.get("verification") or {}
        if t.rules is not None:
            if f["rule"] not in t.rules or not any(Path(loc["file"]).name == t.script.name for loc in f["locations"]):
                continue
        elif not v or v.get("runs", 0) == 0:
            continue
        saving = f.get("estimated_saving") or {}
        row = {"script": t.name, "rule": f["rule"], "verdict": v.get("verdict"), "kind": v.get("kind"),
               "predicted_ms": saving.get("ms_per_step"), "measured_ms": v.get("measured_ms_per_step"),
               "interval_ms": v.get("interval_ms"), "step_ms": v.get("step_ms"), "runs": v.get("runs"),
               "why": v.get("why"), "load": [round(l0, 2), round(l1, 2)]}
        if twin and v.get("kind") == "fix" and v.get("verdict") not in ("did-not-hold", "not-verifiable-here"):
            made = (t.twin, t.cwd) if t.twin is not None else twin_of(t, f)
            if made is not None:
                lt = load()
                row["twin"] = bare_saving(t, t.script, made[0], made[1], twin_pairs, work)
                row["twin_load"] = [round(lt, 2), round(load(), 2)]
        rows.append(row)
    if not rows:
        rows.append({"script": t.name, "rule": ",".join(sorted(t.rules or [])) or "-",
                     "error": "no finding verified" if t.rules is None else "no expected finding reported"})
    return rows


def sample_targets(work: Path, steps: int, only: list[str] | None) -> list[Target]:
    out = []
    for d in SAMPLE_DIRS:
        for s in sorted(d.glob("*.py")):
            twin = s.with_name(s.stem + "_fixed.py")
            if s.stem.endswith("_fixed") or not twin.exists() or not expected(s):
                continue
            if only and not any(s.name.startswith(o) for o in only):
                continue
            dest = work / s.stem
            dest.mkdir(parents=True)
            shutil.copy(s, dest / s.name)
            shutil.copy(twin, dest / twin.name)
            launch, n = run_options(s), steps
            own = launch.index("--steps") if "--steps" in launch else None
            if own is not None:  # the sample's own step count (a problem seen every few steps)
                n, launch = int(launch[own + 1]), launch[:own] + launch[own + 2:]
            out.append(Target(s.name, dest / s.name, dest, ENV, steps=n, twin=dest / twin.name,
                              rules=expected(s), timeout=600, launch=launch))
    return out


def corpus_target(script: dict, repos: dict, work: Path, site: list[Path], steps: int) -> Target | dict:
    """A corpus script materialised and prepared by benchmarks/corpus.py, or why it could not be."""
    import corpus

    ns = argparse.Namespace(mirror=corpus.DEFAULT_MIRROR, work=work, site=site, timeout=None, prepare_only=True,
                            reanalyse=False)
    r = corpus.run_script(script, repos, ns)
    if r["status"] != "prepared":
        return {"script": script["id"], "rule": "-", "error": f"{r['status']}: {r.get('error', '')}"[:160]}
    root = work / script["id"] / "repo"
    script_dir = str(Path(script["path"]).parent)
    env = {**corpus.script_env(script, root, site), "NO_COLOR": "1"}
    return Target(script["id"], root / script["path"], root / script.get("cwd", script_dir), env,
                  [str(a) for a in script.get("args", [])], steps=steps, timeout=script.get("timeout", 300))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", action="append", help="a sample name's start, e.g. pd027 (repeatable)")
    ap.add_argument("--no-samples", action="store_true", help="corpus scripts only")
    ap.add_argument("--corpus", choices=("dev", "test", "none"), default="none",
                    help="also verify the corpus's development half or its frozen test half (run, never read)")
    ap.add_argument("--corpus-only", action="append", default=[], metavar="ID", help="these corpus scripts only")
    ap.add_argument("--site", action="append", type=Path, default=[], help="extra folder on PYTHONPATH (corpus)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/perfdoctor-verify"), help="corpus scratch folder")
    ap.add_argument("--twin", action="store_true", help="also measure each fix bare against its twin (independent)")
    ap.add_argument("--twin-pairs", type=int, default=3)
    ap.add_argument("--repeats", type=int, help="verify's --repeats (default: verify's own, 3)")
    ap.add_argument("--max-repeats", type=int, help="verify's --max-repeats (default: verify's own, 6)")
    ap.add_argument("--json", type=Path, help="write the rows here (appended to what is there)")
    ap.add_argument("--table", action="store_true", help="print the table of --json's rows, run nothing")
    args = ap.parse_args()
    rows: list[dict] = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    if args.table:
        print(table(rows))
        return 0
    budget = [*(["--repeats", str(args.repeats)] if args.repeats else []),
              *(["--max-repeats", str(args.max_repeats)] if args.max_repeats else [])]

    def record(got: list[dict]) -> None:
        rows.extend(got)
        for r in got:
            print(json.dumps(r), file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))

    if not args.no_samples:
        with tempfile.TemporaryDirectory(prefix="pd-verify-") as tmp:
            for t in sample_targets(Path(tmp), args.steps, args.only):
                with tempfile.TemporaryDirectory(dir=tmp) as w:
                    try:
                        record(one(t, args.twin, args.twin_pairs, Path(w), budget))
                    except subprocess.TimeoutExpired:
                        record([{"script": t.name, "rule": "-", "error": "timed out"}])
    if args.corpus != "none":
        import corpus

        repos, scripts = corpus.load_corpus()
        chosen = [s for s in scripts if s["split"] == args.corpus
                  and (not args.corpus_only or s["id"] in args.corpus_only)]
        for s in chosen:
            t = corpus_target(s, repos, args.work, args.site, args.steps)
            if isinstance(t, dict):
                record([t])
                continue
            try:
                record(one(t, args.twin, args.twin_pairs, args.work / s["id"], budget))
            except subprocess.TimeoutExpired:
                record([{"script": t.name, "rule": "-", "error": "timed out"}])
    print(table(rows))
    return 0


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and a > 0 and b > 0 else None


def table(rows: list[dict]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    def r2(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    out = ["| script | rule | kind | verdict | predicted | measured (90% interval) | pred/meas | bare twin | "
           "meas/bare | pred/bare | runs | load |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['script']} | {r['rule']} | | {r['error']} | | | | | | | | |")
            continue
        iv = r.get("interval_ms")
        meas = ms(r.get("measured_ms")) + (f" ({iv[0]:.1f} .. {iv[1]:.1f})" if iv else "")
        tw = (r.get("twin") or {}).get("ms")
        out.append(f"| {r['script']} | {r['rule']} | {r.get('kind') or ''} | {r.get('verdict')} | "
                   f"{ms(r.get('predicted_ms'))} | {meas} | {r2(_ratio(r.get('predicted_ms'), r.get('measured_ms')))} | "
                   f"{ms(tw)} | {r2(_ratio(r.get('measured_ms'), tw))} | {r2(_ratio(r.get('predicted_ms'), tw))} | "
                   f"{r.get('runs') or ''} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    out += ["", "| rule | predicted / measured (median) | rows | inside 0.75-1.33 | sum predicted / sum measured "
            "(all rows) | prediction inside the interval | real savings |", "|---|---:|---:|---|---:|---:|---:|"]
    for rule, s in sorted(per_rule(rows).items()):
        med, n = s["median"], s["positive"]
        out.append(f"| {rule} | {r2(med)} | {n} | {'-' if med is None else 'yes' if 0.75 <= med <= 1.33 else 'NO'} | "
                   f"{r2(s['sum_ratio'])} | {s['inside']} of {s['rows']} | {s['real']} of {s['rows']} |")
    return "\n".join(out)


def per_rule(rows: list[dict]) -> dict[str, dict]:
    """Per rule, over its rows with a predicted and a measured number (did-not-hold left out): the median
    of predicted / measured where both are positive (the issue's statistic), and, because a median over
    positive rows leaves out every row whose measured saving came out negative, the sum of the
    predictions over the sum of the measured savings of all rows, the rows whose prediction lies inside
    the measured 90% interval, and the rows with a real saving (the interval above zero)."""
    out: dict[str, dict] = {}
    for r in rows:
        p, m, iv = r.get("predicted_ms"), r.get("measured_ms"), r.get("interval_ms")
        if p is None or m is None or r.get("verdict") == "did-not-hold":
            continue
        s = out.setdefault(r["rule"], {"ratios": [], "p": 0.0, "m": 0.0, "rows": 0, "inside": 0, "real": 0})
        s["rows"] += 1
        s["p"] += p
        s["m"] += m
        if (q := _ratio(p, m)) is not None:
            s["ratios"].append(q)
        if iv:
            s["inside"] += iv[0] <= p <= iv[1]
            s["real"] += iv[0] > 0
    for s in out.values():
        s["median"] = statistics.median(s["ratios"]) if s["ratios"] else None
        s["positive"] = len(s["ratios"])
        s["sum_ratio"] = s["p"] / s["m"] if s["m"] > 0 else None
    return out


if __name__ == "__main__":
    sys.exit(main())
