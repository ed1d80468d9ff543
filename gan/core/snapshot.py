"""A trained generator for use outside training: ``<run>/generator.pt``, and exports made from it.

``generator.pt`` is a plain dictionary -- tensors, strings, numbers, lists -- that
``torch.load(path, weights_only=True)`` reads without unpickling any object:

    format        FORMAT
    generator     "ema" or "G": which of the run's generators the weights are
    step          the generator steps it was trained for
    data          the dataset's name
    model         the run's ``model`` config (name, width or hidden and layers, ...)
    z_dim, data_shape, condition      G's input and output: z (N, z_dim) [and labels (N,)] -> (N, *data_shape);
                  condition: {"kind": "none" | "classes" | "code", "values": K}, what the labels are, and
                  "subset": [the classes it trained on] for a run on some of the data's (data.classes)
    state_dict    G's weights and buffers (BatchNorm statistics)

:func:`load_generator` rebuilds G from it: pure PyTorch, no Lightning or Hydra. :func:`export` writes
``torch.export``'s program (``generator.pt2``) or an ONNX model (``generator.onnx``) of such a G and
checks it: run on other noise than it was traced with, and on another batch size, it must give what
the eager G gives.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gan.core.models import Condition, build_generator, g_condition
from gan.errors import ConfigError, RunError
from gan.files import atomic_write

FORMAT = 2  # 1: before ``condition``, with ``num_classes`` (the labels' values) instead; still read
FILE = "generator.pt"  # its name in a run directory
# export kind -> the file it writes beside generator.pt, and the packages it needs beyond torch
EXPORTS = {"torch": ("generator.pt2", ()), "onnx": ("generator.onnx", ("onnx", "onnxscript", "onnxruntime"))}
# The largest difference an export may show from the eager G, in units of G's output ([-1, 1] images):
# float32 rounding differences of reordered arithmetic are around 1e-7.
TOLERANCE = 1e-4


def make_snapshot(network: nn.Module, /, *, model: Mapping[str, Any], z_dim: int, data_shape: tuple[int, ...],
                  condition: Condition, **info: Any) -> dict[str, Any]:
    """What ``generator.pt`` holds for the generator ``network`` (built from the ``model`` config); ``info``:
    plain values to keep beside it (``generator``, ``step``, ``data``, ...)."""
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in network.state_dict().items()}
    return {"format": FORMAT, **info, "model": dict(model), "z_dim": int(z_dim),
            "data_shape": [int(d) for d in data_shape], "condition": condition.as_dict(), "state_dict": state}


def save_snapshot(path: str | Path, snapshot: Mapping[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save(dict(snapshot), f))


def read_snapshot(path: str | Path) -> dict[str, Any]:
    """A ``generator.pt``, read with ``weights_only=True``; a ConfigError for any other file."""
    try:
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # missing, truncated, or holding pickled objects
        raise ConfigError(f"{path} is not a readable generator.pt ({type(e).__name__}: {e})".splitlines()[0]) from None
    if not isinstance(snapshot, dict) or snapshot.get("format") not in (1, FORMAT):
        raise ConfigError(f"{path} is not a generator.pt of format 1 or {FORMAT}: write one with "
                          "python evaluate.py run_dir=<run> snapshot=true")
    if snapshot["format"] == 1:  # its labels' count, with the config saying whether they are classes or a code
        snapshot["condition"] = g_condition(snapshot["model"], snapshot.pop("num_classes")).as_dict()
        snapshot["format"] = FORMAT
    return snapshot


def load_generator(source: str | Path | Mapping[str, Any], device: str | torch.device = "cpu") -> nn.Module:
    """The generator of a ``generator.pt`` (a path, or the dictionary itself), on ``device``, in eval mode
    and without gradients. It carries ``z_dim``, ``data_shape`` and ``condition`` (what its labels are)::

        G = load_generator("<run>/generator.pt")
        images = G(torch.randn(16, G.z_dim))                          # (16, *G.data_shape) in [-1, 1]
        images = G(torch.randn(16, G.z_dim), G.condition.labels(16))  # classes in turn, or a code drawn
    """
    snapshot = source if isinstance(source, Mapping) else read_snapshot(source)
    shape = tuple(snapshot["data_shape"])
    condition = Condition.from_dict(snapshot["condition"])
    generator = build_generator(snapshot["model"], snapshot["z_dim"], shape, condition.values)
    generator.load_state_dict(snapshot["state_dict"])
    generator.z_dim, generator.condition, generator.data_shape = snapshot["z_dim"], condition, shape
    return generator.to(device).eval().requires_grad_(False)


# --- exports ---------------------------------------------------------------------------------------

def missing_packages(kind: str) -> list[str]:
    """The packages export ``kind`` needs that are not installed (a ConfigError for an unknown kind)."""
    if kind not in EXPORTS:
        raise ConfigError(f"export={kind}: use {' | '.join(EXPORTS)} (or a list of them, export=[torch,onnx])")
    return [name for name in EXPORTS[kind][1] if importlib.util.find_spec(name) is None]


def example_inputs(generator: nn.Module, batch: int, seed: int) -> tuple[Tensor, ...]:
    """Seeded noise (and balanced labels of what it was trained with, for a conditional G): the inputs G is
    traced and checked with."""
    z = torch.randn(batch, generator.z_dim, generator=torch.Generator().manual_seed(seed))
    return (z, generator.condition.cycle(batch)) if generator.condition.values else (z,)


def input_names(generator: nn.Module) -> list[str]:
    return ["z", "labels"] if generator.condition.values else ["z"]


def export(generator: nn.Module, kind: str, path: str | Path) -> float:
    """Write ``generator`` (from :func:`load_generator`) to ``path`` as export ``kind``, with a dynamic batch
    dimension; read it back and return the largest difference of its output from the eager G's on
    other noise and another batch size. A RunError if that exceeds ``TOLERANCE``."""
    traced = example_inputs(generator, 4, seed=0)
    batch = torch.export.Dim("batch")
    dynamic = tuple({0: batch} for _ in traced)
    if kind == "torch":
        program = torch.export.export(generator, traced, dynamic_shapes=dynamic)
        atomic_write(path, lambda f: torch.export.save(program, f))
        run = torch.export.load(path).module()
    elif kind == "onnx":
        with warnings.catch_warnings():  # the exporter's note that it names the axis "batch" once, for both inputs
            warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape.*")
            program = torch.onnx.export(generator, traced, dynamo=True, input_names=input_names(generator),
                                        output_names=["samples"], dynamic_shapes=dynamic, verbose=False)
        atomic_write(path, lambda f: f.write(program.model_proto.SerializeToString()))
        run = onnx_runner(path, input_names(generator))
    else:
        missing_packages(kind)  # raises the ConfigError that names the kinds
        raise AssertionError(kind)
    difference = max_difference(generator, run)
    if not difference <= TOLERANCE:
        raise RunError(f"the {kind} export in {path} gives samples up to {difference:.3g} away from the eager "
                       f"generator's (tolerance {TOLERANCE:g}): do not use it")
    return difference


def onnx_runner(path: str | Path, names: list[str]) -> Callable[..., Tensor]:
    """An ONNX file as a function of tensors, run by onnxruntime on the CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])

    def run(*inputs: Tensor) -> Tensor:
        return torch.from_numpy(session.run(None, {n: x.numpy() for n, x in zip(names, inputs)})[0])

    return run


def max_difference(generator: nn.Module, run: Callable[..., Tensor], batch: int = 7, seed: int = 1) -> float:
    """The largest elementwise difference between ``run`` and the eager ``generator`` on the same noise."""
    inputs = example_inputs(generator, batch, seed)
    with torch.no_grad():
        expected, got = generator(*inputs), run(*inputs)
    if got.shape != expected.shape:
        return float("inf")
    return (got.detach().float() - expected.float()).abs().max().item()
