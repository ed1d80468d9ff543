"""Claims about the GAN step: freezing D in the G update, detaching the fake in the D update, not reusing
D's logits across ``opt_d.step()``, and the conditional D input.

``freeze``, ``gan_d_step`` and ``conditional`` run the training step itself -- ``gan.core.step``'s
``generator_step``, ``d_update`` and ``g_update``, with the losses and critic of the GANModule train.py
builds in ``conditional`` -- so breaking gan/core/step.py breaks them (tests/test_patterns.py does).
``reuse_d_fake`` shows, on the same models, the PyTorch rule that makes the step compute a fresh
``D(fake)`` for the G loss.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode

from gan.core import step
from gan.core.contexts import frozen
from gan.core.models import condition_input
from gan.patterns.measure import (
    PYTORCH,
    STEP,
    Result,
    above,
    all_grads,
    below,
    contains,
    counted_flops,
    cuda_peak_bytes,
    median_ms,
    mib,
    no_grads,
    quote,
    raised,
    saved_bytes,
    state_tensors,
)
from gan.patterns.models import LOSS, adam, gan_inputs, make_gan, training_module
from gan.run.module import GANModule

# --- freezing with requires_grad_(False) ---------------------------------------------------------------


def freeze(device: torch.device, *, size: int = 32, width: int = 32, batch: int = 64,
           repeats: int = 31) -> Result:
    g, d = make_gan(device, size=size, width=width)
    z, real = gan_inputs(device, batch, size)

    # Fine-tuning: freeze D's body, train only its last convolution.
    head = [m for m in d.modules() if isinstance(m, nn.Conv2d)][-1]
    d.requires_grad_(False)
    head.requires_grad_(True)
    LOSS.d(d(real), d(g(z).detach())).backward()
    body = [p for p in d.parameters() if not any(p is q for q in head.parameters())]
    finetune_body_no_grad = all(p.grad is None for p in body)
    finetune_head_grad = all_grads(head)
    d.requires_grad_(True)
    d.zero_grad(set_to_none=True)

    # The G update of the training step (gan.core.step.g_update, which freezes D), against the same update
    # with D left trainable. SGD with lr 0: the weights stay as they are across repeats.
    opt_g = torch.optim.SGD(g.parameters(), lr=0.0)

    def g_loss(D: nn.Module, fake: Tensor, real: Tensor, labels: Tensor | None) -> Tensor:
        return LOSS.g(D(fake))

    def g_update(frozen_d: bool) -> Callable[[], object]:
        g.zero_grad(set_to_none=True)
        d.zero_grad(set_to_none=True)
        fake = g(z)  # G's forward is not part of the comparison
        if frozen_d:
            return partial(step.g_update, d, opt_g, g_loss, fake, real, None)

        def trainable() -> None:
            opt_g.zero_grad(set_to_none=True)
            g_loss(d, fake, real, None).backward()
            opt_g.step()
        return trainable

    flops_frozen = counted_flops(g_update(True))
    g_step_d_no_grad, g_step_g_grad = no_grads(d), all_grads(g)
    flops_trainable = counted_flops(g_update(False))
    trainable_d_grad = all_grads(d)
    ms = median_ms(device, repeats, frozen=lambda: g_update(True), trainable=lambda: g_update(False))
    values = {
        "finetune_body_no_grad": finetune_body_no_grad, "finetune_head_grad": finetune_head_grad,
        "g_step_d_no_grad": g_step_d_no_grad, "g_step_g_grad": g_step_g_grad,
        "trainable_d_grad": trainable_d_grad,
        "flops_frozen": flops_frozen, "flops_trainable": flops_trainable,
        "flop_ratio": flops_frozen / flops_trainable,
        "frozen_ms": ms["frozen"], "trainable_ms": ms["trainable"], "time_ratio": ms["frozen"] / ms["trainable"],
    }
    # Cost is judged by FLOPs, which are exact; the times are reported, not judged (a shared machine).
    expected = {"finetune_body_no_grad": True, "finetune_head_grad": True, "g_step_d_no_grad": True,
                "g_step_g_grad": True, "trainable_d_grad": True, "flop_ratio": below(1.0)}
    return Result(
        "freeze", STEP,
        "`requires_grad_(False)` (fine-tuning; the frozen D of the G step): frozen weights get no `.grad`, "
        "the rest still do, and the backward is cheaper",
        f"DCGAN {size}x{size}, width {width}, batch {batch}: fine-tune D's last conv only; the training "
        f"step's G update (`gan.core.step.g_update`, D frozen) vs the same update with D trainable, "
        f"median of {repeats}",
        f"fine-tune: body .grad None {finetune_body_no_grad}, head .grad set {finetune_head_grad}; G step: "
        f"D .grad None {g_step_d_no_grad} (set when trainable: {trainable_d_grad}), G .grad set "
        f"{g_step_g_grad}; G update {flops_frozen / 1e6:.1f} vs {flops_trainable / 1e6:.1f} MFLOP (ratio "
        f"{values['flop_ratio']:.2f}), {ms['frozen']:.1f} ms frozen vs {ms['trainable']:.1f} ms trainable "
        f"(ratio {values['time_ratio']:.2f})",
        values, expected)


# --- the D step three ways ----------------------------------------------------------------------------


D_STEP_VARIANTS = ("detach", "retain_graph", "neither")


def generator_step_variant(variant: str, g: nn.Module, d: nn.Module, z: Tensor, real: Tensor,
                           d_loss: step.DLoss) -> Callable[[], object]:
    """One generator step of ``variant``: ``detach`` is the training step itself
    (:func:`gan.core.step.generator_step`); the other two are built from its D and G updates for contrast:
    the D update on the undetached fake, with ``retain_graph=True`` or with neither."""
    opt_g, opt_d = adam(g), adam(d)

    def g_loss(D: nn.Module, fake: Tensor, real: Tensor, labels: Tensor | None) -> Tensor:
        return LOSS.g(D(fake))

    if variant == "detach":
        return partial(step.generator_step, g, d, opt_g, opt_d, [step.Batch(z, real, None)], d_loss, g_loss)

    def contrast() -> None:
        fake = g(z)
        backward = partial(Tensor.backward, retain_graph=variant == "retain_graph")
        step.d_update(d, opt_d, d_loss, real, fake, None, 0, backward)
        step.g_update(d, opt_g, g_loss, fake, real, None)
    return contrast


def plain_d_loss(d: nn.Module) -> step.DLoss:
    def d_loss(D: nn.Module, real: Tensor, fake: Tensor, labels: Tensor | None, k: int) -> tuple[Tensor, ...]:
        real_logits, fake_logits = D(real), D(fake)
        return LOSS.d(real_logits, fake_logits), real_logits, fake_logits
    return d_loss


def observed_step(variant: str, g: nn.Module, d: nn.Module, z: Tensor, real: Tensor) -> dict[str, Any]:
    """Runs one generator step of ``variant`` and records, right after D's backward (opt_d's pre-step
    hook), what it did to G and to the graphs; and D's weights after its update."""
    seen: dict[str, Any] = {}
    inner = plain_d_loss(d)

    def d_loss(D: nn.Module, real: Tensor, fake: Tensor, labels: Tensor | None, k: int) -> tuple[Tensor, ...]:
        seen["d_input_requires_grad"] = fake.requires_grad
        out = inner(D, real, fake, labels, k)
        seen["d_loss"] = out[0]
        return out

    run = generator_step_variant(variant, g, d, z, real, d_loss)
    g.register_forward_hook(lambda module, inputs, output: seen.__setitem__("fake", output))
    state = [*state_tensors(g, d), real, z]

    def after_d_backward() -> None:
        seen["g_grads_touched"] = not no_grads(g)
        seen["d_graph_bytes"] = saved_bytes(seen["d_loss"], exclude=state, stop_at=seen["fake"])
        seen["g_graph_bytes"] = saved_bytes(seen["fake"], exclude=state)

    def after_d_update() -> None:
        seen["d_weights"] = [p.detach().clone() for p in d.parameters()]

    def is_opt_d(optimizer: torch.optim.Optimizer) -> bool:
        return optimizer.param_groups[0]["params"][0] is next(d.parameters())

    # Global optimizer hooks: the step builds its own optimizers; only D's trigger a record.
    hooks = [register_optimizer_step_pre_hook(
                 lambda opt, *args: after_d_backward() if is_opt_d(opt) else None),
             register_optimizer_step_post_hook(
                 lambda opt, *args: after_d_update() if is_opt_d(opt) else None)]
    try:
        with FlopCounterMode(display=False) as flops:
            seen["g_step_error"] = raised(run)
    finally:
        for hook in hooks:
            hook.remove()
    seen["flops"] = flops.get_total_flops()
    return seen


