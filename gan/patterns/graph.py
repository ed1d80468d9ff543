"""``python -m gan.patterns graph``: the autograd graphs of one training step, as text trees and pictures."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from gan.core import step
from gan.evaluation.graphs import ForwardRecorder, Graph, dot_path, draw, text_tree, to_dot
from gan.patterns.models import adam, gan_inputs, training_module


def step_graphs(device: torch.device, batch: int = 4, model: str = "dcgan") -> dict[str, Graph]:
    """The graphs of one training step of the GANModule that ``train.py model=<model>`` builds (small: 16 x 16
    images), recorded as :func:`gan.core.step.generator_step` runs it, before each backward; then, for contrast,
    the D update on the undetached ``fake`` (:func:`gan.core.step.d_update`), the G loss with D left trainable,
    and sampling (``GANModule.generate``, under ``evaluating``)."""
    module = training_module(device, model=model)
    g, d = module.G, module.D
    z, real = gan_inputs(device, batch)
    known = {"real images": real, "noise z": z}
    graphs: dict[str, Graph] = {}

    with ForwardRecorder(G=g, D=d) as recorder:
        def recorded_d_loss(name: str, caption: str) -> step.DLoss:
            def d_loss(D: nn.Module, real: Tensor, fake: Tensor, labels: Tensor | None, k: int) -> tuple[Tensor, ...]:
                out = module.objective.d_loss(D, real, fake, labels, k)
                graphs[name] = recorder.graph("D loss", out[0], caption, known)
                return out
            return d_loss

        def g_loss(D: nn.Module, fake: Tensor, real: Tensor, labels: Tensor | None) -> Tensor:
            loss = module.objective.g_loss(D, fake, real, labels)
            graphs["g_loss"] = recorder.graph("G loss", loss, "the G update: through D(fake), with D frozen", known)
            return loss

        step.generator_step(g, d, adam(g), adam(d), [step.Batch(z, real, None)],
                            recorded_d_loss("d_loss", "the D update: D(real) and D(fake.detach())"), g_loss)

        fake = g(z)
        step.d_update(d, adam(d), recorded_d_loss("d_loss_without_detach", "a D update on the undetached fake"),
                      real, fake, None)
        # The G loss as g_update computes it, without g_update's frozen(D).
        graphs["g_loss_d_not_frozen"] = recorder.graph("G loss", module.objective.g_loss(d, g(z), real, None),
                                                       "a G loss with D not frozen", known)
    with ForwardRecorder(G=g, D=d) as recorder:
        graphs["sampling"] = recorder.graph("samples", module.generate(z), "GANModule.generate, under evaluating(G)")
    return graphs


PICTURES = {
    "autograd_step": ("One training step (gan.core.step.generator_step) of the GANModule train.py builds",
                      ("d_loss", "g_loss")),
    "autograd_contrast": ("For contrast: the D update without detach, the G loss with D not frozen, sampling",
                          ("d_loss_without_detach", "g_loss_d_not_frozen", "sampling")),
}


def main(out: Path, device: torch.device, model: str = "dcgan") -> int:
    """Print every graph of :func:`step_graphs` as a text tree; draw them (SVG and PNG) into ``out``
    when Graphviz's ``dot`` is installed."""
    graphs = step_graphs(device, model=model)
    print("\n\n".join(text_tree(g) for g in graphs.values()))
    if dot_path() is None:
        print("\nno pictures: Graphviz's `dot` is not installed (apt-get install graphviz)")
        return 0
    print()
    out.mkdir(parents=True, exist_ok=True)
    for stem, (title, names) in PICTURES.items():
        dot_text = to_dot([graphs[n] for n in names], title)
        for fmt in ("svg", "png"):
            (out / f"{stem}.{fmt}").write_bytes(draw(dot_text, fmt))
            print(f"wrote {out / f'{stem}.{fmt}'}")
    return 0
