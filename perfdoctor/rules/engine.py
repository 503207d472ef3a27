"""Judge facts with rules: which rules fire, for which subject, at what estimated cost."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from perfdoctor.contracts.source import read_source
from perfdoctor.errors import RuleError
from perfdoctor.facts import registry
from perfdoctor.facts.model import Facts, Subject
from perfdoctor.model import Fact, Finding, Fix, Location
from perfdoctor.rules.catalog import GROUP_COUNT, LET_PREFIX, TEMPLATE_RE, Rule, split_placeholder
from perfdoctor.rules.config import Settings
from perfdoctor.rules.expr import Missing, evaluate, names_in
from perfdoctor.stats import quantile

IGNORE_RE = re.compile(r"#\s*perfdoctor:\s*ignore(?:\[([A-Za-z0-9_,\s-]+)\])?")
SOURCE_WORDS = {"run": "measured in this run", "trace": "measured in this trace"}
# Severity follows the measured cost: a saving below both floors' worth is minor (severity "low",
# collapsed under "minor" in the text report), whatever the rule's own severity.
MINOR_FRACTION = 0.01  # of the step
MINOR_MS = 0.2
GPU_ONLY = "GPU-only, not measured on this run"
PROJECTED = "projected for the GPU the script targets, not this machine's step"


def make_lookup(facts: Facts, subject: Subject | None, thresholds: dict[str, Any],
                lets: dict[str, str] | None = None) -> Callable[[str], Any]:
    """Reads a rule's names: thresholds, the subject's facts, the global facts, the derived facts
    (`registry.DERIVED_FACTS`, from the global facts) and the rule's lets (`let.NAME`, its expression
    evaluated over the same names once; Missing where a fact it needs is)."""
    values: dict[str, Any] = {}

    def lookup(name: str) -> Any:
        if name.startswith(LET_PREFIX) and lets is not None and name[len(LET_PREFIX):] in lets:
            if name not in values:
                try:
                    values[name] = evaluate(lets[name[len(LET_PREFIX):]], lookup)
                except Missing as e:
                    values[name] = e
            v = values[name]
            if isinstance(v, Missing):
                raise v
            return v
        if name.startswith("threshold."):
            key = name[len("threshold."):]
            if key in thresholds:
                return thresholds[key]
            raise Missing(name)
        if subject is not None and name in subject.facts:
            return subject.facts[name].value
        f = facts.get(name)
        if f is None:
            if name in registry.DERIVED_FACTS:
                v = registry.derive(name, facts.value)
                if v is not None:
                    return v
            raise Missing(name)
        return f.value

    return lookup


def _fact(facts: Facts, subject: Subject | None, name: str) -> Fact | None:
    if subject is not None and name in subject.facts:
        return subject.facts[name]
    return facts.get(name)


def _fmt(value: Any, spec: str) -> str:
    if spec:
        try:
            return format(value, spec)
        except (TypeError, ValueError, OverflowError):
            return str(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, tuple):
        return ", ".join(_fmt(v, "") for v in value)
    return str(value)


def render_template(text: str, lookup: Callable[[str], Any]) -> str:
    """Fill `{expr}` / `{expr:.1f}` placeholders; an unmeasured fact renders as `n/a`."""

    def sub(m: re.Match) -> str:
        expr, spec = split_placeholder(m.group(1))
        try:
            return _fmt(evaluate(expr, lookup), spec)
        except Missing:
            return "n/a"
        except RuleError:
            return "?"

    return TEMPLATE_RE.sub(sub, text)


def _render_params(params: Any, lookup: Callable[[str], Any]) -> Any:
    if isinstance(params, dict):
        # a parameter that renders to "" is left out (e.g. pin_memory only where batches go to a GPU)
        out = {k: _render_params(v, lookup) for k, v in params.items()}
        return {k: v for k, v in out.items() if v != ""}
    if isinstance(params, list):
        return [_render_params(v, lookup) for v in params]
    if isinstance(params, str):
        return render_template(params, lookup)
    return params


class Sources:
    """The user's own source files, the only files a finding's locations may make perfdoctor read
    (for ignore comments and fixes). A location comes from the input (a trace's frame names any
    path it likes, `/dev/zero` included): a file is read only when it lies inside the project
    folder (where the config was read: the current directory or `--config`'s folder) or is one of
    the run's user files, and `contracts.source` reads it (regular files only, at most
    MAX_SOURCE_BYTES). A relative path is taken from the project folder."""

    def __init__(self, project: Path, user_files: Iterable[Path | str] = ()):
        self.project = project.resolve()
        self.user_files = {Path(p).resolve() for p in user_files}
        self._lines: dict[str, list[str] | None] = {}

    def path(self, file: str) -> Path | None:
        """The file's resolved path when perfdoctor may read it, else None."""
        if not file or "\0" in file:
            return None
        try:
            p = (self.project / file).resolve()
        except (OSError, RuntimeError, ValueError):  # a symlink loop, an odd name
            return None
        return p if p in self.user_files or p.is_relative_to(self.project) else None

    def lines(self, file: str) -> list[str] | None:
        if file not in self._lines:
            p = self.path(file)
            sf = read_source(p)
            self._lines[file] = None if sf is None else sf.lines
        return self._lines[file]

    def line(self, file: str, line: int) -> str:
        lines = self.lines(file)
        return lines[line - 1] if lines is not None and 0 < line <= len(lines) else ""


