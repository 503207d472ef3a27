"""SARIF 2.1.0 for GitHub code scanning (and any other SARIF viewer).

Pure: takes a Report (or its dict) and the rule metadata, returns the JSON text. Locations are
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
from perfdoctor.model import finding_identity
from perfdoctor.report import escape

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
LEVEL = {"high": "error", "medium": "warning", "low": "note"}
PRECISION = {"high": "high", "medium": "medium", "low": "low"}
INFO_URI = "https://pypi.org/project/perfdoctor/"


def _as_dict(obj: Any) -> dict[str, Any]:
    return msgspec.to_builtins(obj.as_dict()) if hasattr(obj, "as_dict") else dict(obj)


def identity_of(finding: dict[str, Any]) -> str:
    """`finding_identity` of a finding in report.json's shape."""
    loc = (finding.get("locations") or [{}])[0]
    if loc.get("file"):
        return finding_identity(str(finding.get("rule")), loc["file"], loc.get("code"))
    return finding.get("fingerprint") or finding_identity(str(finding.get("rule")), None, None)


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


def fingerprint(finding: dict[str, Any]) -> str:
    """partialFingerprints of a finding (a report's, or a comparison's in report shape): a hash of
    its identity."""
    return hashlib.sha256(identity_of(finding).encode()).hexdigest()[:32]


def _rule_help(rule: dict[str, Any]) -> tuple[str, str]:
    doc = rule.get("doc") or {}
    text, md = [], []
    for key, head in (("what", "What it does"), ("why", "Why is this bad?"), ("example", "Example"),
                      ("use_instead", "Use instead"), ("fix_safety", "Fix safety")):
        val = (doc.get(key) or "").strip()
        if not val:
            continue
        text += [f"{head}: {val}" if key not in ("example", "use_instead") else f"{head}:\n{val}", ""]
        md += [f"## {head}", "", f"```python\n{val}\n```" if key in ("example", "use_instead") else val, ""]
    refs = doc.get("references") or []
    if refs:
        text += ["References: " + ", ".join(refs)]
        md += ["## References", ""] + [f"- <{r}>" for r in refs]
    return "\n".join(text).strip() or rule.get("summary", rule["id"]), "\n".join(md).strip() or rule.get("summary", rule["id"])


def _descriptor(rule: dict[str, Any]) -> dict[str, Any]:
    doc = rule.get("doc") or {}
    short = rule.get("summary") or rule.get("title") or rule["id"]
    help_text, help_md = _rule_help(rule)
    d = {"id": rule["id"], "name": rule.get("name") or rule["id"],
         "shortDescription": {"text": short},
         "fullDescription": {"text": (doc.get("what") or short).strip()},
         "help": {"text": help_text, "markdown": help_md},
         "defaultConfiguration": {"level": LEVEL.get(rule.get("severity", "medium"), "warning")},
         "properties": {"tags": ["performance", "pytorch"]}}
    if rule.get("help_uri"):
        d["helpUri"] = rule["help_uri"]
    return d


