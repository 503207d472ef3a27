"""TF32 settings in the source.

Statements that turn TF32 off (PD022): `torch.backends.cuda.matmul.allow_tf32 = False`,
`torch.backends.cudnn.allow_tf32 = False`, `torch.set_float32_matmul_precision("highest")`; one
`tf32` subject per statement, with the statement as written.

What the fp32 math of a CUDA-targeting script runs in on the GPU (facts/trace/target_gpu.py): the
global facts `script.tf32_matmul` (True where a statement lets matmuls use TF32: `allow_tf32 = True`,
precision "high" or "medium"; False where one keeps them fp32; absent: torch's default, fp32) and
`script.tf32_conv` (the value `torch.backends.cudnn.allow_tf32` is set to; absent: torch's default,
True). Where statements disagree (a setting per path), the one that lets TF32 run wins: the estimate
it feeds is then the faster math, the smaller share of the step."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

_MATMUL = "torch.backends.cuda.matmul.allow_tf32"
_CUDNN = "torch.backends.cudnn.allow_tf32"
_PRECISION = "torch.set_float32_matmul_precision"


def _setting(facts: Facts, name: str, on: bool, statement: str) -> None:
    prior = facts.get(name)
    if prior is None or (prior.source == "static" and on and not prior.value):
        facts.add(name, on, "bool", "static", statement)


def detect(index: SourceIndex, facts: Facts) -> None:
    for node in index.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool):
            on = node.value.value
            for target in (index.qual(t) for t in node.targets):
                if target not in (_MATMUL, _CUDNN):
                    continue
                _setting(facts, "script.tf32_matmul" if target == _MATMUL else "script.tf32_conv", on, index.text(node))
                if not on:
                    put(index.subject(facts, "tf32", node), "setting", index.text(node))
        elif (isinstance(node, ast.Call) and index.qual(node.func) == _PRECISION
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            precision = node.args[0].value
            _setting(facts, "script.tf32_matmul", precision != "highest", index.text(node))
            if precision == "highest":
                put(index.subject(facts, "tf32", node), "setting", index.text(node))
