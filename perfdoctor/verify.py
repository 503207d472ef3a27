"""`perfdoctor verify`: each finding's fix applied in a scratch copy of the user's project, and what it
saves measured there, with the gate's statistics.

For each finding with a mechanical fix (`Finding.fix` written against the user's line; applied with
`rules.fixes.apply_fix`, the one patcher), and, where there is none, a safe ablation (the rule's
`[ablation]`: a line removed with the remove-call fixer, or the child's `--ablate data`, data loading
replaced by the first batch repeated: an upper bound on the saving, never a fix):

1. the project (the folder holding the script and the working folder; `.perfdoctor`, `.git`, virtual
   environments and run folders left out; files over BIG_FILE linked, not copied) is copied twice
   into the scratch folder: `original/` and the changed copy, each beside links to what lies beside the
   project's folder (a script reading `../data` reads the same files). The user's files are only read.
2. the original copy and the changed one run alternately under perfdoctor's capture (`--steps`, the
   profiled window at the last step, so that every other step is a steady one), `pairs` pairs, and
   more, one pair at a time, while the result is undecided, up to `max_pairs`.
3. each run's value is its median steady step where the rule's saving is paid on every step (robust to
   a shared machine's contention, which lands on some steps at random), its mean where the saving is
   paid on some steps only (the rule's `spread_over_steps`: an epoch start, every Nth step; the median
   would not see it); the saving's interval is the gate's bootstrap (gate.stats.side_replicates: a
   block bootstrap of each run's steps, with the run-to-run variance measured on the repeated runs),
   of the original's centre less the changed one's (`difference_interval`).
4. the verdict (`verdict`): `verified` (the saving is real and the prediction inside its interval),
   `smaller` / `larger` (real, the prediction above / below the interval; `smaller` also where the
   change made the step slower), `no-saving-here` (the interval holds no saving), `did-not-hold` (the
   fix does not apply, the changed copy raises or exits otherwise than the original, or, where two runs
   of the original give the same losses on their first steps, the changed copy's losses differ beyond
   LOSS_RTOL; not for the data ablation, which feeds other batches by design), `not-verifiable-here`
   (a GPU-only finding on a CPU run of a CUDA-targeting script, or no fix and no safe ablation).

A distributed job (a job folder of `rank-<R>` run folders, `perfdoctor run --nproc-per-node N`) is
verified as a job: every run of either copy is launched as the recorded job was, on this machine
(`launch_of`: torch.distributed.run --standalone --nproc-per-node N, every rank under capture), and a
run's steps are the job's: step i is the slowest rank's step i (gate.baseline.meta_and_steps, what the
gate compares), its losses rank 0's. A job of several nodes cannot be re-run here: one InputError.

Ctrl-C ends verify between or during runs: what was measured is judged, the rest is left out.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from perfdoctor.contracts.run import Meta, Probes, Rank, rank_dirs, read, read_meta
from perfdoctor.contracts.source import read_source
from perfdoctor.errors import InputError
from perfdoctor.facts import registry
from perfdoctor.gate import stats
from perfdoctor.gate.baseline import MIN_STEPS, meta_and_steps
from perfdoctor.gate.compare import LEVEL
from perfdoctor.model import Finding, Fix, Location, Report, Verification
from perfdoctor.rules.catalog import Rule
from perfdoctor.rules.engine import PROJECTED
from perfdoctor.rules.fixes import apply_fix, render_fix
from perfdoctor.stats import profiler_steps, quantile, warmup_steps

PAIRS = 3  # runs of each side before the first look: the gate's GATE_REPEATS
MAX_PAIRS = 6  # at most twice the runs the gate needs, per finding
STEPS = 30  # steps per run unless --steps (or the run verified had a limit)
LOSS_RTOL = 0.02  # the changed copy's loss on the first steps may differ this much (relative) where the original's do not
LOSS_ATOL = 1e-6  # two runs of the original give the same losses within this (a seeded script)
BIG_FILE = 16 * 2**20  # larger files are linked into the copies, not copied (data sets, checkpoints)
MAX_SIBLINGS = 1000  # entries beside a folder linked beside its copy (more: none at that level)
LINKED_LEVELS = 3  # the project's folder and 2 above it get what lies beside them linked (`../../data`)
MAX_COPY_BYTES = 512 * 2**20
MAX_COPY_FILES = 20_000
SKIP_DIRS = {".perfdoctor", ".git", ".hg", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox"}
SETTLED_HALFWIDTH = 0.02  # an interval around zero narrower than this share of the step settles "no saving"


@dataclass
class Change:
    """What is run against the original: the user's files rewritten (path -> new text) and/or a child ablation."""

    finding: Finding
    kind: str  # fix | ablation
    what: str  # what was changed, for the verdict's sentence
    files: dict[Path, str] = field(default_factory=dict)
    ablate: str | None = None
    statistic: str = "median"  # a run's value: "median" or "mean" (the rule's saving is spread over steps)


