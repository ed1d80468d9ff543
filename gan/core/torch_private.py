"""The private torch functions this project calls, in one place: torch's fused multi-tensor kernels (what its
optimizers and GradScaler run on) and its CPU capability probes. Each does in one call what the public API does
in one call per tensor (or not at all), on the hot path; torch does not promise to keep them, so
tests/test_library_adapters.py checks that each still exists and behaves as used here."""

from __future__ import annotations

import torch

# flag_nonfinite(tensors, found, one): sets ``found`` (a one-element float tensor) to 1 if any element of any
# tensor is inf or NaN, in one kernel and without a host read; with ``one`` (a tensor of 1.0) as the inverse
# scale the tensors keep their values. GradScaler's own check.
flag_nonfinite = torch._amp_foreach_non_finite_check_and_unscale_
foreach_norm = torch._foreach_norm  # the L2 norm of each tensor of a list
foreach_lerp_ = torch._foreach_lerp_  # a[i] += w * (b[i] - a[i]) for every pair, in place
foreach_copy_ = torch._foreach_copy_  # a[i].copy_(b[i]) for every pair


def cpu_has_bf16_units() -> bool:
    """Whether this CPU has the instructions (AVX512-BF16 or AMX) torch's x86 kernels dispatch bf16 work to."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