def gan_d_step(device: torch.device, *, size: int = 32, width: int = 32, batch: int = 64,
               repeats: int = 31) -> Result:
    g0, d0 = make_gan(device, size=size, width=width)
    z, real = gan_inputs(device, batch, size)
    # Identical starting states and inputs for every variant.
    runs = {v: observed_step(v, copy.deepcopy(g0), copy.deepcopy(d0), z, real) for v in D_STEP_VARIANTS}

    def timed(variant: str) -> Callable[[], Callable[[], object]]:
        g, d = copy.deepcopy(g0), copy.deepcopy(d0)
        run = generator_step_variant(variant, g, d, z, real, plain_d_loss(d))
        return lambda: partial(raised, run)  # a broken step is reported by the verdict, not raised here

    ms = median_ms(device, repeats, detach=timed("detach"), retain_graph=timed("retain_graph"))
    peak = {v: cuda_peak_bytes(device, timed(v)()) for v in ("detach", "retain_graph")}
    a, b, c = (runs[v] for v in D_STEP_VARIANTS)
    values = {key: {v: runs[v][key] for v in D_STEP_VARIANTS}
              for key in ("g_grads_touched", "d_input_requires_grad", "d_graph_bytes", "g_graph_bytes",
                          "g_step_error", "flops")}
    values.update(
        flop_ratio=a["flops"] / b["flops"],
        d_weights_max_diff=max((x - y).abs().max().item() for x, y in zip(a["d_weights"], b["d_weights"])),
        step_ms=ms, cuda_peak_bytes=peak)
    expected = {
        "g_grads_touched": {"detach": False, "retain_graph": True, "neither": True},
        "d_input_requires_grad": {"detach": False, "retain_graph": True, "neither": True},
        # After D's backward: D's part of the graph is freed unless retained; G's part is still alive
        # for the G update -- except when the D backward ran through it and freed it (neither).
        "d_graph_bytes.detach": 0, "d_graph_bytes.retain_graph": above(0), "d_graph_bytes.neither": 0,
        "g_graph_bytes.detach": above(0), "g_graph_bytes.retain_graph": above(0), "g_graph_bytes.neither": 0,
        "g_step_error.detach": None, "g_step_error.retain_graph": None,
        "g_step_error.neither": contains("backward through the graph a second time"),
        "flop_ratio": below(1.0),  # (b)'s D backward also runs through G, for nothing
        "d_weights_max_diff": below(1e-6),  # one Adam step moves weights by ~2e-4
    }
    peak_text = ("" if device.type != "cuda" else
                 f" CUDA peak {mib(peak['detach'])} (a) vs {mib(peak['retain_graph'])} (b);")
    return Result(
        "gan_d_step", STEP,
        "the training step's D update on `fake.detach()` (a) leaves G alone and G's graph alive; (b) without "
        "detach it needs `retain_graph=True` and backprops into G for nothing; (c) with neither the G "
        "backward fails; (a) and (b) update D identically",
        f"(a) `gan.core.step.generator_step`, (b) and (c) its `d_update` on the undetached fake then its "
        f"`g_update`; DCGAN {size}x{size}, width {width}, batch {batch}, `nonsaturating` loss, Adam, identical "
        f"starting states; measured right after D's backward; step time median of {repeats}",
        f"G .grad set by the D update: (a) {a['g_grads_touched']}, (b) {b['g_grads_touched']}, (c) "
        f"{c['g_grads_touched']}; graph held after D's backward, D part / G part: (a) {mib(a['d_graph_bytes'])} / "
        f"{mib(a['g_graph_bytes'])}, (b) {mib(b['d_graph_bytes'])} / {mib(b['g_graph_bytes'])}, (c) "
        f"{mib(c['d_graph_bytes'])} / {mib(c['g_graph_bytes'])}; D weights (a) vs (b) max diff "
        f"{values['d_weights_max_diff']:.1e}; whole step {a['flops'] / 1e6:.1f} MFLOP (a) vs {b['flops'] / 1e6:.1f} "
        f"(b), {ms['detach']:.1f} ms vs {ms['retain_graph']:.1f} ms;{peak_text} G update: (a), (b) "
        f"{quote(a['g_step_error'])}, (c) {quote(c['g_step_error'], 70)}",
        values, expected)


