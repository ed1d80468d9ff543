"""Where a training step's time goes: per-phase timing of every generator step, logged to TensorBoard.

Phases, in the order a generator step runs them (``PHASES``): waiting for data (fetch and transfer to
the device), D forward+backward, D optimizer step, G forward (G(z), and the G loss through D), G
backward, G optimizer step, statistics (counters, EMA, running means, ADA), and the callbacks
(logging, samples, checkpoints, metrics). The step code marks them with :meth:`PhaseTimer.phase`.

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

import lightning as L
import torch
from lightning.pytorch.profilers import PyTorchProfiler

from gan.core.phases import PHASES


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA's allocator peak on a GPU, the peak resident set
    size (RSS) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux


class StepTimer(L.Callback):
    """Times the phases outside the training step (data, callbacks) and logs every phase's mean over
    each ``log.every`` window as ``time/<phase>_ms``, with ``perf/g_steps_per_s``,
    ``perf/images_per_s`` and ``perf/peak_memory_mb``. Put it last among the callbacks: its batch-end
    hook then closes the callbacks phase after the others have run."""

    def __init__(self, every: int):
        self.every = every
        self.window_start: Any = None
        self.window_steps = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.timer.device = pl_module.device
        pl_module.timer.labels = isinstance(trainer.profiler, PyTorchProfiler)
        pl_module.timer.collect()  # drop anything from before training
        pl_module.timer.start("data")
        self.window_start, self.window_steps = time.perf_counter(), 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        pl_module.timer.stop("data")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        timer = pl_module.timer
        timer.stop("callbacks")  # opened by GANModule at the end of training_step
        self.window_steps += 1
        step = pl_module.counters.g
        if step % self.every == 0:
            totals = timer.collect()  # one device sync per logging window
            if self.window_start is not None and self.window_steps:
                elapsed = time.perf_counter() - self.window_start
                values = {f"time/{name}_ms": totals.get(name, 0.0) / self.window_steps for name in PHASES}
                values["time/step_ms"] = elapsed * 1e3 / self.window_steps
                values["perf/g_steps_per_s"] = self.window_steps / elapsed
                values["perf/images_per_s"] = values["perf/g_steps_per_s"] * pl_module.images_per_step
                values["perf/peak_memory_mb"] = peak_memory_mb(pl_module.device)
                if trainer.is_global_zero:
                    for logger in trainer.loggers:
                        logger.log_metrics(values, step=step)
            self.window_start, self.window_steps = time.perf_counter(), 0
        timer.start("data")
