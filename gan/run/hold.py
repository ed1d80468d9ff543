"""One run, one directory: a process that trains into a run directory, or evaluates it, holds that directory
for as long as it does; another process that would write there is refused with a ConfigError naming the holder.

The hold is an OS lock, ``fcntl.flock`` on ``<run>/.lock``, whose content names the holder for the refusal's
message. Who holds it, and when:

- ``python train.py``: Hydra's callback (gan/training/checks.py) takes it before Hydra writes ``<run>/.hydra/``,
  so a refused run leaves the holder's config as it was; the task (gan/training/loop.py) takes it over and
  releases it when it ends, however it ends. ``gan.train`` and a direct call of the loop hold it likewise;
  so do multirun jobs (each in its own directory), from the loop, after Hydra has written their ``.hydra/``.
- ``python evaluate.py`` and ``gan.evaluate`` hold the run they score, and its ``eval/``, which they write; a run
  another process is training they score as it is, holding its ``eval/`` alone (gan/evaluation/app.py).
- DDP: the ranks a launcher starts (Lightning's for trainer=ddp, which runs the same command again; torchrun;
  SLURM) hold nothing: rank 0, which the user started, holds the run for all of them.
- Within one process a hold is re-entrant: the process that holds a run may train and evaluate it.

Released explicitly (the file removed while still locked, so no one can lock a file no longer in the
directory) or, whatever kills the process, by the OS. Where ``fcntl`` is absent (Windows) nothing is held,
silently: two runs into one directory are then not refused.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from gan.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no hold (see above)
    fcntl = None  # type: ignore[assignment]

FILE = ".lock"
# How a refused process can go on, by what it would have done.
TRAIN_FIX = "wait until it ends, or train into another hydra.run.dir"
EVALUATE_FIX = "evaluate it once that has ended"

# The variables a launcher sets for the ranks it starts: Lightning's (LOCAL_RANK, NODE_RANK: trainer=ddp runs
# train.py again for each further rank), torchrun's (RANK), SLURM's (SLURM_PROCID). Rank 0 holds for all.
RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")


def started_rank() -> bool:
    """Whether this process is a rank that another process, or a launcher, started for rank 0's run."""
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in RANK_VARIABLES)


class Hold:
    """This process's hold on one run directory: the locked file's descriptor, how many holders in this
    process share it, and whether it waits for the task Hydra runs next to take it over (train.py)."""

    def __init__(self, key: Path, fd: int, created: list[Path]):
        self.key, self.fd, self.created = key, fd, created
        self.count, self.for_task = 1, False

    def release(self) -> None:
        self.count -= 1
        if self.count > 0:
            return
        HELD.pop(self.key, None)
        (self.key / FILE).unlink(missing_ok=True)  # while still locked: see take()
        os.close(self.fd)  # unlocks
        for directory in reversed(self.created):  # a refused run leaves no directory of its own behind
            try:
                directory.rmdir()
            except OSError:  # not empty: the run wrote there
                break


HELD: dict[Path, Hold] = {}


class Held(ConfigError):
    """A run directory another process holds: ``holder`` says who, ``doing`` what (as its lock file says, e.g.
    "training"; None where it could not be read)."""

    def __init__(self, message: str, holder: str, doing: str | None):
        super().__init__(message)
        self.holder, self.doing = holder, doing


def take(run_dir: Path, doing: str, fix: str, create: bool = True) -> Hold | None:
    """Hold ``run_dir`` for this process (doing ``doing``, e.g. "training"), or a ConfigError naming the process
    that holds it, whose message ends with ``fix``; nothing is written then. None: nothing to hold (another
    rank's run, no fcntl, or ``create=False`` and no such directory). ``create``: make the directory."""
    if fcntl is None or started_rank() or (not create and not run_dir.is_dir()):
        return None
    key = run_dir.expanduser().resolve()
    if (held := HELD.get(key)) is not None:
        held.count += 1
        return held
    created = [p for p in (key, *key.parents) if not p.exists()][::-1]
    key.mkdir(parents=True, exist_ok=True)
    path = key / FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock, not a pid file to judge stale: the OS drops it when its process dies, SIGKILL too
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            described = (f"pid {holder['pid']} on {holder['host']} has been {holder['doing']} there since "
                         f"{holder['since']} ({holder['command']})" if holder else
                         f"another process holds {FILE} there")
            raise Held(f"{run_dir} is in use: {described}; {fix}", described, holder and holder["doing"]) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # locked; but a holder that released meanwhile removed the file we opened: lock the new one
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev):
            break
        os.close(fd)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "doing": doing,
              "since": datetime.now().isoformat(sep=" ", timespec="seconds"), "command": command()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    hold = HELD[key] = Hold(key, fd, created)
    return hold


def read_holder(fd: int) -> dict[str, Any] | None:
    """The holder of the lock on ``fd``, as its file names it (written just after it locked: read again until it
    is there); None where it never is."""
    for _ in range(20):
        try:
            holder = json.loads(os.pread(fd, 4096, 0).decode())
            if all(key in holder for key in ("pid", "host", "doing", "since", "command")):
                return holder
        except (ValueError, TypeError):
            pass
        time.sleep(0.05)
    return None


def command() -> str:
    """This process's command line, on one line and short enough for a message."""
    line = " ".join(" ".join(sys.argv).split()) or "python"
    line = f"python {line}" if sys.argv and sys.argv[0].endswith(".py") else line
    return line if len(line) <= 160 else line[:157] + "..."


@contextmanager
def holding(run_dir: Path | None, doing: str, fix: str, create: bool = True) -> Iterator[None]:
    """``run_dir`` held inside the block (see :func:`take`), then released; a hold train.py's callback took for
    this task is taken over, and released here. ``None``: nothing to hold."""
    held = HELD.get(run_dir.expanduser().resolve()) if run_dir is not None else None
    if held is not None and held.for_task:
        held.for_task = False
        hold: Hold | None = held
    else:
        hold = take(run_dir, doing, fix, create) if run_dir is not None else None
    try:
        yield
    finally:
        if hold is not None:
            hold.release()


@contextmanager
def held_for_task(run_dir: Path, doing: str, fix: str) -> Iterator[None]:
    """``run_dir`` held from here on for the task Hydra runs next (:func:`holding` takes it over); released
    at once if the block raises (a refused run), else when the task ends or, at the latest, the process."""
    hold = take(run_dir, doing, fix)
    try:
        yield
    except BaseException:
        if hold is not None:
            hold.release()
        raise
    if hold is not None:
        hold.for_task = True


@atexit.register
def release_all() -> None:
    """Every hold of this process, released (the OS would unlock them; this also removes their files)."""
    for hold in list(HELD.values()):
        hold.count = 1
        hold.release()


def forget_in_child() -> None:
    """A forked child (a DataLoader worker) holds nothing: its copies of the descriptors are closed, so that
    it cannot keep the lock alive after its parent dies. (Closing a copy does not unlock the parent's.)"""
    for hold in HELD.values():
        os.close(hold.fd)
    HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_in_child)
