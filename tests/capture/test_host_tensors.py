"""Tensors made on the host inside the step and moved to a device (capture/probes/host_tensors.py,
in process, real torch): the factory's line and the move's line, in any function; and the program
unchanged (TorchScript, torch.compile, results)."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from perfdoctor.capture.patches import ErrorLog  # noqa: E402
from perfdoctor.capture.probes.host_tensors import WATCH_STEPS, HostTensorProbe  # noqa: E402

pytestmark = pytest.mark.slow  # torch in this process: run by CI, not in the fast tier


@pytest.fixture
def probe():
    err = ErrorLog()
    p = HostTensorProbe(torch, err)
    bare = torch.randn
    p.install()
    yield p
    p.uninstall()
    assert torch.randn is bare and not err.items


def _line(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def noise(b):
    return torch.randint(0, 10, (b,))  # made in a helper


def attention(w, device):
    pos = torch.arange(w.shape[-1]).expand_as(w).to(device)  # a view of the host tensor, moved
    return w + pos


def step(imgs, device):
    y = noise(4).to(device)  # moved by the caller
    z = torch.randn(4, 3).type_as(imgs)
    h = torch.ones(4).to(torch.float16)  # a dtype, not a device: not a move
    return y, z, h, attention(torch.zeros(2, 5, dtype=torch.long), device)


def test_factory_and_move_lines_in_any_function(probe):
    device = torch.device("cpu")
    imgs = torch.zeros(2, 3)
    step(imgs, device)  # step 1: before the watch
    probe.end_step(1)
    for i in range(2, 6):
        step(imgs, device)
        probe.end_step(i)
    got = {(r.factory, r.how): r for r in probe.records()}
    assert set(got) == {("randint", "to"), ("randn", "type_as"), ("arange", "to")}
    r = got["randint", "to"]
    assert (r.site.line, r.moved.line) == (_line(noise, "torch.randint"), _line(step, "noise(4).to"))
    n = min(4, WATCH_STEPS)  # the steps watched of the 4 after the first
    assert (r.moves, r.steps, r.watched, r.nbytes) == (n, n, n, 4 * 8)
    assert got["arange", "to"].site.line == got["arange", "to"].moved.line == _line(attention, "torch.arange")
    assert got["randn", "type_as"].moved.function == "step"


def test_tensors_made_before_the_watch_or_moved_after_their_step_do_not_count(probe):
    kept = torch.randn(3)  # made before the first step ended
    probe.end_step(1)
    kept.to("cpu")
    made = torch.randn(3)
    probe.end_step(2)
    made.to("cpu")  # a step later: the factory's step is over
    assert probe.records() == []


def test_the_watch_ends_and_puts_the_tensor_methods_back(probe):
    bare_to = torch.Tensor.to
    probe.end_step(1)
    assert torch.Tensor.to is not bare_to
    for i in range(2, 2 + 31):
        probe.end_step(i)
    assert probe.done and torch.Tensor.to is bare_to and torch.randn(2).to("cpu").shape == (2,)


def test_torchscript_and_compile_see_torchs_own_factories(probe):
    probe.end_step(1)

    @torch.jit.script
    def scripted(n: int):
        return torch.randn(n) * 0 + torch.arange(n)

    assert torch.equal(scripted(3), torch.arange(3).float())

    from torch._dynamo.utils import counters

    counters.clear()

    def f(x):
        return x + torch.ones(3).to(x.device) + torch.randint(0, 1, (3,)).float().to(x.device)

    compiled = torch.compile(f, backend="eager")
    x = torch.zeros(3)
    assert torch.equal(compiled(x), f(x))
    probe.end_step(2)
    assert torch.equal(compiled(x), f(x))
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1


def test_run_facts_key_the_factory_line_with_the_move_beside():
    from perfdoctor.contracts.run import HostTensorRecord, Probes, Site
    from perfdoctor.facts.run import host_tensors
    from perfdoctor.facts.run.context import RunContext

    made = Site(file="/p/utils.py", line=6, code="return torch.randint(0, n, (b,))", function="labels")
    moved = Site(file="/p/train.py", line=20, code="y = labels(8).to(device)", function="main")
    every = HostTensorRecord(site=made, moved=moved, factory="randint", how="to", moves=40, steps=20, watched=20)
    rare = HostTensorRecord(site=moved, moved=moved, factory="zeros", how="cuda", moves=2, steps=2, watched=20)
    ctx = RunContext(probes=Probes(host_tensors=[every, rare]))
    host_tensors.add(ctx)
    subjects = {s.key: s for s in ctx.facts.subjects["cpu_to_device"]}
    s = subjects["/p/utils.py:6"]
    assert [(loc.file, loc.line) for loc in s.locations] == [("/p/utils.py", 6), ("/p/train.py", 20)]
    assert s.facts["cpu_to_device.in_loop"].value is True and s.facts["cpu_to_device.moves_per_step"].value == 2
    assert s.facts["cpu_to_device.factory"].source == "run"
    assert subjects["/p/train.py:20"].facts["cpu_to_device.in_loop"].value is False  # 2 of 20 steps: not per step


def test_normal_with_a_size_draws_on_the_host(probe):
    """TD3's target-policy noise: `torch.normal(mean=0, std=s, size=...).to(device)` every update."""
    def update(a, device):
        return torch.normal(mean=0, std=0.2, size=a.size()).to(device)  # drawn on the host
    a = torch.zeros(4, 1)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        update(a, torch.device("cpu"))
        probe.end_step(i)
    (r,) = probe.records()
    assert (r.factory, r.how, r.steps) == ("normal", "to", WATCH_STEPS)


