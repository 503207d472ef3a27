"""The rules engine and rules PD001-PD007, judged on hand-built facts."""


import pytest

from perfdoctor.errors import RuleError
from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.catalog import load_rule_file, load_rules
from perfdoctor.rules.config import Settings, load_settings
from perfdoctor.rules.engine import judge

RULES = load_rules()


def cpu_run(step_ms=20.0, cpus=2):
    f = Facts()
    f.add("step.time_ms", step_ms, "ms", "run")
    f.add("cpu.count", cpus, "count", "machine")
    f.add("device.type", "cpu", "", "machine")
    f.add("device.amp_available", False, "", "machine", "CPU without AMX")
    f.add("run.loss_scan_steps", 30, "count", "run")
    return f


def ids(findings):
    return sorted(f.rule for f in findings)


def loader(f, workers, wait_ms, source="run", pin=False, feeds_cuda=None, line=10, tmp=None):
    s = f.subject("dataloader", f"train.py:{line}")
    s.add("num_workers", workers, "count", source)
    s.add("pin_memory", pin, "", source)
    if wait_ms is not None:
        s.add("wait_ms", wait_ms, "ms", source)
        s.add("wait_fraction", wait_ms / f.value("step.time_ms"), "ratio", source)
    if feeds_cuda is not None:
        s.add("feeds_cuda", feeds_cuda, "", "static")
    s.locations.append(Location(str(tmp / "train.py") if tmp else "train.py", line,
                                "loader = DataLoader(ds, batch_size=64)"))
    return s


def test_catalog_has_the_design_rules():
    assert [r.id for r in RULES][:7] == [f"PD00{i}" for i in range(1, 8)]
    names = {r.id: r.name for r in RULES}
    assert names["PD002"] == "dataloader-workers" and names["PD006"] == "loss-graph-retained"
    for r in RULES:
        assert r.doc.what and r.doc.why and r.doc.references


def test_pd002_fires_when_loop_waits_and_estimates_the_saving():
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0)
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD002"
    # L = 8 ms with 0 workers; with 4 workers the wait is max(0, 8/4 - 12) = 0: all 8 ms saved
    assert finding.ms_per_step == pytest.approx(8.0)
    assert finding.fraction_of_step == pytest.approx(0.4)
    assert finding.saving_basis == "measured in this run"
    assert finding.confidence == "high"
    assert "num_workers=0" in finding.title


def test_pd002_partial_saving_when_loading_dominates():
    f = cpu_run(step_ms=100.0, cpus=2)
    loader(f, workers=0, wait_ms=90.0)  # compute 10 ms; 2 workers -> wait 45 - 10 = 35
    (finding,) = judge(f, RULES)
    assert finding.ms_per_step == pytest.approx(55.0)


@pytest.mark.parametrize("workers,wait", [(0, 0.3), (2, 0.0), (0, None), (2, 9.0)])
def test_pd002_silent_when_workers_keep_up_or_none_can_be_added(workers, wait):
    f = cpu_run(step_ms=20.0, cpus=2)
    loader(f, workers=workers, wait_ms=wait)
    assert "PD002" not in ids(judge(f, RULES))


def test_pd002_threshold_from_settings():
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=3.0)  # 15 % of the step
    assert "PD002" in ids(judge(f, RULES))
    strict = Settings(thresholds={"PD002": {"min_wait_fraction": 0.2}})
    assert "PD002" not in ids(judge(f, RULES, strict))


def test_select_and_ignore():
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0)
    assert judge(f, RULES, Settings(ignore=["PD002"])) == []
    assert judge(f, RULES, Settings(select=["PD00"])) != []
    assert judge(f, RULES, Settings(select=["PD005"])) == []


