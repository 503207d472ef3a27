"""The rules whose cost a CPU run cannot show (PD016, PD017, PD021-PD026, PD028): their static
detectors, their judgement on a CPU run (GPU-only: a finding from the source, no number) and on a
GPU machine, the layout transposes they measure in real GPU traces, and their fixes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static import analyse_files
from perfdoctor.facts.trace import add_trace_facts
from perfdoctor.model import Location
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.config import Settings
from perfdoctor.rules.engine import judge
from perfdoctor.trace.loader import load_trace
from tests.helpers import TESTS

RULES = load_rules()
NEW = ("PD016", "PD017", "PD021", "PD022", "PD023", "PD024", "PD025", "PD026", "PD028")
TRACES = TESTS / "data" / "traces"
KINETO = TRACES / "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
MI300 = TRACES / "tracelens__mi300__resnet_act_checkpoint.json.gz"
HTA = TRACES / "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""


def machine(facts: Facts, device: str = "cpu", capability: float | None = None, step_ms: float = 20.0) -> Facts:
    facts.add("device.type", device, "", "machine")
    if capability is not None:
        facts.add("device.capability", capability, "", "machine")
        facts.add("device.amp_available", capability >= 7.0, "", "machine")
    else:
        facts.add("device.amp_available", False, "", "machine", "CPU without AMX")
    facts.add("step.time_ms", step_ms, "ms", "run")
    return facts


def analyse(tmp_path: Path, body: str, facts: Facts | None = None) -> tuple[Facts, Path]:
    path = tmp_path / "train.py"
    path.write_text(HEAD + textwrap.dedent(body))
    facts = facts if facts is not None else Facts()
    analyse_files([path], facts)
    return facts, path


def findings(facts: Facts, tmp_path: Path, rule: str | None = None):
    out = judge(facts, RULES, Settings(project=tmp_path))
    return [f for f in out if rule is None or f.rule == rule]


def lines(facts: Facts, kind: str) -> dict[int, dict]:
    return {int(s.key.rsplit(":", 1)[1]): {n.split(".", 1)[1]: f.value for n, f in s.facts.items()}
            for s in facts.of_kind(kind)}


def test_every_rule_is_documented_with_real_references():
    by_id = {r.id: r for r in RULES}
    for rid in NEW:
        r = by_id[rid]
        assert r.doc.what and r.doc.why and r.doc.example and r.doc.use_instead and r.doc.fix_safety, rid
        assert r.doc.references and all(u.startswith("https://") for u in r.doc.references), rid
    assert [by_id[rid].name for rid in NEW] == [
        "cudnn-benchmark", "copy-not-async", "optimizer-not-fused", "tf32-disabled", "channels-last",
        "slow-storage", "batch-too-small", "zero-grad-no-none", "conv-bias-before-bn"]
    assert "reduce-overhead" in by_id["PD009"].doc.why and "CUDA graphs" in by_id["PD009"].doc.why
    for rid in ("PD002", "PD024"):
        assert "prefetcher" in by_id[rid].doc.why and "side" in by_id[rid].doc.why, rid


# -- PD016 cudnn-benchmark ---------------------------------------------------------------------
CONV_NET = """\
model = nn.Sequential(
    nn.Conv2d(3, 16, 3), nn.ReLU(),
    nn.Conv2d(16, 32, 3), nn.ReLU(),
).to(device)
"""


def test_pd016_static_on_a_cpu_run_with_the_fix(tmp_path):
    facts, path = analyse(tmp_path, CONV_NET, machine(Facts()))
    assert lines(facts, "conv_net") == {6: {"layer": "nn.Conv2d", "dims": 2, "convs": 2, "spatial_convs": 2}}
    assert "cudnn.benchmark" not in facts
    [f] = findings(facts, tmp_path, "PD016")
    assert f.ms_per_step is None and "GPU" in f.saving_basis  # GPU-only: no invented number
    assert f.locations[0].line == 6 and f.confidence == "medium"
    assert f.fix is not None and not f.fix.example
    assert f.fix.after.startswith("torch.backends.cudnn.benchmark = True\nmodel = nn.Sequential(")


POINTWISE = """\
ffn = nn.Sequential(
    nn.Conv1d(64, 64, kernel_size=1), nn.ReLU(),
    nn.Conv1d(64, 64, 1), nn.Dropout(0.1),
).to(device)
"""


def test_pd016_quiet_where_every_convolution_is_pointwise(tmp_path):
    """SASRec's position-wise feed-forward as two Conv1d(kernel_size=1): a 1x1 convolution is a matmul,
    with no algorithm for cuDNN's search to choose. One 3-wide kernel beside them is a conv net again."""
    facts, _ = analyse(tmp_path, POINTWISE, machine(Facts()))
    assert lines(facts, "conv_net") == {6: {"layer": "nn.Conv1d", "dims": 1, "convs": 2, "spatial_convs": 0}}
    assert findings(facts, tmp_path, "PD016") == []
    facts, _ = analyse(tmp_path, POINTWISE.replace("nn.Conv1d(64, 64, 1)", "nn.Conv1d(64, 64, (3,), padding=1)"),
                       machine(Facts()))
    assert len(findings(facts, tmp_path, "PD016")) == 1
    # the run's module tree decides where it read one: its count of convolutions with a larger kernel
    facts, _ = analyse(tmp_path, CONV_NET, machine(Facts()))
    (net,) = facts.of_kind("conv_net")
    net.add("spatial_convs", 0, "count", "run")
    assert findings(facts, tmp_path, "PD016") == []


def test_pd016_is_one_finding_for_the_process(tmp_path):
    """srgan: a generator, a discriminator and a VGG perceptual loss were three PD016 findings for the
    one `cudnn.benchmark = True` that fixes all three: one finding, every model's line listed."""
    facts, _ = analyse(tmp_path, CONV_NET, machine(Facts()))
    for line, convs in ((40, 10), (45, 13)):  # the run's module trees: two more models, in another file
        s = facts.subject("conv_net", f"{tmp_path / 'model.py'}:{line}")
        s.add("layer", "Conv2d", "", "run")
        s.add("dims", 2, "count", "run")
        s.add("convs", convs, "count", "run")
        s.locations.append(Location(str(tmp_path / "model.py"), line, "nn.Conv2d(...)"))
    [f] = findings(facts, tmp_path, "PD016")
    assert [loc.line for loc in f.locations] == [6, 40, 45] and "(2 convolution layers)" in f.title


