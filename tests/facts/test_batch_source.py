"""A plain Python batch source on the training thread (perfdoctor/facts/static/batch_source.py, PD002):
a generator or a user iterator the training loop draws from, tied to the loop by the static read and
timed by cProfile's share of the profiled steps (`function_shares`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from perfdoctor.facts.model import Facts
from perfdoctor.facts.run.hotspots import FunctionShare
from perfdoctor.facts.static import analyse_files
from perfdoctor.rules.engine import judge
from tests.facts.test_static import by_line
from tests.rules.builders import RULES, ids

DATA = """\
import torch
class Corpus:
    def __init__(self, rows):
        self.rows = rows
    def batches(self, size):
        while True:
            t = torch.zeros(size, 8, dtype=torch.long)
            for i, row in enumerate(self.rows[:size]):
                for j, w in enumerate(row):
                    t[i, j] = w
            yield t
"""

# ymfa-summarizer's shape: the generator made in main, passed as a parameter, drawn with next() per step
TRAIN = """\
import torch
from data import Corpus
def train(gen, model, opt, n):
    for i in range(n):
        batch = next(gen)
        loss = model(batch.float()).sum()
        loss.backward()
        opt.step()
def main():
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    corpus = Corpus([[1, 2, 3]] * 64)
    train_gen = corpus.batches(16)
    train(train_gen, model, opt, 10)
