"""Load torch.profiler Chrome traces (every dialect) into the compact `Trace` model, fast.

The bytes are streamed (zlib for gzip, chunked reads for plain JSON); the `traceEvents` array is
cut into chunks at event boundaries (`}` `,` `{`) and each chunk is decoded by msgspec into
structs that declare only the fields analysis keeps (msgspec skips the rest in C). A cut that
falls inside a string does not decode and is simply extended with the next bytes. Whatever is
before the array (and the last chunk with whatever follows it) is decoded as one small JSON
object, which also yields `deviceProperties` and `distributedInfo`.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Iterator

import msgspec

from perfdoctor.errors import InputError
from perfdoctor.trace.model import (CATEGORY_KIND, CPU_OP, MEMORY, PYFUNC, USER_ANN, Trace)
from perfdoctor.trace.steps import find_steps

READ_SIZE = 4 << 20  # bytes per read of a plain file
GZ_READ_SIZE = 1 << 20  # compressed bytes per read of a gzip file
CHUNK = 8 << 20  # decode the events array in pieces of about this many bytes

_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_RANK_IN_NAME = re.compile(r"(?:worker|rank)[-_]?(\d+)", re.IGNORECASE)
_META_KEYS = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "roctracer_version",
              "record_shapes", "with_stack", "profile_memory", "traceName")
# cpu ops / annotations whose input types and shapes facts need (matmuls, convs, collectives)
_SHAPE_WORDS = ("mm", "matmul", "linear", "conv", "einsum", "nccl", "c10d", "gloo", "record_param_comms",
                "all_reduce", "allreduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


class Args(msgspec.Struct, gc=False):
    ext: int | None = msgspec.field(default=None, name="External id")
    ext_legacy: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    stream: int | None = None
    device: int | None = None
    bytes: Any = None  # an int, or a string on ROCm runtime calls
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    input_type: Any = msgspec.field(default=None, name="Input type")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    py_id: int | None = msgspec.field(default=None, name="Python id")
    py_parent: int | None = msgspec.field(default=None, name="Python parent id")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")


class Ev(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Args | None = None


class Top(msgspec.Struct, gc=False):
    traceEvents: list[Ev] | None = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    roctracer_version: Any = None
    record_shapes: Any = None
    with_stack: Any = None
    profile_memory: Any = None
    traceName: Any = None


_events_decoder = msgspec.json.Decoder(list[Ev])
_top_decoder = msgspec.json.Decoder(Top)
_any_decoder = msgspec.json.Decoder()


class _Builder:
    """Appends decoded events to the trace's columns, interning strings."""

    def __init__(self, trace: Trace):
        self.t = trace
        self.sidx: dict[str, int] = {}
        self.tracks: dict[tuple, int] = {}
        self.catkind: dict[str, int] = {}
        self.want_shape: dict[int, bool] = {}
        self.skipped = 0

    def intern(self, s: str) -> int:
        i = self.sidx.get(s)
        if i is None:
            i = self.sidx[s] = len(self.t.strings)
            self.t.strings.append(s)
        return i

    def add(self, events: list[Ev]) -> None:
        t = self.t
        catkind, sidx, tracks, intern = self.catkind, self.sidx, self.tracks, self.intern
        a_kind, a_name, a_ts, a_dur, a_track = t.kind.append, t.name.append, t.ts.append, t.dur.append, t.track.append
        a_ext, a_corr, a_stream, a_dev, a_bytes = (t.ext.append, t.corr.append, t.stream.append,
                                                   t.device.append, t.nbytes.append)
        for e in events:
            ph = e.ph
            if ph == "X":
                k = catkind.get(e.cat)
                if k is None:
                    k = catkind[e.cat] = CATEGORY_KIND.get(e.cat.lower(), -1)
                if k < 0 or k == MEMORY:
                    continue
            elif ph == "i" and e.name == "[memory]":
                k = MEMORY
            else:
                continue
            name = e.name
            ni = sidx.get(name)
            if ni is None:
                ni = intern(name)
            tk = (e.pid, e.tid)
            ti = tracks.get(tk)
            if ti is None:
                ti = tracks[tk] = intern(f"{e.pid}/{e.tid}")
            idx = len(t.kind)
            a_kind(k)
            a_name(ni)
            a_ts(e.ts)
            a_dur(e.dur if e.dur > 0 else 0.0)
            a_track(ti)
            a = e.args
            if a is None:
                a_ext(-1), a_corr(-1), a_stream(-1), a_dev(-1), a_bytes(0)
                continue
            if k == PYFUNC:
                a_ext(-1 if a.py_id is None else a.py_id)
                a_corr(-1 if a.py_parent is None else a.py_parent)
            else:
                ext = a.ext if a.ext is not None else a.ext_legacy
                a_ext(-1 if ext is None else ext)
                a_corr(-1 if a.correlation is None else a.correlation)
            a_stream(-1 if a.stream is None else a.stream)
            a_dev(-1 if a.device is None else a.device)
            b = a.bytes if a.bytes is not None else a.mem_bytes
            a_bytes(b if type(b) is int else _as_int(b))
            if k == CPU_OP or k == USER_ANN:
                if a.call_stack:
                    t.call_stack[idx] = intern(a.call_stack)
                want = self.want_shape.get(ni)
                if want is None:
                    low = name.lower()
                    want = self.want_shape[ni] = any(w in low for w in _SHAPE_WORDS)
                if want:
                    if isinstance(a.input_type, list):
                        t.shapes[idx] = (a.input_type, a.input_dims if isinstance(a.input_dims, list) else [])
                    if a.in_nelems is not None or a.collective is not None:
                        t.comm[idx] = {"in_nelems": a.in_nelems, "out_nelems": a.out_nelems,
                                       "dtype": a.dtype, "collective": a.collective}

    def add_lenient(self, raw: Any) -> None:
        """Events that msgspec could not type in bulk: convert one by one, skip the bad ones."""
        if not isinstance(raw, list):
            raise InputError(f"{self.t.path}: `traceEvents` is not a list; this is not a torch.profiler trace")
        good = []
        for e in raw:
            try:
                good.append(msgspec.convert(e, Ev))
            except msgspec.ValidationError:
                self.skipped += 1
        self.add(good)