@pytest.mark.parametrize("extra", [
    "torch.backends.cudnn.benchmark = True\n",
    "torch.backends.cudnn.benchmark = False\n",  # the user's choice
    "torch.backends.cudnn.benchmark = cfg.CUDNN_BENCHMARK\n",  # a setting: the user's choice too
    "torch.backends.cudnn.benchmark = not args.deterministic\n",
    "torch.backends.cudnn.benchmark = torch.cuda.is_available()\n",
    "import lightning as L\ntrainer = L.Trainer(benchmark=True)\n",  # Lightning sets it for the run
    "import pytorch_lightning as pl\ntrainer = pl.Trainer(deterministic=True)\n",
    "torch.backends.cudnn.deterministic = True\n",
    "torch.use_deterministic_algorithms(True)\n",
    "loader = DataLoader(ds, batch_size=8, collate_fn=pad_batch)\n",  # shapes may change every step
])
def test_pd016_quiet_where_autotuning_would_not_help(tmp_path, extra):
    facts, _ = analyse(tmp_path, extra + CONV_NET, machine(Facts()))
    assert findings(facts, tmp_path, "PD016") == []


def _conv_trace(path: Path, widths: list[int]) -> Path:
    """A CPU trace of a 1-D convolutional model as torch.profiler writes it: one profiled step per
    width, each running two `aten::convolution` ops on inputs of that width (a batch padded to its
    longest word)."""
    import gzip
    import json

    ev, ts = [], 0.0
    for n, w in enumerate(widths):
        t0 = ts
        for c in (30, 50):
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "pid": 1, "tid": 1, "ts": ts,
                       "dur": 100, "args": {"Input Dims": [[10, c, w], [50, c, 3], [50]],
                                            "Input type": ["float", "float", "float"]}})
            ts += 200
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": ts - t0})
        ts += 10
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    return path


@pytest.mark.parametrize("widths, reuse, fires", [
    ([12, 9, 15, 11, 14], 0.0, False),  # every batch padded to its own longest word: a new shape each step
    ([12, 12, 12, 12, 12], 1.0, True),  # fixed shapes: the search runs once
    ([12, 12, 12, 12, 7], 0.75, True),  # an epoch's last, partial batch
])
def test_pd016_judges_the_shapes_the_steps_fed_the_convolutions(tmp_path, widths, reuse, fires):
    """ncrfpp-lstmcrf: a character CNN over each batch's longest word, batches built without a
    DataLoader (no collate_fn to go by): the profiled steps' convolution input shapes decide."""
    facts, _ = analyse(tmp_path, CONV_NET, machine(Facts()))
    add_trace_facts(load_trace(_conv_trace(tmp_path / "trace.json.gz", widths)), facts)
    assert facts.value("conv.shape_reuse") == reuse
    assert bool(findings(facts, tmp_path, "PD016")) is fires


def test_pd016_benchmark_set_in_another_file_counts(tmp_path):
    other = tmp_path / "setup.py"
    other.write_text("from torch.backends import cudnn\ncudnn.benchmark = True\n")
    facts, path = analyse(tmp_path, CONV_NET, machine(Facts()))
    analyse_files([other], facts)
    assert facts.value("cudnn.benchmark") is True
    assert findings(facts, tmp_path, "PD016") == []


