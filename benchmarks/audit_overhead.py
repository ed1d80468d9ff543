"""Overhead of the training audit (audit=true) on the default run's step, as a ratio.

Usage: python benchmarks/audit_overhead.py [--steps 150] [--rounds 3] [hydra overrides...]

Both variants train the default recipe (DCGAN on digits) through the real training loop in this one
process, interleaved round by round so machine noise hits both alike; the figure is the ratio of
median step times (audited / plain).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gan.training.compose import compose
from gan.training.loop import Probe, train


class StepTimes(Probe):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_start(self, *args: object) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, *args: object) -> None:
        self.times.append(time.perf_counter() - self.start)


def median_step(overrides: list[str], audit: bool, steps: int) -> float:
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(*overrides, f"audit={str(audit).lower()}", f"trainer.max_steps={steps}",
                      "trainer.enable_progress_bar=false", "log.sample_every=100000", "checkpoint.every=100000",
                      run_dir=Path(tmp) / "run")
        train(cfg, [timer])
    return statistics.median(timer.times[10:])  # skip warm-up steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args, overrides = parser.parse_known_args()
    plain, audited = [], []
    for _ in range(args.rounds):
        plain.append(median_step(overrides, False, args.steps))
        audited.append(median_step(overrides, True, args.steps))
    p, a = statistics.median(plain), statistics.median(audited)
    print(f"machine: {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"median step, plain:   {p * 1e3:.2f} ms")
    print(f"median step, audited: {a * 1e3:.2f} ms")
    print(f"audit overhead: {(a / p - 1) * 100:+.1f}% of step time (ratio {a / p:.3f})")


if __name__ == "__main__":
    main()
