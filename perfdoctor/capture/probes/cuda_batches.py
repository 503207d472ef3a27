"""Whether a DataLoader's batches go to a CUDA device, and with `non_blocking` (CUDA runs only,
the first steps only): the DataLoader probe tags the CPU tensors of a batch, and `Tensor.to` /
`Tensor.cuda` report a tagged tensor moved to CUDA to its loader's state."""

from __future__ import annotations

from typing import Any

from perfdoctor.capture.patches import Patches


class CudaBatchProbe:
    def __init__(self, torch: Any):
        self.torch = torch
        self.patches = Patches()
        self.active = False  # installed: the DataLoader probe tags batches
        self.batch_ids: dict[int, Any] = {}  # id() of a tagged tensor -> its loader's state

    def install(self) -> None:
        T, probe = self.torch.Tensor, self
        orig_to, orig_cuda = T.to, T.cuda

        def seen(t: Any, out: Any, args: tuple, kwargs: dict) -> None:
            lrec = probe.batch_ids.get(id(t))
            if lrec is not None and getattr(out, "is_cuda", False):
                nb = bool(kwargs.get("non_blocking", any(a is True for a in args)))
                lrec.to_cuda = True
                lrec.non_blocking = nb if lrec.non_blocking is None else (lrec.non_blocking and nb)
                lrec.cuda_seen += 1

        def to(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_to(t, *args, **kwargs)
            if probe.batch_ids:
                seen(t, out, args, kwargs)
            return out

        def cuda(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_cuda(t, *args, **kwargs)
            if probe.batch_ids:
                seen(t, out, args, kwargs)
            return out

        self.patches.replace(T, "to", to)
        self.patches.replace(T, "cuda", cuda)
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
