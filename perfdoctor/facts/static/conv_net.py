"""Convolutional models (PD016 cudnn-benchmark, PD023 channels-last): one `conv_net` subject per
file that constructs convolution layers, keyed on the first one, with the layer as written, its
spatial dimensions and how many the file constructs; the layers of a model class the run never
called are not counted (`SourceIndex.model_ran`)."""

from __future__ import annotations

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
