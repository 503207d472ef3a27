"""What a probe changed in torch (or os), so that it can put it back; and the probes' error log."""

from __future__ import annotations

import functools
import types
from typing import Any

MAX_ERRORS = 20


class Patches:
    """Attributes one probe replaced and hooks it registered, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Any] = []

    def replace(self, owner: Any, name: str, new: Any) -> Any:
        """Set `owner.name` to `new`; return what it was. A wrapper function takes the original's name,
        doc and signature (`functools.update_wrapper`: `__wrapped__`), so that what reads them sees
        the bare function: Lightning re-creates a DataLoader from `inspect.signature(__init__)`'s
        parameters, and a wrapper's `(loader, *args, **kwargs)` made it ask for a `loader` attribute."""
        had = name in vars(owner)
        old = getattr(owner, name)
        if isinstance(new, types.FunctionType) and callable(old):
            functools.update_wrapper(new, old)
        setattr(owner, name, new)
        self._undo.append((owner, name, old, had))
        return old

    def hook(self, handle: Any) -> Any:
        """Keep a hook's removable handle."""
        self._undo.append(handle)
        return handle

    def undo(self) -> None:
        for u in reversed(self._undo):
            if isinstance(u, tuple):
                owner, name, old, had = u
                if had:
                    setattr(owner, name, old)
                else:
                    try:
                        delattr(owner, name)
                    except AttributeError:
                        pass
            else:
                u.remove()
        self._undo = []


class ErrorLog:
    """Probe errors: the first few are kept for meta.json, none is raised into the user's script."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def __call__(self, where: str, e: BaseException) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append(f"{where}: {type(e).__name__}: {e}")