def test_device_and_generator_arguments_are_not_host_tensors_to_fix(probe):
    probe.end_step(1)
    g = torch.Generator().manual_seed(0)
    torch.randn(3, generator=g).to("cpu")  # a host generator: device= cannot be given
    torch.zeros(3, device="cpu").to("cpu")  # made where the script said
    probe.end_step(2)
    assert probe.records() == []


def test_batches_of_a_loader_moved_by_a_helper(probe):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2), torch.zeros(8)), batch_size=2)
    probe.end_step(1)
    for i, batch in enumerate(loader, 2):
        probe.tag(batch, 7)
        [t.to("cpu", non_blocking=True) for t in batch]  # noqa: B018
        probe.end_step(i)
    (r,) = probe.records()
    n = min(4, WATCH_STEPS)  # the steps watched of the 4 after the first, two moves each
    assert (r.loader, r.site, r.factory, r.moves, r.steps, r.non_blocking) == (7, None, "", 2 * n, n, True)


def test_run_facts_of_a_loaders_moves():
    from perfdoctor.contracts.run import DataLoaderKwargs, DataLoaderRecord, HostTensorRecord, Probes, Site
    from perfdoctor.facts.run import host_tensors
    from perfdoctor.facts.run.context import RunContext

    def site(file, line):
        return Site(file=file, line=line, code="", function="f")

    train = DataLoaderRecord(id=0, site=site("/p/data.py", 20), kwargs=DataLoaderKwargs(pin_memory=True))
    val = DataLoaderRecord(id=1, site=site("/p/data.py", 21), kwargs=DataLoaderKwargs(pin_memory=False))
    move = site("/p/utils.py", 16)
    ctx = RunContext(probes=Probes(dataloaders=[train, val], host_tensors=[
        HostTensorRecord(loader=0, moved=move, how="to", moves=60, steps=30, watched=31, non_blocking=False),
        HostTensorRecord(loader=1, moved=move, how="to", moves=24, steps=3, watched=31, non_blocking=False)]))
    host_tensors.add(ctx)
    loaders = {s.key: s for s in ctx.facts.subjects["dataloader"]}
    t, v = loaders["/p/data.py:20"], loaders["/p/data.py:21"]
    assert t.facts["dataloader.trains"].value is True and v.facts["dataloader.trains"].value is False
    assert t.facts["dataloader.moved"].value and [loc.line for loc in t.locations] == [20, 16]
    (b,) = ctx.facts.subjects["batch_copy"]
    assert b.key == "/p/utils.py:16" and b.facts["batch_copy.pinned"].value is True
    assert b.facts["batch_copy.non_blocking"].value is False


