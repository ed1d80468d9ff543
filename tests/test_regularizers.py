"""R1, LeCam and spectral norm change D's gradients exactly as their formulas say (float64, by hand)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from gan.losses import lecam_penalty, r1_penalty

X_REAL = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.0, -2.0]], dtype=torch.float64)
X_FAKE = torch.tensor([[0.5, 0.5], [2.0, -1.0], [-1.5, 1.0]], dtype=torch.float64)


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def test_r1_penalty_and_its_gradient_by_hand():
    # D(x) = w.x + c/2 |x|^2, so grad_x D = w + c x and R1 = mean_i |w + c x_i|^2.
    w = torch.tensor([0.3, -0.7], requires_grad=True)
    c = torch.tensor(0.4, requires_grad=True)
    x = X_REAL.clone().requires_grad_(True)
    logits = x @ w + c / 2 * x.pow(2).sum(1)
    penalty = r1_penalty(logits, x)
    g = w.detach() + c.detach() * X_REAL  # (N, 2)
    assert torch.allclose(penalty, g.pow(2).sum(1).mean())
    dw, dc = torch.autograd.grad(penalty, (w, c))
    assert torch.allclose(dw, 2 * g.mean(0))  # d/dw |w + c x|^2 = 2 (w + c x)
    assert torch.allclose(dc, 2 * (g * X_REAL).sum(1).mean())  # d/dc = 2 (w + c x) . x


def test_lecam_penalty_and_its_gradient_by_hand():
    # D(x) = w.x; anchors are constants (running means held in buffers).
    w = torch.tensor([0.5, -0.25], requires_grad=True)
    real_anchor, fake_anchor = torch.tensor(0.8), torch.tensor(-0.6)
    penalty = lecam_penalty(X_REAL @ w, X_FAKE @ w, real_anchor, fake_anchor)
    r, f = X_REAL @ w.detach(), X_FAKE @ w.detach()
    assert torch.allclose(penalty, (r - fake_anchor).pow(2).mean() + (f - real_anchor).pow(2).mean())
    (dw,) = torch.autograd.grad(penalty, w)
    expected = 2 * ((r - fake_anchor)[:, None] * X_REAL).mean(0) + 2 * ((f - real_anchor)[:, None] * X_FAKE).mean(0)
    assert torch.allclose(dw, expected)


def test_spectral_norm_output_and_gradient_by_hand():
    torch.manual_seed(0)
    layer = spectral_norm(nn.Linear(3, 2, bias=False), n_power_iterations=50)
    layer(torch.zeros(1, 3))  # training-mode call: power iterations converge u, v
    layer.eval()  # eval: u, v stay fixed, as constants of the formula
    sn = layer.parametrizations.weight[0]
    u, v = sn._u.clone(), sn._v.clone()
    assert "_u" in dict(sn.named_buffers()) and "_v" in dict(sn.named_buffers())
    w = layer.parametrizations.weight.original
    sigma = u @ w.detach() @ v
    assert torch.allclose(sigma, torch.linalg.matrix_norm(w.detach(), ord=2), rtol=1e-6)

    # f(W) = a . (W x / sigma(W)), sigma = u^T W v:
    # df/dW = a x^T / sigma - (a^T W x) / sigma^2 * u v^T
    a, x = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.0, -1.0])
    f = a @ layer(x[None])[0]
    assert torch.allclose(f, a @ (w.detach() @ x) / sigma)
    (dw,) = torch.autograd.grad(f, w)
    expected = torch.outer(a, x) / sigma - (a @ w.detach() @ x) / sigma**2 * torch.outer(u, v)
    assert torch.allclose(dw, expected)
