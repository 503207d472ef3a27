"""Run facts and rules of the checklist measured on the steps: PD015 (worker start-up per epoch),
PD020 (periodic stalls named by their line), PD027 (gc.collect() on the steps), PD018 (too many
DataLoader workers for the CPUs), PD019 (eval-mode forwards recording autograd), PD029
(torch.compile's graph breaks and recompilations)."""

from __future__ import annotations

import json
import textwrap

import pytest

from perfdoctor.facts.run import load_run
from perfdoctor.facts.run.stalls import _period
from perfdoctor.facts.static import analyse_files
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import judge
from tests.facts.test_run_facts import make_run

RULES = [r for r in load_rules() if r.id in ("PD015", "PD018", "PD019", "PD020", "PD027", "PD029")]


def site(line: int, code: str = "x", function: str = "main") -> dict:
    return {"file": "/x/train.py", "line": line, "code": code, "function": function}


def findings(run_dir):
    """As the analysis judges a run: its facts, then the static read of its files (none here: the run's
    own ranking of a stall's lines stands, `periodic_stall.choose`)."""
    r = load_run(run_dir)
    analyse_files(r.user_files, r.facts)
    return r, judge(r.facts, RULES, user_files=r.user_files)


# -- PD027 ---------------------------------------------------------------------------------------

def test_gc_collect_every_step_is_measured_and_flagged(tmp_path):
    probes = {"gc_calls": [{"site": site(30, "gc.collect()"), "calls": 40, "calls_in_steps": 40,
                            "ms_by_step": [[i, 8.0, 1] for i in range(1, 41)]},
                           {"site": site(10, "gc.collect()"), "calls": 1, "calls_in_steps": 0, "ms_by_step": []}]}
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    (s,) = r.facts.of_kind("gc_collect")  # the call before the loop is no subject
    assert s.key == "/x/train.py:30"
    assert s.facts["gc_collect.ms"].value == pytest.approx(8.0)
    assert s.facts["gc_collect.calls_per_step"].value == pytest.approx(1.0)
    (f,) = fs
    assert f.rule == "PD027" and f.ms_per_step == pytest.approx(8.0)


def test_gc_collect_now_and_then_is_quiet(tmp_path):
    # one call every 20 steps at 2 ms: 0.1 ms per step, under the rule's floor
    probes = {"gc_calls": [{"site": site(30, "gc.collect()"), "calls": 2, "calls_in_steps": 2,
                            "ms_by_step": [[20, 2.0, 1], [40, 2.0, 1]]}]}
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    assert r.facts.of_kind("gc_collect") and not fs


# -- PD020 ---------------------------------------------------------------------------------------

def _stall_probes(slow_line_steps, everywhere=range(1, 41)):
    return {"stalls": {"interval_s": 0.005,
                       "samples_by_step": [[i, 10] for i in range(1, 41)],
                       "lines": [
                           {"site": site(50, "main()", "<module>"), "depth": 0,
                            "by_step": [[i, 10] for i in everywhere]},
                           {"site": site(37, "save_checkpoint(model, ckpt)"), "depth": 1,
                            "by_step": [[i, 8] for i in slow_line_steps]},
                           {"site": site(18, "torch.save(state, path)", "save_checkpoint"), "depth": 2,
                            "by_step": [[i, 8] for i in slow_line_steps]},
                       ]}}


def test_periodic_stall_named_by_the_outermost_line_that_runs_only_then(tmp_path):
    slow = [i for i in range(1, 41) if i % 4 == 1]
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=_stall_probes(slow)))
    (s,) = r.facts.of_kind("periodic_stall")
    assert s.key == "/x/train.py:37"
    f = {k: v.value for k, v in s.facts.items()}
    assert f["periodic_stall.period"] == 4 and f["periodic_stall.extra_ms"] == pytest.approx(50.0)
    steady = [i for i in range(14, 41)]  # make_run's window: steps 6..13 are not steady
    n_slow = sum(1 for i in steady if i % 4 == 1)
    assert f["periodic_stall.ms_per_step"] == pytest.approx(50.0 * n_slow / len(steady))
    (finding,) = fs
    assert finding.rule == "PD020" and finding.locations[0].line == 37
    ms = f["periodic_stall.ms_per_step"]
    assert finding.fraction_of_step == pytest.approx(ms / (10.0 + ms))


def test_a_stall_is_named_by_its_first_line_that_does_not_run_every_step(tmp_path):
    """The sampler looks at an ordinary step once, at one phase: `opt.step()`, late in every step, is
    seen on the slow steps more often than the checkpoint behind `if step % 4 == 1:`. The run hands both
    lines over in its order (`rank`); the static read says `opt.step()` runs on every step, and the
    checkpoint is named."""
    run = tmp_path / "run"
    d = make_run(run, wall=lambda i: 60.0 if i % 4 == 1 else 10.0)
    (d / "train.py").write_text(textwrap.dedent("""\
        import torch
        def main():
            for step, (x, y) in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                opt.step()
                if step % 4 == 1:
                    torch.save(model.state_dict(), "ckpt.pt")
        main()
        """))
    slow = [i for i in range(1, 41) if i % 4 == 1]

    def at(line, code, function="main"):
        return {"file": str(d / "train.py"), "line": line, "code": code, "function": function}

    probes = {"stalls": {"interval_s": 0.005, "samples_by_step": [[i, 10] for i in range(1, 41)],
                         "lines": [{"site": at(9, "main()", "<module>"), "depth": 0, "by_step": [[i, 10] for i in range(1, 41)]},
                                   {"site": at(6, "opt.step()"), "depth": 1, "by_step": [[i, 8] for i in slow]},
                                   {"site": at(8, "torch.save(...)"), "depth": 1, "by_step": [[i, 8] for i in slow if i != 21]}]}}
    (d / "probes.json").write_text(json.dumps(probes))
    r, fs = findings(d)
    (s,) = r.facts.of_kind("periodic_stall")
    assert s.key.endswith("train.py:8") and s.facts["periodic_stall.rank"].value == 1
    assert [f.locations[0].line for f in fs if f.rule == "PD020"] == [8]
    # the same run with the checkpoint's line unseen: opt.step() alone, on every step: no finding
    probes["stalls"]["lines"].pop()
    (d / "probes.json").write_text(json.dumps(probes))
    r, fs = findings(d)
    (s,) = r.facts.of_kind("periodic_stall")
    assert s.facts["periodic_stall.every_step"].value is True and not [f for f in fs if f.rule == "PD020"]


