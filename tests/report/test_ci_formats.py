"""CI-native output: SARIF (validated against the vendored SARIF 2.1.0 schema), GitHub workflow
commands and Markdown."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from perfdoctor.contracts.baseline import GateFinding
from perfdoctor.contracts.report import BreakdownDoc, RunInfoDoc, StepTimeDoc, SummaryDoc
from perfdoctor.gate import RunRecord, compare
from perfdoctor.model import Fact, Finding, Fix, Location, Report, RuleDoc
from perfdoctor.report import escape, github, markdown, sarif
from tests.helpers import TESTS

SCHEMA = json.loads((TESTS / "data" / "sarif-2.1.0.json").read_text())
ROOT = Path("/repo")

RULES = [
    RuleDoc(id="PD002", name="dataloader-workers", severity="high", summary="Too few DataLoader workers",
            what="Flags a DataLoader with too few workers while the loop waits for data.",
            why="The GPU idles while one process decodes batches.", example="DataLoader(ds)",
            use_instead="DataLoader(ds, num_workers=4)", references=["https://pytorch.org/docs/stable/data.html"]),
    RuleDoc(id="PD005", name="empty-cache", severity="low", summary="empty_cache() in the loop",
            what="Flags torch.cuda.empty_cache() inside the loop.", why="It syncs and frees the cache."),
]


def finding(line=12, code="loader = DataLoader(ds, batch_size=64)", rule="PD002", severity="high", file="/repo/src/train.py"):
    return Finding(rule=rule, name="dataloader-workers" if rule == "PD002" else "empty-cache", severity=severity,
                   title="DataLoader waits: 0 workers | slow", message="The loop waits 41 ms per step for data.\nUse workers.",
                   why="Data loading runs in the main process.", ms_per_step=41.0, fraction_of_step=0.55,
                   saving_basis="measured", confidence="high",
                   locations=[Location(file, line, code, "main")],
                   evidence=[Fact("dataloader.wait_ms", 41.0, "ms", "run")],
                   fix=Fix(before=code, after=code.replace(")", ", num_workers=4, pin_memory=True)"), note="persistent_workers=True too"),
                   references=["https://pytorch.org/docs/stable/data.html"])


def report(findings=None):
    return Report(run=RunInfoDoc(script="/repo/src/train.py", argv=["train.py"], device="cpu", torch="2.13.0"),
                  summary=SummaryDoc(step_time_ms=StepTimeDoc(median=74.5, p90=80.1, n=40),
                                     breakdown=[BreakdownDoc("data loading", 41.0, 0.55), BreakdownDoc("forward", 20.0, 0.27)]),
                  findings=[finding()] if findings is None else findings, notes=["profiled steps 5-8"])


def validate(text: str) -> dict:
    doc = json.loads(text)
    jsonschema.Draft4Validator(SCHEMA).validate(doc)
    return doc


def test_vendored_schema_is_the_sarif_2_1_0_schema():
    jsonschema.Draft4Validator.check_schema(SCHEMA)
    assert SCHEMA["id"].endswith("/sarif-schema-2.1.0.json") and "result" in SCHEMA["definitions"]
    # it rejects what it should: a result without a message, a bad level
    bad = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"ruleId": "A", "level": "fatal"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(bad)


def test_sarif_validates_and_carries_rules_results_locations():
    doc = validate(sarif.render_report(report(), rules=RULES, root=ROOT))
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "perfdoctor" and [r["id"] for r in driver["rules"]] == ["PD002", "PD005"]
    pd002 = driver["rules"][0]
    assert pd002["name"] == "dataloader-workers" and pd002["shortDescription"]["text"] == "Too few DataLoader workers"
    assert pd002["defaultConfiguration"]["level"] == "error"
    assert "Why is this bad?" in pd002["help"]["markdown"] and "num_workers=4" in pd002["help"]["text"]
    assert driver["rules"][1]["defaultConfiguration"]["level"] == "note"
    (res,) = run["results"]
    assert res["ruleId"] == "PD002" and res["ruleIndex"] == 0 and res["level"] == "error"
    assert "41.0 ms per step" in res["message"]["text"]
    phys = res["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"]["uri"] == "src/train.py" and phys["region"]["startLine"] == 12


def test_sarif_fingerprint_ignores_line_number_but_not_code():
    fp = lambda f: json.loads(sarif.render_report(report([f]), rules=RULES, root=ROOT))["runs"][0]["results"][0]["partialFingerprints"]  # noqa: E731
    assert fp(finding(line=12)) == fp(finding(line=40))
    assert fp(finding(code="loader = DataLoader(ds,  batch_size=64)")) == fp(finding())  # whitespace-insensitive
    assert fp(finding(code="loader = DataLoader(other)")) != fp(finding())
    assert fp(finding(rule="PD005")) != fp(finding())


def test_sarif_without_catalog_entry_or_location_still_valid(tmp_path):
    f = finding(rule="PD005", severity="medium")
    f.locations = []
    f.fix = None
    f.ms_per_step = None
    doc = validate(sarif.render_report(report([f, finding(file=str(tmp_path / "elsewhere.py"))]), rules=[], root=ROOT))
    run = doc["runs"][0]
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == {"PD002", "PD005"}
    assert "locations" not in run["results"][0]
    assert run["results"][1]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("file:///")
    validate(sarif.render_report(report([]), rules=RULES, root=ROOT))  # no findings: still a valid log


def test_github_escaping_rules():
    assert escape.github_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape.github_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    line = github.command("error", "x: y, z", file="src/a,b.py", line=3, title="PD002: slow, really")
    assert line == "::error file=src/a%2Cb.py,line=3,title=PD002%3A slow%2C really::x: y, z"


def test_github_report_annotations():
    out = github.render_report(report([finding(), finding(rule="PD005", severity="low", line=30)]), root=ROOT)
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("::error file=src/train.py,line=12,title=PD002 DataLoader waits%3A 0 workers | slow::")
    assert "%0AFix: loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)" in lines[0]
    assert "\n" not in lines[0] and lines[1].startswith("::notice file=src/train.py,line=30,")
    assert github.render_report(report([finding()] * 15), root=ROOT).count("\n") == github.MAX_ANNOTATIONS


def _records(mean, n=2, seed=0, findings=()):
    rng = random.Random(seed)
    env = {"torch": "2.13.0", "device": "cpu", "cpu_count": 2, "script": "train.py", "args": []}
    out = []
    for _ in range(n):
        s = [mean * (1 + rng.gauss(0, 0.01)) for _ in range(60)]
        out.append(RunRecord("r", dict(env), s, sorted(s)[30], findings=list(findings)))
    return out


def test_github_failed_gate_and_markdown_comparison():
    new = GateFinding(rule="PD005", fingerprint="PD005:x", severity="high", title="empty_cache in loop",
                      file="/repo/src/train.py", line=7)
    c = compare(_records(10.0), _records(12.0, 1, 1, [new]), fail_on="high")
    assert c.failed
    gh = github.render_comparison(c, root=ROOT)
    assert "::error title=perfdoctor gate%3A step time (p10) regression::step time (p10) regressed +" in gh
    assert "::error file=src/train.py,line=7,title=PD005 (new since baseline)::New high finding: empty_cache in loop" in gh
    assert gh.rstrip().splitlines()[-1].startswith("::error::perfdoctor gate failed: step time (p10) +")
    md = markdown.render_comparison(c)
    assert "❌ perfdoctor gate: failed" in md
    assert "| Metric | Baseline | Current | Change | 90% CI | Verdict |" in md
    assert "❌ regression" in md and "### New findings" in md and "**PD005** (high)" in md
    ok = compare(_records(10.0), _records(10.0, 1, 2))
    assert "✅ perfdoctor gate: passed" in markdown.render_comparison(ok) and github.render_comparison(ok) == ""


def test_sarif_of_a_comparison_marks_new_and_unchanged_findings():
    old = GateFinding(rule="PD002", fingerprint="PD002:train.py:loader = DataLoader(ds)", severity="high",
                      title="DataLoader waits", file="/repo/src/train.py", line=12, code="loader = DataLoader(ds)")
    new = GateFinding(rule="PD005", fingerprint="PD005:train.py:torch.cuda.empty_cache()", severity="low",
                      title="empty_cache in loop", file="/repo/src/train.py", line=30, code="torch.cuda.empty_cache()")
    c = compare(_records(10.0, findings=[old]), _records(12.0, 1, 1, [old, new]))
    doc = validate(sarif.render_comparison(c, RULES, ROOT))  # `compare --format sarif`
    states = {r["ruleId"]: r["baselineState"] for r in doc["runs"][0]["results"]}
    assert states == {"PD002": "unchanged", "PD005": "new"}
    res = {r["ruleId"]: r for r in doc["runs"][0]["results"]}
    assert res["PD005"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/train.py"
    gate = doc["runs"][0]["properties"]["perfdoctorGate"]
    assert gate["verdict"] == "failed" and gate["rows"][0]["verdict"] == "regression"
    # the same finding from a full report (`run --baseline --format sarif`) has the same fingerprint
    rep = report([finding(line=12, code="loader = DataLoader(ds)")])
    with_report = validate(sarif.render_both(rep, c, RULES, ROOT))
    r0 = with_report["runs"][0]["results"][0]
    assert r0["baselineState"] == "unchanged"
    assert r0["partialFingerprints"] == res["PD002"]["partialFingerprints"]


def test_not_comparable_is_loud_but_not_failing():
    cur = _records(20.0, 1, 3)
    cur[0].env["torch"] = "2.12.0"
    c = compare(_records(10.0), cur)
    gh = github.render_comparison(c)
    assert gh.startswith("::warning title=perfdoctor gate%3A not comparable::") and "::error" not in gh
    md = markdown.render_comparison(c)
    assert "baseline not comparable" in md and "> **NOT COMPARABLE" in md and "⚠️ not comparable" in md


def test_markdown_report_summary_table_and_details():
    md = markdown.render_report(report())
    assert md.startswith("## perfdoctor: train.py")
    assert "**Step time** 74.50 ms median · p90 80.10 ms · 40 steps · device cpu · torch 2.13.0" in md
    assert "| data loading | 41.00 | 55% |" in md
    # the finding row: pipes in the title are escaped so the table stays intact
    assert "| 1 | PD002 dataloader-workers | high | 41.0 ms/step (55%) | `train.py:12` | DataLoader waits: 0 workers \\| slow |" in md
    assert "<details><summary><b>PD002</b>" in md and "</details>" in md
    assert "```diff\n- loader = DataLoader(ds, batch_size=64)\n+ loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)\n```" in md
    assert "persistent_workers=True too" in md and "> profiled steps 5-8" in md
    assert "No findings" in markdown.render_report(report([]))


def test_append_step_summary(tmp_path):
    target = tmp_path / "summary.md"
    target.write_text("earlier\n")
    assert markdown.append_step_summary("## hi", {"GITHUB_STEP_SUMMARY": str(target)})
    assert markdown.append_step_summary("## again\n", {"GITHUB_STEP_SUMMARY": str(target)})
    assert target.read_text() == "earlier\n## hi\n## again\n"
    assert markdown.append_step_summary("x", {}) is False
