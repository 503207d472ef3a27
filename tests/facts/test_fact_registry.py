"""The fact registry (perfdoctor/facts/registry.py): what producers may add, what rules may read,
one precedence rule for every add, and the fact tables of docs/ARCHITECTURE.md generated from it.

`python -m tests.facts.test_fact_registry` rewrites the doc's fact tables from the registry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.errors import RuleError
from perfdoctor.facts import registry
from perfdoctor.facts.merge import drop_subjects_only_from, merge_subject, supersedes
from perfdoctor.facts.model import Facts
from perfdoctor.facts.registry import UndeclaredFact
from perfdoctor.rules.catalog import FIX_KINDS, load_rules, parse_rule
from perfdoctor.rules.engine import judge
from perfdoctor.rules.expr import names_in
from tests.helpers import REPO

DOC = REPO / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- BEGIN fact tables (generated: python -m tests.facts.test_fact_registry) -->", "<!-- END fact tables -->"


def fact_tables() -> str:
    """The doc's fact tables, from the registry."""

    def rows(specs: list[registry.FactSpec]) -> list[str]:
        return [f"| `{s.name}` | {s.unit} | {' / '.join(s.producers)} | {s.doc} |" for s in specs]

    head = ["| fact | unit | from | what |", "|---|---|---|---|"]
    subject_specs = [s for table in registry.SUBJECT_FACTS.values() for s in table.values()]
    return "\n".join([
        "Global facts (`Facts.add`):", "", *head, *rows(list(registry.GLOBAL_FACTS.values())), "",
        "Subject facts (`Facts.subject(kind, key).add`), named after their kind; each subject also has "
        f"`locations`. Kinds: {', '.join(f'`{k}`' for k in registry.SUBJECT_KINDS)}.", "",
        *head, *rows(subject_specs), "",
        "Derived facts (`registry.DERIVED_FACTS`: computed from the global facts named, where a rule reads "
        "them or Python calls `registry.derive`; a finding's evidence is their inputs):", "",
        "| fact | unit | from | what |", "|---|---|---|---|",
        *(f"| `{d.name}` | {d.unit} | {', '.join(f'`{i}`' for i in d.inputs)} | {d.doc} |"
          for d in registry.DERIVED_FACTS.values()),
    ])


def _doc_section(text: str) -> str:
    assert BEGIN in text and END in text, f"{DOC} has no generated fact tables ({BEGIN} ... {END})"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def test_doc_fact_tables_are_the_registry() -> None:
    """A fact declared but missing from the doc, or named in the doc but not declared, fails here."""
    assert _doc_section(DOC.read_text()) == fact_tables(), \
        "docs/ARCHITECTURE.md's fact tables differ from the registry: run `python -m tests.facts.test_fact_registry`"


# -- producers -----------------------------------------------------------------------------------

def test_an_undeclared_fact_is_refused() -> None:
    f = Facts()
    with pytest.raises(UndeclaredFact, match="step.tme_ms"):
        f.add("step.tme_ms", 1.0, "ms", "run")
    with pytest.raises(UndeclaredFact, match="dataloader.wait_secs"):
        f.subject("dataloader", "t.py:1").add("wait_secs", 1.0, "ms", "run")
    with pytest.raises(UndeclaredFact, match="dataloaders"):
        f.subject("dataloaders", "t.py:1")
    with pytest.raises(ValueError, match="source"):
        f.add("step.time_ms", 1.0, "ms", "profiler")
    f.add("step.time_ms", None)  # not measured: nothing recorded, nothing checked
    assert "step.time_ms" not in f


def test_golden_facts_are_declared_with_their_producers() -> None:
    """Every global fact of the golden reports is declared, comes from a declared producer, and
    carries the declared unit (or none, for flags and words)."""
    seen = set()
    for path in sorted((REPO / "tests/golden/expected").glob("*.json")):
        for name, fact in json.loads(path.read_text())["facts"].items():
            spec = registry.spec(name)
            assert spec is not None, f"{path.name}: {name} is not declared"
            assert fact["source"] in spec.producers, f"{path.name}: {name} from {fact['source']}, declared {spec.producers}"
            assert fact["unit"] in ("", spec.unit), f"{path.name}: {name} in {fact['unit']}, declared {spec.unit}"
            seen.add(name)
    assert len(seen) > 40


