"""PD001 (rules/PD001-dataparallel.toml), judged on hand-built facts: why it has no number.

Its sample: sample_scripts/pd001_dataparallel.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd001_dataparallel.* (tests/report/test_golden.py)."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge


def test_pd001_says_why_it_has_no_number() -> None:
    """PD001 reads no fact for its saving (none measures DataParallel's overhead): with several GPUs
    the basis says so instead of claiming the run had too few."""
    pd001 = next(r for r in load_rules() if r.id == "PD001")
    assert pd001.saving_ms is None
    for count, says in [(None, "this run had 0 GPU(s)"), (1, "this run had 1 GPU(s)"),
                        (4, "is not measured apart from the rest of the step")]:
        f = Facts()
        f.add("device.count", count, "count", "machine")
        f.subject("dataparallel", "t.py:1").add("constructed", True, "", "run")
        (finding,) = judge(f, [pd001])
        assert finding.ms_per_step is None and says in finding.saving_basis, finding.saving_basis


def test_pd001_quiet_where_the_user_must_turn_dataparallel_on() -> None:
    """Built only under `if args.dp:` (a store_true flag: `dataparallel.opt_in`), DataParallel is no part
    of the script's default run; a run that built it (the user passed --dp) is judged as any other."""
    pd001 = next(r for r in load_rules() if r.id == "PD001")
    f = Facts()
    s = f.subject("dataparallel", "t.py:9")
    s.add("callee", "nn.DataParallel", "", "static")
    s.add("opt_in", True, "", "static")
    assert judge(f, [pd001]) == []
    s.add("constructed", True, "", "run")
    (finding,) = judge(f, [pd001])
    assert finding.rule == "PD001"
    plain = Facts()
    plain.subject("dataparallel", "t.py:9").add("callee", "nn.DataParallel", "", "static")
    assert len(judge(plain, [pd001])) == 1


def test_pd001_quiet_at_a_construction_the_run_never_reached(tmp_path) -> None:
    """ddim (corpn): the run built nn.DataParallel around the trained model (runners/diffusion.py:111);
    EMAHelper.ema_copy's nn.DataParallel (models/ema.py:37) serves sampling only and never ran. The
    finding is the built one's, not led by a line the training does not take."""
    from pathlib import Path

    from perfdoctor.contracts.run import Site
    from perfdoctor.facts.model import site_subject
    from perfdoctor.facts.static import analyse_files

    script = tmp_path / "train.py"
    script.write_text("import torch, torch.nn as nn\n"
                      "def ema_copy(m):\n    return nn.DataParallel(m)\n"
                      "def train(model):\n    model = nn.DataParallel(model)\n"
                      "def main(net):\n    if torch.cuda.is_available():\n        net = nn.DataParallel(net).cuda()\n"
                      "    else:\n        net = nn.DataParallel(net)\n")
    pd001 = next(r for r in load_rules() if r.id == "PD001")
    f = Facts()
    for line, function in ((5, "train"), (10, "main")):
        site = Site(file=str(script), line=line, function=function)
        site_subject(f, "dataparallel", site).add("constructed", True, "", "run")
    analyse_files([Path(script)], f)
    built = {s.locations[0].line: getattr(s.facts.get("dataparallel.constructed"), "value", None)
             for s in f.of_kind("dataparallel")}
    # the CUDA branch of main's if/else (retinanet-csv) is the same decision as the CPU one the run took
    assert built == {3: False, 5: True, 8: None, 10: True}
    lines = sorted(loc.line for finding in judge(f, [pd001]) for loc in finding.locations)
    assert 3 not in lines and {5, 8} <= set(lines)
    # a run that built none (a CPU run past `if use_cuda:`) leaves the source's constructions as they were
    bare = Facts()
    analyse_files([Path(script)], bare)
    assert all("dataparallel.constructed" not in s.facts for s in bare.of_kind("dataparallel"))
    assert len(judge(bare, [pd001])) >= 1
