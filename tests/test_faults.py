"""Divergence: a non-finite loss or gradient stops the run, or, with train.skip_nonfinite, skips that update.
Real runs, real checkpoints."""

from __future__ import annotations

import math
import re

import lightning as L
import pytest
import torch
from conftest import TINY, compose_config, read_events, run_train

from gan.errors import RunError
from gan.training import train

# Adam moves every weight of D by about lr in its first step: D's next outputs, and its loss, overflow.
DIVERGING = ["optim.d.lr=1e10", "checkpoint.every=1"]
NONFINITE = re.compile(r"error: generator step (\d+), (D|G) update: the loss is (nan|inf) \(forward\); stopped before "
                       r"that update, so the last checkpoint holds the last good state: resume from it with lower "
                       r"learning rates \(optim\.d\.lr, optim\.g\.lr\) or a regularizer \(e\.g\. reg=r1\), or set "
                       r"train\.skip_nonfinite=true to skip such updates")


def finite_weights(state: dict[str, torch.Tensor]) -> bool:
    """G's and D's weights are finite. (Not every buffer: D's BatchNorm variance overflows as D's weights grow,
    while its loss, computed with the batch's own statistics, is still finite.)"""
    return all(torch.isfinite(t).all() for k, t in state.items() if k.endswith((".weight", ".bias")))


def test_a_nonfinite_loss_stops_the_run_within_its_step_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_train(run, *DIVERGING) == 1
    error = NONFINITE.fullmatch(capsys.readouterr().err.strip().splitlines()[-1])
    assert error, "not the one line expected"
    step = int(error[1])
    assert step > 1  # a checkpoint was written before
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert int(last["counters.g_steps"]) == step - 1 and finite_weights(last)
    assert not (run / "checkpoints" / f"step_{step:06d}.ckpt").exists()


class NonfiniteGradient(L.Callback):
    """Puts inf into one of G's gradients at generator step 2, after the backward and before the module's
    check (callbacks' hooks run first): the loss stays finite."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if pl_module.counters.g == 1 and optimizer is trainer.optimizers[0]:
            next(pl_module.G.parameters()).grad.view(-1)[0] = math.inf


def test_nonfinite_gradients_with_a_finite_loss_name_the_backward(tmp_path):
    cfg = compose_config(*TINY, "checkpoint.every=1", run_dir=tmp_path / "run")
    with pytest.raises(RunError, match=r"^generator step 2, G update: the gradients are not finite, the loss is "
                                       r"[-0-9.e]+ \(backward\); stopped before that update"):
        train(cfg, extra_callbacks=[NonfiniteGradient()])
    assert int(torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
               ["state_dict"]["counters.g_steps"]) == 1
    # Skipped instead: that G update only.
    cfg = compose_config(*TINY, "train.skip_nonfinite=true", run_dir=tmp_path / "skipping")
    module = train(cfg, extra_callbacks=[NonfiniteGradient()])
    assert (int(module.counters.skipped_g), int(module.counters.skipped_d), module.counters.g) == (1, 0, 6)


def test_skipped_updates_are_counted_per_network_and_survive_resume(tmp_path):
    # The audit refuses a non-finite logged value, which a skipped update's loss is.
    skip = [*DIVERGING, "train.skip_nonfinite=true", "checkpoint.every=3", "audit=false"]
    assert run_train(tmp_path / "straight", *skip) == 0
    assert run_train(tmp_path / "first", *skip, "trainer.max_steps=3") == 0
    assert run_train(tmp_path / "second", *skip, f"ckpt_path={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}") == 0
    counts = {}
    for run in ("straight", "first", "second"):
        state = torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        counts[run] = int(state["counters.skipped_d"]), int(state["counters.skipped_g"])
        assert finite_weights(state)  # no skipped update reached the weights
    assert counts["first"][0] > 0  # updates were skipped before the checkpoint the second run resumed from
    assert counts["second"] == counts["straight"]  # and counted on from there
    logged = read_events(tmp_path / "second" / "tensorboard").Scalars("train/skipped_d")
    assert [e.step for e in logged] == [4, 5, 6] and logged[-1].value == counts["straight"][0]
