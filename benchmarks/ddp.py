"""trainer=ddp's step time against the fallback it replaced, on 2 CPU processes (gloo).

Usage: python benchmarks/ddp.py [--rounds 7] [--steps 40] [hydra overrides...]

``ddp_separate`` (trainer=ddp: G and D in a DistributedDataParallel each, gan/strategy.py; each of the
step's two backwards all-reduces one network's gradients) against ``ddp_find_unused_parameters_true``
(trainer=ddp_find_unused: the whole module in one, which at every backward searches the autograd graph
for the parameters it will not reach and all-reduces both networks' gradients, zeros for those).

Each run is ``gan.training.train`` in a fresh pair of processes (Lightning's launcher starts rank 1 by
running this script again), on the default digits run unless overrides say otherwise. A round runs
both, back to back, the order reversed every other round; a run's figure is the median of rank 0's
step-to-step times after the warm-up steps. The comparison is the median over rounds of each round's
ratio: on shared cores the load drifts from minute to minute, and a round's two runs share most of it.
Beside it, the ratio of each strategy's fastest run, the one least slowed by other work.
On 2 CPU cores this measures the overheads of the two strategies, not a GPU cluster's scaling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from step import WARMUP, StepClock, compose_train, median_after_warmup

from gan.training import train

STRATEGIES = {"ddp_separate": "trainer=ddp", "ddp_find_unused_parameters_true": "trainer=ddp_find_unused"}


def run_once(trainer: str, steps: int, overrides: list[str], out: Path) -> None:
    """One 2-process training run (this process is one of its ranks); rank 0 writes its median step ms."""
    cfg = compose_train(trainer, "trainer.accelerator=cpu", "trainer.devices=2", f"trainer.max_steps={steps}",
                        *overrides, run_dir=out.parent / "run")
    clock = StepClock()
    module = train(cfg, [clock])
    if module.global_rank == 0:
        times = [(b - a) * 1e3 for a, b in zip(clock.ends, clock.ends[1:])]
        out.write_text(json.dumps(median_after_warmup(times)))


def measure(trainer: str, steps: int, overrides: list[str]) -> float:
    """Median step ms of a fresh 2-process run with ``trainer``."""
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

    results: dict[str, list[float]] = {name: [] for name in STRATEGIES}
    for round_ in range(args.rounds):
        for name in list(STRATEGIES)[:: -1 if round_ % 2 else 1]:
            results[name].append(measure(STRATEGIES[name], args.steps, overrides))
    print(f"2 CPU processes (gloo), torch {torch.__version__}; {args.steps} generator steps per run "
          f"(first {WARMUP} dropped), {args.rounds} rounds; overrides: {' '.join(overrides) or 'none'}")
    for name, values in results.items():
        print(f"  {name:<32} median step {statistics.median(values):7.2f} ms   (rounds: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    unused, separate = results["ddp_find_unused_parameters_true"], results["ddp_separate"]
    ratios = [u / s for u, s in zip(unused, separate)]
    print(f"ddp_find_unused_parameters_true / ddp_separate (above 1: trainer=ddp is faster): median of the "
          f"rounds' ratios {statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)}); "
          f"of each one's fastest run {min(unused) / min(separate):.3f}")

if __name__ == "__main__":
    main()
