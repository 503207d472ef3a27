"""The script's own profiler (`torch.profiler.profile`, `torch.autograd.profiler.profile`,
`torch.autograd.profiler_legacy.profile`). kineto runs one profiler at a time: a script that profiles
itself while perfdoctor's window records crashes the process (nanoGPT's bench.py --profile=True
segfaulted), or fails ("Profiler is already enabled on this thread"). The first two APIs prepare
their trace through `torch.autograd.profiler.profile._prepare_trace`, the legacy one starts its own
through `_start_trace`; a call of either that is not perfdoctor's own ends perfdoctor's window first
(`Window.yield_to_user`), and the script's profiler runs as it does bare."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfdoctor.capture.patches import ErrorLog, Patches


class UserProfilerGuard:
    def __init__(self, torch: Any, window: Callable[[], Any], err: ErrorLog):
        self.torch = torch
        self.window = window  # the recorder's current window (a stronger step clock replaces it)
        self.err = err
        self.patches = Patches()

    def install(self) -> None:
        import torch.autograd.profiler  # noqa: F401 - make the submodules attributes
        import torch.autograd.profiler_legacy  # noqa: F401

        self._step_aside(self.torch.autograd.profiler.profile, "_prepare_trace")
        legacy = getattr(self.torch.autograd.profiler_legacy, "profile", None)
        if legacy is not None and hasattr(legacy, "_start_trace"):
            self._step_aside(legacy, "_start_trace")

    def _step_aside(self, cls: Any, name: str) -> None:
        """`cls.name`, which starts a profiler, first ends perfdoctor's window (unless it is perfdoctor's own)."""
        guard, orig = self, getattr(cls, name)

        def start(prof: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                window = guard.window()
                if not window.own:
                    window.yield_to_user()
            except Exception as e:  # noqa: BLE001 - the script's profiler must start whatever happens here
                guard.err("user_profiler", e)
            return orig(prof, *args, **kwargs)

        self.patches.replace(cls, name, start)

    def uninstall(self) -> None:
        self.patches.undo()
