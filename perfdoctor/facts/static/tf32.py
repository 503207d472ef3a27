"""Statements that turn TF32 off (PD022): `torch.backends.cuda.matmul.allow_tf32 = False`,
`torch.backends.cudnn.allow_tf32 = False`, `torch.set_float32_matmul_precision("highest")`; one
`tf32` subject per statement, with the statement as written."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

_FLAGS = frozenset({"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for node in index.nodes:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is False
                and any(index.qual(t) in _FLAGS for t in node.targets)):
            put(index.subject(facts, "tf32", node), "setting", index.text(node))
        elif (isinstance(node, ast.Call) and index.qual(node.func) == "torch.set_float32_matmul_precision"
              and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "highest"):
            put(index.subject(facts, "tf32", node), "setting", index.text(node))
