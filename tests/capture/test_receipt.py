"""The receipt of a batch from a DataLoader worker, timed on the host after the run (capture/receipt.py)."""

import json
import sys
import time

import pytest

import perfdoctor.capture.receipt as receipt
from perfdoctor.capture.receipt import RECEIPTS, measure_after_run, measure_in_child, shapes_to_measure
from perfdoctor.capture.writer import write
from perfdoctor.contracts.run import DataLoaderKwargs, DataLoaderRecord, Probes


def _loader(workers: int, tensors: int = 2, nbytes: int = 8192, batches: int = 30) -> DataLoaderRecord:
    return DataLoaderRecord(kwargs=DataLoaderKwargs(num_workers=workers), batches=batches,
                            batch_tensors=tensors, batch_bytes=nbytes)


def test_only_loaders_that_load_in_the_training_process_are_timed():
    probes = Probes(dataloaders=[_loader(0), _loader(4, tensors=3), _loader(0), _loader(0, batches=0),
                                 _loader(0, tensors=5, nbytes=1 << 20)])
    assert shapes_to_measure(probes) == [(2, 8192), (5, 1 << 20)]  # each shape once; workers pay it already


@pytest.mark.e2e
def test_a_jobs_ranks_get_one_timing_of_their_shapes(tmp_path, monkeypatch):
    user = tmp_path / "project"  # where the user ran perfdoctor: its files are not what the timing imports
    user.mkdir()
    (user / "torch.py").write_text("raise SystemExit('the user torch.py was imported')\n")
    monkeypatch.chdir(user)
    ranks = [tmp_path / "rank-0", tmp_path / "rank-1"]
    for d, loader in zip(ranks, (_loader(0), _loader(0, tensors=3, nbytes=65536))):
        d.mkdir()
        write(d / "probes.json", Probes(dataloaders=[loader]))
    measure_after_run(ranks)
    docs = [json.loads((d / RECEIPTS).read_text()) for d in ranks]
    assert docs[0] == docs[1]
    got = {(r["tensors"], r["bytes"]): r for r in docs[0]["receipts"]}
    assert set(got) == {(2, 8192), (3, 65536)}
    for r in got.values():  # a worker's batch is never free: its queue, unpickling and shared storages
        assert r["ms"] > 0 and r["take_ms"] > 0 and r["batches"] == 36
        assert r["ms"] == pytest.approx(r["take_ms"] + r["read_ms"] - r["inproc_read_ms"], abs=1e-3)


def test_nothing_is_written_where_no_loader_loaded_in_process(tmp_path):
    write(tmp_path / "probes.json", Probes(dataloaders=[_loader(2)]))
    cut = tmp_path / "cut"  # a child killed while writing its probes: the analysis reports that file
    cut.mkdir()
    (cut / "probes.json").write_text('{"dataloaders": [{"id": 0, "kwargs": {"num_wor')
    measure_after_run([tmp_path, cut, tmp_path / "missing"])
    assert not (tmp_path / RECEIPTS).exists() and not (cut / RECEIPTS).exists()


@pytest.mark.e2e
def test_a_single_run_is_timed_by_a_forked_copy_of_the_child(tmp_path):
    write(tmp_path / "probes.json", Probes(dataloaders=[_loader(0), _loader(2, tensors=4)]))
    measure_in_child(tmp_path)  # this test's process plays the child: it goes on once the copy ended
    got = json.loads((tmp_path / RECEIPTS).read_text())["receipts"]
    assert [(r["tensors"], r["bytes"]) for r in got] == [(2, 8192)]
    assert got[0]["ms"] > 0 and got[0]["batches"] == 36 and got[0]["load_avg"] is not None


def test_a_copy_that_fails_or_runs_out_of_time_writes_nothing_and_the_child_goes_on(tmp_path, monkeypatch, capfd):
    write(tmp_path / "probes.json", Probes(dataloaders=[_loader(0)]))

    def fails(tensors, nbytes):
        print("a warning torch printed")
        print("Traceback: a worker died", file=sys.stderr)
        raise RuntimeError("a worker died")

    monkeypatch.setattr(receipt, "_measure", fails)
    measure_in_child(tmp_path)
    assert not (tmp_path / RECEIPTS).exists()
    assert capfd.readouterr() == ("", "")  # nothing of the copy's reaches the script's output

    def hangs(tensors, nbytes):
        time.sleep(60)

    monkeypatch.setattr(receipt, "_measure", hangs)
    monkeypatch.setattr(receipt, "TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    measure_in_child(tmp_path)  # killed past TIMEOUT_S
    assert time.monotonic() - t0 < 10 and not (tmp_path / RECEIPTS).exists()
