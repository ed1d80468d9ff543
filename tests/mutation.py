"""Deliberate breakages of the real training step (gan/core/step.py), for tests that show a check fails
when the step it certifies is broken: the audit during training, and the claims of gan.patterns."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator

import gan.core.step

# (text in gan/core/step.py, what it becomes)
WITHOUT_DETACH = ("real, fake.detach(), labels", "real, fake, labels")
D_NOT_FROZEN = ("with frozen(D),", "with frozen(),")  # frozen() with no modules freezes nothing
NO_ZERO_GRAD_G = ("opt_g.zero_grad(set_to_none=True)", "pass")
NO_G_STEP = ("opt_g.step()", "pass")


@contextlib.contextmanager
def mutated_step(original: str, replacement: str) -> Iterator[None]:
    """gan/core/step.py with ``original`` replaced, for the duration of the block.

    The edited source runs in the module's own namespace, so every caller that goes through
    ``gan.core.step.<function>`` (GANModule, gan.patterns) runs the broken step; reloading restores it.
    """
    source = inspect.getsource(gan.core.step)
    assert source.count(original) == 1, f"gan/core/step.py must contain {original!r} exactly once"
    try:
        exec(compile(source.replace(original, replacement), gan.core.step.__file__, "exec"), gan.core.step.__dict__)
        yield
    finally:
        importlib.reload(gan.core.step)
