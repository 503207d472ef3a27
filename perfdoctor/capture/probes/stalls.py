"""Where the main thread is, sampled through the whole run, by step (PD020's evidence).

A thread looks at the main thread's stack and counts, for the step being timed then, every line of
the user's code on it (each once per sample, with the smallest depth seen, 0 the outermost user
frame). It looks about once a step, at the moment the step would turn slow (SLOW x the recent
median after it began, INTERVAL_S apart at least: a look costs tens of microseconds, within the
noise of a 5 ms step on this machine), and every INTERVAL_S while a step runs longer than usual
(those looks are marked late), so a stall is sampled densely and an ordinary step costs one look. The facts compare the slow steps of a periodic pattern
with the others: a line seen on the slow steps and hardly ever on the rest is what runs on them (a
checkpoint, an evaluation). O(stack depth) per look; the first MAX_STEPS steps only.
"""

from __future__ import annotations

import linecache
import os
import statistics
import sys
import threading
from collections import deque

from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import Site, StallLine, StallSamples
from perfdoctor.usercode import is_user_file

INTERVAL_S = 0.005  # between looks while a step runs longer than SLOW x the recent median step
QUIET_MAX_S = 0.1  # the longest (every step seen, whatever the steps' times did so far)
SLOW = 1.5
RECENT = 15  # steps the recent median is taken over
MAX_STEPS = 5000
MAX_DEPTH = 32  # user frames looked at per sample, innermost first


class StallSampler(threading.Thread):
    def __init__(self, clock: StepClock, err: ErrorLog):
        super().__init__(name="perfdoctor-stalls", daemon=True)
        self.clock = clock
        self.err = err
        self.main_ident = threading.get_ident()
        self.halt = threading.Event()
        self.samples: dict[int, int] = {}  # step -> samples
        self.late: dict[int, int] = {}  # step -> samples taken while it ran past SLOW x usual
        self.lines: dict[tuple, dict[int, int]] = {}  # (file, line, function) -> step -> samples
        self.depth: dict[tuple, int] = {}
        self._user: dict[str, bool] = {}

    def install(self) -> None:
        self.start()

    def uninstall(self) -> None:
        self.halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=1.0)

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - a probe never raises into the run; the counts so far stay
            self.err("stalls", e)

    def _run(self) -> None:
        clock = self.clock
        recent: deque[float] = deque(maxlen=RECENT)  # the last steps' times (s)
        seen, wait = 0, INTERVAL_S
        while not self.halt.wait(wait):
            if clock.kind is None:
                continue  # no step has begun
            n = len(clock.steps)
            if n >= MAX_STEPS:
                return
            recent.extend(s[2] / 1e3 for s in clock.steps[seen:n] if s[0] > 1)  # the first step warms up
            seen = n
            usual = statistics.median(recent) if recent else 0.0
            elapsed = clock.pc() - clock.step_start
            late = bool(recent) and elapsed > SLOW * usual
            self._sample(n + 1, late)
            # look often only while the step runs long; otherwise once, when this step would turn
            # slow: a stall at the start of a step (a checkpoint after the last step's
            # optimizer.step) is still running then
            wait = INTERVAL_S if late else min(QUIET_MAX_S, max(INTERVAL_S, SLOW * usual - elapsed))

    def _sample(self, i: int, late: bool = False) -> None:
        f = sys._current_frames().get(self.main_ident)
        user = self._user
        chain: list[tuple[str, int, str]] = []
        while f is not None and len(chain) < MAX_DEPTH:
            fn = f.f_code.co_filename
            u = user.get(fn)
            if u is None:
                u = user[fn] = is_user_file(fn)
            line = f.f_lineno  # None for a frame between instructions (3.11+): not a line to name
            if u and line is not None:
                chain.append((fn, line, f.f_code.co_name))
            f = f.f_back
        self.samples[i] = self.samples.get(i, 0) + 1
        if late:
            self.late[i] = self.late.get(i, 0) + 1
        n = len(chain)
        for k, key in enumerate(dict.fromkeys(chain)):
            per = self.lines.get(key)
            if per is None:
                per = self.lines[key] = {}
            per[i] = per.get(i, 0) + 1
            d = n - 1 - k
            if d < self.depth.get(key, MAX_DEPTH):
                self.depth[key] = d

    def records(self) -> StallSamples:
        self.uninstall()  # the counts stop changing
        out = []
        for (fn, ln, func), per in list(self.lines.items()):
            path = os.path.abspath(fn)
            out.append(StallLine(site=Site(file=path, line=ln, code=linecache.getline(path, ln).strip(),
                                           function=func),
                                 depth=self.depth.get((fn, ln, func), 0),
                                 by_step=[[i, c] for i, c in sorted(per.items())]))
        return StallSamples(interval_s=INTERVAL_S, samples_by_step=[[i, c] for i, c in sorted(self.samples.items())],
                            late_by_step=[[i, c] for i, c in sorted(self.late.items())], lines=out)
