"""FLOPs per step counted by `torch.utils.flop_counter.FlopCounterMode` on one real training step.

The mode is entered at the end of step COUNT_STEP - 1 (after the other probes' bookkeeping) and left
at the end of step COUNT_STEP: the script's own step COUNT_STEP runs under it, forward, backward and
optimizer alike (the mode is thread-local state that autograd carries to its backward threads). No
step is added and nothing is computed again: the mode runs each operator as it would run and adds up
the FLOPs of the ones in torch's FLOP registry (matmuls, convolutions, attention), by the module
each ran in (`torch.utils.module_tracker.ModuleTracker`: global module forward hooks and, on the
tensors an operator made that need gradients, multi-grad hooks that say which module's backward runs
(never on a leaf: there the hook would make the script's `autograd.grad(..., inputs=leaf)` raise); all
removed at the mode's exit). An operator with a sparse operand (COO, CSR: `torch.sparse.mm` of a graph's
adjacency) is not counted: the registry counts it as the dense product (2*M*K*N, where the work is
2*nnz*N), and autocast does not run it in 16 bits. What it costs: every operator of that step goes through Python, so the step is
slower; it is a warm-up step (`stats.warmup_steps` drops at least the first two), never a steady one.

Not counted (no record): a step that torch.compile's code runs, or any step once dynamo has seen a
frame (`_dynamo_ran`: the compiled kernels are not the operators the mode counts, and a mode or global
module hooks in the way make dynamo warn and compile again), a step the profiled
window holds, a step the main thread does not end, or a torch without `FlopCounterMode`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import FlopRecord

COUNT_STEP = 2  # the step counted (1 is the first)
MAX_MODULES = 64  # modules kept, by their FLOPs
_SIXTEEN = ("torch.float16", "torch.bfloat16")


def _dynamo_ran() -> bool:
    """Whether dynamo (torch.compile, torch.export) has done anything in this process: its counters
    (`torch._dynamo.utils.counters`, the ones a script may print) count every frame it saw. A dispatch
    mode and global module hooks in the way of compiled code make dynamo warn and compile again (a
    graph count the script prints changes): where dynamo ran, no step is counted. Read only if the
    script loaded dynamo; the probe never imports it."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return any(sum(c.values()) for c in utils.counters.values())
    except Exception:  # noqa: BLE001  (another torch's counters: count nothing)
        return True


class FlopProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.main = threading.get_ident()
        self.counter: Any = None
        self.sixteen = 0  # FLOPs of operators whose first tensor operand was 16-bit
        self.forward: dict[str, int] = {}  # module name -> the FLOPs of its forward (not its backward)
        self.order: dict[str, str] = {}  # module name -> "Class_k", its class's k-th module to run a forward
        self.record: FlopRecord | None = None

    def install(self) -> None:
        pass

    def uninstall(self) -> None:
        self._leave(None)

    def merge_steps(self) -> None:
        """A stronger step clock took over: what was counted was not its step."""
        self._leave(None)
        self.record = None

    def step_ended(self, i: int) -> None:
        """Step `i` ended (its time taken): the first thing done then, so that the count is the step's."""
        if i == COUNT_STEP:
            self._leave(i)

    def after_step(self, i: int, free: bool) -> None:
        """The last thing done at step `i`'s end. `free`: no profiler window and no compiled code in the way."""
        if i == COUNT_STEP - 1 and free and threading.get_ident() == self.main:
            self._enter()

    def _enter(self) -> None:
        if _dynamo_ran():
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode
        except ImportError:
            return
        probe = self
        in_backward = self.torch._C._current_graph_task_id
        strided, tensor = self.torch.strided, self.torch.Tensor

        class Counter(FlopCounterMode):
            def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
                if any(isinstance(a, tensor) and a.layout != strided for a in args):
                    return out  # a sparse operand: FlopCounterMode would count the dense product's FLOPs
                glob = self.flop_counts["Global"]
                before = glob.get(func_packet, 0)
                res = super()._count_flops(func_packet, out, args, kwargs)
                added = glob.get(func_packet, 0) - before
                if added:
                    if args and str(getattr(args[0], "dtype", "")) in _SIXTEEN:
                        probe.sixteen += added
                    if in_backward() == -1:
                        for m in self.mod_tracker.parents:
                            probe.forward[m] = probe.forward.get(m, 0) + added
                return res

        try:
            from torch.autograd.graph import register_multi_grad_hook
            from torch.utils._pytree import tree_flatten

            c = Counter(display=False)
            tracker: Any = c.mod_tracker
            classes: dict[str, int] = {}

            def _grad_hook(values: Any, fn: Any) -> None:
                # ModuleTracker's own hooks put a multi-grad hook on every tensor needing a gradient that
                # goes into or out of a module; on a leaf (`x.requires_grad_()` fed to a critic) that hook
                # raises inside `autograd.grad(outputs, inputs=x)` (WGAN-GP's gradient penalty): the
                # script's own call would fail. Only tensors an operator made (grad_fn) get one here; a
                # module whose input is a leaf stays among the backward's parents until the backward's
                # end (its backward is attributed a little more than it ran), the program is untouched.
                tensors = [a for a in tree_flatten(values)[0]
                           if isinstance(a, probe.torch.Tensor) and a.requires_grad and a.grad_fn is not None]
                if tensors:
                    tracker._hooks.append(register_multi_grad_hook(tensors, fn))

            def _fw_pre_hook(mod: Any, inputs: Any) -> Any:  # ModuleTracker's, and the profiler's "Class_k" order
                try:  # in the script's forward: nothing may reach it
                    name = tracker._get_mod_name(mod)
                    tracker._get_append_fn(name, False)()
                    _grad_hook(inputs, tracker._get_pop_fn(name, True))
                    if name not in probe.order and len(probe.order) < MAX_MODULES * 16:
                        cls = type(mod).__name__
                        probe.order[name] = f"{cls}_{classes.get(cls, 0)}"
                        classes[cls] = classes.get(cls, 0) + 1
                except Exception as e:  # noqa: BLE001
                    probe.err("flops", e)

            def _fw_post_hook(mod: Any, inputs: Any, output: Any) -> Any:
                try:
                    name = tracker._get_mod_name(mod)
                    tracker._get_pop_fn(name, False)()
                    _grad_hook(output, tracker._get_append_fn(name, True))
                except Exception as e:  # noqa: BLE001
                    probe.err("flops", e)

            tracker._fw_pre_hook = _fw_pre_hook  # instance attributes, read by its __enter__
            tracker._fw_post_hook = _fw_post_hook
            c.__enter__()
            self.counter = c
        except Exception as e:  # noqa: BLE001
            self.err("flops", e)

    def _leave(self, i: int | None) -> None:
        c, self.counter = self.counter, None
        if c is None:
            return
        try:
            c.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001  (a mode the script entered and left open above ours)
            self.err("flops", e)
            return
        if i is None:
            return  # the script ended inside the counted step: it was not a whole step
        try:
            counts = c.get_flop_counts()
            total = int(sum(counts.get("Global", {}).values()))
            ops: dict[str, int] = {}
            for op, n in counts.get("Global", {}).items():
                ops[str(op)] = ops.get(str(op), 0) + int(n)
            mods = sorted(((k, int(sum(v.values()))) for k, v in counts.items() if k != "Global"),
                          key=lambda kv: -kv[1])[:MAX_MODULES]
            self.record = FlopRecord(step=i, flops=total, sixteen_bit_flops=int(self.sixteen), ops=ops,
                                     modules={k: v for k, v in mods if v > 0},
                                     forward={k: self.forward.get(k, 0) for k, v in mods if v > 0},
                                     order={k: self.order[k] for k, v in mods if v > 0 and k in self.order})
        except Exception as e:  # noqa: BLE001
            self.err("flops", e)

    def records(self) -> FlopRecord | None:
        return self.record