@dataclass
class Project:
    root: Path  # the user's folder copied
    script: Path | None
    module: str | None
    cwd: Path
    args: list[str]
    launch: list[str] | None = None  # torch.distributed.run's options where the run was a distributed job

    def inside(self, path: Path) -> Path | None:
        """`path` relative to the root, None where it is outside it."""
        try:
            return Path(os.path.abspath(path)).relative_to(self.root)
        except ValueError:
            return None


@dataclass
class Sides:
    original: list[list[float]] = field(default_factory=list)  # each run's steady step times
    changed: list[list[float]] = field(default_factory=list)
    original_losses: list[list[float | None]] = field(default_factory=list)
    changed_losses: list[list[float | None]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.original) + len(self.changed)


# -- the verdict, from measured series -------------------------------------------------------------
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": lambda xs: quantile(xs, 0.5), "mean": statistics.fmean}


def saving_interval(original: list[list[float]], changed: list[list[float]], statistic: str = "median",
                    seed: int = 0) -> tuple[float, float, float, float]:
    """(the original's centre, the saving's point estimate, its LEVEL interval's low and high end), in ms
    per step, a run's value being its median or mean step (`statistic`; gate.stats with `stat=`)."""
    of = STATISTICS[statistic]
    between = stats.pooled_between_log_var([original, changed], seed, MIN_STEPS, stat=of)
    sigma_b2, df = between or (0.0, 0)
    point, lo, hi = stats.difference_interval(original, changed, sigma_b2, df, seed=seed, level=LEVEL, stat=of)
    return stats.side_center([of(r) for r in original]), point, lo, hi


def verdict(predicted: float | None, point: float, lo: float, hi: float) -> tuple[str, str]:
    """The verdict and its reason, from the predicted saving and the measured one's interval (ms per step)."""
    span = f"{point:+.1f} ms/step ({LEVEL:.0%} interval {lo:+.1f} .. {hi:+.1f})"
    if hi < 0:
        return "smaller", f"the change made the step slower: {span}"
    if lo <= 0:
        if predicted is not None and lo <= predicted <= hi and predicted > 0:
            return "no-saving-here", (f"no measurable saving on this machine: {span}, which holds both no saving "
                                      f"and the predicted {predicted:.1f} ms")
        return "no-saving-here", f"no measurable saving on this machine: {span}"
    if predicted is None:
        return "verified", f"a real saving of {span}; perfdoctor gave no number to compare"
    if predicted > hi:
        return "smaller", f"a real saving, smaller than the predicted {predicted:.1f} ms: {span}"
    if predicted < lo:
        return "larger", f"a real saving, larger than the predicted {predicted:.1f} ms: {span}"
    return "verified", f"the predicted {predicted:.1f} ms is inside the measured saving: {span}"


def settled(predicted: float | None, step: float, lo: float, hi: float) -> bool:
    """More runs cannot change the verdict, or need not: the interval excludes no saving (a real saving
    or a slowdown), or it is narrow around zero and leaves out the prediction."""
    if lo > 0 or hi < 0:
        return True
    if predicted is not None and predicted > 0 and lo <= predicted <= hi:
        return False  # no saving and the predicted one both fit: undecided
    return (hi - lo) / 2 <= SETTLED_HALFWIDTH * step or predicted is not None


