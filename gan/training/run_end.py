"""A run's end: what is written after its last step (:func:`at_end`), what is closed however the steps ended
(:func:`close`, :func:`close_after_error`), and the summary it returns with or the error it ends in
(:func:`finish`)."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gan.core import snapshot
from gan.errors import Interrupted, Unhealthy

if TYPE_CHECKING:
    from gan.training.observer import Observer
    from gan.training.state import Training

log = logging.getLogger(__name__)


def at_end(run: Training, observers: Sequence[Observer]) -> None:
    """After the last step: what each of ``observers`` writes at the end (last.ckpt, the last samples,
    health.json), and the generator's snapshot."""
    run.guard.read()
    for observer in observers:
        observer.on_end(run)
    if run.zero:
        generator = run.module.snapshot()  # the EMA generator where there is one, with what it needs to sample
        snapshot.save_snapshot(run.run_dir / snapshot.FILE, generator)


def close(run: Training, observers: Sequence[Observer], status: str) -> None:
    """However the steps ended: each of ``observers`` closed (the signal handlers, the audit's hooks, the progress
    bar), the profiler, the loggers."""
    for observer in observers:
        observer.on_close(run, status)
    run.profiler.describe()
    for logger in run.loggers:
        logger.finalize(status)


def close_after_error(run: Training, observers: Sequence[Observer]) -> None:
    """:func:`close` after the steps failed: an error of its own (the full disk that stopped the run, met again by
    the loggers' last write) is logged, not raised, so the error that stopped the run is the one reported."""
    try:
        close(run, observers, "failed")
    except Exception as e:
        log.warning(f"closing the run after its error failed too: {e}")


def finish(run: Training) -> Training:
    """The run's summary; a run a signal stopped ends with :class:`gan.errors.Interrupted`, one its health check
    stopped with :class:`gan.errors.Unhealthy`: each says how to resume."""
    module, run_dir, stopped_by = run.module, run.run_dir, run.checkpoints.stopped_by
    unhealthy = run.health_stopped
    ill = run.health.stopped_by if run.health is not None else None  # None on ranks > 0: rank 0 judged
    if unhealthy:
        stopped_by = f"its health check ({ill.condition if ill else 'on rank 0'})"
    if run.zero:
        log_summary(run, stopped_by)
    if not stopped_by:
        return run
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = shlex.quote(f"ckpt_path={last}")
    if unhealthy:
        condition = f"{ill.condition} since step {ill.started}" if ill else "a condition rank 0 found"
        raise Unhealthy(f"stopped by its health check at generator step {module.counters.g}: {condition} "
                        f"(docs/usage.md#training-health); saved in {last}: resume with the same overrides, {resume} "
                        "and health.action=warn to go on regardless, or start anew with a fix")
    raise Interrupted(f"stopped by {stopped_by} at generator step {module.counters.g}, saved in {last}: resume with "
                      f"the same overrides and {resume}", run.checkpoints.exit_code)


def log_summary(run: Training, stopped_by: str | None = None) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    steps, run_dir = run.module.counters.g, run.run_dir
    losses = [f"{name} {value:.4g}" for name, value in run.last_losses.items()]
    # The loop logs the last step it trains: none logged means none trained (a resume at trainer.max_steps).
    final = f"final losses {', '.join(losses)} (generator step {steps})" if losses else "no generator step trained"
    how = f"stopped by {stopped_by} after" if stopped_by else "finished:"
    log.info(f"Run {how} {steps} generator steps in {run_dir}; {final}")
    # Quoted for a shell (a run directory may hold spaces): each line can be pasted as it is.
    log.info(f"  curves and samples: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}")
    log.info(f"  metrics:            python evaluate.py {shlex.quote(f'run_dir={run_dir}')}")
    log.info(f"  the generator:      {shlex.quote(str(run_dir / snapshot.FILE))} (gan.core.snapshot.load_generator)")
