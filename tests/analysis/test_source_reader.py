"""The one reader of the user's source files (`contracts.source`): every layer that reads a user file
(the static index, the merge's code lines, the hot spots, ignore comments, fixes, the baseline's hash,
verify) goes through it; one analysis reads each file once; hostile names are refused without
blocking and without raising."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from perfdoctor.contracts import source
from perfdoctor.contracts.source import MAX_SOURCE_BYTES, read_source
from tests.helpers import TESTS

sys.path.insert(0, str(TESTS / "golden"))
import record  # noqa: E402


def test_one_analysis_reads_the_users_file_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """pd002_config_dict's report uses its script four ways (the static index, the subjects' code
    lines, the ignore comments, the fix): the file's bytes are read once (they were read four times
    by three readers before the one reader)."""
    source.clear()
    monkeypatch.setattr(source, "reads", 0)
    run = record.materialise("pd002_config_dict")
    from perfdoctor.analysis import analyse_path

    report = analyse_path(run)
    assert any(f.fix is not None and f.fix.after for f in report.findings)  # the fixer read the file too
    assert any(loc.code for f in report.findings for loc in f.locations)
    assert source.reads == 1
    source.clear()
    analyse_path(run)
    assert source.reads == 2  # a cleared cache reads it again: the count above is real


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    f = tmp_path / "train.py"
    f.write_text("x = 1\n")
    first = read_source(f)
    assert first is not None and read_source(f) is first  # unchanged: served from the cache
    f.write_text("x = 22\n")
    second = read_source(f)
    assert second is not None and second is not first and second.lines == ["x = 22"]


def test_hostile_names_are_refused_without_blocking(tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (MAX_SOURCE_BYTES + 1))
    assert read_source(big) is None
    assert read_source(tmp_path) is None  # a folder
    assert read_source(tmp_path / "missing.py") is None
    assert read_source("bad\0name.py") is None
    assert read_source(None) is None
    if os.path.exists("/dev/zero"):
        assert read_source("/dev/zero") is None
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.py"
        os.mkfifo(fifo)
        assert read_source(fifo) is None  # opened non-blocking, never read


def test_decoding_follows_the_files_coding_line(tmp_path: Path) -> None:
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1"))
    sf = read_source(latin)
    assert sf is not None and sf.encoding == "iso-8859-1" and sf.line(2) == "name = 'café'"
    assert sf.parse() is not None
    broken = tmp_path / "broken.py"
    broken.write_bytes(b"name = '\xff'\n")
    sf = read_source(broken)
    assert sf is not None and sf.encoding is None and sf.line(1) == "name = '\ufffd'"  # no coding line: replaced
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + "(" * 100_000 + ")" * 100_000 + "\n")
    sf = read_source(deep)
    assert sf is not None and sf.parse() is None  # too deep to parse: None, never an exception
