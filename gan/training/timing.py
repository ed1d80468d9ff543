"""Where a training step's time goes: per-phase timing of every generator step, logged to TensorBoard.

Phases, in the order a generator step runs them (``PHASES``): waiting for data (fetch and transfer to
the device), D forward+backward, D optimizer step, G forward (G(z), and the G loss through D), G
backward, G optimizer step, statistics (counters, EMA, running means, ADA), and the callbacks (what
is due after the step: logging, samples, checkpoints, metrics), as gan/core/phases.py lists them. The step
marks its own through :meth:`StepPhases.phase`, the loop the three around them, and the timer reads each
boundary.

Why it is timed this way:

* CUDA runs kernels asynchronously: when a Python call returns, its kernels may not have run yet, so
  ``time.perf_counter()`` around it measures only the launch. Each boundary is therefore a CUDA event
  recorded in the stream; the events are read once per logging window, with one synchronization, so
  the hot path gains none. ``timing.sync=true`` instead synchronizes at every boundary and reads the
  host clock -- exact but slower, and a way to check the events.
* On a CPU every op has finished when it returns: ``time.perf_counter()`` is exact there.
* Under ``trainer.profiler=pytorch`` every phase is also a ``torch.profiler.record_function`` range
  (``gan/<phase>``), so its traces read by phase.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch

from gan.core.phases import NAMES, PhaseTimer
from gan.training.observer import ObservedRun, Observer


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA's allocator peak on a GPU, the peak resident set
    size (RSS) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux


class StepTimer(Observer):
    """Logs every phase's mean over each window of steps up to a logged one (every ``log.every`` and the last) as
    ``time/<phase>_ms``, with ``perf/g_steps_per_s``, ``perf/images_per_s`` (``images_per_step``: over all
    processes) and ``perf/peak_memory_mb``, to ``loggers`` (rank 0's; empty on other ranks). ``timer``: the
    reader of the step's phases."""

    def __init__(self, timer: PhaseTimer, images_per_step: int, loggers: list[Any]):
        self.timer, self.images_per_step, self.loggers = timer, images_per_step, loggers
        self.window_start, self.window_steps = 0.0, 0

    def on_start(self, run: ObservedRun) -> None:
        self.timer.collect()  # drop anything from before training
        self.window_start, self.window_steps = time.perf_counter(), 0

    def on_step_end(self, run: ObservedRun) -> None:
        """After a generator step and its callbacks (the loop calls it after the other observers); a step that
        logged its scalars closes the window."""
        timer, step = self.timer, run.module.counters.g
        self.window_steps += 1
        if run.logged:
            totals = timer.collect()  # one device sync per logging window
            elapsed = time.perf_counter() - self.window_start
            values = {f"time/{name}_ms": totals.get(name, 0.0) / self.window_steps for name in NAMES}
            values["time/step_ms"] = elapsed * 1e3 / self.window_steps
            values["perf/g_steps_per_s"] = self.window_steps / elapsed
            values["perf/images_per_s"] = values["perf/g_steps_per_s"] * self.images_per_step
            values["perf/peak_memory_mb"] = peak_memory_mb(timer.device)
            for logger in self.loggers:
                logger.log_metrics(values, step=step)
            self.window_start, self.window_steps = time.perf_counter(), 0
