"""The global fact `script.targets_cuda`: do the files name a CUDA device (a `"cuda"` / `"cuda:N"`
string, or a `.cuda(...)` call) or select one (`torch.cuda.is_available()`, `torch.cuda.set_device`,
`torch.accelerator.current_accelerator()`: pytorch/examples pick the accelerator that way), or build
a Lightning Trainer, Fabric or LightningCLI that picks the GPU by itself (accelerator "auto", the
default, "gpu" or "cuda"), or a Hugging Face Accelerate `Accelerator` not told `cpu=True`? It is the
union over the files of one read: each file's detector raises an earlier file's static False to True,
and a value from another source is kept."""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import ACCELERATORS, LIGHTNING_TRAINERS, SourceIndex, add_union, kwarg

_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_FACT = "script.targets_cuda"
_SELECTS = ("torch.cuda.", "torch.accelerator.")  # device selection: is_available, set_device, current_accelerator


# Lightning's Trainer, Fabric and LightningCLI (which builds a Trainer) pick a GPU where there is one:
# their accelerator defaults to "auto"
_LIGHTNING = LIGHTNING_TRAINERS | {"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                                   "lightning.pytorch.cli.LightningCLI", "pytorch_lightning.cli.LightningCLI"}
_PICKS_GPU = frozenset({"auto", "gpu", "cuda"})


def _lightning_picks_gpu(index: SourceIndex, call: ast.Call) -> bool:
    """A Trainer / Fabric / LightningCLI left to choose (no accelerator, or "auto"), or told "gpu"/"cuda"."""
    if index.qual(call.func) not in _LIGHTNING:
        return False
    acc = kwarg(call, "accelerator")
    return acc is None or isinstance(acc, ast.Constant) and acc.value in _PICKS_GPU


def _accelerate_picks_gpu(index: SourceIndex, call: ast.Call) -> bool:
    """Hugging Face Accelerate's `Accelerator(...)` not told `cpu=True` (a `cpu=args.cpu` flag is the
    user's opt-in to the CPU: the script's own path is the GPU)."""
    if index.qual(call.func) not in ACCELERATORS:
        return False
    cpu = kwarg(call, "cpu")
    return not (isinstance(cpu, ast.Constant) and cpu.value is True)


def _names_cuda(index: SourceIndex) -> bool:
    for node in index.nodes:
        if isinstance(node, ast.Call) and (_lightning_picks_gpu(index, node) or _accelerate_picks_gpu(index, node)):
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
