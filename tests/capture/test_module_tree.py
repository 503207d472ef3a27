"""The module trees the run calls (capture/probes/modules.py, in process, real torch): layer counts,
convolutions grouped by the user line that built them (library models included), their bias and
layouts, and conv -> BatchNorm seen in a forward's dataflow, whatever code built the layers."""

from __future__ import annotations

import copy
import importlib
import pickle
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from perfdoctor.capture.patches import ErrorLog  # noqa: E402
from perfdoctor.capture.probes.forward import ForwardProbe  # noqa: E402
from perfdoctor.capture.probes.modules import ModuleProbe  # noqa: E402
from tests.capture.test_program_unchanged import Clock  # noqa: E402

pytestmark = pytest.mark.slow  # torch in this process: run by CI, not in the fast tier


@pytest.fixture
def probes():
    err = ErrorLog()
    modules = ModuleProbe(torch, err)
    forward = ForwardProbe(torch, Clock(), err, modules)  # type: ignore[arg-type]
    modules.install()
    forward.install()
    yield forward
    forward.uninstall()
    modules.uninstall()
    assert not err.items


def _vgg(cfg=(64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")):
    layers: list = []
    c = 3
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(2)]
        else:
            layers.append(nn.Conv2d(c, v // 16, 3, padding=1))  # the line that builds all eight
            layers.append(nn.BatchNorm2d(v // 16))
            layers.append(nn.ReLU())
            c = v // 16
    return nn.Sequential(*layers)


def _line(fn, text):
    import inspect

    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def test_sequential_of_appended_layers_counts_its_convs_and_feeds_bn(probes):
    m = _vgg()
    m(torch.randn(2, 3, 32, 32))
    m(torch.randn(2, 3, 32, 32))
    (r,) = probes.records()
    t = r.tree
    assert t.layers["Conv2d"] == 8 and t.layers["BatchNorm2d"] == 8 and t.watched
    (g,) = t.convs
    assert g.site.line == _line(_vgg, "layers.append(nn.Conv2d") and g.site.file == __file__ and g.direct
    assert (g.layer, g.dims, g.count, g.bias, g.bias_into_norm, g.norm) == ("Conv2d", 2, 8, 8, 8, "BatchNorm2d")
    assert g.in_channels == 3 and g.inputs_seen == 8 and g.inputs_channels_last == 0
    assert g.params == sum(p.numel() for k in m if isinstance(k, nn.Conv2d) for p in k.parameters())


class _Block(nn.Module):
    """bn(conv(x)) in a forward, a residual conv with no norm, and a conv without bias."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.plain = nn.Conv2d(4, 4, 1)
        self.nobias = nn.Conv2d(4, 4, 1, bias=False)
        self.frozen = nn.BatchNorm2d(4, affine=False)

    def forward(self, x):
        return self.frozen(self.nobias(self.bn(self.conv(x)) + self.plain(x)))


def test_forward_dataflow_pairs_only_a_biased_conv_into_an_affine_bn(probes):
    m = _Block()
    m(torch.randn(1, 4, 8, 8))
    (r,) = probes.records()
    by_line = {g.site.line: g for g in r.tree.convs}
    conv = by_line[_line(_Block.__init__, "self.conv = ")]
    assert (conv.bias_into_norm, conv.norm) == (1, "BatchNorm2d")
    for text in ("self.plain = ", "self.nobias = "):
        g = by_line[_line(_Block.__init__, text)]
        assert (g.bias_into_norm, g.norm) == (0, None)
    assert by_line[_line(_Block.__init__, "self.nobias = ")].bias == 0
    # the 1x1 ones are pointwise (a matmul: PD016's search has nothing to choose), the 3x3 one is not
    assert [by_line[_line(_Block.__init__, t)].pointwise for t in ("self.conv = ", "self.plain = ", "self.nobias = ")] \
        == [0, 1, 1]


class _PreActBottleneck(nn.Module):
    """bearpaw/pytorch-pose's hourglass block: bn1 -> relu -> conv1 -> bn2 -> relu -> conv2 -> bn3 -> relu ->
    conv3, then `out += residual` in place, whose result the next block's bn1 reads."""

    def __init__(self):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(4)
        self.conv1 = nn.Conv2d(4, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)
        self.conv3 = nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.conv3(self.relu(self.bn2(self.conv1(self.relu(self.bn1(x))))))
        out += x
        return out


def test_an_in_place_op_on_the_conv_output_breaks_conv_into_bn(probes):
    m = nn.Sequential(_PreActBottleneck(), _PreActBottleneck())
    m(torch.randn(1, 4, 8, 8))
    (r,) = probes.records()
    by_line = {g.site.line: g for g in r.tree.convs}
    # conv1 feeds bn2 as it is: its bias is wasted
    assert by_line[_line(_PreActBottleneck.__init__, "self.conv1 = ")].bias_into_norm == 2
    # conv3's output gets the residual added in place before the next block's bn1: the bias is not
    # cancelled there alone (the sum is also the next block's residual)
    conv3 = by_line[_line(_PreActBottleneck.__init__, "self.conv3 = ")]
    assert (conv3.bias_into_norm, conv3.norm) == (0, None)


LIBRARY = '''
import torch.nn as nn


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.blocks = nn.Sequential(*[nn.Conv2d(8, 8, 3, padding=1, bias=False) for _ in range(4)])

    def forward(self, x):
        return self.blocks(self.bn(self.stem(x)))


def tiny_resnet():
    return TinyResNet()
'''


@pytest.fixture
def library(tmp_path, monkeypatch):
    """An installed model library (not the user's code): a package under site-packages."""
    site = tmp_path / "site-packages"
    (site / "fakevision").mkdir(parents=True)
    (site / "fakevision" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(site))
    yield importlib.import_module("fakevision")
    sys.modules.pop("fakevision", None)


def test_a_library_model_is_found_at_the_users_builder_call(probes, library):
    m = library.tiny_resnet()  # the user's line
    m = m.to(memory_format=torch.channels_last)
    m(torch.randn(1, 3, 32, 32).to(memory_format=torch.channels_last))
    (r,) = probes.records()
    assert r.module == "TinyResNet" and r.tree.layers["Conv2d"] == 5
    line = _line(test_a_library_model_is_found_at_the_users_builder_call, "library.tiny_resnet()")
    (g,) = r.tree.convs  # built inside the library, all at the user's one call
    assert (g.site.line, g.direct, g.count, g.bias) == (line, False, 5, 0)
    assert g.weights_channels_last == 5 and g.inputs_seen == 5 and g.inputs_channels_last == 5


def test_weights_converted_after_the_first_call_are_read_again(probes):
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    m(torch.randn(1, 3, 8, 8))
    m.to(memory_format=torch.channels_last)
    probes.stop_discovery()
    (r,) = probes.records()
    assert r.tree.convs[0].weights_channels_last == 1


def test_a_traced_first_call_is_not_watched_the_next_is(probes):
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    x = torch.randn(1, 3, 8, 8)
    traced = torch.jit.trace(m, x, check_trace=False)
    assert not probes.records()  # the forward jit.trace runs is not a call of the model (patches.tracing)
    m(x)
    (r,) = probes.records()
    assert r.tree.watched and r.tree.convs[0].bias_into_norm == 1
    assert torch.equal(traced(x), m(x))


def test_the_program_is_unchanged(probes):
    m = _vgg()
    x = torch.randn(2, 3, 32, 32)
    y = m(x)
    assert b"perfdoctor" not in pickle.dumps(m)
    assert vars(m).keys() == vars(_vgg()).keys() and not m._forward_hooks
    clone = copy.deepcopy(m)
    assert torch.equal(clone(x), y)
    conv = nn.Conv2d(3, 4, 3)
    assert b"perfdoctor" not in pickle.dumps(conv)
    import inspect

    assert list(inspect.signature(nn.Conv2d).parameters)[:3] == ["in_channels", "out_channels", "kernel_size"]


# -- facts: the run decides (perfdoctor/facts/run/modules.py) -----------------------------------

def _tree_record(groups, *, watched=True, module="VGG", site_line=99):
    from perfdoctor.contracts.run import ForwardRecord, ModuleTree, Site

    return ForwardRecord(site=Site(file="/p/train.py", line=site_line, code="model(x)", function="main"),
                         module=module, calls=3, params=1000,
                         tree=ModuleTree(modules=20, layers={"Conv2d": sum(g.count for g in groups)}, convs=groups,
                                         watched=watched))


def _group(line, *, direct=True, count=8, bias=8, fed=8, norm="BatchNorm2d", cl=0):
    from perfdoctor.contracts.run import ConvGroup, Site

    return ConvGroup(site=Site(file="/p/models.py", line=line, code="layers.append(nn.Conv2d(c, v, 3))",
                               function="make_layers"),
                     direct=direct, layer="Conv2d", dims=2, count=count, bias=bias, params=count * 100, in_channels=3,
                     weights_channels_last=cl, inputs_seen=count, bias_into_norm=fed, norm=norm if fed else None)


def test_run_facts_count_every_conv_and_pair_conv_bias_at_the_building_line():
    from perfdoctor.contracts.run import Probes
    from perfdoctor.facts.run import modules
    from perfdoctor.facts.run.context import RunContext

    lib = _group(21, direct=False, count=4, bias=0, fed=0)
    lib.pointwise = 1  # a downsampling 1x1 beside three 3x3
    ctx = RunContext(probes=Probes(forward=[_tree_record([_group(16)]), _tree_record([lib], module="ResNet")]))
    modules.add(ctx)
    nets = {s.key: s for s in ctx.facts.subjects["conv_net"]}
    vgg, resnet = nets["/p/models.py:16"], nets["/p/models.py:21"]
    assert (vgg.facts["conv_net.convs"].value, vgg.facts["conv_net.model"].value, vgg.facts["conv_net.dims"].value) == (8, "VGG", 2)
    assert resnet.facts["conv_net.convs"].value == 4 and resnet.facts["conv_net.convs"].source == "run"
    assert (vgg.facts["conv_net.spatial_convs"].value, resnet.facts["conv_net.spatial_convs"].value) == (8, 3)
    (cb,) = ctx.facts.subjects["conv_bias"]  # the library's layers are not the user's to change
    assert cb.key == "/p/models.py:16" and (cb.facts["conv_bias.count"].value, cb.facts["conv_bias.norm"].value) == (8, "BatchNorm2d")
    assert ctx.facts.value("layout.channels_last") is False
    assert modules.decided(ctx.probes.forward) == {"conv_net", "conv_bias"}


def test_channels_last_weights_seen_and_an_unwatched_tree_leaves_conv_bias_to_the_source():
    from perfdoctor.contracts.run import Probes
    from perfdoctor.facts.run import modules
    from perfdoctor.facts.run.context import RunContext

    forward = [_tree_record([_group(16, cl=8)], watched=False)]
    ctx = RunContext(probes=Probes(forward=forward))
    modules.add(ctx)
    assert ctx.facts.value("layout.channels_last") is True
    assert "conv_bias" not in ctx.facts.subjects  # a compiled forward hides the dataflow
    assert modules.decided(forward) == {"conv_net"}
    assert modules.decided([]) == frozenset()


def test_static_detectors_of_a_decided_kind_stand_down(tmp_path):
    from perfdoctor.facts.model import Facts
    from perfdoctor.facts.static import analyse_files

    path = tmp_path / "m.py"
    path.write_text("import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n")
    both, decided = Facts(), Facts()
    analyse_files([path], both)
    analyse_files([path], decided, decided=frozenset({"conv_net", "conv_bias"}))
    assert {"conv_net", "conv_bias"} <= set(both.subjects)
    assert not {"conv_net", "conv_bias"} & set(decided.subjects)


class _OddLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3)  # an image stem: 3 input channels are not counted
        self.conv = nn.Conv2d(16, 30, 3)
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
        self.head = nn.Linear(64, 5003)

    def forward(self, x):
        return self.head(self.mlp(self.conv(self.stem(x)).mean((2, 3)).repeat(1, 3)[:, :64]))


def test_layers_with_dims_not_multiples_of_8_grouped_by_the_line_that_built_them(probes):
    m = _OddLM()
    m(torch.randn(2, 3, 8, 8))
    (r,) = probes.records()
    groups = {g.layer: g for g in r.tree.misaligned}
    assert set(groups) == {"Conv2d", "Linear"}  # the aligned Linears and the stem are not there
    conv, head = groups["Conv2d"], groups["Linear"]
    assert conv.dims == ["out_channels 30"] and conv.names == ["_OddLM.conv"] and conv.direct
    assert head.dims == ["out_features 5003"] and head.names == ["_OddLM.head"] and head.count == 1
    assert head.site.line == _line(_OddLM.__init__, "self.head = nn.Linear") and head.params == 64 * 5003 + 5003


def test_embedding_tables_are_counted_apart_from_the_layers_that_multiply(probes):
    """A recommender's or a word model's vocabulary is parameters that are looked up, not multiplied:
    PD007 weighs the model by the rest (facts/run/forward.py: model.math_params)."""
    from perfdoctor.contracts.run import Probes
    from perfdoctor.facts.run import forward
    from perfdoctor.facts.run.context import RunContext

    class Rec(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(5000, 64)
            self.bag = nn.EmbeddingBag(1000, 64)
            self.mlp = nn.Sequential(nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 1))

        def forward(self, i, b):
            return self.mlp(torch.cat([self.items(i), self.bag(b)], 1))

    model = Rec()
    model(torch.randint(0, 5000, (4,)), torch.randint(0, 1000, (4, 3)))
    (r,) = [f for f in probes.forward if f.module == "Rec"]
    assert r.params == sum(p.numel() for p in model.parameters())
    assert r.lookup_params == 5000 * 64 + 1000 * 64
    ctx = RunContext(probes=Probes(forward=[r]))
    forward.add(ctx)
    (m,) = ctx.facts.subjects["model"]
    assert m.facts["model.math_params"].value == 128 * 32 + 32 + 32 + 1


class _PatchEmbed(nn.Module):
    """A ViT's one convolution, over non-overlapping 4x4 patches, beside an overlapping strided one."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 4, stride=4)
        self.down = nn.Conv2d(3, 8, 4, stride=2, padding=1)

    def forward(self, x):
        return self.patches(x).flatten(1).sum() + self.down(x).sum()


def test_a_patch_embedding_is_a_matmul_as_a_1x1_is(probes):
    """kernel = stride, no padding: each output is a linear map of one patch; cuDNN's search has no
    Winograd or FFT algorithm for it (PD016 on a ViT's patch embedding was a false finding, corpt)."""
    m = _PatchEmbed()
    m(torch.randn(1, 3, 16, 16))
    (r,) = probes.records()
    by_line = {g.site.line: g for g in r.tree.convs}
    assert [by_line[_line(_PatchEmbed.__init__, t)].pointwise for t in ("self.patches = ", "self.down = ")] == [1, 0]
