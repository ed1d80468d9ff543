"""The training audit: the real step passes it, and each planted violation is caught by name."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import compose_config
from mutation import D_NOT_FROZEN, NO_G_STEP, NO_ZERO_GRAD_G, WITHOUT_DETACH, mutated_step
from torch import nn

import gan.core.step
import gan.run.build
import gan.run.module
import gan.training.assemble
import gan.training.loop
from gan.core.audit import AuditError, Snapshot, check_plain_numbers
from gan.core.models import UNCONDITIONAL
from gan.core.objective import Objective
from gan.run.build import build_module
from gan.training.autograd_audit import expected_to_change, first_changed_grad, grad_versions
from gan.training.loop import train


def tiny(tmp_path, *overrides: str):
    return compose_config("debug=tiny", "audit=true", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
                          *overrides, run_dir=tmp_path)


@pytest.mark.parametrize("overrides,d_steps", [
    (("loss=wgan_gp", "model.d_batchnorm=false"), 10),
    (("reg=r1", "reg.every=2", "augment=ada", "model.conditional=true", "model.spectral_norm=true"), 2),
    (("experiment=ring", "model.codes=0", "model.conditional=true", "loss=lsgan"), 2),
    (("loss=rpgan", "reg=r1r2", "reg.every=2"), 2),  # G's loss runs D on the reals too, under no_grad
])
def test_the_real_step_passes_the_audit(tmp_path, overrides, d_steps):
    module = train(tiny(tmp_path, *overrides)).module
    assert int(module.counters.g_updates) == 2 and int(module.counters.d_updates) == d_steps


def test_missing_detach_is_caught(tmp_path):
    with mutated_step(*WITHOUT_DETACH), pytest.raises(
            AuditError, match=r"D update changed the gradient of G\.net\..*fake\.detach\(\)"):
        train(tiny(tmp_path))


def test_unfrozen_d_is_caught(tmp_path):
    with mutated_step(*D_NOT_FROZEN), pytest.raises(
            AuditError, match=r"G update gave D\.net\..* a gradient: D must be frozen"):
        train(tiny(tmp_path))


def test_gradients_accumulated_across_steps_are_caught(tmp_path):
    # Without opt_g.zero_grad, the second G backward would add to the first step's gradients.
    with mutated_step(*NO_ZERO_GRAD_G), pytest.raises(
            AuditError, match=r"G\.net\..* already holds a gradient before the G backward"):
        train(tiny(tmp_path))


def test_a_d_buffer_changed_in_the_g_update_is_caught(tmp_path, monkeypatch):
    """Planted: a G loss that also writes one of D's buffers (one that no forward of D updates)."""
    build_models, g_loss = gan.run.build.build_models, Objective.g_loss

    def with_buffer(*args, **kwargs):
        G, D = build_models(*args, **kwargs)
        D.register_buffer("calls", torch.zeros(()))
        return G, D

    def touching_d(self, D, fake, real, labels):
        D.calls += 1
        return g_loss(self, D, fake, real, labels)

    monkeypatch.setattr(gan.run.build, "build_models", with_buffer)
    monkeypatch.setattr(Objective, "g_loss", touching_d)
    with pytest.raises(AuditError, match=r"G update changed D\.calls"):
        train(tiny(tmp_path))


def test_a_g_weight_the_g_update_leaves_without_a_gradient_is_caught(tmp_path, monkeypatch):
    """Planted: a parameter of G that G's forward never uses, so the G loss cannot reach it."""
    build_models = gan.run.build.build_models

    def with_unused_weight(*args, **kwargs):
        G, D = build_models(*args, **kwargs)
        G.register_parameter("unused", nn.Parameter(torch.zeros(3)))
        return G, D

    monkeypatch.setattr(gan.run.build, "build_models", with_unused_weight)
    with pytest.raises(AuditError, match=r"^G update left G\.unused with no gradient"):
        train(tiny(tmp_path))


def adam(parameters):
    """An optimizer as configs/optim/adam.yaml builds one."""
    return torch.optim.Adam(parameters, lr=2e-4, betas=(0.5, 0.999))


def planted_optimizers(monkeypatch, change):
    """The loop's build_optimizers with ``change(module, [opt_g, opt_d])`` applied to what it returns."""
    build = gan.training.assemble.build_optimizers

    def changed(module, optim, max_steps):
        optimizers, schedules = build(module, optim, max_steps)
        return change(module, optimizers) or optimizers, schedules

    monkeypatch.setattr(gan.training.assemble, "build_optimizers", changed)


