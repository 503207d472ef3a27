"""The profiled window (runs in the child): torch.profiler, cProfile and a line sampler.

Steps 1..skip run unprofiled; the profiler starts when step `skip` ends, warms up for `warmup`
steps and records `active` steps (driven by the same step clock as everything else). cProfile runs
during the warm-up steps (the recorded steps belong to torch's Python stack tracer: both need the
interpreter's one profile hook); the line sampler, a thread, runs through the whole window.

The window has a budget, so that a run under perfdoctor takes about its bare time plus a constant
whatever a step holds (one LBFGS step of 20 closure evaluations, a long evaluation loop, dozens of
micro-batches per optimizer step):
- time: `budget_s` of wall time from the profiler's start (warm-up and recorded steps). The window
  looks at the clock at each step's end and, through `poll`, at each module call on the main thread
  (submodules included) and each DataLoader batch, so that it also ends inside a long step or a long
  forward (past the budget by at most one stretch without a module call: a backward, say); the
  trace keeps what was recorded. A stop inside a step is perfdoctor's own time, not the step's.
- events: at the end of the warm-up, cProfile's call count per warm-up step estimates the trace's
  events per step (`EVENTS_PER_CALL`, within a few times either way: torch.profiler counts nothing
  before it stops); the recorded steps are cut to fit `budget_events` (at least one is recorded).
  While the profiler runs, the events recorded so far are estimated from the process's memory
  growth since it started (kineto keeps every event in memory until it stops: `BYTES_PER_EVENT`),
  looked at every `LOOK_S` through `poll` and at step ends; past the budget the window ends there,
  inside a step too. This bounds what stopping costs where a warm-up estimate cannot: a window with
  no warm-up, one huge step. Stopping and exporting take about twice the recording time where the
  events are densest (LSTMCell loops, 8 us per recorded operator: 20 s recorded, 3.1 M events,
  about 8.6 GB held, 48 s to stop, export and gzip), so the time budget alone does not bound them. The
  estimate counts the script's own growth too (a step's saved activations): it errs towards a
  shorter window.
When the budget ends the window, the profiler stops (the trace so far is saved), meta.json's window
says why (`stopped_by`), the report says so in a note, and the run goes on unprofiled.

When the profiler has stopped, the C heap's free pages go back to the system (glibc `malloc_trim`):
the profiler's event buffers and the trace export are freed by then but would otherwise stay in the
process's resident memory for the rest of the run, 20-100 MB that varied from run to run (a small
CPU model: peak RSS 352-439 MB under perfdoctor against 334-343 MB bare; 350-357 MB with the trim).
The script's memory is untouched (only free pages are returned), and the run's RSS, which the
report and the gate's peak-memory row read, is the script's again.
"""

from __future__ import annotations

import contextlib
import cProfile
import ctypes
import gzip
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.capture.workers import WorkerSampler
from perfdoctor.contracts.run import FunctionStat, Hotspots, LineSamples, Workers
from perfdoctor.contracts.run import Window as WindowRecord
from perfdoctor.usercode import is_user_file

MAX_FUNCTIONS = 100  # the user's functions kept from cProfile's rows, the most cumulative time first

DEFAULT = (5, 3, 5)  # skip, warmup (cProfile and the line sampler run here), active (the trace)
# A rank of a distributed job records 10 steps: the test that tells a straggler from the steps' noise
# compares the ranks step by step (facts.ranks.straggler_test), and 5 steps of 2 ranks can show
# a straggler only where it is ahead at every one of them.
DISTRIBUTED = (5, 3, 10)
BUDGET_S = 20.0  # wall time of the window, warm-up and recorded steps
# the most the time budget stretches, from the profiler's start, so that one recorded step as long as the
# warm-up's fits (`Window._room_for_a_step`)
LONG_STEP_S = 60.0
STEP_MARGIN = 1.25  # a step taken as this much longer than the one measured before it
BUDGET_EVENTS = 1_000_000  # estimated trace events in the recorded steps (about 300 MB of JSON)
# trace events per Python call that cProfile counts in a warm-up step: the Python tracer's call
# events plus the operators' events (forward and autograd backward, which cProfile does not see).
# Measured: 0.65 (torch.save and deepcopy in the step, tests/data/scripts/pickling.py), 2.1
# (sample_scripts/pd006_loss_graph_retained.py), 10 (LSTMCell loops, tests/data/scripts/lbfgs_long.py).
# A rough estimate, set towards the high end: the time budget and the memory estimate below, while
# the profiler runs, are the hard bounds
EVENTS_PER_CALL = 5.0
# memory kineto holds per recorded event (record_shapes and with_stack: an operator's shapes and
# Python stack). Measured: about 2.8 KB (LSTMCell loops of time_sequence_prediction); set lower, so that
# the estimate errs towards more events
BYTES_PER_EVENT = 2048
LOOK_S = 0.25  # how often `poll` reads the memory growth while the profiler runs


