"""DataLoaders: where each was built and with what, how long each step waited for its batches,
how long each epoch's iterator took to its first batch (worker start-up, PD015), and whether its batches went to a CUDA device (with `capture/probes/cuda_batches.py`).

`DataLoader.__next__` is also the DataLoader step clock's event and the step's data time.

The probe's bookkeeping lives in weak maps of its own (loader -> its site's state, iterator -> the
same), never on the user's DataLoader or its iterators: pickling or copying them sees what a bare
run has.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from msgspec import UNSET

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.capture.probes.cuda_batches import CudaBatchProbe
from perfdoctor.contracts.run import DataLoaderKwargs, DataLoaderRecord, Site

MAX_EPOCHS = 1000  # first-batch times kept per loader
BATCH_SHAPE_SAMPLES = 3  # batches per loader whose tensors and bytes are counted (PD002's receipt cost)
MAX_DRAW_SITES = 8  # user lines kept per loader that drew an epoch's first batch (the loops over it)
_MAX_BATCH_DEPTH = 6  # nesting of tuples, lists and dicts walked in a batch
_MAX_BATCH_ITEMS = 10_000  # objects walked in one batch
_MAX_ORIGIN_DEPTH = 8  # frames above a DataLoader's construction searched for the loader it wraps


class LoaderState:
    """One DataLoader construction site, while the run goes on."""

    __slots__ = ("id", "site", "kwargs", "style", "dataset", "batches", "waits", "cur", "to_cuda",
                 "non_blocking", "constructed", "cuda_seen", "sampler", "sharded", "first_batch_ms",
                 "first_batch_step", "first_batch_index", "length", "origin", "batch_tensors", "batch_bytes", "draw_sites")

    def __init__(self, i: int, site: Site | None):
        self.id, self.site = i, site
        self.origin: Site | None = None  # the site of the loader this one was built from
        self.kwargs = DataLoaderKwargs()
        self.style = "literal"
        self.dataset = ""
        self.batches = 0
        self.waits: list[float] = []  # ms per step
        self.cur = 0.0  # s waited in the current step
        self.to_cuda = False
        self.non_blocking: bool | None = None
        self.constructed = 0
        self.cuda_seen = 0  # batches seen moved to CUDA
        self.sampler = ""
        self.sharded: bool | None = None
        self.first_batch_ms: list[float] = []  # per iterator (epoch): from iter() to its first batch
        self.first_batch_step: list[int] = []  # the step each epoch's first batch arrived in
        self.first_batch_index: list[int] = []  # the batches it had delivered before each epoch's first one
        self.length: int | None = None  # len(loader): batches per epoch
        self.batch_tensors: int | None = None  # the largest of the first batches: its tensors and their bytes
        self.batch_bytes: int | None = None
        self.draw_sites: list[Site] = []  # the user lines that drew an epoch's first batch: the loops over it

    def record(self) -> DataLoaderRecord:
        return DataLoaderRecord(id=self.id, site=self.site, kwargs=self.kwargs, kwargs_style=self.style,
                                dataset=self.dataset, constructed=self.constructed, batches=self.batches,
                                wait_ms_per_step=[round(w, 4) for w in self.waits], to_cuda=self.to_cuda,
                                non_blocking=self.non_blocking, sampler=self.sampler or UNSET,
                                sharded=UNSET if self.sharded is None else self.sharded,
                                first_batch_ms=[round(x, 4) for x in self.first_batch_ms],
                                first_batch_step=self.first_batch_step,
                                first_batch_index=self.first_batch_index, length=self.length,
                                origin=self.origin, batch_tensors=self.batch_tensors,
                                batch_bytes=self.batch_bytes, draw_sites=self.draw_sites)


class DataLoaderProbe:
    def __init__(self, torch: Any, clock: StepClock, cuda: CudaBatchProbe, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.cuda = cuda
        self.host: Any = None  # the host-tensor probe: where the step moves each batch (set by the coordinator)
        self.err = err
        self.patches = Patches()
        self.loaders: dict[tuple, LoaderState] = {}
        self.loader_list: list[LoaderState] = []
        self.worker_iters: weakref.WeakSet = weakref.WeakSet()  # live multi-process DataLoader iterators
        self.of_loader: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DataLoader -> LoaderState
        self.of_iter: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # its iterators -> LoaderState
        self.iter_t0: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # an iterator -> when iter() began
        self.poll: Callable[[], None] = lambda: None  # set by the coordinator: the window's time budget

    def install(self) -> None:
        import torch.utils.data.dataloader  # noqa: F401 - make the submodules attributes

        probe, clock, of_loader, of_iter, iter_t0 = self, self.clock, self.of_loader, self.of_iter, self.iter_t0
        current_thread = threading.current_thread
        dl = self.torch.utils.data.dataloader
        orig_next = dl._BaseDataLoaderIter.__next__
        orig_iter = dl.DataLoader.__iter__
        orig_init = dl.DataLoader.__init__

        def __next__(it: Any) -> Any:
            probe.poll()
            clock.before_batch()
            try:
                lrec = of_iter.get(it)
            except TypeError:  # a subclass that is not hashable
                lrec = None
            t, own0 = clock.pc(), clock.own
            # only the training thread's own fetch (`StepClock.mine`) hides its reads and forwards as data
            # loading: a thread that prefetches batches fetches while the training thread steps
            ours = current_thread() is clock.thread
            clock.in_batch += ours
            try:
                batch = orig_next(it)
            finally:
                clock.in_batch -= ours
                dt = clock.pc() - t - max(0.0, clock.own - own0)  # less perfdoctor's own work inside the fetch
                clock.data += dt
                if lrec is not None:
                    lrec.cur += dt
            if lrec is not None:
                t0 = iter_t0.pop(it, None)
                if t0 is not None:  # the epoch's first batch: iter() (worker start-up) and this wait
                    if len(lrec.first_batch_ms) < MAX_EPOCHS:
                        lrec.first_batch_ms.append((clock.pc() - t0) * 1e3)
                        lrec.first_batch_step.append(len(clock.steps) + 1)
                        lrec.first_batch_index.append(lrec.batches)
                    if len(lrec.draw_sites) < MAX_DRAW_SITES:
                        probe._draw_site(lrec, sys._getframe(1))
                lrec.batches += 1
                if lrec.batches <= BATCH_SHAPE_SAMPLES:
                    try:
                        probe._batch_shape(lrec, batch)
                    except Exception as e:  # noqa: BLE001 - a batch type that does not walk
                        probe.err("dataloader", e)
                if probe.cuda.active and lrec.cuda_seen < 3:
                    probe.cuda.tag(batch, lrec)
                if probe.host is not None and probe.host.on:
                    probe.host.tag(batch, lrec.id)
            return batch

        def __iter__(loader: Any) -> Any:
            t = clock.pc()
            it = orig_iter(loader)
            dt = clock.pc() - t
            clock.data += dt  # starting the workers is data loading, this loader's (its wait in the step)
            try:
                lrec = of_loader.get(loader)
                if lrec is not None:
                    lrec.cur += dt
                    of_iter[it] = lrec
                    iter_t0[it] = t  # until its first batch: an epoch's start-up (PD015)
                if getattr(it, "_workers", None):
                    probe.worker_iters.add(it)
            except Exception:  # noqa: BLE001
                pass
            return it

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(loader, *args, **kwargs)
            if loader not in of_loader:
                t = clock.pc()
                try:
                    probe._on_loader(loader, sys._getframe(1))
                except Exception as e:  # noqa: BLE001
                    probe.err("dataloader", e)
                clock.exclude(t)  # a loader built every epoch: its site lookup is not the step's time

        self.patches.replace(dl._BaseDataLoaderIter, "__next__", __next__)
        self.patches.replace(dl.DataLoader, "__iter__", __iter__)
        self.patches.replace(dl.DataLoader, "__init__", __init__)

    def uninstall(self) -> None:
        self.patches.undo()

    def _draw_site(self, lrec: LoaderState, frame: Any) -> None:
        """Keep the user line that drew an epoch's first batch (the `for` over the loader, a `next(it)`),
        once: where the run's loops over this loader are, in whatever file (a loader a helper module
        builds and returns, iterated by the training loop of another)."""
        t = self.clock.pc()
        try:
            site = sites.site_of(sites.user_frame(frame))
            if site is not None and all((d.file, d.line) != (site.file, site.line) for d in lrec.draw_sites):
                lrec.draw_sites.append(site)
        except Exception as e:  # noqa: BLE001
            self.err("dataloader", e)
        self.clock.exclude(t)

    def _on_loader(self, loader: Any, frame: Any) -> None:
        frame = _outside(loader, frame)
        uf = sites.user_frame(frame)
        site = sites.site_of(uf)
        key = (site.file, site.line) if site else ("?", len(self.loaders))
        lrec = self.loaders.get(key)
        if lrec is None:
            lrec = self.loaders[key] = LoaderState(len(self.loaders), site)
            lrec.waits = [0.0] * len(self.clock.steps)
            self.loader_list.append(lrec)
        ctx = loader.multiprocessing_context
        if ctx is not None and not isinstance(ctx, str):
            ctx = ctx.get_start_method()
        lrec.kwargs = DataLoaderKwargs(batch_size=loader.batch_size, num_workers=loader.num_workers,
                                       pin_memory=bool(loader.pin_memory),
                                       persistent_workers=bool(loader.persistent_workers),
                                       prefetch_factor=loader.prefetch_factor, multiprocessing_context=ctx,
                                       drop_last=bool(loader.drop_last))
        lrec.style = sites.kwargs_style(uf) if uf is not None else "literal"
        lrec.dataset = type(loader.dataset).__name__
        lrec.sampler, lrec.sharded = self._sampler(loader)
        try:
            lrec.length = len(loader)
        except TypeError:  # an IterableDataset without __len__
            lrec.length = None
        lrec.constructed += 1
        lrec.origin = lrec.origin or self._origin(loader, frame)
        self.of_loader[loader] = lrec

    def _origin(self, loader: Any, frame: Any) -> Site | None:
        """Where the loader this one was built from was built: a library that wraps the user's loader
        in its own (opacus's `DPDataLoader.from_data_loader`, a framework's `prepare`) is handed that
        loader as an argument and builds a new one over the same dataset with its settings. The user's
        settings (num_workers, pin_memory) are written at the original's line, where a fix goes."""
        base = self.torch.utils.data.DataLoader
        f, depth = frame, 0
        while f is not None and depth < _MAX_ORIGIN_DEPTH:
            code = f.f_code
            nargs = code.co_argcount + code.co_kwonlyargcount
            local = f.f_locals
            for name in code.co_varnames[:nargs]:
                other = local.get(name)
                if (other is not loader and isinstance(other, base) and other in self.of_loader
                        and getattr(other, "dataset", None) is loader.dataset
                        and getattr(other, "num_workers", None) == loader.num_workers):
                    return self.of_loader[other].site
            f, depth = f.f_back, depth + 1
        return None

    def _sampler(self, loader: Any) -> tuple[str, bool | None]:
        """The loader's sampler (its batch sampler's where the user gave one), and whether it gives each
        rank of a distributed job its own shard: a DistributedSampler, or a sampler of the user's that
        says so in its name (DistributedBucketSampler...). None for an IterableDataset, which shards
        itself (or not) where perfdoctor cannot see."""
        data = self.torch.utils.data
        if isinstance(loader.dataset, data.IterableDataset):
            return "", None
        bs = loader.batch_sampler
        custom = bs is not None and type(bs) is not data.BatchSampler
        parts = [bs, getattr(bs, "sampler", None)] if custom else [loader.sampler]
        name = type(parts[0]).__name__
        dist = data.DistributedSampler
        return name, any(p is not None and (isinstance(p, dist) or "distributed" in type(p).__name__.lower())
                         for p in parts)

    def _batch_shape(self, lrec: LoaderState, batch: Any) -> None:
        """Count a batch's tensors and their bytes (tuples, lists and mappings walked; a tensor's own bytes,
        not its storage's); kept where it is the largest seen. What a worker would send of it: one
        storage per tensor through shared memory."""
        tensor = self.torch.Tensor
        tensors = nbytes = seen = 0
        todo: list[tuple[Any, int]] = [(batch, 0)]
        while todo and seen < _MAX_BATCH_ITEMS:
            obj, depth = todo.pop()
            seen += 1
            if isinstance(obj, tensor):
                tensors += 1
                nbytes += obj.nelement() * obj.element_size()
            elif depth < _MAX_BATCH_DEPTH and isinstance(obj, (tuple, list)):
                todo.extend((x, depth + 1) for x in obj)
            elif depth < _MAX_BATCH_DEPTH and isinstance(obj, Mapping):
                todo.extend((x, depth + 1) for x in obj.values())
        if tensors and (lrec.batch_bytes is None or nbytes > lrec.batch_bytes):
            lrec.batch_tensors, lrec.batch_bytes = tensors, nbytes

    def worker_pids(self) -> list[int]:
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

    # -- driven by the step clock ---------------------------------------------------------------
    def end_step(self) -> None:
        for lrec in self.loader_list:
            lrec.waits.append(lrec.cur * 1e3)
            lrec.cur = 0.0

    def merge_steps(self) -> None:
        """A stronger clock took over: the waits so far belong to its first step."""
        for lrec in self.loader_list:
            lrec.cur += sum(lrec.waits) / 1e3
            lrec.waits = []

    def whole_run(self) -> None:
        """No step clock: the run is one step, and so are the waits."""
        for lrec in self.loader_list:
            lrec.waits = [sum(lrec.waits) + lrec.cur * 1e3]

    def records(self) -> list[DataLoaderRecord]:
        return [lr.record() for lr in self.loader_list]


def _outside(loader: Any, frame: Any) -> Any:
    """The frame that built `loader`, out of its own class's methods: a DataLoader subclass of the user's
    (Conv-TasNet's `AudioDataLoader.__init__` calls `super().__init__(...)`) builds the training and the
    validation loaders at one line of its own; each is the user's call of the subclass."""
    while frame is not None:
        code = frame.f_code
        if not code.co_argcount or frame.f_locals.get(code.co_varnames[0]) is not loader:
            return frame
        frame = frame.f_back
    return frame