@pytest.mark.parametrize("index,network", [(0, "G"), (1, "D")])
def test_an_update_that_moves_no_weight_is_caught(tmp_path, monkeypatch, index, network):
    """Planted: a learning rate of 0 (the checks refuse one in the config; a schedule could reach it)."""
    def zero_lr(module, optimizers):
        for group in optimizers[index].param_groups:
            group["lr"] = 0.0

    planted_optimizers(monkeypatch, zero_lr)
    with pytest.raises(AuditError, match=rf"^the {network} update moved none of {network}'s weights \(learning rate "
                                         r"\[0\.0\]\)"):
        train(tiny(tmp_path))


def test_an_optimizer_that_holds_the_other_networks_weights_is_caught(tmp_path, monkeypatch):
    """Planted: D's optimizer built over D's parameters and G's first."""
    def with_a_g_weight(module, optimizers):
        return [optimizers[0], adam([*module.D.parameters(), next(module.G.parameters())])]

    planted_optimizers(monkeypatch, with_a_g_weight)
    with pytest.raises(AuditError, match=r"^D's optimizer holds G\.net\.\d+\.weight, which is not D's"):
        train(tiny(tmp_path))


def test_an_optimizer_that_misses_a_weight_of_its_network_is_caught(tmp_path, monkeypatch):
    """Planted: D's optimizer built without D's last parameter, which then gets gradients and never moves."""
    def without_the_last(module, optimizers):
        return [optimizers[0], adam(list(module.D.parameters())[:-1])]

    planted_optimizers(monkeypatch, without_the_last)
    with pytest.raises(AuditError, match=r"^D's optimizer does not hold D\.net\.\d+\.bias: the D update cannot "
                                         "move it"):
        train(tiny(tmp_path))


def test_optimizers_stepped_in_the_other_networks_update_are_caught(tmp_path, monkeypatch):
    """Planted: the step handed G's optimizer as D's and D's as G's."""
    generator_step = gan.core.step.generator_step

    def swapped(G, D, opt_g, opt_d, *args, **kwargs):
        return generator_step(G, D, opt_d, opt_g, *args, **kwargs)

    monkeypatch.setattr(gan.core.step, "generator_step", swapped)
    with pytest.raises(AuditError, match=r"^G's optimizer stepped in the D update"):
        train(tiny(tmp_path))


def test_an_update_whose_optimizer_never_steps_is_caught(tmp_path):
    with mutated_step(*NO_G_STEP), pytest.raises(
            AuditError, match=r"^G's optimizer stepped 0 times in a generator step, not 1"):
        train(tiny(tmp_path))


def test_a_training_forward_in_eval_mode_is_caught(tmp_path, monkeypatch):
    """Planted: D 'frozen' for the G update by eval() as well, so G is judged by another function than D is
    trained as (BatchNorm with its running statistics)."""
    frozen = gan.core.step.frozen

    @contextlib.contextmanager
    def frozen_in_eval_mode(*modules):
        for m in modules:
            m.eval()
        with frozen(*modules):
            yield
        for m in modules:
            m.train()

    monkeypatch.setattr(gan.core.step, "frozen", frozen_in_eval_mode)
    with pytest.raises(AuditError, match=r"^D\.<root> ran a training forward in eval mode \(phase g_forward\)"):
        train(tiny(tmp_path))


def test_a_generator_left_in_eval_mode_is_caught(tmp_path, monkeypatch):
    """Planted: a training step that leaves G in eval mode (as sampling code that forgot to restore it would)."""
    run_step = gan.training.loop.run_step

    def g_in_eval_mode(run, *args):
        run.module.G.eval()
        return run_step(run, *args)

    monkeypatch.setattr(gan.training.loop, "run_step", g_in_eval_mode)
    with pytest.raises(AuditError, match=r"^G\.<root> ran a training forward in eval mode \(phase g_forward\)"):
        train(tiny(tmp_path))


