"""Measured demonstrations of the autograd patterns this project relies on: ``python -m gan.patterns``.

Each claim is one function ``name(device, ...) -> Result`` that runs it -- most on the project's own
models, a few on plain tensors -- and returns what it measured and what the claim expects; the verdict
compares the two (:class:`Result`).
The claims about the GAN step run the training step itself (``gan.core.step``: ``generator_step``,
``d_update``, ``g_update``; ``conditional`` runs the GANModule that train.py builds), so breaking the
step breaks them (tests/test_patterns.py shows it). ``tests/test_patterns.py`` asserts every verdict;
``main`` prints every result as one row of a markdown table (``--only NAME`` for one row, ``--device
cuda`` on a GPU). ``timing`` and ``non_blocking`` are about CUDA and are skipped on a CPU.
``python -m gan.patterns graph [--out DIR]`` draws the autograd graphs of one training step instead
(gan/core/graphs.py).

How things are measured:

* time: the median of repeated runs, variants interleaved so that a busy machine slows them alike;
  synchronized on CUDA, where kernels run asynchronously (claim ``timing``). On a CPU, times are
  reported but no verdict depends on them: a shared machine makes small margins meaningless;
* work: FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` (convolutions and matmuls) --
  exact and repeatable, so verdicts about cost use them;
* memory on the CPU, which has no peak-allocation counter: the bytes of tensors autograd saves for
  backward, counted as they are saved (:func:`packed_bytes`) or found by walking a graph
  (:func:`saved_bytes`); on CUDA also ``torch.cuda.max_memory_allocated`` above the memory in use
  before the step.
"""

from __future__ import annotations

import copy
import io
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn
from torch.autograd import Variable
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode

from gan.core import step
from gan.core.contexts import evaluating, frozen
from gan.core.graphs import reachable, saved_tensors
from gan.core.losses import get_loss
from gan.core.models import DCGANDiscriminator, MLPDiscriminator, build_models, condition_input
from gan.training.builder import build_module
from gan.training.compose import compose
from gan.training.module import GANModule

Z_DIM = 16
SIZE = 16  # image side of the small models most demonstrations use
LOSS = get_loss("nonsaturating")  # the default loss of configs/train.yaml


@dataclass(frozen=True)
class Check:
    """An expectation other than equality: ``test(value)`` must hold; ``text`` says what it asks."""

    text: str
    test: Callable[[Any], bool]

    def __repr__(self) -> str:
        return self.text


def below(limit: float) -> Check:
    return Check(f"< {limit:g}", lambda v: v < limit)


def above(limit: float) -> Check:
    return Check(f"> {limit:g}", lambda v: v > limit)


def contains(text: str) -> Check:
    return Check(f"an error containing {text!r}", lambda v: isinstance(v, str) and text in v)


def approx(expected: list[float], tolerance: float = 1e-6) -> Check:
    return Check(f"{expected} within {tolerance:g}",
                 lambda v: len(v) == len(expected) and all(abs(a - b) <= tolerance for a, b in zip(v, expected)))


def lookup(values: dict[str, Any], path: str) -> Any:
    """``values["a"]["b"]`` for the path ``"a.b"``."""
    for key in path.split("."):
        values = values[key]
    return values


@dataclass
class Result:
    """One row of the table: what was measured (``values``) and what the claim says it must be
    (``expected``: a value path mapped to the value it must equal, or a :class:`Check`). The verdict
    compares the two; the tests assert that verdict, so the claim's numbers are written here once."""

    name: str
    claim: str
    ran: str
    measured: str
    values: dict[str, Any]
    expected: dict[str, Any] | None  # None: the claim needs a GPU and this run has none

    def failures(self) -> list[str]:
        """Each expectation the measurement did not meet, as ``path: measured X, expected Y``."""
        out = []
        for path, want in (self.expected or {}).items():
            got = lookup(self.values, path)
            if not (want.test(got) if isinstance(want, Check) else got == want):
                out.append(f"{path}: measured {got!r}, expected {want!r}")
        return out

    @property
    def ok(self) -> bool | None:
        return None if self.expected is None else not self.failures()

    @property
    def verdict(self) -> str:
        if self.ok is None:
            return "skipped (CPU)"
        return "holds" if self.ok else "DOES NOT HOLD: " + "; ".join(self.failures())


# --- shared helpers ----------------------------------------------------------------------------------