def test_pd016_quiet_without_cuda(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch.nn as nn\nmodel = nn.Conv2d(3, 8, 3)\n")
    facts = machine(Facts())
    analyse_files([path], facts)
    assert findings(facts, tmp_path, "PD016") == []


# -- PD017 copy-not-async ----------------------------------------------------------------------
def test_pd017_pinned_batch_moved_synchronously(tmp_path):
    facts, path = analyse(tmp_path, """\
        loader = DataLoader(ds, batch_size=64, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            z = y.to(device, non_blocking=True)
        other = DataLoader(ds, batch_size=64)
        for a in other:
            a = a.to(device)
        """, machine(Facts()))
    assert lines(facts, "batch_copy") == {7: {"pinned": True, "non_blocking": False},
                                          8: {"pinned": True, "non_blocking": True}}
    [f] = findings(facts, tmp_path, "PD017")
    assert f.locations[0].line == 7 and f.ms_per_step is None
    assert f.fix.after.strip() == "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"


def test_pd017_on_a_gpu_saves_the_syncs_after_pinned_copies(tmp_path):
    # an H200 trace of the pd017 sample: each pinned copy without non_blocking is followed by a
    # cudaStreamSynchronize in the same copy_ (22 us a step on that launch-bound GPU)
    facts = machine(Facts(), "cuda", 9.0)
    add_trace_facts(load_trace(TRACES / "h200__pd017_copy_not_async.pt.trace.json.gz"), facts)
    assert facts.value("copies.h2d_pinned_sync_ms") == pytest.approx(0.022, abs=0.002)
    facts, path = analyse(tmp_path, """\
        loader = DataLoader(ds, batch_size=64, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
        """, facts)
    [f] = findings(facts, tmp_path, "PD017")
    assert f.ms_per_step == pytest.approx(0.022, abs=0.002) and f.severity == "low"  # minor on that GPU
    clean = machine(Facts(), "cuda", 9.0)  # its batches are copied with non_blocking=True: no sync after
    add_trace_facts(load_trace(TRACES / "h200__clean.pt.trace.json.gz"), clean)
    assert clean.value("copies.h2d_pinned_sync_ms") is None


def test_pd017_quiet_on_an_evaluation_loop_in_a_file_with_no_training_loop(tmp_path):
    # deep-text-recognition-benchmark: test.py's validation() moves the validation loader's pinned batches;
    # its own file calls it only from its test entry points, train.py every N steps: no training step's copy
    evaluation = """\
        def validation(model, loader):
            for x, y in loader:
                x = x.to(device)
                model(x)

        def test(model, ds):
            validation(model, DataLoader(ds, batch_size=64, pin_memory=True))

        if __name__ == "__main__":
            test(nn.Linear(2, 2), ds)

        loader = DataLoader(ds, batch_size=64, pin_memory=True)
        for a, b in loader:
            a = a.to(device)
        """
    training = """\
        from evaluation import validation
        loader = DataLoader(ds, batch_size=64, pin_memory=True)
        for i, (x, y) in enumerate(loader):
            loss = model(x.to(device, non_blocking=True)).sum()
            loss.backward()
            opt.step()
            if i % 2000 == 0:
                validation(model, loader)
        """
    evalfile, trainfile = tmp_path / "evaluation.py", tmp_path / "train.py"
    evalfile.write_text(HEAD + textwrap.dedent(evaluation))
    trainfile.write_text(HEAD + textwrap.dedent(training))
    facts = machine(Facts())
    analyse_files([trainfile, evalfile], facts)
    # validation()'s move (evaluation.py:7) and the module-level loop's (:18) are left out; the training's stays
    keys = {(Path(s.key.rsplit(":", 1)[0]).name, s.key.rsplit(":", 1)[1]) for s in facts.of_kind("batch_copy")}
    assert keys == {("train.py", "8")}
    alone = machine(Facts())  # no file of the project trains: the source cannot tell, the moves stay
    analyse_files([evalfile], alone)
    assert {s.key.rsplit(":", 1)[1] for s in alone.of_kind("batch_copy")} == {"7", "18"}


def test_pd017_quiet_on_the_moves_of_a_loader_the_run_saw_reach_few_steps(tmp_path):
    # another file's validation() moves a pinned loader's batches; the training loop calls it every 2000
    # steps (the source cannot tell how often); the run saw them moved on 1 of 4 watched steps
    # (`dataloader.trains` False, as facts/run/host_tensors.py sets it): an evaluation loader, no step's copy
    evalfile, trainfile = tmp_path / "evaluation.py", tmp_path / "train.py"
    evalfile.write_text(HEAD + textwrap.dedent("""\
        def validation(model, loader):
            for a, b in loader:
                a = a.to(device)
        """))
    trainfile.write_text(HEAD + textwrap.dedent("""\
        from evaluation import validation
        extra = DataLoader(ds, batch_size=64, pin_memory=True)
        loader = DataLoader(ds, batch_size=64, pin_memory=True)
        for i, (x, y) in enumerate(loader):
            x = x.to(device)
            loss = model(x).sum()
            loss.backward()
            opt.step()
            if i % 2000 == 0:
                validation(model, extra)
        """))
    val_key = f"{trainfile.resolve()}:6"
    draws = {val_key: [(str(evalfile.resolve()), 6)]}

    def copies(run_trains=None):
        facts = machine(Facts())
        if run_trains is not None:
            facts.subject("dataloader", val_key).add("trains", run_trains, "", "run")
        analyse_files([trainfile.resolve(), evalfile.resolve()], facts, loader_draws=draws)
        return {(Path(s.key.rsplit(":", 1)[0]).name, int(s.key.rsplit(":", 1)[1])) for s in facts.of_kind("batch_copy")}

    assert copies() == {("train.py", 9), ("evaluation.py", 7)}
    assert copies(run_trains=False) == {("train.py", 9)}


def test_pd017_quiet_on_an_evaluation_loader_in_a_file_of_no_training(tmp_path):
    # a file with no training loop (the source cannot place it) builds and iterates an evaluation loader:
    # the loader's own read says its batches do not reach a training step (`dataloader.trains` False)
    facts, path = analyse(tmp_path, """\
        def evaluate(model, ds):
            loader = DataLoader(ds, batch_size=64, pin_memory=True)
            for a, b in loader:
                a = a.to(device)
        """, machine(Facts()))
    assert lines(facts, "dataloader")[6]["trains"] is False
    assert lines(facts, "batch_copy") == {}


# -- PD021 optimizer-not-fused -----------------------------------------------------------------
@pytest.mark.parametrize("cls,after", [
    ("AdamW", "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=None, fused=True)"),
    ("RMSprop", "opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, foreach=True)"),
])
def test_pd021_per_tensor_optimizer_and_fix(tmp_path, cls, after):
    facts, _ = analyse(tmp_path, f"opt = torch.optim.{cls}(model.parameters(), lr=1e-3, foreach=False)\n",
                       machine(Facts()))
    [f] = findings(facts, tmp_path, "PD021")
    assert f.ms_per_step is None and f.fix.after.strip() == after


def test_pd021_on_a_gpu_saves_the_per_tensor_updates_repeats(tmp_path):
    # The pd021 sample's source and its H200 trace: AdamW per tensor, six tensors, 60 ops of 8 operators
    # a step. `perfdoctor verify` on the H200 measured 0.82 ms a step (90 % interval 0.20-1.46) of 3.5.
    src = tmp_path / "pd021_optimizer_not_fused.py"
    src.write_text((TESTS.parent / "sample_scripts" / src.name).read_text())
    facts = machine(Facts(), "cuda", 9.0)
    analyse_files([src], facts)
    add_trace_facts(load_trace(TRACES / "h200__pd021_optimizer_not_fused.pt.trace.json.gz"), facts)
    share = facts.value("optimizer_loop.saving_share")
    assert 0.15 < share < 0.3
    [opt] = facts.of_kind("optimizer")
    assert opt.facts["optimizer.loop_saving_share"].value == pytest.approx(share, abs=1e-4)
    [f] = findings(facts, tmp_path, "PD021")
    assert f.severity == "medium" and f.ms_per_step == pytest.approx(share * 20.0, rel=1e-3)
    assert "repeat an operator" in f.saving_basis


def test_pd021_the_share_is_split_over_optimizers_of_one_class_and_absent_on_multi_tensor_steps(tmp_path):
    src = tmp_path / "gan.py"
    src.write_text(HEAD + "opt_g = torch.optim.AdamW(g.parameters(), foreach=False)\n"
                          "opt_d = torch.optim.AdamW(d.parameters(), foreach=False)\n"
                          "opt_e = torch.optim.AdamW(e.parameters())\n")
    facts = machine(Facts(), "cuda", 9.0)
    analyse_files([src], facts)
    add_trace_facts(load_trace(TRACES / "h200__pd021_optimizer_not_fused.pt.trace.json.gz"), facts)
    shares = sorted(s.facts.get("optimizer.loop_saving_share") is not None and s.facts["optimizer.loop_saving_share"].value
                    for s in facts.of_kind("optimizer"))
    half = round(facts.value("optimizer_loop.saving_share") / 2, 4)
    assert shares == [False, half, half]
    clean = machine(Facts(), "cuda", 9.0)
    add_trace_facts(load_trace(TRACES / "h200__clean.pt.trace.json.gz"), clean)  # AdamW's foreach default
    assert clean.value("optimizer_loop.saving_share") is None


@pytest.mark.parametrize("call", [
    "torch.optim.AdamW(model.parameters(), lr=1e-3)",  # torch's default on CUDA: foreach
    "torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)",
    "torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)",
])
def test_pd021_quiet_on_multi_tensor_optimizers(tmp_path, call):
    facts, _ = analyse(tmp_path, f"opt = {call}\n", machine(Facts()))
    assert findings(facts, tmp_path, "PD021") == []


@pytest.mark.slow
def test_pd021_a_hand_written_per_tensor_optimizer_on_a_cpu_run_of_a_cuda_script(tmp_path):
    """bertcls-thucnews: BertAdam, a class of the repository's own, loops over BERT's tensors; the CPU
    run's trace shows its step repeating its operators once per tensor. PD021 flags its construction,
    judged for the GPU the script targets (its repeats' launches as a share of the estimated GPU step),
    and says to use torch.optim's foreach or fused optimizer instead: the class takes no foreach."""
    torch = pytest.importorskip("torch")
    from perfdoctor.facts.trace import add_trace_facts as add
    from tests.facts.test_trace_facts import _loop_adam, _profiled_steps

    facts, _ = analyse(tmp_path, """\
        from optim import LoopAdam
        model = nn.Linear(8, 8).to(device)
        opt = LoopAdam(model.parameters(), lr=1e-3)
        total = sum(p.numel() for p in model.parameters())
        """, machine(Facts()))
    facts.add("script.targets_cuda", True, "bool", "static")
    facts.add("compute.flops_per_step", 1e6, "number", "run")
    opt = [s for s in facts.of_kind("optimizer")]
    assert [s.facts["optimizer.name"].value for s in opt] == ["LoopAdam"]  # not `sum(...)`
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])
    x = torch.randn(4, 8)
    loop_adam = _loop_adam()(model.parameters())

    def step():
        loss = model(x).pow(2).mean()
        loop_adam.zero_grad()
        loss.backward()
        loop_adam.step()
    add(_profiled_steps(tmp_path, step).trace, facts)
    [f] = findings(facts, tmp_path, "PD021")
    assert f.title.startswith("LoopAdam.step loops over the parameters: 84 ops a step for about 12 tensors")
    assert f.ms_per_step is None and f.severity == "medium"  # the loop is most of this tiny GPU step's launches
    assert "of the step on the GPU the script targets" in f.saving_basis
    assert f.fix is not None and not f.fix.after and "torch.optim.AdamW(..., fused=True)" in f.fix.note
    assert f.locations[0].line == 7


