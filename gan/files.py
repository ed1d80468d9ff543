"""Writing files so that a crash or a full disk never leaves a half-written one in place."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from gan.errors import RunError


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into a temporary file beside ``path``, fsync, then ``os.replace`` it onto ``path``.

    A rename within one directory is atomic, so a process killed at any moment leaves either the old
    file or the new one, never a truncated one; fsync first, or after a crash of the machine the
    rename could be on disk before the bytes it names. A failed ``write`` leaves the old file and no
    temporary behind; a full disk or an unwritable directory is a RunError that says so. Creates the
    parent directory.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as f:
            try:
                write(f)
            except RuntimeError as e:  # torch.save reports its file's failed write as a RuntimeError of its own
                raise failed_write(f) or e from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as e:  # ENOSPC, EACCES, EROFS, ...
        raise RunError(f"cannot write {path} ({e.strerror or e}): free disk space or choose a writable directory; "
                       f"the previous {path.name}, if there was one, is unchanged") from e
    finally:
        temporary.unlink(missing_ok=True)


def failed_write(f: BinaryIO) -> OSError | None:
    """The OSError that writing more to ``f`` raises (a full disk, a file size limit), or None where it can be
    written: after a writer's own error, whether the file was the cause."""
    try:
        f.flush()
        os.write(f.fileno(), bytes(1 << 16))
    except OSError as e:
        return e
    return None
