"""No host read inside the training step, counted on any machine.

On a GPU, every time the host reads a value computed on the device (``.item()``, ``float(t)``, ``bool(t)``,
``if t:``, ``.tolist()``, ``.numpy()``) it waits for every kernel queued before it: the step then runs at
the pace of the slowest round trip instead of keeping the device busy. Such reads are the same calls on a
CPU, so they can be counted here: ``.item()`` and its kin dispatch ``aten._local_scalar_dense`` (seen by a
``TorchDispatchMode``), and ``.tolist()`` / ``.numpy()`` are counted where they are called. Adam's own
step counters would add reads of host tensors (which do not wait for a GPU); the recipes use fused Adam,
whose counters live on the device and are never read.

Counted over real training runs of every recipe, per generator step, from one step's start to the next
(its callbacks included): zero on a step that logs nothing; on a logging step, one read of all logged
values together (a health check's figures among them), plus the non-finite guard's one read of its verdict
for the window (gan/training/guard.py). The health check's judge then reads its own state, registered
buffers that stay on the host (it is no part of the module Fabric moves), which waits for no device:
counted apart ("judge"), on checks only.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from typing import Any

import pytest
import torch
from conftest import TINY, compose_config
from torch.utils._python_dispatch import TorchDispatchMode

from gan.training.loop import train
from gan.training.observer import Observer

LOG_EVERY = 3
STEPS = 7


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor values, each under the name of whoever made it: "guard" for the
    non-finite guard's verdict, "other" for everything else."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def record(self) -> None:
        frames = "".join(traceback.format_stack(limit=25))
        self.counts["guard" if "gan/training/guard.py" in frames else "judge" if "gan/core/health.py" in frames
                    else "other"] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record()
        return func(*args, **(kwargs or {}))


class CountPerStep(Observer):
    """One HostReads per generator step, from its batch start to the next one's, the last step's to its end (callbacks
    included)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode: HostReads | None = None
        self.per_step: list[Counter[str]] = []
        for name in ("tolist", "numpy"):  # reads that dispatch no op on a CPU
            original = getattr(torch.Tensor, name)

            def counted(tensor: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if self.mode is not None:
                    self.mode.record()
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def close(self) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.per_step.append(self.mode.counts)
            self.mode = None

    def on_step_start(self, *args: Any) -> None:
        self.close()
        self.mode = HostReads()
        self.mode.__enter__()

    def on_step_end(self, run: Any) -> None:
        if run.module.counters.g == run.config["trainer"]["max_steps"]:  # the last step's window ends with it
            self.close()


RECIPES = {
    "digits (DiffAugment, LeCam, EMA)": ["experiment=digits"],
    "ring (RpGAN, R1 + R2, linear decay)": ["experiment=ring", "model.hidden=16"],
    "R1, latent code": ["experiment=ring", "model.hidden=16", "reg=r1", "model.codes=8"],
    "ADA": ["augment=ada", "augment.interval=2"],
    "EMA off": ["ema.enabled=false"],
    "wgan_gp, 5 D updates": ["loss=wgan_gp"],
    "conditional": ["model.conditional=true"],
    "AC-GAN": ["model.conditional=true", "model.d_condition=classifier"],
    "resnet, AC-GAN": ["model=resnet", "model.width=4", "model.cardinality=2", "model.conditional=true",
                       "model.d_condition=classifier"],
    "skip_nonfinite": ["train.skip_nonfinite=true"],
    # Its figures join the logging step's one read.
    "health check at every logging step, memorisation measured": ["health.every=3", "data.limit=40"],
}


@pytest.mark.parametrize("overrides", RECIPES.values(), ids=RECIPES.keys())
def test_a_step_reads_nothing_from_the_device_and_a_logging_step_reads_once(tmp_path, monkeypatch, overrides):
    cfg = compose_config(*TINY, *overrides, f"trainer.max_steps={STEPS}", f"log.every={LOG_EVERY}",
                         "log.sample_every=1000", "checkpoint.every=1000", "audit=false", run_dir=tmp_path)
    counter = CountPerStep(monkeypatch)
    train(cfg, probes=[counter])
    assert len(counter.per_step) == STEPS
    for step, counts in enumerate(counter.per_step, start=1):
        if step % LOG_EVERY and step != STEPS:  # the last step logs too
            assert counts == Counter(), f"generator step {step} read the device: {dict(counts)}"
        elif "health.every=3" not in overrides:
            assert counts["judge"] == 0, f"logging step {step}: {dict(counts)} (no health check due)"
        else:
            assert counts["other"] == 1, f"logging step {step}: {dict(counts)} (one read of all logged values)"
            assert counts["guard"] <= 1, f"logging step {step}: {dict(counts)}"


def test_the_counter_sees_each_kind_of_read(monkeypatch):
    """The counting itself: every way a value reaches Python is seen (else the test above could not fail)."""
    counter = CountPerStep(monkeypatch)
    counter.on_step_start()
    t = torch.ones(3)
    t.sum().item(), float(t[0]), bool(t[1] > 0), t.tolist(), t.numpy()  # noqa: B018
    counter.close()
    assert counter.per_step == [Counter(other=5)]


class GPUProbes(Observer):
    """Counts NVML device queries (torch.cuda's ``_raw_device_count_nvml``) inside each training step."""

    def __init__(self) -> None:
        self.calls = 0

    def count(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_raw_device_count_nvml":
            self.calls += 1

    def on_step_start(self, *args: Any) -> None:
        sys.setprofile(self.count)

    def on_step_end(self, *args: Any) -> None:
        sys.setprofile(None)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="the claim is about machines without a GPU")
def test_a_step_without_a_gpu_does_not_query_nvml(tmp_path, monkeypatch):
    """Importing Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1, under which every torch.cuda.is_available()
    (Adam asks at each step) loads NVML again until CUDA is initialised, which a CPU run never does."""
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as `import lightning` leaves it
    probes = GPUProbes()
    cfg = compose_config(*TINY, "trainer.max_steps=3", run_dir=tmp_path)
    train(cfg, probes=[probes])
    assert probes.calls == 0, f"{probes.calls} NVML queries in 3 generator steps"
