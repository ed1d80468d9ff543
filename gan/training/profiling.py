"""``trainer.profiler``: where the time of whole generator steps goes, beside the per-phase timing of
gan/training/timing.py. ``simple`` and ``advanced`` are Lightning's profilers (the time of each step;
cProfile's table of every Python function), written to ``<run>/profile/``; ``pytorch`` is torch's
profiler, whose operator table goes there too and whose trace (``trace.json``, for chrome://tracing or
Perfetto) shows each step phase as a ``gan/<phase>`` range."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.profilers import AdvancedProfiler, PassThroughProfiler, SimpleProfiler

LIGHTNING = {"simple": SimpleProfiler, "advanced": AdvancedProfiler}


class TorchProfiler:
    """torch.profiler over the whole run: the table and the trace written by :meth:`describe`."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.profiler = torch.profiler.profile(record_shapes=False)
        self.started = False

    @contextmanager
    def profile(self, action: str) -> Iterator[None]:
        if not self.started:
            self.profiler.start()
            self.started = True
        yield

    def describe(self) -> None:
        if not self.started:
            return
        self.profiler.stop()
        self.directory.mkdir(parents=True, exist_ok=True)
        table = self.profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        (self.directory / "operators.txt").write_text(table + "\n")
        self.profiler.export_chrome_trace(str(self.directory / "trace.json"))
        self.started = False


def build_profiler(name: str | None, run_dir: Path, local_rank: int) -> Any:
    """The profiler ``trainer.profiler=<name>`` names (null: none); each has ``profile(action)`` and ``describe()``."""
    directory = run_dir / "profile"
    if name is None:
        return PassThroughProfiler()
    if name == "pytorch":
        return TorchProfiler(directory / f"rank{local_rank}")
    profiler = LIGHTNING[name](dirpath=directory, filename="steps")
    profiler.setup(stage="fit", local_rank=local_rank, log_dir=str(run_dir))
    return profiler
