"""Processes the script starts itself (`multiprocessing`'s `Process.start`: `torch.multiprocessing.spawn`'s,
`mp.Process(target=train)`, a `Pool`'s workers), per user call site, DataLoader workers left out. A run
that counts no step in the process perfdoctor ran, but whose script started such processes, most likely
trained in them: perfdoctor profiles the process it runs, and the note says so (facts/run/notes.py)."""

from __future__ import annotations

import sys
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import ChildProcessRecord

MAX_SITES = 16
# the target of every DataLoader worker process (torch.utils.data._utils.worker._worker_loop): not the script's
WORKER_LOOP = ("torch.utils.data._utils.worker", "_worker_loop")
# torch.multiprocessing.spawn's per-process wrapper: the user's function is its first argument
SPAWN_WRAP = ("torch.multiprocessing.spawn", "_wrap")


class ChildProcessProbe:
    def __init__(self, err: ErrorLog):
        self.err = err
        self.patches = Patches()
        self.records_by_site: dict[tuple, ChildProcessRecord] = {}

    def install(self) -> None:
        import multiprocessing.process as mpp

        probe = self
        orig = mpp.BaseProcess.start

        def start(proc: Any) -> None:
            try:
                probe._note(proc, sys._getframe(1))
            except Exception as e:  # noqa: BLE001
                probe.err("children", e)
            return orig(proc)

        self.patches.replace(mpp.BaseProcess, "start", start)

    def uninstall(self) -> None:
        self.patches.undo()

    def _note(self, proc: Any, frame: Any) -> None:
        target = getattr(proc, "_target", None)
        where = (getattr(target, "__module__", None), getattr(target, "__name__", None))
        if where == WORKER_LOOP:
            return
        args = getattr(proc, "_args", ()) or ()
        if where == SPAWN_WRAP and args and callable(args[0]):
            target = args[0]
        site = sites.site_of(sites.user_frame(frame))
        key = (site.file, site.line) if site is not None else ("?", 0)
        r = self.records_by_site.get(key)
        if r is None:
            if len(self.records_by_site) >= MAX_SITES:
                return
            method = getattr(proc, "_start_method", None)  # SpawnProcess's 'spawn'; None: the default context's
            name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or (
                "run()" if target is None else type(target).__name__)
            r = self.records_by_site[key] = ChildProcessRecord(site=site, target=str(name),
                                                               method=str(method or "default"))
        r.started += 1

    def records(self) -> list[ChildProcessRecord]:
        return list(self.records_by_site.values())