def suppressed(finding: Finding, sources: Sources) -> bool:
    """An inline `# perfdoctor: ignore[PD005]` (or a bare `# perfdoctor: ignore`) on a flagged line."""
    for loc in finding.locations:
        text = sources.line(loc.file, loc.line) or loc.code
        m = IGNORE_RE.search(text or "")
        if m:
            if m.group(1) is None:
                return True
            codes = {c.strip().upper() for c in m.group(1).split(",")}
            if finding.rule.upper() in codes or finding.name in {c.lower() for c in codes}:
                return True
    return False


def _confidence(sources: set[str]) -> str:
    if sources & {"run", "trace"}:
        return "high"
    if "static" in sources:
        return "medium"
    return "low"


def gpu_only_context(facts: Facts) -> str | None:
    """The one policy for GPU-only problems on a CPU run: where the run (or trace) was on the CPU and
    the script targets CUDA (the derived fact `run.cuda_on_cpu`), what the source and the run show of
    a GPU-only problem is reported, unmeasured, marked `GPU_ONLY`, ranked below the measured findings.
    Returns why the cost is not measured, or None where this run can measure it (a GPU run) or the
    script does not target CUDA."""
    if registry.derive("run.cuda_on_cpu", facts.value):
        return "this run had no GPU and the script targets CUDA"
    return None


def _true(expr: str, lookup: Callable[[str], Any]) -> bool:
    try:
        return evaluate(expr, lookup) is True
    except Missing:
        return False


def _severity(rule: Rule, ms: float | None, frac: float | None, gpu_only: bool,
              gpu_share: float | None = None) -> str:
    if ms is not None and (ms < MINOR_MS or (frac is not None and frac < MINOR_FRACTION)):
        return "low"
    if gpu_share is not None and gpu_share * rule.gpu_gain < MINOR_FRACTION:
        return "low"  # a GPU-only finding whose saving is a sliver of the target GPU's estimated step
    if ms is None and not gpu_only and rule.severity_unmeasured:
        return rule.severity_unmeasured  # a GPU-only finding's missing number is this machine's, not the rule's
    return rule.severity


def _as_number(value: Any) -> float | None:
    """An expression's value as a number: None for a bool, a NaN or anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _number(rule: Rule, expr: str, lookup: Callable[[str], Any]) -> float | None:
    """A rule expression's number; None where it is unmeasured or not a number."""
    try:
        return _as_number(evaluate(expr, lookup))
    except Missing:
        return None
    except RuleError as e:
        raise RuleError(f"rule {rule.id}: {e.message}") from None