def test_pd003_only_where_batches_go_to_cuda():
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=False)
    assert "PD003" not in ids(judge(f, RULES))
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=True, feeds_cuda=True)
    assert "PD003" not in ids(judge(f, RULES))
    # a CPU run's pin_memory=False says nothing of the GPU path: only the source's value there counts
    f = cpu_run()
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True)
    assert "PD003" not in ids(judge(f, RULES))
    for on_cuda, fires in ((True, False), (False, True)):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True).add("pin_memory_on_cuda", on_cuda, "", "static")
        assert ("PD003" in ids(judge(f, RULES))) is fires
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD003" and finding.ms_per_step is None
    assert finding.saving_basis.startswith("GPU-only, not measured on this run: this run had no GPU")
    assert "no number" in finding.saving_basis and finding.confidence == "medium"
    # on a GPU run the run's own value decides
    f = cpu_run()
    f.add("device.type", "cuda", "", "machine")
    loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True).add("pin_memory_on_cuda", True, "", "static")
    assert "PD003" in ids(judge(f, RULES))


def test_pd003_measured_on_gpu_trace():
    f = Facts()
    f.add("step.time_ms", 50.0, "ms", "trace")
    f.add("copies.h2d_pageable_per_step", 2, "count", "trace")
    f.add("copies.h2d_pageable_ms", 4.0, "ms", "trace")
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD003"]
    assert finding.ms_per_step == pytest.approx(2.0)
    assert finding.saving_basis == "measured in this trace"


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


def test_pd007_on_a_cpu_run_of_a_cuda_script():
    def run(uses_amp, targets=True, autocast=False, params=5_000_000):
        f = cpu_run()
        f.add("script.targets_cuda", targets, "", "static")
        f.add("script.uses_amp", uses_amp, "", "static")
        f.add("autocast.enabled", autocast, "", "run")
        f.add("model.param_dtype", "float32", "", "run")
        m = f.subject("model", "train.py:40")
        m.add("autocast", autocast, "", "run")
        m.add("params", params, "count", "run")
        m.locations.append(Location("train.py", 40, "out = model(x)"))
        return judge(f, RULES)
    (finding,) = run(uses_amp=False)  # a CPU without AMX: still a GPU problem of a CUDA script
    assert finding.rule == "PD007" and finding.ms_per_step is None
    assert finding.saving_basis.startswith("GPU-only") and "n/a" not in finding.title
    assert "CUDA-targeting" in finding.title
    assert run(uses_amp=True) == []  # nanoGPT: autocast on the CUDA path only counts as autocast
    assert run(uses_amp=False, targets=False) == []  # a CPU script on a CPU without AMX
    assert run(uses_amp=False, autocast=True) == []
    assert run(uses_amp=False, params=500_000) == []  # a tiny MLP: launch-bound on a GPU


def test_pd008_host_reads_of_a_cuda_script_on_a_cpu_run():
    def run(targets=True, count=None, device="cpu"):
        f = cpu_run()
        f.add("device.type", device, "", "machine")
        f.add("script.targets_cuda", targets, "", "static")
        s = f.subject("host_read", "train.py:12")
        s.add("kind", "item", "", "static")
        s.add("in_loop", True, "", "static")
        s.add("count_per_step", count, "count", "run")
        s.locations.append(Location("train.py", 12, "total += loss.item()"))
        return judge(f, RULES)
    (finding,) = run()
    assert finding.rule == "PD008" and finding.locations[0].line == 12
    assert finding.title == ("A host read of a device tensor (item) on every training step: "
                             "a host-device sync each time on the GPU")
    assert finding.saving_basis.startswith("GPU-only") and finding.confidence == "medium"
    (finding,) = run(count=2.0)
    assert "2 time(s) per step" in finding.title and "in the source and in this run" in finding.saving_basis
    assert run(count=0.1) == []  # the probe saw it once every ten steps: logging, not a step cost
    assert run(targets=False) == []  # a CPU-only script: .item() is no device sync
    assert run(device="cuda") == []  # on a GPU the trace's measured syncs decide


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


def test_pd004_silent_when_script_never_targets_cuda():
    f = cpu_run()
    f.add("script.targets_cuda", False, "", "static")
    f.subject("cpu_to_device", "t.py:3").add("factory", "zeros", "", "static")
    assert judge(f, RULES) == []


