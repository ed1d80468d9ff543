"""Freezing layers for fine-tuning: ``requires_grad_(False)`` once, on a network's first blocks or on named ones.

A block is a layer with weights (a convolution or a linear layer), with the tensors its weight is computed from
under a parametrization (spectral norm's ``parametrizations.weight.original``: what its optimizer steps), together
with the normalisation layers that follow it (BatchNorm); or a module that declares ``is_block = True``, with every
layer inside it (model=resnet's residual blocks, transitions and bases). G's and D's ``nn.Sequential`` read in
order, so D's first block is the one that sees the image (FreezeD: Mo, Cho and Shin, 2020) and G's first the one
that sees the noise. A frozen parameter is left out of its optimizer (gan/run/build.py), so it never gets a
``.grad`` or optimizer state and never moves; ``gan.core.contexts.frozen``, which freezes D in every G update,
restores each flag as it was, so a partly frozen D stays partly frozen. A parametrization's buffers (spectral norm's
power iteration vectors ``_u``, ``_v``) keep updating in training mode, as BatchNorm's running statistics do.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.utils import parametrize

from gan.errors import ConfigError


def blocks(network: nn.Module) -> dict[str, list[str]]:
    """The names of ``network``'s parameters, block by block in the order its layers run, each block under its
    layer's name (``net.0``). A parametrized weight (torch.nn.utils.parametrize: spectral_norm, weight_norm,
    orthogonal...) is computed from the tensors its optimizer steps, ``<layer>.parametrizations.weight.original``
    and any parameter of the parametrization: they belong to their layer's block."""
    grouped: dict[str, list[str]] = {}
    held: set[int] = set()  # the modules of a layer's parametrizations or of a whole block: parts, not layers
    for prefix, layer in network.named_modules():
        if id(layer) in held:
            continue
        if getattr(layer, "is_block", False):  # a block of several layers (a residual block): frozen whole
            held.update(id(m) for m in layer.modules())
            grouped[prefix] = [f"{prefix}.{name}" for name, _ in layer.named_parameters()]
            continue
        own = [name for name, _ in layer.named_parameters(recurse=False)]
        if parametrize.is_parametrized(layer):
            held.update(id(m) for m in layer.parametrizations.modules())
            own += [name for name, _ in layer.parametrizations.named_parameters(prefix="parametrizations")]
        own = [f"{prefix}.{name}" if prefix else name for name in own]
        if not own:
            continue
        if isinstance(layer, _NormBase) and grouped:  # a normalisation belongs to the layer it follows
            grouped[next(reversed(grouped))] += own
        else:
            grouped[prefix] = own
    return grouped


def block_names(network: nn.Module) -> list[str]:
    """Each block by the name of its layer (``net.0``), as ``finetune.freeze_*`` accepts them."""
    return list(blocks(network))


def freeze(network: nn.Module, which: Any, key: str) -> list[str]:
    """``requires_grad_(False)`` on the blocks ``which`` names: an int k (the first k blocks) or a list of
    block names (:func:`block_names`). Returns the names of the parameters frozen. A ConfigError, naming
    ``key`` (the setting), for an unknown block, for freezing every block (then nothing could train), or for
    a block tied to one that trains (a parameter both hold: one tensor, which either both train or neither)."""
    grouped = blocks(network)
    names = list(grouped)
    if isinstance(which, bool) or not isinstance(which, (int, list, tuple)):
        raise ConfigError(f"{key}={which}: give how many of the first blocks to freeze (0: none) or a list of "
                          f"their names, of {names}")
    if isinstance(which, int):
        if not 0 <= which < len(grouped):
            raise ConfigError(f"{key}={which}: this network has {len(grouped)} blocks ({names}); freeze 0 to "
                              f"{len(grouped) - 1} of them, so that one still trains")
        chosen = names[:which]
    else:
        unknown = [name for name in which if name not in names]
        if unknown:
            raise ConfigError(f"{key}: no block named {unknown[0]}; this network's blocks are {names}")
        chosen = [name for name in names if name in which]
        if len(chosen) == len(grouped):
            raise ConfigError(f"{key} names every block of the network ({names}): leave one to train")
    parameters = dict(network.named_parameters(remove_duplicate=False))  # a tied tensor under each of its names
    frozen = [name for block in chosen for name in grouped[block]]
    by_tensor = {id(parameters[name]): name for name in frozen}
    for block in (block for block in names if block not in chosen):
        tied = next((name for name in grouped[block] if id(parameters[name]) in by_tensor), None)
        if tied is not None:
            raise ConfigError(f"{key}: {tied}, of block {block}, is the frozen {by_tensor[id(parameters[tied])]} (tied "
                              f"weights: one tensor), so block {block} could not train in full: freeze both blocks "
                              "or neither")
    for name in frozen:
        parameters[name].requires_grad_(False)
    return frozen