def _fix(rule: Rule, subject: Subject | None, lookup: Callable[[str], Any], files: Sources) -> Fix | None:
    # a trace from elsewhere, or a location outside the user's sources: no source to rewrite
    if (rule.fix_kind and rule.fix_kind != "text" and subject is not None and subject.locations
            and files.lines(subject.locations[0].file) is not None):
        from perfdoctor.rules.fixes import render_fix  # imports libcst: only when there is code to fix

        loc = subject.locations[0]
        path = files.path(loc.file)
        assert path is not None  # lines() read it
        fix = render_fix(rule.fix_kind, Location(str(path), loc.line, loc.code, loc.function),
                         _render_params(rule.fix_params, lookup))
        if fix is not None:
            if not fix.note and "note" in rule.fix_text:
                fix.note = render_template(rule.fix_text["note"], lookup)
            return fix
    if "after" in rule.fix_text:
        # a fix written in the rule file illustrates the change; it is not the user's own line
        return Fix(before=render_template(rule.fix_text.get("before", ""), lookup),
                   after=render_template(rule.fix_text["after"], lookup),
                   note=render_template(rule.fix_text.get("note", ""), lookup), example=True)
    if rule.fix_text.get("note"):  # words only: nothing to illustrate, so no example to call it
        return Fix(before="", after="", note=render_template(rule.fix_text["note"], lookup))
    return None


MIN_RANGE_STEPS = 4  # fewer steady steps give no saving range


def saving_range(expr: str, names: set[str], facts: Facts, subject: Subject | None,
                 lookup: Callable[[str], Any], lets: dict[str, str] | None = None) -> tuple[float, float] | None:
    """The saving's spread: `expr` evaluated at each steady-state step, with every fact that has a
    per-step series (`Fact.per_step`) read at that step and the others at their value; p25..p75 of
    those per-step savings (each floored at 0). None where no fact in it has a series, or where the
    series are of different steps: of different lengths, or from different sources (a run's steady
    steps and its trace's profiled steps are not the same steps)."""
    series = {n: f for n in names if (f := _fact(facts, subject, n)) is not None and f.per_step}
    lengths = {len(f.per_step) for f in series.values()}
    sources = {f.source for f in series.values()}
    if len(lengths) != 1 or len(sources) != 1 or (n := lengths.pop()) < MIN_RANGE_STEPS:
        return None  # no series, or series of different steps: no per-step reading
    values: list[float] = []
    for k in range(n):
        def at(name: str, k: int = k) -> Any:
            if lets and name.startswith(LET_PREFIX) and name[len(LET_PREFIX):] in lets:
                return evaluate(lets[name[len(LET_PREFIX):]], at)  # a let at this step too
            return series[name].per_step[k] if name in series else lookup(name)
        try:
            v = _as_number(evaluate(expr, at))
        except (Missing, RuleError):
            continue
        if v is not None:
            values.append(max(0.0, v))
    if len(values) < MIN_RANGE_STEPS:
        return None
    return quantile(values, 0.25), quantile(values, 0.75)


