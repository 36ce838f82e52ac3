"""Files the commands write: checked before any work is done (never one of the command's own inputs, never a
directory, never through a symbolic link), written whole (a temporary file renamed over the target) and
announced on stderr, saying when an existing file was replaced."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import typer

from optlayout.errors import InputError
from optlayout.inputs.files import same_file


def check_output(path: Path, flag: str, inputs: Iterable[str | Path | None] = ()) -> Path:
    """`path` when the command may write it; a one-line error naming `flag` otherwise."""
    if path.is_symlink():
        raise InputError(f"{flag}: {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); give the file itself")
    if path.is_dir():
        raise InputError(f"{flag}: {str(path)!r} is a directory; give a file name")
    for given in inputs:
        if given is not None and path.exists() and Path(given).exists() and same_file(path, given):
            raise InputError(f"{flag}: {str(path)!r} is also an input of this command; write somewhere else")
    if not path.parent.is_dir():
        raise InputError(f"{flag}: no directory {str(path.parent)!r} to write {path.name} in")
    return path


def check_outputs(named: Iterable[tuple[str, Path | None]], inputs: Iterable[str | Path | None] = ()) -> None:
    """`check_output` for each (flag, path) given, and no two outputs on one file (the second would replace the
    first)."""
    inputs = list(inputs)
    seen: list[tuple[str, Path]] = []
    for flag, path in named:
        if path is None:
            continue
        check_output(path, flag, inputs)
        for other_flag, other in seen:
            if path.absolute() == other.absolute() or (path.exists() and other.exists() and same_file(path, other)):
                raise InputError(f"{flag}: {str(path)!r} is also the file of {other_flag}; give each output its own")
        seen.append((flag, path))


def write_output(path: Path, content: str | bytes, flag: str, inputs: Iterable[str | Path | None] = ()) -> None:
    """Write `content` to `path` (checked as `check_output` does) and say so on stderr."""
    check_output(path, flag, inputs)
    replaced = path.exists()
    data = content.encode() if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, path.stat().st_mode & 0o7777 if replaced else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    typer.echo(f"{'replaced' if replaced else 'wrote'} {path}", err=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def announce(path: Path, existed: bool) -> None:
    """Say on stderr that a file another library wrote (a plot) was made or replaced."""
    typer.echo(f"{'replaced' if existed else 'wrote'} {path}", err=True)
