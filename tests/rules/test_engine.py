"""The rules engine, on hand-built facts: the catalog, select and ignore, severity, templates, inline ignores,
settings, bad rule files, `[let]` tables. Each rule's own tests are in tests/rules/test_pdNNN.py (or its family's module)."""


import pytest

from perfdoctor.errors import RuleError
from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.catalog import load_rule_file, load_rules
from perfdoctor.rules.config import Settings, load_settings
from perfdoctor.rules.engine import judge
from tests.rules.builders import RULES, cpu_run, ids, loader, target_gpu


def test_catalog_has_the_design_rules():
    assert [r.id for r in RULES][:7] == [f"PD00{i}" for i in range(1, 8)]
    names = {r.id: r.name for r in RULES}
    assert names["PD002"] == "dataloader-workers" and names["PD006"] == "loss-graph-retained"
    for r in RULES:
        assert r.doc.what and r.doc.why and r.doc.references


def test_select_and_ignore():
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0)
    assert judge(f, RULES, Settings(ignore=["PD002"])) == []
    assert judge(f, RULES, Settings(select=["PD00"])) != []
    assert judge(f, RULES, Settings(select=["PD005"])) == []


def test_gpu_only_costs_have_no_number_and_rank_below_measured(tmp_path):
    f = cpu_run(step_ms=20.0, cpus=4)
    f.add("script.targets_cuda", True, "", "static")
    loader(f, workers=0, wait_ms=5.0)
    dp = f.subject("dataparallel", "train.py:5")
    dp.add("constructed", True, "", "run")
    dp.locations.append(Location("train.py", 5, "model = nn.DataParallel(model)"))
    ec = f.subject("empty_cache", "train.py:30")
    ec.add("calls_per_step", 1.0, "count", "run")
    ctd = f.subject("cpu_to_device", "train.py:25")
    ctd.add("factory", "randn", "", "static")
    ctd.add("in_loop", True, "", "static")
    findings = judge(f, RULES)
    assert ids(findings) == ["PD001", "PD002", "PD004", "PD005"]
    assert findings[0].rule == "PD002" and findings[0].ms_per_step is not None
    for x in findings[1:]:
        assert x.ms_per_step is None and x.fraction_of_step is None
        assert x.saving_basis.startswith("GPU-only, not measured on this run: this run had no GPU")
    assert [x.confidence for x in findings if x.rule == "PD004"] == ["medium"]  # static evidence only
    assert "seen in the source" in [x for x in findings if x.rule == "PD004"][0].saving_basis


@pytest.mark.parametrize(("step_ms", "nbytes", "severity"), [
    (20.0, 400, "low"),  # one small copy a step: 46 us of a 20 ms GPU step, 0.2 %
    (2.0, 400, "medium"),  # the same copy beside a launch-bound 2 ms step: 2.3 %
    (20.0, 4_000_000, "medium"),  # 4 MB from pageable memory: 0.4 ms more, 2.2 %
    (None, 400, "medium"),  # no estimate of the GPU step: the rule's own severity
])
def test_gpu_only_severity_follows_the_share_of_the_target_gpu_step(step_ms, nbytes, severity):
    f = cpu_run(step_ms=300.0, cpus=4)
    f.add("script.targets_cuda", True, "", "static")
    if step_ms is not None:
        target_gpu(f, step_ms)
    ctd = f.subject("cpu_to_device", "train.py:25")
    ctd.add("factory", "randn", "", "run")
    ctd.add("in_loop", True, "", "run")
    ctd.add("moves_per_step", 1.0, "count", "run")
    ctd.add("bytes_per_move", nbytes, "bytes", "run")
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD004" and finding.ms_per_step is None and finding.severity == severity
    assert ("of the step on the GPU the script targets" in finding.saving_basis) == (step_ms is not None)
    if step_ms is not None:  # the facts the share reads are the finding's evidence
        assert {"target_gpu.step_ms", "cpu_to_device.bytes_per_move"} <= {e.name for e in finding.evidence}


@pytest.mark.parametrize(("host_data", "severity"), [(False, "low"), (True, "medium")])
def test_pd004_from_the_source_alone_is_one_move_a_step(host_data, severity):
    """sac-pendulum's `alpha_loss = torch.tensor(0.).to(self.device)` in every update, which the run did not
    count (torch.tensor is not a factory its probe watches): one move a step, priced at the sync beside a
    20 ms GPU step, 0.2 %. A batch of host data, whose bytes the source does not give, keeps the rule's own."""
    f = cpu_run(step_ms=300.0, cpus=4)
    f.add("script.targets_cuda", True, "", "static")
    f.add("target_gpu.step_ms", 20.0, "ms", "trace")
    f.add("target_gpu.sync_ms", 0.046, "ms", "trace")
    f.add("target_gpu.h2d_bytes_per_ms", 1e7, "number", "trace")
    ctd = f.subject("cpu_to_device", "train.py:25")
    ctd.add("factory", "tensor", "", "static")
    ctd.add("in_loop", True, "", "static")
    if host_data:
        ctd.add("host_data", True, "", "static")
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD004" and finding.severity == severity