# -- PD022 tf32-disabled -----------------------------------------------------------------------
TF32_OFF = """\
torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
torch.backends.cudnn.allow_tf32 = True
torch.set_float32_matmul_precision("high")
"""


def test_pd022_found_in_the_source(tmp_path):
    facts, _ = analyse(tmp_path, TF32_OFF, machine(Facts()))
    assert sorted(lines(facts, "tf32")) == [5, 6]
    found = findings(facts, tmp_path, "PD022")
    assert sorted(f.locations[0].line for f in found) == [5, 6]
    assert all(f.ms_per_step is None and "8.0" in f.saving_basis for f in found)


@pytest.mark.parametrize("stmt,after", [
    ("torch.backends.cuda.matmul.allow_tf32 = False  # exact", "torch.backends.cuda.matmul.allow_tf32 = True  # exact"),
    ("torch.backends.cudnn.allow_tf32 = False", "torch.backends.cudnn.allow_tf32 = True"),
    ("torch.set_float32_matmul_precision('highest')", "torch.set_float32_matmul_precision('high')"),
    ("x = 1; torch.backends.cudnn.allow_tf32 = False", "x = 1; torch.backends.cudnn.allow_tf32 = True"),
])
def test_pd022_fix_turns_the_users_statement_on(tmp_path, stmt, after):
    # a fix against the user's own line (verify applies it), not an example written in the rule
    facts, path = analyse(tmp_path, stmt + "\n", machine(Facts()))
    [f] = findings(facts, tmp_path, "PD022")
    assert not f.fix.example and f.fix.before == stmt and f.fix.after == after
    from perfdoctor.rules.fixes import apply_fix
    assert after in apply_fix(path.read_text(), f.fix)


def test_pd022_fix_in_words_where_the_setting_is_not_a_literal(tmp_path):
    facts, _ = analyse(tmp_path, "torch.backends.cuda.matmul.allow_tf32 = args.tf32 and False\n", machine(Facts()))
    for f in findings(facts, tmp_path, "PD022"):
        assert f.fix is None or not f.fix.before


@pytest.mark.parametrize("body,matmul,conv", [
    (TF32_OFF, True, True),  # a setting per path: the one that lets TF32 run wins
    ("torch.backends.cuda.matmul.allow_tf32 = False\ntorch.backends.cudnn.allow_tf32 = False\n", False, False),
    ('torch.set_float32_matmul_precision("medium")\n', True, None),
    ("x = 1\n", None, None),  # torch's defaults: matmuls fp32, convolutions TF32
])
def test_the_tf32_settings_the_gpu_estimate_reads(tmp_path, body, matmul, conv):
    facts, _ = analyse(tmp_path, body)
    assert facts.value("script.tf32_matmul") is matmul and facts.value("script.tf32_conv") is conv


@pytest.mark.parametrize("device,capability,fires", [("cuda", 8.0, True), ("cuda", 9.0, True),
                                                      ("cuda", 7.0, False), ("rocm", 9.4, False)])
def test_pd022_only_on_ampere_or_newer(tmp_path, device, capability, fires):
    facts, _ = analyse(tmp_path, TF32_OFF, machine(Facts(), device, capability))
    assert bool(findings(facts, tmp_path, "PD022")) is fires


def test_pd022_quiet_under_autocast(tmp_path):
    facts, _ = analyse(tmp_path, TF32_OFF + "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model(x)\n",
                       machine(Facts()))
    assert findings(facts, tmp_path, "PD022") == []


# -- PD023 channels-last -----------------------------------------------------------------------
AUTOCAST = "with torch.autocast(device_type='cuda', dtype=torch.float16):\n    out = model(x)\n"