def test_a_dtype_cast_on_the_host_is_followed_to_its_move(probe):
    """`batch_x.float().to(device)` (a float64 batch of a time-series loader) moves the loader's
    batch; `torch.randn(n).half().cuda()` the factory's tensor: the cast's copy is the same data."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3, dtype=torch.float64)),
                                         batch_size=2)
    probe.end_step(1)
    for i, (batch_x,) in enumerate(loader, 2):
        probe.tag([batch_x], 3)
        batch_x.float().to("cpu")
        torch.randint(0, 5, (4,)).to(torch.float32).double().to("cpu")
        probe.end_step(i)
    got = {(r.loader, r.factory): r for r in probe.records()}
    n = min(4, WATCH_STEPS)
    assert set(got) == {(3, ""), (None, "randint")}
    assert (got[3, ""].moves, got[3, ""].steps) == (n, n)
    assert got[None, "randint"].moved.line == got[None, "randint"].site.line


class _Schedule:
    """A diffusion noise schedule made once on the host (not a module: nothing moves it)."""

    def __init__(self):
        self.alphas = torch.linspace(0.1, 0.9, 1000)
        self.table = torch.ones(8)

    def add_noise(self, x, t):
        a = self.alphas.to(x.device)[t]  # the whole schedule copied every step
        self.table = self.table.to(x.device)  # moved once, then kept on the device
        return x * a


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("pe", torch.arange(8.0))  # model.to(device) moves it

    def forward(self, x):
        return x + self.pe.to(x.device)


def test_a_host_tensor_kept_across_steps_and_moved_every_step(probe):
    sched, net, x = _Schedule(), _Net(), torch.zeros(8)
    rare = torch.ones(3)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        sched.add_noise(x, torch.tensor([3]))
        net(x)
        if i == 2:
            rare.to("cpu")  # one step only: not every step
        probe.end_step(i)
    (r,) = probe.records()
    assert r.kept and r.site is None and r.factory == "" and r.how == "to"
    assert r.moved.line == _line(_Schedule.add_noise, "self.alphas.to") and r.steps == WATCH_STEPS
    assert r.nbytes == 1000 * 4


def test_run_facts_of_a_kept_host_tensor():
    from perfdoctor.contracts.run import HostTensorRecord, Probes, Site
    from perfdoctor.facts.run import host_tensors
    from perfdoctor.facts.run.context import RunContext

    moved = Site(file="/p/sched.py", line=30, code="a = self.alphas.to(x.device)[t]", function="add_noise")
    r = HostTensorRecord(moved=moved, how="to", moves=3, steps=3, watched=3, nbytes=4000, kept=True)
    ctx = RunContext(probes=Probes(host_tensors=[r]))
    host_tensors.add(ctx)
    (s,) = ctx.facts.subjects["cpu_to_device"]
    assert s.key == "/p/sched.py:30" and s.facts["cpu_to_device.kept"].value is True
    assert s.facts["cpu_to_device.in_loop"].value is True and "cpu_to_device.factory" not in s.facts


def test_the_watch_notes_every_factory_line_that_ran_moved_or_not(probe):
    """The watch's record: the steps watched and each user line where a watched factory made a host
    tensor in them, moved or not; a line that ran only before the watch is not among them."""
    def loss(x, labels):
        if labels is None:
            mask = torch.eye(4).to(x.device)  # the unsupervised branch: never taken here
        else:
            mask = (labels == labels.T).float()
        kept = torch.zeros(2)  # made, never moved
        return mask, kept, torch.arange(4).to(x.device)

    x, labels = torch.zeros(4), torch.zeros(4, 1)
    loss(x, None)  # step 1: before the watch
    assert probe.watch_record() is None
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        loss(x, labels)
        probe.end_step(i)
    w = probe.watch_record()
    assert w is not None and w.watched == WATCH_STEPS and w.complete
    assert sorted(s.line for s in w.made) == sorted([_line(loss, "torch.zeros(2)"), _line(loss, "torch.arange(4)")])


def test_the_watch_notes_every_move_line_that_ran_whatever_the_tensor(probe):
    """Every user line that moved a tensor to a device in the watched steps is noted, whatever made the
    tensor (a legacy constructor the probe does not watch, a parameter, a loader's batch); a dtype-only
    `.to()` is no move, and a move that ran only before the watch or not at all is not among them."""
    def gather(x, world_size):
        a = torch.IntTensor([4]).to("cpu")  # a legacy literal: unwatched constructor, the move is seen
        b = x.type_as(a)
        c = x.to(torch.float16)  # a dtype only
        if world_size == 1:
            return a, b, c
        return torch.IntTensor([1]).to("cpu")  # never reached here

    x = torch.zeros(4)
    gather(x, 1)
    assert probe.watch_record() is None
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        gather(x, 1)
        probe.end_step(i)
    w = probe.watch_record()
    assert w is not None and w.moves_complete
    assert sorted(s.line for s in w.moved) == sorted([_line(gather, "IntTensor([4])"), _line(gather, "type_as")])


def test_run_facts_say_which_move_lines_ran_unless_compiled():
    from perfdoctor.contracts.run import CompiledFrame, CompileRecord, HostFactoryWatch, Probes, Site
    from perfdoctor.facts.run.host_tensors import move_lines

    moved = [Site(file="/p/dist.py", line=85, code="", function="all_gather")]
    assert move_lines(Probes(host_factories=HostFactoryWatch(watched=3, moved=moved))) == {
        "/p/dist.py": frozenset({85})}
    assert move_lines(Probes(host_factories=HostFactoryWatch(watched=3))) == {}  # watched, nothing moved
    assert move_lines(Probes()) is None
    assert move_lines(Probes(host_factories=HostFactoryWatch(watched=1, moved=moved))) is None
    assert move_lines(Probes(host_factories=HostFactoryWatch(watched=3, moved=moved, moves_complete=False))) is None
    compiled = CompileRecord(frames=[CompiledFrame(site=Site(file="/p/model.py", line=5, code="", function="forward"))])
    assert move_lines(Probes(host_factories=HostFactoryWatch(watched=3, moved=moved), compile=compiled)) is None


def test_run_facts_say_which_factory_lines_ran_unless_compiled():
    from perfdoctor.contracts.run import CompiledFrame, CompileRecord, HostFactoryWatch, Probes, Site
    from perfdoctor.facts.run.host_tensors import factory_lines

    made = [Site(file="/p/losses.py", line=82, code="", function="forward"),
            Site(file="/p/train.py", line=10, code="", function="main")]
    assert factory_lines(Probes(host_factories=HostFactoryWatch(watched=3, made=made))) == {
        "/p/losses.py": frozenset({82}), "/p/train.py": frozenset({10})}
    assert factory_lines(Probes()) is None  # no watch
    assert factory_lines(Probes(host_factories=HostFactoryWatch(watched=1, made=made))) is None  # too few steps
    assert factory_lines(Probes(host_factories=HostFactoryWatch(watched=3, made=made, complete=False))) is None
    compiled = CompileRecord(frames=[CompiledFrame(site=Site(file="/p/model.py", line=5, code="", function="forward"))])
    assert factory_lines(Probes(host_factories=HostFactoryWatch(watched=3, made=made), compile=compiled)) is None


def _add_noise(img):
    noise = torch.randn(img.size()) * 0.2  # made on the host in a helper
    return img + noise


def test_host_arithmetic_carries_a_factorys_tensor_to_its_move(probe):
    """keon's denoising autoencoder: the loader's batch plus host noise, viewed and moved. The move is
    the factory's (PD004 at the noise's line); arithmetic of a loader's batch alone stays untracked."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.rand(8, 1, 4, 4)), batch_size=2)
    probe.end_step(1)
    for i, (x,) in enumerate(loader, 2):
        probe.tag([x], 3)
        noisy = _add_noise(x).view(-1, 16).to("cpu")
        (x * 2).to("cpu")
        probe.end_step(i)
        assert torch.is_tensor(noisy)
    got = {(r.loader, r.factory): r for r in probe.records()}
    assert set(got) == {(None, "randn")}
    r = got[None, "randn"]
    assert r.site.line == _line(_add_noise, "torch.randn") and r.moved.function.startswith("test_host_arithmetic")
    assert r.steps == min(4, WATCH_STEPS)