def judge_one(rule: Rule, facts: Facts, subject: Subject | None, thresholds: dict[str, Any],
              files: Sources, group_share: float | None = None) -> Finding | None:
    """One subject's finding, or None. `group_share`: a `once` rule's gpu_share summed over the subjects
    that showed it, where each subject's share is its own work (PD008's lines, each its own reads)."""
    lookup = make_lookup(facts, subject, thresholds, rule.lets)
    try:
        if not evaluate(rule.when, lookup):
            return None
    except Missing:
        return None
    except RuleError as e:
        raise RuleError(f"rule {rule.id}: {e.message}") from None

    ms: float | None = None
    spread: tuple[float, float] | None = None
    basis = render_template(rule.unmeasured, lookup) if rule.unmeasured else "not estimated"
    saving_names: set[str] = set()
    if rule.saving_ms and (value := _number(rule, rule.saving_ms, lookup)) is not None:
        ms = max(0.0, value)
        saving_names = rule.reads(names_in(rule.saving_ms))
    gpu_only = gpu_only_context(facts) if rule.gpu_only else None
    share: float | None = None
    if gpu_only:
        ms = None  # what a CPU run measures is not what the problem costs on the GPU
        if rule.gpu_share:
            share = group_share if group_share is not None else _number(rule, rule.gpu_share, lookup)
            if share is not None:  # the facts it reads are the finding's evidence
                saving_names = rule.reads(names_in(rule.gpu_share))
    step = facts.value("step.time_ms")
    if ms is not None and isinstance(step, (int, float)) and rule.spread_over_steps:
        step = step + ms  # the mean step holds the cost the median step does not
    projected = ms is not None and rule.projected_for_gpu is not None and _true(rule.projected_for_gpu, lookup)
    if projected and rule.projected_step and (gpu_step := _number(rule, rule.projected_step, lookup)):
        step = gpu_step  # the saving is a share of the GPU step it was projected on, not this CPU's
    frac = ms / step if ms is not None and isinstance(step, (int, float)) and step > 0 else None
    if ms is not None:
        srcs = {f.source for n in saving_names if (f := _fact(facts, subject, n)) is not None}
        words = [SOURCE_WORDS[s] for s in ("run", "trace") if s in srcs]
        basis = " and ".join(words) if words else "estimated from machine facts"
        if rule.saving_note:
            basis += f": {rule.saving_note}"
        if rule.saving_ms:
            spread = saving_range(rule.saving_ms, saving_names, facts, subject, lookup, rule.lets)
        if projected:
            basis = f"{PROJECTED}; from what was {basis}"

    used = rule.reads(names_in(rule.when)) | saving_names | set(rule.evidence)
    evidence = [f for n in sorted(used) if not n.startswith("threshold.") and (f := _fact(facts, subject, n))]
    sources = {f.source for f in evidence if f.source != "machine"}
    if subject is not None:
        sources |= {f.source for f in subject.facts.values()}
    confidence = _confidence(sources)
    if gpu_only:
        seen = "in the source and in this run" if sources >= {"static", "run"} else (
            "in this run" if "run" in sources else "in the source")
        basis = f"{GPU_ONLY}: {gpu_only}; the problem was seen {seen}. {basis[:1].upper()}{basis[1:]}"
        if share is not None:
            minor = share * rule.gpu_gain < MINOR_FRACTION
            basis += f". The work it affects is an estimated {share:.1%} of the step on the GPU the script targets"
            if rule.gpu_gain < 1:
                basis += (f"; the fix typically saves {rule.gpu_gain:.0%} of that work, about "
                          f"{share * rule.gpu_gain:.1%} of the step")
            basis += f" (minor: under {MINOR_FRACTION:.0%})" if minor else ""
        confidence = "medium" if sources & {"static", "run"} else "low"
    fix = None
    with facts.family(f"the fix of {rule.id}"):  # a bug rendering a fix costs the fix, not the finding
        fix = _fix(rule, subject, lookup, files)
    finding = Finding(
        rule=rule.id, name=rule.name, severity=_severity(rule, ms, frac, bool(gpu_only), share),
        title=render_template(rule.title, lookup), message=render_template(rule.message, lookup),
        why=rule.doc.why.strip(), ms_per_step=ms, fraction_of_step=frac, saving_basis=basis,
        confidence=confidence, locations=list(subject.locations) if subject else [],
        evidence=evidence, fix=fix, references=list(rule.doc.references),
        subject=subject.key if subject else "", saving_range=spread,
    )
    return None if suppressed(finding, files) else finding


