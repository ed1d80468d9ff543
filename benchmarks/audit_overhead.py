"""Overhead of the training audit (audit=true) on the default run's step, as a ratio.

Usage: python benchmarks/audit_overhead.py [--steps 150] [--rounds 3] [--write docs/results.md] [hydra overrides...]

Both variants train the default recipe (DCGAN on digits) through the real training loop in this one
process, interleaved round by round so machine noise hits both alike; the figure is the ratio of
median step times (audited / plain).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gan.config.compose import compose  # noqa: E402
from gan.training.loop import train  # noqa: E402
from gan.training.observer import Observer  # noqa: E402
from tools.blocks import recipe_inputs, write_block  # noqa: E402

INPUTS = ["gan", *recipe_inputs("digits"), "benchmarks/audit_overhead.py"]  # a change: stale block


class StepTimes(Observer):
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
    parser.add_argument("--write", help="write the table into its generated block of this markdown file")
    args, overrides = parser.parse_known_args()
    plain, audited = [], []
    for _ in range(args.rounds):
        plain.append(median_step(overrides, False, args.steps))
        audited.append(median_step(overrides, True, args.steps))
    ratios = sorted(a / p for p, a in zip(plain, audited))
    lines = [f"The default recipe{' with ' + ' '.join(overrides) if overrides else ''}, {args.steps} steps a run "
             f"(the first 10 dropped), {args.rounds} rounds alternating plain and audited runs in one process; "
             f"median step time per run; {torch.get_num_threads()} threads.", "",
             "| round | plain | `audit=true` | overhead |", "|---|---|---|---|"]
    for k, (p, a) in enumerate(zip(plain, audited), 1):
        lines.append(f"| {k} | {p * 1e3:.2f} ms | {a * 1e3:.2f} ms | {(a / p - 1) * 100:+.1f} % |")
    lines.append(f"| **median of the rounds' ratios** | | | **{(statistics.median(ratios) - 1) * 100:+.1f} %** |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        command = "python benchmarks/audit_overhead.py " + " ".join(sys.argv[1:])
        write_block(args.write, "audit", text, command, INPUTS)
        print(f"wrote the table into {args.write}")


if __name__ == "__main__":
    main()