def causal_mask(scores):
    idx = torch.triu_indices(scores.size(-2), scores.size(-1), offset=1)  # made on the host every call
    scores[..., idx[0], idx[1]] = float("-inf")  # indexes the model's scores: on a GPU, a copy each call
    return scores


def test_a_host_index_into_the_models_computation_is_a_move(probe):
    """pbloem/former's mask_(): `torch.triu_indices` made on the host and used to index the attention
    scores, which need a gradient (on the GPU where the script trains): the index is copied to the
    device on every call. The same index into a host tensor without a gradient copies nothing."""
    w = torch.randn(4, 4, requires_grad=True)
    plain = torch.randn(2, 4, 4)
    for i in range(1, 6):
        causal_mask(plain.clone())  # no gradient: host data indexed on the host
        scores = (w * 2).expand(2, 4, 4).clone()
        causal_mask(scores).sum().backward()
        probe.end_step(i)
    [r] = probe.records()
    assert (r.factory, r.how) == ("triu_indices", "index")
    assert r.site.line == _line(causal_mask, "triu_indices") and r.moved.line == _line(causal_mask, "scores[...")
    assert r.steps == WATCH_STEPS and r.moves == WATCH_STEPS
    assert torch.Tensor.__getitem__ is torch._C.TensorBase.__getitem__  # put back when the watch ended


