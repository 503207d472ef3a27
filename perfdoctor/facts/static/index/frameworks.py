"""Training frameworks: Lightning, Hugging Face Accelerate and the Transformers Trainer, as a file builds them.

Whether a framework's construction runs on a GPU where there is one (`framework_picks_gpu`), whether
some call gives a framework the CPU (`gives_framework_the_cpu`), whether a node is a Lightning
Trainer (`lightning_trainer`) or an Accelerate `Accelerator` that places batches on its device
(`accelerator_places`). Reads the file through `Syntax`.
"""

from __future__ import annotations

import ast

from perfdoctor.facts.static.index.syntax import Syntax, dotted, kwarg

LIGHTNING_TRAINERS = frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
                                "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer"})
ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# Lightning's Trainer, Fabric and LightningCLI (which builds a Trainer): their accelerator defaults to "auto"
LIGHTNING = LIGHTNING_TRAINERS | {"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                                  "lightning.pytorch.cli.LightningCLI", "pytorch_lightning.cli.LightningCLI"}
_PICKS_GPU = frozenset({"auto", "gpu", "cuda"})
# The Transformers Trainer takes its device from TrainingArguments: CUDA wherever there is one, unless
# told use_cpu=True (no_cuda=True before transformers 4.34); the arguments usually come from the command line
HF_TRAINERS = frozenset({"transformers.Trainer", "transformers.trainer.Trainer", "transformers.Seq2SeqTrainer",
                         "transformers.trainer_seq2seq.Seq2SeqTrainer"})
HF_TRAINING_ARGS = frozenset({"transformers.TrainingArguments", "transformers.training_args.TrainingArguments",
                              "transformers.Seq2SeqTrainingArguments",
                              "transformers.training_args_seq2seq.Seq2SeqTrainingArguments"})


class Frameworks:
    """The training frameworks one file builds."""

    def __init__(self, syntax: Syntax):
        self.syntax = syntax
        self._framework_cpu: bool | None = None  # `gives_framework_the_cpu`

    def gives_framework_the_cpu(self) -> bool:
        """Some call of this file gives a training framework the CPU (`framework_picks_gpu` False)."""
        if self._framework_cpu is None:
            self._framework_cpu = any(self.framework_picks_gpu(c) is False for c in self.syntax.calls)
        return self._framework_cpu

    def framework_picks_gpu(self, call: ast.Call) -> bool | None:
        """For a training framework's construction, whether it runs on a GPU where there is one: a
        Lightning Trainer / Fabric / LightningCLI left on accelerator "auto" (the default) or told
        "gpu" / "cuda" (or a value that is one of them where CUDA is available), a Hugging Face Accelerate `Accelerator` not told `cpu=True` (a `cpu=args.cpu`
        flag is an opt-in: the script's own path is the GPU), a Transformers `Trainer` (its
        TrainingArguments pick CUDA where there is one) or `TrainingArguments` not told `use_cpu=True` /
        `no_cuda=True`; None for any other call."""
        q = self.syntax.qual(call.func)
        if q in LIGHTNING:
            acc = kwarg(call, "accelerator")
            return acc is None or any(isinstance(v, ast.Constant) and v.value in _PICKS_GPU
                                      for v in self._choices(acc))
        if q in ACCELERATORS:
            cpu = kwarg(call, "cpu")
            return not (isinstance(cpu, ast.Constant) and cpu.value is True)
        if q in HF_TRAINERS:
            return True
        if q in HF_TRAINING_ARGS:
            return not any(isinstance(v := kwarg(call, k), ast.Constant) and v.value is True
                           for k in ("use_cpu", "no_cuda"))
        return None

    def _choices(self, node: ast.expr, depth: int = 0) -> list[ast.expr]:
        """The values an argument can take as the file spells them: both branches of a conditional
        (`"gpu" if torch.cuda.is_available() else "cpu"`: the GPU wherever there is one) and what a
        name is assigned; a value the file does not spell out (`args.accelerator`) as itself."""
        if isinstance(node, ast.IfExp):
            return self._choices(node.body, depth) + self._choices(node.orelse, depth)
        if isinstance(node, ast.Name) and depth < 3 and self.syntax.assigned.get(node.id):
            return [v for a in self.syntax.assigned[node.id] for v in self._choices(a, depth + 1)]
        return [node]

    def _made_by(self, node: ast.AST, makers: frozenset[str], usual_name: str) -> list[ast.Call] | None:
        """The calls of `makers` that `node` stands for (`bound_calls`); None where the file binds it
        to nothing and its name is the usual one for such an object (a parameter `accelerator`,
        LightningCLI's `cli.trainer`); [] where it is something else."""
        calls = self.syntax.bound_calls(node)
        made = [c for c in calls if self.syntax.qual(c.func) in makers]
        if made or calls:
            return made
        return None if (dotted(node) or "").rsplit(".", 1)[-1] == usual_name else []

    def lightning_trainer(self, node: ast.AST) -> bool:
        """`node` is a Lightning Trainer: a `Trainer(...)` call or a name bound to one, or a
        `trainer` the file does not bind (LightningCLI's `cli.trainer`)."""
        return self._made_by(node, LIGHTNING_TRAINERS, "trainer") != []

    def accelerator_places(self, node: ast.AST) -> bool:
        """`node` is a Hugging Face Accelerate `Accelerator` that places batches on its device: an
        `Accelerator(...)` call or a name bound to one, without `device_placement=False`, or an
        `accelerator` the file does not bind (a function's parameter)."""
        made = self._made_by(node, ACCELERATORS, "accelerator")
        return made is None or any(
            not (isinstance(v := kwarg(c, "device_placement"), ast.Constant) and v.value is False) for c in made)
