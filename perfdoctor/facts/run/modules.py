"""The module probe's trees (capture/probes/modules.py, in probes.json `forward[].tree`) -> the conv
nets the run called and the convolutions whose bias a BatchNorm cancels, from what the run saw:
library models (a torchvision ResNet, found at the user's builder call), `nn.Sequential(*layers)`
built in any file, every convolution counted.

One `conv_net` subject per top-level module with convolutions (PD016, PD023), keyed on the line that
built its first one (the user's `nn.Conv2d(...)`, or the builder call of a library model); the
global `layout.channels_last` from the weights' and the watched inputs' layouts. One `conv_bias`
subject per user line that built convolutions with a bias whose output an affine BatchNorm took in
the watched forward (PD028); a library's layers are not the user's to change. Where the run read
the trees, the static detectors of the same kinds stand down (`decided`)."""

from __future__ import annotations

from perfdoctor.contracts.run import ConvGroup, ForwardRecord, LayerGroup, ModuleTree
from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    trees = [(f, f.tree) for f in ctx.probes.forward if f.tree is not None]
    convs = [(f, t) for f, t in trees if t.convs]
    for f, t in convs:
        _conv_net(ctx, f, t)
    if convs:
        _layout(ctx, [t for _, t in convs])
    for f, t in trees:
        for lg in t.misaligned:
            _misaligned(ctx, f, lg)
    for _, t in convs:
        if t.watched:
            for g in t.convs:
                _conv_bias(ctx, g)


def decided(forward: list[ForwardRecord]) -> frozenset[str]:
    """The subject kinds the run decided, whose static detectors then stand down: conv_net where
    the run read the trees of the modules it called, conv_bias where it also watched a forward of
    every tree holding convolutions (compiled code hides the dataflow)."""
    trees = [f.tree for f in forward if f.tree is not None]
    if not trees:
        return frozenset()
    if all(t.watched for t in trees if t.convs):
        return frozenset({"conv_net", "conv_bias"})
    return frozenset({"conv_net"})


def _conv_net(ctx: RunContext, f: ForwardRecord, t: ModuleTree) -> None:
    first = next((g for g in t.convs if g.site is not None), None)
    s = site_subject(ctx.facts, "conv_net", first.site if first is not None else f.site)
    if s is None:
        return
    n = sum(g.count for g in t.convs)
    where = "the model's own line" if first is not None and first.direct else "the call that built the model"
    s.add("layer", t.convs[0].layer, detail=f"the first convolution of {f.module}, built at {where}")
    s.add("dims", max(g.dims for g in t.convs), "count")
    s.add("convs", n, "count", detail=f"convolution modules in {f.module}'s tree, as the run called it")
    s.add("spatial_convs", n - sum(g.pointwise for g in t.convs), "count",
          detail="of them, with a kernel of more than one element over overlapping windows (not 1x1, "
                 "not a patch embedding: kernel = stride)")
    s.add("model", f.module)
    s.add("conv_params", sum(g.params for g in t.convs), "count")
    s.add("min_in_channels", min(g.in_channels for g in t.convs), "count")


def _layout(ctx: RunContext, trees: list[ModuleTree]) -> None:
    groups = [g for t in trees for g in t.convs if g.dims == 2]
    if not groups:
        return
    weights = sum(g.weights_channels_last for g in groups)
    inputs = sum(g.inputs_channels_last for g in groups)
    seen = sum(g.inputs_seen for g in groups)
    total = sum(g.count for g in groups)
    ctx.facts.add("layout.channels_last", bool(weights or inputs), source="run",
                  detail=f"{weights} of {total} 2-D convolution weights and {inputs} of {seen} inputs seen "
                         "in torch.channels_last")


def _conv_bias(ctx: RunContext, g: ConvGroup) -> None:
    if not (g.direct and g.bias_into_norm and g.norm):
        return
    s = site_subject(ctx.facts, "conv_bias", g.site)
    if s is None:
        return
    s.add("layer", g.layer)
    s.add("norm", g.norm)
    s.add("pattern", "run", detail="the run saw the convolution's output go straight into the BatchNorm")
    s.add("count", g.bias_into_norm, "count", detail=f"of {g.count} convolutions built at this line")


def _misaligned(ctx: RunContext, f: ForwardRecord, g: LayerGroup) -> None:
    """A `misaligned` subject (PD034) per user line that built Linear or convolution layers with
    dimensions not multiples of 8: the dimensions, the layers' share of the step's FLOPs where the FLOP
    probe counted a step (its modules by name), else for Linear layers their share of the model's weights,
    and the model's dtype and autocast state."""
    s = site_subject(ctx.facts, "misaligned", g.site)
    if s is None:
        return
    s.add("layer", g.layer)
    s.add("dims", ", ".join(g.dims), detail="the dimensions that are not multiples of 8")
    s.add("count", g.count, "count", detail=f"{g.layer} layers built at this line in {f.module}'s tree")
    s.add("direct", g.direct, "bool", detail="the line itself constructs the layer (not a library's builder it calls)")
    rec = ctx.probes.flops
    if rec is not None and rec.flops > 0:
        mine = sum(rec.modules.get(n, 0) for n in g.names)
        s.add("flops_share", round(mine / rec.flops, 4), "ratio",
              detail=f"{mine:,} of the {rec.flops:,} FLOPs FlopCounterMode counted on step {rec.step}")
    elif g.layer == "Linear" and f.params and g.params:
        # no step counted (compiled code, an early profiler window): a Linear's FLOPs per token are twice
        # its weights, so its share of the model's weights stands for its share of the matmul FLOPs
        s.add("weight_share", round(g.params / f.params, 4), "ratio",
              detail=f"{g.params:,} of {f.module}'s {f.params:,} parameters (no step's FLOPs counted)")
    if f.param_dtype:
        s.add("param_dtype", f.param_dtype, detail=f"{f.module}'s parameters")
    s.add("autocast", f.autocast, "bool", detail=f"autocast was on in at least half of {f.module}'s forward calls")
