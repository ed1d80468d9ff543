"""The phases of a training step and a timer for them (pure PyTorch): the step marks each phase, and the
timer accumulates its time, with CUDA events on a GPU and the host clock elsewhere."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch.profiler import record_function

PHASES = ("data", "d_forward_backward", "d_optimizer", "g_forward", "g_backward", "g_optimizer", "statistics",
          "callbacks")


class PhaseTimer:
    """Accumulates the time of named phases; :meth:`collect` returns their totals in milliseconds.

    On CUDA (``device.type == "cuda"`` and ``sync=False``) a boundary is a CUDA event and nothing
    waits for the GPU until :meth:`collect`; elsewhere it is ``time.perf_counter()``, after a
    ``torch.cuda.synchronize()`` when ``sync`` is set on a GPU.
    """

    def __init__(self, enabled: bool = True, sync: bool = False):
        self.enabled, self.sync = enabled, sync
        self.labels = False  # record_function ranges, set when the PyTorch profiler runs
        self.device = torch.device("cpu")
        self.open: dict[str, Any] = {}
        self.intervals: list[tuple[str, Any, Any]] = []

    @property
    def events(self) -> bool:
        return self.device.type == "cuda" and not self.sync

    def now(self) -> Any:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self, name: str) -> None:
        if self.enabled:
            self.open[name] = self.now()

    def stop(self, name: str) -> None:
        if self.enabled and name in self.open:
            self.intervals.append((name, self.open.pop(name), self.now()))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (accumulated when a phase occurs twice in a step)."""
        # A record_function range costs tens of microseconds even with no profiler listening: labelled
        # only when trainer.profiler=pytorch records them.
        with record_function(f"gan/{name}") if self.labels else nullcontext():
            self.start(name)
            try:
                yield
            finally:
                self.stop(name)

    def collect(self) -> dict[str, float]:
        """Milliseconds per phase since the last call; on CUDA this is the one synchronization."""
        totals: dict[str, float] = defaultdict(float)
        if self.intervals and self.events:
            self.intervals[-1][2].synchronize()  # the last event done: every earlier one is too
        for name, start, end in self.intervals:
            totals[name] += start.elapsed_time(end) if self.events else (end - start) * 1e3
        self.intervals.clear()
        return dict(totals)


def untimed(name: str) -> AbstractContextManager[None]:
    """The ``phase`` of code that is not timed (the patterns, the tests)."""
    return nullcontext()
