"""PD002 (rules/PD002-dataloader-workers.toml), judged on hand-built facts: when the loop waits for data, the saving workers would bring, a CPU run projected onto the GPU it targets.

Its samples: sample_scripts/pd002_dataloader_workers.py, sample_scripts/pd002_config_dict.py (end to end: tests/analysis/test_e2e_samples.py; the fixed twin: tests/rules/test_fixes_applied.py);
its goldens: tests/golden/expected/pd002_dataloader_workers.*, tests/golden/expected/pd002_config_dict.*, tests/golden/expected/torch213_cpu_mlp_dataloader.* (tests/report/test_golden.py);
its saving range: tests/facts/test_run_numbers.py; its fix: tests/rules/test_fixes.py."""

from __future__ import annotations

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.model import Location
from perfdoctor.rules.config import Settings
from perfdoctor.rules.engine import PROJECTED, judge
from tests.rules.builders import RULES, cpu_run, ids, loader

PD002 = [r for r in RULES if r.id == "PD002"]


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


@pytest.mark.parametrize("targets_cuda", [True, False])
def test_pd002_fix_pins_only_where_the_batches_go_to_a_gpu(tmp_path, targets_cuda):
    """The fix adds pin_memory=True where the source moves the batches to a GPU the script names; a move
    on a script whose device is the CPU unless the user says otherwise is no GPU (PD003's `to_gpu`)."""
    (tmp_path / "train.py").write_text("\n" * 9 + "loader = DataLoader(ds, batch_size=64)\n")
    f = cpu_run(step_ms=20.0, cpus=4)
    f.add("script.targets_cuda", targets_cuda, "", "static")
    loader(f, workers=0, wait_ms=8.0, feeds_cuda=True, tmp=tmp_path)
    (finding,) = [x for x in judge(f, RULES, Settings(project=tmp_path)) if x.rule == "PD002"]
    assert ("pin_memory=True" in finding.fix.after) is targets_cuda


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


def _cpu_run_of_gpu_script(load_ms, step_ms, targets_cuda=True, cpus=4):
    f = Facts()
    f.add("step.time_ms", step_ms, "ms")
    f.add("cpu.count", cpus, "count", "machine")
    f.add("device.type", "cpu", "", "machine")
    f.add("script.targets_cuda", targets_cuda, "", "static")
    gpu = (step_ms - load_ms) / 10
    f.add("step.gpu_compute_ms", gpu, "ms")
    f.add("step.gpu_speedup", 10.0, "number")  # as facts/run/dataloader.py adds them together
    s = f.subject("dataloader", "train.py:10")
    s.add("num_workers", 0, "count")
    s.add("pin_memory", False)
    s.add("wait_ms", load_ms, "ms")
    s.add("wait_fraction", load_ms / step_ms, "ratio")
    s.add("load_ms", load_ms, "ms")
    s.locations.append(Location("train.py", 10, "loader = DataLoader(ds)"))
    return f


def test_pd002_projects_a_cpu_run_onto_a_gpu():
    # 5 ms of loading beside 200 ms of CPU compute: 2 % here, 5 / (5 + 19.5) = 20 % of a GPU step
    (finding,) = judge(_cpu_run_of_gpu_script(5.0, 200.0), PD002)
    assert finding.title.startswith("On a GPU, loading batches would take 20% of the step: 5 ms per step")
    assert "Projected for a GPU, not measured" in finding.message
    # the projection's numbers are the finding's evidence, not its message
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["step.gpu_compute_ms"] == pytest.approx(19.5) and evidence["step.gpu_speedup"] == 10.0
    # with 4 workers the GPU step hides 5/4 ms of loading behind 19.5 ms of compute: all 5 ms saved
    assert finding.ms_per_step == pytest.approx(5.0)
    # that GPU's saving, not this CPU's: said so, and verify leaves it to a GPU
    assert finding.saving_basis.startswith(PROJECTED)
    assert judge(_cpu_run_of_gpu_script(5.0, 200.0, targets_cuda=False), PD002) == []
    assert judge(_cpu_run_of_gpu_script(0.5, 20.0), PD002) == []  # below 1 ms: in-memory data