# --- reusing D(fake) after opt_d.step() ---------------------------------------------------------------


def reuse_d_fake(device: torch.device) -> Result:
    g, d = make_gan(device)
    z, real = gan_inputs(device, 8)
    opt_d = adam(d)
    fake = g(z)
    fake_logits = d(fake)  # computed once, meant for both losses
    d_loss = LOSS.d(d(real), fake_logits)
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward(retain_graph=True)  # kept so that the G loss could reuse it
    last_weight = [m for m in d.modules() if isinstance(m, nn.Conv2d)][-1].weight
    version_before = last_weight._version
    opt_d.step()  # Adam updates D's weights in place, bumping their version counters
    version_after = last_weight._version

    with frozen(d):
        stale_error = raised(lambda: LOSS.g(fake_logits).backward())
        g.zero_grad(set_to_none=True)
        fresh_error = raised(lambda: LOSS.g(d(fake)).backward())
    values = {
        "weight_version": (version_before, version_after),
        "weight_version_bumped": version_after > version_before,
        "stale_error": stale_error,
        "fresh_error": fresh_error,
        "fresh_g_grads": all_grads(g),
    }
    expected = {"weight_version_bumped": True, "stale_error": contains("modified by an inplace operation"),
                "fresh_error": None, "fresh_g_grads": True}
    return Result(
        "reuse_d_fake", PYTORCH,
        "reusing `D(fake)` computed before `opt_d.step()` for the G loss fails; a fresh D forward works",
        "`logits = D(fake)`; D loss on them, backward(retain_graph=True), `opt_d.step()`; G loss on the "
        "same logits, then on a fresh `D(fake)`",
        f"D's last conv weight version {version_before} -> {version_after} after opt_d.step(); reused "
        f"logits: {quote(stale_error.split(' Hint:')[0], 200)}; fresh forward: {quote(fresh_error)}, G .grad set "
        f"{values['fresh_g_grads']}",
        values, expected)


