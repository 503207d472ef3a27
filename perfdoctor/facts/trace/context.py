"""What every family of trace facts reads: the trace, its step windows, the launch map, the GPU
events, the python stacks, and `put` to record a global fact. Built once per trace."""

from __future__ import annotations

import re
from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.stacks import Stacks
from perfdoctor.trace.model import GPU_KINDS, Trace
from perfdoctor.trace.steps import launch_map

SRC = "trace"
COMM = re.compile(r"nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"
                  r"|all_?to_?all|sendrecv|c10d::|gloo", re.IGNORECASE)


class TraceContext:
    """One trace, parsed once, shared by the families of facts (perfdoctor.facts.trace.*)."""

    def __init__(self, trace: Trace, facts: Facts):
        self.trace = trace
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
        self.stacks = Stacks(trace)
        self._comm_name: dict[int, bool] = {}

    def put(self, name: str, value: Any, unit: str = "", detail: str = "") -> None:
        """Add a global fact (source "trace", floats to 4 digits), unless it is None or already set."""
        if value is not None and name not in self.facts:
            self.facts.add(name, round(value, 4) if isinstance(value, float) else value, unit, SRC, detail)

    def is_comm(self, ni: int) -> bool:
        """Whether the event name of string index `ni` is a collective (NCCL, RCCL, gloo, c10d...)."""
        v = self._comm_name.get(ni)
        if v is None:
            v = self._comm_name[ni] = bool(COMM.search(self.trace.strings[ni]))
        return v