def test_pd002_projects_onto_the_reference_gpus_step_where_the_run_was_traced():
    # the trace's estimate of the GPU step (target_gpu.step_ms: launch floor and math at the script's own
    # batch, twice this run's) replaces the CPU step / 10: 5 ms of loading a batch here is 10 ms at the
    # script's batch, against a 5 ms GPU step
    f = _cpu_run_of_gpu_script(5.0, 200.0)
    f.add("target_gpu.step_ms", 5.0, "ms", "trace")
    f.add("target_gpu.batch_scale", 2.0, "ratio", "trace")
    (finding,) = judge(f, PD002)
    assert finding.title == ("On a GPU, loading batches would take 67% of the step: 10 ms per step in the training "
                             "process with num_workers=0 at the batch the script uses by default")
    assert finding.ms_per_step == pytest.approx(10.0)  # 4 workers: 2.5 ms each step, hidden behind 5 ms
    # its share is of that GPU step with the loading it leaves (10 of 15 ms), not of this CPU's 200 ms step
    assert finding.fraction_of_step == pytest.approx(10.0 / 15.0) and finding.severity == "high"
    assert {"target_gpu.step_ms", "target_gpu.batch_scale"} <= {e.name for e in finding.evidence}
    # a large model's GPU step (the estimate: 500 ms) leaves the same loading 1 %: nothing to flag
    g = _cpu_run_of_gpu_script(5.0, 200.0)
    g.add("target_gpu.step_ms", 500.0, "ms", "trace")
    assert judge(g, PD002) == []


def test_pd002_projected_saving_is_a_share_of_the_gpu_step_however_long_the_cpu_step():
    """nst-johnson: a 12 s CPU step (VGG16 three times at 256x256) and 15.6 ms of loading a step, against a
    17.3 ms step estimated for the reference GPU: 11.9 ms saved is 36 % of that step, not 0.1 % of the
    CPU's (which made the finding minor)."""
    f = _cpu_run_of_gpu_script(15.6, 12000.0)
    f.add("target_gpu.step_ms", 17.3, "ms", "trace")
    (finding,) = judge(f, PD002)
    assert finding.severity == "high" and finding.fraction_of_step > 0.3


def test_pd002_projects_only_a_loader_the_training_steps_wait_on():
    """bert4rec: the validation loader (whose `trains` the run could not tell) loads 16 batches in the one step
    after each epoch: a mean wait of 5.2 ms a step and a median of 0. Its loading is no share of a training
    step; projected as one, it was a false high once the share was of the GPU step."""
    f = _cpu_run_of_gpu_script(5.2, 400.0)
    f.add("target_gpu.step_ms", 12.0, "ms", "trace")
    (s,) = f.of_kind("dataloader")
    s.add("wait_ms", 0.0, "ms")
    assert judge(f, PD002) == []


def test_pd002_judges_the_workers_of_the_cuda_path(tmp_path):
    # pytorch/examples: `cuda_kwargs = {'num_workers': 1, 'pin_memory': True}` merged in only where
    # CUDA is used. The CPU run had no workers; the GPU path has one, which hides loading behind compute
    from perfdoctor.facts.static import analyse_files

    src = tmp_path / "main.py"
    src.write_text("import torch\nfrom torch.utils.data import DataLoader\n"
                   "use_cuda = torch.cuda.is_available()\ndevice = torch.device('cuda' if use_cuda else 'cpu')\n"
                   "train_kwargs = {'batch_size': 64}\nif use_cuda:\n"
                   "    train_kwargs.update({'num_workers': 1, 'pin_memory': True, 'shuffle': True})\n"
                   "loader = DataLoader(ds, **train_kwargs)\n")
    facts = _cpu_run_of_gpu_script(5.0, 200.0)
    analyse_files([src], facts)
    (static,) = [s for s in facts.of_kind("dataloader") if s.key.endswith("main.py:8")]
    assert static.facts["dataloader.num_workers_on_cuda"].value == 1
    # the same loader as the run's: 5 ms of loading per step, 19.5 ms of GPU compute hide it all
    run = facts.of_kind("dataloader")[0]
    run.add("num_workers_on_cuda", 1, "count", source="static")
    assert judge(facts, PD002) == []
    # one worker cannot keep up with 50 ms of loading per 15 ms GPU step: flagged, on the GPU path's terms
    slow = _cpu_run_of_gpu_script(50.0, 200.0)
    slow.of_kind("dataloader")[0].add("num_workers_on_cuda", 1, "count", source="static")
    (f,) = judge(slow, PD002)
    assert f.title.startswith("On a GPU, num_workers=1 (what the script sets on CUDA) would leave 35 ms")
    assert f.message.startswith("The workers do not keep up")
    # 4 workers: 50/4 = 12.5 ms of loading, all behind 15 ms of compute: 35 ms saved
    assert f.ms_per_step == pytest.approx(35.0)