def test_pd023_static_conv_net_under_autocast(tmp_path):
    facts, _ = analyse(tmp_path, CONV_NET + AUTOCAST, machine(Facts()))
    [f] = findings(facts, tmp_path, "PD023")
    assert f.locations[0].line == 6 and f.ms_per_step is None


@pytest.mark.parametrize(("rule", "body", "conv_share", "severity"), [
    # LSTNet: one convolution before a GRU, 5 % of the counted FLOPs; the autotuner's "few" per cent of it
    # is 0.25 % of the step
    ("PD016", CONV_NET, 0.05, "low"),
    ("PD016", CONV_NET, 0.90, "medium"),  # an MNIST conv net: the convolutions are the work
    # a ViT's patch embedding under autocast: NHWC's third of 2 % of the work
    ("PD023", CONV_NET + AUTOCAST, 0.02, "low"),
    ("PD023", CONV_NET + AUTOCAST, 0.40, "medium"),
    ("PD016", CONV_NET, None, "medium"),  # no FLOPs counted: the rule's own severity
])
def test_conv_rules_severity_follows_the_convolutions_share_of_the_work(tmp_path, rule, body, conv_share, severity):
    facts, _ = analyse(tmp_path, body, machine(Facts()))
    if conv_share is not None:
        facts.add("compute.flops_per_step", 1e9, "number", "run")
        facts.add("compute.conv_flops_per_step", conv_share * 1e9, "number", "run")
    [f] = findings(facts, tmp_path, rule)
    assert f.ms_per_step is None and f.severity == severity
    if conv_share is not None:
        assert f"an estimated {conv_share:.1%} of the step" in f.saving_basis
        assert ("(minor: under 1%)" in f.saving_basis) == (severity == "low")
        assert "compute.conv_flops_per_step" in {e.name for e in f.evidence}
    if conv_share is not None:  # convolutions the count missed: the share is not known
        facts.add("compute.uncounted_convs_per_step", 3, "count", "trace")
        [f] = findings(facts, tmp_path, rule)
        assert f.severity == "medium" and "estimated" not in f.saving_basis


@pytest.mark.parametrize(("rule", "body", "step_share", "severity"), [
    # pytorch/examples' MNIST CNN: its convolutions are 90 % of the FLOPs but 1 % of the step estimated for
    # the reference GPU, which launching its ops bounds: a faster algorithm shortens nothing the step shows
    ("PD016", CONV_NET, 0.01, "low"),
    ("PD016", CONV_NET, 0.46, "medium"),  # ResNet-50 at batch 128: the kernels are the step
    ("PD023", CONV_NET + AUTOCAST, 0.02, "low"),
    ("PD023", CONV_NET + AUTOCAST, 0.46, "medium"),
])
def test_conv_rules_severity_follows_the_convolutions_share_of_the_gpu_step(tmp_path, rule, body, step_share,
                                                                           severity):
    facts, _ = analyse(tmp_path, body, machine(Facts()))
    facts.add("compute.flops_per_step", 1e9, "number", "run")
    facts.add("compute.conv_flops_per_step", 0.9e9, "number", "run")
    facts.add("target_gpu.conv_share", step_share, "ratio", "trace")
    [f] = findings(facts, tmp_path, rule)
    assert f.severity == severity and f"an estimated {step_share:.1%} of the step" in f.saving_basis
    assert "target_gpu.conv_share" in {e.name for e in f.evidence}


@pytest.mark.parametrize("body", [
    CONV_NET,  # no autocast: fp32 convolutions do not use the NHWC tensor-core kernels
    CONV_NET + AUTOCAST + "model = model.to(memory_format=torch.channels_last)\n",
    "model = nn.Conv1d(3, 8, 3).to(device)\n" + AUTOCAST,  # channels_last is for 4-D tensors
    # one convolution: its input and output are converted either way, nothing stays NHWC between two
    "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10)).to(device)\n" + AUTOCAST,
])
def test_pd023_quiet(tmp_path, body):
    facts, _ = analyse(tmp_path, body, machine(Facts()))
    assert findings(facts, tmp_path, "PD023") == []


# sthalles/SimCLR: `with autocast(enabled=self.args.fp16_precision)`, off by default: the convolutions run
# in fp32 unless the user turns AMP on, and a run that saw the forward without autocast says so.
SWITCHED = ("import argparse\nargs = argparse.ArgumentParser().parse_args()\n"
            "with torch.autocast(device_type='cuda', dtype=torch.float16, enabled=args.fp16):\n"
            "    out = model(x)\n")


def test_pd023_quiet_when_autocast_is_a_user_switch_left_off(tmp_path):
    facts, _ = analyse(tmp_path, CONV_NET + SWITCHED, machine(Facts()))
    assert findings(facts, tmp_path, "PD023") == []
    facts.add("autocast.enabled", False, "", "run")
    assert findings(facts, tmp_path, "PD023") == []


def test_pd023_when_the_run_saw_the_switched_autocast_on(tmp_path):
    facts, _ = analyse(tmp_path, CONV_NET + SWITCHED, machine(Facts()))
    facts.add("autocast.enabled", True, "", "run")
    [f] = findings(facts, tmp_path, "PD023")
    assert f.locations[0].line == 6


def test_pd023_quiet_on_a_gpu_without_tensor_cores(tmp_path):
    facts, _ = analyse(tmp_path, CONV_NET + AUTOCAST, machine(Facts(), "cuda", 6.1))
    assert findings(facts, tmp_path, "PD023") == []


def trace_facts(path: Path) -> Facts:
    facts = Facts()
    add_trace_facts(load_trace(path), facts)
    return facts


def test_pd023_measured_in_the_mi300_trace(tmp_path):
    """MI300X ResNet under bf16 autocast, NCHW inputs: MIOpen's NHWC igemm kernels are wrapped in
    batched_transpose kernels, which the trace times."""
    facts = trace_facts(MI300)
    assert facts.value("layout.transposes_per_step") > 100
    share = facts.value("layout.transpose_ms") / facts.value("step.time_ms")
    assert 0.03 < share < 0.2
    [f] = findings(facts, tmp_path, "PD023")
    assert f.ms_per_step == pytest.approx(facts.value("layout.transpose_ms"))
    assert f.confidence == "high" and "trace" in f.saving_basis and not f.locations