def test_a_zero_dim_host_index_is_an_int_not_a_copy(probe):
    """SR-GNN's `torch.stack([get(i) for i in torch.arange(n)])` with `get = lambda i: hidden[i][alias[i]]`:
    each `i` is a 0-dim view of a host arange, which torch reads as a Python int: nothing is copied. The
    same arange as one index tensor (`hidden[torch.arange(n), last]`) is copied on every call."""
    w = torch.randn(3, 4, requires_grad=True)
    for i in range(1, 6):
        hidden = w * 2
        rows = torch.stack([hidden[k] for k in torch.arange(3)])  # 0-dim indices: ints
        last = hidden[torch.arange(3), torch.tensor([0, 1, 2])]  # one index tensor: a copy on a GPU
        (rows.sum() + last.sum()).backward()
        probe.end_step(i)
    [r] = probe.records()
    assert (r.factory, r.how) == ("arange", "index") and r.moves == WATCH_STEPS  # the second line's, once a call
    assert r.moved.line == _line(test_a_zero_dim_host_index_is_an_int_not_a_copy, "last = hidden[")


class _PositionalTable(torch.nn.Module):
    """Chinese-Text-Classification's Positional_Encoding: the table is a plain attribute made on the
    host (model.to(device) leaves it there), wrapped in a fresh Parameter and moved in every forward."""

    def __init__(self):
        super().__init__()
        self.pe = torch.arange(12.0).view(3, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))  # registered: model.to(device) moves it

    def forward(self, x):
        out = x + torch.nn.Parameter(self.pe, requires_grad=False).to(x.device)  # the table, every call
        return out * self.scale.to(x.device)


def test_a_kept_host_tensor_moved_through_a_fresh_parameter(probe):
    bare_new = vars(torch.nn.Parameter)["__new__"]
    net, x = _PositionalTable(), torch.zeros(3, 4)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        net(x).sum().backward()
        probe.end_step(i)
    (r,) = probe.records()
    assert r.kept and r.how == "to" and r.steps == WATCH_STEPS and r.nbytes == 12 * 4
    assert r.moved.line == _line(_PositionalTable.forward, "torch.nn.Parameter(self.pe")
    assert vars(torch.nn.Parameter)["__new__"] is bare_new  # put back when the watch ended
    assert isinstance(torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter)


class _FieldsEmbedding(torch.nn.Module):
    """pytorch-fm's FeaturesEmbedding: the field offsets are a numpy array, turned into a tensor on the
    batch's device by x.new_tensor in every forward (a host-to-device copy on a GPU)."""

    def __init__(self):
        super().__init__()
        import numpy as np

        self.offsets = np.array((0, 5, 9), dtype=np.int64)
        self.embedding = torch.nn.Embedding(12, 2)

    def forward(self, x):
        x = x + x.new_tensor(self.offsets).unsqueeze(0)  # the kept array, copied every call
        return self.embedding(x)


def test_a_kept_host_array_copied_by_new_tensor_onto_a_moved_batch(probe):
    import numpy as np

    net, offsets = _FieldsEmbedding(), np.arange(3)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        batch = torch.tensor([[0, 1, 2]] * 4)  # a new batch each step (built from data), moved
        x = batch.to("cpu")
        net(x).sum().backward()
        torch.zeros(2).new_tensor(offsets)  # on a tensor that stays on the host: no copy to a device
        x.new_tensor([1, 2, 3])  # a list is rebuilt every call: the host computed it
        probe.end_step(i)
    (r,) = probe.records()
    assert r.kept and r.how == "new_tensor" and r.steps == WATCH_STEPS and r.nbytes == 3 * 8
    assert r.moved.line == _line(_FieldsEmbedding.forward, "x.new_tensor(self.offsets)")
    assert torch.Tensor.new_tensor is torch._C.TensorBase.new_tensor  # put back when the watch ended


