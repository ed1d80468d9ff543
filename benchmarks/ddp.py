"""trainer=ddp's step time against the fallback it replaced, on 2 CPU processes (gloo).

Usage: python benchmarks/ddp.py [--rounds 7] [--steps 40] [hydra overrides...]

``ddp_separate`` (trainer=ddp: G and D in a DistributedDataParallel each, gan/training/loop.py; each of the
step's two backwards all-reduces one network's gradients) against ``ddp_find_unused_parameters_true``
(trainer=ddp_find_unused: each network's wrapper searches the autograd graph at every backward for the
parameters it will not reach, and broadcasts rank 0's buffers at every forward).

Each run is ``gan.training.loop.train`` in a fresh pair of processes (Fabric's launcher starts rank 1 by
running this script again), on the default digits run unless overrides say otherwise. A round runs
both, back to back, the order reversed every other round. A run's figures are medians over rank 0's
steps after the warm-up: wall time per step, and CPU time per step (its process's, all threads). On
shared cores the wall time also holds the waits for a core -- each collective needs both ranks
running -- so the CPU time, what the step itself costs, is the steadier comparison. Each comparison
is the median over rounds of each round's ratio: a round's two runs share most of the drifting load.
The collectives (calls and elements per step, every one of the run's, Lightning's own included) are
exact: counted by torch.profiler over a few steps after the timed ones.
On 2 CPU cores this measures the overheads of the two strategies, not a GPU cluster's scaling.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from step import WARMUP, compose_train, median_after_warmup

from gan.training.loop import train
from gan.training.observer import Observer

STRATEGIES = {"ddp_separate": "trainer=ddp", "ddp_find_unused_parameters_true": "trainer=ddp_find_unused"}
CLOCKS = ("wall", "cpu")
COUNTED = 5  # steps after the timed ones, run under torch.profiler to count the collectives


class Clocks(Observer):
    """Wall time and this process's CPU time at the end of each of the first ``timed`` generator steps;
    then the collectives of the next ``COUNTED`` steps, from torch.profiler's record of gloo's calls."""

    def __init__(self, timed: int) -> None:
        self.timed = timed
        self.ends: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)

    def on_step_start(self, run: Any, batch: Any) -> None:
        if run.module.counters.g == self.timed:
            self.profiler.start()

    def on_step_end(self, run: Any) -> None:
        step = run.module.counters.g
        if step <= self.timed:
            self.ends["wall"].append(time.perf_counter())
            self.ends["cpu"].append(time.process_time())
        elif step == self.timed + COUNTED:
            self.profiler.stop()

    def collectives(self) -> dict[str, list[float]]:
        """Per step: {collective: [calls, elements]}, e.g. {"all_reduce": [5.0, 398021.0]}."""
        found: dict[str, list[float]] = {}
        for event in self.profiler.events():
            if event.name.startswith("gloo:"):
                calls_elements = found.setdefault(event.name.removeprefix("gloo:"), [0.0, 0.0])
                calls_elements[0] += 1 / COUNTED
                calls_elements[1] += math.prod(event.input_shapes[0]) / COUNTED
        return found


def run_once(trainer: str, steps: int, overrides: list[str], out: Path) -> None:
    """One 2-process training run (this process is one of its ranks); rank 0 writes its figures."""
    cfg = compose_train(trainer, "trainer.accelerator=cpu", "trainer.devices=2",
                        f"trainer.max_steps={steps + COUNTED}", *overrides, run_dir=out.parent / "run")
    clocks = Clocks(steps)
    if train(cfg, [clocks]).zero:  # rank 0
        figures = {clock: median_after_warmup([(b - a) * 1e3 for a, b in zip(ends, ends[1:])])
                   for clock, ends in clocks.ends.items()}
        out.write_text(json.dumps({**figures, "collectives": clocks.collectives()}))


def measure(trainer: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    """A fresh 2-process run with ``trainer``: median wall and CPU ms per step, and its collectives."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "median_ms.json"
        subprocess.run([sys.executable, __file__, "--run", trainer, "--steps", str(steps), "--out", str(out),
                        *overrides], check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a worker: one run with this trainer config
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.run:
        run_once(args.run, args.steps, overrides, args.out)
        return

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in STRATEGIES}
    for round_ in range(args.rounds):
        for name in list(STRATEGIES)[:: -1 if round_ % 2 else 1]:
            runs[name].append(measure(STRATEGIES[name], args.steps, overrides))
    print(f"2 CPU processes (gloo), torch {torch.__version__}; {args.steps} generator steps per run "
          f"(first {WARMUP} dropped), {args.rounds} rounds; overrides: {' '.join(overrides) or 'none'}")
    for clock in CLOCKS:
        for name, figures in runs.items():
            values = [run[clock] for run in figures]
            print(f"  {clock:>4} ms per step  {name:<32} median {statistics.median(values):7.2f}   (rounds: "
                  f"{', '.join(f'{v:.2f}' for v in values)})")
    for name, figures in runs.items():  # the same in every round: the first round's
        counted = figures[0]["collectives"].items()
        print(f"  collectives per step  {name:<32} "
              + ", ".join(f"{op} {calls:.1f} ({elements:,.0f} elements)" for op, (calls, elements) in counted))
    for clock in CLOCKS:
        ratios = [u[clock] / s[clock] for u, s in zip(runs["ddp_find_unused_parameters_true"], runs["ddp_separate"])]
        print(f"{clock} time, ddp_find_unused_parameters_true / ddp_separate: {statistics.median(ratios):.3f} "
              f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)}; above 1: trainer=ddp is faster)")

if __name__ == "__main__":
    main()