@pytest.mark.parametrize("path", [KINETO, HTA])
def test_pd023_quiet_on_fp32_v100_traces(tmp_path, path):
    facts = trace_facts(path)
    assert facts.value("layout.transpose_ms") < 0.03 * facts.value("step.time_ms")
    assert findings(facts, tmp_path, "PD023") == []


@pytest.mark.slow
def test_no_static_only_rule_fires_on_the_real_gpu_traces(tmp_path):
    """Without the source, the trace-less branches stay quiet (PD016, PD017, PD021, PD022, PD026,
    PD028 have no trace evidence: no real trace here shows theirs)."""
    for path in (KINETO, MI300, HTA):
        got = {f.rule for f in findings(trace_facts(path), tmp_path)} & set(NEW)
        assert got <= {"PD023"}, path.name


# -- PD024 slow-storage ------------------------------------------------------------------------
def worker_run(tmp_path: Path, hot_line: str, step_ms: float = 20.0, data_ms: float = 8.0) -> tuple[Facts, Path]:
    path = tmp_path / "data.py"
    path.write_text("import numpy as np\nfrom PIL import Image\n\n"
                    "class Tiles:\n    def __getitem__(self, i):\n        " + hot_line + "\n")
    facts = machine(Facts(), step_ms=step_ms)
    facts.add("step.data_ms", data_ms, "ms", "run")
    facts.add("cpu.count", 2, "count", "machine")
    s = facts.subject("worker_hotspot", f"{path}:6")
    for name, value in (("function", "Tiles.__getitem__"), ("ms_per_step", 30.0), ("share", 0.9),
                        ("workers", 2), ("busy", 0.95)):
        s.add(name, value, "", "run")
    s.locations.append(Location(str(path), 6, hot_line, "__getitem__"))
    analyse_files([path], facts)
    return facts, path


@pytest.mark.parametrize("hot_line,call", [
    ("return [np.load(p) for p in self.paths[i]]", "np.load(p)"),
    ("return Image.open(self.paths[i]).convert('RGB')", "Image.open(self.paths[i])"),
    ("return open(self.paths[i], 'rb').read()", "open(self.paths[i], 'rb').read()"),
])
def test_pd024_worker_hot_line_reads_files(tmp_path, hot_line, call):
    facts, _ = worker_run(tmp_path, hot_line)
    [s] = facts.of_kind("worker_hotspot")
    assert s.facts["worker_hotspot.io_call"].value == call
    got = findings(facts, tmp_path)
    assert {f.rule for f in got} & {"PD014", "PD024"} == {"PD024"}  # PD014 gives way
    f = next(f for f in got if f.rule == "PD024")
    assert f.ms_per_step == pytest.approx(min(8.0, 30.0 / 2) * 0.5)


def test_pd024_judges_the_wait_against_the_step_less_its_wait_for_a_cpu(tmp_path):
    # beside load (the pd024 sample at load average 6: a 180 ms step of which 100 ms waiting for a CPU):
    # 15 ms of data wait is 8 % of the wall step but 20 % of the step the script itself takes
    facts, _ = worker_run(tmp_path, "return Image.open(self.paths[i]).convert('RGB')", step_ms=180.0, data_ms=15.0)
    assert "PD024" not in {f.rule for f in findings(facts, tmp_path)}  # no contention measured: the wall step
    facts.add("step.work_ms", 75.0, "ms", "run")
    assert "PD024" in {f.rule for f in findings(facts, tmp_path)}


def test_pd024_quiet_when_the_hot_line_computes(tmp_path):
    facts, _ = worker_run(tmp_path, "return sum(math.sin(k) for k in range(80000))")
    got = {f.rule for f in findings(facts, tmp_path)}
    assert "PD024" not in got and "PD014" in got


# -- PD025 batch-too-small ---------------------------------------------------------------------
SMALL_BATCH = """\
loader = DataLoader(ds, batch_size=4, pin_memory=True)
for x, y in loader:
    x = x.to(device, non_blocking=True)
"""


def with_model(facts: Facts, params: int) -> Facts:
    m = facts.subject("model", "train.py:40")
    m.add("params", params, "count", "run")
    return facts


def test_pd025_cpu_run_small_batch_through_a_small_model(tmp_path):
    facts, _ = analyse(tmp_path, SMALL_BATCH, with_model(machine(Facts()), 9610))
    [s] = facts.of_kind("dataloader")
    assert s.facts["dataloader.model_params"].value == 9610 and s.facts["dataloader.model_params"].source == "run"
    [f] = findings(facts, tmp_path, "PD025")
    assert f.ms_per_step is None and f.locations[0].line == 5
    assert "9610 parameters" in f.title and "batch_size=16" in f.fix.after


def test_pd025_not_where_the_script_names_no_cuda_device(tmp_path):
    """torch-rechub's criteo example moves its batches with `.to(self.device)`, whose `--device` defaults
    to 'cpu', and no file names a CUDA device: a CPU-only script by default, judged by no GPU-only rule."""
    path = tmp_path / "train.py"
    path.write_text(HEAD.replace('"cuda" if torch.cuda.is_available() else "cpu"', "args.device") + SMALL_BATCH)
    facts = with_model(machine(Facts()), 9610)
    analyse_files([path], facts)
    assert facts.value("script.targets_cuda") is False
    assert [s.facts["dataloader.feeds_cuda"].value for s in facts.of_kind("dataloader")] == [True]
    assert findings(facts, tmp_path, "PD025") == []


@pytest.mark.parametrize("params", [None, 350_000_000])  # no run, or a large model (not launch-bound)
def test_pd025_cpu_run_quiet_without_a_small_model(tmp_path, params):
    facts = machine(Facts())
    if params:
        with_model(facts, params)
    facts, _ = analyse(tmp_path, SMALL_BATCH, facts)
    assert findings(facts, tmp_path, "PD025") == []