def test_pd002_leaves_an_evaluation_loader_alone():
    # dragen1860's lesson28 and keon's resnet.py: a test loader with no workers, iterated once per epoch
    # in a loop that takes no training step; its loading, spread over the steps as a mean, projected
    # a third of a GPU step. The training loader beside it is judged as before
    f = _cpu_run_of_gpu_script(15.0, 60.0)
    assert ids(judge(f, PD002)) == ["PD002"]
    f.subjects["dataloader"][0].add("trains", False, "", "static")
    assert judge(f, PD002) == []
    # where the run saw the batches reach the steps, the loader trains
    g = _cpu_run_of_gpu_script(15.0, 60.0)
    g.subjects["dataloader"][0].add("trains", True)
    assert ids(judge(g, PD002)) == ["PD002"]


def test_pd002_saving_leaves_the_receipt_of_each_batch():
    # a batch from a worker still costs the training process its receipt (the queue, the unpickling, the
    # storages out of shared memory): 8 ms of loading hidden by 4 workers saves 8 - 1.5 ms, not 8
    f = cpu_run(step_ms=20.0, cpus=4)
    loader(f, workers=0, wait_ms=8.0).add("receipt_ms", 1.5, "ms")
    (finding,) = judge(f, RULES)
    assert finding.ms_per_step == pytest.approx(6.5)
    assert {e.name: e.value for e in finding.evidence}["dataloader.receipt_ms"] == 1.5
    # where the loading is not hidden anyway the receipt changes nothing: 90 ms with 2 workers leaves 35
    g = cpu_run(step_ms=100.0, cpus=2)
    loader(g, workers=0, wait_ms=90.0).add("receipt_ms", 1.5, "ms")
    (finding,) = judge(g, RULES)
    assert finding.ms_per_step == pytest.approx(55.0)


def test_pd002_cpu_bound_counts_the_receipt():
    # 2 CPUs, the tree busy 30 of a 20 ms step: at most 20 - (30 + 2) / 2 = 4 ms saved, where without
    # the receipt it would be 5
    f = cpu_run(step_ms=20.0, cpus=2)
    f.add("cpu.tree_ms", 30.0, "ms", "run")
    loader(f, workers=0, wait_ms=8.0).add("receipt_ms", 2.0, "ms")
    (finding,) = judge(f, RULES)
    assert finding.ms_per_step == pytest.approx(4.0)


