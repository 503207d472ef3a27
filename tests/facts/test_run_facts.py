"""load_run: a run folder -> facts, summary, hotspots, notes (synthetic folders; no child process)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from perfdoctor.contracts.report import HotLineDoc
from perfdoctor.errors import InputError
from perfdoctor.facts.run import load_run
from perfdoctor.facts.run.memory import memory_growth
from perfdoctor.stats import steady_steps

ENV_CPU = {"python": "3.11", "torch": "2.13.0", "cpu_count": 2, "cpu_amx": False, "cpu_model": "EPYC",
           "total_memory_bytes": 16 << 30, "free_memory_bytes": 8 << 30, "cuda_available": False,
           "device": "cpu", "device_name": "EPYC", "device_count": 0, "device_capability": None,
           "device_memory_bytes": None}
WINDOW = {"skip": 5, "warmup": 2, "active": 5, "first_step": 8, "last_step": 12, "completed": True,
          "steps_profiled": 5, "trace": True}


def make_run(d: Path, *, n=40, wall=lambda i: 10.0, mem=lambda i: 1 << 28, clock="optimizer", env=None,
             window=WINDOW, exit_=None, probes=None, hotspots=None, data=2.0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    steps = [{"i": i, "end_s": i * 0.01, "wall_ms": 500.0 if i == 1 else wall(i), "data_ms": data,
              "forward_ms": 3.0, "backward_ms": 4.0, "optimizer_ms": 0.5, "mem_bytes": mem(i)}
             for i in range(1, n + 1)]
    meta = {"schema": "perfdoctor/run/v1", "script": str(d / "train.py"), "module": None, "argv": ["train.py"],
            "cwd": str(d), "started": "2026-01-01T00:00:00", "wall_s": 1.0,
            "exit": exit_ or {"code": 0, "reason": "completed", "traceback": None}, "step_clock": clock,
            "window": window, "env": env or ENV_CPU, "user_files": [str(d / "train.py")], "complete": True}
    (d / "train.py").write_text("print('hi')\n")
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "steps.json").write_text(json.dumps({"steps": steps}))
    (d / "probes.json").write_text(json.dumps(probes or {}))
    if hotspots is not None:
        (d / "hotspots.json").write_text(json.dumps(hotspots))
    return d


def test_summary_uses_steady_steps_and_breakdown_adds_up(tmp_path):
    # steps 2..5 (before the window's skip), the window 6..12 and the step after it (the profiler's
    # stop) are slow; the rest take 10 ms
    r = load_run(make_run(tmp_path, wall=lambda i: 50.0 if i <= 13 else 10.0 + (i % 3)))
    st = r.summary.step_time_ms
    assert st.n == 27 and st.median == 11.0 and r.summary.steady_steps == [14, 40]
    assert r.facts.value("step.time_ms") == 11.0 and 11.0 < r.facts.value("step.time_p90_ms") <= 12.0
    parts = {b.category: b.ms for b in r.summary.breakdown}
    # each part's mean share of the steady steps (10, 11 and 12 ms in turn), times the median step
    inv = sum(1 / (10.0 + i % 3) for i in range(14, 41)) / 27
    expect = {"data loading": 2.0, "forward": 3.0, "backward": 4.0, "optimizer": 0.5}
    for cat, ms in expect.items():
        assert parts[cat] == pytest.approx(11.0 * ms * inv, abs=1e-4)
    assert parts["other"] == pytest.approx(11.0 - 11.0 * 9.5 * inv, abs=1e-3)
    assert math.isclose(sum(parts.values()), st.median, rel_tol=1e-6)
    assert math.isclose(sum(b.fraction for b in r.summary.breakdown), 1.0, abs_tol=1e-3)
    assert r.facts.value("run.step_clock") == "optimizer" and r.facts.value("run.steps_observed") == 40
    assert r.trace_path is None and r.user_files == [tmp_path / "train.py"] and r.notes == []


def test_breakdown_scaled_when_parts_exceed_the_step(tmp_path):
    r = load_run(make_run(tmp_path, wall=lambda i: 5.0, data=8.0))
    parts = {b.category: b.ms for b in r.summary.breakdown}
    assert parts["other"] == 0.0 and math.isclose(sum(parts.values()), 5.0, rel_tol=1e-6)


def test_steady_steps_fall_back_for_short_runs():
    steps = [{"i": i} for i in range(1, 5)]
    assert [s["i"] for s in steady_steps(steps, {"skip": 1, "last_step": 3})] == [2, 3, 4]
    assert [s["i"] for s in steady_steps(steps[:1], {"skip": 0, "last_step": 1})] == [1]


def test_memory_growth_only_when_clearly_linear(tmp_path):
    grow = [{"i": i, "mem_bytes": 1_000_000_000 + 500_000 * i + (i % 2) * 4096} for i in range(10, 60)]
    assert memory_growth(grow) == pytest.approx(500_000, rel=0.01)
    flat = [{"i": i, "mem_bytes": 1_000_000_000 + (i * 7919 % 13) * 100_000} for i in range(10, 60)]
    assert memory_growth(flat) is None
    tiny = [{"i": i, "mem_bytes": 1_000_000_000 + 1000 * i} for i in range(10, 60)]  # 50 KB in all
    assert memory_growth(tiny) is None

    probes = {"loss_holders": [{"site": {"file": "/x/train.py", "line": 30, "code": "history.append(loss)",
                                         "function": "main"}, "holder": "history", "kind": "list",
                                "tensor_name": "loss", "graphs_retained": 29, "first_step": 2, "last_step": 30,
                                "graphs_per_step": 1.0, "numel": 1}]}
    # the RSS grows only while the profiler holds the steps (the window 8..12 and the export step 13: its
    # event buffers, 0.4 MB a step), flat before and after: no growth (odenet-mnist: a false PD035 high
    # from the window's steps inside its steady steps 5..12)
    held = make_run(tmp_path / "held", n=14, mem=lambda i: (1 << 30) + 400_000 * min(max(i - 7, 0), 6))
    assert "memory.growth_bytes_per_step" not in load_run(held).facts
    r = load_run(make_run(tmp_path, mem=lambda i: (1 << 30) + (1 << 20) * i, probes=probes))
    g = r.facts.value("memory.growth_bytes_per_step")
    assert g == pytest.approx(1 << 20)
    assert r.facts.value("memory.steps_to_oom") == (8 << 30) // (1 << 20)
    assert r.facts.value("memory.peak_bytes") == (1 << 30) + 40 * (1 << 20)
    assert r.facts.value("memory.total_bytes") == 16 << 30
    (h,) = r.facts.of_kind("loss_holder")
    assert h.key == "/x/train.py:30" and h.locations[0].code == "history.append(loss)"
    assert h.facts["loss_holder.growth_bytes_per_step"].value == pytest.approx(1 << 20)
    assert h.facts["loss_holder.kind"].value == "list" and h.facts["loss_holder.graphs_per_step"].value == 1.0


def test_rss_peak_leaves_out_the_steps_the_profiler_held(tmp_path):
    # the window (skip 5, last step 12) and the export step 13 hold the profiler's buffers: +90 MB
    base = 1 << 28
    r = load_run(make_run(tmp_path, mem=lambda i: base + (90 << 20 if 6 <= i <= 13 else (i % 4) << 20)))
    peak = r.facts.get("memory.peak_bytes")
    assert peak.value == base + (3 << 20)
    assert peak.detail == "max process RSS at step ends (steps 1..5, 14..40)"


def test_machine_facts(tmp_path):
    r = load_run(make_run(tmp_path / "cpu"))
    amp = r.facts.get("device.amp_available")
    assert amp.value is False and amp.detail.startswith("CPU without AMX") and amp.source == "machine"
    assert r.facts.value("cpu.count") == 2 and "device.count" not in r.facts

    gpu = dict(ENV_CPU, cuda_available=True, device="cuda", device_name="A100", device_count=8,
               device_capability=[8, 0], device_memory_bytes=80 << 30)
    r = load_run(make_run(tmp_path / "a100", env=gpu))
    amp = r.facts.get("device.amp_available")
    assert amp.value is True and amp.detail.startswith("CUDA capability 8.0 >= 7.0")
    assert r.facts.value("device.capability") == 8.0 and r.facts.value("device.count") == 8
    # no step read CUDA memory (cuda_mem): the memory facts are the RSS's, against the host's memory
    assert r.facts.value("memory.total_bytes") == ENV_CPU["total_memory_bytes"]

    old = dict(gpu, device_capability=[6, 1])
    r = load_run(make_run(tmp_path / "p40", env=old))
    assert r.facts.value("device.amp_available") is False
    assert r.facts.get("device.amp_available").detail.startswith("CUDA capability 6.1 < 7.0")


def test_probe_subjects(tmp_path):
    site = lambda line, code: {"file": "/x/train.py", "line": line, "code": code, "function": "main"}  # noqa: E731
    waits = [100.0] + [6.0] * 39
    probes = {
        "dataloaders": [{"id": 0, "site": site(12, "loader = DataLoader(ds, **cfg)"),
                         "kwargs": {"batch_size": 64, "num_workers": 0, "pin_memory": False,
                                    "persistent_workers": False, "prefetch_factor": None,
                                    "multiprocessing_context": None},
                         "kwargs_style": "dict", "batches": 40, "wait_ms_per_step": waits, "to_cuda": False,
                         "non_blocking": None}],
        "empty_cache": [{"site": site(40, "torch.cuda.empty_cache()"), "calls": 40, "calls_in_steps": 39}],
        "dataparallel": [{"site": site(20, "model = nn.DataParallel(model)"), "device_ids": None, "device_count": 0}],
        "forward": [{"site": site(30, "out = model(x)"), "module": "Net", "calls": 40, "autocast": False,
                     "param_dtype": "float32", "device": "cpu", "params": 1000},
                    {"site": site(31, "loss = crit(out, y)"), "module": "CrossEntropyLoss", "calls": 40,
                     "autocast": False, "param_dtype": None, "device": "cpu", "params": 0}],
    }
    r = load_run(make_run(tmp_path, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.key == "/x/train.py:12" and dl.locations[0].code == "loader = DataLoader(ds, **cfg)"
    f = {k: v.value for k, v in dl.facts.items()}
    assert f["dataloader.wait_ms"] == 6.0 and f["dataloader.wait_fraction"] == pytest.approx(0.6)
    assert f["dataloader.num_workers"] == 0 and f["dataloader.kwargs_style"] == "dict"
    assert "dataloader.feeds_cuda" not in f and "dataloader.prefetch_factor" not in f  # not measured on a CPU
    (ec,) = r.facts.of_kind("empty_cache")
    assert ec.facts["empty_cache.calls_per_step"].value == 1.0 and ec.facts["empty_cache.in_loop"].value is True
    (dp,) = r.facts.of_kind("dataparallel")
    assert dp.facts["dataparallel.constructed"].value is True
    (model,) = r.facts.of_kind("model")  # the loss module has no parameters: not a model
    assert model.key == "/x/train.py:30" and model.facts["model.autocast"].value is False
    assert r.facts.value("autocast.enabled") is False and r.facts.value("model.param_dtype") == "float32"


def test_notes(tmp_path):
    r = load_run(make_run(tmp_path / "bwd", clock="backward"))
    assert r.notes == ["no optimizer step seen: steps counted by backward() calls"]
    assert r.facts.value("run.step_clock") == "backward"
    tb = "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: bad batch\n"
    r = load_run(make_run(tmp_path / "exc", n=4, window=dict(WINDOW, completed=False, steps_profiled=0, trace=False),
                          exit_={"code": 1, "reason": "exception", "traceback": tb}))
    assert "the script failed after 4 steps: ValueError: bad batch (train.py:3)" in r.notes
    assert any(n.startswith("profiler window not reached") for n in r.notes)
    r = load_run(make_run(tmp_path / "none", n=1, clock="none"))
    assert r.facts.value("run.step_clock") == "whole-run" and r.summary.step_time_ms.n == 1
    assert any("whole run is one span" in n for n in r.notes)


def test_no_step_in_a_script_that_trained_in_processes_it_started_says_so(tmp_path):
    # mp.spawn(main, nprocs=1): the training ran in a spawned process perfdoctor does not profile
    kids = {"children": [{"site": {"file": str(tmp_path / "k" / "train.py"), "line": 9, "code": "mp.spawn(main, nprocs=1)",
                                   "function": "<module>"}, "target": "main", "method": "spawn", "started": 1}]}
    r = load_run(make_run(tmp_path / "k", n=1, clock="none", probes=kids))
    assert not any("whole run is one span" in n for n in r.notes)
    note = next(n for n in r.notes if n.startswith("no steps found in the process perfdoctor ran"))
    assert "started 1 process itself at train.py:9 (main, spawn start)" in note and "--nproc-per-node" in note
    # with steps counted here, processes the script also started (a Pool's) are no note
    r = load_run(make_run(tmp_path / "s", probes=kids))
    assert r.notes == []


def test_a_distributed_job_the_script_started_itself_is_named(tmp_path):
    ddp = {"ddp": [{"site": None, "module": "M", "world_size": 2, "params": 10, "grad_bytes": 40, "by_step": []}]}
    r = load_run(make_run(tmp_path / "self", probes=ddp,
                          exit_={"code": 0, "reason": "steps-reached", "traceback": None}))
    (note,) = [n for n in r.notes if "distributed job" in n]
    assert "of 2 processes itself" in note and "--steps ended this process alone" in note
    assert "perfdoctor run --nproc-per-node 2" in note and r.facts.value("run.world_size") is None
    r = load_run(make_run(tmp_path / "one", probes={"ddp": [dict(ddp["ddp"][0], world_size=1)]}))
    assert not any("distributed job" in n for n in r.notes)


def test_hotspots_with_hot_lines(tmp_path):
    src = tmp_path / "data.py"
    src.write_text("class DS:\n    def __getitem__(self, i):\n        s = 0\n        for k in range(9):\n"
                   "            s += k\n        return s\n")
    hs = {"steps": 5, "samples": 100, "sample_interval_s": 0.002,
          "functions": [{"function": "__getitem__", "file": str(src), "line": 2, "tottime_s": 0.04,
                         "cumtime_s": 0.05, "ncalls": 320},
                        {"function": "<module>", "file": str(src), "line": 1, "tottime_s": 0.0, "cumtime_s": 0.06,
                         "ncalls": 1}],
          "lines": [{"file": str(src), "line": 5, "samples": 30}, {"file": str(src), "line": 6, "samples": 10},
                    {"file": str(src), "line": 40, "samples": 99}]}
    r = load_run(make_run(tmp_path, hotspots=hs))
    (h,) = r.hotspots
    assert (h.function, h.line, h.ms_per_step, h.calls_per_step) == ("__getitem__", 2, 10.0, 64.0)
    assert h.lines[0] == HotLineDoc(line=5, code="s += k", share=0.75, samples=30)
    assert [l.line for l in h.lines] == [5, 6]


def test_not_a_run_folder(tmp_path):
    with pytest.raises(InputError, match="not a perfdoctor run folder"):
        load_run(tmp_path)
    (tmp_path / "meta.json").write_text("{broken")
    with pytest.raises(InputError, match="not readable JSON"):
        load_run(tmp_path)


@pytest.mark.parametrize("name,content,where", [
    ("steps.json", {"steps": "many"}, "$.steps"),
    ("steps.json", {"steps": [{"i": "one", "wall_ms": 1.0}]}, "$.steps[0].i"),
    ("meta.json", None, "$.env"),  # env is a list
    ("probes.json", {"dataloaders": [{"site": {"file": "/x.py", "line": "12"}}]}, "$.dataloaders[0].site.line"),
    ("hotspots.json", {"workers": {"pids": 3}}, "$.workers.pids"),
])
def test_wrong_typed_files_are_input_errors(tmp_path, name, content, where):
    d = make_run(tmp_path)
    if content is None:
        content = dict(json.loads((d / name).read_text()), env=["cpu"])
    (d / name).write_text(json.dumps(content))
    with pytest.raises(InputError) as e:
        load_run(d)
    assert str(d / name) in e.value.message and where in e.value.message and "\n" not in e.value.message
    assert e.value.exit_code == 2


def test_older_files_without_newer_keys_read(tmp_path):
    meta = {"schema": "perfdoctor/run/v1", "script": None, "argv": [], "env": {}, "window": None,
            "step_clock": "none", "exit": {"code": 137, "reason": "killed", "traceback": None}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "probes.json").write_text(json.dumps({"forward": [{"site": None, "module": "Net"}]}))
    r = load_run(tmp_path)
    assert r.meta == meta and r.facts.value("run.steps_observed") == 0
    assert any("killed" in n for n in r.notes)


def test_run_facts_does_not_import_torch():
    import subprocess

    code = "import sys, perfdoctor.facts.run, perfdoctor.capture; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_user_files_include_the_training_code_of_the_users_own_package(tmp_path):
    # the script under projects/adder drives a Trainer in the project's own package, outside the
    # script's folder: the file that built the DataLoader and called the model is read too
    trainer = tmp_path / "pkg" / "trainer.py"
    trainer.parent.mkdir()
    trainer.write_text("loader = DataLoader(ds)\n")
    site = {"file": str(trainer), "line": 1, "code": "loader = DataLoader(ds)", "function": "run"}
    probes = {"dataloaders": [{"id": 0, "site": site, "kwargs": {"batch_size": 8, "num_workers": 0,
                                                                 "pin_memory": True},
                               "kwargs_style": "literal", "batches": 40, "wait_ms_per_step": [0.0] * 40,
                               "to_cuda": False, "non_blocking": None}]}
    r = load_run(make_run(tmp_path / "projects" / "adder", probes=probes))
    assert r.user_files == [tmp_path / "projects" / "adder" / "train.py", trainer]


def test_user_files_include_the_step_chain_and_the_models_classes(tmp_path):
    # cyoon1729's DQN: test_gym/dqn.py calls common/utils.py's loop (the step's call chain), whose agent
    # in vanillaDQN/dqn.py updates a model defined in vanillaDQN/models.py (the model's classes)
    loop, agent, models = (tmp_path / "common" / "utils.py", tmp_path / "vanillaDQN" / "dqn.py",
                           tmp_path / "vanillaDQN" / "models.py")
    for f in (loop, agent, models):
        f.parent.mkdir(exist_ok=True)
        f.write_text("x = 1\n")
    chain = [{"file": str(agent), "line": 1, "code": "self.optimizer.step()", "function": "update"},
             {"file": str(loop), "line": 1, "code": "agent.update(32)", "function": "mini_batch_train"}]
    forward = [{"site": {"file": str(agent), "line": 1, "code": "q = self.model(s)", "function": "get_action"},
                "module": "DQN", "calls": 40, "classes": [f"{models}:DQN"]}]
    r = load_run(make_run(tmp_path / "test_gym", probes={"step_chain": chain, "forward": forward}))
    assert r.user_files == [tmp_path / "test_gym" / "train.py", agent, loop, models]


@pytest.mark.slow  # a large run folder: run by CI, not in the fast tier
def test_a_100k_step_run_folder_is_analysed_in_seconds(tmp_path) -> None:
    """Every analysis over the step series is O(n log n) or better: a run folder of 100,000 noisy steps
    with a stall every 50 steps (the sampler saw one line on them) is analysed, PD020 found, in
    seconds (4,000 steps took 60 s when one of them was cubic)."""
    import random
    import time

    from perfdoctor.analysis import analyse_run

    rng = random.Random(0)
    n = 100_000
    walls = [10.0 * rng.lognormvariate(0, 0.3) + (40.0 if i % 50 == 7 else 0.0) for i in range(n + 1)]
    stalled = [i for i in range(1, n + 1) if i % 50 == 7]
    probes = {"stalls": {"interval_s": 0.005, "samples_by_step": [[i, 2] for i in range(1, n + 1)],
                         "late_by_step": [[i, 1] for i in stalled],
                         "lines": [{"site": {"file": str(tmp_path / "train.py"), "line": 1, "function": "save"},
                                    "depth": 1, "by_step": [[i, 2] for i in stalled]}]},
              "gc_time": {"ms_by_step": [[i, 0.1] for i in range(1, n + 1, 3)]}}
    run = make_run(tmp_path, n=n, wall=lambda i: walls[i], probes=probes)
    t = time.perf_counter()
    report = analyse_run(run, None)
    took = time.perf_counter() - t
    assert "PD020" in {f.rule for f in report.findings}
    assert took < 90, f"{took:.1f} s"  # about 4 s on an idle 2-core box; a quadratic step would take hours


def test_a_rebuilt_loaders_moves_land_on_the_users_loader(tmp_path):
    """A loader a library rebuilt from the user's (origin) is one subject at the user's line: where
    its batches were moved (host tensors) lands there too, not on a second subject at the library's."""
    user = {"file": "/x/train.py", "line": 12, "code": "loader = DataLoader(ds, batch_size=64)", "function": "main"}
    lib = {"file": "/lib/dp.py", "line": 80, "code": "return DataLoader(dataset, ...)", "function": "wrap"}
    move = {"file": "/x/train.py", "line": 30, "code": "x = x.to(device)", "function": "main"}
    kwargs = {"batch_size": 64, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": None, "multiprocessing_context": None}
    probes = {
        "dataloaders": [{"id": 3, "site": lib, "origin": user, "kwargs": kwargs, "batches": 40,
                         "wait_ms_per_step": [1.0] * 40, "to_cuda": False, "non_blocking": None}],
        "host_tensors": [{"loader": 3, "moved": move, "how": "to", "non_blocking": False, "moves": 8,
                          "steps": 8, "watched": 8}],
    }
    r = load_run(make_run(tmp_path, probes=probes))
    (dl,) = r.facts.of_kind("dataloader")
    assert dl.key == "/x/train.py:12"
    assert dl.facts["dataloader.moved"].value is True and dl.facts["dataloader.trains"].value is True
    assert any(loc.line == 30 for loc in dl.locations)


def test_functions_called_in_the_profiled_steps_unless_the_run_cannot_say():
    """cProfile's functions of the profiled steps, per file: none under 2 profiled steps, a list cut
    at MAX_FUNCTIONS or a compiled region."""
    from perfdoctor.capture.window import MAX_FUNCTIONS
    from perfdoctor.contracts.run import CompiledFrame, CompileRecord, FunctionStat, Hotspots, Probes, Site
    from perfdoctor.facts.run.context import RunContext
    from perfdoctor.facts.run.hotspots import functions_called

    def stat(file, line):
        return FunctionStat(function="f", file=file, line=line, tottime_s=0.0, cumtime_s=0.0, ncalls=3)

    rows = [stat("/p/nt_xent.py", 27), stat("/p/simclr.py", 29), stat("/p/nt_xent.py", 18)]
    assert functions_called(RunContext(hotspot_file=Hotspots(functions=rows, steps=3))) == {
        "/p/nt_xent.py": frozenset({27, 18}), "/p/simclr.py": frozenset({29})}
    assert functions_called(RunContext(hotspot_file=Hotspots(functions=rows, steps=1))) is None
    cut = [stat("/p/m.py", i) for i in range(MAX_FUNCTIONS)]
    assert functions_called(RunContext(hotspot_file=Hotspots(functions=cut, steps=3))) is None
    compiled = CompileRecord(frames=[CompiledFrame(site=Site(file="/p/m.py", line=1, code="", function="f"))])
    assert functions_called(RunContext(hotspot_file=Hotspots(functions=rows, steps=3),
                                       probes=Probes(compile=compiled))) is None


def test_a_loaders_batch_gives_its_receipt_cost_per_step(tmp_path):
    """PD002's receipt: the batch's tensors and bytes (the probe's) give what receiving such a batch from a
    worker would cost the training process, per batch x the batches per step."""
    from perfdoctor.facts.run import dataloader as dlf

    site = {"file": "/x/train.py", "line": 12, "code": "loader = DataLoader(ds)", "function": "main"}
    rec = {"id": 0, "site": site, "kwargs": {"batch_size": 64, "num_workers": 0}, "batches": 80,
           "wait_ms_per_step": [6.0] * 40, "batch_tensors": 2, "batch_bytes": 3 << 19}
    r = load_run(make_run(tmp_path, probes={"dataloaders": [rec]}))
    (dl,) = r.facts.of_kind("dataloader")
    f = {k: v.value for k, v in dl.facts.items()}
    assert f["dataloader.batch_tensors"] == 2 and f["dataloader.batch_bytes"] == 3 << 19
    one = dlf.RECEIPT_BASE_MS + 2 * dlf.RECEIPT_PER_TENSOR_MS + 1.5 * dlf.RECEIPT_PER_MB_MS
    assert one > 0
    assert f["dataloader.receipt_ms"] == pytest.approx(one * 2)  # 80 batches over 40 steps
    # a record from before the probe counted batches: no receipt, no guess
    old = {k: v for k, v in rec.items() if not k.startswith("batch_")}
    r = load_run(make_run(tmp_path / "old", probes={"dataloaders": [old]}))
    assert "dataloader.receipt_ms" not in r.facts.of_kind("dataloader")[0].facts


def test_a_receipt_timed_on_the_host_after_the_run_is_the_one_judged(tmp_path):
    """receipts.json (capture/receipt.py, written by the parent after the run) gives the receipt of a batch
    of the run's shape on its host; a shape it did not time, or a value no timing gives, keeps the estimate."""
    from perfdoctor.capture.writer import write
    from perfdoctor.contracts.run import Receipt, Receipts
    from perfdoctor.facts.run import dataloader as dlf

    site = {"file": "/x/train.py", "line": 12, "code": "loader = DataLoader(ds)", "function": "main"}
    rec = {"id": 0, "site": site, "kwargs": {"batch_size": 64, "num_workers": 0}, "batches": 80,
           "wait_ms_per_step": [6.0] * 40, "batch_tensors": 2, "batch_bytes": 3 << 19}
    estimate = (dlf.RECEIPT_BASE_MS + 2 * dlf.RECEIPT_PER_TENSOR_MS + 1.5 * dlf.RECEIPT_PER_MB_MS) * 2

    def receipt(tmp: Path, *receipts: Receipt):
        run = make_run(tmp, probes={"dataloaders": [rec]})
        write(run / "receipts.json", Receipts(receipts=list(receipts)))
        (dl,) = load_run(run).facts.of_kind("dataloader")
        return dl.facts["dataloader.receipt_ms"]

    timed = receipt(tmp_path / "a", Receipt(tensors=2, bytes=3 << 19, ms=4.5, batches=36, load_avg=0.5))
    assert timed.value == pytest.approx(9.0)  # 4.5 ms per batch, 2 batches per step
    assert "timed on this host after the run" in timed.detail and "load average 0.5" in timed.detail
    other_shape = receipt(tmp_path / "b", Receipt(tensors=3, bytes=3 << 19, ms=4.5))
    assert other_shape.value == pytest.approx(estimate)
    assert receipt(tmp_path / "c", Receipt(tensors=2, bytes=3 << 19, ms=-1.0)).value == pytest.approx(estimate)
    # a file that does not read (infinity is written as null) is set aside: the run's report stands
    assert receipt(tmp_path / "d", Receipt(tensors=2, bytes=3 << 19, ms=float("inf"))).value == pytest.approx(estimate)


def test_an_evaluation_loaders_moves_are_no_batch_copy(tmp_path):
    """mvts_transformer validates before training and every 2nd epoch with a pinned loader of its own: its
    moves (1 of 5 watched steps) are no training-step copy for PD017; the training loader's (4 of 5) are."""
    kwargs = {"batch_size": 64, "num_workers": 0, "pin_memory": True, "persistent_workers": False,
              "prefetch_factor": None, "multiprocessing_context": None}

    def site(line, code, fn):
        return {"file": "/x/running.py", "line": line, "code": code, "function": fn}

    probes = {
        "dataloaders": [{"id": i, "site": {"file": "/x/main.py", "line": line, "code": "DataLoader(...)", "function": "main"},
                         "kwargs": kwargs, "batches": 40, "wait_ms_per_step": [1.0] * 40, "to_cuda": False,
                         "non_blocking": None} for i, line in ((0, 207), (1, 216))],
        "host_tensors": [{"loader": 0, "moved": site(448, "targets = targets.to(self.device)", "evaluate"), "how": "to",
                          "non_blocking": False, "moves": 1, "steps": 1, "watched": 5},
                         {"loader": 1, "moved": site(401, "targets = targets.to(self.device)", "train_epoch"), "how": "to",
                          "non_blocking": False, "moves": 4, "steps": 4, "watched": 5}],
    }
    r = load_run(make_run(tmp_path, probes=probes))
    assert [s.key for s in r.facts.of_kind("batch_copy")] == ["/x/running.py:401"]


def test_a_dataset_that_moves_each_sample_marks_its_loaders_batches_on_the_device(tmp_path):
    """UrbanSound's `signal.to(self.device)` in `__getitem__`: a per-sample PD004 subject at the move, and the
    loaders over that Dataset (by its class) yield batches on the device: nothing for PD003 to pin."""
    kwargs = {"batch_size": 4, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": None, "multiprocessing_context": None}
    probes = {
        "dataloaders": [{"id": i, "site": {"file": "/x/train.py", "line": line, "code": "DataLoader(...)", "function": "main"},
                         "kwargs": kwargs, "batches": 40, "wait_ms_per_step": [1.0] * 40, "dataset": name}
                        for i, line, name in ((0, 21, "UrbanSoundDataset"), (1, 30, "TensorDataset"))],
        "host_tensors": [{"moved": {"file": "/x/urbansounddataset.py", "line": 32, "code": "signal = signal.to(self.device)",
                                    "function": "__getitem__"}, "how": "to", "moves": 12, "steps": 3, "watched": 3,
                          "nbytes": 88200, "dataset": "UrbanSoundDataset"}],
    }
    r = load_run(make_run(tmp_path, probes=probes))
    (s,) = r.facts.of_kind("cpu_to_device")
    f = {k: v.value for k, v in s.facts.items()}
    assert s.key == "/x/urbansounddataset.py:32" and f["cpu_to_device.per_sample"] is True
    assert f["cpu_to_device.moves_per_step"] == 4 and f["cpu_to_device.in_loop"] is True
    on = {d.key: d.facts.get("dataloader.samples_on_device") for d in r.facts.of_kind("dataloader")}
    assert on["/x/train.py:21"].value is True and on["/x/train.py:30"] is None