# -- precedence ----------------------------------------------------------------------------------

def test_one_precedence_rule() -> None:
    assert supersedes("run", "static") and supersedes("trace", "trace") and supersedes("static", "static")
    for new, old in [("trace", "run"), ("trace", "static"), ("trace", "machine"), ("static", "run"),
                     ("static", "trace"), ("machine", "run"), ("run", "trace"), ("run", "machine")]:
        assert not supersedes(new, old), (new, old)


def test_add_keeps_the_stronger_source() -> None:
    f = Facts()
    f.add("device.type", "cuda", "", "machine")
    f.add("device.type", "cpu", "", "trace")  # the trace does not overwrite the machine's fact
    assert f.get("device.type").value == "cuda"
    f.add("script.targets_cuda", False, "", "static")
    f.add("script.targets_cuda", True, "", "run")  # run evidence replaces static evidence
    assert f.get("script.targets_cuda").source == "run"
    f.add("script.targets_cuda", False, "", "static")  # and static never replaces run
    assert f.value("script.targets_cuda") is True
    s = f.subject("cpu_to_device", "t.py:3")
    s.add("ms", 1.0, "ms", "trace")
    s.add("ms", 3.0, "ms", "trace")  # the trace refines its own fact (summed over the copies)
    assert s.facts["cpu_to_device.ms"].value == 3.0
    d = f.subject("dataloader", "t.py:9")
    d.add("num_workers", 4, "count", "run")
    d.add("num_workers", 0, "count", "trace")
    d.add("num_workers", 2, "count", "static")
    assert d.facts["dataloader.num_workers"].value == 4
    e = f.subject("empty_cache", "t.py:12")
    e.add("in_loop", False, "", "static")
    e.add("in_loop", True, "", "run")
    assert e.facts["empty_cache.in_loop"].value is True


def test_merge_and_drop_subjects() -> None:
    """The report's merging of the trace's subjects into the run's (what build.py did by hand)."""
    f = Facts()
    run = f.subject("dataloader", "/abs/train.py:9")
    run.add("num_workers", 0, "count", "run")
    run.add("pin_memory", False, "", "static")
    kinds = f.kinds_from("run")
    assert kinds == {"dataloader"}
    trace = f.subject("dataloader", "train.py:9")
    trace.add("num_workers", 2, "count", "trace")
    trace.add("wait_ms", 5.0, "ms", "trace")
    only_trace = f.subject("dataloader", "trace:dataloader")
    only_trace.add("wait_ms", 7.0, "ms", "trace")
    merge_subject(run, trace)
    assert run.facts["dataloader.num_workers"].value == 0 and run.facts["dataloader.wait_ms"].value == 5.0
    other = f.subject("dataloader", "/abs/train.py:9")  # the same subject
    assert other is run
    second = Facts().subject("dataloader", "x:1")
    second.add("pin_memory", True, "", "run")
    second.add("num_workers", 8, "count", "run")
    merge_subject(run, second)  # run replaces static; a same-source fact of the subject stays
    assert run.facts["dataloader.pin_memory"].value is True and run.facts["dataloader.num_workers"].value == 0
    drop_subjects_only_from(f, "trace", kinds)
    assert [s.key for s in f.of_kind("dataloader")] == ["/abs/train.py:9"]


# -- rules ---------------------------------------------------------------------------------------

RULE = """id = "PD900"
name = "x"
severity = "high"
summary = "s"
subject = "dataloader"
when = "{when}"
title = "t {{step.time_ms:.1f}}"
message = "m"
evidence = {evidence}
[thresholds]
limit = 1
[doc]
what = "w"
why = "y"
"""


def _rule(tmp_path: Path, when: str = "dataloader.wait_ms > threshold.limit", evidence: str = "[]") -> Path:
    d = tmp_path / "perf-rules"
    d.mkdir(exist_ok=True)
    (d / "PD900-x.toml").write_text(RULE.format(when=when, evidence=evidence))
    return d


