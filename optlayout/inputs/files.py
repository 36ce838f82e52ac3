"""Files as bytes: a path that is missing, a directory or unreadable, a file over its size limit, or text that
is not UTF-8 is refused in one line naming the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from optlayout.errors import InputError
from optlayout.inputs.limits import MIB


def check_readable(path: str | Path, what: str) -> Path:
    """The path of a file that exists and is not a directory (a pipe or a device is read like a file)."""
    if not isinstance(path, str | os.PathLike):
        raise InputError(f"{what}: expected a file path, got {type(path).__name__}")
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{what}: no such file {str(path)!r}") from None
    except OSError as exc:
        raise InputError(f"{what}: cannot read {str(path)!r} ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{what}: {str(path)!r} is a directory, not a file")
    return path


def read_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The file's bytes; more than `max_bytes` is refused (read in one bounded call: /dev/zero stops there too)."""
    path = check_readable(path, what)
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{what}: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} {path.name}: larger than the {_size(max_bytes)} a {what} file may have")
    return data


def decode(data: bytes, where: str) -> str:
    """UTF-8 text (a byte-order mark is dropped); the first byte that is not UTF-8 is named with its offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); is it the right file?"
        ) from None


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The file's UTF-8 text, at most `max_bytes` long."""
    return decode(read_bytes(path, what, max_bytes), f"{what} {Path(path).name}")


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n} bytes"


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (both must exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