@pytest.mark.parametrize("slowest_ms,fires", [(0.4, True), (18.1, False)])
def test_pd025_cpu_run_a_few_large_samples_are_no_small_batch(tmp_path, slowest_ms, fires):
    """nst-johnson trains a 7.6 M-parameter style-transfer net four 256x256 images at a time, with VGG's
    loss network: 350 GFLOP a step, 18 ms even at the reference GPU's fp32 rate, against 7.3 ms of host
    time launching its 317 ops. Not launch-bound, whatever the batch's count of samples; a LeNet at the
    same batch (0.4 ms of math) is."""
    facts = with_model(machine(Facts()), 7_600_000)
    facts.add("target_gpu.slowest_math_ms", slowest_ms, "ms", "trace")
    facts.add("target_gpu.launch_ms", 7.3, "ms", "trace")
    facts.add("target_gpu.ops_per_step", 317, "count", "trace")
    facts, _ = analyse(tmp_path, SMALL_BATCH, facts)
    got = findings(facts, tmp_path, "PD025")
    assert bool(got) is fires
    if fires:  # the estimate it was judged by is said
        assert f"{slowest_ms} ms even at its fp32 rate, against 7.3 ms" in got[0].saving_basis


DEFAULT_BATCH = """\
import argparse
parser = argparse.ArgumentParser()
parser.add_argument('--batch-size', type=int, default=BATCH)
args = parser.parse_args()
loader = DataLoader(ds, batch_size=args.batch_size, pin_memory=True)
for x, y in loader:
    x = x.to(device, non_blocking=True)
"""


@pytest.mark.parametrize("default,fires", [(128, False), (4, True)])
def test_pd025_cpu_run_is_judged_at_the_scripts_default_batch(tmp_path, default, fires):
    """ritheshkumar95/pytorch-vqvae run with --batch-size 8 to keep a CPU run short: its GPU trains at
    the option's default of 128, not launch-bound; a script whose own default is tiny still is."""
    facts = with_model(machine(Facts()), 9610)
    s = facts.subject("dataloader", f"{tmp_path / 'train.py'}:9")
    s.add("batch_size", 8, "count", "run")
    facts, _ = analyse(tmp_path, DEFAULT_BATCH.replace("BATCH", str(default)), facts)
    [s] = facts.of_kind("dataloader")
    assert s.facts["dataloader.default_batch_size"].value == default
    got = findings(facts, tmp_path, "PD025")
    assert bool(got) is fires
    if fires:  # the title says the script's batch it judged, and the run's beside it
        assert got[0].title.startswith(f"The batch ({default} samples by the script default; 8 in this run,")


@pytest.mark.parametrize("peak_gb,fires", [(4, True), (20, False)])
def test_pd025_gpu_run_needs_memory_headroom(tmp_path, peak_gb, fires):
    facts = machine(Facts(), "cuda", 8.0)
    facts.add("gpu.idle_host_wait_ms", 10.0, "ms", "trace")
    facts.add("memory.peak_bytes", peak_gb * 2**30, "bytes", "run")
    facts.add("memory.total_bytes", 40 * 2**30, "bytes", "machine")
    facts, _ = analyse(tmp_path, SMALL_BATCH, facts)
    got = findings(facts, tmp_path, "PD025")
    assert bool(got) is fires
    if fires:
        assert got[0].ms_per_step == pytest.approx(5.0) and "batch_size=8" in got[0].fix.after


# -- PD026 zero-grad-no-none -------------------------------------------------------------------
def test_pd026_zero_grad_without_none_and_fix(tmp_path):
    facts, _ = analyse(tmp_path, "optimizer.zero_grad(set_to_none=False)\noptimizer.zero_grad(set_to_none=True)\n",
                       machine(Facts()))
    assert lines(facts, "zero_grad") == {5: {"set_to_none": False, "grads_read": False},
                                         6: {"set_to_none": True, "grads_read": False}}
    [f] = findings(facts, tmp_path, "PD026")
    assert f.fix.after.strip() == "optimizer.zero_grad(set_to_none=True)"


def test_pd026_quiet_when_the_file_reads_grads(tmp_path):
    facts, _ = analyse(tmp_path, "optimizer.zero_grad(set_to_none=False)\nnorm = model.weight.grad.norm()\n",
                       machine(Facts()))
    assert findings(facts, tmp_path, "PD026") == []


# -- PD028 conv-bias-before-bn -----------------------------------------------------------------
def test_pd028_sequential_and_forward(tmp_path):
    facts, _ = analyse(tmp_path, """\
        seq = nn.Sequential(
            nn.Conv2d(3, 16, 3),
            nn.BatchNorm2d(16),
            nn.Conv2d(16, 16, 3, bias=False), nn.BatchNorm2d(16),
            nn.Conv2d(16, 16, 3), nn.ReLU(), nn.BatchNorm2d(16),
            nn.Conv2d(16, 16, 3), nn.BatchNorm2d(16, affine=False),
        )

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv1d(8, 8, 3, bias=True)
                self.bn = nn.BatchNorm1d(8)
                self.other = nn.Conv1d(8, 8, 3)

            def forward(self, x):
                y = self.other(x)
                return self.bn(self.conv(x)) + y
        """, machine(Facts()))
    assert lines(facts, "conv_bias") == {
        6: {"layer": "Conv2d", "norm": "BatchNorm2d", "pattern": "sequential"},
        16: {"layer": "Conv1d", "norm": "BatchNorm1d", "pattern": "forward"}}
    got = {f.locations[0].line: f for f in findings(facts, tmp_path, "PD028")}
    assert sorted(got) == [6, 16]
    after = got[6].fix.after  # the whole nn.Sequential statement, with only the flagged layer changed
    assert "    nn.Conv2d(3, 16, 3, bias=False),\n" in after
    assert after.replace("nn.Conv2d(3, 16, 3, bias=False)", "nn.Conv2d(3, 16, 3)") == got[6].fix.before
    assert got[16].fix.after.strip() == "self.conv = nn.Conv1d(8, 8, 3, bias=False)"


MODELS = """\
    class Stem(nn.Module):  # a base class: the run records it through Net's __mro__
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))

    class Net(Stem):
        def forward(self, x):
            return self.stem(x)

    class Unused(nn.Module):  # defined (or imported from a models file) but never called
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            return self.bn(self.conv(x))

    def factory():
        class Local(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8))
        return Local()

    head = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))  # in no class: always judged
    """


