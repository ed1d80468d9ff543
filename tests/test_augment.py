"""Differentiable augmentation: gradients reach the input, and ADA's p follows D's overfitting."""

from __future__ import annotations

import pytest
import torch

from gan.core.augment import Augment, build_augment
from gan.errors import ConfigError


@pytest.mark.parametrize("operation", ["translation", "cutout", "color"])
def test_each_operation_is_differentiable(operation):
    augment = Augment([operation], p=1.0).double()

    def seeded(x):
        torch.manual_seed(0)  # the same random draw on every call, as gradcheck requires
        return augment(x)

    x = torch.rand(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(seeded, (x,), eps=1e-6, atol=1e-5)
    out = seeded(x)
    assert out.shape == x.shape and not torch.equal(out, x)  # p = 1 changes the images


def test_p_zero_is_the_identity_and_keeps_the_graph():
    x = torch.rand(4, 1, 8, 8, requires_grad=True)
    out = Augment(["translation", "cutout", "color"], p=0.0)(x)
    assert torch.equal(out, x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, torch.ones_like(x))


def test_ada_p_rises_when_d_overfits_and_falls_when_it_does_not():
    ada = Augment(["translation"], p=0.5, adaptive=True, target=0.6, interval=4, speed_images=1000)
    ada.accumulate(torch.full((64,), 3.0))  # D sure every real image is real: r_t = 1 > 0.6
    ada.adjust(batch_size=64)
    assert ada.p.item() == pytest.approx(0.5 + 64 * 4 / 1000)
    assert ada.sign_count.item() == 0  # accumulators reset after each adjustment
    for _ in range(10):
        ada.accumulate(torch.tensor([1.0, -1.0, -1.0, 1.0]))  # r_t = 0 < 0.6
        ada.adjust(batch_size=64)
    assert ada.p.item() == 0.0  # clamped at zero


def test_fixed_augmentation_does_not_adapt():
    diff = Augment(["color"], p=1.0, adaptive=False)
    diff.accumulate(torch.ones(8))
    diff.adjust(batch_size=8)
    assert diff.p.item() == 1.0


def test_config_errors():
    with pytest.raises(ConfigError, match="augment.policy"):
        Augment(["rotate"])
    with pytest.raises(ConfigError, match=r"not 2D points: use augment=none \(data=ring or data=grid alone"):
        build_augment({"name": "diff", "policy": ["color"], "p": 1.0, "adaptive": False}, (2,))