def loss_check(original: list[list[float | None]], changed: list[list[float | None]]) -> str | None:
    """Why the changed copy's loss trajectory does not hold (None where it holds, or cannot be told):
    only where two runs of the original agree on their first losses (the script seeds its RNGs)."""
    if len(original) < 2 or not changed:
        return None
    a, b = original[0], original[1]
    n = min(len(a), len(b))
    pairs = [(x, y) for x, y in zip(a[:n], b[:n]) if x is not None and y is not None]
    if not pairs or any(abs(x - y) > LOSS_ATOL * max(1.0, abs(x)) for x, y in pairs):
        return None  # the original itself differs from run to run: nothing to hold the copy to
    for run in changed:
        for i, (x, y) in enumerate(zip(a, run)):
            if x is None:
                continue
            if y is None or abs(x - y) > LOSS_RTOL * max(abs(x), 1e-3):
                got = "no loss" if y is None else f"{y:.6g}"
                return f"the loss at step {i + 1} is {got} against the original's {x:.6g} (the script seeds its RNGs)"
    return None


# -- the project and its copies --------------------------------------------------------------------
def project_of(meta: Meta) -> Project:
    script = Path(meta.script) if meta.script else None
    cwd = Path(meta.cwd or os.getcwd())
    if script is not None and not script.is_file():
        raise InputError(f"{script}: the script of this run is gone; verify needs it")
    roots = [str(cwd)] + ([str(script.parent)] if script else [])
    root = Path(os.path.commonpath(roots))
    if root == Path(root.anchor) or root == Path.home():
        root = script.parent if script else cwd
    args = list(meta.argv[1:])
    return Project(root=root, script=script, module=meta.module, cwd=cwd, args=args, launch=launch_of(meta))


def launch_of(meta: Meta) -> list[str] | None:
    """How to launch again the job a rank's run (`meta.rank`) belonged to, on this machine: its ranks per
    node under torch.distributed.run, `--standalone` (a free port of its own, so that verify's runs and
    another job on the machine do not meet); None for a run of one process. A job of several nodes is one
    InputError: verify re-runs it here only."""
    rank = meta.rank if isinstance(meta.rank, Rank) else None
    if rank is None or not rank.world_size or rank.world_size < 2:
        return None
    local = rank.local_world_size or rank.world_size
    if rank.world_size > local:
        raise InputError(f"a job of {rank.world_size} ranks over {rank.world_size // local} nodes: verify re-runs "
                         f"a job on this machine only; verify it from a run of one node (--nproc-per-node N)")
    return ["--standalone", "--nproc-per-node", str(local)]


