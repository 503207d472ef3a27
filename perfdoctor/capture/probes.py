"""Runtime probes and the step clock (runs in the child; imports torch).

The step clock is the optimizer step (a global post hook on every optimizer); a script that never
steps an optimizer is clocked by `torch.autograd.backward` calls, then by DataLoader batches, else
the whole run is one span. A stronger clock that appears later takes over: the steps counted so
far merge into its first step.

Outside the profiled window a step costs a few attribute updates, a /proc read for the RSS and
one tuple append; every probe is O(1) per call. Probe errors are recorded, never raised into the
user's script.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.holders import HolderScanner
from perfdoctor.capture.window import Window

_PRIORITY = {None: 0, "dataloader": 1, "backward": 2, "optimizer": 3}
SCAN_STEPS = 30  # loss holders are looked for during the first steps only
FWD_GLOBAL_STEPS = 3  # global forward hooks find the top-level modules, then per-module hooks
CUDA_PROBE_STEPS = 30  # Tensor.to/.cuda are watched (CUDA only) for the first steps only
FLUSH_S = 0.5


class StepsReached(SystemExit):
    """Raised from the step clock when `--steps N` is reached."""


class _Loader:
    __slots__ = ("id", "site", "kwargs", "style", "dataset", "batches", "waits", "cur", "to_cuda",
                 "non_blocking", "constructed", "cuda_seen")

    def __init__(self, i: int, site: dict | None):
        self.id, self.site = i, site
        self.kwargs: dict[str, Any] = {}
        self.style = "literal"
        self.dataset = ""
        self.batches = 0
        self.waits: list[float] = []
        self.cur = 0.0
        self.to_cuda = False
        self.non_blocking: bool | None = None
        self.constructed = 0
        self.cuda_seen = 0

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "site": self.site, "kwargs": self.kwargs, "kwargs_style": self.style,
                "dataset": self.dataset, "constructed": self.constructed, "batches": self.batches,
                "wait_ms_per_step": [round(w, 4) for w in self.waits], "to_cuda": self.to_cuda,
                "non_blocking": self.non_blocking}


class Recorder:
    def __init__(self, torch: Any, run_dir: Path, *, steps_limit: int | None = None,
                 window: tuple[int, int, int] = (5, 2, 5)):
        self.torch = torch
        self.run_dir = run_dir
        self.steps_limit = steps_limit
        self.window_cfg = window
        self.worker_iters: weakref.WeakSet = weakref.WeakSet()  # live multi-process DataLoader iterators
        self.window = Window(torch, run_dir, *window, worker_pids=self._worker_pids)
        self.pid = os.getpid()
        self.main_ident = threading.get_ident()
        self.pc = time.perf_counter
        self.t0 = self.step_start = self.pc()
        self.clock: str | None = None
        self.steps: list[tuple] = []
        self.data = self.fwd = self.bwd = self.opt = 0.0
        self.fwd_depth = self.bwd_depth = self.opt_depth = 0
        self.fwd_t0 = self.opt_t0 = 0.0
        self.clock_opt: int | None = None
        self.opt_seen: set[int] = set()
        self.dl_calls = 0
        self.loaders: dict[tuple, _Loader] = {}
        self.loader_list: list[_Loader] = []
        self.forward: dict[int, dict[str, Any]] = {}
        self.roots: dict[int, Any] = {}
        self.empty_cache: dict[tuple, dict[str, Any]] = {}
        self.anomaly: list[dict[str, Any]] = []
        self.dataparallel: list[dict[str, Any]] = []
        self.holders = HolderScanner(torch)
        self.cuda: bool | None = None  # decided at the first step (the script may set CUDA env first)
        self.batch_ids: dict[int, _Loader] = {}
        self.errors: list[str] = []
        self.stopping = False
        self.finalised = False
        self._undo: list[Any] = []
        self._fwd_handles: list[Any] = []
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self._partial = open(run_dir / "steps.partial.jsonl", "w")
        self._flushed = 0
        self._last_flush = self.t0
        self._real_exit = os._exit

    def _worker_pids(self) -> list[int]:
        """PIDs of the DataLoader worker processes alive now (py-spy samples them in the window)."""
        pids = []
        for it in list(self.worker_iters):
            for w in getattr(it, "_workers", None) or []:
                try:
                    if w.is_alive() and w.pid:
                        pids.append(int(w.pid))
                except Exception:  # noqa: BLE001 - a worker that is going away
                    pass
        return sorted(set(pids))

    # -- errors ---------------------------------------------------------------------------------
    def _err(self, where: str, e: BaseException) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{where}: {type(e).__name__}: {e}")

    # -- installation ------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, new: Any) -> Any:
        had = name in vars(owner)
        old = getattr(owner, name)
        setattr(owner, name, new)
        self._undo.append((owner, name, old, had))
        return old

    def install(self) -> None:
        torch = self.torch
        import torch.optim.optimizer as opt_mod
        import torch.utils.data.dataloader  # noqa: F401 - make the submodules attributes
        import torch.autograd.anomaly_mode  # noqa: F401
        self._undo.append(opt_mod.register_optimizer_step_pre_hook(self._opt_pre))
        self._undo.append(opt_mod.register_optimizer_step_post_hook(self._opt_post))
        self._install_backward()
        self._install_dataloader()
        mm = torch.nn.modules.module
        self._fwd_handles = [mm.register_module_forward_pre_hook(self._fwd_pre)]
        try:
            self._fwd_handles.append(mm.register_module_forward_hook(self._fwd_post, always_call=True))
        except TypeError:  # torch < 2.1
            self._fwd_handles.append(mm.register_module_forward_hook(self._fwd_post))
        self._install_misc()
        rec = self

        def _exit(code: int = 0) -> None:
            if os.getpid() == rec.pid and not rec.finalised:
                try:
                    rec.finalise("sys-exit", int(code))
                except BaseException:  # noqa: BLE001
                    pass
            rec._real_exit(code)

        self._patch(os, "_exit", _exit)
        if self.window.next_at == 0:
            self.window.tick(0)

    def _install_backward(self) -> None:
        rec = self
        orig = self.torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if rec.bwd_depth:
                return orig(*args, **kwargs)
            rec.bwd_depth = 1
            t = rec.pc()
            try:
                out = orig(*args, **kwargs)
            finally:
                rec.bwd_depth = 0
                rec.bwd += rec.pc() - t
            if rec.finalised:
                rec._after_final()
            elif rec.clock == "backward" or rec.clock is None:
                if rec._clock_event("backward"):
                    rec._tick()
            return out

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        self._patch(self.torch.autograd, "backward", backward)

    def _install_dataloader(self) -> None:
        rec = self
        dl = self.torch.utils.data.dataloader
        orig_next = dl._BaseDataLoaderIter.__next__
        orig_iter = dl.DataLoader.__iter__
        orig_init = dl.DataLoader.__init__

        def __next__(it: Any) -> Any:
            if rec.finalised:
                rec._after_final()
            elif rec.dl_calls and (rec.clock == "dataloader" or rec.clock is None):
                if rec._clock_event("dataloader"):
                    rec._tick()
            rec.dl_calls += 1
            lrec = getattr(it, "_pd_rec", None)
            t = rec.pc()
            try:
                batch = orig_next(it)
            finally:
                dt = rec.pc() - t
                rec.data += dt
                if lrec is not None:
                    lrec.cur += dt
            if lrec is not None:
                lrec.batches += 1
                if rec.cuda and lrec.cuda_seen < 3:
                    rec._tag_batch(batch, lrec)
            return batch

        def __iter__(loader: Any) -> Any:
            it = orig_iter(loader)
            try:
                it._pd_rec = loader.__dict__.get("_pd_rec")
                if getattr(it, "_workers", None):
                    rec.worker_iters.add(it)
            except Exception:  # noqa: BLE001
                pass
            return it

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(loader, *args, **kwargs)
            if "_pd_rec" not in loader.__dict__:
                try:
                    rec._on_loader(loader, sys._getframe(1))
                except Exception as e:  # noqa: BLE001
                    rec._err("dataloader", e)

        self._patch(dl._BaseDataLoaderIter, "__next__", __next__)
        self._patch(dl.DataLoader, "__iter__", __iter__)
        self._patch(dl.DataLoader, "__init__", __init__)

    def _install_misc(self) -> None:
        torch, rec = self.torch, self

        # torch.cuda.empty_cache (both names the function is reachable by)
        orig_ec = torch.cuda.empty_cache

        def empty_cache() -> None:
            try:
                site = sites.caller_site()
                key = (site["file"], site["line"]) if site else ("?", 0)
                r = rec.empty_cache.get(key)
                if r is None:
                    r = rec.empty_cache[key] = {"site": site, "calls": 0, "calls_in_steps": 0}
                r["calls"] += 1
                if rec.steps:
                    r["calls_in_steps"] += 1
            except Exception as e:  # noqa: BLE001
                rec._err("empty_cache", e)
            return orig_ec()

        self._patch(torch.cuda, "empty_cache", empty_cache)
        if getattr(torch.cuda, "memory", None) is not None and hasattr(torch.cuda.memory, "empty_cache"):
            self._patch(torch.cuda.memory, "empty_cache", empty_cache)

        # anomaly detection switches
        am = torch.autograd.anomaly_mode
        for cls, fixed in ((am.set_detect_anomaly, None), (am.detect_anomaly, True)):
            orig = cls.__init__

            def init(obj: Any, *args: Any, _orig: Any = orig, _fixed: Any = fixed, **kwargs: Any) -> None:
                _orig(obj, *args, **kwargs)
                try:
                    on = _fixed if _fixed is not None else bool(args[0] if args else kwargs.get("mode", True))
                    rec.anomaly.append({"site": sites.caller_site(), "enabled": on})
                except Exception as e:  # noqa: BLE001
                    rec._err("anomaly", e)

            self._patch(cls, "__init__", init)

        # nn.DataParallel construction
        dp = torch.nn.DataParallel
        orig_dp = dp.__init__

        def dp_init(obj: Any, *args: Any, **kwargs: Any) -> None:
            orig_dp(obj, *args, **kwargs)
            try:
                ids = getattr(obj, "device_ids", None)
                rec.dataparallel.append({"site": sites.caller_site(), "device_ids": list(ids) if ids else None,
                                         "device_count": torch.cuda.device_count()})
            except Exception as e:  # noqa: BLE001
                rec._err("dataparallel", e)

        self._patch(dp, "__init__", dp_init)

    def uninstall(self) -> None:
        for h in self._fwd_handles:
            h.remove()
        self._fwd_handles = []
        for u in reversed(self._undo):
            if isinstance(u, tuple):
                owner, name, old, had = u
                if had:
                    setattr(owner, name, old)
                else:
                    try:
                        delattr(owner, name)
                    except AttributeError:
                        pass
            else:
                u.remove()
        self._undo = []

    # -- DataLoader -----------------------------------------------------------------------------
    def _on_loader(self, loader: Any, frame: Any) -> None:
        uf = sites.user_frame(frame)
        site = sites.site_of(uf)
        key = (site["file"], site["line"]) if site else ("?", len(self.loaders))
        lrec = self.loaders.get(key)
        if lrec is None:
            lrec = self.loaders[key] = _Loader(len(self.loaders), site)
            lrec.waits = [0.0] * len(self.steps)
            self.loader_list.append(lrec)
        ctx = loader.multiprocessing_context
        if ctx is not None and not isinstance(ctx, str):
            ctx = ctx.get_start_method()
        lrec.kwargs = {"batch_size": loader.batch_size, "num_workers": loader.num_workers,
                       "pin_memory": bool(loader.pin_memory), "persistent_workers": bool(loader.persistent_workers),
                       "prefetch_factor": loader.prefetch_factor, "multiprocessing_context": ctx,
                       "drop_last": bool(loader.drop_last)}
        lrec.style = sites.kwargs_style(uf) if uf is not None else "literal"
        lrec.dataset = type(loader.dataset).__name__
        lrec.constructed += 1
        loader.__dict__["_pd_rec"] = lrec

    def _tag_batch(self, batch: Any, lrec: _Loader) -> None:
        T = self.torch.Tensor
        ids: dict[int, _Loader] = {}
        todo = [batch]
        for _ in range(64):
            if not todo:
                break
            b = todo.pop()
            if isinstance(b, T):
                if not b.is_cuda:
                    ids[id(b)] = lrec
            elif isinstance(b, (list, tuple)):
                todo.extend(b[:16])
            elif isinstance(b, dict):
                todo.extend(list(b.values())[:16])
        self.batch_ids = ids

    def _install_cuda_probe(self) -> None:
        T, rec = self.torch.Tensor, self
        orig_to, orig_cuda = T.to, T.cuda

        def seen(t: Any, out: Any, args: tuple, kwargs: dict) -> None:
            lrec = rec.batch_ids.get(id(t))
            if lrec is not None and getattr(out, "is_cuda", False):
                nb = bool(kwargs.get("non_blocking", any(a is True for a in args)))
                lrec.to_cuda = True
                lrec.non_blocking = nb if lrec.non_blocking is None else (lrec.non_blocking and nb)
                lrec.cuda_seen += 1

        def to(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_to(t, *args, **kwargs)
            if rec.batch_ids:
                seen(t, out, args, kwargs)
            return out

        def cuda(t: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_cuda(t, *args, **kwargs)
            if rec.batch_ids:
                seen(t, out, args, kwargs)
            return out

        self._cuda_undo = len(self._undo)
        self._patch(T, "to", to)
        self._patch(T, "cuda", cuda)

    def _remove_cuda_probe(self) -> None:
        for owner, name, old, had in (self._undo[self._cuda_undo], self._undo[self._cuda_undo + 1]):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        del self._undo[self._cuda_undo:self._cuda_undo + 2]
        self.batch_ids = {}
        self.cuda = False  # stop tagging batches

    # -- forward --------------------------------------------------------------------------------
    def _fwd_pre(self, mod: Any, args: Any) -> None:
        if threading.get_ident() != self.main_ident:
            return
        if self.fwd_depth:
            self.fwd_depth += 1
            return
        if self.bwd_depth:  # activation checkpointing re-runs forward inside backward
            return
        self.fwd_depth = 1
        self.fwd_t0 = self.pc()
        try:
            r = self.forward.get(id(mod))
            if r is None:
                r = self._new_forward(mod)
            r["calls"] += 1
            if self._autocast(r["device"]):
                r["autocast_calls"] += 1
        except Exception as e:  # noqa: BLE001
            self._err("forward", e)

    def _fwd_post(self, mod: Any, args: Any, out: Any) -> None:
        if self.fwd_depth == 0 or threading.get_ident() != self.main_ident:
            return
        self.fwd_depth -= 1
        if self.fwd_depth == 0:
            self.fwd += self.pc() - self.fwd_t0

    def _new_forward(self, mod: Any) -> dict[str, Any]:
        p = next(mod.parameters(), None)
        r = {"site": sites.caller_site(2), "module": type(mod).__name__, "calls": 0, "autocast_calls": 0,
             "param_dtype": str(p.dtype).replace("torch.", "") if p is not None else None,
             "device": p.device.type if p is not None else "cpu",
             "params": int(sum(q.numel() for q in mod.parameters()))}
        self.forward[id(mod)] = r
        self.roots[id(mod)] = weakref.ref(mod)
        return r

    def _autocast(self, dev: str) -> bool:
        torch = self.torch
        try:
            return bool(torch.is_autocast_enabled(dev)) or (dev != "cuda" and bool(torch.is_autocast_enabled()))
        except TypeError:  # older torch: no device argument
            return bool(torch.is_autocast_enabled() or (dev == "cpu" and torch.is_autocast_cpu_enabled()))

    def _forward_to_roots(self) -> None:
        """Swap the global forward hooks (slow path for every module) for hooks on the roots only."""
        for h in self._fwd_handles:
            h.remove()
        self._fwd_handles = []
        for ref in self.roots.values():
            m = ref()
            if m is None:
                continue
            self._fwd_handles.append(m.register_forward_pre_hook(self._fwd_pre))
            try:
                self._fwd_handles.append(m.register_forward_hook(self._fwd_post, always_call=True))
            except TypeError:
                self._fwd_handles.append(m.register_forward_hook(self._fwd_post))
        self.fwd_depth = 0

    # -- optimizer ------------------------------------------------------------------------------
    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.opt_depth == 0:
            self.opt_t0 = self.pc()
        self.opt_depth += 1

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.opt_depth = max(0, self.opt_depth - 1)
        if self.finalised:
            self._after_final()
            return
        if self.opt_depth:
            return
        self.opt += self.pc() - self.opt_t0
        oid = id(opt)
        if self.clock != "optimizer":
            self._clock_event("optimizer")
            self.clock_opt = oid
        elif oid != self.clock_opt:
            if oid not in self.opt_seen:  # a second optimizer (GAN): time it, do not tick
                self.opt_seen.add(oid)
                return
            self.clock_opt = oid  # stepped twice without the clock optimizer: it replaced it
        if self.opt_seen:
            self.opt_seen.clear()
        self._tick()

    # -- the step clock -------------------------------------------------------------------------
    def _clock_event(self, kind: str) -> bool:
        c = self.clock
        if c == kind:
            return True
        if _PRIORITY[kind] < _PRIORITY[c]:
            return False
        if c is not None and self.steps:
            self._merge_steps()
        self.clock = kind
        self._partial.seek(0)
        self._partial.truncate()
        self._partial.write(json.dumps({"clock": kind}) + "\n")
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
        self.steps = []
        for lrec in self.loader_list:
            lrec.cur += sum(lrec.waits) / 1e3
            lrec.waits = []
        if self.window.state != "wait":
            self.window.discard = True
            self.window._abort()
            for f in ("trace.json.gz", "hotspots.json", "profile.pstats"):
                (self.run_dir / f).unlink(missing_ok=True)
        self.window = Window(self.torch, self.run_dir, *self.window_cfg, worker_pids=self._worker_pids)
        self.holders.cands.clear()

    def _mem(self) -> int | None:
        if self.cuda:
            return int(self.torch.cuda.memory_allocated())
        if self._statm is not None:
            return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        return None

    def _tick(self) -> None:
        now = self.pc()
        i = len(self.steps) + 1
        try:
            self.steps.append((i, now - self.t0, (now - self.step_start) * 1e3, self.data * 1e3, self.fwd * 1e3,
                               self.bwd * 1e3, self.opt * 1e3, self._mem()))
            self.data = self.fwd = self.bwd = self.opt = 0.0
            self.fwd_depth = 0
            for lrec in self.loader_list:
                lrec.waits.append(lrec.cur * 1e3)
                lrec.cur = 0.0
            # bookkeeping below is not part of any step's time
            if i <= CUDA_PROBE_STEPS:
                self._early(i)
            if i >= self.window.next_at:
                self.window.tick(i)
            if now - self._last_flush > FLUSH_S:
                self._flush()
        except Exception as e:  # noqa: BLE001
            self._err("tick", e)
        if self.steps_limit and i >= self.steps_limit:
            self._stop()
        self.step_start = self.pc()

    def _early(self, i: int) -> None:
        if i == 1:
            self.cuda = bool(self.torch.cuda.is_initialized())
            if self.cuda:
                self._install_cuda_probe()
        if i == FWD_GLOBAL_STEPS:
            self._forward_to_roots()
        if i <= SCAN_STEPS and not self.window.active_now:
            self.holders.scan(i, sys._getframe())
        if i == CUDA_PROBE_STEPS and self.cuda:
            self._remove_cuda_probe()

    def _flush(self) -> None:
        self._last_flush = self.pc()
        new = self.steps[self._flushed:]
        if new:
            self._partial.write("".join(json.dumps(self._step_dict(s)) + "\n" for s in new))
            self._partial.flush()
            self._flushed = len(self.steps)

    def _after_final(self) -> None:
        """A step event after the run folder was written: if --steps was reached, the script
        swallowed StepsReached and keeps training; leave now (everything is on disk)."""
        if self.stopping:
            sys.stdout.flush()
            sys.stderr.flush()
            self._real_exit(0)

    def _stop(self) -> None:
        self.stopping = True
        self.finalise("steps-reached", 0)
        raise StepsReached(0)

    @staticmethod
    def _step_dict(s: tuple) -> dict[str, Any]:
        return {"i": s[0], "end_s": round(s[1], 6), "wall_ms": round(s[2], 4), "data_ms": round(s[3], 4),
                "forward_ms": round(s[4], 4), "backward_ms": round(s[5], 4), "optimizer_ms": round(s[6], 4),
                "mem_bytes": s[7]}

    # -- the end --------------------------------------------------------------------------------
    def finalise(self, reason: str, code: int, traceback: str | None = None) -> None:
        """Stop the profiler and write the run folder. Safe to call once from any exit path."""
        if self.finalised:
            return
        self.finalised = True
        import signal

        main = threading.get_ident() == self.main_ident
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self._write_all(reason, code, traceback)
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _write_all(self, reason: str, code: int, tb: str | None) -> None:
        from perfdoctor.capture.env import collect_env, user_files

        end = self.pc()
        try:
            self.window.finish()
        except Exception as e:  # noqa: BLE001
            self._err("window", e)
        steps = [self._step_dict(s) for s in self.steps]
        if self.clock is None or not steps:  # no step clock: the whole run is one span
            steps = [self._step_dict((1, end - self.t0, (end - self.t0) * 1e3, self.data * 1e3, self.fwd * 1e3,
                                      self.bwd * 1e3, self.opt * 1e3, self._mem()))]
            for lrec in self.loader_list:
                lrec.waits = [sum(lrec.waits) + lrec.cur * 1e3]
        _write_json(self.run_dir / "steps.json", {"steps": steps})
        fwd = []
        for r in self.forward.values():
            r = dict(r)
            r["autocast"] = r["autocast_calls"] * 2 >= r["calls"] > 0
            fwd.append(r)
        probes = {"dataloaders": [lr.as_dict() for lr in self.loader_list], "dataparallel": self.dataparallel,
                  "empty_cache": list(self.empty_cache.values()), "anomaly": self.anomaly, "forward": fwd,
                  "loss_holders": self.holders.records()}
        _write_json(self.run_dir / "probes.json", probes)
        meta = json.loads((self.run_dir / "meta.json").read_text())
        meta.update({"wall_s": round(end - self.t0, 4),
                     "exit": {"code": code, "reason": reason, "traceback": tb},
                     "step_clock": self.clock or "none", "window": self.window.meta(),
                     "env": collect_env(self.torch), "steps_limit": self.steps_limit,
                     "user_files": user_files(meta.get("script"), meta.get("cwd"), meta.get("module")),
                     "probe_errors": self.errors, "complete": True})
        _write_json(self.run_dir / "meta.json", meta)
        try:
            self._partial.close()
            (self.run_dir / "steps.partial.jsonl").unlink()
        except OSError:
            pass


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
