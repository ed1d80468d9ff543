"""R1, R2, LeCam and spectral norm change D's gradients exactly as their formulas say (float64, by hand)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from gan.core.losses import get_loss
from gan.core.objective import Objective
from gan.core.regularizers import build_regularizer, lecam_penalty, r1_penalty
from gan.core.step import DUpdate

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


def test_r1r2_adds_r1_on_real_and_r2_on_fake_by_hand():
    # D(x) = w.x + c/2 |x|^2: grad_x D = w + c x, so R1 + R2 = mean_i |w + c x_i|^2 + mean_j |w + c y_j|^2.
    w, c = torch.tensor([0.3, -0.7]), torch.tensor(0.4)
    D = lambda x: x @ w + c / 2 * x.pow(2).sum(1)  # noqa: E731
    objective = Objective(get_loss("rpgan"), build_regularizer({"name": "r1r2", "gamma": 3.0, "every": 1}))
    fake = X_FAKE.clone()  # arrives detached, as the step passes it
    loss, real_logits, fake_logits = objective.d_loss(D, X_REAL, fake, None)
    rpgan = F.softplus(-(D(X_REAL) - D(X_FAKE))).mean()
    r1 = (w + c * X_REAL).pow(2).sum(1).mean()
    r2 = (w + c * X_FAKE).pow(2).sum(1).mean()
    assert torch.allclose(loss, rpgan + 3.0 / 2 * (r1 + r2))
    assert torch.allclose(real_logits, D(X_REAL)) and torch.allclose(fake_logits, D(X_FAKE))
    assert not fake.requires_grad  # R2's leaf is a copy: the caller's fake is left as it was


def test_r1r2_takes_both_input_gradients_in_one_inner_backward(monkeypatch):
    """Two calls of the autograd engine would pay its fixed cost twice a D update (on the 2D recipes, a
    fifth of the step's backward time): R1 and R2 come from one, and equal the two computed apart."""
    D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1), torch.nn.Flatten(0))
    real, fake = X_REAL.clone().requires_grad_(True), X_FAKE.clone().requires_grad_(True)
    apart = r1_penalty(D(real), real) + r1_penalty(D(fake), fake)
    calls = []
    engine = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: (calls.append(1), engine(*a, **k))[1])
    r1r2 = build_regularizer({"name": "r1r2", "gamma": 2.0, "every": 1})  # gamma / 2 = 1: the bare sum
    together = r1r2.penalty(0, real, D(real), fake, D(fake))
    assert len(calls) == 1 and torch.equal(together, apart)


def test_r1_alone_does_not_differentiate_d_with_respect_to_the_fakes():
    w = torch.tensor([0.3, -0.7])
    D = lambda x: x @ w + 0.2 * x.pow(2).sum(1)  # noqa: E731
    seen = []
    r1 = build_regularizer({"name": "r1", "gamma": 1.0, "every": 1})
    r1r2 = build_regularizer({"name": "r1r2", "gamma": 1.0, "every": 1})
    for reg in (r1, r1r2):
        Objective(get_loss("rpgan"), reg).d_loss(lambda x: (seen.append(x.requires_grad), D(x))[1], X_REAL,
                                                 X_FAKE.clone(), None)
    assert seen == [True, False, True, True]  # (real, fake) with R1, then with R1 + R2


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


# --- the penalties wired into D's loss (Objective.d_loss), against a known critic ------------------------------

W = torch.tensor([[0.6, -0.8]])  # |w| = 1.0: would zero the gradient penalty, so it is scaled below


def linear_critic():
    """D(x) = w . x: grad_x D(x) = w for every x, so each penalty has a closed form."""
    D = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Flatten(0))
    D[0].weight.data = (1.5 * W).to(torch.get_default_dtype())
    return D, D[0].weight.detach()[0]


