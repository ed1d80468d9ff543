"""Overhead of the training audit (audit=true) on the default run's step, as a ratio.

Usage: python benchmarks/audit_overhead.py [--steps 150] [--rounds 3] [hydra overrides...]

Both variants train the default model (DCGAN on digits) with a real Lightning Trainer in this one
process, interleaved round by round so machine noise hits both alike; the figure is the ratio of
median step times (audited / plain).
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from omegaconf import OmegaConf

from gan.data.datasets import data_shape
from gan.data.module import GANDataModule
from gan.training.audit import AutogradAudit
from gan.training.compose import compose
from gan.training.module import GANModule


class StepTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self.start)


def median_step(cfg, audit: bool, steps: int) -> float:
    container = OmegaConf.to_container(cfg, resolve=True) | {"audit": audit}
    module = GANModule(container, data_shape(container["data"]))
    data = GANDataModule(container["data"], cfg.train.batch_size, cfg.train.d_steps, cfg.seed)
    timer = StepTimer()
    trainer = L.Trainer(max_steps=steps * (cfg.train.d_steps + 1), accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[timer] + ([AutogradAudit()] if audit else []))
    trainer.fit(module, datamodule=data)
    return statistics.median(timer.times[10:])  # skip warm-up steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args, overrides = parser.parse_known_args()
    cfg = compose(*overrides)
    plain, audited = [], []
    for _ in range(args.rounds):
        plain.append(median_step(cfg, False, args.steps))
        audited.append(median_step(cfg, True, args.steps))
    p, a = statistics.median(plain), statistics.median(audited)
    print(f"machine: {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"median step, plain:   {p * 1e3:.2f} ms")
    print(f"median step, audited: {a * 1e3:.2f} ms")
    print(f"audit overhead: {(a / p - 1) * 100:+.1f}% of step time (ratio {a / p:.3f})")


if __name__ == "__main__":
    main()
