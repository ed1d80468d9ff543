"""What a claim returns and how it is judged (:class:`Result`, :class:`Check`), and the measuring toolkit
the claims share.

A claim is a function ``name(device, ...) -> Result`` that runs something and returns what it measured
(``values``) next to what the claim expects (``expected``); the verdict compares the two. A Result also
says what its row runs (``subject``): :data:`STEP`, the project's training step itself (the functions of
``gan.core.step``, or the GANModule train.py builds), so that breaking the step breaks the row; or
:data:`PYTORCH`, a fact of PyTorch shown on the project's models.

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

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from gan.evaluation.graphs import reachable, saved_tensors

STEP = "the training step"  # the row runs gan.core.step's functions or the GANModule train.py builds
PYTORCH = "PyTorch"  # the row shows a fact of PyTorch, on the project's models


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
    subject: str  # STEP or PYTORCH: whether the row runs the project's training step
    claim: str
    ran: str
    measured: str
    values: dict[str, Any]
    expected: dict[str, Any] | None  # None: the claim needs a GPU and this run has none

    def __post_init__(self) -> None:
        if self.subject not in (STEP, PYTORCH):
            raise ValueError(f"{self.name}: subject must be {STEP!r} or {PYTORCH!r}, not {self.subject!r}")

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


# --- measuring ------------------------------------------------------------------------------------------


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