def _return_free_memory() -> None:
    """glibc's `malloc_trim(0)`: the heap's free pages back to the system (see the module docstring).
    Elsewhere (musl, macOS) nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _without_kineto_chatter() -> Iterator[None]:
    """Kineto writes `USDT: ... profiler_start` lines straight to fd 2 when the profiler starts and
    stops: keep them out of the user's terminal, pass anything else written meanwhile through."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        tmp = tempfile.TemporaryFile()
        os.dup2(tmp.fileno(), 2)
    except OSError:  # no fd 2 to juggle: say nothing, change nothing
        yield
        return
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        rest = b"".join(l for l in tmp.read().splitlines(keepends=True) if not l.startswith(b"USDT:"))
        tmp.close()
        if rest:
            os.write(2, rest)


def plan(steps: int | None, cfg: tuple[int, int, int] | None = None, distributed: bool = False
         ) -> tuple[int, int, int]:
    """The window (skip, warmup, active): `cfg`, else a rank's of a distributed job or the default;
    shrunk so that it ends by step `steps` when that is set."""
    skip, warmup, active = cfg or (DISTRIBUTED if distributed else DEFAULT)
    if steps and skip + warmup + active > steps:
        active = max(1, min(active, steps // 2))
        warmup = max(0, min(warmup, steps - active - 1))  # keep step 1 out of the window where possible
        skip = max(0, steps - active - warmup)
    return skip, warmup, active


class Sampler(threading.Thread):
    """Every `interval` s: the innermost user frame (file, line) of the main thread."""

    def __init__(self, main_ident: int, interval: float = 0.002):
        super().__init__(name="perfdoctor-sampler", daemon=True)
        self.main_ident = main_ident
        self.interval = interval
        self.counts: dict[tuple[str, int], int] = {}
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        frames = sys._current_frames
        counts = self.counts
        while not self.halt.wait(self.interval):
            f = frames().get(self.main_ident)
            while f is not None and not is_user_file(f.f_code.co_filename):
                f = f.f_back
            self.samples += 1
            # a frame seen from another thread between instructions has no line yet (f_lineno None
            # on 3.11+): the sample counts, its line does not
            line = f.f_lineno if f is not None else None
            if f is not None and line is not None:
                key = (f.f_code.co_filename, line)
                counts[key] = counts.get(key, 0) + 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=1.0)


class Window:
    def __init__(self, torch: Any, run_dir: Path, skip: int, warmup: int, active: int,
                 worker_pids: Callable[[], list[int]] = list, budget_s: float = BUDGET_S,
                 budget_events: int = BUDGET_EVENTS, rss: Callable[[], int | None] = lambda: None):
        self.torch = torch
        self.run_dir = run_dir
        self.worker_pids = worker_pids  # the live DataLoader worker processes, asked when the window opens
        self.workers: WorkerSampler | None = None
        self.worker_data: Workers | None = None
        self.skip, self.active = skip, active
        self._warm_up(warmup)
        self.next_at = skip  # the next step index at which tick() has work to do
        self.state = "wait"  # wait -> warmup -> active -> done
        self.prof: Any = None
        self.cprof: cProfile.Profile | None = None
        self.sampler: Sampler | None = None
        self.recorded = 0
        self.python_steps = 0  # steps profiled by cProfile and the sampler
        self.trace_saved = False
        self.completed = False
        self.discarded = False
        self.error: str | None = None
        self.main_ident = threading.get_ident()
        self.budget_s, self.budget_events = budget_s, budget_events
        self.deadline = float("inf")  # perf_counter() at which the time budget is spent
        self.started = 0.0  # perf_counter() at which the profiler started
        # the process's resident bytes (the step clock's reader, StepClock.rss; None: no /proc, and the
        # time budget alone): the events recorded so far, estimated
        self.rss = rss
        self.rss0: int | None = None  # ... at the profiler's start
        self.next_look = float("inf")  # perf_counter() at which `poll` next reads the memory growth
        self.stopped_by: str | None = None  # "time" | "events": the budget ended the window early
        # the estimate at the end of the warm-up, or from the memory growth where that ended the window
        self.events_per_step: int | None = None
        self.ticked = 0  # the last step that ended (tick)
        self.pc = time.perf_counter
        self.own = False  # perfdoctor's own profiler is being started or stepped (UserProfilerGuard)
        self.user_hook = False  # the script had a profile hook of its own (sys.setprofile) when the window opened

    def _warm_up(self, steps: int) -> None:
        """The warm-up's steps after the skipped ones, and the recorded steps after them."""
        self.warmup = steps
        self.first_step = self.skip + steps + 1
        self.last_step = self.skip + steps + self.active

    # -- driven by the step clock -----------------------------------------------------------
    def tick(self, i: int, wall_s: float | None = None) -> None:
        """Called after step `i` ended (only when i >= next_at); `wall_s`: that step's wall time."""
        if self.state == "done":
            self.next_at = 1 << 62
            return
        self.ticked = i
        try:
            if self.state == "wait":
                if wall_s is not None and self.warmup > 1 and (
                        (self.warmup + 1) * wall_s * STEP_MARGIN > self.budget_s):
                    # steps too long for the warm-up and one recorded step to fit the budget: one warm-up
                    # step, then `_room_for_a_step` stretches the budget for one recorded step
                    self._warm_up(1)
                self.main_ident = threading.get_ident()  # the training thread (StepClock.mine) from here on
                # the interpreter has one profile hook per thread: a script that set its own
                # (sys.setprofile) keeps it; perfdoctor records no Python calls then
                self.user_hook = sys.getprofile() is not None
                self._start_profiler()
                # cProfile runs in the warm-up steps: it and torch's Python stack tracer (with_stack)
                # share the interpreter's one profile hook, and the recorded steps need the tracer for
                # source lines in the trace (with no warm-up they share the steps). The line sampler
                # reads frames from a thread, needs no hook, and runs through the whole window.
                self._start_python()
                self.state = "warmup" if self.warmup else "active"
            else:
                if self.state == "warmup":
                    self.python_steps += 1
                elif self.state == "active":
                    self.recorded += 1
                    if self.warmup == 0:
                        self.python_steps += 1
                if self.pc() > self.deadline:  # out of time: step i is the last one profiled
                    self._expire(i, "time")
                    return
                if self._over_events(i - self.skip):  # the events so far fill the budget
                    self._expire(i, "events")
                    return
                if self.state == "warmup" and i >= self.skip + self.warmup:
                    if self.cprof is not None:
                        self.cprof.disable()
                    self.state = "active"
                    self._fit_events()
                    self._room_for_a_step()
                elif self.state == "active" and i >= self.last_step:
                    self._stop_python()
                with _without_kineto_chatter(), self._own_call():
                    self.prof.step()
                if self.state == "active" and i >= self.last_step:
                    self.completed = self.recorded >= self.active
                    self._stop_profiler()
            self.next_at = i + 1
        except Exception as e:  # noqa: BLE001 - the script must go on whatever the profiler does
            self.error = f"{type(e).__name__}: {e}"
            self._abort()

    # -- the budget -----------------------------------------------------------------------------
    def poll(self) -> float | None:
        """Called often by the probes (main thread or not; on every module call: one clock read when
        there is nothing to do): end the window once its time or its events are spent. Returns the
        perf_counter() at which this call began ending it, None if it did not (the caller takes the
        stop out of the step: `StepClock.exclude`)."""
        now = self.pc()
        if now < self.next_look and now <= self.deadline:
            return None
        if threading.get_ident() != self.main_ident or self.state == "done":
            return None
        why = "time" if now > self.deadline else None
        if why is None:
            self.next_look = now + LOOK_S
            if not self._over_events(self.ticked + 1 - self.skip):
                return None
            why = "events"
        try:
            self._expire(self.ticked + 1, why)  # the step in progress: profiled in part
        except Exception as e:  # noqa: BLE001 - the script must go on whatever the profiler does
            self.error = f"{type(e).__name__}: {e}"
        return now

    def _over_events(self, steps: int) -> bool:
        """The events recorded so far (estimated from the memory growth) fill the event budget;
        if so, `events_per_step` is set from them (over the `steps` profiled, the last one in part)."""
        now = self.rss() if self.rss0 is not None else None
        if now is None or self.rss0 is None:  # no reading (no /proc): the time budget alone
            return False
        events = max(0, now - self.rss0) // BYTES_PER_EVENT
        if events < self.budget_events:
            return False
        self.events_per_step = int(events // max(1, steps))
        return True

    def _expire(self, last: int, why: str) -> None:
        """The time or event budget is spent: stop now (inside step `last` or at its end) and keep
        what was recorded; the run goes on unprofiled."""
        self.stopped_by = why
        self.deadline = self.next_look = float("inf")
        self.last_step = last
        self._stop_python()
        self._stop_profiler()

    @contextlib.contextmanager
    def _own_call(self) -> Iterator[None]:
        self.own = True
        try:
            yield
        finally:
            self.own = False

    def yield_to_user(self) -> None:
        """The script starts a profiler of its own (torch.profiler, torch.autograd.profiler): kineto
        runs one profiler at a time, and two at once crash the process. perfdoctor's window ends
        here, keeping what it recorded, and never starts afterwards; the report says why."""
        if self.state == "done":
            return
        self.stopped_by = "user-profiler"
        self.last_step = self.ticked  # the last step that ended before it
        if self.state == "wait":
            self.state, self.next_at = "done", 1 << 62
            return
        self._stop_python()
        self._stop_profiler()

    def _fit_events(self) -> None:
        """End of the warm-up: cut the recorded steps to what the event budget holds."""
        if self.cprof is None or not self.python_steps:
            return
        calls = sum(e.callcount for e in self.cprof.getstats())
        per_step = max(1, int(calls * EVENTS_PER_CALL / self.python_steps))
        self.events_per_step = per_step
        fit = max(1, self.budget_events // per_step)
        if fit < self.active:
            self.stopped_by = "events"
            self.last_step = self.first_step + fit - 1

    def _room_for_a_step(self) -> None:
        """End of the warm-up, whose steps were long (a style-transfer step of 12 s on a CPU against the
        20 s budget; `tick` has cut such a warm-up to one step): what the budget leaves would stop the
        window inside the first recorded step, with no whole step in the trace (no FLOPs, no estimate for
        the GPU, none of the trace's facts). The budget stretches to hold one recorded step as long as
        the warm-up's and a quarter more, never past LONG_STEP_S from the profiler's start: the run's
        cost grows by at most that one step."""
        if not self.python_steps:
            return
        now = self.pc()
        need = now + STEP_MARGIN * (now - self.started) / self.python_steps
        if need > self.deadline:
            self.deadline = min(need, self.started + max(LONG_STEP_S, self.budget_s))

    def _start_profiler(self) -> None:
        tp = self.torch.profiler
        acts = [tp.ProfilerActivity.CPU]
        if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            acts.append(tp.ProfilerActivity.CUDA)
        self.prof = tp.profile(activities=acts, record_shapes=True, with_stack=not self.user_hook, profile_memory=True,
                               schedule=tp.schedule(wait=0, warmup=self.warmup, active=self.active, repeat=1),
                               on_trace_ready=self._save_trace)
        self.rss0 = self.rss()
        with _without_kineto_chatter(), self._own_call():
            self.prof.start()
        self.started = self.pc()
        self.deadline = self.started + self.budget_s
        self.next_look = self.started + LOOK_S

    def _start_python(self) -> None:
        # the sampler needs the GIL to look: with the default 5 ms switch interval it would mostly
        # see the lines that release it (torch ops), not pure-Python loops
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        self.sampler = Sampler(self.main_ident)
        self.sampler.start()
        pids = self.worker_pids()
        if pids:
            self.workers = WorkerSampler(self.run_dir)
            self.workers.start(pids)
        if not self.user_hook:
            self.cprof = cProfile.Profile()
            self.cprof.enable()

    def _stop_python(self) -> None:
        if self.cprof is not None:
            self.cprof.disable()
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
            sys.setswitchinterval(self._switch)
        if self.workers is not None:
            workers, self.workers = self.workers, None
            self.worker_data = workers.stop()

    def _stop_profiler(self) -> None:
        prof, self.prof = self.prof, None
        self.state = "done"
        self.next_at = 1 << 62
        self.deadline = self.next_look = float("inf")
        if prof is not None:
            with _without_kineto_chatter():
                prof.stop()  # in the record phase this calls _save_trace with what was recorded
            _return_free_memory()

    def _abort(self) -> None:
        self._stop_python()
        try:
            self._stop_profiler()
        except Exception:  # noqa: BLE001
            pass

    def _save_trace(self, prof: Any) -> None:
        if self.discarded:
            return
        tmp = self.run_dir / "trace.json"
        prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(self.run_dir / "trace.json.gz", "wb", compresslevel=4) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.unlink()
        self.trace_saved = True

    def discard(self) -> None:
        """A stronger step clock took over: stop, and drop what was recorded (its step numbers are void)."""
        self.discarded = True
        self._abort()
        for f in ("trace.json.gz", "hotspots.json", "profile.pstats"):
            (self.run_dir / f).unlink(missing_ok=True)

    def forget(self) -> None:
        """In a forked copy of the process: the profiler (its threads are the parent's) is neither
        stepped nor stopped here; the window is over for this process."""
        self.prof = self.cprof = self.sampler = self.workers = None
        self.state, self.next_at = "done", 1 << 62
        self.deadline = self.next_look = float("inf")

    # -- end of the run -----------------------------------------------------------------------
    def finish(self) -> Hotspots | None:
        """Stop whatever still runs (the script ended inside the window) and save what was recorded;
        the hot spots for hotspots.json, if cProfile ran (profile.pstats is written here)."""
        if self.state in ("warmup", "active") and threading.get_ident() != self.main_ident:
            # the training thread ended inside the window: the profiler cannot be stopped from another
            # thread (kineto aborts the process), so its events are left unsaved
            self._stop_python()
            self.forget()
            self.error = "the training thread ended inside the profiled window: its trace was not saved"
        elif self.state in ("warmup", "active"):
            self._stop_python()
            try:
                self._stop_profiler()
            except Exception as e:  # noqa: BLE001
                self.error = f"{type(e).__name__}: {e}"
        if self.cprof is not None and not self.discarded:
            return self._hotspots()
        return None

    def _hotspots(self) -> Hotspots:
        assert self.cprof is not None
        self.cprof.dump_stats(str(self.run_dir / "profile.pstats"))
        stats = pstats.Stats(self.cprof).stats  # type: ignore[attr-defined]
        funcs = []
        for (fn, line, name), (_cc, nc, tt, ct, _callers) in stats.items():
            if is_user_file(fn):
                funcs.append(FunctionStat(function=name, file=os.path.abspath(fn), line=line, tottime_s=tt,
                                          cumtime_s=ct, ncalls=nc))
        funcs.sort(key=lambda f: -f.cumtime_s)
        s = self.sampler
        lines = []
        if s is not None:
            for (fn, line), n in sorted(s.counts.items(), key=lambda kv: -kv[1])[:300]:
                lines.append(LineSamples(file=os.path.abspath(fn), line=line, samples=n))
        # py-spy ran through the whole window: its warm-up and recorded steps
        workers = None if self.worker_data is None else msgspec.structs.replace(
            self.worker_data, steps=self.recorded + (self.python_steps if self.warmup else 0))
        return Hotspots(functions=funcs[:MAX_FUNCTIONS], lines=lines, samples=s.samples if s else 0,
                        sample_interval_s=s.interval if s else None, steps=self.python_steps, workers=workers)

    def meta(self) -> WindowRecord:
        return WindowRecord(skip=self.skip, warmup=self.warmup, active=self.active, first_step=self.first_step,
                            last_step=self.last_step, completed=self.completed, steps_profiled=self.recorded,
                            trace=self.trace_saved, error=self.error, budget_s=self.budget_s,
                            budget_events=self.budget_events, stopped_by=self.stopped_by,
                            events_per_step=self.events_per_step, user_profile_hook=self.user_hook or None)