# --- conditional discriminator input --------------------------------------------------------------


def gradient_split(module: GANModule, z: Tensor, real: Tensor, labels: Tensor | None) -> dict[str, bool]:
    """Who gets gradients in one training step of ``module`` (gan.core.step.generator_step, with the
    module's own losses and conditional critic), observed before each optimizer step."""
    g, d = module.G, module.D
    opt_g, opt_d = adam(g), adam(d)
    split: dict[str, bool] = {}
    d_grads: list[Tensor] = []

    def before_step(optimizer: torch.optim.Optimizer, *args: Any) -> None:
        if optimizer is opt_d:
            split.update(d_step_d_grads=all_grads(d), d_step_g_untouched=no_grads(g))
            d_grads.extend(p.grad.clone() for p in d.parameters())
        elif optimizer is opt_g:
            split.update(g_step_g_grads=all_grads(g), g_step_d_untouched=all(
                torch.equal(p.grad, before) for p, before in zip(d.parameters(), d_grads)))

    hook = register_optimizer_step_pre_hook(before_step)
    try:
        step.generator_step(g, d, opt_g, opt_d, [step.Batch(z, real, labels)], module.objective.d_loss,
                            module.objective.g_loss)
    finally:
        hook.remove()
    return split


def conditional(device: torch.device, *, num_classes: int = 10) -> Result:
    z, real = gan_inputs(device, 8)
    labels = torch.arange(8, device=device) % num_classes
    unconditional_split = gradient_split(training_module(device), z, real, None)
    module = training_module(device, num_classes)
    g, d = module.G, module.D
    condition = condition_input(labels, num_classes, tuple(real.shape[1:]))
    fake = g(z, labels)
    d_in = [m for m in d.modules() if isinstance(m, nn.Conv2d)][0].in_channels
    values = {
        "d_in_channels": d_in,
        "condition_requires_grad": condition.requires_grad,
        "d_step_input_requires_grad": torch.cat((condition, fake.detach()), dim=1).requires_grad,
        "g_step_input_requires_grad": torch.cat((condition, fake), dim=1).requires_grad,
        "unconditional": unconditional_split,
        "conditional": gradient_split(module, z, real, labels),
    }
    split_holds = {"d_step_d_grads": True, "d_step_g_untouched": True, "g_step_g_grads": True,
                   "g_step_d_untouched": True}
    expected = {"d_in_channels": 1 + num_classes, "condition_requires_grad": False,
                "d_step_input_requires_grad": False, "g_step_input_requires_grad": True,
                "unconditional": split_holds, "conditional": split_holds}
    split = ", ".join(f"{k} {v}" for k, v in values["conditional"].items())
    return Result(
        "conditional", STEP,
        "a conditional D input `torch.cat((condition, fake.detach()), 1)` in the D step and the undetached "
        "cat in the G step split gradients as in the unconditional case",
        f"the GANModule train.py builds, with `model.conditional=true` ({num_classes} classes) and without: "
        "one `gan.core.step.generator_step` with the module's own losses and critic",
        f"D in_channels {d_in}; requires grad: condition {values['condition_requires_grad']}, D-step cat "
        f"{values['d_step_input_requires_grad']}, G-step cat {values['g_step_input_requires_grad']}; "
        f"conditional split: {split}; same as unconditional "
        f"{values['conditional'] == values['unconditional']}",
        values, expected)
