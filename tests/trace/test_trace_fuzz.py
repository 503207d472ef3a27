"""Property test: whatever bytes it gets, the loader returns a Trace or raises InputError."""

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace import add_trace_facts
from perfdoctor.trace import load_trace
from perfdoctor.trace.model import Trace
from tests.helpers import TESTS

pytestmark = pytest.mark.slow  # fuzzed traces: run by CI, not in the fast tier

SMALL = gzip.open(TESTS / "data" / "traces" / "torch213_cpu_mlp_dataloader.pt.trace.json.gz").read()
SMALL = SMALL[:20000].rsplit(b"},", 1)[0] + b"}]}"  # the first events, still a valid trace
json.loads(SMALL)
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def check(tmp_path, data: bytes) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(data)
    try:
        t = load_trace(p)
    except InputError as e:
        assert e.message and "\n" not in e.message
        return
    assert isinstance(t, Trace) and len(t) > 0
    add_trace_facts(t, Facts())


@FUZZ
@given(cut=st.integers(0, len(SMALL)), pos=st.integers(0, len(SMALL) - 1), byte=st.integers(0, 255))
def test_mutated_and_truncated(tmp_path, cut, pos, byte):
    data = bytearray(SMALL)
    data[pos] = byte
    check(tmp_path, bytes(data[:cut] if cut % 2 else data))
    check(tmp_path, gzip.compress(bytes(data))[: max(cut // 10, 1)])


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=12)
event = st.fixed_dictionaries({"ph": st.sampled_from(["X", "i", "s", 5]), "name": json_values | st.text(max_size=8),
                               "cat": st.sampled_from(["kernel", "cpu_op", "Runtime", "gpu_memcpy", "user_annotation"]),
                               "ts": json_values | st.floats(0, 1e6), "dur": json_values | st.floats(0, 1e3),
                               "pid": json_values, "tid": json_values, "args": json_values})


@FUZZ
@given(top=st.dictionaries(st.sampled_from(["traceEvents", "deviceProperties", "distributedInfo", "x"]),
                           json_values | st.lists(event, max_size=6), max_size=4))
def test_random_json(tmp_path, top):
    check(tmp_path, json.dumps(top).encode())


# -- structure-aware mutations of the real traces in tests/data ---------------------------------------

DATA = TESTS / "data" / "traces"
SOURCES = ["torch213_cpu_mlp_dataloader.pt.trace.json.gz", "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
           "tracelens__mi300__resnet_act_checkpoint.json.gz",
           "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]


def _sample(name: str, n: int = 400) -> dict:
    """The trace's top-level keys and n of its complete events from the middle (steps, python
    frames, kernels and their launches together)."""
    doc = json.loads(gzip.open(DATA / name).read())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    mid = len(xs) // 2
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"][:50] + xs[mid: mid + n]
    return doc


SAMPLES = {name: _sample(name) for name in SOURCES}
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARGS = ["External id", "correlation", "Python id", "Python parent id", "stream", "device", "bytes", "Bytes",
        "Input Dims", "Input type", "Call stack", "In msg nelems", "Collective name"]
hostile = st.one_of(st.none(), st.booleans(), st.sampled_from([0, -1, 2**63, 2**70, -(2**70), 1e308, -1e308, 1e20]),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                    st.sampled_from(["12", "", "/dev/zero(22): <module>", "threading.py(1): run", "ProfilerStep#3",
                                     "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "step 1" + "1" * 5000 + "x",
                                     "x" * 70_000]),
                    st.just([]), st.just({}), st.just([[[[[]]]]]))
mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FIELDS), hostile),
    st.tuples(st.just("arg"), st.sampled_from(ARGS), hostile),
    st.tuples(st.just("del"), st.sampled_from(FIELDS), st.none()),
    st.tuples(st.just("self-parent"), st.none(), st.none()),
    st.tuples(st.just("dup"), st.none(), st.none()),
    st.tuples(st.just("drop"), st.none(), st.none()),
)


def mutate(doc: dict, muts: list, where: list[int]) -> dict:
    doc = json.loads(json.dumps(doc))  # a copy
    events = doc["traceEvents"]
    for (op, key, value), w in zip(muts, where):
        i = w % len(events)
        e = events[i]
        if not isinstance(e, dict):
            continue
        if op == "set":
            e[key] = value
        elif op == "arg":
            if not isinstance(e.get("args"), dict):
                e["args"] = {}
            e["args"][key] = value
        elif op == "del":
            e.pop(key, None)
        elif op == "self-parent":  # a python event that is its own parent, or parent of its parent
            e.update(cat="python_function", args={"Python id": 7, "Python parent id": 7 if w % 2 else 8})
            events.append({**e, "args": {"Python id": 8, "Python parent id": 7}})
        elif op == "dup":
            events.insert(i, json.loads(json.dumps(e)))
        elif op == "drop":
            del events[i]
            if not events:
                events.append({"ph": "X"})
    return doc


def analyse(tmp_path, data: bytes, name: str = "t.json") -> None:
    """The whole report pipeline: a Report, or one InputError / RuleError line."""
    from perfdoctor.analysis import analyse_trace
    from perfdoctor.errors import PerfdoctorError

    p = tmp_path / name
    p.write_bytes(data)
    try:
        report = analyse_trace(p)
    except PerfdoctorError as e:
        assert e.message and "\n" not in e.message
        return
    assert report.summary is not None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(source=st.sampled_from(SOURCES), muts=st.lists(mutation, min_size=1, max_size=12),
       where=st.lists(st.integers(0, 10**6), min_size=12, max_size=12), gz=st.booleans())
def test_structure_aware_mutations_of_real_traces(tmp_path, monkeypatch, source, muts, where, gz):
    monkeypatch.chdir(tmp_path)  # the project: no config, no sources
    data = json.dumps(mutate(SAMPLES[source], muts, where)).encode()
    analyse(tmp_path, gzip.compress(data, 1) if gz else data, "t.json.gz" if gz else "t.json")
