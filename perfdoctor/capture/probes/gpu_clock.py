"""The SM clock of the rank's GPU and why the driver holds it down (NVML's clock throttle reasons:
power cap, thermal slowdown, ...), read at a step end at most every `INTERVAL_S` (two NVML calls, tens
of microseconds): a rank whose GPU runs slower than the others' is a straggler for it (the rank
table's `gpu_clock_mhz`, the cause "GPU throttling" that `facts.ranks` can name).

Only where the script has initialised CUDA (never initialised here) and NVML's Python binding
(`pynvml`, the nvidia-ml-py package) imports and starts; otherwise nothing is read or recorded, and
nothing is said: the rank table simply has no clock column. The device is the one current when the
first reading is taken, found by its UUID (CUDA_VISIBLE_DEVICES renumbers devices; NVML does not)."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import GpuClockRecord

INTERVAL_S = 0.1


def _pynvml() -> ModuleType:
    return importlib.import_module("pynvml")


class GpuClockProbe:
    def __init__(self, torch: Any, err: ErrorLog, nvml: Callable[[], ModuleType] = _pynvml):
        self.torch = torch
        self.err = err
        self.load_nvml = nvml
        self.nvml: ModuleType | None = None
        self.handle: Any = None
        self.off = False  # no NVML or no device: nothing more is tried
        self.last = float("-inf")
        self.rec = GpuClockRecord(by_step=[])

    def install(self) -> None:
        pass  # the device is looked up at the first step end after CUDA is initialised

    def end_step(self, i: int) -> None:
        now = time.perf_counter()
        if self.off or now - self.last < INTERVAL_S:
            return
        self.last = now
        if self.handle is None and not self._open():
            return
        nvml = self.nvml
        assert nvml is not None
        try:
            mhz = nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM)
            reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            self.rec.by_step.append([i, float(mhz), int(reasons(self.handle))])
        except Exception as e:  # noqa: BLE001 - NVML failed mid-run: stop reading
            self.err("gpu_clock", e)
            self.off = True

    def _open(self) -> bool:
        """NVML's handle of the current CUDA device, once CUDA is initialised; False while it is not
        (tried again later) and where NVML cannot be had (then never again)."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return False
        try:
            nvml = self.load_nvml()
            nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no pynvml, no driver: no clock readings, silently
            self.off = True
            return False
        self.nvml = nvml
        try:
            device = cuda.current_device()
            try:
                self.handle = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{cuda.get_device_properties(device).uuid}")
            except Exception:  # noqa: BLE001 - a MIG slice, an old driver: by index where devices are not renumbered
                if os.environ.get("CUDA_VISIBLE_DEVICES"):
                    raise
                self.handle = nvml.nvmlDeviceGetHandleByIndex(device)
            self.rec.max_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001
            self.uninstall()
            return False
        return True

    def uninstall(self) -> None:
        self.off = True
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nvml, self.handle = None, None

    def merge_steps(self) -> None:
        """A stronger step clock took over: its steps are counted from 1 again."""
        self.rec.by_step = []

    def records(self) -> GpuClockRecord | None:
        return self.rec if self.rec.by_step else None
