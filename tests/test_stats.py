"""Running statistics live in registered buffers: saved, moved, restored, never optimized."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import compose_config
from omegaconf import OmegaConf

from gan.core.models import g_condition
from gan.core.state import EMAGenerator, RunningMean, StepCounters
from gan.data.datasets import data_shape
from gan.run.build import build_module, build_optimizers
from gan.run.module import GANModule

FULL = ["debug=tiny", "augment=ada", "reg=lecam", "model.spectral_norm=true", "model.conditional=true"]


def build(*overrides: str) -> GANModule:
    cfg = compose_config(*FULL, *overrides)
    container = OmegaConf.to_container(cfg, resolve=True)
    return build_module(container, data_shape(container["data"]), g_condition(container["model"], 10))  # digits


def test_every_buffer_is_saved_and_never_optimized():
    module = build()
    buffers = dict(module.named_buffers())
    expected = {"counters.g_updates", "counters.d_updates", "counters.images_seen", "counters.skipped_g",
                "counters.skipped_d", "objective.d_real_mean.value", "objective.d_fake_mean.value",
                "objective.augment.p", "objective.augment.sign_sum", "sample_noise", "sample_labels"}
    assert expected <= set(buffers)
    assert any(name.startswith("D.") and name.endswith("_u") for name in buffers)  # spectral norm
    ema_weights = {n for n in buffers if n.startswith("ema.generator.")}
    assert {f"ema.generator.{n}" for n, _ in module.G.named_parameters()} <= ema_weights
    state = module.state_dict()
    # No buffer is persistent=False: each one is state a resumed run needs.
    assert set(buffers) <= set(state)
    trained = {id(p) for p in [*module.G.parameters(), *module.D.parameters()]}
    optimizers = build_optimizers(module, module.cfg["optim"], 1)[0]
    optimized = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    everything = {id(p) for p in module.parameters()}  # the EMA copy is not even a parameter
    for name, buffer in buffers.items():
        assert id(buffer) not in trained | optimized | everything, name
        assert not buffer.requires_grad, name
    assert optimized == trained


def test_buffers_follow_to():
    module = build().to(torch.float64)
    for name, buffer in module.named_buffers():
        if name.endswith(("g_updates", "d_updates", "images_seen", "skipped_g", "skipped_d", "count", "sign_count",
                          "num_updates", "sample_labels", "num_batches_tracked")):
            assert buffer.dtype == torch.int64, name  # integer counters stay integers
        else:
            assert buffer.dtype == torch.float64, name
    if torch.cuda.is_available():  # only on a machine with a GPU
        moved = module.to("cuda")
        assert all(b.is_cuda for b in moved.buffers())


def test_buffers_survive_save_and_load():
    module = build()
    with torch.no_grad():
        for i, buffer in enumerate(module.buffers()):
            buffer.add_(i + 1)  # distinct, non-initial values everywhere
    blob = io.BytesIO()
    torch.save(module.state_dict(), blob)
    blob.seek(0)
    fresh = build()
    fresh.load_state_dict(torch.load(blob, weights_only=True))
    for (name, a), (_, b) in zip(module.named_buffers(), fresh.named_buffers()):
        assert torch.equal(a, b), name


def test_counters_start_at_zero():
    counters = StepCounters()
    assert [int(b) for b in counters.buffers()] == [0, 0, 0, 0, 0]


def test_running_mean_starts_at_first_value_then_decays():
    mean = RunningMean(decay=0.9)
    no = torch.tensor(False)
    mean.update(torch.tensor(float("nan")), keep=no)  # refused before the first value: still no start
    assert (mean.value.item(), mean.count.item()) == (0.0, 0)
    mean.update(torch.tensor(3.0), keep=torch.tensor(True))
    assert mean.value.item() == 3.0  # set, not pulled from zero
    mean.update(torch.tensor(float("inf")), keep=no)
    assert (mean.value.item(), mean.count.item()) == (3.0, 1)
    mean.update(torch.tensor(13.0))
    assert mean.value.item() == pytest.approx(0.9 * 3.0 + 0.1 * 13.0) and mean.count.item() == 2


def test_ema_copies_during_warmup_then_averages_with_ramped_decay():
    g = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = EMAGenerator(g, decay=0.999, start=2)
    assert not list(ema.parameters())  # weights are buffers
    with torch.no_grad():
        g[0].weight.fill_(1.0)
        g[1].running_mean.fill_(5.0)
    ema.update(g, g_step=2)  # warm-up: a copy
    assert torch.equal(ema.generator[0].weight, g[0].weight)
    with torch.no_grad():
        g[0].weight.fill_(3.0)
    ema.update(g, g_step=3)  # first average: decay min(0.999, 1/10) = 0.1
    assert torch.allclose(ema.generator[0].weight, torch.full((2, 2), 0.1 * 1.0 + 0.9 * 3.0))
    assert torch.equal(ema.generator[1].running_mean, g[1].running_mean)  # BatchNorm stats: copied
    ema.update(g, g_step=4)  # second: min(0.999, 2/11)
    assert torch.allclose(ema.generator[0].weight, torch.full((2, 2), 2 / 11 * 2.8 + 9 / 11 * 3.0))


def test_ema_follows_its_buffers_through_to():
    """.to() replaces buffers (the average's weights among them): the update must average into the new ones."""
    g = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = EMAGenerator(g, decay=0.5)
    ema.update(g, g_step=1)  # the pairs of tensors are found here, before the move
    both = torch.nn.ModuleDict({"G": g, "ema": ema}).to(torch.float64)
    with torch.no_grad():
        g[0].weight.fill_(4.0), ema.generator[0].weight.fill_(2.0)
        g[1].running_mean.fill_(7.0)
    ema.update(both["G"], g_step=2)
    assert ema.generator[0].weight.dtype == torch.float64
    moved = 2.0 + (1 - 2 / 11) * (4.0 - 2.0)  # the ramp's second update: decay min(0.5, 2/11)
    assert torch.allclose(ema.generator[0].weight, torch.full((2, 2), moved, dtype=torch.float64))
    assert torch.equal(ema.generator[1].running_mean, torch.full((2,), 7.0, dtype=torch.float64))


def test_counter_mirrors_follow_counting_and_loading():
    counters = StepCounters()
    counters.count_d_step()
    counters.count_g_step(images=16)
    counters.count_skipped("D")
    assert (counters.g, counters.d) == (1, 1)
    assert [int(b) for b in counters.buffers()] == [1, 1, 16, 0, 1]
    fresh = StepCounters()
    fresh.load_state_dict(counters.state_dict())  # as Lightning does when it resumes
    assert (fresh.g, fresh.d) == (1, 1)
