"""Load torch.profiler Chrome traces (every dialect) into the compact `Trace` model, fast.

The bytes are streamed (zlib for gzip, chunked reads for plain JSON); the `traceEvents` array is
cut into chunks at event boundaries (`}` `,` `{`) and each chunk is decoded by msgspec into
structs that declare only the fields analysis keeps (msgspec skips the rest in C). A cut that
falls inside a string does not decode and is simply extended with the next bytes. Whatever is
before the array (and the last chunk with whatever follows it) is decoded as one small JSON
object, which also yields `deviceProperties` and `distributedInfo`.

Limits (a trace may come from anywhere; each keeps time and memory proportional to the file):
- `MAX_HEAD`: the bytes before `"traceEvents": [` (torch.profiler writes a few KB there);
- `MAX_EVENT_BYTES`: one event's JSON;
- `MAX_STRING`: a name, track or call stack longer than this is cut to it (counted as repaired);
- `MAX_EXPANSION`: a gzip file expands at most this many times (real traces: 10-30x), with a floor
  of `MIN_EXPANDED` bytes;
- `EVENTS_PER_MB`: events per MB of the file on disk (real traces: 4,000-70,000), with a floor of
  `MIN_EVENTS`;
- JSON nesting: as deep as msgspec decodes within the interpreter's recursion limit (about 900).
Going past a limit is an InputError (exit 2) naming the file and the limit, except `MAX_STRING`.
Events that cannot be used (no timestamp, no name, no duration on a complete event, wrong-typed
fields, times beyond `MAX_TIME`) are dropped, and odd values (negative durations, ids beyond
64 bits) repaired; both are counted by reason in `Trace.dropped`. So are the repairs of text that is
not JSON (`_repair`: NaN / Infinity literals read as null, bytes that are not UTF-8 and lone
surrogate escapes as U+FFFD), and the steps longer than a day
(`MAX_STEP_US`), left out: one odd value costs its event, never the whole trace.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from array import array
from collections.abc import Iterator
from itertools import compress
from pathlib import Path
from struct import error as StructError
from struct import pack
from typing import Any, cast

import msgspec

from perfdoctor.contracts.files import TOO_DEEP
from perfdoctor.errors import InputError
from perfdoctor.trace.model import CATEGORY_KIND, CPU_OP, MEMORY, PYFUNC, USER_ANN, Trace, gc_paused
from perfdoctor.trace.steps import find_steps

READ_SIZE = 4 << 20  # bytes per read of a plain file
GZ_READ_SIZE = 1 << 20  # compressed bytes per read of a gzip file
CHUNK = 8 << 20  # decode the events array in pieces of about this many bytes
MAX_HEAD = 64 << 20  # bytes before the events array
MAX_EVENT_BYTES = 64 << 20  # one event
MAX_STRING = 64 << 10  # characters of one name, track or call stack (longer ones are cut)
MAX_EXPANSION = 200  # decompressed bytes per byte of a gzip file...
MIN_EXPANDED = 256 << 20  # ...or this many, whichever is more
EVENTS_PER_MB = 1_000_000  # events per MB of the file on disk...
MIN_EVENTS = 2_000_000  # ...or this many, whichever is more
MAX_STEP_US = 86_400e6  # a step longer than a day (µs) is no training step: the trace's times are suspect
MAX_TIME = 1e20  # |ts| and dur (µs; ns in some dialects): beyond is not a time, and sums of it stay finite

_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_RANK_IN_NAME = re.compile(r"(?:worker|rank)[-_]?(\d+)", re.IGNORECASE)
_META_KEYS = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "roctracer_version",
              "record_shapes", "with_stack", "profile_memory", "traceName")
# cpu ops / annotations whose input types and shapes facts need (matmuls, convs, collectives)
_SHAPE_WORDS = ("mm", "matmul", "linear", "conv", "einsum", "nccl", "c10d", "gloo", "record_param_comms",
                "all_reduce", "allreduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


class Args(msgspec.Struct, gc=False):
    # ids default to -1 (absent); an explicit JSON null decodes to None and becomes -1 in the column
    ext: int | None = msgspec.field(default=-1, name="External id")
    ext_legacy: int | None = msgspec.field(default=-1, name="external id")
    correlation: int | None = -1
    stream: int | None = -1
    device: int | None = -1
    bytes: Any = None  # an int, or a string on ROCm runtime calls
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    # kept as raw JSON (no lists built per op); copied out for the few ops whose shapes facts need
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_strides: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Strides")
    py_id: int | None = msgspec.field(default=-1, name="Python id")
    py_parent: int | None = msgspec.field(default=-1, name="Python parent id")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    seq: int | None = msgspec.field(default=-1, name="Sequence number")  # autograd's: a forward op and its backward
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    # a "[memory]" event's (profile_memory): the block's address, the allocator's total after it, its device type
    addr: int | None = msgspec.field(default=-1, name="Addr")
    total: int | None = msgspec.field(default=-1, name="Total Allocated")
    dev_type: int | None = msgspec.field(default=-1, name="Device Type")


class Ev(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str | None = None  # None: absent (the event is dropped)
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
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
_one_decoder = msgspec.json.Decoder(Ev)
_top_decoder = msgspec.json.Decoder(Top)
_any_decoder = msgspec.json.Decoder()


class _Interner(dict):
    """str -> index into `strings`, adding unseen strings on lookup. A string over MAX_STRING is
    stored cut to it (and never kept whole as a key); `cut` counts them."""

    def __init__(self, strings: list[str]):
        super().__init__()
        self.strings = strings
        self.cut = 0

    def __missing__(self, s: str) -> int:
        if len(s) > MAX_STRING:
            self.cut += 1
            return self[s[:MAX_STRING]]
        i = self[s] = len(self.strings)
        self.strings.append(s)
        return i


class _Lazy(dict):
    """A dict that computes a missing value with `fn(key)` once."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __missing__(self, key):
        v = self[key] = self.fn(key)
        return v