def copy_project(project: Project, side: Path, scratch: Path) -> Path:
    """The project's files into `copy_root(project, side)` (links for files over BIG_FILE); never the
    scratch folder, run folders, `.perfdoctor`, `.git` or virtual environments. A project too large is
    one InputError. Beside the copy and the folders above it in `side`, links to what lies beside the
    project's folder and the folders above it (`linked_levels`; at most MAX_SIBLINGS entries a level), so
    that a path leaving it (`../data`, pytorch/examples' layout; `../../data`) reaches the same files as
    the script's own runs do. Returns the copy's root."""
    count, size = 0, 0
    dest = copy_root(project, side)

    def ignore(folder: str, names: list[str]) -> set[str]:
        nonlocal count, size
        out = set()
        for n in names:
            p = Path(folder) / n
            if n in SKIP_DIRS or p == scratch or (p.is_dir() and ((p / "meta.json").is_file() or (p / "pyvenv.cfg").is_file())):
                out.add(n)
            elif p.is_file() and not p.is_symlink():
                count += 1
                size += min(p.stat().st_size, BIG_FILE)
        if count > MAX_COPY_FILES or size > MAX_COPY_BYTES:
            raise InputError(f"{project.root}: too large to copy for verify ({count} files, {size >> 20} MB "
                             f"so far); run verify on a smaller project folder")
        return out

    def copy(src: str, dst: str) -> None:
        if os.path.getsize(src) > BIG_FILE:
            os.symlink(os.path.abspath(src), dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(project.root, dest, ignore=ignore, copy_function=copy, symlinks=True)
    for level, mirror in zip(linked_levels(project.root), dest.parents):
        try:
            siblings = [e for e in os.scandir(level.parent) if e.name != level.name]
        except OSError:
            continue
        if len(siblings) <= MAX_SIBLINGS:
            for e in siblings:
                os.symlink(os.path.abspath(e.path), mirror / e.name)
    return dest


def linked_levels(root: Path) -> list[Path]:
    """The project's folder and up to LINKED_LEVELS - 1 folders above it, nearest first, whose siblings
    are linked beside their mirror; never a level whose parent is the filesystem's root or the home."""
    out: list[Path] = []
    level = root
    while len(out) < LINKED_LEVELS and level.parent != level and level.parent not in (Path(level.anchor),
                                                                                        Path.home()):
        out.append(level)
        level = level.parent
    return out


def copy_root(project: Project, side: Path) -> Path:
    """Where the project's copy goes in `side`: under the names of the folders above it whose siblings
    are linked (`side/tutorials/02-intermediate/cnn` for a project `.../tutorials/02-intermediate/cnn`)."""
    above = [level.name for level in linked_levels(project.root)[1:]]
    return side.joinpath(*reversed(above), project.root.name)


def _mapped(project: Project, copy: Path, path: Path) -> Path:
    rel = project.inside(path)
    return copy / rel if rel is not None else path


def _mapped_args(project: Project, copy: Path) -> list[str]:
    """The script's arguments, with absolute paths into the project pointing into the copy (its writes stay there)."""
    root = str(project.root) + os.sep
    return [str(copy) + os.sep + a[len(root):] if a.startswith(root) else a for a in project.args]


# -- what each finding changes -----------------------------------------------------------------------
def _read(path: Path) -> str | None:
    """The file's UTF-8 text with universal newlines (as `read_text` gives it), read by contracts.source
    (regular files only, capped, shared with the analysis); None where it cannot be read or decoded."""
    sf = read_source(path)
    try:
        return None if sf is None else sf.data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        return None


def _removed_call(loc: Location, callee: str | None) -> Fix | None:
    """The statement at `loc` removed (the remove-call fixer), the call `callee` or, where None, the bare
    call statement the line is."""
    if callee is None:
        try:
            node = ast.parse(loc.code.strip()).body[0] if loc.code.strip() else None
        except SyntaxError:
            node = None
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            return None
        callee = ast.unparse(node.value.func)
    return render_fix("remove-call", loc, {"callee": callee})


def plan(finding: Finding, rule: Rule | None, gpu_only_here: bool) -> Change | Verification:
    """What verify changes for `finding`, or the verification it gets without running anything."""
    if gpu_only_here and rule is not None and rule.gpu_only:
        return Verification("not-verifiable-here", "fix", "a GPU-only problem on a CPU run of a CUDA-targeting "
                            "script: its cost exists only on a GPU; verify it on one")
    if gpu_only_here and finding.saving_basis.startswith(PROJECTED):
        return Verification("not-verifiable-here", "fix", "the saving is projected for the GPU the script targets; "
                            "this CPU run's step is not that step: verify it on one")
    loc = finding.locations[0] if finding.locations else None
    statistic = "mean" if rule is not None and rule.spread_over_steps else "median"
    # a fix in words (before = after = "": "num_workers comes from `workers`: give it 2 where that value is
    # set") changes nothing perfdoctor can apply: not a fix that did not hold
    words = finding.fix is not None and not finding.fix.before and not finding.fix.after
    if finding.fix is not None and not finding.fix.example and not words and loc is not None:
        source = _read(Path(loc.file))
        fixed = apply_fix(source, finding.fix, loc.line) if source is not None else None
        if fixed is None:
            return Verification("did-not-hold", "fix", f"the fix does not apply: its `before` is not in {loc.file}")
        return Change(finding, "fix", "the fix applied", {Path(loc.file): fixed}, statistic=statistic)
    ablation = rule.ablation if rule is not None else None
    if ablation is None:
        return Verification("not-verifiable-here", "fix", "the fix is words, not an edit perfdoctor can apply, and "
                            "the rule has no safe ablation" if words else "no mechanical fix and no safe ablation for this rule")
    kind, what = ablation["kind"], ablation["what"]
    if kind == "data":
        return Change(finding, "ablation", what, ablate="data", statistic=statistic)
    if loc is None:
        return Verification("not-verifiable-here", "ablation", f"{what}: the finding names no line to change")
    fix = _removed_call(loc, ablation.get("callee") if kind == "remove-call" else None)
    source = _read(Path(loc.file))
    changed = apply_fix(source, fix, loc.line) if fix is not None and source is not None else None
    if changed is None:
        return Verification("not-verifiable-here", "ablation", f"{what}: the line is not a call statement that can "
                            f"be left out safely")
    return Change(finding, "ablation", what, {Path(loc.file): changed}, statistic=statistic)


# -- running ----------------------------------------------------------------------------------------
@dataclass
class Progress:
    """One line per run on stderr: 'verifying PD002 2/4: run 3 of 6, ETA 40 s'."""

    total: int
    write: Callable[[str], None] | None = None  # default: a line on stderr
    run_s: list[float] = field(default_factory=list)

    def line(self, rule: str, n: int, run: int, of: int) -> None:
        eta = ""
        if self.run_s:
            left = (of - run + 1) * statistics.fmean(self.run_s)
            eta = f", ETA {left:.0f} s"
        line = f"verifying {rule} {n}/{self.total}: run {run} of {of}{eta}"
        if self.write is not None:
            self.write(line)
        else:
            sys.stderr.write(f"perfdoctor: {line}\n")
            sys.stderr.flush()


@dataclass
class Outcome:
    verified: list[tuple[Finding, Verification]]
    patch: str  # the unified diff of the fixes whose saving is real and that held ("" where none)
    interrupted: bool
    notes: list[str]


def steady(run_dir: Path) -> list[float]:
    """A verify run's steady step times: its warm-up (`stats.warmup_steps`) and the profiled step at its
    end (and the one after, `stats.profiler_steps`) left out. Not the gate's `steady_steps`, which
    also drops every step before the profiler's schedule: here that is every step. Of a job folder, the
    job's steps (each the slowest rank's: `meta_and_steps`, as the gate takes them)."""
    meta, steps = meta_and_steps(run_dir)
    timed = [s for s in steps if (s.get("wall_ms") or 0) > 0]
    held = profiler_steps(msgspec.to_builtins(meta.window) if meta.window is not None else None)
    drop = warmup_steps(len(timed))
    return [s["wall_ms"] for s in timed if s["i"] > drop and s["i"] not in held]


def _run(project: Project, copy: Path, out: Path, steps: int, ablate: str | None) -> tuple[int, str, list[float],
                                                                                            list[float | None], str]:
    """One run of a copy: (exit code, reason, steady step times, first losses, the traceback's last line)."""
    from perfdoctor.capture.runner import run_job, run_script

    target = str(_mapped(project, copy, project.script)) if project.script else str(project.module)
    launch = run_script if project.launch is None else functools.partial(run_job, launcher_args=project.launch)
    result = launch(target, module=project.script is None, script_args=_mapped_args(project, copy), out_dir=out,
                    steps=steps, cwd=_mapped(project, copy, project.cwd), quiet=True, ablate=ablate, timing=True)
    ranks = [d for _, d in rank_dirs(result.run_dir)] or [result.run_dir]  # a job: its ranks, rank 0 first
    tbs = [(read_meta(d).exit.traceback or "").strip().splitlines() for d in ranks]
    tb = next((t for t in tbs if t), [])  # the first rank that raised
    probes = read(ranks[0] / "probes.json", Probes)
    return result.exit_code, result.reason, steady(result.run_dir), list(probes.losses) if probes else [], \
        tb[-1] if tb else ""


def _measure(change: Change, n: int, total: int, project: Project, scratch: Path, steps: int, pairs: int,
             max_pairs: int, progress: Progress) -> tuple[Verification, bool]:
    """Run the original and the changed copy alternately and judge; (the verification, interrupted)."""
    rule = change.finding.rule
    name = f"{n:02d}-{rule}"
    orig_copy = copy_root(project, scratch / "original")
    new_copy = copy_project(project, scratch / name / "project", scratch)
    for path, text in change.files.items():
        target = _mapped(project, new_copy, path)
        target.unlink(missing_ok=True)  # a linked file is replaced, never written through
        target.write_text(text, encoding="utf-8")
    sides = Sides()
    predicted = change.finding.ms_per_step
    interrupted = False
    ok_codes: tuple[int, str] | None = None
    result: Verification | None = None
    planned = 2 * pairs
    k = 0
    while k < planned:
        which = "original" if k % 2 == 0 else "changed"
        progress.line(rule, n, k + 1, planned)
        t0 = time.monotonic()
        try:
            code, reason, series, losses, last = _run(project, orig_copy if which == "original" else new_copy,
                                                      scratch / name / f"{which}-{k // 2 + 1}", steps,
                                                      change.ablate if which == "changed" else None)
        except KeyboardInterrupt:
            interrupted = True
            break
        progress.run_s.append(time.monotonic() - t0)
        k += 1
        if reason == "interrupted":
            interrupted = True
            break
        if which == "original":
            if code != 0:
                return Verification("not-verifiable-here", change.kind, f"the original copy failed (exit {code}: {last}); "
                                    f"nothing to compare", runs=sides.runs + 1), False
            ok_codes = (code, reason)
            sides.original.append(series)
            sides.original_losses.append(losses)
            continue
        if ok_codes is not None and code != ok_codes[0]:
            why = f"{change.what}, the script {'raised' if reason == 'exception' else 'exited with ' + str(code)}"
            return Verification("did-not-hold", change.kind, f"{why}: {last}" if last else why, runs=sides.runs + 1), False
        sides.changed.append(series)
        sides.changed_losses.append(losses)
        # the data ablation feeds other batches by design: its losses differ and say nothing
        bad = loss_check(sides.original_losses, sides.changed_losses) if change.ablate is None else None
        if bad is not None and len(sides.original) >= 2:
            return Verification("did-not-hold", change.kind, f"{change.what}, {bad}", runs=sides.runs), False
        if len(sides.changed) < pairs:
            continue
        result = _judge(change, sides, predicted)
        assert result.interval_ms is not None
        if settled(predicted, result.step_ms or 0.0, *result.interval_ms):
            break
        planned = min(2 * max_pairs, k + 2)
    if len(sides.changed) and len(sides.original) and all(len(r) >= MIN_STEPS for r in sides.original + sides.changed):
        result = _judge(change, sides, predicted)
        if interrupted:
            result.why += " (interrupted: judged on the runs made)"
        if len(sides.original) < 2:
            result.why += "; one run per side: the interval leaves out the run-to-run noise"
    elif result is None:
        why = "interrupted before a run of each side ended" if interrupted else (
            f"too few steady steps per run (fewer than {MIN_STEPS}): give more --steps")
        result = Verification("no-saving-here" if not interrupted else "not-verifiable-here", change.kind, why,
                              runs=sides.runs)
    return result, interrupted


def _judge(change: Change, sides: Sides, predicted: float | None) -> Verification:
    base, point, lo, hi = saving_interval(sides.original, sides.changed, change.statistic)
    v, why = verdict(predicted, point, lo, hi)
    why += f"; {change.statistic} steps compared"
    if change.kind == "ablation":
        why = f"{change.what} (an upper bound on the saving, not a fix): {why}"
    return Verification(v, change.kind, why, point, (lo, hi), sides.runs, base)


def diff(project: Project, changes: list[Change]) -> str:
    """One unified diff of the changes' files, paths relative to the working folder where they are in it
    (else to the project's root), as `git apply` takes it there."""
    root = project.cwd if all(_rel(project.cwd, p) is not None for c in changes for p in c.files) else project.root
    texts: dict[Path, str] = {}
    originals: dict[Path, str] = {}
    for c in changes:
        for path in c.files:
            src = texts.get(path) or _read(path)
            fix = c.finding.fix
            if src is None or fix is None:
                continue
            loc = c.finding.locations[0] if c.finding.locations else None
            new = apply_fix(src, fix, loc.line if loc is not None and Path(loc.file) == path else None)
            if new is not None:
                originals.setdefault(path, _read(path) or "")
                texts[path] = new
    out: list[str] = []
    for path, new in texts.items():
        rel = (_rel(root, path) or path).as_posix()
        out += difflib.unified_diff(originals[path].splitlines(keepends=True), new.splitlines(keepends=True),
                                    f"a/{rel}", f"b/{rel}")
    return "".join(out)


def _rel(root: Path, path: Path) -> Path | None:
    try:
        return Path(os.path.abspath(path)).relative_to(root)
    except ValueError:
        return None


def verify(report: Report, run_dir: Path, rules: list[Rule], *, steps: int | None = None, pairs: int = PAIRS,
           max_pairs: int = MAX_PAIRS, scratch: Path | None = None, progress: Progress | None = None,
           only: Callable[[Finding], bool] | None = None) -> Outcome:
    """Verify the findings of `report` (the analysis of `run_dir`): each one gets its Verification
    (`Finding.verification`, set here too); the scratch copies and runs go under `scratch` (default
    `run_dir/verify`), the copies of the project are removed at the end."""
    meta, _ = meta_and_steps(run_dir)  # of a job folder, rank 0's
    project = project_of(meta)
    steps = steps or meta.steps_limit or STEPS
    scratch = Path(os.path.abspath(scratch or run_dir / "verify"))
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    by_id = {r.id: r for r in rules}
    seen = {"device.type": meta.env.device or "cpu",
            "script.targets_cuda": getattr(report.facts.get("script.targets_cuda"), "value", None)}
    gpu_only_here = bool(registry.derive("run.cuda_on_cpu", seen.get))
    findings = [f for f in report.findings if only is None or only(f)]
    plans: list[tuple[Finding, Change | Verification]] = [(f, plan(f, by_id.get(f.rule), gpu_only_here))
                                                          for f in findings]
    changes = [p for _, p in plans if isinstance(p, Change)]
    progress = progress or Progress(len(changes))
    notes: list[str] = []
    interrupted = False
    kept: list[Change] = []
    done: list[tuple[Finding, Verification]] = []
    try:
        if changes:
            copy_project(project, scratch / "original", scratch)
        n = 0
        for finding, p in plans:
            if isinstance(p, Verification):
                finding.verification = p
                done.append((finding, p))
                continue
            if interrupted:
                continue
            n += 1
            v, interrupted = _measure(p, n, len(changes), project, scratch, steps, pairs, max_pairs, progress)
            finding.verification = v
            done.append((finding, v))
            if p.kind == "fix" and v.interval_ms is not None and v.interval_ms[0] > 0 and v.verdict != "did-not-hold":
                kept.append(p)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for d in [scratch / "original", *scratch.glob("*/project")]:
            shutil.rmtree(d, ignore_errors=True)
    if interrupted:
        left = [f.rule for f, p in plans if isinstance(p, Change) and f.verification is None]
        notes.append("verify was interrupted: " + (f"not verified: {', '.join(left)}" if left else "judged on the runs made"))
    return Outcome(done, diff(project, kept) if kept else "", interrupted, notes)


def ratio(v: Verification, predicted: float | None) -> float | None:
    """Predicted over measured saving, where both are positive (the benchmark's figure)."""
    if predicted is None or v.measured_ms_per_step is None or v.measured_ms_per_step <= 0:
        return None
    r = predicted / v.measured_ms_per_step
    return r if math.isfinite(r) else None
