"""Each loss against values computed by hand, and the sign of its gradients."""

from __future__ import annotations

import math

import pytest
import torch

from gan.core.losses import LOSSES, get_loss, gradient_penalty
from gan.core.models import Condition
from gan.errors import ConfigError

REAL = torch.tensor([2.0, -1.0])
FAKE = torch.tensor([0.5, -3.0])


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# Expected (d_loss, g_loss) for REAL and FAKE, written out from each loss's formula.
HAND = {
    "nonsaturating": ((softplus(-2) + softplus(1)) / 2 + (softplus(0.5) + softplus(-3)) / 2,
                      (softplus(-0.5) + softplus(3)) / 2),
    "minimax": ((softplus(-2) + softplus(1)) / 2 + (softplus(0.5) + softplus(-3)) / 2,
                -(softplus(0.5) + softplus(-3)) / 2),
    # relu(1 - real): [0, 2] -> 1; relu(1 + fake): [1.5, 0] -> 0.75
    "hinge": (1.0 + 0.75, -(0.5 - 3.0) / 2),
    # 0.5 * mean((real - 1)^2) = 0.5 * (1 + 4) / 2; 0.5 * mean(fake^2) = 0.5 * (0.25 + 9) / 2
    "lsgan": (1.25 + 2.3125, 0.5 * ((0.5 - 1) ** 2 + (-3 - 1) ** 2) / 2),
    "wgan_gp": ((0.5 - 3.0) / 2 - (2.0 - 1.0) / 2, -(0.5 - 3.0) / 2),
    # pairs (2, 0.5) and (-1, -3): -log sigmoid(real - fake) = softplus(-(1.5)), softplus(-(2));
    # G's: -log sigmoid(fake - real) = softplus(1.5), softplus(2)
    "rpgan": ((softplus(-1.5) + softplus(-2.0)) / 2, (softplus(1.5) + softplus(2.0)) / 2),
}


def g_of(loss, fake, real):
    """G's loss: a relativistic loss also reads D's logits on the paired reals."""
    return loss.g(fake, real) if loss.relativistic else loss.g(fake)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_values_match_hand_computation(name):
    loss = get_loss(name)
    d_expected, g_expected = HAND[name]
    assert loss.d(REAL, FAKE).item() == pytest.approx(d_expected, rel=1e-6)
    assert g_of(loss, FAKE, REAL).item() == pytest.approx(g_expected, rel=1e-6)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_signs(name):
    """Descending the D loss raises D's score on real and lowers it on fake; descending the G loss
    raises D's score on fake. (Inputs are chosen inside every loss's active region.)"""
    real = torch.tensor([0.2, -0.3], requires_grad=True)
    fake = torch.tensor([0.1, 0.4], requires_grad=True)
    loss = get_loss(name)
    d_real, d_fake = torch.autograd.grad(loss.d(real, fake), (real, fake))
    assert (d_real < 0).all() and (d_fake > 0).all()
    (g_fake,) = torch.autograd.grad(g_of(loss, fake, real), fake)
    assert (g_fake < 0).all()


def test_rpgan_depends_only_on_each_pair_s_difference():
    """Relativistic: shifting every logit by the same amount changes neither loss, where the sigmoid loss moves."""
    rpgan, sigmoid = get_loss("rpgan"), get_loss("nonsaturating")
    assert rpgan.d(REAL + 7, FAKE + 7).item() == pytest.approx(rpgan.d(REAL, FAKE).item(), rel=1e-6)
    assert rpgan.g(FAKE + 7, REAL + 7).item() == pytest.approx(rpgan.g(FAKE, REAL).item(), rel=1e-6)
    assert sigmoid.d(REAL + 7, FAKE + 7).item() != pytest.approx(sigmoid.d(REAL, FAKE).item(), rel=1e-3)


def test_minimax_saturates_where_nonsaturating_does_not():
    """When D confidently rejects fakes (large negative logits) the minimax G gradient vanishes."""
    fake = torch.tensor([-10.0], requires_grad=True)
    (minimax,) = torch.autograd.grad(get_loss("minimax").g(fake), fake)
    (nonsat,) = torch.autograd.grad(get_loss("nonsaturating").g(fake), fake)
    assert abs(minimax.item()) < 1e-4 < abs(nonsat.item())