def _as_int(v: Any) -> int:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else 0
    except (TypeError, ValueError, OverflowError):
        return 0


def _pieces(path: Path) -> Iterator[bytes]:
    """The file's bytes, decompressed if it is gzip (by magic number, not by name)."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; use load_traces for a folder of per-rank traces") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}; check the path and its permissions") from None
    with f:
        first = f.read(GZ_READ_SIZE)
        if first[:2] != b"\x1f\x8b":
            data = first
            while data:
                yield data
                data = f.read(READ_SIZE)
            return
        d = zlib.decompressobj(47)
        data = first
        try:
            while data:
                out = d.decompress(data)
                while d.eof and d.unused_data:  # concatenated gzip members
                    yield out
                    rest, d = d.unused_data, zlib.decompressobj(47)
                    out = d.decompress(rest)
                yield out
                data = f.read(GZ_READ_SIZE)
            yield d.flush()
        except zlib.error as e:
            raise InputError(f"{path}: corrupt gzip data ({e}); re-export or re-download the trace") from None
        if not d.eof:
            raise InputError(f"{path}: the gzip file is truncated; re-export or re-download the trace")


def load_trace(path: Path | str) -> Trace:
    """Load one trace file (.json or .json.gz, any torch.profiler dialect). Raises InputError."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path} does not exist; give the path of a torch.profiler trace (.json or .json.gz)")
    trace = Trace(path=path)
    b = _Builder(trace)
    head = bytearray()  # bytes before the events array (then: the object's head up to `traceEvents:`)
    buf: bytearray | None = None  # the events array so far, always starting with "["
    next_try = CHUNK
    for piece in _pieces(path):
        if buf is None:
            head += piece
            m = _ARRAY_START.search(head)
            if m is None:
                continue
            buf = bytearray(head[m.end() - 1:])
            del head[m.end() - 1:]
        else:
            buf += piece
        if len(buf) < next_try:
            continue
        c = _last_split(buf)
        if c <= 0:
            next_try = len(buf) + CHUNK
            continue
        buf[c] = 0x5D  # "]": close the array after the last whole event
        try:
            events = _events_decoder.decode(memoryview(buf)[: c + 1])
        except msgspec.ValidationError:
            events = None
            b.add_lenient(_try_any(buf, c + 1))
        except (msgspec.DecodeError, UnicodeDecodeError):  # the cut fell inside a string: extend with the next bytes
            buf[c] = 0x2C
            next_try = len(buf) + CHUNK
            continue
        if events is not None:
            b.add(events)
            del events
        del buf[:c]
        buf[0] = 0x5B  # "["
        next_try = CHUNK
    _finish(trace, b, head, buf)
    return trace


