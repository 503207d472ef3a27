"""SARIF 2.1.0 for GitHub code scanning (and any other SARIF viewer).

Pure: takes a Report (its findings and the rules' documentation it carries), a gate Comparison, or
both, and returns the JSON text. Locations are
made relative to the repository root (`root`, else $GITHUB_WORKSPACE, else the current folder)
so code scanning can place them on the file. partialFingerprints hash the finding's one identity
(`perfdoctor.model.finding_identity`: the rule, the file's name and the code line's text, never the
line number), so a finding keeps its identity when lines move above it, and SARIF, baselines and
the gate agree on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import msgspec

from perfdoctor import __version__
from perfdoctor.gate.compare import Comparison
from perfdoctor.model import Finding, Location, Report, RuleDoc
from perfdoctor.report import escape

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
LEVEL = {"high": "error", "medium": "warning", "low": "note"}
PRECISION = {"high": "high", "medium": "medium", "low": "low"}
INFO_URI = "https://pypi.org/project/perfdoctor/"


def artifact_uri(file: str, root: Path | None) -> str:
    """A URI relative to the repository root where the file lies under it, else a file:// URI."""
    p = Path(file)
    if root is not None and p.is_absolute():
        try:
            return quote(PurePosixPath(*p.resolve().relative_to(root.resolve()).parts).as_posix())
        except ValueError:
            return p.resolve().as_uri()
    if p.is_absolute():
        return p.as_uri()
    return quote(PurePosixPath(*p.parts).as_posix()) if p.parts else ""


def fingerprint(finding: Finding) -> str:
    """partialFingerprints of a finding: a hash of its identity (`Finding.fingerprint`)."""
    return hashlib.sha256(finding.fingerprint().encode()).hexdigest()[:32]


def _rule_help(rule: RuleDoc) -> tuple[str, str]:
    text, md = [], []
    for val, key, head in ((rule.what, "what", "What it does"), (rule.why, "why", "Why is this bad?"),
                           (rule.example, "example", "Example"), (rule.use_instead, "use_instead", "Use instead"),
                           (rule.fix_safety, "fix_safety", "Fix safety")):
        val = (val or "").strip()
        if not val:
            continue
        text += [f"{head}: {val}" if key not in ("example", "use_instead") else f"{head}:\n{val}", ""]
        md += [f"## {head}", "", f"```python\n{val}\n```" if key in ("example", "use_instead") else val, ""]
    if rule.references:
        text += ["References: " + ", ".join(rule.references)]
        md += ["## References", ""] + [f"- <{r}>" for r in rule.references]
    return "\n".join(text).strip() or rule.summary, "\n".join(md).strip() or rule.summary


def _descriptor(rule: RuleDoc) -> dict[str, Any]:
    short = rule.summary or rule.id
    help_text, help_md = _rule_help(rule)
    return {"id": rule.id, "name": rule.name or rule.id,
            "shortDescription": {"text": short},
            "fullDescription": {"text": (rule.what or short).strip()},
            "help": {"text": help_text, "markdown": help_md},
            "defaultConfiguration": {"level": LEVEL.get(rule.severity, "warning")},
            "properties": {"tags": ["performance", "pytorch"]}}