def test_d_loss_adds_r1_with_gain_gamma_over_2_times_every_on_due_steps_only():
    objective = Objective(get_loss("nonsaturating"), build_regularizer({"name": "r1", "gamma": 2.0, "every": 4}))
    D, w = linear_critic()
    real, fake = X_REAL.to(w.dtype), X_FAKE.to(w.dtype)
    plain = F.softplus(-(real @ w)).mean() + F.softplus(fake @ w).mean()
    r1 = w.pow(2).sum()  # E|grad_x D|^2 = |w|^2
    loss, real_logits, fake_logits = objective.d_loss(D, real, fake, None, 0)  # D update 0: due
    assert torch.allclose(loss, plain + 2.0 / 2 * 4 * r1)
    assert torch.allclose(real_logits, real @ w) and torch.allclose(fake_logits, fake @ w)
    assert torch.allclose(objective.d_loss(D, real, fake, None, 1)[0], plain)  # update 1 of every 4: not due
    assert torch.allclose(objective.d_loss(D, real, fake, None, 8)[0], plain + 2.0 / 2 * 4 * r1)


def test_d_loss_adds_lecam_with_each_anchor_on_the_other_side_and_moves_no_statistic():
    objective = Objective(get_loss("hinge"), build_regularizer({"name": "lecam", "weight": 0.3}))
    D, w = linear_critic()
    real, fake = X_REAL.to(w.dtype), X_FAKE.to(w.dtype)
    r, f = real @ w, fake @ w
    objective.d_real_mean.value.fill_(2.0), objective.d_real_mean.count.fill_(5)
    objective.d_fake_mean.value.fill_(-3.0), objective.d_fake_mean.count.fill_(5)
    hinge = F.relu(1 - r).mean() + F.relu(1 + f).mean()
    lecam = (r - -3.0).pow(2).mean() + (f - 2.0).pow(2).mean()  # anchors: the means as they stand
    loss, real_logits, fake_logits = objective.d_loss(D, real, fake, None)
    assert torch.allclose(loss, hinge + 0.3 * lecam)
    swapped = (r - 2.0).pow(2).mean() + (f - -3.0).pow(2).mean()
    assert not torch.allclose(loss, hinge + 0.3 * swapped)  # the anchors' sides are distinguishable here
    assert objective.d_real_mean.value.item() == 2.0  # computing a loss moved nothing
    objective.observe(DUpdate(loss.detach(), real_logits.detach(), fake_logits.detach()))  # the explicit update
    assert torch.allclose(objective.d_real_mean.value, 2.0 + 0.01 * (r.mean() - 2.0))
    assert torch.allclose(objective.d_fake_mean.value, -3.0 + 0.01 * (f.mean() + 3.0))


def test_a_non_finite_d_update_moves_no_statistic():
    objective = Objective(get_loss("hinge"), build_regularizer({"name": "lecam", "weight": 0.3}))
    objective.d_real_mean.value.fill_(2.0), objective.d_real_mean.count.fill_(5)
    inf = torch.tensor([float("inf"), 1.0])
    objective.observe(DUpdate(torch.tensor(float("nan")), inf, torch.ones(2)))
    assert objective.d_real_mean.value.item() == 2.0 and objective.d_real_mean.count.item() == 5
    assert objective.d_fake_mean.count.item() == 0


def test_d_loss_adds_the_gradient_penalty_times_its_weight():
    objective = Objective(get_loss("wgan_gp"), build_regularizer({"name": "none"}), gp_weight=10.0)
    D, w = linear_critic()
    real, fake = X_REAL.to(w.dtype), X_FAKE.to(w.dtype)
    wasserstein = (fake @ w).mean() - (real @ w).mean()
    gp = (w.norm() - 1).pow(2)  # |grad D(x_hat)| = |w| = 1.5 at every interpolate
    loss, _, _ = objective.d_loss(D, real, fake, None)
    assert torch.allclose(loss, wasserstein + 10.0 * gp)


def test_penalties_under_a_loss_scale_equal_the_unscaled_ones():
    """float16 mixed precision scales the penalties' inner backward (against underflow) and divides the
    scale back out: the penalty and its gradient are those of the unscaled computation."""
    from gan.core.losses import gradient_penalty

    w = torch.tensor([0.3, -0.7], requires_grad=True)

    def penalties(scale):
        x = X_REAL.clone().requires_grad_(True)
        r1 = r1_penalty(x @ w + x.pow(2).sum(1), x, scale)
        torch.manual_seed(0)  # the same interpolates
        gp = gradient_penalty(lambda v: v @ w + v.pow(3).sum(1), X_REAL, X_FAKE, scale)
        return r1, gp, torch.autograd.grad(r1 + gp, w)[0]

    plain, scaled = penalties(None), penalties(torch.tensor(2.0**16))
    assert all(torch.allclose(a, b) for a, b in zip(plain, scaled))
