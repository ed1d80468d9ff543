"""Claims about tensors and modules as autograd sees them, shown on the project's models: where ``.to()``
puts things, what a module registers, how ``requires_grad`` spreads, what ``detach()`` shares, which
tensors are leaves and get ``.grad``, and what ``backward()`` and an optimizer refuse."""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from gan.core.contexts import frozen
from gan.patterns.measure import PYTORCH, Result, all_grads, approx, contains, quote, raised
from gan.patterns.models import LOSS, gan_inputs, make_gan


def move_target(device: torch.device) -> torch.device | torch.dtype:
    """Where the ``.to()`` demonstrations move things: the GPU when there is one, else float64.

    A dtype change follows the same rules as a device change (new tensor; module moved in place), so
    the CPU can show them too.
    """
    return device if device.type == "cuda" else torch.float64


def placed(t: Tensor, target: torch.device | torch.dtype) -> bool:
    return t.device.type == target.type if isinstance(target, torch.device) else t.dtype == target


# --- .to() / .cuda() / .cpu() ----------------------------------------------------------------------


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
        "to_device", PYTORCH,
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


# --- requires_grad propagation ----------------------------------------------------------------------


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
        "requires_grad", PYTORCH,
        "a result requires grad if any input does, and not if none does",
        "`w * x + x` (only w requires grad), `x * 2 + x`; G(z) with G's weights trainable, then `frozen(G)`",
        f"w*x+x: {values['one_input_requires']}, x*2+x: {values['no_input_requires']}; z: "
        f"{values['z_requires']}, G(z): {values['g_output_requires']}, G(z) with G frozen: "
        f"{values['frozen_g_output_requires']}",
        values, expected)


# --- detach() and detach_() ------------------------------------------------------------------------------


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
        "detach", PYTORCH,
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


# --- leaves, backward and optimizers on a scalar example ---------------------------------------------


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
        "leaf", PYTORCH,
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
        "backward_needs_grad", PYTORCH,
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
        "optimizer_leaf", PYTORCH,
        "an optimizer refuses a non-leaf tensor; SGD(lr=0.01) moves a, b, c of the example above to "
        "0.72, 1.86, 2.86",
        f"`SGD([torch.ones(3, requires_grad=True).to({target})])`; one SGD step on z(a, b, c)",
        f"leaf {values['moved_is_leaf']}: {quote(error)}; a, b, c after one step "
        + ", ".join(f"{v:.2f}" for v in values["after_step"]),
        values, expected)


# --- tensor attribute vs Parameter vs buffer ------------------------------------------------------------


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
        "parameter_buffer", PYTORCH,
        "Parameter, buffer, non-persistent buffer and plain tensor attribute differ in what sees them",
        f"a module holding one of each: `parameters()`, `state_dict()`, `.to({target})`, SGD over "
        "`parameters()`, SGD given the buffer and plain tensor with requires_grad=True, "
        "`torch.save` + `torch.load(weights_only=True)` into a fresh module",
        f"in parameters()/state_dict()/follows .to()/updated by the optimizer/survives save+load -- {kinds}; "
        f"passed explicitly: buffer updated {updated_explicitly['buffer']}, plain {updated_explicitly['plain']}",
        values, expected)
