"""The phases of a training step, as the step says them (pure PyTorch): :class:`PhaseTimer` records which
phase runs now -- so the audit, the non-finite guard and the graph picture read which update is running
from the step itself -- and accumulates each phase's time, with CUDA events on a GPU and the host clock
elsewhere."""

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
    """The step's ``phase`` hook: records the phase running now (:attr:`current`, :attr:`network`,
    :attr:`d_update`) and accumulates the time of each; :meth:`collect` returns their totals in
    milliseconds. ``enabled=False`` records without timing.

    On CUDA (``device.type == "cuda"`` and ``sync=False``) a boundary is a CUDA event and nothing
    waits for the GPU until :meth:`collect`; elsewhere it is ``time.perf_counter()``, after a
    ``torch.cuda.synchronize()`` when ``sync`` is set on a GPU.
    """

    def __init__(self, enabled: bool = True, sync: bool = False):
        self.enabled, self.sync = enabled, sync
        self.labels = False  # record_function ranges, set when the PyTorch profiler runs
        self.device = torch.device("cpu")
        self.current: str | None = None  # the phase running now
        self.d_update = -1  # which D update of this generator step runs (0-based), or ran last
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

    @property
    def network(self) -> str | None:
        """"D" or "G": the network whose update runs now (its phases start ``d_`` or ``g_``); else None."""
        return self.current[0].upper() if self.current and self.current[:2] in ("d_", "g_") else None

    def begin_step(self) -> None:
        """A new generator step: its first D update will be number 0."""
        self.d_update = -1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the block as phase ``name`` and time it (accumulated when a phase occurs twice in a step)."""
        if name == "d_forward_backward":
            self.d_update += 1
        outer, self.current = self.current, name
        # A record_function range costs tens of microseconds even with no profiler listening: labelled
        # only when trainer.profiler=pytorch records them.
        with record_function(f"gan/{name}") if self.labels else nullcontext():
            self.start(name)
            try:
                yield
            finally:
                self.stop(name)
                self.current = outer

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
