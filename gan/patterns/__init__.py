"""Measured demonstrations of the autograd patterns this project relies on: ``python -m gan.patterns``.

Imported by nothing in the library. Each claim is a function ``name(device, ...) -> Result`` that runs
on the project's own code and returns what it measured next to what it expects:

    measure.py     Result, Check and the verdict; the measuring toolkit (times, FLOPs, saved bytes)
    models.py      what the claims run on: the project's small models, inputs, the GANModule train.py builds
    tensors.py     tensors and modules as autograd sees them: .to(), registration, requires_grad, leaves
    gan_step.py    the GAN step: freezing D, detaching the fake, D's logits across opt_d.step(), conditioning
    evaluation.py  evaluating without a graph: volatile, no_grad, inference_mode
    cuda.py        timing CUDA work, non_blocking copies (skipped on a CPU)
    claims.py      every claim in table order (DEMOS) and the markdown table
    graph.py       ``python -m gan.patterns graph``: pictures of one training step's autograd graphs
"""