def test_every_builtin_rule_reads_declared_facts() -> None:
    for rule in load_rules():
        used = rule.reads(names_in(rule.when) | (names_in(rule.saving_ms) if rule.saving_ms else set())) | set(rule.evidence)
        for name in used:
            if name.startswith(registry.THRESHOLD_PREFIX):
                assert name[len(registry.THRESHOLD_PREFIX):] in rule.thresholds, (rule.id, name)
            else:
                assert any(registry.readable(name, k) for k in rule.subjects or (None,)), (rule.id, name)
        assert rule.subject is None or rule.subject in registry.SUBJECT_KINDS


def test_derived_facts_are_computed_once_from_declared_inputs() -> None:
    """The derived facts are said once (registry.DERIVED_FACTS) from declared global facts, are never
    stored (a producer cannot add one), and mean what their docs say, also where inputs are absent."""
    for d in registry.DERIVED_FACTS.values():
        assert d.unit in registry.UNITS and all(i in registry.GLOBAL_FACTS for i in d.inputs), d.name
        with pytest.raises(UndeclaredFact):
            Facts().add(d.name, 1, d.unit, "run")

    def derive(name: str, **inputs: object) -> object:
        values = {k.replace("__", "."): v for k, v in inputs.items()}
        return registry.derive(name, values.get)

    assert derive("run.cuda_on_cpu", device__type="cpu", script__targets_cuda=True) is True
    for inputs in ({"device__type": "cuda", "script__targets_cuda": True}, {"device__type": "cpu"},
                   {"script__targets_cuda": True}, {"device__type": "cpu", "script__targets_cuda": False}):
        assert derive("run.cuda_on_cpu", **inputs) is False, inputs
    assert derive("run.gpu_target", script__targets_cuda=True) is True
    assert derive("run.gpu_target", device__type="rocm") is True
    assert derive("run.gpu_target", device__type="cpu", script__targets_cuda=False) is False
    assert derive("run.gpu_target") is False
    assert derive("cpu.workers", cpu__count=6) == 6 and derive("cpu.workers", cpu__count=0) == 1
    assert derive("cpu.workers") is None


def test_a_rule_reads_a_derived_fact_and_shows_its_inputs_as_evidence(tmp_path: Path) -> None:
    d = _rule(tmp_path, "run.cuda_on_cpu and cpu.workers >= 2 and dataloader.wait_ms > threshold.limit")
    rules = [r for r in load_rules([d]) if r.id == "PD900"]
    f = Facts()
    f.add("device.type", "cpu", "str", "machine")
    f.add("script.targets_cuda", True, "bool", "static")
    f.add("step.time_ms", 10.0, "ms", "run")
    f.subject("dataloader", "t.py:1").add("wait_ms", 5.0, "ms", "run")
    assert judge(f, rules) == []  # cpu.workers: absent without cpu.count, so the rule cannot say
    f.add("cpu.count", 4, "count", "machine")
    (finding,) = judge(f, rules)
    assert {e.name for e in finding.evidence} == {"device.type", "script.targets_cuda", "cpu.count",
                                                  "dataloader.wait_ms"}
    assert finding.confidence == "high"


def test_rules_say_the_shared_tests_through_the_registry() -> None:
    """The CPU run of a CUDA-targeting script, a script that targets a GPU, and a flag read with has()
    are not spelt out in a rule file: `run.cuda_on_cpu`, `run.gpu_target` and `get(x, default)` say them."""
    import re

    for path in sorted((REPO / "rules").glob("*.toml")):
        text = path.read_text()
        assert not re.search(r"has\(([a-z_.]+)\) and \1(?![a-z0-9_.]|\s*(==|!=|<|>|in\b|not\b|[-+*/%]))", text), path.name
        assert not re.search(r"device\.type\W{0,12}== 'cpu'.{0,80}script\.targets_cuda"
                             r"|script\.targets_cuda.{0,80}device\.type\W{0,12}== 'cpu'", text, re.S), path.name


def test_rules_read_short() -> None:
    """A message is one or two sentences with the numbers (details are the evidence's, the explanation
    the doc's), and no condition or let nears the evaluator's size limit (PD007's was at half of it)."""
    from perfdoctor.rules.expr import MAX_SOURCE

    for rule in load_rules():
        assert len(rule.message) <= 520 and len(rule.title) <= 400, rule.id
        for expr in (rule.when, rule.saving_ms or "", *rule.lets.values()):
            assert len(expr) <= MAX_SOURCE // 3, rule.id


