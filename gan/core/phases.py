"""The phases of a training step, as data (pure PyTorch): :data:`PHASES` lists them in the order a generator
step runs them, each with the network whose update it is part of. :class:`StepPhases` is the step's ``phase``
hook: its record says which phase runs now and which D update of the generator step it belongs to (the step's
own count, passed in), which the audit, the non-finite guard and the sample pictures read; its readers are told
as each phase begins and ends, and :class:`PhaseTimer` is one of them, accumulating each phase's time, with
CUDA events on a GPU and the host clock elsewhere. The step (gan/core/step.py) opens the phases of the updates,
the loop (gan/training/loop.py) the three around them; each is opened and closed by one ``with`` block."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import torch
from torch.profiler import record_function


class Phase(NamedTuple):
    """One phase of a generator step: its ``name`` (``time/<name>_ms`` in TensorBoard) and the ``network``
    whose update it is part of ("D", "G"; None for the loop's phases around the updates)."""

    name: str
    network: str | None


PHASES = (
    Phase("data", None),  # the next batch fetched and on the device
    # loss.d_steps times a generator step; R1 (reg=r1, r1r2) also on every reg.every-th D update of the run
    Phase("d_forward_backward", "D"),
    Phase("d_optimizer", "D"),
    Phase("g_forward", "G"),  # G(z), and the G loss through the frozen D
    Phase("g_backward", "G"),
    Phase("g_optimizer", "G"),
    Phase("statistics", None),  # counters, learning rates, running means, EMA, ADA
    Phase("callbacks", None),  # what is due after the step: scalars, samples, checkpoints, metrics
)
NAMES = tuple(phase.name for phase in PHASES)


class StepPhases:
    """The record of what a training step runs now -- :attr:`current` (the phase), :attr:`network` (whose update)
    and :attr:`d_step` (which of the generator step's ``loss.d_steps`` D updates, 0-based) -- kept by
    :meth:`phase`, the step's ``phase`` hook, which also tells each of ``readers`` (objects with ``start(name)``
    and ``stop(name)``, such as the timer) as a phase begins and ends."""

    def __init__(self, *readers: Any):
        self.readers = readers
        self.by_name = {phase.name: phase for phase in PHASES}
        self.profiled = False  # each phase a record_function range, set when the PyTorch profiler runs
        self.current: Phase | None = None  # the phase running now
        self.d_step = 0  # which D update of this generator step runs, or ran last

    @property
    def network(self) -> str | None:
        """"D" or "G": the network whose update runs now; else None."""
        return self.current.network if self.current is not None else None

    def phase(self, name: str, d_step: int = 0) -> Opened:
        """Record the block as phase ``name`` (of the step's D update ``d_step``, for D's phases), and tell the readers
        where it begins and ends."""
        return Opened(self, self.by_name[name], d_step)


class Opened:
    """One ``with phases.phase(name):`` block. A class rather than ``@contextmanager``, whose generator and
    wrapper cost several microseconds a block, and a step runs about fifteen blocks."""

    __slots__ = ("phases", "phase", "d_step", "outer", "range")

    def __init__(self, phases: StepPhases, phase: Phase, d_step: int):
        self.phases, self.phase, self.d_step = phases, phase, d_step

    def __enter__(self) -> None:
        phases, phase = self.phases, self.phase
        if phase.network == "D":
            phases.d_step = self.d_step
        self.outer, phases.current = phases.current, phase
        # A record_function range costs tens of microseconds even with no profiler listening: labelled
        # only when trainer.profiler=pytorch records them.
        self.range = record_function(f"gan/{phase.name}").__enter__() if phases.profiled else None
        for reader in phases.readers:
            reader.start(phase.name)

    def __exit__(self, *exc: object) -> None:
        phases = self.phases
        for reader in phases.readers:
            reader.stop(self.phase.name)
        phases.current = self.outer
        if self.range is not None:
            self.range.__exit__(*exc)


class PhaseTimer:
    """Accumulates the time of each phase between :meth:`start` and :meth:`stop` (a reader of
    :class:`StepPhases`); :meth:`collect` returns their totals in milliseconds. ``enabled=False`` times nothing.

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


def untimed(name: str, d_step: int = 0) -> AbstractContextManager[None]:
    """The ``phase`` of code that is not timed (the patterns, the tests)."""
    return nullcontext()