def _kind_of(cat: str) -> int:
    """The kind of a complete ("X") event of this category, -1 to drop it."""
    k = CATEGORY_KIND.get(cat.lower(), -1)
    return -1 if k == MEMORY else k


_NO_ARGS = Args()
_UNUSABLE = -2  # the kind of an event analysis would use but cannot (see _Builder.add)
_KEPT = (-1).__lt__  # kind >= 0, tested in C


def _column(typecode: str, values: list) -> array:
    """An array of these values (which must fit), packed by struct: array(typecode, values) parses
    each item as a function argument, several times slower."""
    return array(typecode, pack(f"{len(values)}{typecode}", *values))


def _extend(col: array, values: list, default: int = -1) -> int:
    """Append a chunk's values to a column; a null (None) or an out-of-range number becomes `default`.
    Returns how many out-of-range numbers were replaced."""
    try:
        col += _column(col.typecode, values)
        return 0
    except (StructError, TypeError, OverflowError):
        pass
    lim = 1 << (8 * col.itemsize - 1)
    col += array(col.typecode, [v if type(v) is int and -lim <= v < lim else default for v in values])
    return sum(1 for v in values if v is not None and not (type(v) is int and -lim <= v < lim))


class _Builder:
    """Appends decoded events to the trace's columns, interning strings. Works a chunk at a time:
    one pass gives each event its kind (or marks it unused or unusable), one comprehension per
    column reads the kept events' fields, and struct packs the columns."""

    def __init__(self, trace: Trace):
        self.t = trace
        self.sidx = _Interner(trace.strings)
        self.tracks = _Lazy(lambda tk: self.sidx[f"{tk[0]}/{tk[1]}"])
        self.kinds = _Lazy(_kind_of)
        self.want_shape = _Lazy(lambda ni: any(w in trace.strings[ni].lower() for w in _SHAPE_WORDS))
        self.dropped = trace.dropped
        self.seen = 0  # events decoded, kept or not (EVENTS_PER_MB)

    def count(self, why: str, n: int = 1) -> None:
        if n:
            self.dropped[why] = self.dropped.get(why, 0) + n

    def add(self, events: list[Ev]) -> None:
        t, kinds_of = self.t, self.kinds
        self.seen += len(events)
        # each event's kind: complete events of known categories, and "[memory]" instant events, where
        # usable (a name, a timestamp, and a duration on a complete event, all within MAX_TIME);
        # UNUSABLE where not, -1 for the events analysis never uses. The one per-event pass in Python.
        ks = [(k if e.name is not None and (ts := e.ts) is not None and -MAX_TIME < ts < MAX_TIME
               and (k == MEMORY or (d := e.dur) is not None and d < MAX_TIME) else _UNUSABLE)
              if (k := kinds_of[e.cat] if e.ph == "X" else MEMORY if e.ph == "i" and e.name == "[memory]" else -1) >= 0
              else -1 for e in events]
        if _UNUSABLE in ks:
            self._count_unusable(events, ks)
        ok = list(map(_KEPT, ks))  # selectors for compress: the kept events and their kinds, in C
        keep = list(compress(events, ok))
        if not keep:
            return
        # one comprehension per column (attribute reads specialise there: cheaper than attrgetter),
        # the columns packed by struct (cheaper than array's per-item argument parsing); the rare
        # repairs only where a chunk needs them
        kcol = list(compress(ks, ok))
        base = len(t.kind)
        sidx = self.sidx
        cut = sidx.cut
        names = list(map(sidx.__getitem__, [e.name for e in keep]))  # never None: checked above
        t.kind += _column("b", kcol)
        t.name += _column("i", names)
        t.ts += _column("d", [e.ts for e in keep])  # never None: checked above
        given = [e.dur for e in keep]  # None only on memory events, which need none
        durs = [0.0 if d is None else d for d in given] if None in given else cast("list[float]", given)
        del given
        if min(durs) < 0:
            self.count("with a negative duration set to 0", sum(1 for d in durs if d < 0))
            durs = [d if d > 0 else 0.0 for d in durs]
        t.dur += _column("d", durs)
        del durs
        tracks = self.tracks
        t.track += _column("i", [tracks[e.pid, e.tid] for e in keep])
        args = [e.args or _NO_ARGS for e in keep]
        # python_function events carry their own id and their parent's in place of External id/correlation
        ext = [a.ext for a in args]
        if -1 in ext:  # the legacy key, where the current one is absent
            ext = [x if x != -1 else a.ext_legacy for x, a in zip(ext, args)]
        corr = [a.correlation for a in args]
        if PYFUNC in kcol:
            for j in [j for j, k in enumerate(kcol) if k == PYFUNC]:
                ext[j], corr[j] = args[j].py_id, args[j].py_parent
        stream = [a.stream for a in args]
        if MEMORY in kcol:  # memory events: the block's address, the allocator's total, the device type
            for j in [j for j, k in enumerate(kcol) if k == MEMORY]:
                ext[j], corr[j], stream[j] = args[j].addr, args[j].total, args[j].dev_type
        odd = _extend(t.ext, ext)
        odd += _extend(t.corr, corr)
        del ext, corr
        odd += _extend(t.stream, stream)
        odd += _extend(t.device, [a.device for a in args])
        odd += _extend(t.nbytes, [b if type(b := a.bytes) is int else _as_int(b) if b is not None else  # "bytes",
                                  m if type(m := a.mem_bytes) is int else 0 if m is None else _as_int(m)  # else "Bytes"
                                  for a in args], 0)
        self.count("with an id or size beyond 64 bits ignored", odd)
        # the sparse columns: operators' and annotations' call stacks and, for the few whose names
        # facts look at (matmuls, convs, collectives), input types and shapes and message sizes
        ops = [j for j, k in enumerate(kcol) if k == CPU_OP or k == USER_ANN]
        for j, s in zip(ops, [args[j].call_stack for j in ops]):
            if s:
                t.call_stack[base + j] = sidx[s]
        for j in ops:
            q = args[j].seq
            if q is not None and q >= 0:
                t.seq[base + j] = q
        want = self.want_shape
        for j in [j for j in ops if want[names[j]] and args[j] is not _NO_ARGS]:
            a = args[j]
            if len(a.input_type) + len(a.input_dims) + len(a.input_strides) <= MAX_STRING:
                types = bytes(a.input_type)
                if types[:1] == b"[":
                    t.shapes[base + j] = (types, bytes(a.input_dims), bytes(a.input_strides))
                if a.in_nelems is not None or a.collective is not None:
                    t.comm[base + j] = {"in_nelems": a.in_nelems, "out_nelems": a.out_nelems,
                                        "dtype": a.dtype[:MAX_STRING] if a.dtype else a.dtype,
                                        "collective": a.collective[:MAX_STRING] if a.collective else a.collective}
        self.count("with a string over 64 KB cut", sidx.cut - cut)

    def _count_unusable(self, events: list[Ev], ks: list[int]) -> None:
        for e, k in zip(events, ks):
            if k != _UNUSABLE:
                continue
            if e.name is None:
                self.count("without a name")
            elif e.ts is None:
                self.count("without a timestamp")
            elif e.ph == "X" and e.dur is None:
                self.count("without a duration")
            elif not -MAX_TIME < e.ts < MAX_TIME or e.dur is not None and e.dur >= MAX_TIME:
                self.count("with a time beyond 1e20")

    def add_lenient(self, raw: Any) -> None:
        """Events that msgspec could not type in bulk: convert one by one, skip the bad ones."""
        if not isinstance(raw, list):
            raise InputError(f"{self.t.path}: `traceEvents` is not a list; this is not a torch.profiler trace")
        good = []
        for e in raw:
            try:  # through JSON again, as `Raw` fields only decode from JSON
                good.append(_one_decoder.decode(msgspec.json.encode(e)))
            except (msgspec.ValidationError, msgspec.DecodeError):
                self.seen += 1
                if isinstance(e, dict) and (e.get("ph") == "X" and _kind_of(str(e.get("cat", ""))) >= 0
                                            or e.get("ph") == "i" and e.get("name") == "[memory]"):
                    self.count("with wrong-typed fields")  # an event analysis would have used
        self.add(good)


