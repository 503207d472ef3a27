"""Judge facts with rules: which rules fire, for which subject, at what estimated cost."""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfdoctor.errors import RuleError
from perfdoctor.facts.model import Facts, Subject
from perfdoctor.model import Fact, Finding, Fix
from perfdoctor.rules.catalog import TEMPLATE_RE, Rule, split_placeholder
from perfdoctor.rules.config import Settings
from perfdoctor.rules.expr import Missing, evaluate, names_in

IGNORE_RE = re.compile(r"#\s*perfdoctor:\s*ignore(?:\[([A-Za-z0-9_,\s-]+)\])?")
SOURCE_WORDS = {"run": "measured in this run", "trace": "measured in this trace"}
# Severity follows the measured cost: a saving below both floors' worth is minor (severity "low",
# collapsed under "minor" in the text report), whatever the rule's own severity.
MINOR_FRACTION = 0.01  # of the step
MINOR_MS = 0.2
GPU_ONLY = "GPU-only, not measured on this run"


def make_lookup(facts: Facts, subject: Subject | None, thresholds: dict[str, Any]) -> Callable[[str], Any]:
    def lookup(name: str) -> Any:
        if name.startswith("threshold."):
            key = name[len("threshold."):]
            if key in thresholds:
                return thresholds[key]
            raise Missing(name)
        if subject is not None and name in subject.facts:
            return subject.facts[name].value
        f = facts.get(name)
        if f is None:
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
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
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


def suppressed(finding: Finding) -> bool:
    """An inline `# perfdoctor: ignore[PD005]` (or a bare `# perfdoctor: ignore`) on a flagged line."""
    for loc in finding.locations:
        line = linecache.getline(loc.file, loc.line) if loc.file and loc.line else ""
        text = line or loc.code
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
    the script targets CUDA (`script.targets_cuda`, read from the source: a `"cuda"` device, `.cuda()`),
    what the source and the run show of a GPU-only problem is reported, unmeasured, marked
    `GPU_ONLY`, ranked below the measured findings. Returns why the cost is not measured, or None
    where this run can measure it (a GPU run) or the script does not target CUDA."""
    if facts.value("device.type") == "cpu" and facts.value("script.targets_cuda") is True:
        return "this run had no GPU and the script targets CUDA"
    return None


def minor(finding: Finding) -> bool:
    """A measured finding worth too little to list with the others (the text report collapses it)."""
    return finding.severity == "low" and finding.ms_per_step is not None


def _severity(rule: Rule, ms: float | None, frac: float | None) -> str:
    if ms is not None and (ms < MINOR_MS or (frac is not None and frac < MINOR_FRACTION)):
        return "low"
    return rule.severity


def _fix(rule: Rule, subject: Subject | None, lookup: Callable[[str], Any]) -> Fix | None:
    if (rule.fix_kind and rule.fix_kind != "text" and subject is not None and subject.locations
            and Path(subject.locations[0].file).is_file()):  # a trace from elsewhere: no source to rewrite
        from perfdoctor.rules.fixes import render_fix  # imports libcst: only when there is code to fix

        fix = render_fix(rule.fix_kind, subject.locations[0], _render_params(rule.fix_params, lookup))
        if fix is not None:
            if not fix.note and "note" in rule.fix_text:
                fix.note = render_template(rule.fix_text["note"], lookup)
            return fix
    if "after" in rule.fix_text:
        # a fix written in the rule file illustrates the change; it is not the user's own line
        return Fix(before=render_template(rule.fix_text.get("before", ""), lookup),
                   after=render_template(rule.fix_text["after"], lookup),
                   note=render_template(rule.fix_text.get("note", ""), lookup), example=True)
    if rule.fix_text.get("note"):
        return Fix(before="", after="", note=render_template(rule.fix_text["note"], lookup), example=True)
    return None


def judge_one(rule: Rule, facts: Facts, subject: Subject | None, thresholds: dict[str, Any]) -> Finding | None:
    lookup = make_lookup(facts, subject, thresholds)
    try:
        if not evaluate(rule.when, lookup):
            return None
    except Missing:
        return None
    except RuleError as e:
        raise RuleError(f"rule {rule.id}: {e.message}") from None

    ms: float | None = None
    basis = render_template(rule.unmeasured, lookup) if rule.unmeasured else "not estimated"
    saving_names: set[str] = set()
    if rule.saving_ms:
        try:
            value = evaluate(rule.saving_ms, lookup)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                ms = max(0.0, float(value))
                saving_names = names_in(rule.saving_ms)
        except Missing:
            ms = None
        except RuleError as e:
            raise RuleError(f"rule {rule.id}: {e.message}") from None
    gpu_only = gpu_only_context(facts) if rule.gpu_only else None
    if gpu_only:
        ms = None  # what a CPU run measures is not what the problem costs on the GPU
    step = facts.value("step.time_ms")
    frac = ms / step if ms is not None and isinstance(step, (int, float)) and step > 0 else None
    if ms is not None:
        srcs = {f.source for n in saving_names if (f := _fact(facts, subject, n)) is not None}
        words = [SOURCE_WORDS[s] for s in ("run", "trace") if s in srcs]
        basis = " and ".join(words) if words else "estimated from machine facts"
        if rule.saving_note:
            basis += f": {rule.saving_note}"

    used = names_in(rule.when) | saving_names | set(rule.evidence)
    evidence = [f for n in sorted(used) if not n.startswith("threshold.") and (f := _fact(facts, subject, n))]
    sources = {f.source for f in evidence if f.source != "machine"}
    if subject is not None:
        sources |= {f.source for f in subject.facts.values()}
    confidence = _confidence(sources)
    if gpu_only:
        seen = "in the source and in this run" if sources >= {"static", "run"} else (
            "in this run" if "run" in sources else "in the source")
        basis = f"{GPU_ONLY}: {gpu_only}; the problem was seen {seen}. {basis[:1].upper()}{basis[1:]}"
        confidence = "medium" if sources & {"static", "run"} else "low"
    finding = Finding(
        rule=rule.id, name=rule.name, severity=_severity(rule, ms, frac),
        title=render_template(rule.title, lookup), message=render_template(rule.message, lookup),
        why=rule.doc.why.strip(), ms_per_step=ms, fraction_of_step=frac, saving_basis=basis,
        confidence=confidence, locations=list(subject.locations) if subject else [],
        evidence=evidence, fix=_fix(rule, subject, lookup), references=list(rule.doc.references),
        subject=subject.key if subject else "",
    )
    return None if suppressed(finding) else finding


def judge(facts: Facts, rules: list[Rule], settings: Settings | None = None) -> list[Finding]:
    """All findings, best first: measured savings (largest first), then severity; minor ones last."""
    settings = settings or Settings()
    findings: list[Finding] = []
    seen: set[str] = set()
    for rule in rules:
        if not settings.enabled(rule.id):
            continue
        thresholds = {**rule.thresholds, **settings.thresholds.get(rule.id, {})}
        subjects: list[Subject | None] = [s for kind in rule.subjects for s in facts.of_kind(kind)]
        if not rule.subjects or (not subjects and rule.subject_optional):
            subjects = [None]  # e.g. a trace with no source locations: judge once, globally
        for subject in subjects:
            f = judge_one(rule, facts, subject, thresholds)
            if f is not None and f.fingerprint() not in seen:
                seen.add(f.fingerprint())
                findings.append(f)
    findings.sort(key=lambda f: (minor(f), *f.sort_key()))
    return findings