main()
"""


def _files(tmp_path: Path, data: str = DATA, train: str = TRAIN) -> tuple[Path, Path]:
    d, t = tmp_path / "data.py", tmp_path / "train.py"
    d.write_text(textwrap.dedent(data))
    t.write_text(textwrap.dedent(train))
    return d, t


def _facts(step_ms: float = 100.0, device: str = "cpu") -> Facts:
    f = Facts()
    f.add("step.time_ms", step_ms, "ms")
    f.add("cpu.count", 4, "count", "machine")
    f.add("device.type", device, "", "machine")
    return f


def _shares(path: Path, line: int, share: float, calls: float = 1.0, own: float | None = None
            ) -> dict[str, dict[int, FunctionShare]]:
    return {str(path.resolve()): {line: FunctionShare(share, calls, share if own is None else own)}}


def test_a_generator_drawn_by_next_through_a_parameter(tmp_path):
    data, train = _files(tmp_path)
    f = _facts()
    analyse_files([data, train], f, script=train, function_shares=_shares(data, 5, 0.4))
    got = by_line(f, "dataloader")[13]  # the call that made it: train_gen = corpus.batches(16)
    assert got["num_workers"] == 0 and got["trains"] is True
    assert got["wait_fraction"] == pytest.approx(0.4) and got["wait_ms"] == pytest.approx(40.0)
    assert "Corpus.batches()" in got["source"]
    assert got["source_def"] == "data.py(5): batches"  # the profiler's name of its frame (facts/trace/target_gpu.py)
    (s,) = f.of_kind("dataloader")
    assert {(Path(l.file).name, l.line) for l in s.locations} >= {("train.py", 13), ("train.py", 5), ("data.py", 5)}
    (finding,) = [x for x in judge(f, RULES) if x.rule == "PD002"]
    assert "wrap that code in a DataLoader over an IterableDataset" in finding.message
    assert finding.ms_per_step > 0
    # nothing of the DataLoader's other rules judges it
    assert ids(judge(f, RULES)) == ["PD002"]


def test_a_user_iterator_class_iterated_through_an_attribute_and_enumerate(tmp_path):
    """pytorchicbert's shape: a class whose __iter__ is a generator, built in one file, given to a
    trainer of another that keeps it as `self.data_iter` and iterates `enumerate(tqdm(...))`."""
    data = """\
    import torch
    class PairLoader:
        def __init__(self, n):
            self.n = n
        def __iter__(self):
            while True:
                yield [torch.tensor([i] * 8) for i in range(self.n)]
    """
    trainer = """\
    import torch
    from tqdm import tqdm
    class Trainer:
        def __init__(self, model, data_iter, opt):
            self.model, self.data_iter, self.opt = model, data_iter, opt
        def train(self):
            for i, batch in enumerate(tqdm(self.data_iter)):
                loss = self.model(batch[0].float()).sum()
                loss.backward()
                self.opt.step()
    """
    main = """\
    import torch
    from data import PairLoader
    from trainer import Trainer
    model = torch.nn.Linear(8, 1)
    it = PairLoader(4)
    Trainer(model, it, torch.optim.SGD(model.parameters(), lr=0.1)).train()
    """
    d, t, m = tmp_path / "data.py", tmp_path / "trainer.py", tmp_path / "main.py"
    for p, src in ((d, data), (t, trainer), (m, main)):
        p.write_text(textwrap.dedent(src))
    f = _facts()
    analyse_files([d, t, m], f, script=m, function_shares=_shares(d, 5, 0.3))
    got = by_line(f, "dataloader")[5]  # it = PairLoader(4)
    assert "PairLoader.__iter__()" in got["source"] and got["wait_ms"] == pytest.approx(30.0)


@pytest.mark.parametrize("why", ["cheap", "rare", "unprofiled", "dataloader_draw", "wraps_dataloader", "rollout",
                                 "no_tensors"])
def test_quiet_cases(tmp_path, why):
    data, train = DATA, TRAIN
    shares_line, share, calls = 5, 0.4, 1.0
    draws: dict[str, list[tuple[str, int]]] = {}
    if why == "cheap":
        share = 0.02  # 2 % of the step: under PD002's own threshold
    elif why == "rare":
        calls = 0.1  # resumed once in ten steps: not the step's batch
    elif why == "unprofiled":
        shares_line = 3  # cProfile saw another function, not the generator
    elif why == "dataloader_draw":
        draws = {"loader.py:1": [(str((tmp_path / "train.py").resolve()), 5)]}  # the run drew a DataLoader there
    elif why == "wraps_dataloader":
        draws = {"loader.py:1": [(str((tmp_path / "data.py").resolve()), 8)]}  # a DataLoader drawn inside it
    elif why == "rollout":
        data = """\
        import torch
        class Corpus:
            def __init__(self, env):
                self.env = env
            def batches(self, size):
                obs = self.env.reset()
                while True:
                    obs, reward, done, trunc, info = self.env.step(0)
                    yield torch.tensor(obs)
        """
    elif why == "no_tensors":
        data = DATA.replace("t = torch.zeros(size, 8, dtype=torch.long)", "t = [[0] * 8 for _ in range(size)]")
    d, t = _files(tmp_path, data, train)
    f = _facts()
    analyse_files([d, t], f, script=t, function_shares=_shares(d, shares_line, share, calls), loader_draws=draws)
    if why == "cheap":
        assert by_line(f, "dataloader")[13]["wait_fraction"] == pytest.approx(0.02)
    else:
        assert not f.of_kind("dataloader")
    assert "PD002" not in ids(judge(f, RULES))


def test_without_the_run_s_times_nothing_is_judged(tmp_path):
    d, t = _files(tmp_path)
    f = _facts()
    analyse_files([d, t], f, script=t)
    assert not f.of_kind("dataloader")


def test_a_cpu_run_of_a_cuda_script_is_projected_to_the_gpu(tmp_path):
    """A source that is 5 % of a CPU step is a real share of a GPU step 10x faster."""
    d, t = _files(tmp_path)
    f = _facts(step_ms=200.0)
    f.add("script.targets_cuda", True, "", "static")
    analyse_files([d, t], f, script=t, function_shares=_shares(d, 5, 0.05))
    got = by_line(f, "dataloader")[13]
    assert got["load_ms"] == pytest.approx(10.0) and f.value("step.gpu_compute_ms") == pytest.approx(19.0)
    (pd002,) = [x for x in judge(f, RULES) if x.rule == "PD002"]  # 10 / (10 + 19) of the projected GPU step
    assert "would take 34% of the step" in pd002.title


# NGCF's shape: no loop iterable makes the batch; a function called once per step draws it in Python
SAMPLER = """\
import random
class Data:
    def __init__(self, n):
        self.n = n
    def sample(self):
        users = [random.randrange(self.n) for _ in range(64)]
        return users, [u + 1 for u in users]