def test_gradient_penalty_of_a_linear_critic():
    """critic(x) = w.x has gradient w everywhere: the penalty is exactly (|w| - 1)^2, and it is
    differentiable with respect to w (create_graph=True)."""
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    penalty = gradient_penalty(lambda x: x @ w, torch.randn(8, 2), torch.randn(8, 2))
    assert penalty.item() == pytest.approx((5.0 - 1.0) ** 2)
    (dw,) = torch.autograd.grad(penalty, w)
    # d/dw (|w| - 1)^2 = 2 (|w| - 1) w / |w|
    assert torch.allclose(dw, 2 * 4.0 * w.detach() / 5.0)


def test_unknown_loss_is_a_config_error():
    with pytest.raises(ConfigError, match="loss=nonsaturating"):
        get_loss("nope")


def test_ac_gan_adds_the_class_cross_entropy_to_both_losses():
    """A classifying D's output is its real/fake logit, then class logits; here D passes its input through,
    so each row is what D says: real [2 | 1, -1] and fake [0.5 | 0, 3], both of class 0."""
    from gan.core.objective import Objective
    from gan.core.regularizers import build_regularizer

    objective = Objective(get_loss("nonsaturating"), build_regularizer({"name": "none"}),
                          condition=Condition("classes", 2), data_shape=(3,), classify=True)
    D, labels = torch.nn.Identity(), torch.tensor([0])
    real, fake = torch.tensor([[2.0, 1.0, -1.0]]), torch.tensor([[0.5, 0.0, 3.0]])
    d_loss, real_logits, fake_logits = objective.d_loss(D, real, fake, labels)
    # -log sigmoid(2) - log(1 - sigmoid(0.5)), then -log softmax(1, -1)[0] and -log softmax(0, 3)[0]
    assert d_loss.item() == pytest.approx(softplus(-2) + softplus(0.5) + softplus(-2) + softplus(3), rel=1e-6)
    assert real_logits.tolist() == [2.0] and fake_logits.tolist() == [0.5]  # what is logged: the real/fake logit
    # -log sigmoid(0.5), and D naming class 0 of the fake: -log softmax(0, 3)[0]
    assert objective.g_loss(D, fake, real, labels).item() == pytest.approx(softplus(-0.5) + softplus(3), rel=1e-6)


def test_rpgan_g_loss_reads_d_real_as_a_constant():
    """G's relativistic loss scores each fake against D's verdict on its paired real, computed under no_grad:
    G's gradient flows through D(fake) alone, and nothing reaches the data or keeps a graph back to it."""
    from gan.core.objective import Objective
    from gan.core.regularizers import build_regularizer

    objective = Objective(get_loss("rpgan"), build_regularizer({"name": "none"}))
    D = torch.nn.Flatten(0)  # D(x) = x: the logits are the inputs
    real = torch.tensor([[2.0], [-1.0]], requires_grad=True)  # as if it required grad: it must not get one
    fake = torch.tensor([[0.5], [-3.0]], requires_grad=True)
    loss = objective.g_loss(D, fake, real, None)
    assert loss.item() == pytest.approx((softplus(1.5) + softplus(2.0)) / 2, rel=1e-6)
    loss.backward()
    sigmoid = torch.sigmoid
    # d/dfake_i softplus(-(fake_i - real_i)) / 2 = -sigmoid(-(fake_i - real_i)) / 2
    expected = -sigmoid(torch.tensor([1.5, 2.0])) / 2
    assert torch.allclose(fake.grad.flatten(), expected)
    assert real.grad is None


def test_a_latent_code_adds_its_cross_entropy_on_fakes_only():
    """InfoGAN: D names G's code from G's sample; real data has no code, so D's loss has no term for it.
    D passes its input through: real [2 | 1, -1] and fake [0.5 | 0, 3], the fake made with code 1."""
    from gan.core.objective import Objective
    from gan.core.regularizers import build_regularizer

    objective = Objective(get_loss("nonsaturating"), build_regularizer({"name": "none"}),
                          condition=Condition("code", 2), data_shape=(3,), classify=True)
    D, codes = torch.nn.Identity(), torch.tensor([1])
    real, fake = torch.tensor([[2.0, 1.0, -1.0]]), torch.tensor([[0.5, 0.0, 3.0]])
    d_loss, _, _ = objective.d_loss(D, real, fake, codes)
    # -log sigmoid(2) - log(1 - sigmoid(0.5)), then -log softmax(0, 3)[1]; nothing for the real row's classes
    assert d_loss.item() == pytest.approx(softplus(-2) + softplus(0.5) + softplus(-3), rel=1e-6)
    # -log sigmoid(0.5), and D naming code 1 of the fake: -log softmax(0, 3)[1]
    assert objective.g_loss(D, fake, real, codes).item() == pytest.approx(softplus(-0.5) + softplus(-3), rel=1e-6)