def test_no_period_no_stall(tmp_path):
    # slow steps at no fixed period, a line seen on them: not periodic
    slow = [15, 16, 22, 31, 33]
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i in slow else 10.0, probes=_stall_probes(slow)))
    assert not r.facts.of_kind("periodic_stall") and not fs


def test_periodic_data_wait_is_not_a_stall(tmp_path):
    # epoch boundaries: the extra time is data loading (PD015's, PD002's business)
    slow = [i for i in range(1, 41) if i % 4 == 1]
    d = make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=_stall_probes(slow))
    import json
    steps = json.loads((d / "steps.json").read_text())
    for s in steps["steps"]:
        s["data_ms"] = s["wall_ms"] - 8.0
    (d / "steps.json").write_text(json.dumps(steps))
    r, fs = findings(d)
    assert not r.facts.of_kind("periodic_stall") and not fs


def test_periodic_stall_without_a_line_of_its_own_is_not_named(tmp_path):
    slow = [i for i in range(1, 41) if i % 4 == 1]
    # the only lines are seen on every step: nothing runs on the slow steps alone
    probes = _stall_probes(range(1, 41))
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=probes))
    assert not fs and slow


def _loaded(n, wait, slow_line, slow_steps, other_line_steps):
    """A run beside other processes: the training thread's wait for a CPU on each step (`wait(i)`),
    the sampler looking once a step and densely (late) on the slow ones, `slow_line` seen on
    `slow_steps` and `opt.step()` on `other_line_steps`."""
    rnd = [(i * 7919) % 101 / 101 for i in range(1, n + 1)]  # a fixed pseudo-random load
    return {"cpu_wait": {"wait_ms": [wait(i, rnd[i - 1]) for i in range(1, n + 1)], "run_ms": [8.0] * n},
            "stalls": {"interval_s": 0.005, "samples_by_step": [[i, 1 + 6 * (i in slow_steps)] for i in range(1, n + 1)],
                       "late_by_step": [[i, 6] for i in slow_steps],
                       "lines": [{"site": site(60, "main()", "<module>"), "depth": 0,
                                  "by_step": [[i, 1] for i in range(1, n + 1)]},
                                 {"site": slow_line, "depth": 1, "by_step": [[i, 6] for i in slow_steps]},
                                 {"site": site(41, "opt.step()"), "depth": 1,
                                  "by_step": [[i, 6] for i in other_line_steps]}]}}


def test_steps_slowed_by_waiting_for_a_cpu_are_no_stall(tmp_path):
    # every 7th step a neighbour holds the CPU 50 ms (issue 20: "every 7 steps a step takes 440 ms
    # longer" at opt.step(), a line that runs every step): the sampler, looking densely on the long
    # steps, saw opt.step() there; less the wait, the steps are alike
    slow = [i for i in range(1, 41) if i % 7 == 0]
    probes = _loaded(40, lambda i, u: 50.0 if i % 7 == 0 else 0.5 * u, site(41, "opt.step()"), slow, slow)
    r, fs = findings(make_run(tmp_path, wall=lambda i: 10.0 + (50.0 if i % 7 == 0 else 0.5 * ((i * 7919) % 101 / 101)),
                              probes=probes))
    assert not r.facts.of_kind("periodic_stall") and not [f for f in fs if f.rule == "PD020"]
    assert r.facts.value("cpu.contended") is True  # 50 ms of 60 every 7th step: the report says so


def test_checkpoint_every_15_steps_beside_load_is_named(tmp_path):
    # a checkpoint every 15 steps (30 ms) on a host whose load makes the training thread wait 0-300 ms
    # on any step: less the wait, the checkpoint's steps stand out, and its line is named; its 2 ms per
    # step are a share of the step the script takes (10 ms), not of the inflated wall time (~160 ms)
    ckpt = [i for i in range(1, 121) if i % 15 == 0]
    probes = _loaded(120, lambda i, u: 300.0 * u, site(37, "save_checkpoint(model, ckpt)"), ckpt, [])
    r, fs = findings(make_run(tmp_path, n=120, wall=lambda i: 10.0 + 300.0 * ((i * 7919) % 101 / 101)
                              + (30.0 if i % 15 == 0 else 0.0), probes=probes))
    assert r.facts.value("step.time_ms") > 100 and r.facts.value("step.work_ms") == pytest.approx(10.0)
    (s,) = r.facts.of_kind("periodic_stall")
    assert s.key == "/x/train.py:37" and s.facts["periodic_stall.period"].value == 15
    assert [f.locations[0].line for f in fs if f.rule == "PD020"] == [37]


def test_period_search():
    xs = [(i, 30.0 if i % 3 == 0 else 10.0 + (i % 2)) for i in range(10, 30)]
    assert _period(xs) == (3, [i for i in range(10, 30) if i % 3 == 0])
    assert _period([(i, 10.0 + (i % 2)) for i in range(10, 30)]) is None


# -- PD015 ---------------------------------------------------------------------------------------

def _loader(persistent=False, constructed=1, first=(400.0, 300.0, 320.0, 310.0, 305.0), workers=2):
    return {"dataloaders": [{"id": 0, "site": site(12, "loader = DataLoader(ds, num_workers=2)"),
                             "kwargs": {"batch_size": 32, "num_workers": workers, "pin_memory": False,
                                        "persistent_workers": persistent},
                             "kwargs_style": "literal", "batches": 40, "constructed": constructed,
                             "wait_ms_per_step": [5.0] * 40, "first_batch_ms": list(first), "length": 8}]}


