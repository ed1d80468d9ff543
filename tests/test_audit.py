"""The training audit: the real step passes it, and each planted violation is caught by name."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import compose_config

import gan.module
import gan.training
from gan.audit import AuditError, check_plain_numbers
from gan.module import GANModule
from gan.training import train


def tiny(tmp_path, *overrides: str):
    return compose_config("debug=tiny", "audit=true", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
                          *overrides, run_dir=tmp_path)


@pytest.mark.parametrize("overrides,d_steps", [
    (("loss=wgan_gp", "model.d_batchnorm=false"), 10),
    (("reg=r1", "reg.every=2", "augment=ada", "model.conditional=true", "model.spectral_norm=true"), 2),
    (("data=ring", "model.conditional=true", "loss=lsgan"), 2),
])
def test_the_real_step_passes_the_audit(tmp_path, overrides, d_steps):
    module = train(tiny(tmp_path, *overrides))
    assert int(module.counters.g_steps) == 2 and int(module.counters.d_steps) == d_steps


class MissingDetach(GANModule):
    """A user's step that forgets fake.detach() in the D update."""

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        real, y = batch
        fake = self.G(self.noise(len(real)), y)
        self.update_d(opt_d, real, fake, y)  # planted bug: should be fake.detach()


def test_missing_detach_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(gan.training, "GANModule", MissingDetach)
    with pytest.raises(AuditError, match=r"D update changed the gradient of G\.net\..*fake\.detach\(\)"):
        train(tiny(tmp_path))


def test_unfrozen_d_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(gan.module, "frozen", lambda *modules: contextlib.nullcontext())  # planted bug
    with pytest.raises(AuditError, match=r"G update gave D\.net\..* a gradient: D must be frozen"):
        train(tiny(tmp_path))


@pytest.mark.parametrize("ema", ["true", "false"])
def test_sampling_in_train_mode_under_grad_is_caught(tmp_path, monkeypatch, ema):
    # planted bug: sample without the evaluation context (train mode, grad enabled)
    monkeypatch.setattr(gan.module, "evaluating", lambda *modules: contextlib.nullcontext())
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

    monkeypatch.setattr(gan.module, "evaluating", eval_only)
    with pytest.raises(AuditError, match="attached to a graph"):
        train(tiny(tmp_path, "ema.enabled=false"))


def test_logged_values_must_be_plain_numbers():
    check_plain_numbers({"loss/d": 0.5, "count": 3})
    with pytest.raises(AuditError, match="'loss/g' is Tensor"):
        check_plain_numbers({"loss/g": torch.tensor(0.5, requires_grad=True)})
    with pytest.raises(AuditError, match="'loss/d' is float nan"):
        check_plain_numbers({"loss/d": float("nan")})