def test_buffers_the_g_update_may_change_are_exactly_batchnorm_and_spectral_norm(tmp_path):
    """The policy docs/design.md states: in the G update D runs in train mode, so its BatchNorm running
    statistics and spectral-norm vectors may move -- they do, and nothing else of D does. (A vector
    that has converged stays put: the last layer's, whose weight has a single row.)"""
    from omegaconf import OmegaConf

    from gan.core import step

    cfg = compose_config("debug=tiny", "model.spectral_norm=true", run_dir=tmp_path)
    module = build_module(OmegaConf.to_container(cfg, resolve=True), (1, 16, 16), UNCONDITIONAL)
    allowed = expected_to_change(module.D)
    assert {"net.3.running_mean", "net.3.running_var", "net.3.num_batches_tracked"} <= allowed
    assert {"net.0.parametrizations.weight.0._u", "net.0.parametrizations.weight.0._v"} <= allowed
    before = {n: b.clone() for n, b in module.D.named_buffers()}
    opt_g = torch.optim.Adam(module.G.parameters())
    real = torch.randn(8, 1, 16, 16)
    step.g_update(module.D, opt_g, module.objective.g_loss, module.G(torch.randn(8, module.z_dim)), real, None)
    changed = {n for n, b in module.D.named_buffers() if not torch.equal(b, before[n])}
    assert changed <= allowed
    assert {"net.3.running_mean", "net.3.running_var", "net.3.num_batches_tracked",
            "net.0.parametrizations.weight.0._u", "net.0.parametrizations.weight.0._v"} <= changed


@pytest.mark.parametrize("ema", ["true", "false"])
def test_sampling_in_train_mode_under_grad_is_caught(tmp_path, monkeypatch, ema):
    # planted bug: sample without the evaluation context (train mode, grad enabled)
    monkeypatch.setattr(gan.run.module, "evaluating", lambda *modules: contextlib.nullcontext())
    with pytest.raises(AuditError, match=r"sampling changed generator\..*running_mean"):
        train(tiny(tmp_path, f"ema.enabled={ema}"))


def test_sampling_that_returns_a_graph_is_caught(tmp_path, monkeypatch):
    # planted bug: eval mode (buffers safe) but autograd on: the samples carry a graph
    @contextlib.contextmanager
    def eval_only(*modules):
        for m in modules:
            m.eval()
        yield
        for m in modules:
            m.train()

    monkeypatch.setattr(gan.run.module, "evaluating", eval_only)
    with pytest.raises(AuditError, match="attached to a graph"):
        train(tiny(tmp_path, "ema.enabled=false"))


def test_logged_values_must_be_plain_numbers():
    check_plain_numbers({"loss/d": 0.5, "count": 3})
    with pytest.raises(AuditError, match="'loss/g' is Tensor"):
        check_plain_numbers({"loss/g": torch.tensor(0.5, requires_grad=True)})
    with pytest.raises(AuditError, match="'loss/d' is float nan"):
        check_plain_numbers({"loss/d": float("nan")})


def test_a_backward_into_a_recorded_gradient_is_named_without_copying_it():
    """The D update's check on G's gradients reads identities and version counters: a backward that adds to
    an existing gradient (a second step without detach) or creates one is caught; no backward is not."""
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    net(x).sum().backward()
    recorded = grad_versions(list(net.named_parameters()))
    assert first_changed_grad(recorded, list(net.named_parameters())) is None
    net(x).sum().backward()  # accumulates in place into every .grad
    assert first_changed_grad(recorded, list(net.named_parameters())) == "0.weight"
    net.zero_grad(set_to_none=True)
    recorded = grad_versions(list(net.named_parameters()))
    net[1](torch.randn(2, 4)).sum().backward()  # only the second layer gets a gradient
    assert first_changed_grad(recorded, list(net.named_parameters())) == "1.weight"


def test_a_snapshot_finds_the_first_tensor_that_changed():
    weights = {"w": torch.randn(3, 2), "b": None, "n": torch.zeros((), dtype=torch.long), "v": torch.randn(4)}
    kept = Snapshot(weights)
    assert kept.first_difference(weights) is None and not kept.moved(weights)
    weights["v"].add_(1.0)
    assert kept.first_difference(weights) == "v" and kept.moved(weights)  # a copy, not the tensor itself
    kept.take(weights)  # the new values copied in
    assert kept.first_difference(weights) is None
    weights["n"].add_(1)  # another dtype, kept in its own buffer
    assert kept.first_difference(weights) == "n"
    kept.take(weights)
    assert kept.first_difference({**weights, "b": torch.zeros(1)}) == "b"  # None -> tensor
    assert kept.first_difference({**weights, "w": weights["w"].reshape(2, 3)}) == "w"  # same values, new shape
    weights["w"][0, 0] = float("nan")
    kept.take(weights)
    assert kept.first_difference(weights) is None  # NaN equals NaN: a skipped update leaves NaN where it was