@pytest.mark.parametrize("when,evidence,says", [
    ("dataloader.overhead_ms > 1", "[]", "'dataloader.overhead_ms'"),
    ("true", '["step.tme_ms"]', "did you mean 'step.time_ms'"),
    ("empty_cache.calls_per_step > 0", "[]", "a fact of empty_cache subjects"),
    ("dataloader.wait_ms > threshold.limt", "[]", "'threshold.limt', which is not in the rule's [thresholds] (limit)"),
])
def test_a_user_rule_reading_an_unknown_name_is_one_clear_error(tmp_path: Path, when, evidence, says) -> None:
    d = _rule(tmp_path, when, evidence)
    with pytest.raises(RuleError) as e:
        load_rules([d])
    msg = e.value.message
    assert "\n" not in msg and str(d / "PD900-x.toml") in msg and says in msg, msg


def test_extend_rules_with_an_unknown_fact_is_one_error_line(tmp_path: Path) -> None:
    """`perfdoctor report` with a project's own rule file that reads an unknown fact: exit 2, one line."""
    from tests.helpers import run_cli

    trace = tmp_path / "trace.json.gz"
    trace.write_bytes((REPO / "tests/data/traces/torch213_cpu_mlp_dataloader.pt.trace.json.gz").read_bytes())
    _rule(tmp_path, "dataloader.wait_ms > threshold.limit and dataloader.overhead_ms > 1")
    (tmp_path / "pyproject.toml").write_text('[tool.perfdoctor]\nextend-rules = ["perf-rules"]\n')
    p = run_cli("report", str(trace), cwd=tmp_path)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "PD900-x.toml" in lines[0] and "'dataloader.overhead_ms'" in lines[0], lines[0]


def test_templates_and_fix_params_are_checked(tmp_path: Path) -> None:
    base = {"id": "PD900", "name": "x", "severity": "high", "summary": "s", "when": "true", "title": "t",
            "message": "m", "doc": {"what": "w", "why": "y"}}
    for extra, where in [({"message": "{memory.peak_byte}"}, "message"),
                         ({"unmeasured": "{gpu.util}"}, "unmeasured"),
                         ({"fix": {"kind": "call-kwargs", "params": {"set": {"a": "{cpu.cnt}"}}}}, "fix.params"),
                         ({"fix": {"note": "{run.steps}"}}, "fix.note"),
                         ({"subject": "loaders"}, "subject")]:
        with pytest.raises(RuleError, match=where):
            parse_rule({**base, **extra}, "r.toml")
    assert parse_rule({**base, "subject": "model", "message": "{model.autocast} {cpu.count}"}, "r.toml")


def test_a_valid_user_rule_loads_and_judges(tmp_path: Path) -> None:
    rules = [r for r in load_rules([_rule(tmp_path)]) if r.id == "PD900"]
    f = Facts()
    f.add("step.time_ms", 10.0, "ms", "run")
    f.subject("dataloader", "t.py:1").add("wait_ms", 5.0, "ms", "run")
    assert [x.title for x in judge(f, rules)] == ["t 10.0"]


# -- fixes ---------------------------------------------------------------------------------------

def test_fix_kinds_are_the_fixer_modules() -> None:
    import importlib

    from perfdoctor.rules.fixes import fix_kinds

    assert FIX_KINDS == (*fix_kinds(), "text")
    assert {"call-kwargs", "dataparallel-to-ddp", "factory-device", "remove-call", "detach-loss",
            "wrap-autocast", "non-blocking"} <= set(fix_kinds())
    for kind in fix_kinds():
        assert callable(importlib.import_module(f"perfdoctor.rules.fixes.{kind.replace('-', '_')}").fix), kind


def test_loading_rules_does_not_import_libcst() -> None:
    code = "import sys; from perfdoctor.rules.catalog import load_rules; load_rules(); print('libcst' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


if __name__ == "__main__":
    head, rest = DOC.read_text().split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{fact_tables()}\n{END}{rest.split(END, 1)[1]}")
