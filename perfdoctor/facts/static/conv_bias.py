"""Convolutions with a bias directly followed by BatchNorm (PD028): one `conv_bias` subject per such
convolution, keyed on its line. BatchNorm subtracts each channel's mean, so the convolution's
per-channel bias cancels out: it costs a parameter tensor, an add and its gradient for nothing.

Two shapes are recognised: consecutive layers of `nn.Sequential(conv, bn, ...)`, and a forward
that calls `self.bn(self.conv(x))` with `self.conv` / `self.bn` built in the same class. A
convolution given `bias=False` (or a bias that is not a literal, or a positional one), and a BatchNorm given
`affine=False` (its bias cannot absorb the shift of frozen statistics), are left out, and so is a
layer of a model class the run never called (`SourceIndex.model_ran`: a file of several models)."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import dotted, kwarg

CONVS = frozenset(f"torch.nn.{k}{d}d" for d in (1, 2, 3) for k in ("Conv", "ConvTranspose"))
NORMS = frozenset({"torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d", "torch.nn.SyncBatchNorm"})
# Conv{1,2,3}d(in, out, kernel, stride, padding, dilation, groups, bias): a positional bias is left out
_BIAS_ARG = 7


def _is(index: SourceIndex, node: ast.AST, names: frozenset[str]) -> bool:
    return isinstance(node, ast.Call) and index.qual(node.func) in names


def _has_bias(call: ast.Call) -> bool:
    if len(call.args) > _BIAS_ARG:
        return False  # the fix sets `bias=` by keyword
    v = kwarg(call, "bias")
    if v is None:
        return not any(k.arg is None for k in call.keywords) and not any(isinstance(a, ast.Starred) for a in call.args)
    return isinstance(v, ast.Constant) and v.value is True


def _affine(call: ast.Call) -> bool:
    v = kwarg(call, "affine")
    return v is None or (isinstance(v, ast.Constant) and v.value is True)


def _pair(index: SourceIndex, facts: Facts, conv: ast.Call, norm: ast.Call, pattern: str) -> None:
    if _has_bias(conv) and _affine(norm) and index.model_ran(conv):
        s = index.subject(facts, "conv_bias", conv)
        put(s, "layer", (dotted(conv.func) or "").rsplit(".", 1)[-1])
        put(s, "norm", (dotted(norm.func) or "").rsplit(".", 1)[-1])
        put(s, "pattern", pattern)


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) == "torch.nn.Sequential":
            for a, b in zip(call.args, call.args[1:]):
                if _is(index, a, CONVS) and _is(index, b, NORMS):
                    assert isinstance(a, ast.Call) and isinstance(b, ast.Call)
                    _pair(index, facts, a, b, "sequential")
    for cls in (n for n in index.nodes if isinstance(n, ast.ClassDef)):
        built: dict[str, ast.Call] = {}  # self.<attr> = nn.Conv2d(...) / nn.BatchNorm2d(...)
        for n in ast.walk(cls):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call):
                t = dotted(n.targets[0])
                if t and t.startswith("self.") and (_is(index, n.value, CONVS) or _is(index, n.value, NORMS)):
                    built[t] = n.value
        for n in ast.walk(cls):  # self.bn(self.conv(x)): the conv's output feeds the norm alone
            if isinstance(n, ast.Call) and len(n.args) == 1 and isinstance(n.args[0], ast.Call):
                norm, conv = built.get(dotted(n.func) or ""), built.get(dotted(n.args[0].func) or "")
                if norm is not None and conv is not None and _is(index, norm, NORMS) and _is(index, conv, CONVS):
                    _pair(index, facts, conv, norm, "forward")