def to_sarif(report: Any, rules: Iterable[Any] | None = None, root: Path | str | None = None,
             comparison: Any = None) -> dict[str, Any]:
    """SARIF of a report's findings, a descriptor for each of their rules (`rules`: rule objects or
    dicts; by default the report's own, `Report.rules`). With the gate's `comparison`, each result
    says whether it is new since the baseline (`baselineState`), and the run's property bag carries
    the verdict."""
    r = _as_dict(report)
    root_path = Path(root) if root is not None else Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
    by_id = {d["id"]: d for d in (r.get("rules") or [] if rules is None else [_as_dict(x) for x in rules])}
    findings = r.get("findings") or []
    for f in findings:  # a finding whose rule the report does not document still gets a descriptor
        by_id.setdefault(f["rule"], {"id": f["rule"], "name": f.get("name"), "summary": f.get("title"),
                                     "severity": f.get("severity"), "doc": {"what": f.get("why") or f.get("title")}})
    ids = sorted(by_id)
    descriptors = [_descriptor(by_id[i]) for i in ids]
    index = {i: n for n, i in enumerate(ids)}
    results = []
    for f in findings:
        saving = f.get("estimated_saving")
        msg = (f.get("message") or f.get("title") or f["rule"]).strip()
        if saving:
            frac = saving.get("fraction_of_step")
            msg += f" Estimated saving: {saving['ms_per_step']:.1f} ms per step" + (f" ({frac:.0%} of the step)." if frac is not None else ".")
        fix = f.get("fix")
        if fix and fix.get("after"):
            msg += f" Fix: {' '.join(fix['after'].split())}"
        res: dict[str, Any] = {"ruleId": f["rule"], "ruleIndex": index[f["rule"]],
                               "level": LEVEL.get(f.get("severity", "medium"), "warning"), "message": {"text": msg},
                               "properties": {"confidence": f.get("confidence"),
                                              "precision": PRECISION.get(f.get("confidence", "medium"), "medium"),
                                              "estimatedSavingMsPerStep": saving["ms_per_step"] if saving else None}}
        if f.get("verification"):  # `perfdoctor verify`: the measured saving beside the estimate
            res["properties"]["verification"] = f["verification"]
        locs = [l for l in f.get("locations") or [] if l.get("file")]
        if locs:
            res["locations"] = []
            for l in locs:
                uri = artifact_uri(l["file"], root_path)
                phys: dict[str, Any] = {"artifactLocation": {"uri": uri}}
                if int(l.get("line") or 0) >= 1:
                    phys["region"] = {"startLine": int(l["line"])}
                    if l.get("code"):
                        phys["region"]["snippet"] = {"text": l["code"]}
                res["locations"].append({"physicalLocation": phys})
        res["partialFingerprints"] = {"perfdoctorFinding/v1": fingerprint(f)}
        results.append(res)
    run: dict[str, Any] = {"tool": {"driver": {"name": "perfdoctor", "version": __version__, "semanticVersion": __version__,
                                               "informationUri": INFO_URI, "rules": descriptors}},
                           "results": results, "columnKind": "unicodeCodePoints"}
    info = r.get("run") or {}
    props = {k: info[key] for k, key in (("perfdoctorConfig", "config"), ("perfdoctorDroppedEvents", "dropped_events"))
             if info.get(key)}  # what the project's config changed; trace events dropped or repaired
    contention = (r.get("summary") or {}).get("contention")
    if contention:  # how long the training thread waited for a CPU, and whether that inflated the step times
        props["perfdoctorContention"] = contention
    if props:
        run["properties"] = props
    if comparison is not None:
        c = _as_dict(comparison)
        new = {f["fingerprint"] for f in c.get("new_findings") or []}
        for res, f in zip(results, findings):
            res["baselineState"] = "new" if identity_of(f) in new else "unchanged"
        run.setdefault("properties", {})["perfdoctorGate"] = {k: c.get(k) for k in ("verdict", "failed", "max_regression", "ci_level",
                                                                      "rows", "resolved_findings", "notes")}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def comparison_findings(comparison: Any) -> dict[str, Any]:
    """A report-shaped dict of the current side's findings in a comparison (which keeps each
    finding's rule, severity, title, file, line and code), for `to_sarif`."""
    c = _as_dict(comparison)
    return {"findings": [{"rule": f["rule"], "title": f.get("title") or f["rule"], "severity": f.get("severity") or "medium",
                          "locations": [{"file": f["file"], "line": f.get("line") or 0, "code": f.get("code") or ""}]
                          if f.get("file") else [], "fingerprint": f.get("fingerprint")}
                         for f in c.get("findings") or []]}


def _text(doc: dict[str, Any]) -> str:
    """The SARIF log as JSON, its strings without control characters (`escape.json_doc`,
    `escape.json_text`)."""
    return escape.json_text(json.dumps(escape.json_doc(doc), indent=2, ensure_ascii=False)) + "\n"


def render_report(report: Any, rules: Iterable[Any] | None = None, root: Path | str | None = None) -> str:
    """SARIF 2.1.0 text of a report's findings. `rules`: rule objects or dicts (id, name, severity,
    summary, doc{what, why, example, use_instead, fix_safety, references}); None: the report's own."""
    return _text(to_sarif(report, rules, root))


def render_comparison(comparison: Any, rules: Iterable[Any] | None = None, root: Path | str | None = None) -> str:
    """`compare --format sarif`: the current side's findings as the comparison keeps them, each
    marked new or unchanged since the baseline; the verdict in the run's properties."""
    return _text(to_sarif(comparison_findings(comparison), rules, root, comparison))


def render_both(report: Any, comparison: Any, rules: Iterable[Any] | None = None,
                root: Path | str | None = None) -> str:
    """`run --baseline --format sarif`: the report's findings, each marked new or unchanged since
    the baseline; the verdict in the run's properties."""
    return _text(to_sarif(report, rules, root, comparison))