def to_sarif(findings: list[Finding], rules: Iterable[RuleDoc], root: Path | str | None = None,
             comparison: Comparison | None = None, report: Report | None = None) -> dict[str, Any]:
    """SARIF of `findings`, a descriptor for each of their rules (`rules`, the report's own,
    `Report.rules`; a finding whose rule is not among them gets one from its own words). With the
    gate's `comparison`, each result says whether it is new since the baseline (`baselineState`),
    and the run's property bag carries the verdict; with the `report`, what its config changed, the
    trace events dropped and the wait for a CPU."""
    root_path = Path(root) if root is not None else Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
    by_id = {r.id: r for r in rules}
    for f in findings:  # a finding whose rule the report does not document still gets a descriptor
        by_id.setdefault(f.rule, RuleDoc(id=f.rule, name=f.name, severity=f.severity, summary=f.title,
                                         what=f.why or f.title))
    ids = sorted(by_id)
    descriptors = [_descriptor(by_id[i]) for i in ids]
    index = {i: n for n, i in enumerate(ids)}
    results = []
    for f in findings:
        # the saving as report.json holds it
        ms = None if f.ms_per_step is None else round(f.ms_per_step, 3)
        msg = (f.message or f.title or f.rule).strip()
        if ms is not None:
            frac = None if f.fraction_of_step is None else round(f.fraction_of_step, 4)
            msg += f" Estimated saving: {ms:.1f} ms per step" + (f" ({frac:.0%} of the step)." if frac is not None else ".")
        if f.fix and f.fix.after:
            msg += f" Fix: {' '.join(f.fix.after.split())}"
        res: dict[str, Any] = {"ruleId": f.rule, "ruleIndex": index[f.rule],
                               "level": LEVEL.get(f.severity, "warning"), "message": {"text": msg},
                               "properties": {"confidence": f.confidence or None,
                                              "precision": PRECISION.get(f.confidence or "medium", "medium"),
                                              "estimatedSavingMsPerStep": ms}}
        if f.verification is not None:  # `perfdoctor verify`: the measured saving beside the estimate
            res["properties"]["verification"] = f.verification.as_dict()
        locs = [l for l in f.locations if l.file]
        if locs:
            res["locations"] = []
            for l in locs:
                phys: dict[str, Any] = {"artifactLocation": {"uri": artifact_uri(l.file, root_path)}}
                if l.line >= 1:
                    phys["region"] = {"startLine": l.line}
                    if l.code:
                        phys["region"]["snippet"] = {"text": l.code}
                res["locations"].append({"physicalLocation": phys})
        res["partialFingerprints"] = {"perfdoctorFinding/v1": fingerprint(f)}
        results.append(res)
    run: dict[str, Any] = {"tool": {"driver": {"name": "perfdoctor", "version": __version__, "semanticVersion": __version__,
                                               "informationUri": INFO_URI, "rules": descriptors}},
                           "results": results, "columnKind": "unicodeCodePoints"}
    props: dict[str, Any] = {}
    if report is not None:
        info, contention = report.run, report.summary.contention
        if info.config:  # what the project's config changed
            props["perfdoctorConfig"] = msgspec.to_builtins(info.config)
        if info.dropped_events:  # trace events dropped or repaired
            props["perfdoctorDroppedEvents"] = info.dropped_events
        if contention:  # how long the training thread waited for a CPU, and whether that inflated the step times
            props["perfdoctorContention"] = msgspec.to_builtins(contention)
    if props:
        run["properties"] = props
    if comparison is not None:
        new = {g.fingerprint for g in comparison.new_findings}
        for res, f in zip(results, findings):
            res["baselineState"] = "new" if f.fingerprint() in new else "unchanged"
        gate = comparison.as_dict()  # the gate's JSON (`compare --format json`), in the run's properties
        run.setdefault("properties", {})["perfdoctorGate"] = {k: gate[k] for k in (
            "verdict", "failed", "max_regression", "ci_level", "rows", "resolved_findings", "notes")}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def comparison_findings(comparison: Comparison) -> list[Finding]:
    """The current side's findings in a comparison as findings (the comparison keeps each one's rule,
    severity, title, file, line and code, and its identity), for `to_sarif`."""
    out = []
    for g in comparison.findings:
        subject = g.fingerprint[len(g.rule) + 1:] if g.fingerprint.startswith(g.rule + ":") else ""
        out.append(Finding(rule=g.rule, name="", severity=g.severity or "medium", title=g.title or g.rule, message="",
                           why="", ms_per_step=None, fraction_of_step=None, saving_basis="", confidence="",
                           locations=[Location(g.file, g.line, g.code)] if g.file else [], subject=subject))
    return out


def _text(doc: dict[str, Any]) -> str:
    """The SARIF log as JSON, its strings without control characters (`escape.json_doc`,
    `escape.json_text`)."""
    return escape.json_text(json.dumps(escape.json_doc(doc), indent=2, ensure_ascii=False)) + "\n"


def render_report(report: Report, rules: Iterable[RuleDoc] | None = None, root: Path | str | None = None) -> str:
    """SARIF 2.1.0 text of a report's findings. `rules`: the rules' documentation (RuleDoc); None:
    the report's own (`Report.rules`)."""
    return _text(to_sarif(report.findings, report.rules if rules is None else rules, root, report=report))


def render_comparison(comparison: Comparison, rules: Iterable[RuleDoc] | None = None,
                      root: Path | str | None = None) -> str:
    """`compare --format sarif`: the current side's findings as the comparison keeps them, each
    marked new or unchanged since the baseline; the verdict in the run's properties."""
    return _text(to_sarif(comparison_findings(comparison), rules or [], root, comparison))


def render_both(report: Report, comparison: Comparison, rules: Iterable[RuleDoc] | None = None,
                root: Path | str | None = None) -> str:
    """`run --baseline --format sarif`: the report's findings, each marked new or unchanged since
    the baseline; the verdict in the run's properties."""
    return _text(to_sarif(report.findings, report.rules if rules is None else rules, root, comparison, report))
