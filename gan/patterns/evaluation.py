"""Claims about evaluating without a graph: ``volatile`` is gone, ``torch.no_grad()`` (the project's
``evaluating``) saves nothing for backward, and ``inference_mode`` goes further at a price."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd import Variable

from gan.core.contexts import evaluating
from gan.core.models import MLPDiscriminator, build_models
from gan.patterns.measure import (
    PYTORCH,
    Check,
    Result,
    above,
    contains,
    cuda_peak_bytes,
    median_ms,
    mib,
    packed_bytes,
    quote,
    raised,
    state_tensors,
    versions_around_inplace_edit,
)
from gan.patterns.models import LOSS, Z_DIM, gan_inputs, make_gan

# --- volatile is gone --------------------------------------------------------------------------------


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
        "volatile", PYTORCH,
        "`volatile` is gone; `torch.no_grad()` replaces it",
        "`Variable(real, volatile=True)` into D; the same batch into D under `torch.no_grad()`",
        f"warning {quote(values['warnings'][0] if values['warnings'] else None)}; Variable returns a plain "
        f"Tensor {values['variable_is_plain_tensor']}, `.volatile` {volatile_flag}; D(volatile input) "
        f"requires grad {values['volatile_output_requires_grad']} (no effect); under no_grad "
        f"{values['no_grad_output_requires_grad']}",
        values, expected)


# --- evaluation under no_grad -------------------------------------------------------------------------


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
        "no_grad", PYTORCH,
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
