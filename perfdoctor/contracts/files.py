"""Reading a contract file: JSON decoded and validated into its Struct at the edge, every failure one
InputError line (exit 2) that names the file and what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

from perfdoctor.errors import InputError

T = TypeVar("T")


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror or e})") from None


def decode(path: Path, raw: bytes, type: type[T], what: str, hint: str = "") -> T:
    """`raw` (the bytes of `path`) as a `type`; `what` names the file's kind in the error, `hint`
    (if any) what to do about it."""
    tail = f"; {hint}" if hint else ""
    try:
        return msgspec.json.decode(raw, type=type)
    except msgspec.ValidationError as e:
        raise InputError(f"{path}: not a valid {what}: {e}{tail}") from None
    except msgspec.DecodeError as e:
        raise InputError(f"{path}: not readable JSON ({e}){tail}") from None


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
        raise InputError(f"{path}: not readable JSON ({e})") from None