"""

COUNTED = """\
import torch
from data import Data
data = Data(100)
model = torch.nn.Embedding(200, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for i in range(10):
        users, items = data.sample()
        out = model(torch.tensor(users))
        loss = out.sum()
        loss.backward()
        opt.step()
"""


def _counted(tmp_path: Path, train: str = COUNTED, data: str = SAMPLER, share: float = 0.3, calls: float = 1.0,
             own: float | None = None,
             model_lines: tuple[tuple[str, int], ...] = (("train.py", 9),),
             draws: dict[str, list[tuple[str, int]]] | None = None) -> Facts:
    tmp_path.mkdir(exist_ok=True)
    d, t = _files(tmp_path, data, train)
    f = _facts()
    analyse_files([d, t], f, script=t, function_shares=_shares(d, 5, share, calls, own), loader_draws=draws,
                  model_calls=[(str(tmp_path / name), line) for name, line in model_lines])
    return f


def test_a_function_called_once_per_step_whose_result_the_model_takes(tmp_path):
    f = _counted(tmp_path)
    got = by_line(f, "dataloader")[8]  # users, items = data.sample()
    assert "Data.sample()" in got["source"] and got["wait_ms"] == pytest.approx(30.0)
    (s,) = f.of_kind("dataloader")
    assert [(Path(l.file).name, l.line) for l in s.locations] == [("train.py", 8), ("data.py", 5)]
    assert "PD002" in ids(judge(f, RULES))


@pytest.mark.parametrize("why", ["no_model_call", "model_takes_other", "loop_draws_a_loader", "iterates_batches",
                                 "steps_an_env", "twice_per_step", "calls_the_model", "evaluation_loop"])
def test_a_function_called_once_per_step_quiet_cases(tmp_path, why):
    train, data, kw = COUNTED, SAMPLER, {}
    if why == "no_model_call":
        kw = {"model_lines": (("train.py", 3),)}  # the run saw no model called in that loop
    elif why == "model_takes_other":
        train = COUNTED.replace("model(torch.tensor(users))", "model(torch.arange(64))")
    elif why == "loop_draws_a_loader":
        kw = {"draws": {"loader.py:1": [(str((tmp_path / "train.py").resolve()), 10)]}}
    elif why == "iterates_batches":
        train = COUNTED.replace("for i in range(10):", "for i in loader:")
    elif why == "steps_an_env":
        data = SAMPLER + "def roll(env):\n    obs, reward, done, trunc, info = env.step(0)\n"
    elif why == "twice_per_step":
        kw = {"calls": 2.0}
    elif why == "calls_the_model":
        kw = {"model_lines": (("train.py", 9), ("data.py", 6))}  # a model (an encoder) called inside it
    elif why == "evaluation_loop":
        # nanoGPT's estimate_loss: an evaluation loop over range() in a function the training loop
        # calls every N steps, the same batch function and a model call the run saw
        train = COUNTED + """\
def estimate():
    for k in range(5):
        u, v = data.sample()
        model(torch.tensor(u))
for it in range(100):
    if it % 10 == 0:
        estimate()
    loss = model(torch.arange(64)).sum()
    loss.backward()
    opt.step()
"""
        train = train.replace("users, items = data.sample()", "users, items = [1], [2]")
        kw = {"model_lines": (("train.py", 16),)}
    f = _counted(tmp_path, train, data, **kw)  # type: ignore[arg-type]
    assert not f.of_kind("dataloader")


SLICED = """\
import numpy as np
import torch
from data import Data
data = Data(100)
model = torch.nn.Embedding(200, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def forward(model, i, data):
    users, items = data.sample(i)
    return model(torch.tensor(users))
for epoch in range(2):
    slices = data.batches(64)
    for i, j in zip(slices, np.arange(len(slices))):
        loss = forward(model, i, data).sum()
        loss.backward()
        opt.step()
"""
SLICER = SAMPLER.replace("    def sample(self):", "    def sample(self, i=None):") + (
    "    def batches(self, n):\n        return [list(range(k, k + n)) for k in range(0, self.n, n)]\n"
    "    def batch_gen(self, n):\n        for k in range(0, self.n, n):\n            yield list(range(k, k + n))\n")


def test_a_batch_made_in_a_helper_of_the_step_from_index_slices(tmp_path):
    """SR-GNN: the training loop iterates index slices a function of the user's made before it
    (`zip(slices, np.arange(len(slices)))`), and calls `forward(model, i, data)`, which builds the batch
    with `data.get_slice(i)` and calls the model: the batch is made on the training thread every step.
    Slices from a generator of the user's are that generator's draw, not counted steps."""
    got = by_line(_counted(tmp_path / "a", SLICED, SLICER, model_lines=(("train.py", 9),)), "dataloader")
    assert "Data.sample()" in got[8]["source"]
    lazy = SLICED.replace("data.batches(64)", "data.batch_gen(64)")
    assert not _counted(tmp_path / "b", lazy, SLICER, model_lines=(("train.py", 9),)).of_kind("dataloader")


def test_a_transform_of_a_loaders_batch_drawn_in_a_helper_is_no_source(tmp_path):
    """deep-text-recognition-benchmark: `image_tensors, labels = train_dataset.get_batch()` (its get_batch
    calls next() on its DataLoaders' iterators: the run saw the draws there), then `text, length =
    converter.encode(labels)` and the model takes `text`. The encoder transforms the loader's batch."""
    train = COUNTED.replace("        users, items = data.sample()",
                            "        labels = data.get_batch()\n        users, items = data.sample(labels)")
    data = SAMPLER.replace("    def sample(self):", "    def sample(self, labels=None):") + (
        "    def get_batch(self):\n        return next(self.it)\n")
    drawn = {"data.py:9": [(str((tmp_path / "q" / "data.py").resolve()), 9)]}
    assert not _counted(tmp_path / "q", train, data, model_lines=(("train.py", 10),), draws=drawn).of_kind("dataloader")
    # the same helper where the run saw no DataLoader drawn: a batch function of the user's, a source
    got = by_line(_counted(tmp_path / "p", train, data, model_lines=(("train.py", 10),)), "dataloader")
    assert "Data.sample()" in got[9]["source"]


HANDED = """\
import torch
from data import Data
data = Data(100)
model = torch.nn.Embedding(200, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step(users, items):
    out = model(torch.tensor(users))
    loss = out.sum()
    loss.backward()
    opt.step()
    return loss.item()
for i in range(10):
    loss = step(*data.sample())
"""


def test_a_function_whose_result_is_handed_to_the_step_function(tmp_path):
    """char-rnn's `loss = train(*random_training_set(n, b))`: the batch function's result goes straight to
    the function that calls the model and takes the step."""
    f = _counted(tmp_path, HANDED, model_lines=(("train.py", 7),))
    got = by_line(f, "dataloader")[13]
    assert "Data.sample()" in got["source"] and got["wait_ms"] == pytest.approx(30.0)
    # handed to a function that calls no model (a logger): no source
    quiet = HANDED.replace("loss = step(*data.sample())", "log(*data.sample())\n    step([1], [2])")
    assert not _counted(tmp_path / "quiet", quiet, model_lines=(("train.py", 7),)).of_kind("dataloader")


def test_a_function_that_waits_for_batches_other_processes_make_is_no_source(tmp_path):
    """SASRec's WarpSampler: worker processes fill a queue, `next_batch()` only takes from it: its
    time is the queue's (library code), not the user's Python making a batch on the training thread."""
    data = """\
    import queue
    class Sampler:
        def __init__(self):
            self.q = queue.Queue()
        def sample(self):
            return self.q.get()
    """
    f = _counted(tmp_path, data=data, own=0.001)
    assert not f.of_kind("dataloader")
    # the same wait spent in its own Python is a source
    assert _counted(tmp_path / "x", data=data, own=0.2).of_kind("dataloader")


IN_STEP = """\
import torch
from data import Data
data = Data(100)
model = torch.nn.Embedding(200, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train_step():
    users, items = data.sample()
    more, items = data.sample()
    out = model(torch.tensor(users + more))
    loss = out.sum()
    loss.backward()
    opt.step()
    return loss.item()
for i in range(10):
    train_step()
"""


def test_a_function_called_in_the_step_function_at_each_of_its_sites(tmp_path):
    """ner-bilstm-crf's `train_step` builds the sentences' and the tags' tensors with `tensorized(...)`
    twice, the model called there, the step function called once per pass of a loop over range(): one
    source, at its first call, called once per step at each of its sites."""
    f = _counted(tmp_path, IN_STEP, calls=2.0, model_lines=(("train.py", 9),))
    (s,) = f.of_kind("dataloader")
    assert s.key.endswith("train.py:7") and "Data.sample()" in s.facts["dataloader.source"].value
    assert "PD002" in ids(judge(f, RULES))
    f = _counted(tmp_path / "per_sample", IN_STEP, calls=8.0, model_lines=(("train.py", 9),))
    assert not f.of_kind("dataloader")  # called a batch's times a step: a per-sample function
