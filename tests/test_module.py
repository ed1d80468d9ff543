"""The training step's autograd split, observed on real steps of the real training loop."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import compose_config

from gan.core.contexts import evaluating, frozen
from gan.run.module import GANModule
from gan.training.loop import train
from gan.training.observer import Observer


def clone(tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    return {k: None if v is None else v.detach().clone() for k, v in tensors.items()}


class Watch(Observer):
    """Records G's and D's gradients and D's weights right before each optimizer step, and D's weights at the
    end of each generator step; ``prepare(module)`` runs once the module is built."""

    def __init__(self, prepare=lambda module: None) -> None:
        self.events: list[dict[str, Any]] = []
        self.prepare = prepare

    def on_start(self, run) -> None:
        self.module = run.module
        self.prepare(run.module)
        for optimizer in run.optimizers:
            optimizer.register_step_pre_hook(self.before_step)

    def before_step(self, optimizer, args, kwargs) -> None:
        module = self.module
        is_d = optimizer.param_groups[0]["params"][0] is next(module.D.parameters())
        self.events.append({
            "opt": "d" if is_d else "g",
            "g_grads": clone({n: p.grad for n, p in module.G.named_parameters()}),
            "d_grads": clone({n: p.grad for n, p in module.D.named_parameters()}),
            "d_weights": clone(dict(module.D.named_parameters())),
        })

    def on_step_end(self, run) -> None:
        self.events.append({"opt": "end", "d_weights": clone(dict(run.module.D.named_parameters()))})


def fit(tmp_path, steps: int, probes: list[Observer], *overrides: str) -> GANModule:
    """The real training loop on a tiny config, ``steps`` generator steps; the trained module."""
    return train(compose_config("debug=tiny", "audit=false", "trainer.enable_progress_bar=false",
                                f"trainer.max_steps={steps}", *overrides, run_dir=tmp_path), probes=probes).module


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (x is None and b[k] is None) or (x is not None and b[k] is not None and torch.equal(x, b[k]))
        for k, x in a.items())


@pytest.mark.parametrize("conditional", [[], ["model.conditional=true"],
                                         ["model.conditional=true", "model.d_condition=classifier"],
                                         ["model.codes=4"]],
                         ids=["unconditional", "labels into D", "D classifies", "latent code"])
def test_d_update_spares_g_and_g_update_spares_d(tmp_path, conditional):
    """The split holds for the conditional D too, whose input is torch.cat((condition, fake.detach()), 1),
    for AC-GAN's D, whose class prediction on fake.detach() is in D's loss and on fake in G's, and for
    InfoGAN's, which names G's latent code the same way."""
    # A layer frozen on purpose must stay frozen.
    probe = Watch(prepare=lambda module: module.D.net[0].weight.requires_grad_(False))
    module = fit(tmp_path, 2, [probe], *conditional)
    user_frozen = module.D.net[0].weight

    d1, g1, end1, d2, g2, end2 = probe.events
    assert [e["opt"] for e in probe.events] == ["d", "g", "end"] * 2
    # The D update leaves G's gradients untouched: None stays None on the first step ...
    assert all(v is None for v in d1["g_grads"].values())
    # ... and the previous G update's gradients are unchanged on the second.
    assert same(d2["g_grads"], g1["g_grads"])
    # D learns: every trainable D parameter has a gradient; the frozen one has none.
    assert all((v is None) == (n == "net.0.weight") for n, v in d1["d_grads"].items())
    # The G update gives D no gradient (D's grads are still those of its own update), G learns ...
    for d_event, g_event in ((d1, g1), (d2, g2)):
        assert same(g_event["d_grads"], d_event["d_grads"])
        assert all(v is not None for v in g_event["g_grads"].values())
    # ... and D's weights do not move during it.
    assert same(end1["d_weights"], g1["d_weights"]) and same(end2["d_weights"], g2["d_weights"])
    # frozen() restored every flag as it was, the user's frozen layer included.
    assert user_frozen.requires_grad is False
    assert all(p.requires_grad for n, p in module.D.named_parameters() if n != "net.0.weight")


class BatchLabels(Observer):
    """The labels of each batch the data hands the step; and G's own labels, from a forward pre-hook on G."""

    def __init__(self) -> None:
        self.labels: list[torch.Tensor] = []
        self.given: list[torch.Tensor] = []

    def on_start(self, run) -> None:
        run.module.G.register_forward_pre_hook(lambda _, args: self.given.append(args[1].clone()))

    def on_step_start(self, run, batch) -> None:
        self.labels.append(batch[1].clone())


def test_a_latent_code_is_drawn_at_each_step_not_read_from_the_data(tmp_path):
    """The ring's points carry their mode as a label: a code that were that label would tell G which mode
    to draw (class conditioning in disguise). G's codes are fresh uniform draws over the code's values."""
    batches = BatchLabels()
    fit(tmp_path, 3, [batches], "experiment=ring", "model.hidden=16", "model.codes=8", "log.sample_every=1000")
    given = batches.given
    assert len(given) == len(batches.labels) == 3  # one G forward per step (no sample grid before the end)
    for codes, data_labels in zip(given, batches.labels):
        assert codes.shape == data_labels.shape and 0 <= codes.min() and codes.max() < 8
        assert (codes == data_labels).float().mean() < 0.5  # chance agreement is 1/8
    assert not torch.equal(given[0], given[1])


def test_frozen_restores_each_flag():
    layer = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    layer[0].bias.requires_grad_(False)
    with frozen(layer):
        assert not any(p.requires_grad for p in layer.parameters())
        out = layer(torch.ones(1, 2, requires_grad=True))
        assert out.requires_grad  # gradients still flow *through* a frozen module
    assert [p.requires_grad for p in layer.parameters()] == [True, False, True, True]


def test_evaluating_restores_mixed_modes():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    net.train()
    net[1].eval()  # e.g. a BatchNorm the user keeps in eval mode
    with evaluating(net):
        assert not net.training and not net[0].training
    assert net.training and net[0].training and not net[1].training


# --- speed options: they change how the step runs, not what it computes -----------------------------------

def run_tiny(tmp_path, *overrides: str) -> GANModule:
    return train(compose_config("debug=tiny", "trainer.enable_progress_bar=false", "trainer.max_steps=2",
                                *overrides, run_dir=tmp_path)).module


def test_channels_last_puts_conv_weights_in_nhwc_and_trains(tmp_path):
    module = run_tiny(tmp_path, "data.channels_last=true")
    convs = [m.weight for net in (module.G, module.D) for m in net.modules()
             if isinstance(m, torch.nn.modules.conv._ConvNd)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert int(module.counters.g_updates) == 2


def test_bf16_autocast_trains_with_r1_double_backward(tmp_path):
    module = run_tiny(tmp_path, "trainer.precision=bf16-mixed", "reg=r1")
    assert int(module.counters.g_updates) == 2
    assert all(torch.isfinite(p).all() for p in module.D.parameters())


def test_compile_leaves_d_eager_when_its_loss_differentiates_it_twice(tmp_path):
    """Compiled graphs have no double backward: with R1, only G is compiled (and the run trains)."""
    module = run_tiny(tmp_path, "train.compile=true", "reg=r1")
    assert module.G._compiled_call_impl is not None and module.D._compiled_call_impl is None
    assert int(module.counters.g_updates) == 2
