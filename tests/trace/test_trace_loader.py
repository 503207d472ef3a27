"""The trace loader on real traces from other projects (tests/data/traces, see tests/data/README.md)."""

import gzip
import json
import shutil

import pytest

from perfdoctor.errors import InputError
from perfdoctor.trace import load_trace, load_traces, loader
from perfdoctor.trace.model import CPU_OP, KERNEL, MEMCPY, MEMORY, PYFUNC, RUNTIME
from tests.helpers import CPU, DLRM, HTA, KINETO, MI300, TRACES

DATA = TRACES


def raw(path):
    return json.load(gzip.open(path) if path.name.endswith(".gz") else open(path))


@pytest.mark.slow
def test_torch2_trace_counts_match_raw_json():
    t = load_trace(HTA)
    ev = raw(HTA)["traceEvents"]
    kernels = sum(1 for e in ev if e.get("cat") == "kernel")
    assert sum(1 for k in t.kind if k == KERNEL) == kernels == 4350
    assert sum(1 for k in t.kind if k == RUNTIME) == sum(1 for e in ev if e.get("cat") == "cuda_runtime")
    assert [s[0] for s in t.steps] == [f"ProfilerStep#{i}" for i in range(101, 106)]
    assert t.step_source == "profiler-step" and t.rank == 0 and t.rank_source == "distributedInfo"
    assert t.device_properties[0]["name"] == "Tesla V100-SXM2-32GB" and t.device_type == "cuda"
    # fractional microseconds survive; kernels carry correlation and stream
    i = next(i for i in range(len(t)) if t.kind[i] == KERNEL)
    assert t.corr[i] == 135071 and t.stream[i] == 7 and t.ext[i] == 112


@pytest.mark.slow
def test_legacy_dialect():
    t = load_trace(KINETO)
    ev = raw(KINETO)["traceEvents"]
    assert sum(1 for k in t.kind if k == CPU_OP) == sum(1 for e in ev if e.get("cat") == "Operator")
    assert sum(1 for k in t.kind if k == MEMORY) == sum(1 for e in ev if e.get("name") == "[memory]")
    m = [i for i in range(len(t)) if t.kind[i] == MEMCPY]
    assert len(m) == 12 and t.name_of(m[0]) == "Memcpy HtoD (Pageable -> Device)" and t.nbytes[m[0]] == 19267584
    assert t.ext[m[0]] == 537  # legacy "external id"
    assert t.call_stack and t.rank_source == "file name"
    assert len(t.steps) == 6 and not t.dropped_last_step


def test_rocm_trace():
    t = load_trace(MI300)
    assert t.device_type == "rocm"
    assert t.distributed_info["world_size"] == 8
    names = {t.name_of(i) for i in range(len(t)) if t.kind[i] == RUNTIME}
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel"} <= names
    assert sum(1 for k in t.kind if k == PYFUNC) == 34405
    assert [s[0] for s in t.steps] == ["ProfilerStep#15", "ProfilerStep#16", "ProfilerStep#17"]
    # steps tile the timeline, never overlap, and cover the GPU work
    for a, b in zip(t.steps, t.steps[1:]):
        assert a[2] <= b[1] + 1e-6
    assert t.steps[-1][2] >= max(t.ts[i] + t.dur[i] for i in range(len(t)) if t.kind[i] == KERNEL) - 1


def test_folder_of_ranks_and_plain_pretty_json():
    ts = load_traces(DLRM)
    assert [t.rank for t in ts] == list(range(8))
    assert all(t.rank_source == "distributedInfo" for t in ts)
    assert ts[0].path.name.endswith(".json")  # worker0 is plain, pretty-printed


def test_rank_from_file_name_and_order(tmp_path):
    for r in (3, 1):
        shutil.copy(CPU, tmp_path / f"rank-{r}.trace.json.gz")
    assert [t.rank for t in load_traces(tmp_path)] == [1, 3]


