"""Autograd anomaly detection switched on or off (`set_detect_anomaly`, `detect_anomaly`)."""

from __future__ import annotations

from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import AnomalyRecord


class AnomalyProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.patches = Patches()
        self.switches: list[AnomalyRecord] = []

    def install(self) -> None:
        import torch.autograd.anomaly_mode  # noqa: F401 - make the submodule an attribute

        probe = self
        am = self.torch.autograd.anomaly_mode
        for cls, fixed in ((am.set_detect_anomaly, None), (am.detect_anomaly, True)):
            orig = cls.__init__

            def init(obj: Any, *args: Any, _orig: Any = orig, _fixed: Any = fixed, **kwargs: Any) -> None:
                _orig(obj, *args, **kwargs)
                try:
                    on = _fixed if _fixed is not None else bool(args[0] if args else kwargs.get("mode", True))
                    probe.switches.append(AnomalyRecord(site=sites.caller_site(), enabled=on))
                except Exception as e:  # noqa: BLE001
                    probe.err("anomaly", e)

            self.patches.replace(cls, "__init__", init)

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[AnomalyRecord]:
        return list(self.switches)