def _as_int(v: Any) -> int:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else 0
    except (TypeError, ValueError, OverflowError):
        return 0


def _pieces(path: Path) -> Iterator[bytes]:
    """The file's bytes, decompressed if it is gzip (by magic number, not by name), at most
    MAX_EXPANSION times the file's size (or MIN_EXPANDED bytes) out of a gzip file."""
    try:  # without blocking: a FIFO named as the trace must not hang (it is refused below)
        f = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; use load_traces for a folder of per-rank traces") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}; check the path and its permissions") from None
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputError(f"{path}: not a regular file; give a torch.profiler trace (.json or .json.gz)")
        first = f.read(GZ_READ_SIZE)
        if first[:2] != b"\x1f\x8b":
            data = first
            while data:
                yield data
                data = f.read(READ_SIZE)
            return
        budget = max(MIN_EXPANDED, MAX_EXPANSION * os.fstat(f.fileno()).st_size)
        d = zlib.decompressobj(47)
        data = first
        try:
            while True:
                if not data:
                    data = f.read(GZ_READ_SIZE)
                    if not data:
                        break
                if d.eof:  # another gzip member follows (concatenated members)
                    d = zlib.decompressobj(47)
                # at most READ_SIZE out per call: traces compress ~30x, and pieces that big would
                # make the events decoded at once (and the memory they take) as big
                out = d.decompress(data, READ_SIZE)
                data = d.unconsumed_tail or d.unused_data
                budget -= len(out)
                if budget < 0:
                    raise InputError(f"{path}: the gzip data expands more than {MAX_EXPANSION} times (a trace "
                                     f"compresses 10-30 times); not a torch.profiler trace")
                yield out
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
    with gc_paused():
        try:
            return _load(path)
        except RecursionError:
            raise InputError(f"{path}: {TOO_DEEP}") from None


