"""Static evidence: an ast read of the user's files (perfdoctor/facts/static/: one index per file,
one detector per subject kind)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from perfdoctor.contracts.run import Site
from perfdoctor.facts.model import Facts
from perfdoctor.facts.static import analyse_files


def analyse(tmp_path: Path, source: str, name: str = "train.py") -> tuple[Facts, Path]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    facts = Facts()
    analyse_files([path], facts)
    return facts, path


def by_line(facts: Facts, kind: str) -> dict[int, dict]:
    """{line: {short fact name: value}} for the subjects of a kind."""
    out = {}
    for s in facts.of_kind(kind):
        out[int(s.key.rsplit(":", 1)[1])] = {n.split(".", 1)[1]: f.value for n, f in s.facts.items()}
    return out


# -- dataparallel ----------------------------------------------------------------------------
def test_dataparallel_aliases(tmp_path):
    facts, path = analyse(tmp_path, """\
        import torch
        import torch.nn as nn
        from torch.nn import DataParallel as DP
        from torch import nn as tnn

        a = nn.DataParallel(model)
        b = torch.nn.DataParallel(model, device_ids=[0, 1])
        c = DP(model)
        d = tnn.DataParallel(model)
        e = torch.nn.parallel.DistributedDataParallel(model)
        f = DataParallel(model)  # not imported from torch: not ours
        """)
    subjects = facts.of_kind("dataparallel")
    assert sorted(by_line(facts, "dataparallel")) == [6, 7, 8, 9]
    s = next(s for s in subjects if s.key.endswith(":8"))
    assert s.key == f"{path.resolve()}:8"
    loc = s.locations[0]
    assert (loc.file, loc.line, loc.code, loc.function) == (str(path.resolve()), 8, "c = DP(model)", "<module>")
    assert s.facts["dataparallel.callee"].value == "DP"
    assert s.facts["dataparallel.callee"].source == "static"


# -- empty_cache -----------------------------------------------------------------------------
def test_empty_cache_after_each_run_of_a_sweep_is_not_in_the_training_loop(tmp_path):
    # huggingface/accelerate benchmarks/fp8: a loop over settings, each of which trains, and frees the
    # cache once after its training: once per run, not per step
    facts, _ = analyse(tmp_path, """\
        import torch

        def train_integration(stage):
            for _ in range(2):
                for batch in loader:
                    model(batch).loss.backward()
                    optimizer.step()
            torch.cuda.empty_cache()

        for stage in [1, 2]:
            train_integration(stage)
        """)
    assert by_line(facts, "empty_cache") == {8: {"in_loop": False}}


def test_a_loop_around_the_call_into_training_in_another_file_is_not_per_step(tmp_path):
    # thuml/Time-Series-Library's run.py: `for ii in range(args.itr): exp.train(setting); ...;
    # torch.cuda.empty_cache()`, the training loop in exp/exp_long_term_forecasting.py. Read alone,
    # run.py's loop looks like the step loop; the run's chain to the optimizer step shows it is not.
    from perfdoctor.contracts.run import Site

    exp = tmp_path / "exp.py"
    exp.write_text(textwrap.dedent("""\
        class Exp:
            def train(self, setting):
                for batch in self.loader:
                    self.model(batch).backward()
                    self.opt.step()
        """))
    run = tmp_path / "run.py"
    run.write_text(textwrap.dedent("""\
        import torch
        from exp import Exp

        for ii in range(3):
            exp = Exp()
            exp.train(ii)
            torch.cuda.empty_cache()
        """))
    chain = [Site(file=str(exp), line=5, function="train"), Site(file=str(run), line=6, function="<module>")]
    alone, observed = Facts(), Facts()
    analyse_files([exp, run], alone)
    analyse_files([exp, run], observed, step_chain=chain)
    assert by_line(alone, "empty_cache") == {7: {"in_loop": True}}
    assert by_line(observed, "empty_cache") == {7: {"in_loop": False}}
    # a step function called in the batch loop: that loop is the training loop, its body per step
    step = tmp_path / "step.py"
    step.write_text(textwrap.dedent("""\
        import torch

        def train_step(batch):
            model(batch).backward()
            opt.step()

        for batch in loader:
            train_step(batch)
            torch.cuda.empty_cache()
        """))
    facts = Facts()
    analyse_files([step], facts, step_chain=[Site(file=str(step), line=5, function="train_step"),
                                             Site(file=str(step), line=8, function="<module>")])
    assert by_line(facts, "empty_cache") == {9: {"in_loop": True}}


def test_empty_cache_in_loop_and_called_from_loop(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.cuda import empty_cache as free

        def cleanup():
            torch.cuda.empty_cache()

        def setup():
            torch.cuda.empty_cache()

        setup()
        for step in range(10):
            train_step()
            if step % 100 == 0:
                free()
            cleanup()
        torch.cuda.empty_cache()
        while True:
            torch.cuda.empty_cache()
        """)
    got = by_line(facts, "empty_cache")
    # every 100 steps (line 14) is not every step; at module level (16) it runs once
    assert got == {5: {"in_loop": True}, 8: {"in_loop": False}, 14: {"in_loop": False},
                   16: {"in_loop": False}, 18: {"in_loop": True}}
    s = next(s for s in facts.of_kind("empty_cache") if s.key.endswith(":5"))
    assert s.locations[0].function == "cleanup"


