"""The DataLoader probe names the user's loader a library rebuilt (opacus, accelerate), in process."""

from __future__ import annotations

import torch

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.capture.probes.dataloader import DataLoaderProbe
from tests.capture.test_checklist_probes import Clock


def _wrap(data_loader):
    """A library's wrapper, as opacus's DPDataLoader.from_data_loader: handed the user's loader, it
    builds its own over the same dataset with the user's settings."""
    return torch.utils.data.DataLoader(data_loader.dataset, batch_size=data_loader.batch_size,
                                       num_workers=data_loader.num_workers)


def test_a_loader_built_from_the_users_is_judged_at_the_users_line(monkeypatch):
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4))
    probe = DataLoaderProbe(torch, Clock(), None, ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        user = torch.utils.data.DataLoader(ds, batch_size=8)  # the user's line
        wrapped = _wrap(user)
        evaluation = torch.utils.data.DataLoader(ds, batch_size=16)  # the same dataset, built beside it
    finally:
        probe.uninstall()
    from_wrap = next(r for r in probe.records() if r.site.function == "_wrap")
    assert from_wrap.origin is not None and "user = torch.utils.data.DataLoader" in from_wrap.origin.code
    assert from_wrap.judged_site == from_wrap.origin
    # a loader over the same dataset that is not handed in (train and evaluation loaders of one
    # dataset, built side by side) is its own
    assert [r.origin for r in probe.records() if r.site.function != "_wrap"] == [None, None]
    assert wrapped is not user and evaluation is not user


def test_a_batchs_tensors_and_bytes_are_counted_for_pd002s_receipt():
    """What a worker would send of a batch: its tensors (tuples, lists, mappings walked) and their bytes;
    the largest of the batches seen is kept, a batch without tensors leaves nothing."""
    from perfdoctor.capture.probes.dataloader import LoaderState

    probe = DataLoaderProbe(torch, Clock(), None, ErrorLog())  # type: ignore[arg-type]
    lrec = LoaderState(0, None)
    probe._batch_shape(lrec, ["no", "tensors"])
    assert lrec.batch_tensors is None and lrec.batch_bytes is None
    probe._batch_shape(lrec, (torch.zeros(4, 8), torch.zeros(4, dtype=torch.int64)))
    assert (lrec.batch_tensors, lrec.batch_bytes) == (2, 4 * 8 * 4 + 4 * 8)
    batch = {"x": torch.zeros(16, 8, dtype=torch.float16), "meta": {"ids": [torch.zeros(3), torch.zeros(3)]},
             "name": "a"}
    probe._batch_shape(lrec, batch)
    assert (lrec.batch_tensors, lrec.batch_bytes) == (3, 16 * 8 * 2 + 2 * 3 * 4)
    probe._batch_shape(lrec, (torch.zeros(1),))  # a smaller last batch does not replace it
    assert (lrec.batch_tensors, lrec.batch_bytes) == (3, 280)
    rec = lrec.record()
    assert (rec.batch_tensors, rec.batch_bytes) == (3, 280)


def _epoch(loader):  # a helper's loop over a loader it was handed (another file's training loop)
    for (x,) in loader:
        x.sum()


def test_the_lines_that_draw_each_epochs_first_batch_are_kept_once(monkeypatch):
    """Where the loops over a loader are, whatever file built it: the user line that drew each epoch's
    first batch (a `for` over it, a `next(iter(loader))` peek), once per line."""
    import types

    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    clock = Clock()
    clock.before_batch, clock.in_batch, clock.data, clock.thread = (lambda: None), 0, 0.0, None  # type: ignore[attr-defined]
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4))
    probe = DataLoaderProbe(torch, clock, types.SimpleNamespace(active=False), ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        next(iter(loader))  # a peek at one batch
        for _ in range(3):  # three epochs of one loop
            _epoch(loader)
    finally:
        probe.uninstall()
    (rec,) = probe.records()
    # the batches delivered before each pass's first: the peek's pass left after 1 of its 4 (PD015's cadence)
    assert rec.first_batch_index == [0, 1, 5, 9] and rec.length == 4
    assert [(s.function, s.code) for s in rec.draw_sites] == [
        ("test_the_lines_that_draw_each_epochs_first_batch_are_kept_once", "next(iter(loader))  # a peek at one batch"),
        ("_epoch", "for (x,) in loader:"),
    ]


class _AudioLoader(torch.utils.data.DataLoader):
    """Conv-TasNet's AudioDataLoader: a subclass of the user's that passes everything to DataLoader."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # one line of the user's builds every such loader


def test_a_loader_subclass_of_the_users_is_keyed_at_each_call_of_it(monkeypatch):
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4))
    probe = DataLoaderProbe(torch, Clock(), None, ErrorLog())  # type: ignore[arg-type]
    probe.install()
    try:
        train = _AudioLoader(ds, batch_size=8, num_workers=2)  # the training loader
        valid = _AudioLoader(ds, batch_size=8, num_workers=0)  # the validation loader
    finally:
        probe.uninstall()
    recs = sorted(probe.records(), key=lambda r: r.site.line)
    assert [r.site.code for r in recs] == ["train = _AudioLoader(ds, batch_size=8, num_workers=2)  # the training loader",
                                           "valid = _AudioLoader(ds, batch_size=8, num_workers=0)  # the validation loader"]
    assert [r.kwargs.num_workers for r in recs] == [2, 0]  # each its own settings, not the last one's
    assert train is not valid
