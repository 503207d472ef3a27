"""The step clock (runs in the child; imports torch through its caller).

A step ends at an optimizer step (a global post hook on every optimizer); a script that never
steps an optimizer is clocked by `torch.autograd.backward` calls, then by DataLoader batches, else
the whole run is one span. A DataLoader batch ends a step only where a model forward ran since the
last step ended (a module called outside a batch's fetch): a pass over a loader that feeds no model
(a dataset's mean and std computed before training) is data loading, not steps, and `--steps N`
never stops the script inside it. A stronger clock that appears later takes over: the steps counted so
far merge into its first step. A backward or a batch while an optimizer step runs (between its pre
and post hooks: the closure of LBFGS, Lightning's automatic optimisation) belongs to that step and
ends none, also before the first optimizer step has ended: LBFGS's first step (20 closure
evaluations) is one step, never 20 backward steps that the optimizer clock merges afterwards (the
profiled window would open on them, and its work be thrown away at the merge).

The clock keeps the per-step timings: the probes add the time they measure (DataLoader waits,
forward) to its running totals, the clock itself times backward and the optimizer step (less the
forward, backward and data time of a closure run inside it: LBFGS, Lightning). perfdoctor's own
work inside a step (`exclude`) is taken out of the step's time. Outside the profiled window a step
costs a few attribute updates, a /proc read for the RSS, on CUDA one allocator-statistics read per
device in use (host-side: no synchronisation, no CUDA context), and one tuple append. The probes'
per-step bookkeeping runs in `on_step`, after the step's time was taken.

Memory per step has one meaning for the whole run: `mem_bytes` is always the process RSS, and
`DeviceMemory` adds, from the first step end at which CUDA is initialised, each device's allocated
bytes at the step end and its peak within the step (the allocator's peak, reset at every step end).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.capture.writer import RunWriter

_PRIORITY = {None: 0, "dataloader": 1, "backward": 2, "optimizer": 3}
FLUSH_S = 0.5  # the partial steps reach the disk this often
LOSS_STEPS = 5  # the first backward calls whose loss is kept (probes.json `losses`)


class StepsReached(SystemExit):
    """Raised from the step clock when `--steps N` is reached."""


class StepClock:
    def __init__(self, torch: Any, writer: RunWriter, err: ErrorLog, *, steps_limit: int | None = None):
        self.torch = torch
        self.writer = writer
        self.err = err
        self.steps_limit = steps_limit
        self.patches = Patches()
        self.pc = time.perf_counter
        self.t0 = self.step_start = self.pc()
        self.kind: str | None = None  # optimizer | backward | dataloader, None until one is seen
        # (i, end s since t0, wall ms, data ms, forward ms, backward ms, optimizer ms, RSS bytes,
        #  CUDA memory per device or None)
        self.steps: list[tuple] = []
        self.data = self.fwd = self.bwd = self.opt = 0.0  # seconds in the current step
        self.bwd_depth = 0
        # the running optimizer steps, outermost first: id() of torch's step wrapper frame, which
        # calls the pre and post hooks (a wrapping optimizer steps an inner one: two)
        self.opt_frames: list[int] = []
        # the code of the user's functions on the stack of the first optimizer step, innermost first
        # (the training loop's, and the optimizer wrapper's where the user steps one, as SAM's
        # `second_step`): a probe names the line in the innermost of them that led into a helper
        # (host reads in a metrics function called from the loop)
        self.step_codes: tuple[Any, ...] | None = None
        # the user's frames at the first optimizer step, innermost first: where each called the next,
        # down to the line that steps the optimizer (probes.json `step_chain`)
        self.step_chain: list[Any] = []
        self.opt_t0 = 0.0
        self.opt_inner0 = 0.0  # data + forward + backward so far when the optimizer step began
        self.opt_own0 = 0.0  # perfdoctor's own time so far when the optimizer step began
        self.own = 0.0  # s of perfdoctor's own work inside the current step (`exclude`), taken out of it
        self.clock_opt: int | None = None  # id() of the optimizer whose step ends a step
        self.opt_seen: set[int] = set()
        self.dl_calls = 0
        self.in_batch = 0  # inside a DataLoader batch's fetch (its transforms are no model forward)
        self.forwards = 0  # model forwards (top-level module calls) since the last step ended
        # the loss of the first LOSS_STEPS outermost backward calls, detached copies read only when the run
        # folder is written (no host-device sync inside the steps)
        self.loss_refs: list[Any] = []
        self.device_mem = DeviceMemory(torch)
        self.closed = False  # the run folder is written
        self.stopping = False  # --steps was reached
        # set by the coordinator: the probes' per-step bookkeeping, a stronger clock's takeover,
        # and what to do when --steps is reached (write the run folder)
        self.on_step: Callable[[int], None] = lambda i: None
        self.on_merge: Callable[[], None] = lambda: None
        self.on_limit: Callable[[], None] = lambda: None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self._flushed = 0
        self._last_flush = self.t0
        self.real_exit = os._exit
        self.thread: threading.Thread | None = None  # the training thread the clock follows

    def mine(self, *, main_only: bool = False) -> bool:
        """The event comes from the thread the clock follows: the first thread that ends a step
        (backward, optimizer step, DataLoader batch), until it ends. Events of other threads (a
        script whose threads each train) are theirs: they neither end nor time a step, and the
        profiled window starts and stops on this one thread only (the profiler must: kineto aborts
        when it is stepped from another thread than the one that started it). `main_only`: only the
        main thread takes the clock with this event (a DataLoader batch: a thread that prefetches
        batches for the training thread is no training thread; batches end steps only where the main
        thread's model forwards ran between them)."""
        t = threading.current_thread()
        if t is self.thread:
            return True
        if (self.thread is None or not self.thread.is_alive()) and not (main_only and t is not threading.main_thread()):
            self.thread = t
            return True
        return False

    # -- installation ---------------------------------------------------------------------------
    def install(self) -> None:
        import torch.optim.optimizer as opt_mod

        self.patches.hook(opt_mod.register_optimizer_step_pre_hook(self._opt_pre))
        self.patches.hook(opt_mod.register_optimizer_step_post_hook(self._opt_post))
        self._install_backward()
        self.device_mem.install()

    def uninstall(self) -> None:
        self.device_mem.uninstall()
        self.patches.undo()

    def _install_backward(self) -> None:
        clock = self
        orig = self.torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if clock.bwd_depth or not clock.mine():
                return orig(*args, **kwargs)
            clock.bwd_depth = 1
            if len(clock.loss_refs) < LOSS_STEPS:
                clock.keep_loss(args[0] if args else kwargs.get("tensors"))
            t = clock.pc()
            try:
                out = orig(*args, **kwargs)
            finally:
                clock.bwd_depth = 0
                clock.bwd += clock.pc() - t
            if clock.closed:
                clock.after_close()
            elif not clock.opt_depth and (clock.kind == "backward" or clock.kind is None):
                if clock.event("backward"):
                    clock.tick()
            return out

        self.patches.replace(self.torch.autograd, "backward", backward)

    def keep_loss(self, tensors: Any) -> None:
        t0 = self.pc()
        try:
            t = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
            one = isinstance(t, self.torch.Tensor) and t.numel() == 1
            self.loss_refs.append(t.detach().clone() if one else None)
        except Exception as e:  # noqa: BLE001
            self.err("loss", e)
        self.exclude(t0)

    def losses(self) -> list[float | None]:
        """The losses kept (`keep_loss`) as floats; None for a backward of something else than a
        scalar, or a value that is not finite."""
        out: list[float | None] = []
        for t in self.loss_refs:
            try:
                v = float(t.float().item()) if t is not None else None
            except Exception:  # noqa: BLE001 - a device that is gone: nothing to compare
                v = None
            out.append(v if v is not None and math.isfinite(v) else None)
        return out

    # -- events ---------------------------------------------------------------------------------
    def before_batch(self) -> None:
        """A DataLoader batch is asked for: with the DataLoader clock, the previous one's step ends."""
        if not self.mine(main_only=True):
            return
        if self.closed:
            self.after_close()
        elif (self.dl_calls and self.forwards and not self.opt_depth
              and (self.kind == "dataloader" or self.kind is None)):
            if self.event("dataloader"):
                self.tick()
        self.dl_calls += 1

    @property
    def opt_depth(self) -> int:
        """Optimizer steps running now (nested where one optimizer steps another)."""
        return len(self.opt_frames)

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.mine():
            return
        frame = sys._getframe(1)  # torch's step wrapper, which calls the hooks
        if self.opt_frames:
            # a step whose frame is no longer running raised out of `optimizer.step()` and the
            # script caught it: its post hook never came; it ended there (else no backward,
            # batch or later step would end a step again)
            running, f = set(), frame.f_back
            while f is not None:
                running.add(id(f))
                f = f.f_back
            while self.opt_frames and self.opt_frames[-1] not in running:
                self.opt_frames.pop()
        if self.step_codes is None:
            codes, chain, f = [], [], sites.user_frame(frame.f_back)
            while f is not None:
                codes.append(f.f_code)
                chain.append(sites.site_of(f))
                f = sites.user_frame(f.f_back)
            self.step_codes = tuple(codes)
            self.step_chain = [s for s in chain if s is not None]
        if not self.opt_frames:
            self.opt_t0 = self.pc()
            self.opt_inner0 = self.data + self.fwd + self.bwd
            self.opt_own0 = self.own
        self.opt_frames.append(id(frame))

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.mine():
            return
        frame = id(sys._getframe(1))
        if frame in self.opt_frames:
            del self.opt_frames[self.opt_frames.index(frame):]
        elif self.opt_frames:  # called from another frame than its pre hook (a torch that calls hooks otherwise)
            self.opt_frames.pop()
        if self.closed:
            self.after_close()
            return
        if self.opt_depth:
            return
        # a closure (LBFGS, Lightning's automatic optimisation: optimizer.step(closure)) runs forward
        # and backward inside the step: that time is forward and backward, measured as such, not
        # optimizer; perfdoctor's own work inside it (the profiled window's stop) is no one's
        inner = self.data + self.fwd + self.bwd - self.opt_inner0 + self.own - self.opt_own0
        self.opt += max(0.0, self.pc() - self.opt_t0 - max(0.0, inner))
        oid = id(opt)
        if self.kind != "optimizer":
            self.event("optimizer")
            self.clock_opt = oid
        elif oid != self.clock_opt:
            if oid not in self.opt_seen:  # a second optimizer (GAN): time it, do not tick
                self.opt_seen.add(oid)
                return
            self.clock_opt = oid  # stepped twice without the clock optimizer: it replaced it
        if self.opt_seen:
            self.opt_seen.clear()
        self.tick()

    def event(self, kind: str) -> bool:
        """An event of clock `kind` happened: True if it ends a step (the clock is, or becomes, `kind`)."""
        c = self.kind
        if c == kind:
            return True
        if _PRIORITY[kind] < _PRIORITY[c]:
            return False
        if c is not None and self.steps:
            self._merge_steps()
        self.kind = kind
        self.writer.restart_steps(kind)
        self._flushed = 0
        return True

    def _merge_steps(self) -> None:
        """A stronger clock appeared: what the weaker one counted becomes part of its first step."""
        first = self.steps[0]
        self.step_start = self.t0 + first[1] - first[2] / 1e3
        for s in self.steps:
            self.data += s[3] / 1e3
            self.fwd += s[4] / 1e3
            self.bwd += s[5] / 1e3
            self.opt += s[6] / 1e3
        self.device_mem.merged([s[8] for s in self.steps])
        self.steps = []
        self.on_merge()

    # -- a step ends ----------------------------------------------------------------------------
    def rss(self) -> int | None:
        if self._statm is not None:
            return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        return None

    def exclude(self, t0: float) -> None:
        """perfdoctor's own work since `t0` (a probe's site lookup, a stack walk) happened inside the
        current step: it is taken out of the step's time."""
        self.own += self.pc() - t0

    def tick(self) -> None:
        now = self.pc()
        i = len(self.steps) + 1
        try:
            wall = max(0.0, now - self.step_start - self.own)
            self.steps.append((i, now - self.t0, wall * 1e3, self.data * 1e3, self.fwd * 1e3,
                               self.bwd * 1e3, self.opt * 1e3, self.rss(), self.device_mem.read(i)))
            self.data = self.fwd = self.bwd = self.opt = self.own = 0.0
            self.forwards = 0
            self.on_step(i)  # bookkeeping from here on is not part of any step's time
            if now - self._last_flush > FLUSH_S:
                self.flush()
        except Exception as e:  # noqa: BLE001
            self.err("tick", e)
        if self.steps_limit and i >= self.steps_limit:
            self.stopping = True
            self.on_limit()
            raise StepsReached(0)
        self.step_start = self.pc()

    def flush(self) -> None:
        self._last_flush = self.pc()
        new = self.steps[self._flushed:]
        if new:
            self.writer.append_steps(new)
            self._flushed = len(self.steps)

    def after_close(self) -> None:
        """A step event after the run folder was written: if --steps was reached, the script
        swallowed StepsReached and keeps training; leave now (everything is on disk)."""
        if self.stopping:
            sys.stdout.flush()
            sys.stderr.flush()
            self.real_exit(0)

    def whole_run(self, end: float) -> tuple:
        """The whole run as one step (no step clock)."""
        return (1, end - self.t0, (end - self.t0) * 1e3, self.data * 1e3, self.fwd * 1e3, self.bwd * 1e3,
                self.opt * 1e3, self.rss(), self.device_mem.read(1))


class DeviceMemory:
    """CUDA memory per device at each step end, from the caching allocator's statistics
    (`torch.cuda.memory_stats`: host-side counters, no synchronisation, no CUDA context created).

    Nothing is read until CUDA is initialised (one `is_initialized()` per step until then; before
    it no CUDA memory exists). Every visible device is looked at, not only the current one: a rank
    that uses `cuda:{local_rank}` without `set_device` allocates on its own device while the
    current device stays 0. Devices this process never allocated on are left out (and looked at
    again every `RESCAN` steps). The peak within a step is the allocator's peak, reset at the end
    of every step (`reset_peak_memory_stats`, host-side too).

    The reset would change what the script's own `torch.cuda.max_memory_allocated()` /
    `max_memory_reserved()` return, so while installed those answer with the peak since the
    script's own last `reset_peak_memory_stats()` (or the start), as they would without perfdoctor.
    """

    RESCAN = 16

    def __init__(self, torch: Any):
        self.torch_cuda = torch.cuda
        self.patches = Patches()
        self.on = False  # CUDA is initialised
        self.count = 0  # visible devices
        self.used: set[int] = set()  # devices this process allocated on
        self.first_step: int | None = None  # the first step whose end saw CUDA initialised
        self.peaks: dict[int, int] = {}  # the highest step peak of each device
        self.carried: dict[int, int] = {}  # peaks of steps a stronger clock merged into the next one
        # the peaks of the steps since the script's own last reset, per device: (allocated, reserved)
        self.user_peak: dict[int, list[int]] = {}
        self._reset = torch.cuda.reset_peak_memory_stats  # the original, whatever install() wraps

    # -- the script's own peak readings -------------------------------------------------------------
    def install(self) -> None:
        cuda = self.torch_cuda
        mem = getattr(cuda, "memory", None)
        owners = [cuda] + ([mem] if mem is not None and hasattr(mem, "reset_peak_memory_stats") else [])
        for name, orig, which in (("max_memory_allocated", cuda.max_memory_allocated, 0),
                                  ("max_memory_reserved", cuda.max_memory_reserved, 1)):
            wrapped = self._max_since_user_reset(orig, which)
            for o in owners:
                self.patches.replace(o, name, wrapped)
        orig_reset, dm = self._reset, self

        def reset_peak_memory_stats(device: Any = None) -> Any:
            out = orig_reset(device)
            d = dm._index(device)
            if d is not None:
                dm.user_peak.pop(d, None)
            return out

        reset_peak_memory_stats.__wrapped__ = orig_reset  # type: ignore[attr-defined]
        for o in owners:
            self.patches.replace(o, "reset_peak_memory_stats", reset_peak_memory_stats)

    def uninstall(self) -> None:
        self.patches.undo()

    def _index(self, device: Any) -> int | None:
        """The device index a torch.cuda memory function was given (None: the current device)."""
        if device is None or getattr(device, "index", 0) is None:
            return int(self.torch_cuda.current_device()) if self.on else None
        if isinstance(device, str):
            return int(device.split(":", 1)[1]) if ":" in device else (
                int(self.torch_cuda.current_device()) if self.on else None)
        return int(getattr(device, "index", device))

    def _max_since_user_reset(self, orig: Any, which: int) -> Any:
        dm = self

        def peak(device: Any = None) -> int:
            now = orig(device)
            d = dm._index(device)
            seen = dm.user_peak.get(d) if d is not None else None
            return max(now, seen[which]) if seen else now

        peak.__wrapped__ = orig  # type: ignore[attr-defined]
        return peak

    # -- per step -------------------------------------------------------------------------------
    def merged(self, readings: list[dict[int, tuple[int, int]] | None]) -> None:
        """Steps merged into the next one (a stronger clock took over): their peaks are its peaks."""
        for r in readings:
            for d, (_, peak) in (r or {}).items():
                self.carried[d] = max(self.carried.get(d, 0), peak)

    def read(self, i: int) -> dict[int, tuple[int, int]] | None:
        """{device: (allocated bytes at the step end, peak allocated within the step)} for the
        devices this process allocated on; None while CUDA is not initialised."""
        cuda = self.torch_cuda
        if not self.on:
            if not cuda.is_initialized():
                return None
            self.on, self.count, self.first_step = True, int(cuda.device_count()), i
        look = range(self.count) if (i - (self.first_step or i)) % self.RESCAN == 0 else sorted(self.used)
        out: dict[int, tuple[int, int]] = {}
        for d in look:
            st = cuda.memory_stats(d)
            peak = max(int(st.get("allocated_bytes.all.peak", 0)), self.carried.pop(d, 0))
            if not peak and d not in self.used:
                continue
            self.used.add(d)
            if peak > self.peaks.get(d, 0):
                self.peaks[d] = peak
            alloc = int(st.get("allocated_bytes.all.current", 0))
            reserved = int(st.get("reserved_bytes.all.peak", 0))
            self._reset(d)
            seen = self.user_peak.setdefault(d, [0, 0])
            seen[0], seen[1] = max(seen[0], peak), max(seen[1], reserved)
            out[d] = (alloc, peak)
        return out