def _batches(vocab, rows):
    """ymfa/seq2seq-summarizer's generator: a zeros buffer filled token by token with the data."""
    while True:
        src = torch.zeros(3, len(rows), dtype=torch.long)
        for i, row in enumerate(rows):
            for j, w in enumerate(row):
                src[j, i] = vocab[w]
        yield src


def _mask(n):
    mask = torch.zeros(2, 4)
    mask[:, :n] = 1  # one constant: the mask could be made on the device
    return mask


def _relabel(batch):
    """The step's own writes into a batch already the host's data: no filling of its own."""
    batch[0, 0] = 7
    batch[1, 1] = 8
    return batch


def test_a_factory_buffer_the_host_fills_with_its_data_is_a_batch(probe):
    vocab = {"a": 4, "b": 5, "c": 6}
    gen = _batches(vocab, [["a", "b", "c"], ["c", "a", "b"]])
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        _relabel(next(gen)).to("cpu")  # the batch: its copy is the data path, not PD004
        _mask(2).to("cpu")  # a factory's tensor with constants written: still PD004
        probe.end_step(i)
    got = {(r.loader, r.factory): r for r in probe.records()}
    assert set(got) == {(0, ""), (None, "zeros")}
    assert got[None, "zeros"].site.line == _line(_mask, "torch.zeros")
    # the function that wrote the data, as the profiler names its frame: its ops are the host's on a GPU too
    # (the mask's constant writes are not data)
    assert probe.watch_record().filled == [f"test_host_tensors.py({_batches.__code__.co_firstlineno}): _batches"]


def _square_mask(sz):
    mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)  # made on the host every call
    return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)


def test_a_mask_built_from_a_factorys_tensor_and_a_batch_made_contiguous_are_followed(probe):
    """pytorch-book's poetry model: every step builds the causal mask on the host (`torch.triu` of
    `torch.ones`, compared, transposed, cast, `masked_fill`ed) and moves it (PD004 at the factory), and
    moves its loader's batch as `data_.long().transpose(1, 0).contiguous()` (the data path: PD003).
    A mask computed from the loader's batch alone stays untracked."""
    loader = torch.utils.data.DataLoader(torch.randint(0, 9, (8, 6), dtype=torch.int32), batch_size=2)
    probe.end_step(1)
    for i, data_ in enumerate(loader, 2):
        probe.tag(data_, 3)
        data_ = data_.long().transpose(1, 0).contiguous()
        data_ = data_.to("cpu")
        src_mask = _square_mask(data_.shape[0] - 1)
        src_mask.to("cpu")
        (data_ == 8).permute(1, 0).contiguous().to("cpu")  # made from the batch on the device: nothing
        probe.end_step(i)
    got = {(r.loader, r.factory): r for r in probe.records()}
    assert set(got) == {(3, ""), (None, "ones")}
    assert got[None, "ones"].site.line == _line(_square_mask, "torch.ones")
    assert got[3, ""].steps == got[None, "ones"].steps == min(4, WATCH_STEPS)
    assert torch.equal(_square_mask(2), torch.tensor([[0.0, float("-inf")], [0.0, 0.0]]))


def test_kept_rows_selected_by_a_kept_index_and_moved_every_step(probe):
    """GCNII: labels and idx_train stay on the host; every step moves labels[idx_train] (the same rows):
    a kept host tensor moved every step, at the move's line. Rows a new index draws each step (a
    replay buffer's) and a moving slice are another selection every step: not kept."""
    labels, idx_train = torch.randint(0, 7, (50,)), torch.arange(10)
    store = torch.randn(50, 3)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        moved = labels[idx_train].to("cpu")  # the same rows every step
        store[torch.from_numpy(__import__("numpy").random.randint(0, 50, 4))].to("cpu")  # new rows
        store[i:i + 4].to("cpu")
        assert torch.equal(moved, labels[:10])
        probe.end_step(i)
    recs = probe.records()
    assert [(r.kept, r.moved.line, r.nbytes) for r in recs] == [
        (True, _line(test_kept_rows_selected_by_a_kept_index_and_moved_every_step, "labels[idx_train].to"), 10 * 8)]
    assert recs[0].steps == WATCH_STEPS