def _load(path: Path) -> Trace:
    trace = Trace(path=path)
    b = _Builder(trace)
    try:
        max_events = max(MIN_EVENTS, EVENTS_PER_MB * path.stat().st_size // (1 << 20))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    head = bytearray()  # bytes before the events array (then: the object's head up to `traceEvents:`)
    buf: bytearray | None = None  # the events array so far, always starting with "["
    next_try = CHUNK
    for piece in _pieces(path):
        if buf is None:
            searched = max(0, len(head) - 4096)  # search the new bytes (the key may straddle two pieces)
            head += piece
            start = head.lstrip()[:1]
            if start == b"[":  # a bare Chrome-trace event array: streamed like the object's array
                buf = bytearray(head.lstrip())
                head.clear()
            else:
                m = _ARRAY_START.search(head, searched)
                if m is None:
                    if len(head) > MAX_HEAD:
                        raise InputError(f"{path}: no `traceEvents` array in its first {MAX_HEAD >> 20} MB; "
                                         "it is not a torch.profiler Chrome trace")
                    continue
                buf = bytearray(head[m.end() - 1:])
                del head[m.end() - 1:]
        else:
            buf += piece
        if len(buf) < next_try:
            continue
        c = _last_split(buf)
        if c <= 0:
            if len(buf) > MAX_EVENT_BYTES + CHUNK:
                raise InputError(f"{path}: an event over {MAX_EVENT_BYTES >> 20} MB; not a torch.profiler trace")
            next_try = len(buf) + CHUNK
            continue
        buf[c] = 0x5D  # "]": close the array after the last whole event
        try:
            events = _decode(_events_decoder, memoryview(buf)[: c + 1], b)
        except msgspec.ValidationError:
            events = None
            b.add_lenient(_try_any(buf, c + 1, b))
        except (msgspec.DecodeError, UnicodeDecodeError):  # the cut fell inside a string: extend with the next bytes
            buf[c] = 0x2C
            if len(buf) > MAX_EVENT_BYTES + CHUNK:
                raise InputError(f"{path}: an event over {MAX_EVENT_BYTES >> 20} MB, or JSON that does not "
                                 "decode; not a torch.profiler trace") from None
            next_try = len(buf) + CHUNK
            continue
        if events is not None:
            b.add(events)
            del events
        if b.seen > max_events:
            raise _too_many(path, max_events)
        del buf[:c]
        buf[0] = 0x5B  # "["
        next_try = CHUNK
    _finish(trace, b, head, buf)
    if b.seen > max_events:
        raise _too_many(path, max_events)
    return trace


# what a Python json.dump or a stray byte leaves in an otherwise good trace: NaN / Infinity literals
# (not JSON), lone UTF-16 surrogate escapes and bytes that are not UTF-8 (a Latin-1 name)
_NAN = re.compile(rb"(?<=[:\[,])(\s*)-?(?:NaN|Infinity)\b")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
REPAIRED = "repaired: not JSON (NaN or Infinity as null, text that is not UTF-8 as U+FFFD)"


def _repair(data: bytes) -> bytes:
    """`data` with NaN and Infinity literals as null, lone surrogate escapes and bytes that are not
    UTF-8 as U+FFFD; the same bytes where there was nothing to repair. (A surrogate pair, valid JSON,
    in a chunk that needs repair for another reason becomes two U+FFFD: rare, and only a name.)"""
    out = _NAN.sub(rb"\1null", data)
    out = _SURROGATE.sub(rb"\\ufffd", out)
    return out.decode("utf-8", "replace").encode("utf-8")


def _decode(decoder: Any, data: bytes | memoryview, b: _Builder) -> Any:
    """`decoder.decode(data)`; where that is not JSON, the repaired bytes (`_repair`, counted as such).
    The first error is raised where repairing changes nothing or does not help."""
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        fixed = _repair(bytes(data))
        if fixed == bytes(data):
            raise
        try:
            out = decoder.decode(fixed)
        except (msgspec.DecodeError, UnicodeDecodeError):
            pass
        else:
            b.count(REPAIRED)
            return out
        raise


def _too_many(path: Path, n: int) -> InputError:
    return InputError(f"{path}: more than {n} events, over {EVENTS_PER_MB} per MB of the file "
                      "(real traces hold under 100,000 per MB); not a torch.profiler trace")


def _try_any(buf: bytearray, end: int, b: _Builder) -> Any:
    try:
        return _decode(_any_decoder, memoryview(buf)[:end], b)
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
        doc = bytes(head).strip()
        if not doc:
            raise InputError(f"{path} is empty; give a torch.profiler trace (.json or .json.gz)")
        top = True
    else:  # the events array, after the object's head; or a bare Chrome-trace event array (no head)
        top = bool(head.strip())
        doc = bytes(head) + bytes(buf)
    del buf
    if top:
        try:
            t = _decode(_top_decoder, doc, b)
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
            try:
                events = _decode(_events_decoder, doc, b)
            except msgspec.ValidationError:  # msgspec types as it parses: the JSON may still be malformed later on
                b.add_lenient(_decode(_any_decoder, doc, b))
            else:
                b.add(events)
        except (msgspec.DecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not valid JSON ({_short(e)}); the file is truncated or not a trace") from None
    if not len(trace.kind):
        if b.dropped:  # every event was unusable: say why, not that there were none
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(b.dropped.items(), key=lambda x: -x[1])[:3])
            raise InputError(f"{path}: none of its events can be used ({why}); it is not a torch.profiler trace "
                             "as torch writes it (times are numbers, every event has a name)")
        raise InputError(f"{path} contains no profiler events; profile at least one step and export again")
    rank = trace.distributed_info.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        trace.rank, trace.rank_source = rank, "distributedInfo"
    else:
        m = _RANK_IN_NAME.search(path.name)
        if m:
            trace.rank, trace.rank_source = int(m.group(1)), "file name"
    find_steps(trace)
    keep = [end - start <= MAX_STEP_US for _, start, end in trace.steps]
    if not all(keep):  # no training step: left out of the step times, and said
        b.count("implausible: steps longer than a day left out (times in another unit than µs, or broken)",
                keep.count(False))
        if len(trace.cpu_steps) == len(keep):
            trace.cpu_steps = list(compress(trace.cpu_steps, keep))
        trace.steps = list(compress(trace.steps, keep))


def _lenient_top(path: Path, doc: bytes, b: _Builder) -> Top:
    """The document is JSON but some values have unexpected types: keep what can be read."""
    try:
        raw = _decode(_any_decoder, doc, b)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({_short(e)}); the file is truncated or not a trace") from None
    if not isinstance(raw, dict) or "traceEvents" not in raw:
        raise InputError(f"{path} has no `traceEvents`: it is not a torch.profiler Chrome trace")
    b.add_lenient(raw["traceEvents"])
    fields = {k: raw.get(k) for k in Top.__struct_fields__ if k != "traceEvents"}
    return Top(traceEvents=[], **fields)


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:120]


def trace_files(path: Path | str) -> list[Path]:
    """The trace files `path` names: itself, or a folder's per-rank trace files (*.json, *.json.gz)
    sorted by name. Raises InputError for a folder without any."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and
                   (p.name.endswith(".json") or p.name.endswith(".json.gz")))
    if not files:
        raise InputError(f"{path} holds no trace files (*.json, *.json.gz); point at a trace or a folder of them")
    return files


def settle_ranks(found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The (rank, rank_source) of each trace of one run, given what each file said on its own (in
    file order): kept where every file named its rank and no two clash, else numbered by file order."""
    if any(src == "order" for _, src in found) or len({r for r, _ in found}) != len(found):
        return [(i, "order") for i in range(len(found))]
    return found


def load_traces(path: Path | str) -> list[Trace]:
    """A trace file, or a folder of per-rank trace files (one distributed run), sorted by rank."""
    traces = [load_trace(p) for p in trace_files(path)]
    for t, (rank, source) in zip(traces, settle_ranks([(t.rank, t.rank_source) for t in traces])):
        t.rank, t.rank_source = rank, source
    return sorted(traces, key=lambda t: t.rank)