def test_pd002_cpu_bound_leaves_the_cpus_other_processes_keep():
    # 2 CPUs and a loading wait of 8 ms in a 20 ms step, the tree busy 20 ms: on a quiet machine two
    # workers save all 8 ms (20 - 20 / 2 = 10 is no bound). Where another process kept one CPU busy all
    # along, the tree has the other one only: the step cannot fall below 20 ms, nothing is saved and the
    # finding is minor (ignite-mnist under load: the workers made the step 4-6 ms slower, docs/verify.md)
    def run(others: float | None) -> Facts:
        f = cpu_run(step_ms=20.0, cpus=2)
        f.add("cpu.tree_ms", 20.0, "ms", "run")
        if others is not None:
            f.add("host.others_cpus", others, "number", "run")
        loader(f, workers=0, wait_ms=8.0)
        return f

    (quiet,) = judge(run(0.0), PD002)
    assert quiet.ms_per_step == pytest.approx(8.0)
    (half,) = judge(run(0.5), PD002)  # 1.5 CPUs left: 20 - 20 / 1.5 = 6.7 ms at most
    assert half.ms_per_step == pytest.approx(20 - 20 / 1.5)
    (busy,) = judge(run(1.0), PD002)
    assert busy.ms_per_step == 0.0 and busy.severity == "low"
    assert {e.name: e.value for e in busy.evidence}["host.others_cpus"] == 1.0
    # the message says why the wait it reports saves nothing here; a quiet machine's does not
    assert ("bounded by its free CPUs: the training process used 1 and other processes 1 of its 2"
            in busy.message) and "(0 ms per step at most)" in busy.message
    assert "bounded by its free CPUs" not in quiet.message
    (over,) = judge(run(1.7), PD002)  # never fewer CPUs than the tree had: 1 of them
    assert over.ms_per_step == 0.0


def test_pd002_projection_keeps_the_receipt():
    # projected for a GPU: 5 ms of loading hidden by 4 workers behind 19.5 ms of GPU compute, less the
    # receipt the GPU process still pays, 0.8 ms
    f = _cpu_run_of_gpu_script(5.0, 200.0)
    f.of_kind("dataloader")[0].add("receipt_ms", 0.8, "ms")
    (finding,) = judge(f, PD002)
    assert finding.ms_per_step == pytest.approx(4.2)


def test_pd002_is_quiet_where_the_wait_is_no_longer_than_the_receipt():
    """Workers never take the wait below what receiving their batches costs: a loader of two small
    tensors waited on for 1.15 ms per 8.7 ms step, with 1.09 ms of receipt, has nothing for workers to
    win back (the PD030 sample's gloo job on a slower host, CI of 2026-11-28), here or projected for a
    GPU; three times that wait is a real share of the step either way."""
    def cpu(wait_ms: float) -> Facts:
        f = cpu_run(step_ms=8.7, cpus=4)
        loader(f, workers=0, wait_ms=wait_ms).add("receipt_ms", 1.09, "ms")
        return f

    assert judge(cpu(1.15), PD002) == []
    (finding,) = judge(cpu(3.45), PD002)  # 2.36 ms beyond the receipt: 27 % of the step
    assert finding.ms_per_step == pytest.approx(3.45 - 1.09)

    def projected(load_ms: float) -> Facts:  # 1.02 ms of loading (1.7 % here) against a 6 ms GPU step
        f = _cpu_run_of_gpu_script(load_ms, 60.0 + load_ms)
        f.of_kind("dataloader")[0].add("receipt_ms", 1.09, "ms")
        return f

    assert judge(projected(1.02), PD002) == []
    (finding,) = judge(projected(3.06), PD002)
    assert finding.title.startswith("On a GPU, loading batches would take")


def test_pd002_on_a_batch_source_of_the_user_s_advises_a_dataloader_and_saves_alike():
    """A generator the training loop draws from (dataloader.source, facts/static/batch_source.py): the
    same wait model and saving as a num_workers=0 DataLoader's, the advice to wrap it in one."""
    f = cpu_run(step_ms=20.0, cpus=4)
    s = loader(f, workers=0, wait_ms=8.0)
    plain = judge(f, RULES)
    s.add("source", "Corpus.batches(), a generator of the script's on the training thread", "", "static")
    (finding,) = judge(f, RULES)
    assert finding.rule == "PD002" and finding.ms_per_step == pytest.approx(plain[0].ms_per_step)
    assert finding.message.startswith("Batches come from Corpus.batches()")
    assert "DataLoader over an IterableDataset" in finding.message and "num_workers=4" in finding.message
    cheap = cpu_run(step_ms=20.0, cpus=4)
    loader(cheap, workers=0, wait_ms=1.0).add("source", "g(), a generator", "", "static")  # 5 % of the step
    assert "PD002" not in ids(judge(cheap, RULES))