@pytest.mark.parametrize(("extra", "error"), [
    ('gpu_share = "target_gpu.step_ms"\n', "gpu_share is for a rule with gpu_only = true"),
    ('gpu_gain = 0.1\n', "gpu_gain is a number in"),  # a gain with no share
    ('gpu_only = true\ngpu_share = "target_gpu.step_ms"\ngpu_gain = 0\n', "gpu_gain is a number in"),
    ('gpu_only = true\ngpu_share = "target_gpu.step_ms"\ngpu_gain = true\n', "gpu_gain is a number in"),
    ('projected_step = "step.time_ms"\n', "projected_step is for a rule with projected_for_gpu"),
])
def test_rule_fields_that_need_another(tmp_path, extra, error):
    p = tmp_path / "PD099.toml"
    p.write_text('id = "PD099"\nname = "x"\nseverity = "medium"\nsummary = "x"\nwhen = "true"\ntitle = "t"\n'
                 f'message = "m"\n{extra}[doc]\nwhat = "w"\nwhy = "y"\n')
    with pytest.raises(RuleError, match=error):
        load_rule_file(p)


def test_severity_follows_the_measured_cost():
    f = cpu_run(step_ms=1000.0, cpus=4)
    loader(f, workers=0, wait_ms=150.0)
    (finding,) = judge(f, RULES)
    assert finding.severity == "high"
    # a measured saving under 1 % of the step (or 0.2 ms) is minor: low, and listed last
    f = Facts()
    f.add("step.time_ms", 1211.0, "ms", "trace")
    f.add("device.type", "cuda", "", "trace")
    f.add("copies.h2d_pageable_per_step", 2, "count", "trace")
    f.add("copies.h2d_pageable_ms", 1.66, "ms", "trace")
    f.add("step.comm_ms", 400.0, "ms", "trace")
    findings = judge(f, RULES)
    assert [x.rule for x in findings] == ["PD010", "PD003"]
    assert findings[1].severity == "low" and findings[1].ms_per_step == pytest.approx(0.83)
    assert findings[1].minor and not findings[0].minor


def test_no_template_prints_n_a():
    f = cpu_run()
    f.add("script.targets_cuda", True, "", "static")
    ec = f.subject("empty_cache", "t.py:9")
    ec.add("in_loop", True, "", "static")
    ec.locations.append(Location("t.py", 9, "torch.cuda.empty_cache()"))
    (finding,) = judge(f, RULES)
    assert finding.title == "torch.cuda.empty_cache() is called inside the training loop"
    assert "n/a" not in finding.message + finding.saving_basis


def test_inline_ignore_comment(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("\n" * 9 + "loader = DataLoader(ds)  # perfdoctor: ignore[PD002]\n")
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0, tmp=tmp_path)
    project = Settings(project=tmp_path)  # the ignore comment is read in the project's own sources
    assert judge(f, RULES, project) == []
    assert ids(judge(f, RULES)) == ["PD002"]  # outside the project (the current directory): not read
    src.write_text("\n" * 9 + "loader = DataLoader(ds)  # perfdoctor: ignore[PD005]\n")
    assert ids(judge(f, RULES, project)) == ["PD002"]


def test_settings_from_pyproject_and_user_rules(tmp_path):
    (tmp_path / "myrules").mkdir()
    (tmp_path / "myrules" / "XY100.toml").write_text('''
id = "XY100"
name = "slow-steps"
severity = "low"
summary = "Steps slower than a budget"
when = "step.time_ms > threshold.budget_ms"
saving_ms = "step.time_ms - threshold.budget_ms"
title = "Step takes {step.time_ms:.0f} ms, budget {threshold.budget_ms} ms"
message = "Over budget."
[thresholds]
budget_ms = 10
[doc]
what = "w"
why = "y"
''')
    (tmp_path / "pyproject.toml").write_text('''
[tool.perfdoctor]
ignore = ["PD002"]
extend-rules = ["myrules"]
[tool.perfdoctor.thresholds.XY100]
budget_ms = 15
''')
    settings = load_settings(cwd=tmp_path)
    rules = load_rules(settings.extra_rule_dirs)
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0)
    (finding,) = judge(f, rules, settings)
    assert finding.rule == "XY100" and finding.ms_per_step == pytest.approx(5.0)
    assert finding.title == "Step takes 20 ms, budget 15 ms"