def test_small_chunks_give_same_result(monkeypatch, tmp_path):
    plain = tmp_path / "hta.json"
    plain.write_bytes(gzip.open(HTA).read())
    ref = load_trace(plain)
    monkeypatch.setattr(loader, "CHUNK", 4096)
    monkeypatch.setattr(loader, "READ_SIZE", 1000)
    t = load_trace(plain)
    assert len(t) == len(ref) and list(t.ts) == list(ref.ts)
    assert [t.name_of(i) for i in range(len(t))] == [ref.name_of(i) for i in range(len(ref))]
    assert [t.track_of(i) for i in range(len(t))] == [ref.track_of(i) for i in range(len(ref))]
    for col in ("kind", "dur", "ext", "corr", "stream", "device", "nbytes"):
        assert getattr(t, col) == getattr(ref, col), col
    assert t.shapes == ref.shapes and t.comm == ref.comm and t.steps == ref.steps


def test_split_inside_string(monkeypatch, tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a},{\"x\"},{b" * 50, "pid": 1, "tid": "1", "ts": i, "dur": 1}
          for i in range(200)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    monkeypatch.setattr(loader, "CHUNK", 300)
    monkeypatch.setattr(loader, "READ_SIZE", 97)
    t = load_trace(p)
    assert len(t) == 200 and t.name_of(0) == ev[0]["name"] and t.step_source == "whole-run"


def test_bare_event_array(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]))
    assert len(load_trace(p)) == 1


@pytest.mark.parametrize("content, words", [
    (None, "does not exist"),
    (b"", "empty"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "truncated"),
    (b'\x1f\x8b\x08\x00garbage-garbage', "gzip"),
    (b'{"schemaVersion": 1}', "no `traceEvents`"),
    (b'{"traceEvents": 5}', "not a list"),
    (b'{"traceEvents": []}', "no profiler events"),
    (b'[1, 2]', "no profiler events"),
    (b' [ "schemaVersion": 1]', "not valid JSON"),  # a wrong type first, malformed after (msgspec types as it parses)
])
def test_bad_input(tmp_path, content, words):
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(InputError) as e:
        load_trace(p)
    assert words in e.value.message and "\n" not in e.value.message


def test_truncated_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(CPU.read_bytes()[:20000])
    with pytest.raises(InputError, match="truncated"):
        load_trace(p)


def test_empty_folder(tmp_path):
    with pytest.raises(InputError, match="no trace files"):
        load_traces(tmp_path)


@pytest.mark.slow
def test_gzip_members_and_bounded_pieces(monkeypatch, tmp_path):
    """Concatenated gzip members, decompressed in small bounded pieces, give the plain file's trace."""
    text = gzip.open(HTA).read()
    cut = len(text) // 3
    p = tmp_path / "two_members.json.gz"
    p.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    ref = load_trace(HTA)
    monkeypatch.setattr(loader, "READ_SIZE", 50_000)
    monkeypatch.setattr(loader, "GZ_READ_SIZE", 7_000)
    pieces = list(loader._pieces(p))
    assert b"".join(pieces) == text and max(map(len, pieces)) <= 50_000
    t = load_trace(p)
    assert len(t) == len(ref) and t.ts == ref.ts and t.steps == ref.steps


def test_indices_shapes_and_gc_state():
    import gc

    t = load_trace(CPU)
    assert gc.isenabled()  # the loader pauses the collector and turns it back on
    for k in (CPU_OP, PYFUNC, MEMORY):
        assert t.indices(k) == [i for i in range(len(t)) if t.kind[i] == k]
    both = t.indices(CPU_OP, PYFUNC)
    assert both == sorted(both) and len(both) == len(t.indices(CPU_OP)) + len(t.indices(PYFUNC))
    ev = [e for e in raw(CPU)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    addmm = [e for e in ev if e["name"] == "aten::addmm"]
    mine = [i for i in t.shapes if t.name_of(i) == "aten::addmm"]
    assert addmm and len(mine) == len(addmm)
    assert t.shape(mine[0])[:2] == (addmm[0]["args"]["Input type"], addmm[0]["args"]["Input Dims"])
    assert t.shape(t.indices(MEMORY)[0]) == ([], [], b"")
