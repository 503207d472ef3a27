"""Whether a DataLoader's batches go to a CUDA device, and with `non_blocking` (CUDA runs only,
for `WATCH_STEPS` steps): the DataLoader probe tags the CPU tensors of a batch, and the ways a
tagged tensor reaches a CUDA device report it to its loader's state: `Tensor.to`, `Tensor.cuda`,
`torch.as_tensor(..., device=)` and `Tensor.copy_` into a device buffer.

The watch starts at the first step end at which CUDA is initialised, whenever that is (a script
may build its model on the CPU and move it later), and ends `WATCH_STEPS` steps after. Inside code
that torch.compile traces, the wrappers call the original and nothing else, so the compiled graph
is the one the script would get without perfdoctor. A move the probe cannot see (inside compiled
code, a custom extension) leaves `to_cuda` false; the trace's pageable host-to-device copies then
speak for the loader (rule PD003).
"""

from __future__ import annotations

from typing import Any

from perfdoctor.capture.patches import Patches, tracing

WATCH_STEPS = 30  # steps the moves are watched for, from the step at which CUDA was first seen


class CudaBatchProbe:
    def __init__(self, torch: Any):
        self.torch = torch
        self.patches = Patches()
        self.active = False  # installed: the DataLoader probe tags batches
        self.done = False  # watched its steps: never installed again
        self.until = 0  # the last step watched
        self.batch_ids: dict[int, Any] = {}  # id() of a tagged tensor -> its loader's state

    def end_step(self, i: int) -> None:
        """Per step: start watching once CUDA is initialised, stop `WATCH_STEPS` steps later."""
        if self.done:
            return
        if not self.active:
            if self.torch.cuda.is_initialized():
                self.install()
                self.until = i + WATCH_STEPS
        elif i >= self.until:
            self.uninstall()
            self.done = True

    def install(self) -> None:
        torch, probe = self.torch, self
        T = torch.Tensor
        orig_to, orig_cuda, orig_copy, orig_as_tensor = T.to, T.cuda, T.copy_, torch.as_tensor
        compiling = tracing(torch)

        def seen(t: Any, out: Any, nb: bool) -> None:
            lrec = probe.batch_ids.get(id(t))
            if lrec is not None and getattr(out, "is_cuda", False):
                lrec.to_cuda = True
                lrec.non_blocking = nb if lrec.non_blocking is None else (lrec.non_blocking and nb)
                lrec.cuda_seen += 1

        def to(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_to(t, *args, **kwargs)
            if probe.batch_ids and not compiling():
                seen(t, out, bool(kwargs.get("non_blocking", any(a is True for a in args))))
            return out

        def cuda(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_cuda(t, *args, **kwargs)
            if probe.batch_ids and not compiling():
                seen(t, out, bool(kwargs.get("non_blocking", any(a is True for a in args))))
            return out

        def copy_(dst: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_copy(dst, src, *args, **kwargs)
            if probe.batch_ids and not compiling():
                seen(src, dst, bool(kwargs.get("non_blocking", any(a is True for a in args))))
            return out

        def as_tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_as_tensor(data, *args, **kwargs)
            if probe.batch_ids and not compiling() and out is not data:
                seen(data, out, False)  # as_tensor has no non_blocking: the copy is synchronous
            return out

        for f, o in ((to, orig_to), (cuda, orig_cuda), (copy_, orig_copy), (as_tensor, orig_as_tensor)):
            setattr(f, "__wrapped__", o)  # noqa: B010 - mypy does not allow the attribute on a function
        self.patches.replace(T, "to", to)
        self.patches.replace(T, "cuda", cuda)
        self.patches.replace(T, "copy_", copy_)
        self.patches.replace(torch, "as_tensor", as_tensor)
        self.active = True

    def uninstall(self) -> None:
        self.patches.undo()
        self.batch_ids = {}
        self.active = False  # stop tagging batches

    def tag(self, batch: Any, lrec: Any) -> None:
        """Remember the CPU tensors of `batch` (a few levels into lists, tuples, dicts) as `lrec`'s."""
        T = self.torch.Tensor
        ids: dict[int, Any] = {}
        todo = [batch]
        for _ in range(64):
            if not todo:
                break
            b = todo.pop()
            if isinstance(b, T):
                if not b.is_cuda:
                    ids[id(b)] = lrec
            elif isinstance(b, (list, tuple)):
                todo.extend(b[:16])
            elif isinstance(b, dict):
                todo.extend(list(b.values())[:16])
        self.batch_ids = ids
