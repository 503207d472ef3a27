"""The global fact `script.targets_cuda`: do the files name a CUDA device (a `"cuda"` / `"cuda:N"`
string, or a `.cuda(...)` call) or select one (`torch.cuda.is_available()`, `torch.cuda.set_device`,
`torch.accelerator.current_accelerator()`: pytorch/examples pick the accelerator that way), or build
a Lightning Trainer, Fabric or LightningCLI that picks the GPU by itself (accelerator "auto", the
default, "gpu" or "cuda"), or a Hugging Face Accelerate `Accelerator` not told `cpu=True`, or a
Transformers `Trainer` (whose TrainingArguments pick CUDA where there is one)? It is the
union over the files of one read: each file's detector raises an earlier file's static False to True,
and a value from another source is kept."""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, add_union

_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_FACT = "script.targets_cuda"
_SELECTS = ("torch.cuda.", "torch.accelerator.")  # device selection: is_available, set_device, current_accelerator


def _names_cuda(index: SourceIndex) -> bool:
    for node in index.nodes:
        if isinstance(node, ast.Call) and index.frameworks.framework_picks_gpu(node):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CUDA_STRING.match(node.value):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            return True
        if isinstance(node, ast.Call) and (index.qual(node.func) or "").startswith(_SELECTS):
            return True
    return False


def detect(index: SourceIndex, facts: Facts) -> None:
    add_union(facts, _FACT, _names_cuda(index), "the files name a CUDA device", "no CUDA device named in the files")
