"""Property test: whatever bytes it gets, the loader returns a Trace or raises InputError."""

import gzip
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdoctor.errors import InputError
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace import add_trace_facts
from perfdoctor.trace import load_trace
from perfdoctor.trace.model import Trace

SMALL = gzip.open(Path(__file__).parent / "data" / "traces" / "torch213_cpu_mlp_dataloader.pt.trace.json.gz").read()
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
