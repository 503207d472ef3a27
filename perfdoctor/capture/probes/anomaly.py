"""Autograd anomaly detection switched on or off (`set_detect_anomaly`, `detect_anomaly`) by the
user's own code. Torch enters anomaly mode itself (AOTAutograd traces a compiled model under
`detect_anomaly(check_nan=False)`): only a switch whose direct caller is a user file counts, so the
record's site is the line that switched it."""

from __future__ import annotations

import sys
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import AnomalyRecord
from perfdoctor.usercode import is_user_file


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
                    caller = sys._getframe(1)  # the frame that constructed the switch
                    if not is_user_file(caller.f_code.co_filename):
                        return  # torch's own (AOTAutograd, a library): not the user's switch
                    on = _fixed if _fixed is not None else bool(args[0] if args else kwargs.get("mode", True))
                    probe.switches.append(AnomalyRecord(site=sites.site_of(caller), enabled=on))
                except Exception as e:  # noqa: BLE001
                    probe.err("anomaly", e)

            self.patches.replace(cls, "__init__", init)

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[AnomalyRecord]:
        return list(self.switches)