@pytest.mark.parametrize("body,msg", [
    ('id = "PD900"\nname = "x"', "severity"),
    ('id = "PD900"\nname="x"\nseverity="high"\nsummary="s"\nwhen="__import__(1)"\ntitle="t"\nmessage="m"\n[doc]\nwhat="w"\nwhy="y"', "may be called"),
    ('id = "PD900"\nname="x"\nseverity="high"\nsummary="s"\nwhen="true"\ntitle="t"\nmessage="m"\n[fix]\nkind="rm -rf"\n[doc]\nwhat="w"\nwhy="y"', "fix kind"),
    ('id = [1', "TOML"),
])
def test_bad_rule_files_are_rule_errors(tmp_path, body, msg):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(RuleError) as e:
        load_rule_file(p)
    assert msg in e.value.message


LET_RULE = {
    "id": "PD990", "name": "let-test", "severity": "medium", "summary": "s", "subject": "dataloader",
    "when": "let.lost_ms >= threshold.min_ms", "saving_ms": "let.lost_ms / 2",
    "title": "waits {let.lost_ms:.1f} ms", "message": "set {let.workers} workers",
    "let": {"lost_ms": "min(dataloader.wait_ms, step.idle_ms) if has(step.idle_ms) else dataloader.wait_ms",
            "workers": "max(1, cpu.count) if let.lost_ms > 0 else 0"},
    "thresholds": {"min_ms": 1.0}, "doc": {"what": "w", "why": "y"},
}


def test_a_rules_let_names_values_its_expressions_read() -> None:
    """[let]: named values read as let.NAME in when, saving_ms and templates; the facts they read
    are the finding's evidence and, with a per-step series, its saving's range."""
    from perfdoctor.rules.catalog import parse_rule

    rule = parse_rule(dict(LET_RULE), "PD990.toml")
    assert rule.lets == LET_RULE["let"] and rule.report_doc().lets == LET_RULE["let"]
    f = cpu_run(step_ms=20.0, cpus=4)
    s = f.subject("dataloader", "train.py:3")
    s.add("wait_ms", 6.0, "ms", "run", per_step=(4.0, 6.0, 6.0, 8.0, 6.0))
    (found,) = judge(f, [rule])
    assert found.title == "waits 6.0 ms" and found.message == "set 4 workers" and found.ms_per_step == 3.0
    assert {e.name for e in found.evidence} == {"dataloader.wait_ms"}  # read through let.lost_ms
    assert found.saving_range == (3.0, 3.0)  # the let evaluated step by step
    assert judge(Facts(), [rule]) == []  # a let over a fact that is missing: not judged, as a missing fact


@pytest.mark.parametrize("let,error", [
    ({"x": "dataloader.wait_ms"}, "not in the rule's \\[let\\]"),  # when reads let.lost_ms, not defined
    ({"lost_ms": "let.later", "later": "1"}, "not a let written before it"),
    ({"Lost": "1"}, "must be lower_case"),
    ({"lost_ms": "dataloader.wiat_ms"}, "did you mean"),
    ({"lost_ms": "__import__('os')"}, "let.lost_ms"),
])
def test_a_bad_let_is_refused(let, error) -> None:
    from perfdoctor.rules.catalog import parse_rule

    data = {**LET_RULE, "title": "t", "message": "m", "saving_ms": None, "let": let}
    with pytest.raises(RuleError, match=error):
        parse_rule(data, "PD990.toml")


def test_findings_whose_first_lines_read_the_same_code_keep_every_place():
    """mvts_transformer's evaluate() and train_epoch() both say `targets = targets.to(self.device)`: the
    two PD017 subjects share a finding identity (rule, file, code text), and the second's lines (the
    training step's) were dropped with it. They are one finding with the places of both."""
    f = cpu_run(step_ms=300.0, cpus=4)
    f.add("script.targets_cuda", True, "", "static")
    for line in (448, 401):
        b = f.subject("batch_copy", f"running.py:{line}")
        b.add("pinned", True, "", "run")
        b.add("non_blocking", False, "", "run")
        b.locations.append(Location("running.py", line, "targets = targets.to(self.device)"))
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD017"]
    assert [loc.line for loc in finding.locations] == [448, 401]