def test_numpy_index_arrays_into_the_models_computation_are_a_move(probe):
    """SASRec: `indices = np.where(pos != 0)` on the host, then `pos_logits[indices]` of the model's
    output: on a GPU torch copies the numpy index arrays to the device on every call. The same index
    into a host tensor with no autograd (data on the host) copies nothing."""
    np = pytest.importorskip("numpy")
    w = torch.randn(4, 6, requires_grad=True)
    data = torch.randn(4, 6)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        pos = np.random.randint(0, 3, (4, 6))
        indices = np.where(pos != 0)
        picked = (w * 2)[indices]
        (w * 2)[list(indices)]  # the same arrays in a list: torch's old spelling of the tuple
        data[indices]
        assert picked.shape[0] == len(indices[0])
        probe.end_step(i)
    r, listed = sorted(probe.records(), key=lambda r: r.site.line)
    line = _line(test_numpy_index_arrays_into_the_models_computation_are_a_move, "(w * 2)[indices]")
    assert (r.factory, r.how, r.site.line, r.moved.line, r.steps) == ("numpy", "index", line, line, WATCH_STEPS)
    assert (listed.factory, listed.site.line) == ("numpy", line + 1)


def test_python_list_indices_into_the_models_computation_are_a_move(probe):
    """HGCN: a split kept as a Python list (`idx_train = list(range(140))`) or a range indexes the
    model's output every step: on a GPU torch makes a host index tensor of it and copies it each call.
    A few positions written in the code (`[:, [2, 1, 0]]`) are not an index array; a list of tensors
    is a tuple index; host data indexed by the list copies nothing."""
    w = torch.randn(200, 6, requires_grad=True)
    data = torch.randn(200, 6)
    idx_train, idx_val = list(range(140)), range(140, 200)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        out = w * 2
        out[idx_train].sum()
        out[idx_val]
        out[:, [2, 1, 0]]
        data[idx_train]
        probe.end_step(i)
    recs = sorted(probe.records(), key=lambda r: r.site.line)
    train = _line(test_python_list_indices_into_the_models_computation_are_a_move, "out[idx_train].sum()")
    val = _line(test_python_list_indices_into_the_models_computation_are_a_move, "out[idx_val]")
    assert [(r.factory, r.how, r.site.line, r.moved.line, r.steps) for r in recs] == [
        ("list", "index", train, train, WATCH_STEPS), ("list", "index", val, val, WATCH_STEPS)]
    assert recs[0].nbytes == 140 * 8


def _overlap_add(signal):
    """Conv-TasNet's overlap_and_add: an index made on the host every call, copied onto the signal's
    device with `new_tensor`."""
    frame = torch.arange(0, 6).unfold(0, 2, 1)  # the factory
    frame = signal.new_tensor(frame).long()  # its copy to the device
    return signal.new_zeros(7).index_add(0, frame.reshape(-1)[:4], signal[:4])


def test_a_factorys_tensor_copied_by_new_tensor_is_its_move(probe):
    w = torch.ones(8, requires_grad=True)
    _overlap_add(w * 2)  # step 1: before the watch
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        _overlap_add(w * 2).sum().backward()
        probe.end_step(i)
    (r,) = probe.records()
    assert (r.factory, r.how, r.steps) == ("arange", "new_tensor", WATCH_STEPS)
    assert r.site.line == _line(_overlap_add, "torch.arange") and r.moved.line == _line(_overlap_add, "new_tensor(frame)")


class _MovingDataset(torch.utils.data.Dataset):
    """UrbanSound's shape: each clip read, then moved to the script's device in __getitem__."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        clip = torch.tensor([float(i)] * 8)  # read from a file
        clip = clip.to("cpu")  # the device on a GPU
        return clip, i


def test_a_dataset_that_moves_each_sample_is_noted_with_its_class(probe):
    loader = iter(torch.utils.data.DataLoader(_MovingDataset(), batch_size=4))
    next(loader)
    probe.end_step(1)
    for i in range(2, 2 + WATCH_STEPS):
        x, _ = next(loader)
        x.sum()
        probe.end_step(i)
    (r,) = [r for r in probe.records() if r.dataset is not None]
    assert r.dataset == "_MovingDataset" and r.moved.line == _line(_MovingDataset.__getitem__, "clip.to(")
    assert (r.moves, r.steps, r.how) == (4 * WATCH_STEPS, WATCH_STEPS, "to") and not r.kept