def _try_any(buf: bytearray, end: int) -> Any:
    try:
        return _any_decoder.decode(memoryview(buf)[:end])
    except (msgspec.DecodeError, UnicodeDecodeError):
        return []


def _last_split(buf: bytearray) -> int:
    """Index of the last `,` that separates two events (`}` ws `,` ws `{`), or -1."""
    end = len(buf)
    while True:
        p = buf.rfind(b"}", 0, end)
        if p < 0:
            return -1
        q = p + 1
        n = len(buf)
        while q < n and buf[q] in b" \t\r\n":
            q += 1
        if q < n and buf[q] == 0x2C:
            r = q + 1
            while r < n and buf[r] in b" \t\r\n":
                r += 1
            if r < n and buf[r] == 0x7B:
                return q
        end = p


def _finish(trace: Trace, b: _Builder, head: bytearray, buf: bytearray | None) -> None:
    path = trace.path
    if buf is None:  # no "traceEvents": [ found
        text = bytes(head).strip()
        if not text:
            raise InputError(f"{path} is empty; give a torch.profiler trace (.json or .json.gz)")
        if text[:1] == b"[":  # a bare Chrome-trace event array
            doc = text
            top = None
        else:
            doc = text
            top = True
    else:
        doc = bytes(head) + bytes(buf)
        top = True
    del buf
    if top:
        try:
            t = _top_decoder.decode(doc)
        except msgspec.ValidationError:
            t = _lenient_top(path, doc, b)
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not valid JSON ({_short(e)}); the file is truncated or not a trace") from None
        if t.traceEvents is None and not len(trace.kind):
            raise InputError(f"{path} has no `traceEvents`: it is not a torch.profiler Chrome trace")
        b.add(t.traceEvents or [])
        if isinstance(t.deviceProperties, list):
            trace.device_properties = [p for p in t.deviceProperties if isinstance(p, dict)]
        if isinstance(t.distributedInfo, dict):
            trace.distributed_info = t.distributedInfo
        trace.meta = {k: getattr(t, k) for k in _META_KEYS if getattr(t, k) is not None}
    else:
        try:
            b.add(_events_decoder.decode(doc))
        except msgspec.ValidationError:
            b.add_lenient(_any_decoder.decode(doc))
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not valid JSON ({_short(e)}); the file is truncated or not a trace") from None
    if not len(trace.kind):
        raise InputError(f"{path} contains no profiler events; profile at least one step and export again")
    rank = trace.distributed_info.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        trace.rank, trace.rank_source = rank, "distributedInfo"
    else:
        m = _RANK_IN_NAME.search(path.name)
        if m:
            trace.rank, trace.rank_source = int(m.group(1)), "file name"
    find_steps(trace)


def _lenient_top(path: Path, doc: bytes, b: _Builder) -> Top:
    """The document is JSON but some values have unexpected types: keep what can be read."""
    try:
        raw = _any_decoder.decode(doc)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({_short(e)}); the file is truncated or not a trace") from None
    if not isinstance(raw, dict) or "traceEvents" not in raw:
        raise InputError(f"{path} has no `traceEvents`: it is not a torch.profiler Chrome trace")
    b.add_lenient(raw["traceEvents"])
    fields = {k: raw.get(k) for k in Top.__struct_fields__ if k != "traceEvents"}
    return Top(traceEvents=[], **fields)


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:120]


def load_traces(path: Path | str) -> list[Trace]:
    """A trace file, or a folder of per-rank trace files (one distributed run), sorted by rank."""
    path = Path(path)
    if not path.is_dir():
        return [load_trace(path)]
    files = sorted(p for p in path.iterdir() if p.is_file() and
                   (p.name.endswith(".json") or p.name.endswith(".json.gz")))
    if not files:
        raise InputError(f"{path} holds no trace files (*.json, *.json.gz); point at a trace or a folder of them")
    traces = [load_trace(p) for p in files]
    if any(t.rank_source == "order" for t in traces) or len({t.rank for t in traces}) != len(traces):
        for i, t in enumerate(traces):  # ranks unknown or clashing: number them by file order
            t.rank, t.rank_source = i, "order"
    return sorted(traces, key=lambda t: t.rank)