@pytest.mark.parametrize("ran, lines_found, convs", [
    (None, [8, 17, 27, 30], 4),  # no run says which classes ran: every class is judged
    ({"Stem", "Net"}, [8, 30], 2),
    ({"Stem", "Net", "factory.<locals>.Local"}, [8, 27, 30], 3),
    (set(), [30], 1),  # the run's models hold none of this file's classes
])
def test_pd028_and_conv_net_judge_only_the_classes_the_run_called(tmp_path, ran, lines_found, convs):
    path = tmp_path / "train.py"
    path.write_text(HEAD + textwrap.dedent(MODELS))
    facts = machine(Facts())
    classes = None if ran is None else {f"{path.resolve()}:{q}" for q in ran} | {"/elsewhere/models.py:Net"}
    analyse_files([path], facts, classes)
    assert sorted(lines(facts, "conv_bias")) == lines_found
    assert [s.facts["conv_net.convs"].value for s in facts.of_kind("conv_net")] == [convs]
    # one finding where the layers read the same (grouped), with every line
    assert sorted(loc.line for f in findings(facts, tmp_path, "PD028") for loc in f.locations) == lines_found


# -- Lightning: the Trainer and Fabric move the batches and pick the GPU --------------------------
LIGHTNING = """\
import lightning as L
import torch
from torch.utils.data import DataLoader


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=32)

    def val_dataloader(self):
        return DataLoader(self.ds, batch_size=32)


def main(model, ds):
    train = DataLoader(ds, batch_size=64)
    val = DataLoader(ds, batch_size=64)
    kept = DataLoader(ds, batch_size=64)  # never given to Lightning
    trainer = L.Trainer(max_epochs=1{accelerator})
    trainer.fit(model, train, val_dataloaders=val)
    fabric = L.Fabric()
    a, b = fabric.setup_dataloaders(DataLoader(ds), DataLoader(ds), move_to_device={move})
    for x in kept:
        pass
"""


@pytest.mark.parametrize("accelerator, move", [("", "True"), ("", "False"), (', accelerator="cpu"', "True")])
def test_lightning_loaders_feed_the_gpu_that_the_trainer_picks(tmp_path, accelerator, move):
    path = tmp_path / "train.py"
    path.write_text(LIGHTNING.format(accelerator=accelerator, move=move))
    facts = Facts()
    facts.add("device.type", "cpu", "", "machine")
    analyse_files([path], facts)
    got = lines(facts, "dataloader")
    feeds = {n: (v.get("feeds_cuda"), v.get("trains")) for n, v in got.items()}
    gpu = True if not accelerator else None  # a Trainer told the CPU: this file's loaders feed no GPU
    assert feeds == {8: (gpu, True), 11: (gpu, False), 15: (gpu, True), 16: (gpu, False), 17: (None, None),
                     21: (gpu if move == "True" else None, None)}  # move_to_device=False: Fabric moves nothing
    if gpu:
        assert got[8]["non_blocking"] is True  # Lightning copies with non_blocking=True on CUDA
    # Fabric() is left to pick the device ("auto", a GPU where there is one) in both files
    assert facts.value("script.targets_cuda") is True
    pd003 = sorted(loc.line for f in findings(facts, tmp_path, "PD003") for loc in f.locations)
    assert pd003 == ([8, 15] + ([21] if move == "True" else []) if gpu else [])


def test_a_lightning_trainer_told_cpu_targets_no_gpu(tmp_path):
    path = tmp_path / "train.py"
    path.write_text('import lightning as L\ntrainer = L.Trainer(accelerator="cpu")\n')
    facts = Facts()
    analyse_files([path], facts)
    assert facts.value("script.targets_cuda") is False
    path.write_text('import pytorch_lightning as pl\ntrainer = pl.Trainer(devices=1)\n')
    facts = Facts()
    analyse_files([path], facts)
    assert facts.value("script.targets_cuda") is True


ACCELERATE = """\
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


def main(args, model, optimizer, ds):
    accelerator = Accelerator(cpu=args.cpu{placement})
    train_dataloader = DataLoader(ds, batch_size=32, shuffle=True)
    eval_dataloader = DataLoader(ds, batch_size=32)
    other = DataLoader(ds)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    for batch in train_dataloader:
        loss = model(batch)
        accelerator.backward(loss)
        optimizer.step()
    for batch in eval_dataloader:
        model(batch)
    tokenizer = object()
    tokenizer.prepare(other)  # not an Accelerator
"""


def test_accelerate_prepare_moves_the_loaders_a_helper_returns(tmp_path):
    # huggingface/accelerate examples/nlp_example.py: get_dataloaders builds both loaders and returns them
    path = tmp_path / "train.py"
    path.write_text("""\
from accelerate import Accelerator
from torch.utils.data import DataLoader


def get_dataloaders(accelerator, ds, batch_size=16):
    train_dataloader = DataLoader(ds, shuffle=True, batch_size=batch_size)
    eval_dataloader = DataLoader(ds, shuffle=False, batch_size=32)
    return train_dataloader, eval_dataloader


def training_function(model, optimizer, ds):
    accelerator = Accelerator()
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, ds)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    for batch in train_dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
    for batch in eval_dataloader:
        model(**batch)
""")
    facts = Facts()
    facts.add("device.type", "cpu", "", "machine")
    analyse_files([path], facts)
    got = lines(facts, "dataloader")
    assert {n: (v.get("feeds_cuda"), v.get("trains")) for n, v in got.items()} == {6: (True, True), 7: (True, False)}
    assert sorted(loc.line for f in findings(facts, tmp_path, "PD003") for loc in f.locations) == [6]


@pytest.mark.parametrize("placement", ["", ", device_placement=False"])
def test_accelerate_prepare_moves_the_loaders_it_is_given(tmp_path, placement):
    path = tmp_path / "train.py"
    path.write_text(ACCELERATE.format(placement=placement))
    facts = Facts()
    facts.add("device.type", "cpu", "", "machine")
    analyse_files([path], facts)
    got = lines(facts, "dataloader")
    feeds = {n: (v.get("feeds_cuda"), v.get("trains"), v.get("non_blocking")) for n, v in got.items()}
    moved = not placement
    assert feeds == {8: (True if moved else None, True, None), 9: (True if moved else None, False, None),
                     10: (None, None, None)}
    assert facts.value("script.targets_cuda") is True  # the --cpu flag is an opt-in: the GPU is the script's path
    assert sorted(loc.line for f in findings(facts, tmp_path, "PD003") for loc in f.locations) == ([8] if moved else [])
    path.write_text("from accelerate import Accelerator\naccelerator = Accelerator(cpu=True)\n")
    facts = Facts()
    analyse_files([path], facts)
    assert facts.value("script.targets_cuda") is False
