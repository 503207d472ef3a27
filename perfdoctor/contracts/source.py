"""The one reader of the user's source files, for every layer that reads them.

A source file is named by an input: a run's meta (its user files), a trace's frames, a hotspot's
line, a finding's location. Such a name is hostile until checked: `read_source` opens it non-blocking and
reads it only when the open descriptor is a regular file of at most `MAX_SOURCE_BYTES` (a FIFO, a
device such as /dev/zero or a socket is never read and never waited on), and it never raises.

Each file's bytes are read once per analysis: `read_source` keeps what it read, keyed by the file's
identity and state on the open descriptor (device, inode, size, modification and change times),
so that the static index, the merge's code lines, the hot spots, the ignore comments, the fixes,
the baseline's hash and verify all share one read, and a file changed on disk is read again.

Decoding: the text is decoded with the file's PEP 263 encoding (a `# -*- coding: ... -*-` line,
a UTF-8 BOM, else UTF-8), as Python itself reads the file; where that fails (undecodable bytes,
an unknown codec) the text is UTF-8 with replacement characters and `encoding` is None, so that a
caller that needs the text Python would run (the static index) can tell.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from collections import OrderedDict
from pathlib import Path

from perfdoctor.contracts.files import open_regular

MAX_SOURCE_BYTES = 4 << 20  # a source file bigger than this is not read (the user's own code is far smaller)
# what the cache keeps: the most recently read files, at most this many and this many bytes in all
_CACHE_FILES = 64
_CACHE_BYTES = 32 << 20

_Key = tuple[int, int, int, int, int]


class SourceFile:
    """One source file's contents, read once: bytes, decoded text and its lines."""

    def __init__(self, data: bytes):
        self.data = data
        self.encoding: str | None
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
            self.text = data.decode(encoding)
            self.encoding = encoding
        except (SyntaxError, UnicodeDecodeError, LookupError):
            self.text = data.decode("utf-8", "replace")
            self.encoding = None
        self._lines: list[str] | None = None

    @property
    def lines(self) -> list[str]:
        """The text's lines, without their ends (a caller must not change the list)."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines

    def line(self, number: int) -> str:
        """Line `number` (1-based) without its end, "" past the file's end."""
        lines = self.lines
        return lines[number - 1] if 0 < number <= len(lines) else ""

    def parse(self, filename: str = "<unknown>") -> ast.Module | None:
        """A fresh `ast` tree of the decoded text, or None where Python would not compile it or the tree
        is too deep to build. Never raises."""
        try:
            return ast.parse(self.text, filename=filename)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


_cache: OrderedDict[_Key, SourceFile] = OrderedDict()
_cached_bytes = 0
reads = 0  # how many times a file's bytes were read (not served from the cache): tests count them


def read_source(path: Path | str | None, limit: int = MAX_SOURCE_BYTES) -> SourceFile | None:
    """The source file at `path`, or None unless it is a regular file of at most `limit` bytes that
    can be read. Served from the cache while the file is unchanged on disk."""
    global _cached_bytes, reads
    if path is None:
        return None
    opened = open_regular(path)
    if opened is None:
        return None
    fd, st = opened
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _cache.get(key) if st.st_size <= limit else None
    if hit is not None or st.st_size > limit:  # checked on the open descriptor
        os.close(fd)
        if hit is not None:
            _cache.move_to_end(key)
        return hit
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError:
            return None
    reads += 1
    if len(data) > limit:  # it grew while being read
        return None
    got = SourceFile(data)
    _cache[key] = got
    _cached_bytes += len(data)
    while len(_cache) > _CACHE_FILES or _cached_bytes > _CACHE_BYTES:
        _cached_bytes -= len(_cache.popitem(last=False)[1].data)
    return got


def clear() -> None:
    """Forget every file read so far."""
    global _cached_bytes
    _cache.clear()
    _cached_bytes = 0
