"""The two adapters to what libraries do not promise to keep: torch's private fused kernels
(gan/core/torch_private.py) and Lightning Fabric below its public wrappers (gan/training/fabric_adapter.py).
Each function is run on real tensors, a real Fabric or Fabric's real classes, so that a release that moves or
changes one fails here, by name, rather than somewhere in a training run."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import nn

from gan.core import torch_private
from gan.training import fabric_adapter


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, None])
def test_flag_nonfinite_flags_inf_and_nan_in_any_tensor_and_leaves_the_values(bad):
    tensors = [torch.tensor([1.0, -2.0]), torch.tensor([[3.0, 4.0]])]
    if bad is not None:
        tensors[1][0, 1] = bad
    before = [t.clone() for t in tensors]
    found, one = torch.zeros(()), torch.ones(())
    torch_private.flag_nonfinite(tensors, found, one)
    assert found.item() == (0.0 if bad is None else 1.0)
    assert all(torch.allclose(a, b, equal_nan=True) for a, b in zip(tensors, before))  # an inverse scale of 1


def test_the_foreach_kernels_do_per_tensor_what_their_names_say():
    a, b = [torch.tensor([3.0, 4.0]), torch.ones(2, 2)], [torch.zeros(2), torch.full((2, 2), 3.0)]
    assert [n.item() for n in torch_private.foreach_norm(a)] == [5.0, 2.0]
    averages = [t.clone() for t in a]
    torch_private.foreach_lerp_(averages, b, 0.25)
    assert all(torch.equal(x, torch.lerp(y, z, 0.25)) for x, y, z in zip(averages, a, b))
    torch_private.foreach_copy_(averages, b)
    assert all(torch.equal(x, z) for x, z in zip(averages, b))
    assert isinstance(torch_private.cpu_has_bf16_units(), bool)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_fabric_adapter_on_a_real_fabric(precision):
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    layer = nn.Linear(3, 2)
    assert fabric_adapter.placed(fabric, layer) is layer and fabric_adapter.wrapped(fabric, layer) is layer
    assert fabric_adapter.loss_scaler(fabric) is None  # only float16 scales its loss
    with fabric_adapter.autocast(fabric)():
        out = layer(torch.ones(1, 3))
    assert out.dtype == (torch.float32 if precision == "32-true" else torch.bfloat16)
    state = fabric_adapter.precision_state(fabric)
    fabric_adapter.load_precision_state(fabric, state)
    assert fabric_adapter.every_rank(fabric, True, all=True) and not fabric_adapter.every_rank(fabric, False, all=False)
    fabric_adapter.kill_other_ranks(fabric)  # one process: nothing to end


def test_what_the_fabric_adapter_reads_of_ddp_and_float16_is_still_there():
    """What only trainer=ddp or a GPU exercises (their runs: tests/test_ddp.py and the CUDA tests): the names and
    signatures the adapter calls."""
    assert list(inspect.signature(DDPStrategy.setup_module).parameters) == ["self", "module"]
    assert list(inspect.signature(DDPStrategy.reduce_boolean_decision).parameters) == ["self", "decision", "all"]
    launcher = _SubprocessScriptLauncher.__new__(_SubprocessScriptLauncher)
    _SubprocessScriptLauncher.__init__(launcher, cluster_environment=None, num_processes=2, num_nodes=1)
    assert launcher.procs == []  # the processes it starts for the other ranks, which the adapter ends
    scaler = MixedPrecision("16-mixed", "cpu").scaler
    assert isinstance(scaler, torch.amp.GradScaler)
