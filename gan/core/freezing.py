"""Freezing layers for fine-tuning: ``requires_grad_(False)`` once, on a network's first blocks or on named ones.

A block is a layer with weights (a convolution or a linear layer) together with the normalisation layers
that follow it (BatchNorm): G's and D's ``nn.Sequential`` read in order, so D's first block is the one
that sees the image (FreezeD: Mo, Cho and Shin, 2020) and G's first the one that sees the noise. A frozen
parameter is left out of its optimizer (gan/run/module.py), so it never gets a ``.grad`` or optimizer
state and never moves; ``gan.core.contexts.frozen``, which freezes D in every G update, restores each flag
as it was, so a partly frozen D stays partly frozen.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from gan.errors import ConfigError


def blocks(network: nn.Module) -> list[list[str]]:
    """The names of ``network``'s parameters, block by block, in the order its layers run."""
    grouped: list[list[str]] = []
    for prefix, layer in network.named_modules():
        own = [f"{prefix}.{name}" if prefix else name for name, _ in layer.named_parameters(recurse=False)]
        if not own:
            continue
        if isinstance(layer, _NormBase) and grouped:  # a normalisation belongs to the layer it follows
            grouped[-1] += own
        else:
            grouped.append(own)
    return grouped


def block_names(network: nn.Module) -> list[str]:
    """Each block by the name of its layer (``net.0``), as ``finetune.freeze_*`` accepts them."""
    return [names[0].rpartition(".")[0] for names in blocks(network)]


def freeze(network: nn.Module, which: Any, key: str) -> list[str]:
    """``requires_grad_(False)`` on the blocks ``which`` names: an int k (the first k blocks) or a list of
    block names (:func:`block_names`). Returns the names of the parameters frozen. A ConfigError, naming
    ``key`` (the setting), for an unknown block or for freezing every block (then nothing could train)."""
    grouped, names = blocks(network), block_names(network)
    if isinstance(which, bool) or not isinstance(which, (int, list, tuple)):
        raise ConfigError(f"{key}={which}: give how many of the first blocks to freeze (0: none) or a list of "
                          f"their names, of {names}")
    if isinstance(which, int):
        if not 0 <= which < len(grouped):
            raise ConfigError(f"{key}={which}: this network has {len(grouped)} blocks ({names}); freeze 0 to "
                              f"{len(grouped) - 1} of them, so that one still trains")
        chosen = list(range(which))
    else:
        unknown = [name for name in which if name not in names]
        if unknown:
            raise ConfigError(f"{key}: no block named {unknown[0]}; this network's blocks are {names}")
        chosen = sorted({names.index(name) for name in which})
        if len(chosen) == len(grouped):
            raise ConfigError(f"{key} names every block of the network ({names}): leave one to train")
    parameters = dict(network.named_parameters())
    frozen = [name for index in chosen for name in grouped[index]]
    for name in frozen:
        parameters[name].requires_grad_(False)
    return frozen
