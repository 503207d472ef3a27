"""`zero_grad(set_to_none=...)` calls (PD026): one `zero_grad` subject per call that passes
`set_to_none=` as a literal keyword, with `grads_read`: whether the file reads a tensor's `.grad` at all
(code that reads gradients may rely on them being zero tensors rather than None)."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import kwarg


def detect(index: SourceIndex, facts: Facts) -> None:
    calls = []
    for call in index.calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "zero_grad":
            v = kwarg(call, "set_to_none")
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                calls.append((call, v.value))
    if not calls:
        return
    reads = any(isinstance(n, ast.Attribute) and n.attr == "grad" and isinstance(n.ctx, ast.Load) for n in index.nodes)
    for call, value in calls:
        s = index.subject(facts, "zero_grad", call)
        put(s, "set_to_none", value)
        put(s, "grads_read", reads)
