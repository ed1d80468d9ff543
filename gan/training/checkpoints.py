"""Checkpoints while a run trains, and the signals that stop it with one: :class:`Checkpoints`."""

from __future__ import annotations

import logging
import re
import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gan.errors import StoppedAtOnce
from gan.training.observer import ObservedRun, Observer

log = logging.getLogger(__name__)

# The names of the periodic checkpoint files: Checkpoints prunes these and no other file.
PERIODIC = re.compile(r"step_(\d+)\.ckpt")

# The signals that stop a run at the end of its generator step, with a checkpoint, and their names in messages.
# SIGUSR1 is what a SLURM job is sent before its time limit (sbatch --signal=USR1@90; docs/usage.md).
STOPPING = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1"}


class Checkpoints(Observer):
    """``checkpoints/step_NNNNNN.ckpt`` every ``every`` generator steps, of which the newest ``keep`` stay
    (0: all); ``last.ckpt`` then, at the end, and when a signal stops the run. ``write(path)`` writes the
    training state to a file (the loop's, through gan/files.py's atomic writing).

    Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (:data:`STOPPING`) stop the run at the end of the generator step
    they land in, and save that step: a checkpoint taken between D's update and G's would not resume
    exactly. A second signal stops at once, without a checkpoint (:class:`gan.errors.StoppedAtOnce`), and
    ``kill_ranks`` ends any process the run started for other ranks.
    """

    def __init__(self, directory: Path, every: int, keep: int, write: Callable[[Path], None], is_global_zero: bool,
                 kill_ranks: Callable[[], None] = lambda: None):
        self.directory, self.every, self.keep, self.write = Path(directory), every, keep, write
        self.is_global_zero, self.kill_ranks = is_global_zero, kill_ranks
        self.saved_step = -1
        self.stop_requested = self.interrupted = False
        self.stop_signal: int | None = None  # the first stopping signal received
        self.previous_handlers: dict[int, Any] = {}

    @property
    def stopped_by(self) -> str | None:
        """What stopped the run at the end of a step: a signal's name (:data:`STOPPING`), or None."""
        if not self.interrupted:
            return None
        return STOPPING[signal.Signals(self.stop_signal)] if self.stop_signal else "another rank's signal"

    @property
    def exit_code(self) -> int:
        """128 + the stopping signal's number (a rank stopped by another's: SIGTERM's)."""
        return 128 + (self.stop_signal or signal.SIGTERM)

    def save(self, step: int, periodic: bool) -> None:
        directory = self.directory
        if periodic:
            self.write(directory / f"step_{step:06d}.ckpt")
        self.write(directory / "last.ckpt")
        self.saved_step = step
        # Only now, with both new files complete: a failed or killed save leaves every older checkpoint in place.
        if periodic and self.keep and self.is_global_zero:
            self.prune(step)

    def prune(self, step: int) -> None:
        """Delete the periodic checkpoints of steps up to ``step`` except the newest ``keep``.

        Checkpoints of later steps are left alone: they come from an earlier run in this directory that
        this one resumed from one of its older checkpoints, and this run overwrites them as it gets there.
        """
        periodic = {int(m[1]): p for p in self.directory.iterdir() if (m := PERIODIC.fullmatch(p.name))}
        for old in sorted(s for s in periodic if s <= step)[:-self.keep]:
            periodic[old].unlink(missing_ok=True)

    def on_start(self, run: ObservedRun) -> None:
        """The stopping signals caught from the first step on."""
        if threading.current_thread() is threading.main_thread():  # the only thread signal handlers run in
            self.previous_handlers = {signum: signal.signal(signum, self.request_stop) for signum in STOPPING}

    def request_stop(self, signum: int, frame: Any) -> None:
        name = STOPPING[signal.Signals(signum)]
        if self.stop_requested:
            self.stop_at_once(name, signum)
        self.stop_requested, self.stop_signal = True, signum
        log.warning(f"{name}: the run stops at the end of this generator step, with a checkpoint "
                    f"({name} again stops it at once, without)")

    def stop_at_once(self, name: str, signum: int) -> None:
        self.restore_handlers()
        self.kill_ranks()
        last = self.directory / "last.ckpt"
        resume = (f"resume from the last checkpoint with the same overrides and {shlex.quote(f'ckpt_path={last}')}"
                  if last.is_file() else "no checkpoint had been written")
        raise StoppedAtOnce(f"stopped at once by a second {name}: {resume}", 128 + signum)

    def restore_handlers(self) -> None:
        for signum, handler in self.previous_handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        self.previous_handlers = {}

    def on_step_end(self, run: ObservedRun) -> None:
        """Save what is due at this generator step: a periodic checkpoint, or last.ckpt where the run stops here."""
        step = run.module.counters.g
        if step % self.every == 0 or run.stopping:
            self.save(step, periodic=step % self.every == 0)
        self.interrupted = run.stopping

    def on_end(self, run: ObservedRun) -> None:
        if run.module.counters.g != self.saved_step:
            self.save(run.module.counters.g, periodic=False)

    def on_close(self, run: ObservedRun, status: str) -> None:
        self.restore_handlers()
