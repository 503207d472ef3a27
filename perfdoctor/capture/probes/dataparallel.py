"""`nn.DataParallel` constructions: where, on which devices, with how many devices present."""

from __future__ import annotations

from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import DataParallelRecord


class DataParallelProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.patches = Patches()
        self.built: list[DataParallelRecord] = []

    def install(self) -> None:
        torch, probe = self.torch, self
        dp = torch.nn.DataParallel
        orig = dp.__init__

        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            orig(obj, *args, **kwargs)
            try:
                ids = getattr(obj, "device_ids", None)
                probe.built.append(DataParallelRecord(site=sites.caller_site(), device_ids=list(ids) if ids else None,
                                                      device_count=torch.cuda.device_count()))
            except Exception as e:  # noqa: BLE001
                probe.err("dataparallel", e)

        self.patches.replace(dp, "__init__", init)

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[DataParallelRecord]:
        return list(self.built)
