"""Convolutional models (PD016 cudnn-benchmark, PD023 channels-last): one `conv_net` subject per
file that constructs convolution layers, keyed on the first one, with the layer as written, its
spatial dimensions, how many the file constructs and how many of them have a kernel of more than
one element (a literal `kernel_size=1` is a pointwise matmul); the layers of a model class the run never
called are not counted (`SourceIndex.model_ran`)."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

# torch.nn's convolutions (cuDNN runs them on CUDA) -> spatial dimensions
CONVS = {f"torch.nn.{kind}{d}d": d for d in (1, 2, 3) for kind in ("Conv", "ConvTranspose", "LazyConv",
                                                                   "LazyConvTranspose")}


def detect(index: SourceIndex, facts: Facts) -> None:
    convs = [c for c in index.calls if index.qual(c.func) in CONVS and index.model_ran(c)]
    if not convs:
        return
    first = min(convs, key=lambda c: (c.lineno, c.col_offset))
    s = index.subject(facts, "conv_net", first)
    put(s, "layer", index.text(first.func))
    put(s, "dims", max(CONVS[index.qual(c.func) or ""] for c in convs), "count")
    put(s, "convs", len(convs), "count")
    put(s, "spatial_convs", sum(not _pointwise(c) for c in convs), "count")


def _pointwise(call: ast.Call) -> bool:
    """The call's kernel_size (third positional or keyword) is a literal 1 or a tuple of 1s."""
    k = call.args[2] if len(call.args) > 2 else next((kw.value for kw in call.keywords if kw.arg == "kernel_size"), None)
    items = k.elts if isinstance(k, (ast.Tuple, ast.List)) else [k]
    return bool(items) and all(isinstance(e, ast.Constant) and e.value == 1 for e in items)
