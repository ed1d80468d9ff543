"""The phases of a training step, as the step says them (pure PyTorch). :class:`StepPhases` is the step's
``phase`` hook: its record says which phase and which update run now, which the audit, the non-finite guard
and the sample pictures read; its readers are told as each phase begins and ends, and :class:`PhaseTimer`
is one of them, accumulating each phase's time, with CUDA events on a GPU and the host clock elsewhere."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.profiler import record_function

PHASES = ("data", "d_forward_backward", "d_optimizer", "g_forward", "g_backward", "g_optimizer", "statistics",
          "callbacks")


class StepPhases:
    """The record of what a training step runs now -- :attr:`current` (the phase), :attr:`network` (whose update)
    and :attr:`d_update` (which D update of the generator step) -- kept by :meth:`phase`, the step's ``phase``
    hook, which also tells each of ``readers`` (objects with ``start(name)`` and ``stop(name)``, such as the
    timer) as a phase begins and ends."""

    def __init__(self, *readers: Any):
        self.readers = readers
        self.labels = False  # record_function ranges, set when the PyTorch profiler runs
        self.current: str | None = None  # the phase running now
        self.d_update = -1  # which D update of this generator step runs (0-based), or ran last

    @property
    def network(self) -> str | None:
        """"D" or "G": the network whose update runs now (its phases start ``d_`` or ``g_``); else None."""
        return self.current[0].upper() if self.current and self.current[:2] in ("d_", "g_") else None

    def begin_step(self) -> None:
        """A new generator step: its first D update will be number 0."""
        self.d_update = -1

    def phase(self, name: str) -> Phase:
        """Record the block as phase ``name``, and tell the readers where it begins and ends."""
        return Phase(self, name)


class Phase:
    """One ``with phases.phase(name):`` block. A class rather than ``@contextmanager``, whose generator and
    wrapper cost several microseconds a block, and a step runs about fifteen blocks."""

    __slots__ = ("phases", "name", "outer", "range")

    def __init__(self, phases: StepPhases, name: str):
        self.phases, self.name = phases, name

    def __enter__(self) -> None:
        phases, name = self.phases, self.name
        if name == "d_forward_backward":
            phases.d_update += 1
        self.outer, phases.current = phases.current, name
        # A record_function range costs tens of microseconds even with no profiler listening: labelled
        # only when trainer.profiler=pytorch records them.
        self.range = record_function(f"gan/{name}").__enter__() if phases.labels else None
        for reader in phases.readers:
            reader.start(name)

    def __exit__(self, *exc: object) -> None:
        phases = self.phases
        for reader in phases.readers:
            reader.stop(self.name)
        phases.current = self.outer
        if self.range is not None:
            self.range.__exit__(*exc)


class PhaseTimer:
    """Accumulates the time of each phase between :meth:`start` and :meth:`stop` (a reader of
    :class:`StepPhases`, and called by the loop for the phases around the step); :meth:`collect` returns
    their totals in milliseconds. ``enabled=False`` times nothing.

    On CUDA (``device.type == "cuda"`` and ``sync=False``) a boundary is a CUDA event and nothing
    waits for the GPU until :meth:`collect`; elsewhere it is ``time.perf_counter()``, after a
    ``torch.cuda.synchronize()`` when ``sync`` is set on a GPU.
    """

    def __init__(self, enabled: bool = True, sync: bool = False, device: str | torch.device = "cpu"):
        self.enabled, self.sync, self.device = enabled, sync, torch.device(device)
        # decided once: the clock is read about twenty times a step
        self.events = self.device.type == "cuda" and not sync
        self.synchronize = self.device.type == "cuda" and sync
        self.open: dict[str, Any] = {}
        self.intervals: list[tuple[str, Any, Any]] = []

    def now(self) -> Any:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.synchronize:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self, name: str) -> None:
        if self.enabled:
            self.open[name] = self.now()

    def stop(self, name: str) -> None:
        """Close phase ``name`` (accumulated when a phase occurs twice in a step)."""
        if self.enabled and name in self.open:
            self.intervals.append((name, self.open.pop(name), self.now()))

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
