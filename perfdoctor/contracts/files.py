"""Reading input files at the edge: a contract file's JSON decoded and validated into its Struct, every
failure one InputError line (exit 2) that names the file and what is wrong. (A source file that an input
names is read by `contracts.source`.)"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from perfdoctor.errors import InputError

T = TypeVar("T")

# Value limits of the numbers perfdoctor reads back: a step time is a positive, finite number of
# milliseconds below a day (1e308 or a negative time is a broken or hostile file, not a slow run)
MAX_MS = 86_400_000.0
StepMs = Annotated[float, msgspec.Meta(gt=0, le=MAX_MS)]  # one step, or a median of steps
Ms = Annotated[float, msgspec.Meta(ge=0, le=MAX_MS)]  # a part of a step: may be 0
Count = Annotated[int, msgspec.Meta(ge=0)]


MAX_FILE_BYTES = 256 << 20  # a run file, report.json or baseline bigger than this is refused


def open_regular(path: Path | str) -> tuple[int, os.stat_result] | None:
    """(fd, its stat) of `path` opened for reading when it is a regular file, else None. Opened
    non-blocking and checked on the open descriptor, so that a FIFO, a device (/dev/zero) or a
    socket named by an input is never read and never blocks. The one way perfdoctor opens a file
    someone else wrote (run files, reports, baselines, the user's source: contracts/source.py)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` as valid Unicode: the undecodable bytes of a name (Python holds a non-UTF-8 file name,
    argument or folder as lone surrogates: surrogateescape) written as `\\xNN`, as repr() shows them."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(_escaped, text)


def printable_data(x: Any) -> Any:
    """JSON-like data (dicts, lists, scalars) with every string, keys included, `printable`."""
    if isinstance(x, str):
        return printable(x)
    if isinstance(x, list):
        return [printable_data(v) for v in x]
    if isinstance(x, dict):
        return {printable_data(k): printable_data(v) for k, v in x.items()}
    return x


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"\\u{c:04x}"


def read_head(path: Path | str, size: int) -> bytes:
    """The first `size` bytes of a regular file (a look at what it is), b"" for anything else: a
    FIFO is never waited on."""
    opened = open_regular(path)
    if opened is None:
        return b""
    with os.fdopen(opened[0], "rb") as f:
        try:
            return f.read(size)
        except OSError:
            return b""


def read_bytes(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A perfdoctor JSON file (run file, report.json, baseline): regular files only, at most `limit`
    bytes; InputError otherwise."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    opened = open_regular(path)
    if opened is None:
        if path.is_dir():
            raise InputError(f"{path} is a folder, not a file")
        try:  # the reason it could not be opened (never opened again: a FIFO would block)
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)))
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None
        raise InputError(f"{path}: not a regular file")
    fd, size = opened[0], opened[1].st_size
    with os.fdopen(fd, "rb") as f:
        if size > limit:
            raise InputError(f"{path}: {size} bytes, over the {limit >> 20} MB perfdoctor reads in such a file")
        try:
            return f.read(limit + 1)
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None


def decode(path: Path, raw: bytes, type: type[T], what: str, hint: str = "") -> T:
    """`raw` (the bytes of `path`) as a `type`; `what` names the file's kind in the error, `hint`
    (if any) what to do about it."""
    tail = f"; {hint}" if hint else ""
    try:
        return msgspec.json.decode(raw, type=type)
    except msgspec.ValidationError as e:
        raise InputError(f"{path}: not a valid {what}: {one_line(e)}{tail}") from None
    except msgspec.DecodeError as e:
        raise InputError(f"{path}: not readable JSON ({one_line(e)}){tail}") from None
    except RecursionError:
        raise InputError(f"{path}: {TOO_DEEP}") from None


# msgspec decodes nested JSON recursively, as deep as the interpreter's recursion limit (1000 frames
# by default, less what is already on the stack): deeper JSON is refused with this message
TOO_DEEP = "JSON nested too deeply (perfdoctor reads at most about 900 levels of arrays and objects)"


def one_line(e: Exception, limit: int = 200) -> str:
    """An exception's message as one short line (a decoder's message may quote the input)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


def check_schema(path: Path, found: str | None, expected: str, what: str) -> None:
    """InputError unless `found` is `expected`; a later version of the same kind of file says so."""
    if found == expected:
        return
    family = expected.rsplit("/", 1)[0] + "/"
    if isinstance(found, str) and found.startswith(family):
        raise InputError(f"{path}: a {what} of schema {found[:80]!r}, which this perfdoctor does not read "
                         f"(it reads {expected!r}); use the perfdoctor version that wrote it, or record it again")
    raise InputError(f"{path}: not a {what} (expected schema {expected!r})")


class Header(msgspec.Struct):
    """The `schema` string every perfdoctor JSON file starts with (absent in other JSON files)."""

    schema: str | None = None


def schema_of(path: Path, raw: bytes) -> str | None:
    """The file's `schema`, or None for JSON that is not an object or has none."""
    try:
        return msgspec.json.decode(raw, type=Header).schema
    except msgspec.ValidationError:
        return None
    except msgspec.DecodeError as e:
        raise InputError(f"{path}: not readable JSON ({one_line(e)})") from None
    except RecursionError:
        raise InputError(f"{path}: {TOO_DEEP}") from None
