"""The rule catalog: one TOML file per rule, in the top-level `rules/` folder (shipped in the
wheel as `perfdoctor/_rules`). Rules are data: conditions and estimates are safe expressions
(`perfdoctor.rules.expr`), fixes name one of perfdoctor's fixers with parameters.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from perfdoctor.contracts import files
from perfdoctor.errors import InputError, RuleError
from perfdoctor.facts import registry
from perfdoctor.model import SEVERITIES, RuleDoc
from perfdoctor.rules.expr import names_in
from perfdoctor.rules.fixes import fix_kinds

# perfdoctor's fixers, and "text": a before/after written in the rule file, shown as an example
FIX_KINDS = (*fix_kinds(), "text")
ID_RE = re.compile(r"^[A-Z]{2,4}\d{3}$")
TEMPLATE_RE = re.compile(r"\{([^{}]+)\}")
FORMAT_SPEC_RE = re.compile(r"^[<>^]?[+\- ]?,?\d{0,3}(\.\d{1,2})?[dfeg%s]?$")


@dataclass
class Doc:
    what: str
    why: str
    example: str = ""
    use_instead: str = ""
    fix_safety: str = ""
    references: list[str] = field(default_factory=list)


@dataclass
class Rule:
    id: str
    name: str
    severity: str
    summary: str  # one line, for tables
    title: str  # template
    message: str  # template
    when: str  # expression
    subject: str | None  # judged once per subject of this kind (the first of `subjects`), else once
    subject_optional: bool  # with no subject of that kind, judge once on the global facts
    saving_ms: str | None  # expression; None = never estimated
    unmeasured: str  # why there is no number, when saving_ms cannot be evaluated
    saving_note: str  # how the number is estimated from the measured one, added to the saving basis
    thresholds: dict[str, Any]
    fix_kind: str | None
    fix_params: dict[str, Any]
    fix_text: dict[str, str]  # for kind "text" and as the fallback: before / after / note templates
    evidence: list[str]  # fact names shown as evidence (beyond those the condition reads)
    doc: Doc
    path: Path | None = None
    # every subject kind it is judged on (`subject = ["sync", "host_read"]`: the trace's syncs and
    # the source's and the probe's host reads are one problem); () without a subject
    subjects: tuple[str, ...] = ()
    # the problem exists only on a GPU: on a CPU run of a script that targets CUDA it is reported
    # from the source and the run's evidence, unmeasured, and marked (perfdoctor.rules.engine)
    gpu_only: bool = False
    # the saving is paid on some steps only (an epoch start, every Nth step) and spread over all of
    # them: the median step does not hold it, so its share is of the median step plus the saving
    spread_over_steps: bool = False
    # an expression: where true, the saving is projected for the GPU a CPU run's script targets (PD002's
    # loading as a share of an estimated GPU step), not this machine's; the basis says so and verify,
    # which measures this machine, leaves it to a GPU (engine.PROJECTED)
    projected_for_gpu: str | None = None
    # beside projected_for_gpu: the projected GPU step (ms) a projected saving is a share of (PD002's
    # estimated GPU step with the loading it leaves), not this machine's step: a CPU step of 12 s made a
    # projected 12 ms saving 0.1 % of "the step", minor
    projected_step: str | None = None
    # a GPU-only rule's expression: the share of the step, on the GPU a CPU run's script targets, that the
    # affected work takes (PD004's copies over facts/trace/target_gpu.py's estimated step). Where it
    # evaluates below engine.MINOR_FRACTION the finding is minor, as a measured one is; the basis gives the
    # share. None, or unmeasured: the rule's severity
    gpu_share: str | None = None
    # the part of that work the fix typically saves, from the rule's own claim (PD016: cuDNN's autotuner,
    # "a few" per cent of the convolutions' time; PD004's copies go entirely: 1): the finding is minor where
    # gpu_share x gpu_gain, the saving's share of the step, is under engine.MINOR_FRACTION
    gpu_gain: float = 1.0
    # one finding per run however many subjects show it: the fix is one setting for the process
    # (PD016's cudnn.benchmark), so the other subjects' locations follow the first's
    once: bool = False
    # a `once` rule's title where several subjects showed it (a template over the first finding's names
    # and `group.count`, the number of subjects; the locations list them all); "": the first's title
    title_group: str = ""
    # the severity of a finding this run could not put a number on (the rule's `unmeasured` case);
    # None: the rule's severity
    severity_unmeasured: str | None = None
    # where there is no mechanical fix, what `perfdoctor verify` may take away instead to bound the saving
    # ([ablation]: {"kind": one of ABLATIONS, "what": a phrase, "callee": for remove-call}); None: nothing safe
    ablation: dict[str, str] | None = None
    # `[let]`: named values, each an expression over facts, thresholds and the lets before it, read
    # in the rule's other expressions as `let.NAME` (evaluated where read: rules.engine.make_lookup)
    lets: dict[str, str] = field(default_factory=dict)

    def reads(self, names: set[str]) -> set[str]:
        """`names` with each `let.NAME` replaced by the facts and thresholds its expression reads, and
        each derived fact by the facts it is derived from (`registry.DERIVED_FACTS`)."""
        out: set[str] = set()
        for n in names:
            if n.startswith(LET_PREFIX) and n[len(LET_PREFIX):] in self.lets:
                out |= self.reads(names_in(self.lets[n[len(LET_PREFIX):]]))
            elif n in registry.DERIVED_FACTS:
                out |= set(registry.DERIVED_FACTS[n].inputs)
            else:
                out.add(n)
        return out

    def report_doc(self) -> RuleDoc:
        """What a report carries of this rule (its renderers never load the catalog)."""
        d = self.doc
        return RuleDoc(id=self.id, name=self.name, severity=self.severity, summary=self.summary, what=d.what,
                       why=d.why, example=d.example, use_instead=d.use_instead, fix_safety=d.fix_safety,
                       references=list(d.references), when=self.when, thresholds=dict(self.thresholds),
                       lets=dict(self.lets))

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "severity": self.severity, "summary": self.summary,
                "subject": self.subject, "when": self.when, "saving_ms": self.saving_ms,
                "thresholds": dict(self.thresholds),
                "doc": {"what": self.doc.what, "why": self.doc.why, "example": self.doc.example,
                        "use_instead": self.doc.use_instead, "fix_safety": self.doc.fix_safety,
                        "references": list(self.doc.references)}}


# the name a `title_group` reads for the number of subjects a `once` rule's finding stands for
GROUP_COUNT = "group.count"

# `perfdoctor verify`'s ablations: "data" (the child delivers the first batch again: capture/ablation.py),
# "remove-call" (the call `callee` removed at the finding's line), "skip-line" (the call statement at
# the finding's line removed)
ABLATIONS = ("data", "remove-call", "skip-line")


def builtin_rules_dir() -> Path:
    """`perfdoctor/_rules` in an installed wheel; the repository's `rules/` in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "_rules", here.parent / "rules"):
        if cand.is_dir():
            return cand
    raise RuleError("perfdoctor's rule files are missing from this installation; reinstall perfdoctor")