def make_gan(device: torch.device, *, size: int = SIZE, width: int = 8, num_classes: int = 0,
             seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """The project's DCGAN (G, D) for 1-channel ``size`` x ``size`` images, identical for equal seeds."""
    with torch.random.fork_rng(devices=[]):  # seeded weights without resetting the caller's RNG
        torch.manual_seed(seed)
        g, d = build_models({"name": "dcgan", "width": width}, Z_DIM, (1, size, size), num_classes)
    return g.to(device), d.to(device)


def gan_inputs(device: torch.device, batch: int, size: int = SIZE, seed: int = 1) -> tuple[Tensor, Tensor]:
    """Noise for G and a stand-in batch of "real" images in [-1, 1]; equal seeds give equal tensors."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, Z_DIM, generator=generator)
    real = torch.rand(batch, 1, size, size, generator=generator) * 2 - 1
    return z.to(device), real.to(device)


def move_target(device: torch.device) -> torch.device | torch.dtype:
    """Where the ``.to()`` demonstrations move things: the GPU when there is one, else float64.

    A dtype change follows the same rules as a device change (new tensor; module moved in place), so
    the CPU can show them too.
    """
    return device if device.type == "cuda" else torch.float64


def placed(t: Tensor, target: torch.device | torch.dtype) -> bool:
    return t.device.type == target.type if isinstance(target, torch.device) else t.dtype == target


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(device: torch.device, repeats: int, **variants: Callable[[], Callable[[], object]]
              ) -> dict[str, float]:
    """Median milliseconds of each variant over ``repeats`` rounds, after one warm-up round.

    A variant is a function that prepares a run untimed (e.g. builds the graph a backward needs) and
    returns the step to time. Rounds interleave the variants, so load on a shared machine hits all alike.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(repeats + 1):
        for name, prepare in variants.items():
            step = prepare()
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if round_:  # round 0 warms up allocator and caches
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def cuda_peak_bytes(device: torch.device, step: Callable[[], object]) -> int | None:
    """Peak CUDA memory ``step()`` allocates above what was in use before it; None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before






def saved_bytes(output: Tensor, exclude: Iterable[Tensor] = (), stop_at: Tensor | None = None) -> int:
    """Bytes of the tensors ``output``'s graph still holds for backward, found by walking the graph
    (a freed graph counts 0). Each storage counts once. Storages of ``exclude`` (weights, buffers,
    inputs: they exist with or without a graph) do not count, nor does the graph below ``stop_at``.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    stop = stop_at.grad_fn if stop_at is not None else None
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for node in reachable([output.grad_fn], stop) for t in saved_tensors(node)}
    return sum(n for ptr, n in storages.items() if ptr not in skip)


