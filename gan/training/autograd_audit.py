"""The autograd contract, checked while training (``audit=true``; always on in tests and debug presets).

Each check raises :class:`AuditError` naming the module and parameter (or buffer, or logged value)
at the first violation:

* a D update leaves every G gradient untouched (None stays None) and gives every D parameter a
  gradient (that losses and gradients are finite is checked on every run: gan/training/guard.py);
* before each backward, the network it updates holds no gradient (none accumulates across steps);
* a G update gives every G parameter a gradient, gives D's parameters none, and changes none of D's
  weights or buffers, except the running statistics a train-mode forward updates (see
  :func:`expected_to_change`);
* each update's optimizer holds exactly the parameters of the network it updates, steps once per
  update, and moves that network's weights (an update the non-finite guard skipped moves nothing, and is
  let be);
* parameters frozen for fine-tuning (``finetune.freeze_*``) stay bit-identical and without a gradient
  through every update, and the G update, which freezes all of D, gives each D parameter back the
  ``requires_grad`` it had;
* G and D run every training forward in train mode (every submodule): eval mode is for sampling;
* sampling leaves every generator parameter and buffer bit-identical, restores train/eval mode and
  ``requires_grad`` flags, and returns tensors without a graph;
* values sent to loggers are plain Python numbers.

The gradient and optimizer checks hang on G's and D's optimizers' step hooks and on the loop's
backward, the mode check on G's and D's forward pre-hooks, so the training step itself carries no audit
code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from gan.core.audit import AuditError, Snapshot
from gan.core.phases import StepPhases
from gan.training.observer import ObservedRun, Observer


def grad_versions(parameters: list[tuple[str, Tensor]]) -> dict[str, tuple[Tensor, int] | None]:
    """Each named parameter's gradient and its version counter (None: no gradient). A backward that reaches a
    parameter either creates its gradient or adds to it in place, which bumps the counter: comparing these
    catches it exactly, without copying the gradients."""
    return {name: None if p.grad is None else (p.grad, p.grad._version) for name, p in parameters}


def first_changed_grad(before: dict[str, tuple[Tensor, int] | None],
                       parameters: list[tuple[str, Tensor]]) -> str | None:
    """Name of the first of ``parameters`` whose gradient is not the one recorded in ``before``."""
    for name, now in grad_versions(parameters).items():
        old = before[name]
        if (old is None) != (now is None) or (old is not None and (now[0] is not old[0] or now[1] != old[1])):
            return name
    return None


def expected_to_change(D: nn.Module) -> set[str]:
    """D's buffers that a train-mode forward updates, in the G update too.

    Policy: D stays in train mode while it is frozen for the G update, so that G is judged by the same
    function D is trained as (BatchNorm normalizes with the batch's statistics). Each such forward moves
    BatchNorm's running statistics (used only in eval mode, which training never puts D in) and runs
    one power iteration of spectral normalization (its vectors ``_u``, ``_v``). No other buffer of D
    may change in the G update.
    """
    names = set()
    for prefix, module in D.named_modules():
        if isinstance(module, _BatchNorm) or type(module).__name__ == "_SpectralNorm":
            names.update(f"{prefix}.{name}" if prefix else name for name, _ in module.named_buffers(recurse=False))
    return names


class AutogradAudit(Observer):
    """Checks the detach / freeze split of every D and G update of a :class:`~gan.run.module.GANModule` trained with the
    optimizers ``opt_g`` and ``opt_d``. Which update a backward or an optimizer step belongs to is read
    from the step's own record of its phases (``phases``: gan/core/phases.py), not guessed; ``d_steps``: D's
    updates per generator step (loss.d_steps). ``scaler``: float16's GradScaler, or None. An observer of the run
    (gan/training/observer.py): :meth:`on_start` once, then :meth:`on_step_start`, :meth:`before_backward` and
    :meth:`on_step_end` each step; the optimizers' step hooks and G's and D's forward pre-hooks, registered here, do
    the rest, and :meth:`on_close` removes them."""

    def __init__(self, module: Any, opt_g: Optimizer, opt_d: Optimizer, phases: StepPhases, d_steps: int,
                 scaler: Any = None):
        self.module, self.phases, self.d_steps, self.scaler = module, phases, d_steps, scaler
        self.updates = {id(opt_g): "G", id(opt_d): "D"}
        self.steps = {"G": 0, "D": 0}
        # The networks' parameters and buffers are the same objects for the whole run: listed once here.
        self.named = {n: list(getattr(module, n).named_parameters()) for n in "GD"}
        self.parameters = {f"{n}.{name}": p for n in "GD" for name, p in self.named[n]}
        self.names = {id(p): name for name, p in self.parameters.items()}
        self.ids = {n: {id(p) for _, p in self.named[n]} for n in "GD"}
        self.submodules = {n: list(getattr(module, n).named_modules()) for n in "GD"}
        allowed = expected_to_change(module.D)
        # What the G update must leave as it was: all of D but the statistics a train-mode forward moves.
        self.d_kept = {name: t for name, t in [*self.named["D"], *module.D.named_buffers()] if name not in allowed}
        self.tensors = {n: dict(self.named[n]) for n in "GD"}
        self.by_size = {n: sorted(self.tensors[n].values(), key=Tensor.numel) for n in "GD"}
        self.weights = {n: Snapshot(self.tensors[n]) for n in "GD"}
        self.d_state = Snapshot(self.d_kept)
        self.flags = {name: p.requires_grad for name, p in self.parameters.items()}
        self.frozen = {name: p for name, p in self.parameters.items() if not p.requires_grad}
        self.frozen_weights = Snapshot(self.frozen)
        # D's state is recorded right after the last D update of each step, before the G update runs D
        # forward: the optimizer's step hook sits there.
        self.hooks = [
            *(o.register_step_pre_hook(lambda opt, args, kw: self.before_step(opt)) for o in (opt_g, opt_d)),
            *(o.register_step_post_hook(lambda opt, args, kw: self.after_optimizer_step(opt, kw))
              for o in (opt_g, opt_d)),
            *(getattr(module, n).register_forward_pre_hook(self.in_train_mode(n)) for n in "GD"),
        ]

    def on_start(self, run: ObservedRun) -> None:
        """As the steps start, the references kept across updates are those the run trains from (a resume's, put
        back after the audit was attached): the frozen weights and D's state. (Each network's weights are taken
        again before each of its updates.)"""
        self.frozen_weights.take(self.frozen)
        self.d_state.take(self.d_kept)

    def on_close(self, run: ObservedRun, status: str) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def in_train_mode(self, name: str) -> Callable[..., None]:
        """A forward pre-hook for ``name`` (G or D): in a phase of the step, every submodule is in train mode."""

        def check(module: nn.Module, args: Any) -> None:
            phase = self.phases.current.name if self.phases.current is not None else None
            if phase not in ("g_forward", "d_forward_backward"):
                return  # sampling and metrics, outside the step: eval mode there
            for sub, m in self.submodules[name]:
                if not m.training:
                    raise AuditError(f"{name}.{sub or '<root>'} ran a training forward in eval mode (phase {phase}): "
                                     "training runs G and D in train mode; only sampling uses eval mode "
                                     "(gan.core.contexts.evaluating)")

        return check

    def network_of(self, optimizer: Any) -> str:
        """"G" or "D" for G's or D's optimizer; an optimizer stepped in the other network's update is an error."""
        network = self.updates[id(optimizer)]
        if network != self.phases.network:
            raise AuditError(f"{network}'s optimizer stepped in the {self.phases.network} update")
        return network

    def before_step(self, optimizer: Any) -> None:
        network = self.network_of(optimizer)
        if network == "D":
            self.check_d_update()
        else:
            self.check_g_update()
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for key in held - self.ids[network]:
            raise AuditError(f"{network}'s optimizer holds {self.names.get(key, 'a parameter')}, which is not "
                             f"{network}'s")
        for n, p in self.named[network]:
            if p.requires_grad and id(p) not in held:
                raise AuditError(f"{network}'s optimizer does not hold {network}.{n}: the {network} update cannot "
                                 "move it")
        self.weights[network].take(self.tensors[network])
        # Some gradient not zero (all zero: a D so sure of itself that the G loss saturates, an update with nothing
        # to apply); the smallest first, which nearly always answers at once.
        self.has_gradient = any(bool(p.grad.any()) for p in self.by_size[network] if p.grad is not None)

    def after_optimizer_step(self, optimizer: Any, kwargs: dict[str, Any]) -> None:
        network = self.network_of(optimizer)
        self.steps[network] += 1
        self.check_frozen(network)
        found_inf = kwargs.get("found_inf", getattr(optimizer, "found_inf", None))  # the guard's (or GradScaler's)
        skipped = found_inf is not None and bool(found_inf.item())
        if self.has_gradient and not skipped and not self.weights[network].moved(self.tensors[network]):
            lrs = sorted({group["lr"] for group in optimizer.param_groups})
            raise AuditError(f"the {network} update moved none of {network}'s weights (learning rate {lrs}): "
                             f"its optimizer must step {network}'s parameters with their gradients")
        if network == "D" and self.phases.d_step == self.d_steps - 1:
            self.d_state.take(self.d_kept)

    def check_frozen(self, network: str) -> None:
        """After ``network``'s update: frozen parameters unmoved and without gradients, every flag as it was."""
        moved = self.frozen_weights.first_difference(self.frozen)
        if moved:
            raise AuditError(f"the {network} update moved frozen {moved}: a frozen parameter must stay out of the "
                             "optimizer")
        for name, p in self.frozen.items():
            if p.grad is not None:
                raise AuditError(f"frozen {name} holds a gradient after the {network} update: requires_grad_(False) "
                                 "must stay set on it")
        for name, p in self.parameters.items():
            if p.requires_grad != self.flags[name]:
                raise AuditError(f"{name}.requires_grad is {p.requires_grad} after the {network} update, "
                                 f"{self.flags[name]} before: freezing D for G's update must restore each flag")

    def on_step_start(self, run: ObservedRun, batch: Any) -> None:
        self.steps = {"G": 0, "D": 0}

    def before_backward(self, loss: Tensor, network: str) -> None:
        for name, p in self.named[network]:
            if p.grad is not None:
                raise AuditError(f"{network}.{name} already holds a gradient before the {network} backward: it "
                                 "would be added to, not replaced; call zero_grad(set_to_none=True) first")
        # The other network's gradients, which this backward must leave as they are (checked before the step).
        self.other_grads = grad_versions(self.named["G" if network == "D" else "D"])

    def check_d_update(self) -> None:
        changed = first_changed_grad(self.other_grads, self.named["G"])
        if changed:
            raise AuditError(f"D update changed the gradient of G.{changed}: the D loss must use fake.detach()")
        require_gradients(self.named["D"], "D", "")

    def check_g_update(self) -> None:
        changed = first_changed_grad(self.other_grads, self.named["D"])
        if changed:
            raise AuditError(f"G update gave D.{changed} a gradient: D must be frozen during the G update")
        require_gradients(self.named["G"], "G", ": the G loss must reach every weight of G through the undetached fake")

    def on_step_end(self, run: ObservedRun) -> None:
        expected = {"D": self.d_steps, "G": 1}
        for network, count in expected.items():
            # float16's GradScaler does not call an optimizer that takes no found_inf when it skips its step.
            if self.steps[network] != count and self.scaler is None:
                raise AuditError(f"{network}'s optimizer stepped {self.steps[network]} times in a generator step, "
                                 f"not {count}: the step must call its step() once per {network} update")
        changed = self.d_state.first_difference(self.d_kept)
        if changed:
            raise AuditError(f"G update changed D.{changed}: only BatchNorm running statistics and "
                             "spectral-norm vectors of D may move in the G update")


def require_gradients(parameters: list[tuple[str, Tensor]], network: str, hint: str) -> None:
    """Every trainable one of ``network``'s named ``parameters`` holds a gradient after its backward."""
    for name, p in parameters:
        if p.requires_grad and p.grad is None:
            raise AuditError(f"{network} update left {network}.{name} with no gradient{hint}")