def test_worker_startup_every_epoch(tmp_path):
    probes = _loader()
    probes["dataloaders"][0]["site"]["file"] = str(tmp_path / "train.py")
    d = make_run(tmp_path, wall=lambda i: 40.0, probes=probes)
    (d / "train.py").write_text("from torch.utils.data import DataLoader\n" + "\n" * 10
                                + "loader = DataLoader(ds, num_workers=2)\n")
    r, fs = findings(d)
    (dl,) = r.facts.of_kind("dataloader")
    f = {k: v.value for k, v in dl.facts.items()}
    assert f["dataloader.epochs"] == 5 and f["dataloader.startup_ms"] == pytest.approx(307.5 - 5.0)
    # 4 restarts (epochs 2..5) over the run's 40 training steps
    assert f["dataloader.startup_ms_per_step"] == pytest.approx((307.5 - 5.0) * 4 / 40)
    (finding,) = fs
    assert finding.rule == "PD015" and finding.ms_per_step == pytest.approx(30.25)
    assert finding.title.startswith("Each pass over this DataLoader (every 8 training steps) waits 302 ms")
    # paid at the epoch start, not in the median step: its share is of the median step plus itself
    assert finding.fraction_of_step == pytest.approx(30.25 / (40.0 + 30.25))
    assert finding.fix is not None
    assert finding.fix.after.strip() == "loader = DataLoader(ds, num_workers=2, persistent_workers=True)"


@pytest.mark.parametrize("kw", [{"persistent": True}, {"constructed": 5}, {"workers": 0},
                                {"first": (400.0,)}, {"first": (30.0, 8.0, 9.0)}])
def test_worker_startup_quiet_where_persistence_cannot_help(tmp_path, kw):
    _, fs = findings(make_run(tmp_path, wall=lambda i: 40.0, probes=_loader(**kw)))
    assert not fs