def judge(facts: Facts, rules: list[Rule], settings: Settings | None = None,
          user_files: Iterable[Path | str] = ()) -> list[Finding]:
    """All findings, best first: measured savings (largest first), then severity; minor ones last.
    The findings' locations are read (ignore comments, fixes) only inside the settings' project
    folder or among `user_files` (a run's own files): `Sources`."""
    settings = settings or Settings()
    files = Sources(settings.project, user_files)
    findings: list[Finding] = []
    seen: dict[str, Finding] = {}
    for rule in rules:
        if not settings.enabled(rule.id):
            continue
        thresholds = {**rule.thresholds, **settings.thresholds.get(rule.id, {})}
        subjects: list[Subject | None] = [s for kind in rule.subjects for s in facts.of_kind(kind)]
        if not rule.subjects or (not subjects and rule.subject_optional):
            subjects = [None]  # e.g. a trace with no source locations: judge once, globally
        judged = [(s, f) for s in subjects if (f := judge_one(rule, facts, s, thresholds, files)) is not None]
        if rule.once and judged:
            shares = _shares(rule, facts, thresholds, judged)
            k = _speaker(judged, shares)
            known = [x for x in shares if x is not None]
            if len(judged) > 1 and known:
                total = sum(known)
                # the one that speaks for them is judged again at their summed share; the others give locations
                s = judged[k][0]
                if (f := judge_one(rule, facts, s, thresholds, files, total)) is not None:
                    judged[k] = (s, f)
            judged = [_one_of(rule, facts, thresholds, judged, k)]
        for _, f in judged:
            kept = seen.get(f.fingerprint())
            if kept is None:
                seen[f.fingerprint()] = f
                findings.append(f)
            else:  # another subject whose first line reads the same code in the same file (an evaluation's
                # and the training step's `x = x.to(device)`): one finding, with both places
                kept.locations += [loc for loc in f.locations if loc not in kept.locations]
    findings = group_identical(findings)
    findings.sort(key=lambda f: (f.minor, *f.sort_key()))
    return findings


def _shares(rule: Rule, facts: Facts, thresholds: dict[str, Any],
            judged: list[tuple[Subject | None, Finding]]) -> list[float | None]:
    """A `once` rule's gpu_share of each subject that showed it, where the expression reads the
    subject's own facts (each line's work adds up, and the sum judges the group); all None where it
    reads only global ones (PD016's convolutions' share is the same for every model's line)."""
    if not rule.gpu_share or not any(n.split(".", 1)[0] in rule.subjects for n in names_in(rule.gpu_share)):
        return [None] * len(judged)
    return [_number(rule, rule.gpu_share, make_lookup(facts, s, thresholds, rule.lets)) for s, _ in judged]


def _speaker(judged: list[tuple[Subject | None, Finding]], shares: list[float | None]) -> int:
    """Which of a `once` rule's findings speaks for them: the largest saving; where none has one, the
    largest share of the GPU step (`shares`: a CPU run's 1,280 mask selections a step before its one
    `loss.item()`); else the first."""
    savings = [-1.0 if f.ms_per_step is None else f.ms_per_step for _, f in judged]
    if max(savings) < 0:
        savings = [-1.0 if x is None else x for x in shares]
    return savings.index(max(savings))


def _one_of(rule: Rule, facts: Facts, thresholds: dict[str, Any],
            judged: list[tuple[Subject | None, Finding]], speaker: int) -> tuple[Subject | None, Finding]:
    """A `once` rule's one finding for every subject that showed it: the one with the largest saving
    (the first where none has one) speaks for them, with every subject's locations after its own and,
    where several showed it, the rule's `title_group` (its names and `group.count`)."""
    subject, first = judged[speaker]
    for _, f in judged:
        first.locations += [loc for loc in f.locations if loc not in first.locations]
    if len(judged) > 1 and rule.title_group:
        lookup = make_lookup(facts, subject, thresholds, rule.lets)
        first.title = render_template(
            rule.title_group, lambda name: len(judged) if name == GROUP_COUNT else lookup(name))
    return subject, first


def group_identical(findings: list[Finding]) -> list[Finding]:
    """Findings of one rule that say the same (title, message, severity and saving: PD028's conv
    bias in three layers) are one finding with every location listed in file order (the first of
    them its identity), and one fix (with a note that the change is the same at the others)."""
    out: list[Finding] = []
    by_text: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.rule, f.title, f.message, f.severity, f.ms_per_step)
        first = by_text.get(key)
        if first is None or not f.locations or not first.locations:
            by_text.setdefault(key, f)
            out.append(f)
            continue
        before = len(first.locations)
        first.locations = sorted(first.locations + [loc for loc in f.locations if loc not in first.locations],
                                 key=lambda loc: (loc.file, loc.line))
        if first.fix is not None and len(first.locations) > before and first.fix.before and \
                not first.fix.note.endswith(SAME_CHANGE):
            first.fix.note = (first.fix.note + " " if first.fix.note else "") + SAME_CHANGE
    return out


SAME_CHANGE = "The same change at each location listed."
