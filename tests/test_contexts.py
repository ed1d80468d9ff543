"""gan/core/contexts.py's ``evaluating``: sampling and scoring leave every module exactly as they found it."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_config, eval_settings
from omegaconf import OmegaConf
from torch import nn

from gan.core.contexts import evaluating
from gan.core.models import UNCONDITIONAL
from gan.evaluation.features import FeatureExtractor
from gan.evaluation.metrics import ImageMetrics
from gan.evaluation.sampling import generate_samples, sample_and_score
from gan.run.build import build_module
from gan.run.module import GANModule


def state(module: nn.Module) -> dict[str, object]:
    """Everything sampling could disturb: values of all parameters and buffers (BatchNorm running
    statistics and num_batches_tracked included), every submodule's mode, every requires_grad flag."""
    return {
        "tensors": {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()},
        "modes": {name: m.training for name, m in module.named_modules()},
        "flags": {name: p.requires_grad for name, p in module.named_parameters()},
    }


def assert_same(before: dict, after: dict) -> None:
    assert before["tensors"].keys() == after["tensors"].keys()
    for key, value in before["tensors"].items():
        assert torch.equal(value, after["tensors"][key]), f"{key} changed"
    assert before["modes"] == after["modes"]
    assert before["flags"] == after["flags"]


def assert_no_graph(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert not t.requires_grad and t.grad_fn is None


def dcgan_module(ema: bool) -> GANModule:
    """A digits DCGAN (BatchNorm in G) whose BatchNorm statistics have moved off their initial values."""
    cfg = OmegaConf.to_container(compose_config("debug=tiny", f"ema.enabled={ema}"), resolve=True)
    module = build_module(cfg, (1, 16, 16), UNCONDITIONAL)
    module.G(torch.randn(8, module.z_dim))  # one train-mode forward: running stats and counters move
    return module


def test_evaluating_restores_mixed_modes_and_flags_even_after_an_error():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout(0.5))
    net.train()
    net[2].eval()  # a submodule a user put in eval mode on purpose
    net[0].bias.requires_grad_(False)  # a parameter a user froze on purpose
    before = state(net)
    with pytest.raises(ValueError), evaluating(net):
        assert not any(m.training for m in net.modules())
        assert not torch.is_grad_enabled()
        assert not any(p.requires_grad for p in net.parameters())
        out = net(torch.randn(4, 2))
        assert_no_graph(out)
        raise ValueError("sampling failed")
    assert_same(before, state(net))
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("ema", [False, True], ids=["G", "EMA generator"])
def test_evaluation_leaves_the_generator_bit_identical(ema):
    module = dcgan_module(ema)
    module.train()
    generator = module.sampling_generator
    assert any(isinstance(m, nn.BatchNorm2d) for m in generator.modules())
    before, before_g = state(generator), state(module.G)

    samples = generate_samples(module, 20, seed=0, batch_size=8)
    flat = FeatureExtractor("flat", nn.Flatten(), 256)
    metrics = ImageMetrics(flat)
    metrics.add_real(torch.rand(30, 1, 16, 16) * 2 - 1)
    scored, values = sample_and_score(module, metrics, eval_settings("num_samples=20", "batch_size=8"), seed=0)

    assert_same(before, state(generator))
    assert_same(before_g, state(module.G))
    assert samples.shape == (20, 1, 16, 16) and torch.equal(samples, scored)  # same seed, same samples
    assert_no_graph(samples, scored, flat(samples))
    assert all(isinstance(v, float) for k, v in values.items() if k != "features")


def test_the_check_catches_sampling_in_train_mode():
    """The comparison above is not vacuous: one careless train-mode forward is caught."""
    module = dcgan_module(ema=False)
    before = state(module.G)
    module.G(torch.randn(4, module.z_dim))
    with pytest.raises(AssertionError, match="running_mean changed"):
        assert_same(before, state(module.G))
