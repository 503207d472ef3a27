"""The probes leave the user's program as it is (in process, real torch): nothing on the user's
modules or DataLoaders (pickle, deepcopy, torch.save), the same torch.compile graphs, the same
outputs and gradients where the forward probe counts an eval-mode forward's saved tensors (PD019),
and the profiled window's time budget."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perfdoctor.capture.patches import ErrorLog  # noqa: E402
from perfdoctor.capture.probes.cuda_batches import CudaBatchProbe  # noqa: E402
from perfdoctor.capture.probes.dataloader import DataLoaderProbe  # noqa: E402
from perfdoctor.capture.probes.forward import ForwardProbe  # noqa: E402
from perfdoctor.capture.window import BYTES_PER_EVENT, Window  # noqa: E402

pytestmark = pytest.mark.slow  # torch in this process: run by CI, not in the fast tier


class Clock:
    """What the probes read of the step clock."""

    def __init__(self):
        self.pc = time.perf_counter
        self.fwd = self.data = self.own = 0.0
        self.bwd_depth = self.in_batch = self.forwards = 0
        self.kind = self.thread = None
        self.steps: list = []

    def before_batch(self):
        pass

    def exclude(self, t0):
        self.own += self.pc() - t0


@pytest.fixture
def forward():
    probe = ForwardProbe(torch, Clock(), ErrorLog())  # type: ignore[arg-type]
    probe.install()
    yield probe
    probe.uninstall()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16))
                                 for _ in range(8)])


def test_forward_probe_leaves_nothing_on_the_module(forward):
    bare_call = forward.patches._undo[0][2]
    m = _model()
    before = {k: copy.copy(v) for k, v in vars(m).items()}
    m(torch.randn(2, 16))
    m(torch.randn(2, 16))
    assert vars(m).keys() == before.keys() and not m._forward_hooks and not m._forward_pre_hooks
    assert b"perfdoctor" not in pickle.dumps(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    clone = copy.deepcopy(m)
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), m.state_dict().values()))
    (r,) = forward.records()
    assert (r.module, r.calls, r.params) == ("Sequential", 2, 8 * (32 + 272))  # nested calls are not counted
    assert forward.clock.fwd > 0
    forward.uninstall()
    assert torch.nn.Module.__call__ is bare_call


class _Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()


class _Inner(torch.nn.Module):
    def forward(self, x):
        return x


class _Net(_Base):
    def forward(self, x):
        return self.inner(x)


def test_forward_probe_names_the_user_classes_of_the_model_it_follows(forward):
    m = torch.nn.Sequential(_Net(), torch.nn.ReLU())
    m(torch.randn(2))
    (r,) = forward.records()
    here = str(Path(__file__).resolve())
    assert r.classes == sorted(f"{here}:{q}" for q in ("_Base", "_Inner", "_Net"))  # no torch class, bases too
    assert vars(m).keys() == vars(torch.nn.Sequential(_Net(), torch.nn.ReLU())).keys()


def test_forward_probe_does_not_change_compiled_graphs(forward):
    from torch._dynamo.utils import counters

    def graphs():
        torch._dynamo.reset()
        counters.clear()
        cm = torch.compile(_model(), backend="eager")
        for _ in range(3):
            cm(torch.randn(4, 16)).sum().backward()
        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())

    probed = graphs()
    forward.uninstall()
    assert probed == graphs() == (1, 0)
    assert forward.records()[0].module == "OptimizedModule"


def test_eval_forward_with_grad_measured_without_changing_it(forward):
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()  # what earlier tests compiled: this process then counts as compiling
    dynamo_utils._compilation_metrics.clear()
    m = _model().eval()
    x = torch.randn(64, 16)
    out = m(x)  # evaluation without no_grad: measured
    kept = m(x)  # a model kept in eval mode while it trains: a backward runs through this one
    kept.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    with torch.no_grad():
        m(x)  # grad mode off: not an eval-with-grad forward
    m.train()
    m(x)  # training mode: not one either
    (eval_site, trained_site) = sorted(forward.eval_grad_records(), key=lambda r: r.site.line)
    assert eval_site.calls == 1 and eval_site.backward == 0 and eval_site.saved_bytes[0] > 64 * 16 * 4
    assert eval_site.batch == [64]  # its input's first dimension
    assert trained_site.calls == 1 and trained_site.backward == 1
    assert vars(m).keys() == vars(_model()).keys() and b"perfdoctor" not in pickle.dumps(m)
    forward.uninstall()
    m.eval()
    bare = m(x)
    m.zero_grad()
    m(x).sum().backward()
    assert torch.equal(bare, out) and all(torch.equal(p.grad, g) for p, g in zip(m.parameters(), grads))


def test_eval_forward_of_a_compiled_model_gets_no_hooks(forward):
    from torch._dynamo.utils import counters

    def graphs():
        torch._dynamo.reset()
        counters.clear()
        cm = torch.compile(_model().eval(), backend="eager")
        for _ in range(3):
            cm(torch.randn(4, 16))
        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())

    probed = graphs()
    assert all(not r.saved_bytes for r in forward.eval_grad_records())  # counted, never hooked
    assert [r.calls for r in forward.eval_grad_records()] == [3]
    forward.uninstall()
    assert probed == graphs() == (1, 0)


def test_dataloader_probe_keeps_its_state_off_the_loader():
    DL = torch.utils.data.DataLoader
    bare = {n: (inspect.signature(getattr(DL, n)), getattr(DL, n).__qualname__) for n in ("__init__", "__iter__")}
    probe = DataLoaderProbe(torch, Clock(), CudaBatchProbe(torch), ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        # what reads the methods sees the bare ones: Lightning re-creates a loader (a distributed
        # sampler put in) from the parameters of `DataLoader.__init__`'s signature
        assert {n: (inspect.signature(getattr(DL, n)), getattr(DL, n).__qualname__) for n in bare} == bare
        ds = torch.utils.data.TensorDataset(torch.arange(8.0))
        loader = torch.utils.data.DataLoader(ds, batch_size=2)
        assert sum(len(b[0]) for b in loader) == 8
        assert b"perfdoctor" not in pickle.dumps(loader)
        assert not any(k.startswith("_pd") for k in vars(loader))
        assert probe.loader_list[0].batches == 4
    finally:
        probe.uninstall()


def test_window_stops_inside_a_step_when_its_time_is_spent(tmp_path: Path):
    w = Window(torch, tmp_path, 0, 0, 5, budget_s=0.0)
    w.tick(0)  # the profiler starts
    assert w.state == "active"
    torch.randn(64, 64) @ torch.randn(64, 64)
    w.poll()  # a top-level module call or a batch in the middle of step 1
    assert (w.state, w.stopped_by, w.last_step, w.completed) == ("done", "time", 1, False)
    w.tick(1)
    w.finish()
    assert w.meta().stopped_by == "time" and w.next_at > 1000


def test_window_stretches_its_time_for_one_recorded_step_as_long_as_the_warm_ups(tmp_path: Path):
    """nst-johnson: 14 s steps on a CPU, a 20 s budget. The warm-up step ends at 14 s; the recorded step
    would have been stopped at 20 s with nothing whole in the trace. The budget now holds one recorded
    step of the warm-up's length and a quarter more (31.5 s), never past LONG_STEP_S; short steps keep
    the budget as it was."""
    for step_s, deadline in ((14.0, 14.0 + 1.25 * 14.0), (2.0, 20.0), (40.0, None), (19.0, 19.0 + 1.25 * 19.0)):
        # a warm-up of two steps, cut to one where two and a recorded step could not fit
        clock = [100.0]
        run = tmp_path / str(step_s)
        run.mkdir()
        w = Window(torch, run, 0, 2, 2, budget_s=20.0)
        w.pc = lambda clock=clock: clock[0]
        w.tick(0, step_s)  # the profiler starts at 100 s
        assert w.state == "warmup" and w.deadline == 120.0
        assert w.warmup == (2 if step_s == 2.0 else 1)
        clock[0] += step_s
        w.tick(1)  # a warm-up step ends
        if step_s == 2.0:
            clock[0] += step_s
            w.tick(2)
        if deadline is None:  # a warm-up step past the budget: the window stops as before
            assert (w.state, w.stopped_by) == ("done", "time")
        else:
            assert w.state == "active" and w.deadline == pytest.approx(100.0 + deadline)
        w.finish()


def test_window_ends_when_the_events_it_holds_fill_the_budget(tmp_path: Path):
    """kineto keeps every event in memory until it stops: the growth since the profiler started
    estimates the events recorded, looked at while a step runs and at its end."""
    mem = [1 << 30]
    w = Window(torch, tmp_path, 0, 0, 5, budget_events=1000, rss=lambda: mem[0])
    w.tick(0)
    w.next_look = 0.0  # its next look is due
    assert w.poll() is None and w.state == "active"  # nothing grew
    mem[0] += 400 * BYTES_PER_EVENT
    w.tick(1)
    assert w.state == "active" and w.recorded == 1
    mem[0] += 600 * BYTES_PER_EVENT
    assert w.poll() is None  # not due yet: the memory is read every LOOK_S
    w.next_look = 0.0
    torch.randn(64, 64) @ torch.randn(64, 64)
    assert w.poll() is not None  # inside step 2: the budget is full
    assert (w.state, w.stopped_by, w.last_step) == ("done", "events", 2) and w.trace_saved
    assert w.meta().events_per_step == 500  # 1000 events over steps 1 and 2 (in part)
    w.tick(2)
    w.finish()
    assert w.meta().stopped_by == "events"

    at_step_end = Window(torch, tmp_path / "b", 0, 0, 5, budget_events=1000, rss=lambda: mem[0])
    (tmp_path / "b").mkdir()
    at_step_end.tick(0)
    mem[0] += 2000 * BYTES_PER_EVENT
    at_step_end.tick(1)
    assert (at_step_end.state, at_step_end.stopped_by, at_step_end.last_step) == ("done", "events", 1)


def test_window_ends_inside_one_long_forward_and_its_stop_is_not_forward_time(forward, tmp_path: Path):
    """One top-level call can hold a whole closure (LBFGS over a long LSTMCell loop): the window
    looks at its budget at every module call, submodules too, and stops inside the forward."""
    m = _model()  # 25 modules: the Sequential, 8 blocks, a LayerNorm and a Linear in each
    w = Window(torch, tmp_path, 0, 0, 5, budget_s=0.0)
    w.tick(0)  # the profiler starts, its time already spent
    polls: list[int] = []

    def poll():  # as the coordinator's: the window's stop inside a step is perfdoctor's own time
        polls.append(1)
        t0 = w.poll()
        if t0 is not None:
            time.sleep(0.2)  # stopping a long recording takes a while
            forward.clock.exclude(t0)

    forward.poll = poll
    x = torch.randn(4, 16)
    t0 = time.perf_counter()
    out = m(x)
    wall = time.perf_counter() - t0
    assert len(polls) == 25 and w.state == "done" and w.stopped_by == "time"
    assert w.trace_saved and (tmp_path / "trace.json.gz").stat().st_size > 0
    assert forward.clock.fwd < wall - 0.15  # the stop is not the forward's time
    forward.uninstall()
    assert torch.equal(out, m(x))


def _shared_forward(m, x):
    return m(x)  # the helper both the training step and the evaluation call


def test_eval_forward_through_a_training_helper_is_placed_at_the_evaluation(forward):
    m, x = _model(), torch.randn(4, 16)
    for _ in range(2):
        m.train()
        _shared_forward(m, x).sum().backward()  # training: through the helper
        m.eval()
        evaluated = inspect.currentframe().f_lineno + 1
        _shared_forward(m, x)  # evaluation without no_grad: through the same helper
    m.eval()
    direct = inspect.currentframe().f_lineno + 1
    m(x)  # an evaluation calling the model itself
    by_line = {r.site.line: r for r in forward.eval_grad_records()}
    # not the helper's line, where torch.no_grad() would turn off the training's autograd too
    assert sorted(by_line) == sorted([evaluated, direct])
    assert by_line[evaluated].calls == 2 and by_line[evaluated].site.function.startswith("test_eval_forward_through")
    assert all(r.trained for r in by_line.values())  # the module also ran in train mode with grad on


def test_modules_evaluated_through_one_line_make_one_record(forward):
    import torch._dynamo.utils as dynamo_utils

    dynamo_utils.counters.clear()  # what earlier tests compiled: this process then counts as compiling
    dynamo_utils._compilation_metrics.clear()

    class Scorer:  # a plain class whose method calls two modules, each a top-level call
        def __init__(self):
            self.body, self.head = _model(), torch.nn.Linear(16, 4)

        def score(self, x):
            return self.head(self.body(x))

    s, x = Scorer(), torch.randn(8, 16)
    s.body.eval(), s.head.eval()
    line = inspect.currentframe().f_lineno + 1
    s.score(x)
    s.score(x)
    (r,) = forward.eval_grad_records()
    assert r.site.function == "score" and line  # both calls are at score's one line
    assert r.module == "Sequential" and r.calls == 2 and not r.trained
    body_only = _model().eval()
    forward.eval_grad.clear()
    body_only(x)
    (b,) = forward.eval_grad_records()
    assert r.saved_bytes[0] > b.saved_bytes[0]  # the head's saved input counted with the body's


def test_a_wrapped_tensor_getitem_leaves_tensors_no_sequences():
    """A Python `__getitem__` on torch.Tensor (the host-tensors probe's, while it watches) gave the class
    a sequence slot: torch's constructors then took a 0-d tensor in a list for a sequence and
    `torch.tensor([a.sum(), b.sum()])` raised "len() of a 0-d tensor", during the watch and after it."""
    from perfdoctor.capture.patches import Patches

    w = torch.arange(4.0)
    bare = torch.tensor([w.sum(), w[1:].sum()])
    seen = []
    patches = Patches()
    orig = torch.Tensor.__getitem__

    def getitem(t, idx):
        seen.append(idx)
        return orig(t, idx)

    patches.replace(torch.Tensor, "__getitem__", getitem)
    patches.replace(torch.Tensor, "__setitem__", torch.Tensor.__setitem__)
    try:
        assert torch.equal(torch.tensor([w.sum(), w[1:].sum()]), bare)  # watched: the same program
        assert torch.equal(torch.Tensor([w.sum(), w.sum()]), torch.Tensor([6.0, 6.0]))
        assert seen  # and the wrapper sees the indexing
    finally:
        patches.undo()
    assert "__getitem__" not in vars(torch.Tensor)
    assert torch.equal(torch.tensor([w.sum(), w[1:].sum()]), bare)  # and after