def test_pd004_only_for_tensors_made_every_step():
    def run(in_loop, factory="zeros"):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        s = f.subject("cpu_to_device", "t.py:3")
        s.add("factory", factory, "", "static")
        s.add("in_loop", in_loop, "", "static")
        s.locations.append(Location("t.py", 3, "h0 = torch.zeros(2, 16, 8).to(device)"))
        return judge(f, RULES)
    assert run(in_loop=False) == []  # once per epoch or per run: nothing per step
    (finding,) = run(in_loop=True)
    assert "on every step" in finding.message and "Pass device=" in finding.message
    (finding,) = run(in_loop=True, factory="cuda.FloatTensor")
    assert finding.title.startswith("torch.cuda.FloatTensor(...)") and "torch.randn(..., device=" in finding.message


def test_pd003_not_for_an_evaluation_loader():
    for trains, fires in ((False, False), (True, True)):
        f = cpu_run()
        f.add("script.targets_cuda", True, "", "static")
        s = loader(f, workers=2, wait_ms=0.0, pin=False, feeds_cuda=True)
        s.add("pin_memory_on_cuda", False, "", "static")
        s.add("trains", trains, "", "static")
        assert ("PD003" in ids(judge(f, RULES))) is fires


def test_pd008_trusts_the_source_over_a_short_logging_interval():
    f = cpu_run()
    f.add("script.targets_cuda", True, "", "static")
    s = f.subject("host_read", "train.py:30")
    s.add("kind", "item", "", "static")
    s.add("in_loop", False, "", "static")  # behind `if it % log_interval == 0`
    s.add("count_per_step", 1.0, "count", "run")  # the run logged every step
    s.locations.append(Location("train.py", 30, "lossf = loss.item()"))
    assert judge(f, RULES) == []


def test_pd005_once_per_epoch_is_not_flagged():
    f = cpu_run()
    f.subject("empty_cache", "t.py:9").add("calls_per_step", 0.01, "count", "run")
    assert judge(f, RULES) == []


def test_pd006_run_evidence_decides_over_static():
    f = cpu_run()
    s = f.subject("loss_holder", "t.py:12")
    s.add("kind", "attribute", "", "static")
    s.add("tensor_name", "loss", "", "static")
    assert judge(f, RULES) == []  # the run scanned and saw nothing retained there
    s.add("graphs_per_step", 1.0, "count", "run")
    s.add("holder", "meter.vals", "", "run")
    f.add("memory.growth_bytes_per_step", 3 * 1024 * 1024, "bytes", "run")
    f.add("memory.steps_to_oom", 5000.0, "count", "run")
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD006" and finding.severity == "high"
    assert "meter.vals" in finding.title
    assert "3.0 MB per step" in finding.message and "5000 steps" in finding.message


def test_pd006_static_only_without_a_run():
    f = Facts()
    s = f.subject("loss_holder", "t.py:12")
    s.add("kind", "list", "", "static")
    (finding,) = judge(f, RULES)
    assert finding.confidence == "medium"


@pytest.mark.parametrize("amp,autocast,fires", [(False, False, False), (True, True, False), (True, False, True)])
def test_pd007_judges_the_hardware(amp, autocast, fires):
    f = Facts()
    f.add("step.time_ms", 100.0, "ms", "run")
    f.add("device.type", "cuda", "", "machine")
    f.add("device.amp_available", amp, "", "machine", "CUDA capability 8.0 >= 7.0")
    f.add("autocast.enabled", autocast, "", "run")
    f.add("model.param_dtype", "float32", "", "run")
    f.add("matmul.fp32_share", 0.9, "ratio", "trace")
    f.add("matmul.ms", 40.0, "ms", "trace")
    found = [x for x in judge(f, RULES) if x.rule == "PD007"]
    assert bool(found) == fires
    if fires:
        assert found[0].ms_per_step == pytest.approx(40.0 * 0.9 * 0.5)


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
