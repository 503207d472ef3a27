"""What every family of trace facts reads: the trace, its step windows, the launch map, the GPU
events, the python stacks, and `put` to record a global fact. Built once per trace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from perfdoctor.contracts.report import ComputeModuleDoc
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.stacks import Stacks
from perfdoctor.trace.model import GPU_KINDS, Trace
from perfdoctor.trace.steps import launch_map

SRC = "trace"
COMM = re.compile(r"nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
                  r"|all_?to_?all|sendrecv|c10d::|gloo", re.IGNORECASE)


class TraceContext:
    """One trace, parsed once, shared by the families of facts (perfdoctor.facts.trace.*).

    `run_step_ms`: the median unprofiled step of the run the trace was recorded in (a run folder),
    None for a trace on its own. The profiled steps' host time is inflated by the profiler, their
    GPU time is not: with it, GPU time comes from the trace and host time from the run (gpu.py).
    Several GPUs in one timeline (nn.DataParallel) are measured device by device; the step's
    global facts are the busiest device's (`main_device`)."""

    def __init__(self, trace: Trace, facts: Facts, run_step_ms: float | None = None, steps_label: str = "",
                 modules: list[ComputeModuleDoc] | None = None, user_files: list[Path] | None = None):
        self.trace = trace
        self.user_files = user_files or []  # a run folder's user files: the trace names them by file name only
        self.modules = modules or []  # the run's modules with the most FLOPs (facts/run/compute.py), to time
        self.facts = facts
        # the steps' spans, µs: each step's CPU span extended to the GPU work it launched
        self.windows: list[tuple[float, float]] = [(s, e) for _, s, e in trace.steps]
        # the steps' CPU spans: counts of CPU-side events (syncs, copies launched, ops) go by these
        self.cpu_windows: list[tuple[float, float]] = trace.cpu_steps or self.windows
        self.step_ms: list[float] = [(e - s) / 1000 for s, e in self.windows]
        self.nsteps = len(self.windows)
        self.per_step = max(self.nsteps, 1)  # divisor of totals "per step"
        self.gpu: bool = trace.device_type != "cpu" and trace.has_gpu_events
        self.launches: dict[int, int] = launch_map(trace) if self.gpu else {}  # correlation -> launching call
        self.gpu_events: list[int] = trace.indices(*GPU_KINDS)
        self.run_step_ms = run_step_ms
        self.steps_label = steps_label  # "profiled steps 8..12" in a run folder
        busy: dict[int, float] = {}
        dev, dur = trace.device, trace.dur
        for i in self.gpu_events:
            busy[dev[i]] = busy.get(dev[i], 0.0) + dur[i]
        self.devices: list[int] = sorted(busy)  # GPU devices in the timeline
        self.main_device: int | None = max(self.devices, key=busy.__getitem__) if busy else None
        self.stacks = Stacks(trace)
        self._comm_name: dict[int, bool] = {}
        # what one family works out from the trace and another reads too, worked out once (by the family
        # that owns it: optimizer_loop.loops)
        self.derived: dict[str, Any] = {}

    def put(self, name: str, value: Any, unit: str = "", detail: str = "", per_step: tuple[float, ...] = ()) -> None:
        """Add a global fact (source "trace", floats to 4 digits), unless it is None or already set;
        `per_step`: its value at each step of the trace (`Fact.per_step`)."""
        if value is not None and name not in self.facts:
            if self.steps_label:
                detail = f"{detail} ({self.steps_label})" if detail else self.steps_label
            self.facts.add(name, round(value, 4) if isinstance(value, float) else value, unit, SRC, detail,
                           per_step=per_step)

    def is_comm(self, ni: int) -> bool:
        """Whether the event name of string index `ni` is a collective (NCCL, RCCL, gloo, c10d...)."""
        v = self._comm_name.get(ni)
        if v is None:
            v = self._comm_name[ni] = bool(COMM.search(self.trace.strings[ni]))
        return v