def test_empty_cache_needs_torch(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import mylib
        for i in range(3):
            mylib.cuda.empty_cache()
        """)
    assert facts.of_kind("empty_cache") == []


# -- cpu_to_device ---------------------------------------------------------------------------
def test_cpu_to_device_positive(tmp_path):
    facts, path = analyse(tmp_path, """\
        import torch as th
        from torch import zeros

        device = th.device("cuda" if th.cuda.is_available() else "cpu")
        a = th.randn(4, 4).cuda()
        b = zeros(3).to(device)
        c = th.ones(2).to("cuda:0", non_blocking=True)
        for i in range(5):
            noise = th.rand(
                8, 8,
            ).to(device)
            m = th.arange(10).to(device=device, dtype=th.float16)
        x = th.empty(3)
        y = 5
        x = x.to(device)
        """)
    got = by_line(facts, "cpu_to_device")
    assert got[5] == {"factory": "randn", "target": "cuda", "in_loop": False}
    assert got[6] == {"factory": "zeros", "target": "device", "in_loop": False}
    assert got[7] == {"factory": "ones", "target": '"cuda:0"', "in_loop": False}
    assert got[9] == {"factory": "rand", "target": "device", "in_loop": True}  # a multi-line statement
    assert got[12] == {"factory": "arange", "target": "device", "in_loop": True}
    assert got[13] == {"factory": "empty", "target": "device", "in_loop": False}
    assert len(got) == 6
    s = next(s for s in facts.of_kind("cpu_to_device") if s.key.endswith(":13"))
    assert [l.line for l in s.locations] == [13, 15]  # the factory line, then the move to delete
    assert s.locations[0].code == "x = th.empty(3)"


def test_cpu_to_device_in_a_model_the_run_never_called(tmp_path):
    """A model file of the project (a vendored library's) whose classes the run's models did not
    hold: its factories never ran in a step. Classes that are no nn.Module (a trainer) and the
    models the run called are read as before."""
    source = """\
        import torch
        import torch.nn as nn

        class Block(nn.Module):
            def forward(self, x):
                pos = torch.arange(x.shape[1]).to(x.device)
                return x + pos

        class Unused(Block):
            def extra(self, x):
                return torch.randn(x.shape).cuda()

        class Used(nn.Module):
            def forward(self, x):
                return x * torch.ones(3).to(x.device)

        class Trainer:
            def step(self, x):
                noise = torch.randn(x.shape).to("cuda")
                return noise
        """
    path = tmp_path / "vit.py"
    path.write_text(textwrap.dedent(source))
    everything = Facts()
    analyse_files([path], everything)
    assert sorted(by_line(everything, "cpu_to_device")) == [6, 11, 15, 19]
    facts = Facts()
    analyse_files([path], facts, model_classes={f"{path.resolve()}:Used", "/elsewhere/train.py:Net"})
    assert sorted(by_line(facts, "cpu_to_device")) == [15, 19]


def test_cpu_to_device_on_a_line_the_watched_steps_never_ran(tmp_path):
    """A factory line the run's host-tensor probe watched and never saw make a tensor did not run in
    the step (SupConLoss's `torch.eye` mask when labels are given; a loss helper only another loss
    calls): its static candidate stands down. Lines the watch saw stay; so do an accelerator-only
    branch (a CPU run cannot take it), a branch every N steps, and factories the probe does not
    watch (a literal's torch.tensor)."""
    source = """\
        import torch

        def loss(features, labels=None, use_cuda=True):
            if labels is None:
                mask = torch.eye(4).to(features.device)
            else:
                mask = (labels == labels.T).float()
            idx = torch.arange(4).view(-1, 1).to(features.device)
            if use_cuda:
                perm = torch.randperm(4).cuda()
            scale = torch.tensor(2.0).to(features.device)
            return mask, idx, scale

        def permute(z):
            return torch.randperm(z.shape[0]).to(z.device)

        for step in range(100):
            x = torch.randn(8, 4).to("cuda")
            if step % 10 == 0:
                noise = torch.rand(8).to("cuda")
            loss(x, x)
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    everything = Facts()
    analyse_files([path], everything)
    assert sorted(by_line(everything, "cpu_to_device")) == [5, 8, 10, 11, 15, 18, 20]
    watched = Facts()
    analyse_files([path], watched, factory_lines={str(path.resolve()): frozenset({8, 18})})
    assert sorted(by_line(watched, "cpu_to_device")) == [8, 10, 11, 18, 20]


def test_cpu_to_device_in_a_function_the_profiled_steps_never_called(tmp_path):
    """A legacy type's literal (the probe does not watch those constructors) in a function cProfile
    never saw called in the profiled steps (a LARS optimizer defined beside the Adam the script uses)
    stands down; one in a called function, in the function the steps run in (on the step's call
    chain: entered before them), or in one called behind an accelerator-only `if` stays."""
    source = """\
        import torch

        class LARS(torch.optim.Optimizer):
            def step(self, closure=None):
                device = self.device
                return torch.Tensor([1.0]).to(device)

        def scale(x):
            return x * torch.Tensor([2.0]).to(x.device)

        def to_gpu(x):
            return x + torch.Tensor([0.0]).cuda()

        def train(x, use_cuda):
            for step in range(10):
                one = torch.Tensor([1.0]).to(x.device)
                y = scale(x)
                if use_cuda:
                    y = to_gpu(y)
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    everything = Facts()
    analyse_files([path], everything)
    assert sorted(by_line(everything, "cpu_to_device")) == [6, 9, 12, 16]
    facts = Facts()
    chain = [Site(file=str(path), line=17, code="y = scale(x)", function="train")]
    analyse_files([path], facts, step_chain=chain, functions_called={str(path.resolve()): frozenset({8})})
    assert sorted(by_line(facts, "cpu_to_device")) == [9, 12, 16]


def test_cpu_to_device_whose_move_the_watched_steps_never_ran(tmp_path):
    """vq-vae-2's distributed helper: all_gather runs every step but returns at `if world_size == 1`,
    so its legacy literals' `.to("cuda")` never run in a single-process run. The probe does not watch
    legacy constructors, and the function was called: the watched move lines (every `.to` / `.cuda` /
    `.type_as` of the user's in the watched steps) say the moves did not run, and those candidates
    stand down. A move behind an accelerator-only `if` (a CPU run cannot take it) or behind `%` (the
    watch may fall between two) stays, and so does every candidate where no run says which moves ran."""
    source = """\
        import torch

        def all_gather(data, world_size):
            if world_size == 1:
                return [data]
            local_size = torch.IntTensor([4]).to("cuda")
            size_list = [torch.IntTensor([1]).to("cuda") for _ in range(world_size)]
            return size_list, local_size

        def train(x, use_cuda, world_size):
            for step in range(10):
                one = torch.Tensor([1.0]).to(x.device)
                all_gather(x, world_size)
                if use_cuda:
                    two = torch.Tensor([2.0]).cuda()
                if step % 100 == 0:
                    three = torch.Tensor([3.0]).to(x.device)
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    real = str(path.resolve())
    everything = Facts()
    analyse_files([path], everything, functions_called={real: frozenset({3, 10})})
    assert sorted(by_line(everything, "cpu_to_device")) == [6, 7, 12, 15, 17]
    watched = Facts()
    analyse_files([path], watched, functions_called={real: frozenset({3, 10})}, move_lines={real: frozenset({12})})
    assert sorted(by_line(watched, "cpu_to_device")) == [12, 15, 17]


def test_cpu_to_device_joined_factories_moved_later_in_an_accelerator_if(tmp_path):
    """DGI: the labels are two factories' tensors joined on the host every step and moved by the second
    statement of `if torch.cuda.is_available():` (a CPU run ran the factories, never the move): one
    candidate at the join, the move beside it. A join of data the host had, or a name touched before
    the move in the `if`'s body, is not one."""
    source = """\
        import numpy as np
        import torch

        for epoch in range(100):
            idx = np.random.permutation(10)
            shuf = features[:, idx, :]
            lbl_1 = torch.ones(1, 10)
            lbl_2 = torch.zeros(1, 10)
            lbl = torch.cat((lbl_1, lbl_2), 1)
            both = torch.cat((lbl_1, batch), 1)
            if torch.cuda.is_available():
                shuf = shuf.cuda()
                lbl = lbl.cuda()
            if torch.cuda.is_available():
                print(both)
                both = both.cuda()
            loss = model(features, shuf, lbl)
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source))
    real = str(path.resolve())
    facts = Facts()
    analyse_files([path], facts, factory_lines={real: frozenset({7, 8})}, move_lines={real: frozenset()})
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [9]
    assert got[9]["factory"] == "ones" and got[9]["in_loop"] is True and "host_data" not in got[9]
    s = facts.of_kind("cpu_to_device")[0]
    assert [loc.line for loc in s.locations] == [9, 13]


def test_cpu_to_device_negatives(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        dtype = torch.float16
        a = torch.randn(4).to(torch.float16)
        b = torch.randn(4).to(dtype)
        c = torch.randn(4, device=device).to(device)
        d = torch.randn(4).to("cpu")
        e = make_tensor().to(device)
        f = torch.from_numpy(arr).to(device)
        g = torch.zeros_like(t).cuda()
        h = torch.randn(4, **kw).cuda()
        for x, y in DataLoader(ds):
            x = x.to(device)
        k = torch.randn(4)
        k.normal_()
        k = k.to(device)
        m = torch.randn(4)
        other = m.to(device)
        n = torch.randn(4)
        dev = pick()
        n = n.to(dev)
        """)
    assert by_line(facts, "cpu_to_device") == {}


def test_cpu_to_device_tensor_of_host_data_is_the_data_s_copy(tmp_path):
    """`torch.tensor(reward).to(device)` (cleanRL's PPO, an environment's numpy output) copies what the
    host computed: no device-side factory can make it. A literal's copy is avoidable."""
    facts, _ = analyse(tmp_path, """\
        import torch
        for step in range(10):
            obs, reward = env.step(action)
            r = torch.tensor(reward).to(device)
            o = torch.as_tensor(obs).to(device)
            z = torch.tensor(0.).to(device)
            w = torch.tensor([1.0, -2.0]).to(device)
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [6, 7] and got[6]["factory"] == "tensor"


def test_cpu_to_device_legacy_types_and_chains_through_views(tmp_path):
    """`torch.LongTensor(range(L)).expand_as(w).to(device)` in every attention call (a fresh-set
    seq2seq transformer), a legacy type given a literal or sizes, a factory cast before its move: made on
    the host and moved. A legacy type given the host's data (a numpy batch) copies it, as torch.tensor."""
    facts, _ = analyse(tmp_path, """\
        import torch, torch.nn as nn
        class Attn(nn.Module):
            def forward(self, w):
                pos = torch.LongTensor(range(w.size(1))).expand_as(w).to(w.device)
                return w + pos
        for step in range(10):
            a = torch.FloatTensor([1.0, 2.0]).to(device)
            b = torch.FloatTensor(4, 3).cuda()
            c = torch.randint(0, 9, (4,)).float().to(device)
            d = torch.FloatTensor(batch_np).to(device)
            e = torch.LongTensor(range(8)).cpu()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [4, 7, 8, 9]
    assert got[4]["factory"] == "LongTensor" and got[4]["in_loop"] and got[9]["factory"] == "randint"


def test_cpu_to_device_of_a_repeated_value_is_a_fill(tmp_path):
    """sgrvinod's LM-LSTM-CRF tagger makes its `<end>` targets every step as
    `torch.LongTensor([word_map['<end>']] * b).unsqueeze(1).to(device)`: one value repeated, a fill the
    device makes as well (torch.full), not the host's data. A row of data repeated is the data's copy."""
    facts, _ = analyse(tmp_path, """\
        import torch
        for step in range(10):
            b = wmaps.size(0)
            end = torch.LongTensor([word_map['<end>']] * b).unsqueeze(1).to(device)
            pad = torch.tensor(b * [0]).to(device)
            rows = torch.tensor([obs[i]] * b).to(device)
            data = torch.LongTensor(batch_np * 2).to(device)
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [4, 5]
    assert got[4]["factory"] == "LongTensor" and got[4]["in_loop"] and got[5]["factory"] == "tensor"


def test_cpu_to_device_of_a_tensor_filled_on_the_host_then_moved(tmp_path):
    """spro/char-rnn's batch: `inp = torch.LongTensor(b, n)`, filled row by row in a loop, wrapped in
    `Variable`, then `if args.cuda: inp = inp.cuda()`: made on the host every step and copied, with the
    host's data in it (a batch, `host_data`). A tensor read or handed on in between is left alone."""
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.autograd import Variable
        def batch():
            inp = torch.LongTensor(8, 20)
            for bi in range(8):
                inp[bi] = encode(text[bi])
            inp = Variable(inp)
            if args.cuda:
                inp = inp.cuda()
            out = torch.LongTensor(8, 20)
            for bi in range(8):
                log(out)
            if args.cuda:
                out = out.cuda()
            return inp, out
        for step in range(10):
            x, y = batch()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [4]
    assert got[4]["factory"] == "LongTensor" and got[4]["host_data"] is True


def test_cpu_to_device_of_a_tensor_computed_from_a_host_factory(tmp_path):
    """cloneofsimo/minRF's DiT: every forward computes the timestep frequencies from `torch.arange` on the
    host and moves them (`torch.exp(-math.log(p) * torch.arange(...) / half).to(t.device)`); SimCLR
    concatenates host aranges. A CPU scalar (`torch.tensor(2.)`) or a device tensor in the arithmetic
    is no host tensor moved."""
    facts, _ = analyse(tmp_path, """\
        import math, torch, torch.nn as nn
        class Embed(nn.Module):
            def forward(self, t, x):
                freqs = torch.exp(
                    -math.log(10000) * torch.arange(start=0, end=128) / 128
                ).to(t.device)
                labels = torch.cat([torch.arange(8) for i in range(2)], dim=0).float().to(t.device)
                a = (x * torch.tensor(2.0)).to(t.device)
                b = torch.exp(x).to(t.device)
                return freqs, labels, a, b
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [4, 7]
    assert got[4]["factory"] == "arange" and got[4]["in_loop"] is True and got[7]["factory"] == "arange"


def test_cpu_to_device_of_a_named_tensor_computed_from_a_numpy_fill(tmp_path):
    """THUDM/GRAND's DropNode: every step builds the keep rates with a legacy type over a numpy fill, samples
    the masks with torch.bernoulli on the host, and moves them inline (`masks.cuda() * features`, here behind
    the script's CUDA flag): one host tensor computed and moved per call. A name bound to data (a batch), a
    sample joined with a factory's padding (pbloem/former's `torch.cat([instance, pad])`), or a plain
    factory's name moved by rebinding (`_two_statements`), is not this shape."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np, torch
        use_cuda = torch.cuda.is_available()
        def rand_prop(features, batch, rate):
            drop_rates = torch.FloatTensor(np.ones(features.shape[0]) * rate)
            masks = torch.bernoulli(1. - drop_rates).unsqueeze(1)
            features = (masks.cuda() if use_cuda else masks) * features
            data = torch.FloatTensor(batch)
            moved = data.cuda() * features
            pad = torch.zeros(4, 3)
            sample = torch.cat([data, pad])
            sample = sample.cuda() if use_cuda else sample
            return features, moved, sample
        for step in range(100):
            f, m = rand_prop(x, b, 0.5)
            loss = model(f).sum()
            loss.backward()
            opt.step()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [6]
    assert got[6]["factory"] == "FloatTensor" and got[6]["in_loop"] is True


def test_cpu_to_device_of_a_padded_label_batch_returned_moved(tmp_path):
    """deep-text-recognition-benchmark's CTCLabelConverter.encode (utils.py), which train.py calls every step:
    a LongTensor of sizes filled with zeros, each word's indices written into its row's slice on the host,
    returned moved to the device."""
    (tmp_path / "utils.py").write_text(textwrap.dedent("""\
        import torch
        class Converter:
            def encode(self, text, n=25):
                length = [len(s) for s in text]
                batch_text = torch.LongTensor(len(text), n).fill_(0)
                for i, t in enumerate(text):
                    ids = [self.dict[c] for c in t]
                    batch_text[i][:len(ids)] = torch.LongTensor(ids)
                return (batch_text.to(device), torch.IntTensor(length).to(device))
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        from utils import Converter
        converter = Converter()
        for images, labels in loader:
            text, length = converter.encode(labels)
            loss = model(images, text).sum()
            loss.backward()
            opt.step()
        """))
    facts = Facts()
    analyse_files([tmp_path / "train.py", tmp_path / "utils.py"], facts)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [5]
    assert got[5]["factory"] == "LongTensor" and got[5]["in_loop"] is True and got[5]["host_data"] is True
    assert got[5]["filled"] is True  # filled from Python values: not "drawn from a store in host memory"
    s = next(s for s in facts.of_kind("cpu_to_device") if s.key.endswith(":5"))
    assert [loc.line for loc in s.locations] == [5, 9]  # made, then moved in the return


def test_cpu_to_device_in_a_sampling_loop_after_the_epoch_is_not_per_step(tmp_path):
    """A conditional diffusion model samples images after each epoch, `torch.randn(...).to(device)` at
    each of its 400 denoising steps: no training step runs that loop (the timestep draw of the training
    step is every step)."""
    facts, _ = analyse(tmp_path, """\
        import torch
        def sample(model, n):
            x = torch.randn(n, 1, 28, 28).to(device)
            for i in range(400, 0, -1):
                z = torch.randn(n, 1, 28, 28).to(device)
                x = model(x, i) + z
            return x
        for epoch in range(10):
            for x, c in loader:
                t = torch.randint(1, 400, (x.shape[0],)).to(device)
                loss = model.loss(x.to(device), t)
                opt.zero_grad()
                loss.backward()
                opt.step()
            images = sample(model, 16)
        """)
    got = by_line(facts, "cpu_to_device")
    assert got[5]["in_loop"] is False and got[10]["in_loop"] is True
    # the same as a method of the model, called on it (`ddpm.sample(...)`, Conditional_Diffusion_MNIST)
    facts, _ = analyse(tmp_path, """\
        import torch, torch.nn as nn
        class DDPM(nn.Module):
            def sample(self, n):
                x = torch.randn(n, 1, 28, 28).to(device)
                for i in range(400, 0, -1):
                    z = torch.randn(n, 1, 28, 28).to(device)
                    x = self.nn_model(x, i) + z
                return x
        for epoch in range(10):
            for x, c in loader:
                loss = ddpm(x.to(device), c.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                images = ddpm.sample(16)
        """)
    got = by_line(facts, "cpu_to_device")
    assert got[6]["in_loop"] is False


def test_cpu_to_device_host_batch_copied_every_training_step(tmp_path):
    """A batch drawn from a store kept in host memory and copied inside the training step on every
    update (a numpy replay buffer, a numpy rollout sliced into minibatches, one-row host tensors
    concatenated): `host_data`. The observation moved to act (the rollout), a rollout copied once per
    update before its epochs, and the per-epoch permutation are the data's own copy."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        class Agent:
            def act(self, obs):
                with torch.no_grad():
                    return self.q(torch.FloatTensor(obs).to(self.device)).argmax().item()
            def learn(self, samples):
                s = torch.cat(samples.state).float().to(self.device)
                r = torch.tensor(self.rew[self.idx]).to(self.device)
                loss = self.loss(s, r)
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
            def update(self):
                states = torch.from_numpy(self.states).to(self.device)
                for _ in range(self.epochs):
                    perm = torch.LongTensor(np.random.permutation(64)).to(self.device)
                    for idx in perm.split(16):
                        batch = torch.tensor(self.obs[idx.cpu().numpy()], dtype=torch.float)
                        batch = batch.to(self.device)
                        loss = self.loss(batch)
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
        for episode in range(10):
            obs = env.reset()
            for t in range(200):
                nxt, reward, done, info = env.step(agent.act(obs))
                o = torch.Tensor(nxt).to(device)
                agent.learn(buffer.sample(64))
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [8, 9, 17, 19]
    assert got[8] == {"factory": "cat", "target": "self.device", "in_loop": True, "host_data": True}
    # a legacy type over numpy's permutation is a factory (`torch.randperm(64, device=...)`), made once an epoch
    assert got[17]["factory"] == "LongTensor" and got[17]["in_loop"] is False and "host_data" not in got[17]
    assert got[9]["factory"] == "tensor" and got[19]["host_data"] is True
    s = next(s for s in facts.of_kind("cpu_to_device") if s.key.endswith(":19"))
    assert [loc.line for loc in s.locations] == [19, 20]  # the copy, then its move


def test_cpu_to_device_host_batch_of_a_comprehension_over_drawn_rows(tmp_path):
    """weihua916/powerful-gnns (GIN): each step samples graphs by index from the in-memory list and makes
    the labels from them in a comprehension (`torch.LongTensor([g.label for g in batch_graph])`),
    copied to the device every step: rows drawn from a host store (`host_data`). A comprehension over
    something not drawn (the environment's values as they came) stays the data's own copy."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        def train(model, train_graphs, optimizer, device):
            for pos in range(50):
                selected_idx = np.random.permutation(len(train_graphs))[:32]
                batch_graph = [train_graphs[idx] for idx in selected_idx]
                output = model(batch_graph)
                labels = torch.LongTensor([graph.label for graph in batch_graph]).to(device)
                rewards = torch.FloatTensor([r for r in env.rewards()]).to(device)
                loss = criterion(output, labels) + rewards.sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [8]
    assert got[8] == {"factory": "LongTensor", "target": "device", "in_loop": True, "host_data": True}


def test_cpu_to_device_cat_of_a_tensor_the_step_already_moved_is_on_the_device(tmp_path):
    """Time-Series-Library's decoder input: batch_y is moved first, then joined with zeros_like of it;
    the torch.cat runs on the device and its .to(device) is a no-op, not a host batch copied."""
    facts, _ = analyse(tmp_path, """\
        import torch
        class Exp:
            def train(self):
                for batch_x, batch_y in self.loader:
                    batch_y = batch_y.float().to(self.device)
                    dec_inp = torch.zeros_like(batch_y[:, -4:, :]).float()
                    dec_inp = torch.cat([batch_y[:, :2, :], dec_inp], dim=1).float().to(self.device)
                    host = torch.cat([batch_x[:, :2, :], batch_x], dim=1).to(self.device)
                    loss = self.model(host, dec_inp)
                    loss.backward()
                    self.opt.step()
        """)
    # neither: the device one is no copy, and the host one joins the batch the loop iterates (the loader's
    # data as it came, whose copy is PD003's and PD017's), not rows drawn from a store kept on the host
    assert sorted(by_line(facts, "cpu_to_device")) == []


def test_cpu_to_device_cat_of_the_loops_own_batch_is_the_loaders_copy(tmp_path):
    """SimCLR: `for images, _ in tqdm(train_loader): images = torch.cat(images, dim=0)` then
    `images.to(device)`: the loader's views joined as they came; a replay list's rows joined are drawn."""
    facts, _ = analyse(tmp_path, """\
        import torch
        def train(loader, memory, model, opt, device):
            for images, _ in tqdm(loader):
                images = torch.cat(images, dim=0)
                images = images.to(device)
                sample = memory.sample(64)
                states = torch.cat([s.state for s in sample]).to(device)
                for k in range(3):
                    rows = torch.cat(sample).to(device)
                loss = model(images, states).mean()
                loss.backward()
                opt.step()
        """)
    got = by_line(facts, "cpu_to_device")
    assert 4 not in got and 5 not in got and 7 in got and 9 in got


def test_cpu_to_device_host_batch_of_a_buffer_in_another_file(tmp_path):
    """dongminlee94/deep_rl: the agent's update (td3.py) calls `self.replay_buffer.sample(...)` once per
    step; `sample` (buffers.py) copies the host numpy batch to the device. No code of buffers.py calls
    it: the training steps of the project's other files do. A rollout's `get()` called once per update
    before the loop that takes the steps is not every step."""
    buffers = tmp_path / "buffers.py"
    buffers.write_text(textwrap.dedent("""\
        import numpy as np
        import torch
        class ReplayBuffer:
            def sample(self, n):
                idxs = np.random.randint(0, self.size, size=n)
                return dict(obs=torch.Tensor(self.obs[idxs]).to(self.device),
                            rew=torch.Tensor(self.rew[idxs]).to(self.device))
            def get(self):
                return dict(obs=torch.Tensor(self.all_obs).to(self.device))
        """))
    agent = tmp_path / "td3.py"
    agent.write_text(textwrap.dedent("""\
        class Agent:
            def train_model(self):
                batch = self.replay_buffer.sample(64)
                loss = self.loss(batch["obs"], batch["rew"])
                self.qf_optimizer.zero_grad()
                loss.backward()
                self.qf_optimizer.step()
            def train_ppo(self):
                batch = self.buffer.get()
                for _ in range(80):
                    loss = self.loss(batch)
                    self.vf_optimizer.zero_grad()
                    loss.backward()
                    self.vf_optimizer.step()
        """))
    facts = Facts()
    analyse_files([buffers, agent], facts)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [6, 7] and got[6]["host_data"] is True
    alone = Facts()  # the buffer's file alone: nothing says a training step calls it
    analyse_files([buffers], alone)
    assert by_line(alone, "cpu_to_device") == {}


def test_cpu_to_device_host_batch_returned_by_a_buffer_in_another_file(tmp_path):
    """pranz24/pytorch-soft-actor-critic: the update unpacks `memory.sample(batch_size=...)` (ReplayMemory
    in replay_memory.py: `random.sample(self.buffer, n)`, then `map(np.stack, zip(*batch))`) and copies
    each array with `torch.FloatTensor(x).to(self.device)` every update: rows drawn from a host store.
    The policy's own `sample(state)` (model.py, another function of that name) returns what the model
    computed; its keywords tell the two apart. An observation moved to act stays the data's own copy."""
    (tmp_path / "replay_memory.py").write_text(textwrap.dedent("""\
        import random
        import numpy as np
        class ReplayMemory:
            def sample(self, batch_size):
                batch = random.sample(self.buffer, batch_size)
                state, action, reward = map(np.stack, zip(*batch))
                return state, action, reward
        """))
    (tmp_path / "model.py").write_text(textwrap.dedent("""\
        import torch
        class GaussianPolicy(torch.nn.Module):
            def sample(self, state):
                mean = self.forward(state)
                return mean, mean.sum()
        """))
    (tmp_path / "sac.py").write_text(textwrap.dedent("""\
        import torch
        class SAC:
            def select_action(self, state):
                state = torch.FloatTensor(state).to(self.device).unsqueeze(0)
                return self.policy.sample(state)[0]
            def update_parameters(self, memory, batch_size):
                state_batch, action_batch, reward_batch = memory.sample(batch_size=batch_size)
                state_batch = torch.FloatTensor(state_batch).to(self.device)
                reward_batch = torch.FloatTensor(reward_batch).to(self.device)
                pi, _ = self.policy.sample(state_batch)
                mean = torch.FloatTensor(self.policy.sample(state_batch)[0]).to(self.device)
                loss = (pi - reward_batch).pow(2).mean()
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
        """))
    facts = Facts()
    analyse_files([tmp_path / "replay_memory.py", tmp_path / "model.py", tmp_path / "sac.py"], facts)
    got = {k: v for k, v in by_line(facts, "cpu_to_device").items()}
    assert sorted(got) == [8, 9] and got[8]["host_data"] is True and got[8]["factory"] == "FloatTensor"
    alone = Facts()  # without the buffer's file nothing says what `memory.sample` returns
    analyse_files([tmp_path / "model.py", tmp_path / "sac.py"], alone)
    assert by_line(alone, "cpu_to_device") == {}


def test_a_module_whose_forward_steps_its_optimizer_makes_its_call_a_training_step(tmp_path):
    """dragen1860's MAML: `accs = maml(x_spt, ...)` in the loop, Meta.forward (meta.py) steps the
    meta-optimizer. The run's chain at its first optimizer step says that call leads to it, so the loop
    takes a step and the episode batch it draws from the host cache (`db.next()`, another file) and moves
    every step is host data. The read takes the binding that reaches it: the test loop's rebinding after
    it is no source of the training step's batch. Without the run's chain the loop is not a training step."""
    (tmp_path / "nshot.py").write_text(textwrap.dedent("""\
        class NShot:
            def next(self, mode="train"):
                batch = self.cache[mode][self.index[mode]]
                self.index[mode] += 1
                return batch
        """))
    (tmp_path / "meta.py").write_text(textwrap.dedent("""\
        import torch
        class Meta(torch.nn.Module):
            def forward(self, x, y):
                loss = self.net(x).sub(y).pow(2).mean()
                self.meta_optim.zero_grad()
                loss.backward()
                self.meta_optim.step()
                return loss
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch
        from meta import Meta
        from nshot import NShot
        def main(device):
            maml, db = Meta().to(device), NShot()
            for step in range(1000):
                x, y = db.next()
                x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
                accs = maml(x, y)
                if step % 500 == 0:
                    x, y = db.next("test")
                    x, y = torch.from_numpy(x).to(device), x.sum()
        main("cuda")
        """))
    files = [tmp_path / "nshot.py", tmp_path / "meta.py", train]
    chain = [Site(file=str(tmp_path / "meta.py"), line=7, function="forward"),
             Site(file=str(train), line=9, function="main"), Site(file=str(train), line=13, function="<module>")]
    facts = Facts()
    analyse_files(files, facts, step_chain=chain)
    got = by_line(facts, "cpu_to_device")
    assert 8 in got and got[8]["host_data"] is True and 12 not in got  # the test batch: every 500 steps
    alone = Facts()
    analyse_files(files, alone)
    assert 8 not in by_line(alone, "cpu_to_device")


def test_the_call_into_the_step_is_the_outermost_at_its_line(tmp_path):
    """spro's char-rnn: `loss = train(*random_training_set(...))`, the run's chain at that line: train takes
    the step; the batch function whose result it is given does not (it is PD002's batch source)."""
    from perfdoctor.facts.static.index import read

    path = tmp_path / "train.py"
    path.write_text("for epoch in range(10):\n    loss = train(*random_training_set(200, 100))\n")
    index = read(path)
    assert index is not None
    index.loops.set_step_calls(frozenset({2}))
    outer, inner = sorted((c for c in index.calls if c.lineno == 2), key=lambda c: c.col_offset)
    assert index.loops.takes_step(outer) and not index.loops.takes_step(inner)
    assert index.loops.trains(index.nodes_of(ast.For)[0])


def test_cpu_to_device_next_observation_of_a_one_step_update_is_the_data_s_copy(tmp_path):
    """dongminlee94/deep_rl's one-step actor-critic: the update moves the next observation env.step
    just returned (a value as it came, nothing stored); a fixed slice of it neither. A row drawn by an
    index in the same update is a sampled batch."""
    facts, _ = analyse(tmp_path, """\
        import torch
        class Agent:
            def train_model(self):
                log_pi, v, reward, next_obs, done = self.transition
                next_v = self.vf(torch.Tensor(next_obs).to(self.device))
                first = torch.tensor(self.frames[0]).to(self.device)
                last = torch.tensor(self.frames[:, -1:]).to(self.device)
                drawn = torch.tensor(self.frames[self.idx]).to(self.device)
                loss = (reward + next_v - v).pow(2).mean() - log_pi.mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        """)
    assert sorted(by_line(facts, "cpu_to_device")) == [8]


def test_cpu_to_device_normal_with_a_size_is_a_factory(tmp_path):
    """`torch.normal(mean=0, std=s, size=...)` draws on the host (TD3's target-policy noise, every
    update); `torch.normal(mu, std)` of tensors draws where they are."""
    facts, _ = analyse(tmp_path, """\
        import torch
        for step in range(10):
            eps = torch.normal(mean=0, std=0.2, size=a.size()).to(device)
            b = torch.normal(mu, sigma).to(device)
            c = torch.normal(0.0, 1.0, (4, 2)).cuda()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [3, 5] and got[3] == {"factory": "normal", "target": "device", "in_loop": True}


def test_cpu_to_device_in_a_sampling_method_of_another_file_is_not_per_step(tmp_path):
    """cloneofsimo/minDiffusion: `DDPM.sample` lives in the model's file, which has no training loop;
    the script calls `ddpm.sample(...)` after each epoch. The project's files are read together, so
    the sampling loop's `torch.randn(...).to(device)` is judged where it is called: not per step. The
    training step's timestep draw in `forward` stays per step."""
    model = tmp_path / "ddpm.py"
    model.write_text(textwrap.dedent("""\
        import torch, torch.nn as nn
        class DDPM(nn.Module):
            def forward(self, x):
                t = torch.randint(1, 1000, (x.shape[0],)).to(x.device)
                return self.eps_model(x, t)
            def sample(self, n, device):
                x = torch.randn(n, 3, 32, 32).to(device)
                for i in range(1000, 0, -1):
                    z = torch.randn(n, 3, 32, 32).to(device)
                    x = self.eps_model(x, i) + z
                return x
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch
        from ddpm import DDPM
        def main():
            ddpm = DDPM()
            for epoch in range(100):
                for x, _ in loader:
                    optim.zero_grad()
                    loss = ddpm(x.to(device))
                    loss.backward()
                    optim.step()
                with torch.no_grad():
                    xh = ddpm.sample(8, device)
        main()
        """))
    for paths in ([model, train], [train, model]):
        facts = Facts()
        analyse_files(paths, facts)
        got = by_line(facts, "cpu_to_device")
        assert got[9]["in_loop"] is False and got[4]["in_loop"] is True
    # read alone, the model's file cannot tell where `sample` runs: its loop is taken as per step
    facts = Facts()
    analyse_files([model], facts)
    assert by_line(facts, "cpu_to_device")[9]["in_loop"] is True


def test_cpu_to_device_in_function_called_from_loop(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch

        class Trainer:
            def make_noise(self):
                return torch.randn(16).to(self.device)

            def fit(self):
                for batch in self.loader:
                    self.make_noise()
        """)
    assert by_line(facts, "cpu_to_device") == {5: {"factory": "randn", "target": "self.device", "in_loop": True}}
    s = facts.of_kind("cpu_to_device")[0]
    assert s.locations[0].function == "make_noise"


# -- dataloader ------------------------------------------------------------------------------
def test_cpu_to_device_host_batch_drawn_and_copied_with_device_given(tmp_path):
    """CleanRL-style updates: `torch.tensor(obs, device=device)` of rows a numpy buffer drew by index is
    the same copy from host memory on every update as `torch.tensor(obs).to(device)`. The observation
    copied to act, and a copy given the CPU, are not."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        class Buffer:
            def sample(self, n):
                idx = np.random.randint(0, self.size, size=n)
                return self.obs[idx], self.act[idx]
        class Agent:
            def act(self, obs):
                return self.q(torch.tensor(obs, dtype=torch.float32, device=device)).argmax()
            def update(self, buf):
                obs, act = buf.sample(64)
                o = torch.tensor(obs, dtype=torch.float32, device=device)
                a = torch.as_tensor(act, device=device)
                c = torch.tensor(obs, device="cpu")
                loss = (self.q(o).gather(1, a) - 1).pow(2).mean()
                self.opt.zero_grad(); loss.backward(); self.opt.step()
        agent = Agent(); buf = Buffer()
        for t in range(1000):
            env_obs, r, d, _ = env.step(agent.act(env_obs))
            agent.update(buf)
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [13, 14] and got[13] == {"factory": "tensor", "target": "device", "in_loop": True,
                                                    "host_data": True}


def test_cpu_to_device_drawn_batch_of_an_update_inline_in_the_environment_loop(tmp_path):
    """gouxiangchen's dueling DQN updates inside the loop that steps CartPole: `batch =
    memory_replay.sample(BATCH)` (a list comprehension of `self.buffer[i]`), `zip(*batch)`, then
    `torch.FloatTensor(batch_state).to(device)` every update. The observation moved to act in that loop
    is the data's own copy; the replay sample is rows drawn from a host store."""
    facts, _ = analyse(tmp_path, """\
        import random
        import torch
        class Memory:
            def sample(self, n):
                idx = random.sample(range(len(self.buffer)), n)
                return [self.buffer[i] for i in idx]
        memory = Memory()
        for epoch in range(100):
            state = env.reset()
            while True:
                action = net(torch.FloatTensor(state).unsqueeze(0).to(device)).argmax().item()
                state, reward, done, _ = env.step(action)
                memory.buffer.append((state, reward))
                batch = memory.sample(32)
                batch_state, batch_reward = zip(*batch)
                batch_state = torch.FloatTensor(batch_state).to(device)
                loss = net(batch_state).sum()
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                if done:
                    break
        """)
    assert sorted(by_line(facts, "cpu_to_device")) == [16]


def test_cpu_to_device_drawn_rows_converted_by_a_helper_of_the_file(tmp_path):
    """vae-cf-pytorch: `data = naive_sparse2tensor(train_data[idxlist[s:e]]).to(device)` every step, with
    `def naive_sparse2tensor(data): return torch.FloatTensor(data.toarray())`: shuffled rows of a host
    scipy matrix densified and copied to the device by a helper."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        def naive_sparse2tensor(data):
            return torch.FloatTensor(data.toarray())
        def train():
            np.random.shuffle(idxlist)
            for start in range(0, N, 500):
                data = train_data[idxlist[start:start + 500]]
                data = naive_sparse2tensor(data).to(device)
                loss = model(data).sum()
                optimizer.zero_grad(); loss.backward(); optimizer.step()
        for epoch in range(10):
            train()
        """)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [9] and got[9]["factory"] == "FloatTensor" and got[9]["host_data"] is True


def test_cpu_to_device_host_batch_through_a_parameter_from_lists_filled_by_a_draw(tmp_path):
    """cyoon1729's DQN: `update` passes `self.replay_buffer.sample(batch_size)` to `compute_loss(self,
    batch)`, which unpacks it and copies each part with `torch.FloatTensor(states).to(self.device)`;
    BasicBuffer.sample (common/replay_buffers.py) fills `state_batch = []` with `state_batch.append(state)`
    for each `experience` of `random.sample(self.buffer, n)`. PrioritizedBuffer.sample beside it returns
    another shape; the run's cProfile says which of the two its steps called (`functions_called`),
    whatever order the files are read in. `push`'s own `experience` is not the sample loop's."""
    (tmp_path / "replay_buffers.py").write_text(textwrap.dedent("""\
        import random
        class BasicBuffer:
            def push(self, state, action):
                experience = (state, action)
                self.buffer.append(experience)
            def sample(self, batch_size):
                state_batch = []
                action_batch = []
                batch = random.sample(self.buffer, batch_size)
                for experience in batch:
                    state, action = experience
                    state_batch.append(state)
                    action_batch.append(action)
                return (state_batch, action_batch)
        class PrioritizedBuffer:
            def sample(self, batch_size):
                return (self.tree.states, self.tree.actions), self.idx, self.weights
        """))
    (tmp_path / "dqn.py").write_text(textwrap.dedent("""\
        import torch
        class DQNAgent:
            def get_action(self, state):
                state = torch.FloatTensor(state).unsqueeze(0).to(self.device)
                return self.model(state).argmax()
            def compute_loss(self, batch):
                states, actions = batch
                states = torch.FloatTensor(states).to(self.device)
                actions = torch.LongTensor(actions).to(self.device)
                return (self.model(states).gather(1, actions.unsqueeze(1)) - 1).pow(2).mean()
            def update(self, batch_size):
                batch = self.replay_buffer.sample(batch_size)
                loss = self.compute_loss(batch)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        """))
    files = [tmp_path / "dqn.py", tmp_path / "replay_buffers.py"]
    called = {str(tmp_path / "dqn.py"): frozenset({3, 6, 11}), str(tmp_path / "replay_buffers.py"): frozenset({6})}
    facts = Facts()
    analyse_files(files, facts, functions_called=called)
    got = by_line(facts, "cpu_to_device")
    assert sorted(got) == [8, 9] and got[8]["host_data"] is True
    unrun = Facts()  # without the run, both buffers' `sample` could be the one: not every return is a draw
    analyse_files(files, unrun)
    assert by_line(unrun, "cpu_to_device") == {}


def test_dataloader_drawn_by_a_loop_of_another_file_that_moves_it_to_cuda(tmp_path):
    """aaron-xichen/pytorch-playground, HobbitLong/RepDistiller: a helper module builds the loaders
    (`**kwargs` from its caller) and returns them; the training loop of another file iterates one and
    moves its batch with `.cuda()` only when CUDA is available, which a CPU run never executes. No name
    links the loop to the construction: the run's draw sites do (`loader_draws`), and the loop's move
    makes the loader `feeds_cuda`. With no `pin_memory` anywhere in the files, torch's default (False)
    is the CUDA path's value too."""
    helper = tmp_path / "dataset.py"
    helper.write_text(textwrap.dedent("""\
        import torch
        def get(batch_size, **kwargs):
            kwargs.setdefault('num_workers', 1)
            train_loader = torch.utils.data.DataLoader(
                make_set(), batch_size=batch_size, shuffle=True, **kwargs)
            return train_loader
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch
        import dataset
        cuda = torch.cuda.is_available()
        train_loader = dataset.get(batch_size=64, num_workers=1)
        for epoch in range(10):
            for batch_idx, (data, target) in enumerate(train_loader):
                if cuda:
                    data, target = data.cuda(), target.cuda()
                optimizer.zero_grad()
                loss = model(data).sum()
                loss.backward()
                optimizer.step()
        """))
    key = f"{helper}:4"
    facts = Facts()
    analyse_files([helper, train], facts, loader_draws={key: [(str(train), 6)]})
    got = by_line(facts, "dataloader")[4]
    assert got["feeds_cuda"] is True and got["non_blocking"] is False
    assert got["pin_memory_on_cuda"] is False
    # the run saw the loader pin its batches (a config file's "pin_memory": true, the PD002 config
    # sample): no file sets it apart for CUDA, so the CUDA path pins too
    seen = Facts()
    seen.subject("dataloader", key).add("dataloader.pin_memory", True, "", "run")
    analyse_files([helper, train], seen, loader_draws={key: [(str(train), 6)]})
    assert by_line(seen, "dataloader")[4]["pin_memory_on_cuda"] is True
    # without the run's draw sites nothing links them; a draw at a line whose loop moves nothing says nothing
    for draws in (None, {key: [(str(train), 3)]}):
        other = Facts()
        analyse_files([helper, train], other, loader_draws=draws)
        assert "feeds_cuda" not in by_line(other, "dataloader")[4]
    # a file that names pin_memory (set on some path the source may not say) leaves it unknown
    train.write_text(train.read_text().replace("num_workers=1)", "num_workers=1, pin_memory=cuda)"))
    named = Facts()
    analyse_files([helper, train], named, loader_draws={key: [(str(train), 6)]})
    assert "pin_memory_on_cuda" not in by_line(named, "dataloader")[4]


def test_dataloader_drawn_by_a_loop_that_hands_the_batch_to_a_step_method(tmp_path):
    """yihong-chen/neural-collaborative-filtering: the loop draws the batch and hands its parts to
    `self.train_single_batch(user, item, rating)`, whose body moves them with `.cuda()` when the config
    says so (never on a CPU run). The move one call deep is the loop's: the loader feeds CUDA. A method
    that moves only its other parameters says nothing."""
    data = tmp_path / "data.py"
    data.write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader
        def make_loader(dataset, batch_size):
            return DataLoader(dataset, batch_size=batch_size, shuffle=True)
        """))
    engine = tmp_path / "engine.py"
    source = """\
        class Engine:
            def train_single_batch(self, users, items, ratings, scale=1.0):
                if self.config['use_cuda'] is True:
                    users, items, ratings = users.cuda(), items.cuda(), ratings.cuda()
                self.opt.zero_grad()
                loss = self.crit(self.model(users, items).view(-1), ratings) * scale
                loss.backward()
                self.opt.step()
                return loss.item()
            def train_an_epoch(self, train_loader):
                for batch_id, batch in enumerate(train_loader):
                    user, item, rating = batch[0], batch[1], batch[2]
                    rating = rating.float()
                    loss = self.train_single_batch(user, item, rating)
        """
    engine.write_text(textwrap.dedent(source))
    key = f"{data}:3"
    facts = Facts()
    analyse_files([data, engine], facts, loader_draws={key: [(str(engine), 11)]})
    got = by_line(facts, "dataloader")[3]
    assert got["feeds_cuda"] is True and got["non_blocking"] is False
    assert got["pin_memory_on_cuda"] is False
    # the method moves only a parameter the loop gives no batch to
    engine.write_text(textwrap.dedent(source).replace(
        "users, items, ratings = users.cuda(), items.cuda(), ratings.cuda()", "scale = scale.cuda()"))
    other = Facts()
    analyse_files([data, engine], other, loader_draws={key: [(str(engine), 11)]})
    assert "feeds_cuda" not in by_line(other, "dataloader")[3]


def test_dataloader_drawn_by_a_loop_that_hands_a_part_of_the_batch_to_a_step_method(tmp_path):
    """EmilienDupont/wgan-gp: the loop hands `data[0]` (the images of an (images, labels) batch) to
    `self._critic_train_iteration(data[0])`, whose body moves it with `.cuda()` under `if self.use_cuda`.
    A fixed part of the batch is still the batch; a computed argument is not."""
    data = tmp_path / "dataloaders.py"
    data.write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader
        def get_loaders(train_data, batch_size):
            return DataLoader(train_data, batch_size=batch_size, shuffle=True)
        """))
    training = tmp_path / "training.py"
    source = """\
        class Trainer:
            def _critic_train_iteration(self, data):
                if self.use_cuda:
                    data = data.cuda()
                loss = self.D(data).mean()
                loss.backward()
                self.D_opt.step()
            def _train_epoch(self, data_loader):
                for i, data in enumerate(data_loader):
                    self.num_steps += 1
                    self._critic_train_iteration(data[0])
        """
    training.write_text(textwrap.dedent(source))
    key = f"{data}:3"
    facts = Facts()
    analyse_files([data, training], facts, loader_draws={key: [(str(training), 9)]})
    got = by_line(facts, "dataloader")[3]
    assert got["feeds_cuda"] is True and got["non_blocking"] is False
    # a computed argument hands on something else
    training.write_text(textwrap.dedent(source).replace("(data[0])", "(data[0] * 2)"))
    other = Facts()
    analyse_files([data, training], other, loader_draws={key: [(str(training), 9)]})
    assert "feeds_cuda" not in by_line(other, "dataloader")[3]


def test_dataloader_literal_kwargs_and_feeds_cuda(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        def main(args):
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=64, shuffle=True,
                                num_workers=2, pin_memory=True, persistent_workers=True)
            for epoch in range(3):
                for i, (x, y) in enumerate(loader):
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        """)
    assert by_line(facts, "dataloader") == {6: {
        "batch_size": 64, "num_workers": 2, "pin_memory": True, "persistent_workers": True,
        "kwargs_style": "literal", "feeds_cuda": True, "non_blocking": True,
        "pin_memory_on_cuda": True, "num_workers_on_cuda": 2}}


def test_dataloader_defaults_positional_and_blocking(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch.utils.data as tud

        loader = tud.DataLoader(ds, 32, True)
        for batch in loader:
            inputs = batch["x"]
            inputs = inputs.cuda()
            labels = {k: v.to(device) for k, v in batch.items()}
        """)
    assert by_line(facts, "dataloader") == {3: {
        "batch_size": 32, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
        "kwargs_style": "literal", "feeds_cuda": True, "non_blocking": False,
        "pin_memory_on_cuda": False, "num_workers_on_cuda": 0}}


def test_dataloader_dict_and_mixed_kwargs_leave_unknowns_absent(tmp_path):
    facts, _ = analyse(tmp_path, """\
        from torch.utils.data import DataLoader

        a = DataLoader(ds, **cfg)
        b = DataLoader(ds, batch_size=8, num_workers=args.workers, **cfg)
        c = DataLoader(ds, num_workers=args.workers)
        """)
    got = by_line(facts, "dataloader")
    assert got[3] == {"kwargs_style": "dict"}
    assert got[4] == {"kwargs_style": "mixed", "batch_size": 8}
    # a non-literal value is absent; the others take the documented defaults
    assert got[5] == {"kwargs_style": "literal", "pin_memory": False, "persistent_workers": False,
                      "pin_memory_on_cuda": False}


def test_dataloader_batches_through_a_progress_bar_bound_to_a_name(tmp_path):
    """SRGAN: `train_bar = tqdm(train_loader)`, `for data, target in train_bar:`, then
    `real_img = target` and `real_img.float().cuda()`: the loader's batches go to the GPU. A count
    of the loader (`n = len(loader)`) is no batch."""
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader
        from tqdm import tqdm

        train_loader = DataLoader(ds, batch_size=64)
        other = DataLoader(ds2)
        for epoch in range(3):
            train_bar = tqdm(enumerate(train_loader))
            for i, (data, target) in train_bar:
                real_img = target
                if torch.cuda.is_available():
                    real_img = real_img.float().cuda()
            n = len(other)
            for k in range(n):
                z = torch.randn(4).cuda()
        """)
    got = by_line(facts, "dataloader")
    assert got[5]["feeds_cuda"] is True and got[5]["non_blocking"] is False
    assert "feeds_cuda" not in got[6]


def test_dataloader_batches_through_variable_and_dtype_methods(tmp_path):
    """VDSR: the loader goes to `train(loader, ...)`, whose loop wraps the batch in `Variable(...)` (an
    identity since torch 0.4) and moves it with `.cuda()` only under `if opt.cuda:`: the loader feeds
    CUDA on the script's GPU path. `x.float()` is the batch too; a model's output is not."""
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.autograd import Variable
        from torch.utils.data import DataLoader

        def train(training_data_loader, model):
            for iteration, batch in enumerate(training_data_loader, 1):
                input, target = Variable(batch[0]), Variable(batch[1], requires_grad=False)
                if opt.cuda:
                    input = input.cuda()

        def other(loader, model):
            for x, y in loader:
                x = x.float()
                out = Variable(model(x)).cuda()

        def main():
            training_data_loader = DataLoader(ds, batch_size=128)
            train(training_data_loader, model)
            plain = DataLoader(ds2)
            other(plain, model)
        """)
    got = by_line(facts, "dataloader")
    assert got[17]["feeds_cuda"] is True and got[17]["non_blocking"] is False
    assert "feeds_cuda" not in got[19]


def test_dataloader_no_feeds_cuda_without_a_device_move(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(ds)
        other = DataLoader(ds2)
        for x, y in loader:
            x = x.to(torch.float16)
            y = y.to("cpu")
            out = model(x).cuda()
        for x, y in other:
            step(x, y)
        """)
    got = by_line(facts, "dataloader")
    assert "feeds_cuda" not in got[4] and "non_blocking" not in got[4]
    assert "feeds_cuda" not in got[5]


def test_dataloader_local_name_matches_only_its_function(tmp_path):
    facts, _ = analyse(tmp_path, """\
        from torch.utils.data import DataLoader

        def make():
            loader = DataLoader(ds)
            return loader

        def train(loader):
            for x in loader:
                x.cuda()
        """)
    assert "feeds_cuda" not in by_line(facts, "dataloader")[4]


# -- loss_holder -----------------------------------------------------------------------------
def test_loss_holders(tmp_path):
    facts, _ = analyse(tmp_path, """\
        history, running = [], 0.0
        for step, (x, y) in enumerate(loader):
            out = model(x)
            loss = criterion(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(loss)
            running += loss * x.size(0)
            total = total + loss
            meter.update(loss, x.size(0))
            self.losses.append(loss)
        """)
    assert by_line(facts, "loss_holder") == {
        8: {"kind": "list", "holder": "history", "tensor_name": "loss"},
        9: {"kind": "running-sum", "holder": "running", "tensor_name": "loss"},
        10: {"kind": "running-sum", "holder": "total", "tensor_name": "loss"},
        11: {"kind": "attribute", "holder": "meter", "tensor_name": "loss"},
        12: {"kind": "list", "holder": "self.losses", "tensor_name": "loss"},
    }


def test_loss_holder_negatives(tmp_path):
    facts, _ = analyse(tmp_path, """\
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            history.append(loss.item())
            running += loss.detach()
            total += float(loss)
            writer.add_scalar("loss", loss, step)
            print(loss)
            loss = loss.item()
            later.append(loss)
        for x, y in val_loader:  # no backward: not a training loop
            val_loss = criterion(model(x), y)
            val_history.append(val_loss)
        for chunk in chunks:
            part = criterion(model(chunk))
            acc += part  # the sum is what is backward-ed
        acc.backward()
        """)
    assert by_line(facts, "loss_holder") == {}


def test_loss_holder_scaled_backward(tmp_path):
    facts, _ = analyse(tmp_path, """\
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            losses.append(loss)
        """)
    assert by_line(facts, "loss_holder") == {5: {"kind": "list", "holder": "losses", "tensor_name": "loss"}}


# -- global facts, robustness ----------------------------------------------------------------
def test_targets_cuda(tmp_path):
    facts, _ = analyse(tmp_path, "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n")
    assert facts.value("script.targets_cuda") is True
    assert facts.get("script.targets_cuda").source == "static"
    facts, _ = analyse(tmp_path, "import torch\nmodel = Net().cuda()\n", "b.py")
    assert facts.value("script.targets_cuda") is True
    facts, _ = analyse(tmp_path, "import torch\ndevice = torch.device('cpu')\nprint('no cuda here')\n", "c.py")
    assert facts.value("script.targets_cuda") is False


def test_targets_cuda_by_device_selection(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        use_accel = not args.no_accel and torch.accelerator.is_available()
        device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
        """)
    assert facts.value("script.targets_cuda") is True
    facts, _ = analyse(tmp_path, "import torch\nx = torch.zeros(3, device='cpu')\n")
    assert facts.value("script.targets_cuda") is False


def test_targets_cuda_by_a_transformers_trainer(tmp_path):
    # Stanford Alpaca's train.py: the Trainer picks CUDA through its TrainingArguments (from the command line)
    facts, _ = analyse(tmp_path, """\
        import transformers
        from transformers import Trainer
        trainer = Trainer(model=model, tokenizer=tokenizer, args=training_args, **data_module)
        trainer.train()
        """)
    assert facts.value("script.targets_cuda") is True
    facts, _ = analyse(tmp_path, """\
        import transformers
        args = transformers.TrainingArguments(output_dir="out", use_cpu=True)
        """, "cpu.py")
    assert facts.value("script.targets_cuda") is False


def test_a_lightning_accelerator_chosen_by_cuda_availability_feeds_cuda(tmp_path):
    # lightly's examples/pytorch_lightning/mae.py: the loader goes to trainer.fit, the accelerator is
    # "gpu" wherever CUDA is available
    facts, _ = analyse(tmp_path, """\
        import pytorch_lightning as pl
        import torch
        dataloader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=True, num_workers=8)
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
        trainer = pl.Trainer(max_epochs=10, devices=1, accelerator=accelerator)
        trainer.fit(model=model, train_dataloaders=dataloader)
        """)
    (s,) = facts.of_kind("dataloader")
    assert s.facts["dataloader.feeds_cuda"].value is True
    # a device the file does not spell out stays unknown: no feeds_cuda
    facts, _ = analyse(tmp_path, """\
        import pytorch_lightning as pl
        import torch
        dataloader = torch.utils.data.DataLoader(dataset, batch_size=256)
        trainer = pl.Trainer(accelerator=args.accelerator)
        trainer.fit(model=model, train_dataloaders=dataloader)
        """, "b.py")
    (s,) = facts.of_kind("dataloader")
    assert "dataloader.feeds_cuda" not in s.facts


def test_targets_cuda_is_the_union_over_the_files(tmp_path):
    plain = tmp_path / "data.py"
    plain.write_text("import torch\nx = torch.zeros(3)\n")
    cuda = tmp_path / "train.py"
    cuda.write_text("import torch\nmodel = Net().to('cuda')\n")
    for paths in ([plain, cuda], [cuda, plain], [plain, plain]):
        facts = Facts()
        analyse_files(paths, facts)
        assert facts.value("script.targets_cuda") is (cuda in paths)
        assert facts.get("script.targets_cuda").detail == (
            "the files name a CUDA device" if cuda in paths else "no CUDA device named in the files")


def test_every_detector_module_is_listed():
    import pkgutil

    import perfdoctor.facts.static as static

    # batch_source reads every file's index at once, after the detectors (`analyse_files`)
    modules = {m.name for m in pkgutil.iter_modules(static.__path__)} - {"index", "batch_source"}
    assert {d.__module__.rsplit(".", 1)[1] for d in static.DETECTORS} == modules


def test_bad_files_are_skipped(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    torch.cuda.empty_cache()\n")
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"import torch\nname = '\xe9t\xe9'\ntorch.cuda.empty_cache()\n")
    declared = tmp_path / "declared.py"
    declared.write_bytes(b"# -*- coding: latin-1 -*-\nimport torch\nname = '\xe9t\xe9'\n"
                         b"for i in r:\n    torch.cuda.empty_cache()\n")
    facts = Facts()
    analyse_files([bad, latin, tmp_path / "missing.py", tmp_path, declared], facts)
    subjects = facts.of_kind("empty_cache")
    assert [s.key for s in subjects] == [f"{declared.resolve()}:5"]
    assert subjects[0].facts["empty_cache.in_loop"].value is True
    facts = Facts()
    analyse_files([bad], facts)
    assert "script.targets_cuda" not in facts  # nothing read: not measured


def test_static_never_overwrites_other_sources(tmp_path):
    path = tmp_path / "t.py"
    path.write_text("from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=0)\n")
    facts = Facts()
    s = facts.subject("dataloader", f"{path.resolve()}:2")
    s.add("num_workers", 8, source="run")
    facts.add("script.targets_cuda", True, source="run")
    analyse_files([path], facts)
    assert s.facts["dataloader.num_workers"].value == 8
    assert s.facts["dataloader.num_workers"].source == "run"
    assert s.facts["dataloader.pin_memory"].source == "static"
    assert facts.value("script.targets_cuda") is True
    assert len(facts.of_kind("dataloader")) == 1


def test_dataloader_passed_to_a_train_function(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch

        def train(args, model, device, train_loader, optimizer):
            for batch_idx, (data, target) in enumerate(train_loader):
                data, target = data.to(device), target.to(device)

        def evaluate(model, loader):
            for data, target in loader:
                data = data.float()

        def main():
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            kwargs = {"batch_size": 64}
            train_loader = torch.utils.data.DataLoader(ds, **kwargs)
            test_loader = torch.utils.data.DataLoader(ds, batch_size=1000)
            for epoch in range(3):
                train(args, model, device, train_loader, optimizer)
                evaluate(model, loader=test_loader)
        """)
    got = by_line(facts, "dataloader")
    # the kwargs dict never gets pin_memory: False on the GPU too
    assert got[14] == {"kwargs_style": "dict", "feeds_cuda": True, "non_blocking": False, "pin_memory_on_cuda": False,
                       "num_workers_on_cuda": 0}
    assert "feeds_cuda" not in got[15]


# -- values on the device the script targets ----------------------------------------------------
def test_pin_memory_on_cuda_reads_conditional_values(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        def main(args, ds):
            use_cuda = not args.no_cuda and torch.cuda.is_available()
            device = torch.device("cuda" if use_cuda else "cpu")
            train_kwargs = {'batch_size': 64}
            if use_cuda:
                cuda_kwargs = {'num_workers': 1, 'pin_memory': True, 'shuffle': True}
                train_kwargs.update(cuda_kwargs)
            a = DataLoader(ds, **train_kwargs)
            b = DataLoader(ds, pin_memory=use_cuda)
            c = DataLoader(ds, pin_memory=torch.cuda.is_available())
            d = DataLoader(ds, pin_memory=(device.type == "cuda"))
            e = DataLoader(ds, batch_size=3)
            f = DataLoader(ds, pin_memory=False)
            kw = {'num_workers': 1, 'pin_memory': True} if use_cuda else {}
            g = DataLoader(ds, **kw)
            h = DataLoader(ds, pin_memory=args.device != "cpu")
            cpu_kwargs = {}
            if not use_cuda:
                cpu_kwargs.update({'pin_memory': True})
            i = DataLoader(ds, **cpu_kwargs)
            j = DataLoader(ds, **args.loader_kwargs)
            k = DataLoader(ds, pin_memory=args.pin)
        """)
    got = {line: v.get("pin_memory_on_cuda") for line, v in by_line(facts, "dataloader").items()}
    assert got == {11: True, 12: True, 13: True, 14: True, 15: False, 16: False, 18: True, 19: True,
                   23: False, 24: None, 25: None}


def test_pin_memory_on_cuda_unknown_guard_stays_absent(tmp_path):
    facts, _ = analyse(tmp_path, """\
        from torch.utils.data import DataLoader
        kwargs = {}
        if args.fast:
            kwargs["pin_memory"] = True
        loader = DataLoader(ds, **kwargs)
        """)
    assert "pin_memory_on_cuda" not in by_line(facts, "dataloader")[5]


def test_host_reads_in_the_training_step(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch

        def train(model, loader, opt):
            total = 0
            for i, (x, y) in enumerate(loader):
                loss = model(x, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item()
                acc = (model(x).argmax(1) == y).float().mean().cpu().numpy()
                print("loss", loss)
                if i % 100 == 0:
                    print(loss.item())
                lv = float(loss)
                lr = float(args.lr)

        def test(model, loader):
            with torch.no_grad():
                for x, y in loader:
                    correct = model(x).eq(y).sum().item()

        def step(model, x):
            loss = model(x)
            loss.backward()
            return loss.item()

        for x in data:
            step(model, x)

        for epoch in range(3):
            train(model, loader, opt)
            sample = model.decode(z).cpu()
        """)
    got = by_line(facts, "host_read")
    assert got == {10: {"kind": "item", "in_loop": True}, 11: {"kind": "cpu", "in_loop": True},
                   12: {"kind": "print", "in_loop": True}, 15: {"kind": "float", "in_loop": True},
                   26: {"kind": "item", "in_loop": True},
                   14: {"kind": "item, print", "in_loop": False},  # every 100 steps: the run's count is not trusted
                   33: {"kind": "cpu", "in_loop": False}}  # the epoch loop's own body: once per epoch


def test_host_reads_of_values_already_on_the_host_are_no_sync(tmp_path):
    """The sync is the `.cpu()`, counted once at its line: a later read of what it returned (or of a
    `.numpy()` array, of a number from `.item()`) is no device read, whatever the CPU run counts."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np

        def train(model, loader, opt, device):
            total = 0
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                out = model(x)
                loss = out.sum()
                loss.backward()
                opt.step()
                total += loss.item()
                preds = out.argmax(1).cpu()
                hits = (preds == y.cpu()).sum().item()
                right = (preds == 3).sum().item()
                arr = out.detach().cpu().numpy()
                top = arr.tolist()
                v = loss.detach().cpu().item()
                lv = float(total)
                w = (out * 2).sum().item()

        def top1(out, labels):
            preds = out.argmax(1).cpu()
            return (preds == labels).float().mean().item()
        """)
    got = by_line(facts, "host_read")
    assert got[23] == {"kind": "item", "in_loop": False}  # a metric helper's read of a host tensor
    assert got[11] == {"kind": "item", "in_loop": True}
    assert got[12] == {"kind": "cpu", "in_loop": True}  # the transfer: the one sync
    assert got[13] == {"kind": "cpu", "in_loop": True}  # y.cpu() is a sync, the .item() of the host result not
    assert got[14] == {"kind": "item", "in_loop": False}  # preds is on the host
    assert got[15] == {"kind": "cpu", "in_loop": True}  # .numpy() of the .cpu() result: one read
    assert got[16] == {"kind": "tolist", "in_loop": False}  # a numpy array's list
    assert got[17] == {"kind": "cpu", "in_loop": True}
    assert got[18] == {"kind": "float", "in_loop": False}  # a Python number
    assert got[19] == {"kind": "item", "in_loop": True}  # a device tensor times a number stays on the device


def test_uses_amp_counts_autocast_on_any_path(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from contextlib import nullcontext
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
        """)
    assert facts.value("script.uses_amp") is True
    facts, _ = analyse(tmp_path, "import torch\nmodel = Net().cuda()\nout = model(x)\n")
    assert facts.value("script.uses_amp") is False
    facts, _ = analyse(tmp_path, "import lightning as L\ntrainer = L.Trainer(precision='bf16-mixed')\n")
    assert facts.value("script.uses_amp") is True


@pytest.mark.parametrize("enabled,uses", [
    ("amp", False),  # Pytorch-UNet: `--amp`, off by default; the run shows whether it was on
    ("args.amp", False),
    ("not args.fp32", True),  # on unless --fp32 is given
    ("not args.noamp", True),  # a ViT trainer's `use_amp = not args.noamp`: on by default
    ("device.type == 'cuda'", True),  # a device test: on for the GPU the script targets
    ("use_amp", True),  # bound below to a device test
    ("torch.cuda.is_available()", True),
])
def test_uses_amp_switched_by_a_setting(tmp_path, enabled, uses):
    facts, _ = analyse(tmp_path, f"""\
        import torch
        use_amp = args.amp and torch.cuda.is_available()
        with torch.autocast(device.type, enabled={enabled}):
            out = model(x)
        scaler = torch.cuda.amp.GradScaler(enabled={enabled})
        """)
    assert facts.value("script.uses_amp") is uses


@pytest.mark.parametrize("src,uses", [
    # timm's train.py: autocast built only under `--amp` (off by default), handed on through partial
    ("amp_autocast = suppress\nif args.amp:\n    amp_autocast = partial(torch.autocast, device_type=device.type)\n", False),
    ("amp_autocast = partial(torch.autocast, device_type='cuda')\n", True),  # built on every path
    ("amp_autocast = partial(torch.autocast, device_type='cuda', enabled=args.amp)\n", False),
    ("if use_amp == 'native':\n    ctx = torch.autocast('cuda')\n", False),  # use_amp bound to constants below
    ("if device.type == 'cuda':\n    ctx = torch.autocast('cuda')\n", True),  # a device test: on for its GPU
    ("if args.fp16:\n    ctx = torch.autocast('cuda')\n", True),  # --fp16 defaults to on (below)
    ("if args.amp:\n    ctx = nullcontext()\nelse:\n    ctx = torch.autocast('cuda')\n", True),  # the default branch
    ("if not args.amp:\n    ctx = nullcontext()\nelse:\n    ctx = torch.autocast('cuda')\n", False),
    ("amp = False\nif amp:\n    ctx = torch.autocast('cuda')\n", False),  # a constant setting, off
    ("amp = True\nif amp:\n    ctx = torch.autocast('cuda')\n", True),
    # Transformer-XL: `if args.fp16: model = model.half()`, --fp16 a store_true; a .half() on every path
    ("if args.amp:\n    model = model.half()\n", False),
    ("model = model.half()\n", True),
    ("if args.fp16:\n    model = model.half()\n", True),  # --fp16 defaults to on (below)
    ("if args.amp:\n    trainer = L.Trainer(precision='16-mixed')\n", False),
    # an fp32 island inside low-precision code (timm's fast_norm), and a scaler class nobody builds
    ("with torch.amp.autocast(device_type=x.device.type, enabled=False):\n    y = f(x)\n"
     "class NativeScaler:\n    def __init__(self):\n        self.s = torch.amp.GradScaler()\n", False),
])
def test_uses_amp_only_where_on_by_default(tmp_path, src, uses):
    head = ("import torch\nfrom functools import partial\nfrom contextlib import suppress\nimport argparse\n"
            "p = argparse.ArgumentParser()\np.add_argument('--amp', action='store_true')\n"
            "p.add_argument('--fp16', default=True)\nuse_amp = None\nuse_amp = 'native'\n")
    facts, _ = analyse(tmp_path, head + src)
    assert facts.value("script.uses_amp") is uses


def test_eval_forward_without_no_grad(tmp_path):
    facts, _ = analyse(tmp_path, """
import torch

def evaluate(model, x):
    model.eval()
    out = model(x)
    with torch.no_grad():
        again = model(x)
    model.train()
    return out, again

@torch.no_grad()
def evaluate_quiet(model, x):
    model.eval()
    return model(x)

def frozen_bn_step(model, x, opt):
    model.eval()
    model(x).sum().backward()
    opt.step()

def called_under_no_grad(model, x):
    model.eval()
    return model(x)

def never_called(model, x):
    model.eval()
    return model(x)

for x in data:
    evaluate(net, x)
    evaluate_quiet(net, x)
    frozen_bn_step(net, x, opt)
    with torch.no_grad():
        called_under_no_grad(net, x)
""")
    subs = facts.of_kind("eval_grad")
    assert [(s.locations[0].line, s.facts["eval_grad.in_source"].value) for s in subs] == [(6, True)]


def test_eval_mode_follows_the_source_order_loops_and_callers(tmp_path):
    """Where a model is in eval mode is the last `.eval()` / `.train(False)` / `.train()` of it before
    the call, in a function, at the script's top level, or in the caller that passed it; a backward
    stops an evaluation only where it can run through its graph (in the same loop, or after it), not
    where it is the training loop's own beside the evaluation loop in one `main()`. A helper the
    training step calls too (SR-GNN's `forward(model, i, data)`) is judged at the evaluation's call of it,
    where no_grad can go. An evaluation counts where it recurs beside the training (a loop around it, or
    around a call of its function, trains): a test once after training costs the steps nothing."""
    facts, _ = analyse(tmp_path, """\
        import torch
        def main(model, opt, D, G):
            for epoch in range(10):
                model.train()
                for x, y in train_loader:
                    loss = crit(model(x), y)
                    opt.zero_grad(); loss.backward(); opt.step()
                model.eval()
                for i in range(0, len(X), 64):
                    out = model(X[i:i + 64])
                D.eval()
                for z in noise:
                    G(z); g_loss = -D(G(z)).mean()
                    g_loss.backward()
        def gathered(d, chunks):
            d.train(False)
            outs = [d(x) for x in chunks]
            sum(outs).backward()
        def test(net, loader):
            return [net(x).argmax(1) for x, y in loader]
        def score(m, x):
            m.train(False)
            return m(x)
        def shared(m, x):
            return m(x)
        def final(m, x):
            m.eval()
            return m(x)
        main(net, o, disc, gen)
        for epoch in range(3):
            gathered(net, xs)
            net.train(mode=False)
            test(net, test_loader)
            score(net, xs)
            for x in test_data:
                shared(net, x)
            net.train(True)
            for x, y in train_data:
                shared(net, x).sum().backward()
            net.eval()
            for x in test_data:
                pred = net(x)
        final(net, xs)
        for x in test_data:
            pred = net(x)
        """)
    assert sorted(by_line(facts, "eval_grad")) == [10, 20, 23, 36, 42]


def test_an_evaluation_beside_a_training_epoch_of_another_file_recurs(tmp_path):
    """The epoch loop calls `train_epoch` of utils.py, then its own `evaluate`: the loop trains through the
    other file's function, so the evaluation recurs beside the training; the test once after it does not."""
    (tmp_path / "utils.py").write_text(textwrap.dedent("""\
        def train_epoch(model, loader, opt):
            for x, y in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        from utils import train_epoch
        def evaluate(model, loader):
            model.eval()
            return [model(x) for x, y in loader]
        def test(model, loader):
            model.eval()
            return [model(x) for x, y in loader]
        for epoch in range(10):
            model.train()
            train_epoch(model, train_loader, opt)
            evaluate(model, val_loader)
        test(model, test_loader)
        """))
    facts = Facts()
    analyse_files([tmp_path / "main.py", tmp_path / "utils.py"], facts)
    assert sorted(by_line(facts, "eval_grad")) == [4]


def test_an_eval_forward_on_a_branch_the_run_did_not_take_is_left_to_the_run(tmp_path):
    """Torch-Pruning's `_trace`: `model.eval()`, then `model(**example_inputs)` for a dict of inputs and
    `model(*example_inputs)` otherwise. The run's probe watched the second line (an eval-mode call it
    judged once, before training); the first is a branch this configuration never takes, and the run's
    judgement of the evaluation it reached stands for the function. Without a run, both lines count."""
    source = """
import torch

def trace(model, example_inputs):
    model.eval()
    if isinstance(example_inputs, dict):
        out = model(**example_inputs)
    else:
        out = model(*example_inputs)
    return out

for x in data:
    trace(net, x)
    net(x).sum().backward()
"""
    unrun, _ = analyse(tmp_path, source)
    assert sorted(by_line(unrun, "eval_grad")) == [7, 9]
    path = tmp_path / "train.py"
    facts = Facts()
    s = facts.subject("eval_grad", f"{path}:9")
    s.add("calls_per_step", 0.0, "count")
    analyse_files([path], facts)
    got = by_line(facts, "eval_grad")
    assert sorted(got) == [9]
    assert "in_source" not in got[9]


# -- how often a line runs: every training step, once per epoch, every N steps ------------------
def test_cpu_tensor_made_every_step_or_once_per_epoch(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch

        class RNN(torch.nn.Module):
            def forward(self, x):
                h0 = torch.zeros(2, x.size(0), 8).to(x.device)
                return self.lstm(x, h0)

        def draw(n):
            return torch.randn(n, 4).cuda()

        def train(loader):
            for x, y in loader:
                loss = model(x.cuda(), y.cuda())
                loss.backward()
                opt.step()

        for epoch in range(10):
            state = torch.zeros(2, 16, 8).to(device)
            for i in range(0, 100, 10):
                noise = torch.randn(16, 4).to(device)
                z = draw(16)
                if i % 50 == 0:
                    grid = torch.randn(64, 4).to(device)
                loss = model(noise, state)
                loss.backward()
                opt.step()

        for epoch in range(3):
            train(loader)
            sample = torch.randn(64, 20).to(device)
        start = torch.zeros(1, 8).cuda()
        """)
    got = {line: f["in_loop"] for line, f in by_line(facts, "cpu_to_device").items()}
    # the forward and a helper of the step loop run every step; the epoch loop's own body (its inner
    # loop takes the steps), an epoch loop around train(), a periodic guard and module level do not
    assert got == {5: True, 9: True, 18: False, 20: True, 23: False, 30: False, 31: False}


def test_host_data_given_to_a_legacy_cuda_tensor_type(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        cuda = True if torch.cuda.is_available() else False
        Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor
        Plain = torch.FloatTensor

        def one_hot(y, n):
            out = np.zeros((y.shape[0], n))
            out[range(y.shape[0]), y] = 1.0
            return Tensor(out)

        for imgs, labels in loader:
            valid = Tensor(imgs.size(0), 1).fill_(1.0)
            z = Tensor(np.random.normal(0, 1, (imgs.shape[0], 16)))
            picked = np.random.randint(0, 10, imgs.shape[0])
            gen_labels = LongTensor(picked)
            codes = one_hot(picked, 10)
            cpu_only = Plain(np.zeros(3))
            loss = model(z, gen_labels, valid, codes)
            loss.backward()
            opt.step()
        """)
    got = by_line(facts, "cpu_to_device")
    # sizes allocate on the GPU (line 14) and a CPU type moves nothing (line 19)
    assert sorted(got) == [11, 15, 17]
    assert got[15] == {"factory": "cuda.FloatTensor", "target": "cuda", "in_loop": True}
    assert got[17]["factory"] == "cuda.LongTensor" and got[11]["in_loop"] is True


def test_dataloader_built_in_a_helper_and_kept_by_a_trainer_class(tmp_path):
    # pytorch/examples distributed/ddp-tutorial-series: the loader is returned by a helper, handed to a
    # Trainer class and iterated through the attribute its __init__ keeps it in
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        class Trainer:
            def __init__(self, model, train_data, gpu_id):
                self.train_data = train_data
                self.gpu_id = gpu_id

            def run_batch(self, source, targets):
                self.model(source).sum().backward()

            def run_epoch(self):
                for source, targets in self.train_data:
                    source = source.to(self.gpu_id)
                    self.run_batch(source, targets)

        def prepare_dataloader(dataset, batch_size):
            return DataLoader(dataset, batch_size=batch_size, pin_memory=True)

        def get_dataloaders(ds):
            train_dl = DataLoader(ds, shuffle=True)
            eval_dl = DataLoader(ds)
            return train_dl, eval_dl

        def main(ds, model, device):
            train_data = prepare_dataloader(ds, 32)
            Trainer(model, train_data, 0).run_epoch()
            train_dl, eval_dl = get_dataloaders(ds)
            for x, y in train_dl:
                x = x.to(device, non_blocking=True)
                model(x).sum().backward()
            unused = DataLoader(ds)
        """)
    got = by_line(facts, "dataloader")
    assert got[18]["feeds_cuda"] is True and got[18]["non_blocking"] is False and got[18]["trains"] is True
    assert got[21]["feeds_cuda"] is True and got[21]["non_blocking"] is True and got[21]["trains"] is True
    assert "feeds_cuda" not in got[22]  # returned beside the training loader, never iterated
    assert "feeds_cuda" not in got[32]


def test_loaders_of_a_helper_module_iterated_elsewhere_go_by_their_names(tmp_path):
    # huggingface/accelerate benchmarks/fp8/*/fp8_utils.py: the loaders are built, prepared and returned;
    # the loops are in the scripts that import them
    facts, _ = analyse(tmp_path, """\
        from torch.utils.data import DataLoader

        def get_dataloaders(ds):
            train_dataloader = DataLoader(ds["train"], shuffle=True)
            eval_dataloader = DataLoader(ds["validation"])
            val_loader = DataLoader(ds["validation"])
            return train_dataloader, eval_dataloader, val_loader

        def get_training_utilities(accelerator, ds):
            train_dataloader, eval_dataloader, val_loader = get_dataloaders(ds)
            return accelerator.prepare(train_dataloader, eval_dataloader, val_loader)
        """)
    got = by_line(facts, "dataloader")
    assert "trains" not in got[4] and got[5]["trains"] is False and got[6]["trains"] is False


def test_evaluation_loader_beside_the_training_one(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader
        Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor

        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)
        test_loader = DataLoader(test_ds, batch_size=64)
        gan_loader = DataLoader(gan_ds, batch_size=64)

        for epoch in range(5):
            for images, labels in train_loader:
                images, labels = images.to(device), labels.to(device)
                loss = criterion(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

        with torch.no_grad():
            for images, labels in test_loader:
                images = images.to(device)
                correct += (model(images).argmax(1) == labels.to(device)).sum()

        for imgs, _ in gan_loader:
            real = imgs.type(Tensor)
            d_loss = D(real).mean()
            d_loss.backward()
            optimizer_D.step()
        """)
    got = by_line(facts, "dataloader")
    assert got[5]["feeds_cuda"] is True and got[5]["trains"] is True
    assert got[6]["feeds_cuda"] is True and got[6]["trains"] is False
    assert got[7]["feeds_cuda"] is True and got[7]["trains"] is True  # .type(<CUDA type>) is a move


def test_loader_in_an_evaluation_function_and_next_iter_loops(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader

        def evaluate(model, ds):
            loader = DataLoader(ds, batch_size=100)
            for x, y in loader:
                x = x.to(model.device)
                hits = model.generate(x)

        class Trainer:
            def run(self):
                loader = DataLoader(self.ds, batch_size=32, pin_memory=True)
                it = iter(loader)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(loader)
                        batch = next(it)
                    batch = [t.to(self.device) for t in batch]
                    x, y = batch
                    loss = self.model(x, y)
                    loss.backward()
                    self.optimizer.step()
        """)
    got = by_line(facts, "dataloader")
    assert got[5]["trains"] is False  # no training loop in this file, but an evaluation function
    assert got[12]["feeds_cuda"] is True and got[12]["trains"] is True
    assert by_line(facts, "batch_copy") == {20: {"pinned": True, "non_blocking": False}}


def test_batch_copy_follows_pin_memory_on_the_cuda_path_and_skips_evaluation(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader
        use_cuda = torch.cuda.is_available()
        kwargs = {"batch_size": 64}
        if use_cuda:
            kwargs.update({"num_workers": 1, "pin_memory": True})
        train_loader = DataLoader(train_ds, **kwargs)
        val_loader = DataLoader(val_ds, pin_memory=use_cuda)

        def train():
            for data, target in train_loader:
                data, target = data.to(device), target.to(device)
                loss = model(data, target)
                loss.backward()
                optimizer.step()

        def validate():
            with torch.no_grad():
                for data, target in val_loader:
                    data = data.to(device)
                    acc = model(data).eq(target).sum()
        """)
    assert sorted(by_line(facts, "batch_copy")) == [12]


def test_batch_copy_skips_a_nested_loop_that_rebinds_the_batch_name(tmp_path):
    # HiFi-GAN: validation every N steps inside the training loop draws from another loader into the
    # same name `batch`; its move is the validation loader's (no training step), not the training one's
    facts, _ = analyse(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader
        train_loader = DataLoader(train_ds, batch_size=16, num_workers=4, pin_memory=True)
        validation_loader = DataLoader(valid_ds, batch_size=1, num_workers=1, pin_memory=True)
        for epoch in range(10):
            for i, batch in enumerate(train_loader):
                x, y = batch
                x = x.to(device, non_blocking=True)
                loss = model(x, y)
                loss.backward()
                optimizer.step()
                if i % 1000 == 0:
                    with torch.no_grad():
                        for j, batch in enumerate(validation_loader):
                            x, y = batch
                            y_hat = model(x.to(device))
        """)
    assert by_line(facts, "batch_copy") == {8: {"pinned": True, "non_blocking": True}}


def test_host_reads_less_often_than_every_step(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch

        class Meter:
            def __init__(self):
                self.val = 0
            def update(self, v):
                self.val = v
            def __str__(self):
                return "{val:.3f}".format(**self.__dict__)

        class Progress:
            def display(self, i):
                print("\t".join(str(m) for m in self.meters))

        for i, (imgs, labels) in enumerate(train_loader):
            onehot = np.eye(10)[labels.numpy()]
            imgs = imgs.to(device)
            out = model(imgs)
            loss = criterion(out, labels.to(device))
            meter.update(out.max())
            loss.backward()
            opt_d.step()
            if i % n_critic == 0:
                g_loss = G(imgs).mean()
                g_loss.backward()
                opt_g.step()
                history.append((loss.item(), g_loss.item()))
            if i % 10 == 0:
                progress.display(i)
        """)
    got = by_line(facts, "host_read")
    assert got[10]["in_loop"] is False  # __str__ of a meter the loop never prints on every step
    assert got[14]["in_loop"] is False  # display() is only called behind `if i % 10`
    assert got[17] == {"kind": "numpy", "in_loop": False}  # labels: a host batch tensor, never moved first
    assert got[28] == {"kind": "item", "in_loop": True}  # a guard that takes the generator's step: per step
    assert 21 not in got  # a device tensor kept in the meter: no read


def test_a_guard_whose_modulus_is_one_by_default_is_every_step(tmp_path):
    """srviest's char-CNN logs behind `if i_batch % args.log_interval == 0` with the option's default 1:
    every batch, as the run saw; so does `% 1`. A default of 10 is a periodic guard, whatever a run's
    command line gives (a short run's `--log-interval 1` is that run's, not the script's)."""
    source = """\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument('--log-interval', type=int, default=LOG)
        args = parser.parse_args()
        every = 1
        for i, (x, y) in enumerate(loader):
            loss = model(x.to(device)).mean()
            loss.backward()
            opt.step()
            if i % args.log_interval == 0:
                print(loss.item())
            if i % every == 0:
                print(loss.cpu())
            if i % 1 == 0:
                print(loss.tolist())
        """
    facts, _ = analyse(tmp_path, source.replace("LOG", "1"))
    got = by_line(facts, "host_read")
    assert got[11]["in_loop"] is True and got[15]["in_loop"] is True
    assert got[13]["in_loop"] is False  # a plain name is a setting a config may change (nanoGPT's)
    facts, _ = analyse(tmp_path, source.replace("LOG", "10"))
    assert by_line(facts, "host_read")[11]["in_loop"] is False


_EVAL_BESIDE_TRAINING = """\
    import torch

    def fit_one_epoch(net, batches, opt):
        for xb, yb in batches:
            opt.zero_grad()
            err = net(xb).sub(yb).pow(2).mean()
            err.backward()
            opt.step()
            running = err.item()
            log_grads(net)

    def log_grads(net):
        for p in net.parameters():
            norms.append(p.grad.norm().item())

    @torch.no_grad()
    def score(net, batches):
        hits = 0
        for xb, yb in batches:
            hits += (net(xb).argmax(1) == yb).sum().item()
            spread(net(xb))
        return hits

    def spread(out):
        return out.std().item()

    net = net.to("cuda")
    for epoch in range(5):
        fit_one_epoch(net, train_batches, opt)
        score(net, val_batches)
        for xb, yb in val_batches:
            val = net(xb).mean().item()
        for xb, yb in train_batches:
            loss = net(xb).mean()
            loss.backward()
            opt.step()
            seen = loss.item()
        last = loss.item()
    """


def test_host_reads_outside_the_training_step_are_not_per_step(tmp_path):
    facts, path = analyse(tmp_path, _EVAL_BESIDE_TRAINING)
    got = by_line(facts, "host_read")
    lines = textwrap.dedent(_EVAL_BESIDE_TRAINING).splitlines()
    at = {text: next(i for i, ln in enumerate(lines, 1) if text in ln)
          for text in ("running =", "norms.append", "hits +=", "out.std", "val =", "seen =", "last =")}
    # evaluation loops (a function of its own, a helper only it calls, one inline in the epoch
    # loop) and the epoch loop's own body: no training step runs them
    for text in ("hits +=", "out.std", "val =", "last ="):
        assert got[at[text]]["in_loop"] is False, text
    # the training loop, a training loop nested in the epoch loop, and the inner loop of a helper
    # the training loop calls: every step
    assert got[at["running ="]] == {"kind": "item", "in_loop": True}
    assert got[at["seen ="]] == {"kind": "item", "in_loop": True}
    assert got.get(at["norms.append"], {}).get("in_loop") is not False


def test_an_action_read_for_the_environment_is_no_per_step_sync(tmp_path):
    """cleanRL's DQN reads its action every environment step for `envs.step`: the environment runs on
    the host, the action must cross (the corpus labels cleanRL's PPO so). The loss read beside it is a
    step's sync."""
    facts, _ = analyse(tmp_path, """\
        import torch
        for global_step in range(1000):
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            obs2, r2, d2, t2, i2 = env2.step(policy(o).item())
            data = rb.sample(128)
            loss = F.mse_loss(q_network(data.obs), data.target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total = loss.item()
        """)
    got = by_line(facts, "host_read")
    assert got[4]["in_loop"] is False and got[6]["in_loop"] is False
    assert got[12] == {"kind": "item", "in_loop": True}


def test_an_action_returned_by_a_selection_helper_is_read_for_the_environment(tmp_path):
    """dongminlee94/deep_rl's A2C: `action = self.select_action(obs)` then `env.step(action)`; the
    helper returns `action.detach().cpu().numpy()` (TD3's binds it to a name first). The loss read of
    the update beside it is a step's sync."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        class Agent:
            def select_action(self, obs):
                action, _, log_pi = self.policy(obs)
                return action.detach().cpu().numpy()
            def noisy_action(self, obs):
                action = self.policy(obs).detach().cpu().numpy()
                return np.clip(action + 0.1, -1, 1)
            def train_model(self):
                loss = self.loss()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                self.losses.append(loss.item())
            def run(self):
                while True:
                    action = self.select_action(torch.Tensor(obs).to(self.device))
                    next_obs, reward, done, _ = self.env.step(action)
                    obs, r, d, i = self.env.step(self.noisy_action(next_obs))
                    self.train_model()
        """)
    got = by_line(facts, "host_read")
    assert got[5]["in_loop"] is False and got[7]["in_loop"] is False
    assert got[14]["in_loop"] is True


def test_an_action_from_a_model_object_s_method_is_read_for_the_environment(tmp_path):
    """gouxiangchen's dueling DQN: the module-level loop does `action =
    onlineQNetwork.select_action(tensor_state)` (a method of the network class, returning
    `action_index.item()`) then `env.step(action)`: read for the environment, not a step's sync."""
    facts, _ = analyse(tmp_path, """\
        import torch
        class QNetwork(torch.nn.Module):
            def select_action(self, state):
                with torch.no_grad():
                    action_index = torch.argmax(self.forward(state), dim=1)
                return action_index.item()
        net = QNetwork()
        for epoch in range(100):
            state = env.reset()
            for t in range(200):
                action = net.select_action(torch.FloatTensor(state).unsqueeze(0).to(device))
                state, reward, done, _ = env.step(action)
                loss = net(batch).sum()
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                writer.add_scalar("loss", loss.item())
        """)
    got = by_line(facts, "host_read")
    assert got[6]["in_loop"] is False and got[15]["in_loop"] is True


def test_an_action_from_an_agent_of_another_file_is_read_for_the_environment(tmp_path):
    """cyoon1729's DQN: common/utils.py's loop does `action = agent.get_action(state)` then
    `env.step(action)`; the agent in dqn.py returns `np.argmax(qvals.cpu().detach().numpy())` bound to
    a name. Read for the environment, not a step's sync; the update's `loss.item()` is not taken for one."""
    agent = tmp_path / "dqn.py"
    agent.write_text(textwrap.dedent("""\
        import numpy as np
        class DQNAgent:
            def get_action(self, state, eps=0.2):
                qvals = self.model.forward(state)
                action = np.argmax(qvals.cpu().detach().numpy())
                if np.random.randn() < eps:
                    return self.env.action_space.sample()
                return action
            def update(self, batch):
                loss = self.compute_loss(batch)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                return loss.item()
        """))
    loop = tmp_path / "utils.py"
    loop.write_text(textwrap.dedent("""\
        def mini_batch_train(env, agent, episodes, steps):
            for episode in range(episodes):
                state = env.reset()
                for step in range(steps):
                    action = agent.get_action(state)
                    next_state, reward, done, _ = env.step(action)
                    agent.update(32)
        """))
    facts = Facts()
    analyse_files([agent, loop], facts)
    got = {line: v for line, v in by_line(facts, "host_read").items()}
    assert got[5]["in_loop"] is False and got.get(14, {}).get("in_loop") is not False


def test_a_stall_in_an_environment_rollout_is_the_algorithm_s_work(tmp_path):
    """minimalRL's PPO: the optimizer steps come in bursts after each rollout of T_horizon env steps, and
    the run names the policy's forward inside the rollout loop as a stall every third step. The
    rollout is the algorithm's own work: `periodic_stall.rollout`, and no PD020. A checkpoint in the
    same script is a stall."""
    from perfdoctor.contracts.run import Site
    from perfdoctor.facts.model import site_subject
    from perfdoctor.rules.catalog import load_rules
    from perfdoctor.rules.engine import judge

    src = """\
        import torch
        def collect(env, model, s):
            for t in range(20):
                prob = model.pi(torch.from_numpy(s).float())
                s, r, done, truncated, info = env.step(prob.argmax().item())
            return s
        for n_epi in range(1000):
            while not done:
                for t in range(20):
                    prob = model.pi(torch.from_numpy(s).float())
                    s_prime, r, done, truncated, info = env.step(prob.argmax().item())
                model.train_net()
            s = collect(env, model, s)
            torch.save(model.state_dict(), "ckpt.pt")
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(src))
    facts = Facts()
    facts.add("step.time_ms", 3.0, "ms", "run")
    for line in (10, 13, 14):  # the policy's forward in the loop, the call of a stepping helper, the save
        s = site_subject(facts, "periodic_stall", Site(file=str(path), line=line, code=""))
        assert s is not None
        for name, value in (("period", 3), ("stalls", 5), ("extra_ms", 3.0), ("ms_per_step", 0.9), ("share", 0.75)):
            s.add(name, value, "", "run")
    analyse_files([path], facts)
    got = by_line(facts, "periodic_stall")
    assert got[10].get("rollout") is True and got[13].get("rollout") is True and "rollout" not in got[14]
    assert [f.locations[0].line for f in judge(facts, load_rules()) if f.rule == "PD020"] == [14]


def test_a_stall_at_a_line_that_runs_every_step_is_no_periodic_stall(tmp_path):
    """Issue 20: on a loaded 2-CPU host the run named `optimizer.step()` as a stall every few steps (the
    steps slowed there; the sampler saw it late in them only). A line on every step is no work done
    every N steps: `periodic_stall.every_step`, and no PD020. A save behind `if step % N`, behind an
    early `continue`, an evaluation after each epoch and one in an `except` are not on every step; the
    step loop's own header and a line in an inner loop over the parameters are."""
    from perfdoctor.contracts.run import Site
    from perfdoctor.facts.model import site_subject
    from perfdoctor.rules.catalog import load_rules
    from perfdoctor.rules.engine import judge

    src = """\
        import torch
        for epoch in range(10):
            for step, (x, y) in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                optimizer.step(
                    closure=None)
                for p in model.parameters():
                    p.grad = None
                if step % 25 == 0:
                    torch.save(model.state_dict(), "ckpt.pt")
                if step % 7:
                    continue
                log.flush()
                try:
                    sched.step()
                except RuntimeError:
                    log.write("x")
            evaluate(model)
        """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(src))
    facts = Facts()
    facts.add("step.time_ms", 3.0, "ms", "run")
    lines = (3, 6, 7, 9, 11, 14, 16, 18, 19)
    text = textwrap.dedent(src).splitlines()
    for line in lines:
        s = site_subject(facts, "periodic_stall", Site(file=str(path), line=line, code=text[line - 1].strip()))
        assert s is not None
        for name, value in (("period", 3), ("stalls", 5), ("extra_ms", 3.0), ("ms_per_step", 0.9), ("share", 0.75)):
            s.add(name, value, "", "run")
    analyse_files([path], facts)
    got = {line: by_line(facts, "periodic_stall")[line].get("every_step") for line in lines}
    assert got == {3: True, 6: True, 7: True, 9: True, 11: False, 14: False, 16: False, 18: False, 19: False}
    found = [loc.line for f in judge(facts, load_rules()) if f.rule == "PD020" for loc in f.locations]
    assert sorted(found) == [11, 14, 16, 18, 19]


def test_a_run_count_in_an_evaluation_loop_is_no_per_step_finding(tmp_path):
    """The probe counts an evaluation between epochs as reads per training step; the static read
    of the same line (one subject, keyed on file:line) says no training step runs it."""
    from perfdoctor.contracts.run import Site
    from perfdoctor.facts.model import site_subject
    from perfdoctor.rules.catalog import load_rules
    from perfdoctor.rules.engine import judge

    facts, path = analyse(tmp_path, _EVAL_BESIDE_TRAINING)
    facts.add("step.time_ms", 20.0, "ms", "run")
    facts.add("device.type", "cpu", "", "machine")
    lines = textwrap.dedent(_EVAL_BESIDE_TRAINING).splitlines()
    at = {}
    for text, count in (("running =", 1.0), ("hits +=", 0.5), ("val =", 0.5), ("norms.append", 3.0)):
        at[text] = line = next(i for i, ln in enumerate(lines, 1) if text in ln)
        s = site_subject(facts, "host_read", Site(file=str(path.resolve()), line=line, code=text))
        assert s is not None
        s.add("kind", "item", "", "run")
        s.add("count_per_step", count, "count", "run")
    found = [f for f in judge(facts, load_rules()) if f.rule == "PD008"]
    seen = next(i for i, ln in enumerate(lines, 1) if "seen =" in ln)  # the source's per-step read, uncounted
    assert len(found) == 1  # the step's reads are one problem, each line a location of it
    assert {loc.line for loc in found[0].locations} == {at["running ="], at["norms.append"], seen}


def test_dataparallel_built_only_where_the_user_turns_it_on(tmp_path):
    """kentaroy47/vision-transformers-cifar10 wraps the ViT in nn.DataParallel only with `--dp` (a
    store_true flag, inside the CUDA test): `opt_in`. Under a device test alone, or with a flag whose
    default is on, it is the script's default run."""
    facts, _ = analyse(tmp_path, """\
        import argparse, torch
        import torch.nn as nn
        parser = argparse.ArgumentParser()
        parser.add_argument('--dp', action='store_true')
        parser.add_argument('--no-dp', dest='nodp', action='store_true')
        args = parser.parse_args()
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        if 'cuda' in device:
            if args.dp:
                a = nn.DataParallel(model)
        if torch.cuda.device_count() > 1:
            b = nn.DataParallel(model)
        c = nn.DataParallel(model) if not args.nodp else model
        """)
    got = by_line(facts, "dataparallel")
    assert got[10].get("opt_in") is True and "opt_in" not in got[12] and "opt_in" not in got[13]


def test_dataparallel_behind_a_multi_gpu_flag_parsed_in_another_file(tmp_path):
    """Time-Series-Library (tslib-autoformer): run.py parses `--use_gpu` (on by default) and
    `--use_multi_gpu` (store_true); the experiment class builds nn.DataParallel under
    `if self.args.use_multi_gpu and self.args.use_gpu:`. A flag for several GPUs is the user's choice
    of parallelism, not the test of the device the script targets, and its default is read where the
    project parses it."""
    run = tmp_path / "run.py"
    run.write_text(textwrap.dedent("""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument('--use_gpu', action='store_true', default=True)
        parser.add_argument('--use_multi_gpu', action='store_true', default=False)
        parser.add_argument('--data_parallel', action='store_false')
        args = parser.parse_args()
        """))
    exp = tmp_path / "exp.py"
    exp.write_text(textwrap.dedent("""\
        import torch.nn as nn
        class Exp:
            def build(self, model):
                if self.args.use_multi_gpu and self.args.use_gpu:
                    model = nn.DataParallel(model, device_ids=self.args.device_ids)
                if self.args.data_parallel:
                    model = nn.DataParallel(model)
                return model
        """))
    facts = Facts()
    analyse_files([run, exp], facts)
    got = by_line(facts, "dataparallel")
    assert got[5].get("opt_in") is True and "opt_in" not in got[7]


def test_dataparallel_on_a_list_of_gpus_the_caller_passes(tmp_path):
    """torch-rechub's trainers wrap the model under `if len(gpus) > 1:` with `gpus=None` then `[]` by
    default, and its examples pass no GPUs: a list the user passes is their choice of parallelism, off
    unless passed. A list of the machine's devices is the device test: on the GPU machine it runs."""
    facts, _ = analyse(tmp_path, """\
        import torch
        import torch.nn as nn
        class Trainer:
            def __init__(self, model, gpus=None):
                if gpus is None:
                    gpus = []
                if len(gpus) > 1:
                    self.model = nn.DataParallel(model, device_ids=gpus)
        devices = list(range(torch.cuda.device_count()))
        if len(devices) > 1:
            m = nn.DataParallel(model)
        """)
    got = by_line(facts, "dataparallel")
    assert got[8].get("opt_in") is True and "opt_in" not in got[11]


def test_dataparallel_under_the_main_guard_is_the_scripts_default(tmp_path):
    """bubbliiiing/unet-pytorch builds `nn.DataParallel` at module level under `if __name__ == "__main__":`
    (guarded by `if Cuda:`, on by default): the main guard runs in the script the user runs, no setting
    they must turn on. Read as one (an unbound name, off), it made the construction opt-in: PD001 missed."""
    facts, _ = analyse(tmp_path, """\
        import torch
        import torch.nn as nn
        Cuda = True
        if __name__ == "__main__":
            model = nn.Linear(4, 4)
            if Cuda:
                model = nn.DataParallel(model)
            if __debug__:
                m2 = nn.DataParallel(model)
        """)
    got = by_line(facts, "dataparallel")
    assert "opt_in" not in got[7] and "opt_in" not in got[9]


def test_a_worker_count_computed_from_the_machines_cpus(tmp_path):
    facts, _ = analyse(tmp_path, """\
        import os, multiprocessing
        from torch.utils.data import DataLoader
        workers = 4 * len(os.sched_getaffinity(0))
        a = DataLoader(ds, num_workers=workers)
        b = DataLoader(ds, num_workers=os.cpu_count() // 2)
        c = DataLoader(ds, num_workers=multiprocessing.cpu_count())
        d = DataLoader(ds, num_workers=16)
        e = DataLoader(ds, num_workers=args.workers)
        """)
    got = {line: v.get("workers_follow_cpus") for line, v in by_line(facts, "dataloader").items()}
    assert got == {4: True, 5: True, 6: True, 7: None, 8: None}


def test_a_loaders_default_batch_from_the_option_it_reads(tmp_path):
    """The batch a DataLoader gets unless the user changes it: the argparse default of the option it
    reads (parsed in this file or in another of the project's), or of the one a name is bound to (a
    literal is `batch_size` itself)."""
    opts = tmp_path / "options.py"
    opts.write_text(textwrap.dedent("""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument('--batch-size', type=int, default=128)
        parser.add_argument('--eval_bs', default='big')
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader
        a = DataLoader(ds, batch_size=args.batch_size)
        bs = opt.batch_size
        b = DataLoader(ds, batch_size=bs)
        c = DataLoader(ds, batch_size=64)
        d = DataLoader(ds, batch_size=args.eval_bs)
        e = DataLoader(ds, batch_size=args.unknown)
        """))
    facts = Facts()
    analyse_files([opts, train], facts)
    got = {line: v.get("default_batch_size") for line, v in by_line(facts, "dataloader").items()}
    assert got == {2: 128, 4: 128, 5: None, 6: None, 7: None}


def test_a_loaders_default_batch_through_the_parameter_its_callers_fill(tmp_path):
    """playground-mnist: dataset.py's `get(batch_size, ...)` builds the loaders with
    `batch_size=batch_size`; train.py calls `dataset.get(batch_size=args.batch_size)`, whose option
    defaults to 200. A helper whose callers pass different options, or pass nothing, has no one
    default; a name bound in the helper is what it is bound to, as before."""
    data = tmp_path / "dataset.py"
    data.write_text(textwrap.dedent("""\
        import torch
        def get(batch_size, data_root='/tmp', train=True, **kwargs):
            train_loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, **kwargs)
            return train_loader
        def get_eval(bs):
            return torch.utils.data.DataLoader(ds, batch_size=bs)
        def get_other(batch_size):
            return torch.utils.data.DataLoader(ds, batch_size=batch_size)
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import argparse
        import dataset
        from dataset import get_eval
        parser = argparse.ArgumentParser()
        parser.add_argument('--batch_size', type=int, default=200)
        parser.add_argument('--test_batch', type=int, default=1000)
        args = parser.parse_args()
        train_loader = dataset.get(batch_size=args.batch_size, data_root='x', num_workers=1)
        test_loader = get_eval(args.test_batch)
        a = dataset.get_other(args.batch_size)
        b = dataset.get_other(args.test_batch)
        """))
    facts = Facts()
    analyse_files([data, train], facts)
    got = {line: v.get("default_batch_size") for line, v in by_line(facts, "dataloader").items()}
    assert got == {3: 200, 6: 1000, 8: None}


def test_a_loaders_default_batch_through_a_method_and_the_callers_own_parameter(tmp_path):
    """torch-rechub's run_census.py: data.py's `DataGenerator.generate_dataloader(self, ...,
    batch_size=16)` builds the loaders; run.py's `main(..., batch_size, ...)` calls it on an object,
    `dg.generate_dataloader(x, batch_size=batch_size)`, and main is called with `args.batch_size`,
    whose option defaults to 1024. A method called by position on an object of no telling name is
    not matched; a caller that rebinds its parameter before passing it on says nothing of the option."""
    data = tmp_path / "data.py"
    data.write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader
        class DataGenerator:
            def generate_dataloader(self, x, batch_size=16, num_workers=0):
                return DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
            def other(self, x, bs):
                return DataLoader(ds, batch_size=bs)
            def third(self, x, size):
                return DataLoader(ds, batch_size=size)
        """))
    train = tmp_path / "run.py"
    train.write_text(textwrap.dedent("""\
        import argparse
        from data import DataGenerator
        def main(epoch, batch_size, size):
            dg = DataGenerator()
            loader = dg.generate_dataloader(x, batch_size=batch_size)
            dg.other(x, batch_size)
            size = size * 2
            dg.third(x, size=size)
        parser = argparse.ArgumentParser()
        parser.add_argument('--batch_size', type=int, default=1024)
        parser.add_argument('--size', type=int, default=8)
        args = parser.parse_args()
        main(args.epoch, args.batch_size, args.size)
        """))
    facts = Facts()
    analyse_files([data, train], facts)
    got = {line: v.get("default_batch_size") for line, v in by_line(facts, "dataloader").items()}
    assert got == {4: 1024, 6: None, 8: None}


def test_pin_memory_on_cuda_through_the_parameter_its_callers_fill(tmp_path):
    """LynnHo's DCGAN: data.py's `make_dataset(..., pin_memory=False)` builds the loader with
    `pin_memory=pin_memory`; train.py passes `pin_memory=use_gpu`, with `use_gpu =
    torch.cuda.is_available()` there: pinned on CUDA. A helper nobody calls, callers that disagree,
    and a caller that passes nothing (the parameter's default) say what the source says."""
    data = tmp_path / "data.py"
    data.write_text(textwrap.dedent("""\
        from torch.utils.data import DataLoader
        def make_dataset(ds, batch_size, num_workers=4, pin_memory=False):
            return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)
        def make_unused(ds, pin_memory=False):
            return DataLoader(ds, pin_memory=pin_memory)
        def make_mixed(ds, pin_memory):
            return DataLoader(ds, pin_memory=pin_memory)
        def make_default(ds, pin_memory=False):
            return DataLoader(ds, pin_memory=pin_memory)
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        import torch
        import data
        use_gpu = torch.cuda.is_available()
        loader = data.make_dataset(ds, 64, pin_memory=use_gpu)
        a = data.make_mixed(ds, use_gpu)
        b = data.make_mixed(ds, True)
        c = data.make_mixed(ds, flag)
        d = data.make_default(ds)
        device = torch.device("cuda" if use_gpu else "cpu")
        for epoch in range(10):
            for x_real in loader:
                x_real = x_real.to(device)
                loss = model(x_real).sum()
                loss.backward()
                optimizer.step()
        """))
    facts = Facts()
    analyse_files([data, train], facts)
    got = {line: v.get("pin_memory_on_cuda") for line, v in by_line(facts, "dataloader").items()}
    assert got == {3: True, 5: None, 7: None, 9: False}
    assert not facts.of_kind("batch_copy")  # no name links the loop in train.py to the loader in data.py
    # the run's draw site does: the move of the pinned batch is a blocking copy (PD017)
    drawn = Facts()
    analyse_files([data, train], drawn, loader_draws={f"{data}:3": [(str(train), 11)]})
    copies = {s.locations[0].line: {k.split(".", 1)[1]: f.value for k, f in s.facts.items()}
              for s in drawn.of_kind("batch_copy")}
    assert copies == {12: {"pinned": True, "non_blocking": False}}


def test_host_reads_of_tensors_the_step_made_on_the_host_before_moving_them(tmp_path):
    """ncrfpp-lstmcrf: batchify builds the lengths with torch.LongTensor(...) and reads them (`.max()
    .item()`, `seqlen.item()` over `zip(..., lengths)`) before `if gpu: lengths = lengths.cuda()`:
    host tensors, no sync. The same read after the move, a read where a loop brings the move round,
    and a made tensor beside one not known are device reads; a later tuple rebinding (`lengths, order =
    lengths.sort(...)`) does not hide the reads before it."""
    facts, _ = analyse(tmp_path, """\
        import torch

        def batchify(batch, gpu):
            words = [b[0] for b in batch]
            lengths = torch.LongTensor(list(map(len, words)))
            longest = lengths.max().item()
            mask = torch.zeros((len(batch), longest)).bool()
            for idx, (seq, seqlen) in enumerate(zip(words, lengths)):
                n = seqlen.item()
                mask[idx, :n] = 1
            total = (lengths * 2).sum().item()
            lengths, order = lengths.sort(0, descending=True)
            if gpu:
                lengths = lengths.cuda()
            after = lengths.sum().item()
            return lengths, mask

        def train(model, batches, opt):
            acc = torch.zeros(1)
            for batch in batches:
                x, m = batchify(batch, True)
                loss = model(x, m)
                loss.backward()
                opt.step()
                acc = acc + loss.detach()
                print(acc.item())
                steps = torch.tensor(3)
                print((steps * loss).item())
                s = torch.tensor(0.0, device="cuda")
                v = s.item()
                c = torch.ones(2)
                r = c.sum().item()
                c = c.cuda()
        """)
    got = by_line(facts, "host_read")
    assert got[6] == {"kind": "item", "in_loop": False}  # .max() of lengths made on the host
    assert got[9] == {"kind": "item", "in_loop": False}  # an element of iterating them
    assert got[11] == {"kind": "item", "in_loop": False}  # arithmetic with a number keeps it on the host
    assert 15 not in got  # after the move: a device read, left to the run's count as any helper's
    assert got[26] == {"kind": "item", "in_loop": True}  # acc grew from the loss
    assert got[28] == {"kind": "item", "in_loop": True}  # beside the loss: on the device
    assert got[30] == {"kind": "item", "in_loop": True}  # made with device=
    assert got[32] == {"kind": "item", "in_loop": True}  # the loop brings `c = c.cuda()` round


def test_an_imported_modules_main_block_never_runs(tmp_path):
    """karpathy/pytorch-made: run.py trains; made.py, which it imports, ends with a self-test under
    `if __name__ == '__main__':` that backpropagates in a loop and reads `.numpy()` of a gradient. In a
    run of run.py that block never ran: no per-step host read there. The script's own block stays
    (its training loop is there), and an `else:` branch of the guard is what the import runs."""
    model = tmp_path / "made.py"
    model.write_text(textwrap.dedent("""\
        import torch
        class MADE(torch.nn.Module):
            pass
        if __name__ == '__main__':
            for k in range(10):
                loss = model(x)[0, k]
                loss.backward()
                depends = (x.grad[0].numpy() != 0)
        else:
            for k in range(10):
                loss = model(x)[0, k]
                loss.backward()
                print(loss.item())
        """))
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from made import MADE
        if __name__ == '__main__':
            for step in range(100):
                loss = model(x).sum()
                loss.backward()
                opt.step()
                lossf = loss.item()
        """))
    facts = Facts()
    analyse_files([script, model], facts, script=script)
    reads = {(Path(s.key.rsplit(":", 1)[0]).name, int(s.key.rsplit(":", 1)[1])): s.facts["host_read.in_loop"].value
             for s in facts.of_kind("host_read")}
    assert reads == {("run.py", 8): True, ("made.py", 13): True}
    # without the script named (a trace, `python -m pkg`), every file is read whole, as before
    whole = Facts()
    analyse_files([script, model], whole)
    assert ("made.py", 8) in {(Path(s.key.rsplit(":", 1)[0]).name, int(s.key.rsplit(":", 1)[1]))
                              for s in whole.of_kind("host_read")}


_EVAL_WITHOUT_EVAL_MODE = """\
    import torch
    import torch.optim as optim
    from torch.utils.data import DataLoader
    train_loader = DataLoader(train_set, batch_size=200)
    test_loader = DataLoader(test_set, batch_size=200)
    net = MLP().to(device)
    optimizer = optim.SGD(net.parameters(), lr=0.01)
    for epoch in range(10):
        for data, target in train_loader:
            logits = net(data.to(device))
            loss = criteon(logits, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        for data, target in test_loader:
            logits = net(data.to(device))
            test_loss += criteon(logits, target).item()
        with torch.no_grad():
            for data, target in test_loader:
                out = net(data)
        validate(test_loader)
        checked(test_loader)

    def validate(loader):
        for x, y in loader:
            pred = net(x)

    @torch.no_grad()
    def checked(loader):
        for x, y in loader:
            pred = net(x)
    """


def test_an_evaluation_loop_that_never_calls_eval_records_autograd(tmp_path):
    """dragen1860's lesson28: the MLP has no dropout or BatchNorm, so the evaluation after each epoch
    never calls .eval() (the run's probe, which watches eval-mode forwards, sees nothing) and runs the
    trained net over the test loader with autograd on. A loop under no_grad, in a no_grad function, or
    the training loop itself is no such evaluation."""
    facts, _ = analyse(tmp_path, _EVAL_WITHOUT_EVAL_MODE)
    got = by_line(facts, "eval_grad")
    assert got == {16: {"in_source": True}, 26: {"in_source": True}}


def test_a_prediction_loop_over_the_script_s_own_batches_records_autograd(tmp_path):
    """Zhenye-Na/DA-RNN: `test()` predicts the whole series batch by batch (no DataLoader, no `.eval()`),
    reading each prediction out with `.cpu().data.numpy()`, without no_grad: both forwards of the trained
    encoder and decoder record autograd for nothing. A rollout whose outputs stay in the graph for a
    later backward (REINFORCE's log-probs), the training loop, and a loop under no_grad are no such
    prediction."""
    facts, _ = analyse(tmp_path, """\
        import numpy as np
        import torch
        class DA_RNN:
            def __init__(self):
                self.enc_opt = torch.optim.Adam(self.Encoder.parameters())
                self.dec_opt = torch.optim.Adam(params=filter(lambda p: p.requires_grad, self.Decoder.parameters()))
            def train(self, x, y):
                for epoch in range(10):
                    idx = 0
                    while idx < 100:
                        loss = ((self.Decoder(self.Encoder(x)) - y) ** 2).mean()
                        loss.backward()
                        self.enc_opt.step()
                        idx += 1
                    if epoch % 10 == 0:
                        y_pred = self.test()
            def test(self):
                y_pred = np.zeros(100)
                i = 0
                while i < 100:
                    enc = self.Encoder(torch.zeros(8, 3))
                    y_pred[i:i + 8] = self.Decoder(enc).cpu().data.numpy()[:, 0]
                    i += 8
                return y_pred
            def rollout(self, env):
                log_probs = []
                for t in range(200):
                    probs = self.Encoder(torch.zeros(1, 3))
                    log_probs.append(probs.log())
                    env.step(probs.detach().numpy())
                return log_probs
            def quiet(self):
                with torch.no_grad():
                    for i in range(10):
                        out = self.Decoder(self.Encoder(torch.zeros(8, 3))).cpu().numpy()
        """)
    assert sorted(by_line(facts, "eval_grad")) == [21, 22]


def test_cpu_to_device_guarded_move_in_a_model_file_the_step_reaches(tmp_path):
    """jiesutd/NCRFpp: the CRF (crf.py) builds `Variable(torch.zeros(b, t)).long()` and
    `torch.LongTensor(seq_len, batch_size)` on the host and moves them with `if self.gpu: x = x.cuda()`
    in its loss and Viterbi decode; the model's loss method (seqlabel.py) calls them, the training
    loop (main.py) calls that. The n-best decode only evaluation reaches is not per step, nor is a
    move behind a flag the tensor's own name decides."""
    crf = tmp_path / "crf.py"
    crf.write_text(textwrap.dedent("""\
        import torch
        import torch.nn as nn
        import torch.autograd as autograd
        class CRF(nn.Module):
            def viterbi(self, feats):
                b, t = feats.size(0), feats.size(1)
                pad_zero = autograd.Variable(torch.zeros(b, t)).long()
                if self.gpu:
                    pad_zero = pad_zero.cuda()
                idx = torch.LongTensor(t, b)
                if self.gpu:
                    idx = idx.cuda()
                return pad_zero, idx
            def nbest(self, feats):
                pad = torch.zeros(feats.size(0), 3)
                if self.gpu:
                    pad = pad.cuda()
                return pad
            def odd(self, feats):
                w = torch.ones(3)
                if w.sum() > 0:
                    w = w.cuda()
                return w
        """))
    seqlabel = tmp_path / "seqlabel.py"
    seqlabel.write_text(textwrap.dedent("""\
        import torch.nn as nn
        class SeqLabel(nn.Module):
            def calculate_loss(self, x, y):
                out = self.lstm(x)
                tags = self.crf.viterbi(out)
                self.crf.odd(out)
                return out.sum(), tags
            def decode_nbest(self, x):
                return self.crf.nbest(self.lstm(x))
        """))
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent("""\
        def evaluate(model, batches):
            for x in batches:
                model.decode_nbest(x)
        def train(model, batches, optimizer):
            for epoch in range(10):
                for x, y in batches:
                    loss, tags = model.calculate_loss(x, y)
                    loss.backward()
                    optimizer.step()
                evaluate(model, batches)
        """))
    facts = Facts()
    analyse_files([crf, seqlabel, main], facts)
    got = by_line(facts, "cpu_to_device")
    assert got[7] == {"factory": "zeros", "target": "cuda", "in_loop": True}  # through Variable and .long()
    assert got[10] == {"factory": "LongTensor", "target": "cuda", "in_loop": True}  # several sizes
    assert got[15]["in_loop"] is False  # only evaluation reaches the n-best decode
    assert 20 not in got  # the `if` reads the tensor: not a guard around its move



def test_optimizer_and_evaluation_of_a_module_class_the_run_never_ran(tmp_path):
    """DomainBed keeps all its algorithms in one file, each an nn.Module that builds its own optimizer
    (some with foreach=False) and predicts in eval mode. The run trained ERM: the other classes' models
    never ran and none of their methods did in the profiled steps (`module_ran`), so their optimizer
    and evaluation forwards are not the run's (no PD021, no static PD019). Without a run, every class
    is judged."""
    path = tmp_path / "algorithms.py"
    path.write_text(textwrap.dedent("""\
        import torch
        import torch.nn as nn
        class ERM(nn.Module):
            def __init__(self, net):
                super().__init__()
                self.network = net
                self.optimizer = torch.optim.Adam(self.network.parameters(), foreach=False)
            def update(self, x, y):
                loss = nn.functional.cross_entropy(self.network(x), y)
                loss.backward()
                self.optimizer.step()
            def predict(self, x):
                self.network.eval()
                return self.network(x)
        class Other(nn.Module):
            def __init__(self, net):
                super().__init__()
                self.network = net
                self.optimizer = torch.optim.Adam(self.network.parameters(), foreach=False)
            def update(self, x, y):
                loss = nn.functional.cross_entropy(self.network(x), y)
                loss.backward()
                self.optimizer.step()
            def predict(self, x):
                self.network.eval()
                return self.network(x)
        def evaluate(algorithm, x):
            return algorithm.predict(x)
        def train(algorithm, loader):
            for step, (x, y) in enumerate(loader):
                algorithm.loss(x, y).backward()
                if step % 100 == 0:
                    evaluate(algorithm, x)
        """))
    real = str(path.resolve())
    unrun, everything = Facts(), Facts()
    analyse_files([path], everything)
    analyse_files([path], unrun, model_classes={"/elsewhere/networks.py:MNIST_CNN"},
                  functions_called={real: frozenset({8})})
    assert sorted(by_line(everything, "optimizer")) == [7, 19]
    assert sorted(by_line(everything, "eval_grad")) == [14, 26]
    assert by_line(unrun, "optimizer") == {7: {"name": "Adam", "foreach": False}}
    assert sorted(by_line(unrun, "eval_grad")) == [14]


def test_a_model_class_whose_methods_ran_ran(tmp_path):
    """NCRFpp's CRF is never called as a module: the model's loss method calls its methods directly, so
    the run's module trees do not hold it. cProfile saw those methods called in the profiled steps
    (`functions_called`, the def's line): the class ran, and its code is judged."""
    path = tmp_path / "crf.py"
    path.write_text(textwrap.dedent("""\
        import torch
        import torch.nn as nn
        class CRF(nn.Module):
            def viterbi(self, feats):
                idx = torch.LongTensor(feats.size(0), 3)
                if self.gpu:
                    idx = idx.cuda()
                return idx
        """))
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent("""\
        def train(crf, batches, optimizer):
            for x in batches:
                loss = crf.viterbi(x).sum()
                loss.backward()
                optimizer.step()
        """))
    other = {f"{tmp_path / 'model.py'}:Net"}  # the run called another model only
    unseen, seen = Facts(), Facts()
    analyse_files([path, main], unseen, model_classes=other)
    analyse_files([path, main], seen, model_classes=other,
                  functions_called={str(path.resolve()): frozenset({4}), str(main.resolve()): frozenset({1})})
    assert by_line(unseen, "cpu_to_device") == {}
    assert by_line(seen, "cpu_to_device") == {5: {"factory": "LongTensor", "target": "cuda", "in_loop": True}}