def _restarts(tmp_path, own_ms: float, step_ms: float, **probes_extra):
    """Epochs of 8 steps, the epochs' first batches at steps 1, 9, 17, 25, 33; the loader's own time in
    each later start step `own_ms` (5 ms on the others), those steps `step_ms` long (40 ms the others;
    steps 9 and below are the warm-up): the run's facts and findings."""
    probes = {**_loader(), **probes_extra}
    probes["dataloaders"][0]["first_batch_step"] = [1, 9, 17, 25, 33]
    probes["dataloaders"][0]["wait_ms_per_step"] = [own_ms if i in (9, 17, 25, 33) else 5.0 for i in range(1, 41)]
    r, fs = findings(make_run(tmp_path, wall=lambda i: step_ms if i in (17, 25, 33) else 40.0, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    return dl, fs


def test_worker_startup_measured_on_the_epoch_start_steps(tmp_path):
    # the steps that start epochs 3..5 are steady and take 200 ms more
    dl, (finding,) = _restarts(tmp_path, own_ms=205.0, step_ms=240.0)
    assert dl.facts["dataloader.startup_ms"].value == pytest.approx(200.0)
    assert finding.ms_per_step == pytest.approx(200.0 / 8)  # one restart every 8 training steps


def test_loaders_starting_passes_in_one_step_share_its_extra_time(tmp_path):
    # a test loader's pass starts in the train loader's epoch-start steps (gomodular-tinyvgg, development
    # half: both findings claimed the whole step). The test loader runs each pass whole inside the step
    # (an evaluation): the step's 380 ms hold the evaluation's work, no restart's, so each loader's
    # start-up is its own time there (seqlabel-lmlstmcrf: 3.5 s of validation taken for one worker's start)
    test = {**_loader()["dataloaders"][0], "id": 1, "site": site(20, "test_loader = DataLoader(ts, num_workers=2)"),
            "first_batch_step": [1, 9, 17, 25, 33], "length": 1, "batches": 5,
            "wait_ms_per_step": [25.0 if i in (9, 17, 25, 33) else 0.0 for i in range(1, 41)]}
    probes = _loader()
    probes["dataloaders"][0]["first_batch_step"] = [1, 9, 17, 25, 33]
    probes["dataloaders"][0]["wait_ms_per_step"] = [80.0 if i in (9, 17, 25, 33) else 5.0 for i in range(1, 41)]
    probes["dataloaders"].append(test)
    r, fs = findings(make_run(tmp_path, wall=lambda i: 420.0 if i in (17, 25, 33) else 40.0, probes=probes))
    startup = {s.locations[0].line: s.facts["dataloader.startup_ms"].value for s in r.facts.of_kind("dataloader")}
    assert startup == {12: pytest.approx(75.0), 20: pytest.approx(25.0)}
    # drawn by the training steps too (two loaders zipped), it runs no pass whole in one step: the step's
    # extra time is shared by their own times there (75 and 25 - 1 ms over their steady waits)
    probes["dataloaders"][1]["wait_ms_per_step"] = [25.0 if i in (9, 17, 25, 33) else 1.0 for i in range(1, 41)]
    r, fs = findings(make_run(tmp_path / "zipped", wall=lambda i: 420.0 if i in (17, 25, 33) else 40.0, probes=probes))
    startup = {s.locations[0].line: s.facts["dataloader.startup_ms"].value for s in r.facts.of_kind("dataloader")}
    assert startup == {12: pytest.approx(380.0 * 75 / 99), 20: pytest.approx(380.0 * 24 / 99)}


def test_persistent_workers_still_wait_for_a_passs_first_batch(tmp_path):
    # the workers spend 12 ms of CPU on each batch: a pass's first batch waits for that with persistent
    # workers too, so the saving is the restart less one batch's loading
    cpu = {"wait_ms": [0.0] * 40, "run_ms": [35.0] * 40, "workers_run_ms": [12.0] * 40,
           "workers_wait_ms": [0.0] * 40, "workers": [2] * 40}
    dl, (finding,) = _restarts(tmp_path, own_ms=205.0, step_ms=240.0, cpu_wait=cpu)
    assert dl.facts["dataloader.refill_ms"].value == pytest.approx(12.0)
    assert finding.ms_per_step == pytest.approx((200.0 - 12.0) / 8)


def test_worker_startup_per_pass_counts_the_steps_between_passes(tmp_path):
    # passes of 32 steps, the run cut short 8 steps into the second (playground-mnist, corpi): the run's
    # 40 steps over its 2 passes made a pass 20 steps, each restart dearer; a pass is 32 steps
    probes = _loader(first=(400.0, 300.0))
    probes["dataloaders"][0]["first_batch_step"] = [1, 33]
    probes["dataloaders"][0]["wait_ms_per_step"] = [205.0 if i == 33 else 5.0 for i in range(1, 41)]
    r, _ = findings(make_run(tmp_path, wall=lambda i: 240.0 if i == 33 else 40.0, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.facts["dataloader.steps_per_pass"].value == 32
    assert dl.facts["dataloader.startup_ms_per_step"].value == pytest.approx(200.0 / 32)


def test_worker_startup_per_pass_leaves_out_a_peek(tmp_path):
    # `real, _ = next(iter(loader))` before an infinite loop over the loader (w867gans-dcgan, corpn): the
    # peek's pass delivered one batch, the loop's pass began a step later. That is no pass of 1 step (each
    # restart charged to every step): a pass is the loader's 32 batches at one a step
    probes = _loader(first=(400.0, 300.0))
    probes["dataloaders"][0].update(first_batch_step=[1, 2], first_batch_index=[0, 1], length=32)
    probes["dataloaders"][0]["wait_ms_per_step"] = [205.0 if i == 2 else 5.0 for i in range(1, 41)]
    r, _ = findings(make_run(tmp_path, wall=lambda i: 40.0, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.facts["dataloader.steps_per_pass"].value == pytest.approx(32.0)
    startup = dl.facts["dataloader.startup_ms"].value
    assert dl.facts["dataloader.startup_ms_per_step"].value == pytest.approx(startup / 32)


def test_worker_startup_of_an_evaluation_loader_is_per_training_step(tmp_path):
    # a validation loader of 2 batches, restarted at each of 5 evaluations over 40 training steps:
    # 4 restarts of 300 ms cost a training step 30 ms, not 300 / 2 = 150 ms (its own batches)
    probes = _loader()
    probes["dataloaders"][0]["length"] = 2
    r, fs = findings(make_run(tmp_path, wall=lambda i: 40.0, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.facts["dataloader.startup_ms_per_step"].value == pytest.approx((307.5 - 5.0) * 4 / 40)
    (finding,) = fs
    assert finding.title.startswith("Each pass over this DataLoader (every 8 training steps)")


def test_periodic_stall_needs_its_line_on_most_stalls(tmp_path):
    # a line seen on one slow step only (a chance sample under load) names no stall
    slow = [i for i in range(1, 41) if i % 4 == 1]
    probes = _stall_probes([slow[-1]])
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=probes))
    assert not r.facts.of_kind("periodic_stall") and not fs


def _late(probes, steps):
    probes["stalls"]["late_by_step"] = [[i, 3] for i in steps]
    return probes


def test_periodic_stall_judged_on_the_stalls_watched_while_they_ran(tmp_path):
    # the sampler caught only every other stall while it ran (the rest were looked at before it
    # began): the line is on all of those, so it names the stall
    slow = [i for i in range(1, 41) if i % 4 == 1]
    watched = slow[::2]
    probes = _late(_stall_probes(watched), watched)
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=probes))
    (finding,) = fs
    assert finding.rule == "PD020" and finding.locations[0].line == 37
    # without the late looks every slow step counts, and the line is on too few of them
    r, fs = findings(make_run(tmp_path / "all", wall=lambda i: 60.0 if i % 4 == 1 else 10.0,
                              probes=_stall_probes(watched)))
    assert not fs


def test_periodic_stall_needs_enough_stalls_watched(tmp_path):
    slow = [i for i in range(1, 41) if i % 4 == 1]
    probes = _late(_stall_probes(slow), slow[-2:])  # two stalls watched: too few to name a line
    r, fs = findings(make_run(tmp_path, wall=lambda i: 60.0 if i % 4 == 1 else 10.0, probes=probes))
    assert not fs


# -- PD019 ---------------------------------------------------------------------------------------

def _eval_grad(saved=(9 << 20,) * 20, backward=0, calls=40, ms=5.0):
    return {"eval_grad": [{"site": site(16, "out = model(x)", "evaluate"), "module": "Sequential", "calls": calls,
                           "ms_by_step": [[i, ms, 1] for i in range(1, calls + 1)],
                           "saved_bytes": list(saved), "backward": backward}]}


def test_eval_forward_with_grad_is_flagged_with_its_memory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("def evaluate(model, x):\n    model.eval()\n    out = model(x)\n    return out\n")
    probes = _eval_grad()
    probes["eval_grad"][0]["site"] = {"file": str(src / "train.py"), "line": 3, "code": "out = model(x)",
                                      "function": "evaluate"}
    r = load_run(make_run(tmp_path / "run", wall=lambda i: 20.0, probes=probes))
    fs = judge(r.facts, RULES, user_files=[src / "train.py"])
    (s,) = r.facts.of_kind("eval_grad")
    assert s.facts["eval_grad.saved_bytes"].value == 9 << 20
    assert s.facts["eval_grad.backward_share"].value == 0.0
    assert s.facts["eval_grad.calls_per_step"].value == pytest.approx(1.0)
    assert s.facts["eval_grad.ms"].value == pytest.approx(5.0)
    (f,) = fs
    assert f.rule == "PD019" and f.ms_per_step is None and "9.0 MiB" in f.title.replace("MB", "MiB")
    assert "Sequential runs in eval mode" in f.title
    assert f.fix is not None and f.fix.after == "    with torch.no_grad():\n        out = model(x)"


def test_eval_forward_with_a_backward_of_a_module_trained_in_train_mode(tmp_path):
    # the Annotated Transformer's evaluation: model.eval(), then SimpleLossCompute(opt=None) still calls
    # loss.backward() on every evaluation batch, all of them between two training steps; the run saw the
    # same module trained in train mode
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("def evaluate(model, x):\n    model.eval()\n    out = model(x)\n    return out\n")

    def judged(trained, every_step=False):
        probes = _eval_grad(backward=20)
        probes["eval_grad"][0]["site"] = {"file": str(src / "train.py"), "line": 3, "code": "out = model(x)",
                                          "function": "evaluate"}
        probes["eval_grad"][0]["trained"] = trained
        if not every_step:
            probes["eval_grad"][0]["ms_by_step"] = [[20, 100.0, 40]]  # the evaluation: 40 calls at one step
        r = load_run(make_run(tmp_path / f"run{trained}{every_step}", wall=lambda i: 20.0, probes=probes))
        return r, judge(r.facts, RULES, user_files=[src / "train.py"])

    r, (f,) = judged(True)
    assert f.rule == "PD019" and "a backward through it in an evaluation" in f.title
    assert "drop that backward before wrapping" in f.message
    (s,) = r.facts.of_kind("eval_grad")
    assert 0 < s.facts["eval_grad.step_share"].value < 0.1
    assert not judged(False)[1]  # a model kept in eval mode while it trains (frozen BatchNorm): not flagged
    # a GAN's generator step through a discriminator it keeps in eval mode (trained in train mode in its own
    # step): a backward through eval-mode forwards on every training step is training, not an evaluation
    r, fs = judged(True, every_step=True)
    assert r.facts.of_kind("eval_grad")[0].facts["eval_grad.step_share"].value == 1.0 and not fs


def test_eval_forward_judged_at_the_evaluation_loaders_default_batch(tmp_path):
    # a CPU run given --test-batch-size 64 of a default 200 (corpi's playground-mnist): 0.58 MiB saved
    # per call at 64 is under the 1 MiB floor, 1.8 MiB at the batch the script evaluates with
    from perfdoctor.facts.static import analyse_files

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import argparse\nfrom torch.utils.data import DataLoader\n"
        "p = argparse.ArgumentParser()\np.add_argument('--test_batch_size', type=int, default=200)\n"
        "args = p.parse_args()\ntest_loader = DataLoader(ds, batch_size=args.test_batch_size)\n"
        "def evaluate(model, x):\n    model.eval()\n    out = model(x)\n    return out\n")
    probes = _eval_grad(saved=(int(0.58 * (1 << 20)),) * 20)
    probes["eval_grad"][0]["site"] = {"file": str(src / "train.py"), "line": 9, "code": "out = model(x)",
                                      "function": "evaluate"}
    probes["eval_grad"][0]["batch"] = [64] * 20

    def judged(loader_batch):
        r = load_run(make_run(tmp_path / f"run{loader_batch}", wall=lambda i: 20.0, probes=probes))
        loader = r.facts.subject("dataloader", f"{src / 'train.py'}:6")
        loader.add("dataloader.batch_size", loader_batch, "count", "run")
        loader.add("dataloader.trains", False, "", "run")
        analyse_files([src / "train.py"], r.facts)
        return r.facts, judge(r.facts, RULES, user_files=[src / "train.py"])

    facts, fs = judged(64)
    (s,) = facts.of_kind("eval_grad")
    assert s.facts["eval_grad.batch"].value == 64 and s.facts["eval_grad.default_batch"].value == 200
    (f,) = [f for f in fs if f.rule == "PD019"]
    assert "1.8 MiB" in f.title.replace("MB", "MiB") and "default batch of 200" in f.title
    # the loader of another batch fed these calls: nothing says which default applies, judged as run
    facts, fs = judged(32)
    assert "eval_grad.default_batch" not in facts.of_kind("eval_grad")[0].facts
    assert not [f for f in fs if f.rule == "PD019"]


def test_eval_forward_seen_in_the_source_only(tmp_path):
    from perfdoctor.facts.model import Facts
    from perfdoctor.facts.static import analyse_files

    src = tmp_path / "train.py"
    src.write_text("def evaluate(model, x):\n    model.eval()\n    return model(x)\n\nfor x in data:\n"
                   "    net(x).sum().backward()\n    evaluate(net, x)\n")
    facts = Facts()
    analyse_files([src], facts)
    (f,) = judge(facts, RULES, user_files=[src])
    assert f.rule == "PD019" and f.locations[0].line == 3 and "no torch.no_grad()" in f.title
    assert f.fix is not None and f.fix.after == "    with torch.no_grad():\n        return model(x)"
    # the run measured the call: a backward used its graph, the source's reading gives way
    facts.subject("eval_grad", f"{src}:3").add("eval_grad.measured", 20, "count")
    facts.subject("eval_grad", f"{src}:3").add("eval_grad.backward_share", 1.0, "ratio")
    facts.subject("eval_grad", f"{src}:3").add("eval_grad.saved_bytes", 1 << 24, "bytes")
    assert not judge(facts, RULES, user_files=[src])


def test_eval_mode_training_with_a_backward_is_quiet(tmp_path):
    # model.eval() kept while training (frozen BatchNorm): a backward runs through every graph
    r, fs = findings(make_run(tmp_path, probes=_eval_grad(backward=20)))
    assert r.facts.of_kind("eval_grad") and not fs


def test_eval_forward_that_saves_nothing_is_quiet(tmp_path):
    # frozen parameters: autograd records nothing, nothing is kept
    r, fs = findings(make_run(tmp_path, probes=_eval_grad(saved=(0,) * 20)))
    assert not fs


def test_eval_forward_unmeasured_is_quiet(tmp_path):
    # no saved-tensor hooks could be used (the script compiles): nothing says a backward never came
    r, fs = findings(make_run(tmp_path, probes=_eval_grad(saved=())))
    assert "eval_grad.measured" not in r.facts.of_kind("eval_grad")[0].facts and not fs


# -- PD029 ---------------------------------------------------------------------------------------

def test_graph_break_named_by_its_line_and_reason(tmp_path):
    probes = {"compile": {
        "graph_breaks": [{"site": site(22, "if h.mean().item() > 1.0:", "forward"),
                          "reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False", "steps": [1, 1]}],
        "frames": [{"site": site(20, "def forward(self, x):", "forward"), "name": "forward", "compiles": [[1, 300.0]]},
                   {"site": site(22, "if h.mean().item() > 1.0:", "torch_dynamo_resume_in_forward_at_22"),
                    "name": "torch_dynamo_resume_in_forward_at_22", "compiles": [[1, 50.0], [2, 40.0]],
                    "reasons": ["___stack0 == 0.1"]}]}}
    r, fs = findings(make_run(tmp_path, probes=probes))
    (s,) = r.facts.of_kind("graph_break")  # the resumed frame's recompile at step 2 is the break's line, and not steady
    assert s.facts["graph_break.kind"].value == "graph break" and s.facts["graph_break.count"].value == 1
    assert len(s.locations) == 1
    (f,) = fs
    assert f.rule == "PD029" and f.ms_per_step is None and "Tensor.item()" in f.title
    assert [(loc.line, loc.code) for loc in f.locations] == [(22, "if h.mean().item() > 1.0:")]


def test_recompiles_on_the_steady_steps_are_measured(tmp_path):
    # a new input shape every 4th step: 300 ms compiling each time; steady steps are 14..40
    compiles = [[1, 900.0]] + [[i, 300.0] for i in range(4, 41, 4)]
    probes = {"compile": {"graph_breaks": [], "frames": [
        {"site": site(20, "def step(x):", "step"), "name": "step", "compiles": compiles,
         "reasons": ["0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9"]}]}}
    r, fs = findings(make_run(tmp_path, probes=probes))
    (s,) = r.facts.of_kind("graph_break")
    steady = [i for i in range(16, 41, 4)]  # 16, 20, ..., 40
    assert s.facts["graph_break.steady"].value == len(steady)
    assert s.facts["graph_break.ms"].value == pytest.approx(300.0 * len(steady) / 27)
    (f,) = fs
    assert f.rule == "PD029" and f.ms_per_step == pytest.approx(300.0 * len(steady) / 27)
    assert "size mismatch" in f.title


def test_compiles_only_at_start_are_quiet(tmp_path):
    probes = {"compile": {"graph_breaks": [], "frames": [
        {"site": site(20, "def step(x):", "step"), "name": "step", "compiles": [[1, 900.0], [2, 300.0]]}]}}
    r, fs = findings(make_run(tmp_path, probes=probes))
    assert not fs


# -- PD018 ---------------------------------------------------------------------------------------

def _crowded_loader(workers):
    return [{"id": 1, "site": site(46, "loader = DataLoader(ds, num_workers=8)"), "kwargs": {"num_workers": workers},
             "constructed": 1, "batches": 40, "wait_ms_per_step": [0.1] * 40}]


def _cpu_wait(burst_every=8, burst_wait=60.0, usual_wait=4.0, burst_workers_ms=(40.0, 200.0)):
    """Every `burst_every`th step the workers all load at once (on a CPU 40 ms, waiting 200 ms over a
    20 ms step: 12 runnable at once) and the training thread waits `burst_wait`; else `usual_wait`."""
    burst = [i % burst_every == 0 for i in range(1, 41)]
    return {"wait_ms": [burst_wait if b else usual_wait for b in burst], "run_ms": [15.0] * 40,
            "workers_run_ms": [burst_workers_ms[0] if b else 0.0 for b in burst],
            "workers_wait_ms": [burst_workers_ms[1] if b else 0.0 for b in burst], "workers": [8] * 40,
            "machine_ms": [40.0] * 40, "process_ms": [20.0] * 40}


def test_too_many_workers_measured_by_the_training_threads_wait(tmp_path):
    probes = {"dataloaders": _crowded_loader(8), "cpu_wait": _cpu_wait()}
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    (s,) = r.facts.of_kind("dataloader")
    # steady steps 14..40: bursts at 16, 24, 32, 40; 12 runnable, 1 CPU beside the training thread
    want = 4 * (60.0 - 4.0) * (12 - 1) / 12 / 27
    assert s.facts["dataloader.contention_ms"].value == pytest.approx(want)
    assert r.facts.value("cpu.wait_ms") == pytest.approx((4 * 60.0 + 23 * 4.0) / 27)
    (f,) = fs
    assert f.rule == "PD018" and f.ms_per_step == pytest.approx(want) and f.severity == "medium"
    assert "8 DataLoader workers on 2 usable CPUs" in f.title


def test_a_cuda_scripts_workers_on_a_cpu_run_are_judged_for_its_gpu_machine(tmp_path):
    """The same crowded loader, on a CPU run of a script that targets CUDA: its 8 workers were chosen
    for the GPU machine, whose CPUs this run cannot see (pytorch-fm's examples/main.py on 2 cores):
    no finding, rather than advice to use this box's 2."""
    probes = {"dataloaders": _crowded_loader(8), "cpu_wait": _cpu_wait()}
    r = load_run(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    assert r.facts.value("device.type") == "cpu"
    assert judge(r.facts, RULES, user_files=r.user_files)  # as a CPU script: PD018, measured
    r.facts.add("script.targets_cuda", True, "", "static")
    assert not judge(r.facts, RULES, user_files=r.user_files)
    # a count the script computes from the machine's CPUs (the PD018 sample's 4 per usable CPU) is as
    # crowded on the GPU machine: judged here
    for s in r.facts.of_kind("dataloader"):
        s.add("workers_follow_cpus", True, "", "static")
    assert [f.rule for f in judge(r.facts, RULES, user_files=r.user_files)] == ["PD018"]


def test_as_many_workers_as_cpus_is_quiet(tmp_path):
    probes = {"dataloaders": _crowded_loader(2), "cpu_wait": _cpu_wait()}
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    assert not fs


def test_idle_extra_workers_cost_nothing_measurable_and_are_no_finding(tmp_path):
    # 8 workers on 2 CPUs, but hardly ever loading at once: the training thread waits as usual, so a
    # finding would say "waits 0.0 ms per step for a CPU" (issue 20): none
    probes = {"dataloaders": _crowded_loader(8), "cpu_wait": _cpu_wait(burst_wait=4.0, burst_workers_ms=(2.0, 0.0))}
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes=probes))
    assert r.facts.of_kind("dataloader")[0].facts["dataloader.contention_ms"].value == 0.0
    assert not fs


def test_too_many_workers_without_schedstat_fires_unmeasured(tmp_path):
    r, fs = findings(make_run(tmp_path, wall=lambda i: 20.0, probes={"dataloaders": _crowded_loader(8)}))
    (f,) = fs
    assert f.rule == "PD018" and f.ms_per_step is None and "schedstat" in f.saving_basis
    assert f.severity == "low"  # the worker count alone (severity_unmeasured); measured, it is medium


def test_periodic_stalls_found_in_a_long_noisy_series_in_n_log_n() -> None:
    """A stall every 97 steps in 100,000 noisy steps is found (the search tried every class of every
    period: about cubic, 4,000 steps took 80 s); pure noise, as long, in no more time."""
    import random
    import time

    rng = random.Random(3)
    n = 100_000
    xs = [(i, 10.0 * rng.lognormvariate(0, 0.3) + (40.0 if i % 97 == 5 else 0.0)) for i in range(10, 10 + n)]
    t = time.perf_counter()
    p, members = _period(xs)
    assert (p, members[:2], len(members)) == (97, [102, 199], n // 97)
    noise = [(i, 10.0 * rng.lognormvariate(0, 0.3)) for i in range(10, 10 + n)]
    _period(noise)
    assert time.perf_counter() - t < 60  # seconds on a loaded 2-core box; the old search: hours


def test_period_matches_the_exhaustive_definition_on_short_series() -> None:
    """On short series the search gives what trying every class of every period gives."""
    import random
    import statistics

    from perfdoctor.facts.run import stalls

    def exhaustive(xs):
        for p in range(2, len(xs) // stalls.MIN_STALLS + 1):
            for r in range(p):
                members = [v for i, v in xs if i % p == r]
                others = [v for i, v in xs if i % p != r]
                if len(members) < stalls.MIN_STALLS or len(others) < stalls.MIN_STALLS:
                    continue
                med = statistics.median(others)
                spread = statistics.median(abs(v - med) for v in others) * 1.4826
                cut = med + max(stalls.SLOW_MADS * spread, stalls.SLOW_FRACTION * med, stalls.SLOW_MIN_MS)
                if sum(v > cut for v in members) >= stalls.HIT_RATE * len(members):
                    return p, [i for i, _ in xs if i % p == r]
        return None

    rng = random.Random(1)
    same = 0
    for _ in range(150):
        n, start = rng.randint(6, 90), rng.randint(0, 20)
        base, noise, amp = rng.choice([1.0, 5.0, 20.0]), rng.choice([0.01, 0.1, 0.3]), rng.choice([0, 0.5, 2, 10])
        p = rng.randint(2, max(2, n // 3))
        r = rng.randrange(p)
        xs = [(i, base * rng.lognormvariate(0, noise) + (amp * base if i % p == r and rng.random() < 0.85 else 0.0))
              for i in range(start, start + n)]
        same += _period(xs) == exhaustive(xs)
    assert same >= 148  # a pattern that no distance between slow steps suggests may be missed


# -- contention (issue 20) -----------------------------------------------------------------------

def test_contention_is_measured_said_and_shown_apart_in_the_breakdown(tmp_path):
    # the training thread waits 34.3 ms of every 51.2 ms step (67 %): other processes on its cores
    n = 40
    probes = {"cpu_wait": {"wait_ms": [34.3] * n, "run_ms": [16.6] * n, "tree_ms": [18.0] * n,
                           "machine_ms": [18.0 + 51.2 * 1.5] * n, "steal_ms": [0.0] * n, "pressure_ms": [40.0] * n, "pressure": True,
                           "loadavg": [5.2, 3.0, 1.0], "loadavg_end": [6.1, 3.2, 1.1]}}
    r, _ = findings(make_run(tmp_path, wall=lambda i: 51.2, probes=probes))
    assert r.facts.value("cpu.wait_share") == pytest.approx(34.3 / 51.2)
    assert r.facts.value("cpu.contended") is True and r.facts.value("cpu.tree_ms") == pytest.approx(18.0)
    assert r.facts.value("host.cpu_pressure") == pytest.approx(40.0 / 51.2)
    assert r.facts.value("host.load_avg") == 5.2
    assert r.facts.value("host.others_cpus") == pytest.approx(1.5)  # what the machine used beyond the tree
    c = r.summary.contention
    assert c and c.inflated and "waited 34.3 ms per step for a CPU, 67% of the step" in c.sentence
    assert "step times are inflated" in r.notes[0]
    parts = {b.category: b.ms for b in r.summary.breakdown}
    assert parts["waiting for a CPU"] == pytest.approx(51.2 * 34.3 / 51.2, abs=1e-3)
    assert sum(parts.values()) == pytest.approx(51.2, abs=1e-3)  # work and wait apart, adding up to the step


def test_a_wait_under_a_millisecond_is_said_in_microseconds(tmp_path):
    # 0.2 ms of a 0.55 ms step: 37 % of it, material, and not "waited 0 ms per step"
    n = 40
    probes = {"cpu_wait": {"wait_ms": [0.205] * n, "run_ms": [0.3] * n}}
    r, _ = findings(make_run(tmp_path, wall=lambda i: 0.55, probes=probes))
    c = r.summary.contention
    assert c and c.inflated and "waited 205 µs per step for a CPU, 37% of the step" in c.sentence


def test_a_rank_sharing_its_node_counts_no_other_processes(tmp_path):
    # one of two ranks on the node: the other rank's CPU time is in the machine's; cpu.count is this
    # rank's share already, so the CPUs other processes kept busy are not measured for it
    n = 40
    probes = {"cpu_wait": {"wait_ms": [0.1] * n, "run_ms": [9.8] * n, "tree_ms": [10.0] * n,
                           "machine_ms": [20.0] * n}}
    run = make_run(tmp_path / "single", wall=lambda i: 10.0, probes=probes)
    assert load_run(run).facts.value("host.others_cpus") == pytest.approx(1.0)
    ranked = make_run(tmp_path / "rank", wall=lambda i: 10.0, probes=probes)
    meta = json.loads((ranked / "meta.json").read_text())
    meta["rank"] = {"rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2, "cpu_share": 1}
    (ranked / "meta.json").write_text(json.dumps(meta))
    assert "host.others_cpus" not in load_run(ranked).facts


def test_a_quiet_host_says_nothing_of_contention(tmp_path):
    n = 40
    probes = {"cpu_wait": {"wait_ms": [0.1] * n, "run_ms": [9.8] * n, "tree_ms": [10.0] * n}}
    r, _ = findings(make_run(tmp_path, wall=lambda i: 10.0, probes=probes))
    assert r.facts.value("cpu.contended") is False and not r.summary.contention.inflated
    assert not any("inflated" in n for n in r.notes)
    assert "waiting for a CPU" not in {b.category for b in r.summary.breakdown}


def test_every_format_says_the_step_times_are_inflated(tmp_path):
    import io

    from rich.console import Console

    from perfdoctor.analysis import analyse_run
    from perfdoctor.report.formats import FORMATS, render
    n = 40
    probes = {"cpu_wait": {"wait_ms": [34.3] * n, "run_ms": [16.6] * n, "tree_ms": [18.0] * n}}
    report = analyse_run(make_run(tmp_path, wall=lambda i: 51.2, probes=probes))
    for fmt in FORMATS:
        out = render(fmt, report)
        if FORMATS[fmt].console:
            buf = io.StringIO()
            Console(file=buf, width=400, no_color=True).print(out)
            out = buf.getvalue()
        assert "waited 34.3 ms per step for a CPU, 67%" in out, fmt


# -- PD013 ---------------------------------------------------------------------------------------

def test_anomaly_mode_gets_the_time_of_its_stack_captures(tmp_path):
    """PD013's number: anomaly mode's Python stack captures per steady step (probes.json anomaly_stack_ms)
    plus the backward's NaN checks' share of the step (from the trace); without the captures, no number."""
    rule = [r for r in load_rules() if r.id == "PD013"]
    probes = {"anomaly": [{"site": site(16, "torch.autograd.set_detect_anomaly(True)"), "enabled": True}],
              "anomaly_stack_ms": [[i, 6.0] for i in range(1, 41)]}
    r = load_run(make_run(tmp_path / "a", wall=lambda i: 20.0, probes=probes))
    (s,) = r.facts.of_kind("anomaly")
    assert s.facts["anomaly.stack_ms"].value == pytest.approx(6.0)
    (f,) = judge(r.facts, rule, user_files=r.user_files)
    assert f.ms_per_step == pytest.approx(6.0) and "stack capture" in f.saving_basis
    # the backward's NaN checks, where a profiled step recorded them: their share of the step on top
    r.facts.add("autograd.nan_check_fraction", 0.25, "ratio", "trace")
    (f,) = judge(r.facts, rule, user_files=r.user_files)
    assert f.ms_per_step == pytest.approx(6.0 + 0.25 * 20.0)
    del probes["anomaly_stack_ms"]
    r = load_run(make_run(tmp_path / "b", wall=lambda i: 20.0, probes=probes))
    (f,) = judge(r.facts, rule, user_files=r.user_files)
    assert f.ms_per_step is None


def test_anomaly_stack_time_leaves_out_the_profilers_window(tmp_path):
    """A short run's steady steps include the profiler's window (6..13 here), where the profiler and
    cProfile make a stack capture dearer: PD013's number comes from the steady steps outside it."""
    probes = {"anomaly": [{"site": site(16, "torch.autograd.set_detect_anomaly(True)"), "enabled": True}],
              "anomaly_stack_ms": [[i, 2.0 if 6 <= i <= 13 else 0.7] for i in range(1, 16)]}
    r = load_run(make_run(tmp_path, n=15, wall=lambda i: 20.0, probes=probes))
    (s,) = r.facts.of_kind("anomaly")
    assert s.facts["anomaly.stack_ms"].value == pytest.approx(0.7)


def test_eval_forward_outside_the_steps_is_quiet(tmp_path):
    # TensorBoard's add_graph (jit.trace) runs an eval-mode forward with grad on once before the
    # first step: "0 call(s) per step", nothing of the training step to save
    probes = _eval_grad(calls=1)
    probes["eval_grad"][0]["ms_by_step"] = [[0, 30.0, 1]]
    probes["eval_grad"][0]["saved_bytes"] = [9 << 20]
    r, fs = findings(make_run(tmp_path, probes=probes))
    (s,) = r.facts.of_kind("eval_grad")
    assert s.facts["eval_grad.calls_per_step"].value == 0 and s.facts["eval_grad.measured"].value == 1
    assert not fs