def packed_bytes(step: Callable[[], object], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``step()`` runs, counted at the moment
    they are saved (``torch.autograd.graph.saved_tensors_hooks``); each storage once, ``exclude``'s
    storages (weights, inputs) not at all."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def versions_around_inplace_edit(t: Tensor) -> tuple[int, int]:
    """``t._version`` before and after one in-place op: autograd's record of in-place edits."""
    before = t._version
    t.add_(0)
    return before, t._version


def counted_flops(step: Callable[[], object]) -> int:
    """FLOPs of the convolutions and matmuls ``step()`` runs."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def state_tensors(*modules: nn.Module) -> list[Tensor]:
    return [t for m in modules for t in (*m.parameters(), *m.buffers())]


def raised(step: Callable[[], object]) -> str | None:
    """The error ``step()`` raised, as ``Type: message``; None when it ran."""
    try:
        step()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def quote(error: str | None, limit: int = 90) -> str:
    """An error message cut to fit a table cell."""
    if error is None:
        return "no error"
    line = error.splitlines()[0]
    return f'"{line[:limit]}..."' if len(line) > limit else f'"{line}"'


def all_grads(module: nn.Module) -> bool:
    return all(p.grad is not None for p in module.parameters())


def no_grads(module: nn.Module) -> bool:
    return all(p.grad is None for p in module.parameters())


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.2f} MiB"


# --- 1. .to() / .cuda() / .cpu() ----------------------------------------------------------------------


def to_device(device: torch.device) -> Result:
    target = move_target(device)
    t = torch.ones(3)
    moved = t.to(target)

    _, d = make_gan(torch.device("cpu"))
    d.threshold = torch.zeros(1)  # a plain tensor attribute: not registered, so .to() never sees it
    params_before = list(d.parameters())
    optimizer = torch.optim.SGD(d.parameters(), lr=0.1)  # built before the move, as is common
    batchnorm = next(m for m in d.modules() if isinstance(m, nn.BatchNorm2d))
    running_mean = batchnorm.running_mean
    returned = d.to(target)

    values = {
        "tensor_new_object": moved is not t,
        "tensor_original_unchanged": not placed(t, target),
        "tensor_moved": placed(moved, target),
        "tensor_no_op_is_self": t.to(t.device) is t and t.cpu() is t,
        "module_returns_self": returned is d,
        "same_parameter_objects": all(a is b for a, b in zip(params_before, d.parameters())),
        "parameters_moved": all(placed(p, target) for p in d.parameters()),
        "optimizer_sees_moved": all(placed(p, target) for p in optimizer.param_groups[0]["params"]),
        "float_buffers_moved": all(placed(b, target) for b in d.buffers() if b.is_floating_point()),
        "buffer_new_object": batchnorm.running_mean is not running_mean,
        # A dtype cast converts floating-point tensors only; a device move takes every buffer.
        "integer_buffer_moved": placed(batchnorm.num_batches_tracked, target),
        "plain_attribute_moved": placed(d.threshold, target),
    }
    expected = {name: True for name in values}
    # A dtype cast converts floating-point tensors only; a device move takes every buffer. A plain
    # attribute is never moved.
    expected.update(integer_buffer_moved=device.type == "cuda", plain_attribute_moved=False)
    return Result(
        "to_device",
        "`.to()`/`.cuda()`/`.cpu()` return a new tensor when they convert (the tensor itself when nothing "
        "changes), but move a module's parameters and buffers in place -- not its plain tensor attributes",
        f"`t.to({target})`; DCGANDiscriminator with a plain `threshold` tensor, `D.to({target})`",
        f"tensor: new object {values['tensor_new_object']}, original unchanged "
        f"{values['tensor_original_unchanged']}, no-op `.to()`/`.cpu()` returns self "
        f"{values['tensor_no_op_is_self']}; module: same Parameter objects "
        f"{values['same_parameter_objects']}, moved {values['parameters_moved']} (an optimizer built "
        f"before sees them moved: {values['optimizer_sees_moved']}), floating-point buffers moved "
        f"{values['float_buffers_moved']} (as new tensors: {values['buffer_new_object']}), integer buffer "
        f"`num_batches_tracked` moved {values['integer_buffer_moved']}, plain attribute moved "
        f"{values['plain_attribute_moved']}",
        values, expected)


# --- 2. requires_grad propagation ----------------------------------------------------------------------


def requires_grad(device: torch.device) -> Result:
    g, _ = make_gan(device)
    z, _ = gan_inputs(device, 4)
    w = torch.ones(3, device=device, requires_grad=True)
    x = torch.ones(3, device=device)
    values = {
        "one_input_requires": (w * x + x).requires_grad,
        "no_input_requires": (x * 2 + x).requires_grad,
        "z_requires": z.requires_grad,
        "g_output_requires": g(z).requires_grad,  # z does not, G's weights do
    }
    with frozen(g):
        values["frozen_g_output_requires"] = g(z).requires_grad  # now no input does
    expected = {"one_input_requires": True, "no_input_requires": False, "z_requires": False,
                "g_output_requires": True, "frozen_g_output_requires": False}
    return Result(
        "requires_grad",
        "a result requires grad if any input does, and not if none does",
        "`w * x + x` (only w requires grad), `x * 2 + x`; G(z) with G's weights trainable, then `frozen(G)`",
        f"w*x+x: {values['one_input_requires']}, x*2+x: {values['no_input_requires']}; z: "
        f"{values['z_requires']}, G(z): {values['g_output_requires']}, G(z) with G frozen: "
        f"{values['frozen_g_output_requires']}",
        values, expected)


# --- 3. freezing with requires_grad_(False) ---------------------------------------------------------------


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

    def g_loss(D: nn.Module, fake: Tensor, labels: Tensor | None) -> Tensor:
        return LOSS.g(D(fake))

    def g_update(frozen_d: bool) -> Callable[[], object]:
        g.zero_grad(set_to_none=True)
        d.zero_grad(set_to_none=True)
        fake = g(z)  # G's forward is not part of the comparison
        if frozen_d:
            return partial(step.g_update, d, opt_g, g_loss, fake, None)

        def trainable() -> None:
            opt_g.zero_grad(set_to_none=True)
            g_loss(d, fake, None).backward()
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
        "freeze",
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


# --- 4. volatile is gone --------------------------------------------------------------------------------


def volatile(device: torch.device) -> Result:
    _, d = make_gan(device)
    _, real = gan_inputs(device, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = Variable(real, volatile=True)  # before PyTorch 0.4, the way to say "build no graph"
        volatile_flag = x.volatile
    with torch.no_grad():
        no_grad_out = d(real)
    values = {
        "warnings": [str(w.message) for w in caught],
        "variable_is_plain_tensor": type(x) is Tensor,
        "volatile_flag": volatile_flag,
        "volatile_output_requires_grad": d(x).requires_grad,
        "no_grad_output_requires_grad": no_grad_out.requires_grad,
    }
    expected = {"warnings": Check("a warning that volatile was removed",
                                  lambda ws: any("volatile was removed" in w for w in ws)),
                "variable_is_plain_tensor": True, "volatile_flag": False,
                "volatile_output_requires_grad": True, "no_grad_output_requires_grad": False}
    return Result(
        "volatile",
        "`volatile` is gone; `torch.no_grad()` replaces it",
        "`Variable(real, volatile=True)` into D; the same batch into D under `torch.no_grad()`",
        f"warning {quote(values['warnings'][0] if values['warnings'] else None)}; Variable returns a plain "
        f"Tensor {values['variable_is_plain_tensor']}, `.volatile` {volatile_flag}; D(volatile input) "
        f"requires grad {values['volatile_output_requires_grad']} (no effect); under no_grad "
        f"{values['no_grad_output_requires_grad']}",
        values, expected)


# --- 5. detach() and detach_() ------------------------------------------------------------------------------


def detach(device: torch.device) -> Result:
    g, _ = make_gan(device)
    z, _ = gan_inputs(device, 4)
    fake = g(z)
    alias = fake.detach()
    values = {
        "same_storage": alias.data_ptr() == fake.data_ptr(),
        "detached_requires_grad": alias.requires_grad,
        "original_requires_grad": fake.requires_grad,
    }
    fake.mean().backward()
    values["original_backprops"] = all_grads(g)
    # Edited only now: Tanh saved `fake` for the backward above, and the alias shares its version
    # counter, so an earlier in-place edit would have made that backward fail.
    alias[0].fill_(0.0)
    values["edit_visible"] = bool((fake[0] == 0).all())

    in_place = g(z)
    in_place.detach_()
    values["detach__grad_fn_none"] = in_place.grad_fn is None
    values["detach__is_leaf"] = in_place.is_leaf
    values["detach__requires_grad"] = in_place.requires_grad
    expected = {name: True for name in values}
    expected["detached_requires_grad"] = expected["detach__requires_grad"] = False
    return Result(
        "detach",
        "`detach()` shares storage and does not require grad, while the original can still backprop; "
        "`detach_()` turns the tensor itself into a leaf",
        "`fake = G(z)`, `alias = fake.detach()`, `fake.mean().backward()`, `alias[0].fill_(0)`; "
        "`G(z).detach_()`",
        f"same data_ptr {values['same_storage']}, alias requires grad {values['detached_requires_grad']}, "
        f"fake requires grad {values['original_requires_grad']}, backward through fake fills G's .grad "
        f"{values['original_backprops']}, in-place edit visible in fake {values['edit_visible']}; "
        f"detach_(): grad_fn None {values['detach__grad_fn_none']}, leaf {values['detach__is_leaf']}, "
        f"requires grad {values['detach__requires_grad']}",
        values, expected)


# --- 6. the D step three ways ----------------------------------------------------------------------------

D_STEP_VARIANTS = ("detach", "retain_graph", "neither")


def adam(module: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(module.parameters(), lr=2e-4, betas=(0.5, 0.999))


def generator_step_variant(variant: str, g: nn.Module, d: nn.Module, z: Tensor, real: Tensor,
                           d_loss: step.DLoss) -> Callable[[], object]:
    """One generator step of ``variant``: ``detach`` is the training step itself
    (:func:`gan.core.step.generator_step`); the other two are built from its D and G updates for contrast:
    the D update on the undetached fake, with ``retain_graph=True`` or with neither."""
    opt_g, opt_d = adam(g), adam(d)

    def g_loss(D: nn.Module, fake: Tensor, labels: Tensor | None) -> Tensor:
        return LOSS.g(D(fake))

    if variant == "detach":
        return partial(step.generator_step, g, d, opt_g, opt_d, [step.Batch(z, real, None)], d_loss, g_loss)

    def contrast() -> None:
        fake = g(z)
        backward = partial(Tensor.backward, retain_graph=variant == "retain_graph")
        step.d_update(d, opt_d, d_loss, real, fake, None, 0, backward)
        step.g_update(d, opt_g, g_loss, fake, None)
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
        "gan_d_step",
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


# --- 7. reusing D(fake) after opt_d.step() ---------------------------------------------------------------


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
        "reuse_d_fake",
        "reusing `D(fake)` computed before `opt_d.step()` for the G loss fails; a fresh D forward works",
        "`logits = D(fake)`; D loss on them, backward(retain_graph=True), `opt_d.step()`; G loss on the "
        "same logits, then on a fresh `D(fake)`",
        f"D's last conv weight version {version_before} -> {version_after} after opt_d.step(); reused "
        f"logits: {quote(stale_error.split(' Hint:')[0], 200)}; fresh forward: {quote(fresh_error)}, G .grad set "
        f"{values['fresh_g_grads']}",
        values, expected)


# --- 8. conditional discriminator input --------------------------------------------------------------


def training_module(device: torch.device, num_classes: int = 0, width: int = 8) -> GANModule:
    """The GANModule that ``python train.py`` builds -- composed from the project's configs -- for
    1-channel SIZE x SIZE images, with augmentation and regularizers off (D's loss is the plain loss)."""
    cfg = compose("data=digits", "augment=none", "reg=none", "loss=nonsaturating", f"model.width={width}",
                  f"data.image_size={SIZE}", f"train.z_dim={Z_DIM}", f"model.conditional={bool(num_classes)}")
    return build_module(OmegaConf.to_container(cfg, resolve=True), (1, SIZE, SIZE), num_classes).to(device)


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
        "conditional",
        "a conditional D input `torch.cat((condition, fake.detach()), 1)` in the D step and the undetached "
        "cat in the G step split gradients as in the unconditional case",
        f"the GANModule train.py builds, with `model.conditional=true` ({num_classes} classes) and without: "
        "one `gan.core.step.generator_step` with the module's own losses and critic",
        f"D in_channels {d_in}; requires grad: condition {values['condition_requires_grad']}, D-step cat "
        f"{values['d_step_input_requires_grad']}, G-step cat {values['g_step_input_requires_grad']}; "
        f"conditional split: {split}; same as unconditional "
        f"{values['conditional'] == values['unconditional']}",
        values, expected)


# --- 9. timing CUDA work ---------------------------------------------------------------------------------


def timing(device: torch.device, *, size: int = 4096, matmuls: int = 20) -> Result:
    claim = ("timing CUDA work without `torch.cuda.synchronize()` under-reports; CUDA events agree with "
             "synchronized wall time")
    if device.type != "cuda":
        return Result(
            "timing", claim, "nothing: CPU run",
            "CPU ops run synchronously in the calling thread: when an op returns its work is done, so "
            "`time.perf_counter()` around it measures it and there is nothing to synchronize",
            {}, None)
    a = torch.randn(size, size, device=device)

    def work() -> None:
        for _ in range(matmuls):
            a @ a  # the result is dropped; the kernel runs all the same

    work()  # warm-up: cuBLAS handles and workspaces
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    work()
    unsynced = (time.perf_counter() - start) * 1e3  # only the kernel launches have happened by now
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    work()
    torch.cuda.synchronize(device)
    synced = (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    work()
    end.record()
    end.synchronize()
    events = begin.elapsed_time(end)
    values = {"unsynced_ms": unsynced, "synced_ms": synced, "events_ms": events,
              "unsynced_share": unsynced / synced, "events_deviation": abs(events - synced) / synced}
    expected = {"unsynced_share": below(0.5), "events_deviation": below(0.1)}
    return Result(
        "timing", claim, f"{matmuls} matmuls {size}x{size} on {device}: wall time without sync, with "
        "sync, and between two CUDA events",
        f"without sync {unsynced:.2f} ms, with sync {synced:.2f} ms, CUDA events {events:.2f} ms",
        values, expected)


# --- 10. evaluation under no_grad -------------------------------------------------------------------------


def no_grad(device: torch.device, *, size: int = 32, width: int = 32, batch: int = 64,
            repeats: int = 101) -> Result:
    g, d = make_gan(device, size=size, width=width)
    z, real = gan_inputs(device, batch, size)

    def evaluate() -> Tensor:
        with evaluating(g):  # eval mode + no_grad: how this project samples
            return g(z)

    def evaluate_with_autograd() -> Tensor:
        g.eval()  # the same evaluation, but autograd records a graph
        try:
            return g(z)
        finally:
            g.train()

    exclude = [*state_tensors(g), z]
    # Counted as autograd saves them, not by walking the result's graph: a graph-free result would
    # say 0 by construction; this counts what the forward actually kept for a backward.
    grad_bytes, no_grad_bytes = packed_bytes(evaluate_with_autograd, exclude), packed_bytes(evaluate, exclude)
    sample = evaluate()
    peak_grad, peak_no_grad = cuda_peak_bytes(device, evaluate_with_autograd), cuda_peak_bytes(device, evaluate)

    with torch.no_grad():
        created = torch.ones(3, device=device, requires_grad=True)
        computed = created * 2
        head = MLPDiscriminator(4, 8, 1).to(device)  # parameters created inside no_grad

    # inference_mode skips per-op bookkeeping that no_grad still does: version counters (bumped by
    # every in-place op) and view tracking. Per-op costs show where ops are small, so it is timed on
    # the MLP generator of the 2D mixtures (configs/model/mlp.yaml), one point at a time, 20 per run:
    # short runs, many of them, so that the median dodges the bursts of a shared machine.
    points_g, _ = build_models({"name": "mlp", "hidden": 256, "layers": 3}, Z_DIM, (2,))
    points_g.to(device)
    points_z = torch.randn(1, Z_DIM, device=device)

    def sample_points(inference: bool) -> Callable[[], object]:
        def run() -> None:
            with evaluating(points_g, inference=inference):
                for _ in range(20):
                    points_g(points_z)
        return run

    ms = median_ms(device, repeats, no_grad=lambda: sample_points(False),
                   inference_mode=lambda: sample_points(True))
    with evaluating(g, inference=True):
        inference_sample = g(z)
    values = {
        "output_requires_grad": sample.requires_grad,
        "output_grad_fn_none": sample.grad_fn is None,
        "saved_bytes_grad": grad_bytes,
        "saved_bytes_no_grad": no_grad_bytes,
        "cuda_peak_bytes": {"grad": peak_grad, "no_grad": peak_no_grad},
        "created_inside_requires_grad": created.requires_grad,
        "computed_inside_requires_grad": computed.requires_grad,
        "parameter_inside_requires_grad": all(p.requires_grad for p in head.parameters()),
        "no_grad_ms": ms["no_grad"],
        "inference_ms": ms["inference_mode"],
        "inference_ratio": ms["inference_mode"] / ms["no_grad"],
        "no_grad_sample_versions": versions_around_inplace_edit(sample),
        "inference_sample_version_error": raised(lambda: inference_sample._version),
        # no_grad samples are ordinary tensors: D can still train on them; inference tensors cannot.
        "no_grad_sample_error": raised(lambda: LOSS.d(d(real), d(sample)).backward()),
        "inference_sample_error": raised(lambda: LOSS.d(d(real), d(inference_sample)).backward()),
    }
    # inference_ratio is reported, not judged: a per-op saving of microseconds, on a shared machine.
    expected = {"output_requires_grad": False, "output_grad_fn_none": True, "saved_bytes_no_grad": 0,
                "saved_bytes_grad": above(0), "created_inside_requires_grad": True,
                "computed_inside_requires_grad": False, "parameter_inside_requires_grad": True,
                "no_grad_sample_versions": (0, 1), "no_grad_sample_error": None,
                "inference_sample_version_error": contains("version counter"),
                "inference_sample_error": contains("Inference tensors cannot be saved for backward")}
    peak_text = ("" if device.type != "cuda" else
                 f" CUDA peak {mib(peak_no_grad)} vs {mib(peak_grad)} (ratio {peak_no_grad / peak_grad:.2f});")
    return Result(
        "no_grad",
        "evaluation under `torch.no_grad()` builds no graph and saves no activations; tensors and "
        "Parameters created inside keep `requires_grad=True`; `inference_mode` also drops version counters, "
        "and its tensors cannot enter autograd",
        f"DCGAN G {size}x{size}, width {width}, batch {batch} in eval mode: `evaluating(G)` vs autograd on; "
        f"`evaluating(G, inference=True)`; D trained on each sample; no_grad vs inference_mode: 20 "
        f"single-point samples of the 2D MLP G, median of {repeats}",
        f"output requires grad {values['output_requires_grad']}, grad_fn None "
        f"{values['output_grad_fn_none']}; activations saved for backward {mib(no_grad_bytes)} vs "
        f"{mib(grad_bytes)} with autograd (ratio {no_grad_bytes / grad_bytes:.2f});{peak_text} created "
        f"inside: tensor requires grad {values['created_inside_requires_grad']}, result computed from it "
        f"{values['computed_inside_requires_grad']}, new module's Parameters "
        f"{values['parameter_inside_requires_grad']}; MLP G sampling: inference_mode "
        f"{ms['inference_mode']:.2f} ms vs no_grad {ms['no_grad']:.2f} ms (ratio {values['inference_ratio']:.2f}); "
        f"version counter of a no_grad sample before/after an in-place edit "
        f"{values['no_grad_sample_versions']}, of an inference sample "
        f"{quote(values['inference_sample_version_error'])}; D on no_grad samples "
        f"{quote(values['no_grad_sample_error'])}, on inference samples "
        f"{quote(values['inference_sample_error'], 60)}",
        values, expected)


# --- 11. non_blocking copies from pinned memory -------------------------------------------------------------


def busy(ms: float) -> None:
    """Keep the host busy for ``ms``: stands for a data loader preparing the next batch."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def non_blocking(device: torch.device, *, batch: int = 1024, size: int = 64, steps: int = 10,
                 repeats: int = 3) -> Result:
    claim = "`.to(device, non_blocking=True)` from pinned memory lets the copy overlap with other work"
    if device.type != "cuda":
        return Result(
            "non_blocking", claim, "nothing: CPU run",
            "pinned (page-locked) memory and non_blocking copies concern host-to-GPU transfers; on the CPU "
            "`.to('cpu')` copies nothing, so there is no transfer to overlap",
            {}, None)
    d = DCGANDiscriminator(3, size, 16).to(device)
    pinned = [torch.randn(batch, 3, size, size).pin_memory() for _ in range(2)]

    def step(i: int, non_blocking: bool) -> None:
        x = pinned[i % 2].to(device, non_blocking=non_blocking)
        d(x).mean().backward()

    # The host work lasts as long as the GPU's copy + compute of one step, so that overlapping them
    # could at best halve a step.
    gpu_ms = median_ms(device, repeats, gpu=lambda: partial(step, 0, False))["gpu"]

    def loop(non_blocking: bool) -> Callable[[], object]:
        def run() -> None:
            for i in range(steps):
                step(i, non_blocking)
                busy(gpu_ms)
        return run

    ms = median_ms(device, repeats, blocking=lambda: loop(False), non_blocking=lambda: loop(True))

    def call_ms(non_blocking: bool) -> float:
        """How long the host is held inside the ``.to()`` call itself."""
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        pinned[0].to(device, non_blocking=non_blocking)
        held = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize(device)
        return held

    values = {
        "pinned": pinned[0].is_pinned(),
        "gpu_step_ms": gpu_ms,
        "blocking_step_ms": ms["blocking"] / steps,
        "non_blocking_step_ms": ms["non_blocking"] / steps,
        "blocking_call_ms": call_ms(False),
        "non_blocking_call_ms": call_ms(True),
    }
    values["step_ratio"] = values["non_blocking_step_ms"] / values["blocking_step_ms"]
    values["call_ratio"] = values["non_blocking_call_ms"] / values["blocking_call_ms"]
    expected = {"pinned": True, "step_ratio": below(0.9), "call_ratio": below(1.0)}
    mb = pinned[0].nbytes / 2**20
    return Result(
        "non_blocking", claim,
        f"{steps} steps: copy a pinned {mb:.0f} MiB batch to {device}, D forward+backward, then "
        f"{gpu_ms:.2f} ms of host work (busy loop, as long as the GPU part); blocking vs non_blocking copy",
        f"per step {values['blocking_step_ms']:.2f} ms blocking vs {values['non_blocking_step_ms']:.2f} ms "
        f"non_blocking; host held inside `.to()` {values['blocking_call_ms']:.3f} ms vs "
        f"{values['non_blocking_call_ms']:.3f} ms",
        values, expected)


# --- 12-14. leaves, backward and optimizers on a scalar example ---------------------------------------------


def scalar_example(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """x = 1 (data); a, b, c = 1, 2, 3 (leaves to learn); y = a²x + bx + c = 6; z = y² + 2y = 48.

    dz/dy = 2y + 2 = 14, so dz/da = 14 * 2ax = 28 and dz/db = dz/dc = 14.
    """
    x = torch.tensor(1.0, device=device)
    a, b, c = (torch.tensor(v, device=device, requires_grad=True) for v in (1.0, 2.0, 3.0))
    y = a**2 * x + b * x + c
    z = y**2 + 2 * y
    return x, a, b, c, y, z


def leaf(device: torch.device) -> Result:
    x, a, b, c, y, z = scalar_example(device)
    z.backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y_grad = y.grad  # a non-leaf's .grad: None, with a warning pointing to retain_grad()
    values: dict[str, Any] = {
        "is_leaf": {"x": x.is_leaf, "a": a.is_leaf, "y": y.is_leaf},
        "backward_grads": {"a": a.grad.item(), "b": b.grad.item(), "c": c.grad.item()},
        "x_grad": x.grad,
        "y_grad": y_grad,
        "y_grad_warning": str(caught[0].message) if caught else None,
    }

    _, a, b, c, y, z = scalar_example(device)
    y.retain_grad()
    z.backward()
    values["retained_y_grad"] = y.grad.item()

    _, a, b, c, y, z = scalar_example(device)
    grads = torch.autograd.grad(z, (a, b, c, y))
    values["autograd_grad"] = dict(zip("abcy", (t.item() for t in grads)))
    values["autograd_grad_left_dot_grad_none"] = all(t.grad is None for t in (a, b, c))

    grads_by_hand = {"a": 28.0, "b": 14.0, "c": 14.0}
    expected = {"is_leaf": {"x": True, "a": True, "y": False}, "backward_grads": grads_by_hand,
                "x_grad": None, "y_grad": None, "y_grad_warning": contains("retain_grad"),
                "retained_y_grad": 14.0, "autograd_grad": {**grads_by_hand, "y": 14.0},
                "autograd_grad_left_dot_grad_none": True}
    return Result(
        "leaf",
        "`backward()` fills `.grad` only on leaves; `retain_grad()` keeps a non-leaf's; "
        "`torch.autograd.grad` returns any gradient without touching `.grad`",
        "x=1, a=1, b=2, c=3, y = a²x + bx + c, z = y² + 2y: `z.backward()`; with `y.retain_grad()`; "
        "`torch.autograd.grad(z, (a, b, c, y))`",
        f"backward: a.grad {values['backward_grads']['a']:g}, b.grad {values['backward_grads']['b']:g}, "
        f"c.grad {values['backward_grads']['c']:g}, y.grad {y_grad} (non-leaf), x.grad {x.grad} (leaf "
        f"without requires_grad); retain_grad: y.grad {values['retained_y_grad']:g}; autograd.grad: "
        + ", ".join(f"dz/d{k} {v:g}" for k, v in values["autograd_grad"].items())
        + f", .grad left None {values['autograd_grad_left_dot_grad_none']}",
        values, expected)


def backward_needs_grad(device: torch.device) -> Result:
    g, d = make_gan(device)
    z, _ = gan_inputs(device, 4)
    fake = g(z)
    with frozen(d):
        wrong = LOSS.g(d(fake.detach()))  # the G loss with G cut off and D frozen: nothing to differentiate
        right = LOSS.g(d(fake))
    values = {
        "wrong_requires_grad": wrong.requires_grad,
        "error": raised(wrong.backward),
        "right_requires_grad": right.requires_grad,
    }
    expected = {"wrong_requires_grad": False, "error": contains("element 0 of tensors does not require grad"),
                "right_requires_grad": True}
    return Result(
        "backward_needs_grad",
        "a loss that does not require grad cannot `backward()`",
        "G loss on `D(fake.detach())` with `frozen(D)`: no input requires grad",
        f"loss requires grad {values['wrong_requires_grad']}; backward: {quote(values['error'])}; "
        f"on the undetached fake the loss requires grad {values['right_requires_grad']}",
        values, expected)


def optimizer_leaf(device: torch.device) -> Result:
    target = move_target(device)
    moved = torch.ones(3, requires_grad=True).to(target)  # the result of an op: not a leaf
    error = raised(lambda: torch.optim.SGD([moved], lr=0.01))

    _, a, b, c, _, z = scalar_example(device)
    optimizer = torch.optim.SGD([a, b, c], lr=0.01)
    z.backward()
    optimizer.step()
    values = {"moved_is_leaf": moved.is_leaf, "error": error, "after_step": [t.item() for t in (a, b, c)]}
    expected = {"moved_is_leaf": False, "error": contains("can't optimize a non-leaf Tensor"),
                "after_step": approx([0.72, 1.86, 2.86])}
    return Result(
        "optimizer_leaf",
        "an optimizer refuses a non-leaf tensor; SGD(lr=0.01) moves a, b, c of the example above to "
        "0.72, 1.86, 2.86",
        f"`SGD([torch.ones(3, requires_grad=True).to({target})])`; one SGD step on z(a, b, c)",
        f"leaf {values['moved_is_leaf']}: {quote(error)}; a, b, c after one step "
        + ", ".join(f"{v:.2f}" for v in values["after_step"]),
        values, expected)


# --- 15. tensor attribute vs Parameter vs buffer ------------------------------------------------------------

KINDS = ("parameter", "buffer", "buffer_nonpersistent", "plain")


class FourKinds(nn.Module):
    """One tensor of each kind a module can hold, all filled with ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.parameter = nn.Parameter(torch.full((2,), value))
        self.register_buffer("buffer", torch.full((2,), value))
        self.register_buffer("buffer_nonpersistent", torch.full((2,), value), persistent=False)
        self.plain = torch.full((2,), value)


def parameter_buffer(device: torch.device) -> Result:
    target = move_target(device)
    module = FourKinds(1.0)
    in_parameters = {k: any(p is getattr(module, k) for p in module.parameters()) for k in KINDS}
    in_state_dict = {k: k in module.state_dict() for k in KINDS}
    moved = FourKinds(1.0).to(target)
    follows_to = {k: placed(getattr(moved, k), target) for k in KINDS}

    # An optimizer over parameters(), and a loss that touches all four.
    module = FourKinds(1.0)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    sum(getattr(module, k).sum() for k in KINDS).backward()
    optimizer.step()
    updated = {k: bool((getattr(module, k) != 1.0).all()) for k in KINDS}

    # Any leaf with requires_grad=True handed to an optimizer explicitly is updated, registered or not.
    module = FourKinds(1.0)
    explicit = [module.buffer.requires_grad_(True), module.plain.requires_grad_(True)]
    optimizer = torch.optim.SGD(explicit, lr=0.5)
    sum(t.sum() for t in explicit).backward()
    optimizer.step()
    updated_explicitly = {"buffer": bool((module.buffer != 1.0).all()), "plain": bool((module.plain != 1.0).all())}

    file = io.BytesIO()
    torch.save(FourKinds(1.0).state_dict(), file)
    file.seek(0)
    fresh = FourKinds(0.0)
    fresh.load_state_dict(torch.load(file, weights_only=True))
    survives = {k: bool((getattr(fresh, k) == 1.0).all()) for k in KINDS}

    values = {"in_parameters": in_parameters, "in_state_dict": in_state_dict, "follows_to": follows_to,
              "optimizer_updates": updated, "updated_explicitly": updated_explicitly,
              "survives_save_load": survives}
    expected = {
        "in_parameters": {"parameter": True, "buffer": False, "buffer_nonpersistent": False, "plain": False},
        "in_state_dict": {"parameter": True, "buffer": True, "buffer_nonpersistent": False, "plain": False},
        "follows_to": {"parameter": True, "buffer": True, "buffer_nonpersistent": True, "plain": False},
        "optimizer_updates": {"parameter": True, "buffer": False, "buffer_nonpersistent": False,
                              "plain": False},
        "updated_explicitly": {"buffer": True, "plain": True},
        "survives_save_load": {"parameter": True, "buffer": True, "buffer_nonpersistent": False,
                               "plain": False},
    }
    columns = ("in_parameters", "in_state_dict", "follows_to", "optimizer_updates", "survives_save_load")
    kinds = "; ".join(f"{k}: " + "/".join("yes" if values[c][k] else "no" for c in columns) for k in KINDS)
    return Result(
        "parameter_buffer",
        "Parameter, buffer, non-persistent buffer and plain tensor attribute differ in what sees them",
        f"a module holding one of each: `parameters()`, `state_dict()`, `.to({target})`, SGD over "
        "`parameters()`, SGD given the buffer and plain tensor with requires_grad=True, "
        "`torch.save` + `torch.load(weights_only=True)` into a fresh module",
        f"in parameters()/state_dict()/follows .to()/updated by the optimizer/survives save+load -- {kinds}; "
        f"passed explicitly: buffer updated {updated_explicitly['buffer']}, plain {updated_explicitly['plain']}",
        values, expected)


# --- the table ---------------------------------------------------------------------------------------------

DEMOS: dict[str, Callable[[torch.device], Result]] = {
    demo.__name__: demo
    for demo in (to_device, requires_grad, freeze, volatile, detach, gan_d_step, reuse_d_fake, conditional,
                 timing, no_grad, non_blocking, leaf, backward_needs_grad, optimizer_leaf, parameter_buffer)
}