def _req(d: dict, key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v.strip():
        raise RuleError(f"{where}: '{key}' must be a non-empty str")
    return v


def split_placeholder(body: str) -> tuple[str, str]:
    """`expr` or `expr:spec` (a colon inside the expression's strings is not a spec)."""
    expr, sep, spec = body.rpartition(":")
    if sep and expr.strip() and FORMAT_SPEC_RE.match(spec):
        return expr, spec
    return body, ""


def template_names(text: str) -> set[str]:
    """The names the `{expr}` placeholders of a template read (each placeholder vetted)."""
    out: set[str] = set()
    for m in TEMPLATE_RE.finditer(text):
        out |= names_in(split_placeholder(m.group(1))[0])
    return out


def _param_names(params: Any) -> set[str]:
    if isinstance(params, dict):
        return set().union(*(_param_names(v) for v in params.values()))
    if isinstance(params, list):
        return set().union(*(_param_names(v) for v in params))
    return template_names(params) if isinstance(params, str) else set()


LET_PREFIX = "let."
LET_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


def parse_lets(data: Any, where: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """A rule's `[let]` table: names to expressions, each reading facts, thresholds and only the lets
    written before it (so there is no cycle); and the names each reads, for check_names."""
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise RuleError(f"{where}: [let] must map names to expressions (strings)")
    lets: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for name, expr in data.items():
        if not LET_NAME_RE.match(name):
            raise RuleError(f"{where}: [let] name {name!r} must be lower_case letters, digits and _")
        try:
            names = names_in(expr)
        except RuleError as e:
            raise RuleError(f"{where}: let.{name}: {e.message}") from None
        later = sorted(n for n in names if n.startswith(LET_PREFIX) and n[len(LET_PREFIX):] not in lets)
        if later:
            raise RuleError(f"{where}: let.{name} reads {later[0]!r}, which is not a let written before it")
        lets[name] = expr
        used[f"let.{name}"] = names
    return lets, used


def check_names(names: dict[str, set[str]], subjects: tuple[str, ...], thresholds: dict[str, Any], where: str,
                lets: dict[str, str] | None = None) -> None:
    """Every name a rule reads (by the field that reads it) must be a declared fact it can see
    (perfdoctor.facts.registry: the global facts, and its subject kinds') or one of its own thresholds."""
    subject = subjects[0] if subjects else None
    for field_name, used in names.items():
        for name in sorted(used):
            if name.startswith(LET_PREFIX):
                if name[len(LET_PREFIX):] not in (lets or {}):
                    raise RuleError(f"{where}: {field_name} reads {name!r}, which is not in the rule's [let] "
                                    f"({', '.join(sorted(lets or {})) or 'none'})")
                continue
            if name.startswith(registry.THRESHOLD_PREFIX):
                key = name[len(registry.THRESHOLD_PREFIX):]
                if key not in thresholds:
                    raise RuleError(f"{where}: {field_name} reads {name!r}, which is not in the rule's "
                                    f"[thresholds] ({', '.join(sorted(thresholds)) or 'none'})")
                continue
            if registry.readable(name, None) or any(registry.readable(name, k) for k in subjects):
                continue
            kind = name.split(".", 1)[0]
            if kind in registry.SUBJECT_FACTS and name in registry.SUBJECT_FACTS[kind] and kind not in subjects:
                hint = f"it is a fact of {kind} subjects, and this rule's subject is {subject or 'none'}"
            else:
                seen = [*registry.GLOBAL_FACTS, *registry.SUBJECT_FACTS.get(subject or "", {})]
                close = difflib.get_close_matches(name, seen, n=1)
                hint = f"did you mean {close[0]!r}?" if close else "no fact of that name is measured"
            raise RuleError(f"{where}: {field_name} reads {name!r}, which is not a fact perfdoctor produces ({hint})")


MAX_RULE_TEXT = 8_000  # characters in one text of a rule (the built-in rules' longest: about 1,200)
MAX_RULE_ITEMS = 64  # entries in one list or table of a rule


def _bounded(x: Any, where: str, path: str = "") -> None:
    """Every text and list of a rule file within MAX_RULE_TEXT / MAX_RULE_ITEMS: what a rule says is
    repeated in every report that shows it (each finding, each format), so its size bounds theirs."""
    if isinstance(x, str) and len(x) > MAX_RULE_TEXT:
        raise RuleError(f"{where}: {path or 'a value'} is {len(x):,} characters, over the {MAX_RULE_TEXT:,} a rule's "
                        f"text may hold")
    if isinstance(x, (list, dict)):
        if len(x) > MAX_RULE_ITEMS:
            raise RuleError(f"{where}: {path or 'the rule'} has {len(x):,} entries, over the {MAX_RULE_ITEMS} a rule "
                            f"may hold")
        for k, v in (x.items() if isinstance(x, dict) else enumerate(x)):
            _bounded(v, where, f"{path}.{k}" if path else str(k))


def parse_rule(data: dict[str, Any], where: str) -> Rule:
    _bounded(data, where)
    rid = _req(data, "id", where)
    if not ID_RE.match(rid):
        raise RuleError(f"{where}: rule id {rid!r} must look like PD001")
    severity = _req(data, "severity", where)
    if severity not in SEVERITIES:
        raise RuleError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    when = _req(data, "when", where)
    used: dict[str, set[str]] = {}
    try:
        used["when"] = names_in(when)
        if data.get("saving_ms") is not None:
            used["saving_ms"] = names_in(_req(data, "saving_ms", where))
        for key in ("title", "message"):
            used[key] = template_names(_req(data, key, where))
        if "title_group" in data:
            used["title_group"] = template_names(str(data["title_group"])) - {GROUP_COUNT}
        used["unmeasured"] = template_names(str(data.get("unmeasured", "")))
        if data.get("projected_for_gpu") is not None:
            used["projected_for_gpu"] = names_in(_req(data, "projected_for_gpu", where))
        if data.get("projected_step") is not None:
            if data.get("projected_for_gpu") is None:
                raise RuleError("projected_step is for a rule with projected_for_gpu")
            used["projected_step"] = names_in(_req(data, "projected_step", where))
        if data.get("gpu_share") is not None:
            used["gpu_share"] = names_in(_req(data, "gpu_share", where))
    except RuleError as e:
        raise RuleError(f"{where}: {e.message}") from None
    thresholds = data.get("thresholds", {})
    if not isinstance(thresholds, dict) or not all(
            isinstance(v, (int, float, str, bool)) for v in thresholds.values()):
        raise RuleError(f"{where}: [thresholds] must map names to numbers, strings or booleans")
    fix = data.get("fix", {})
    if not isinstance(fix, dict):
        raise RuleError(f"{where}: [fix] must be a table")
    fix_kind = fix.get("kind")
    if fix_kind is not None and fix_kind not in FIX_KINDS:
        raise RuleError(f"{where}: fix kind {fix_kind!r} is not one of {', '.join(FIX_KINDS)}")
    fix_text = {k: str(fix[k]) for k in ("before", "after", "note") if k in fix}
    params = fix.get("params", {})
    if not isinstance(params, dict):
        raise RuleError(f"{where}: [fix.params] must be a table")
    try:
        for k, v in fix_text.items():
            used[f"fix.{k}"] = template_names(v)
        used["fix.params"] = _param_names(params)
    except RuleError as e:
        raise RuleError(f"{where}: fix: {e.message}") from None
    doc = data.get("doc", {})
    if not isinstance(doc, dict):
        raise RuleError(f"{where}: [doc] must be a table")
    refs = doc.get("references", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise RuleError(f"{where}: doc.references must be a list of strings")
    evidence = data.get("evidence", [])
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        raise RuleError(f"{where}: evidence must be a list of fact names")
    used["evidence"] = set(evidence)
    subject = data.get("subject")
    subjects = tuple(subject) if isinstance(subject, list) else (subject,) if subject is not None else ()
    if not all(isinstance(k, str) and k in registry.SUBJECT_KINDS for k in subjects) or (
            isinstance(subject, list) and not subjects):
        raise RuleError(f"{where}: subject must be one of {', '.join(registry.SUBJECT_KINDS)}, or a list of them")
    gpu_only = data.get("gpu_only", False)
    if not isinstance(gpu_only, bool):
        raise RuleError(f"{where}: gpu_only must be true or false")
    severity_unmeasured = data.get("severity_unmeasured")
    if severity_unmeasured is not None and severity_unmeasured not in SEVERITIES:
        raise RuleError(f"{where}: severity_unmeasured must be one of {', '.join(SEVERITIES)}")
    if data.get("gpu_share") is not None and not gpu_only:
        raise RuleError(f"{where}: gpu_share is for a rule with gpu_only = true")
    gpu_gain = data.get("gpu_gain", 1.0)
    if isinstance(gpu_gain, bool) or not isinstance(gpu_gain, (int, float)) or not 0 < gpu_gain <= 1 or (
            "gpu_gain" in data and data.get("gpu_share") is None):
        raise RuleError(f"{where}: gpu_gain is a number in (0, 1], beside gpu_share")
    spread = data.get("spread_over_steps", False)
    if not isinstance(spread, bool):
        raise RuleError(f"{where}: spread_over_steps must be true or false")
    once = data.get("once", False)
    if not isinstance(once, bool):
        raise RuleError(f"{where}: once must be true or false")
    title_group = data.get("title_group", "")
    if not isinstance(title_group, str) or (title_group and not once):
        raise RuleError(f"{where}: title_group is a text, for a rule with once = true")
    ablation = data.get("ablation")
    if ablation is not None and not (isinstance(ablation, dict) and ablation.get("kind") in ABLATIONS
                                     and isinstance(ablation.get("what"), str)
                                     and all(isinstance(v, str) for v in ablation.values())):
        raise RuleError(f"{where}: [ablation] needs kind (one of {', '.join(ABLATIONS)}) and what, as strings")
    lets, let_used = parse_lets(data.get("let", {}), where)
    check_names({**let_used, **used}, subjects, thresholds, where, lets)
    return Rule(
        id=rid, name=_req(data, "name", where), severity=severity, summary=_req(data, "summary", where),
        title=data["title"], message=data["message"], when=when, subject=subjects[0] if subjects else None,
        subjects=subjects, gpu_only=gpu_only, spread_over_steps=spread, once=once,
        projected_for_gpu=data.get("projected_for_gpu"), projected_step=data.get("projected_step"),
        gpu_share=data.get("gpu_share"),
        gpu_gain=float(gpu_gain),
        title_group=title_group,
        severity_unmeasured=severity_unmeasured,
        subject_optional=bool(data.get("subject_optional", False)), ablation=ablation,
        saving_ms=data.get("saving_ms"), unmeasured=str(data.get("unmeasured", "")),
        saving_note=str(data.get("saving_note", "")),
        thresholds=dict(thresholds), fix_kind=fix_kind, fix_params=params, fix_text=fix_text,
        evidence=list(evidence), lets=lets,
        doc=Doc(what=_req(doc, "what", f"{where} [doc]"), why=_req(doc, "why", f"{where} [doc]"),
                example=str(doc.get("example", "")), use_instead=str(doc.get("use_instead", "")),
                fix_safety=str(doc.get("fix_safety", "")), references=list(refs)),
    )


MAX_RULE_BYTES = 1 << 20  # a rule file bigger than this is refused


def load_rule_file(path: Path) -> Rule:
    try:
        # a regular file only, opened without blocking (a FIFO, /dev/zero), at most MAX_RULE_BYTES
        raw = files.read_bytes(path, MAX_RULE_BYTES)
    except InputError as e:
        raise RuleError(f"rule file {e.message}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(f"cannot read rule file {path}: {e}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise RuleError(f"rule file {path} is not valid TOML: {' '.join(str(e).split())[:200]}") from None
    rule = parse_rule(data, str(path))
    rule.path = path
    return rule


def load_rules(extra_dirs: list[Path] | None = None, project: Path | None = None) -> list[Rule]:
    """The built-in rules plus the project's own rule folders. A project rule may not take a
    built-in rule's id (it would replace what the CI gate checks), nor two project rules one id;
    nor be a link to a file outside the `project` folder (a link can arrive in a pull request)."""
    rules: dict[str, Rule] = {}
    builtin: set[str] = set()
    for n, d in enumerate([builtin_rules_dir(), *(extra_dirs or [])]):
        if not d.is_dir():
            raise RuleError(f"rules folder {d} does not exist")
        for p in sorted(d.glob("*.toml")):
            if n > 0 and project is not None and not p.resolve().is_relative_to(project.resolve()):
                raise RuleError(f"rule file {p} leads outside the project ({p.resolve()}): refused")
            r = load_rule_file(p)
            if n > 0 and r.id in rules:
                what = "a built-in rule" if r.id in builtin else f"{rules[r.id].path}"
                raise RuleError(f"{p}: rule id {r.id} is already taken by {what}; give the project rule its own id")
            rules[r.id] = r
        if n == 0:
            builtin = set(rules)
    return sorted(rules.values(), key=lambda r: r.id)


def find_rule(rules: list[Rule], key: str) -> Rule | None:
    key = key.strip()
    for r in rules:
        if r.id.lower() == key.lower() or r.name == key:
            return r
    return None
