"""Training stays bit-identical. For every recipe, 10 generator steps trained here end in exactly the state (a
sha256 of last.ckpt's weights, buffers, counters, optimizer and schedule states and random streams:
tools/training_fingerprints.py) recorded in tests/data/training_fingerprints.json for this machine. So the loop,
the step and the builders give the same weights, optimizer states and random streams as the commit the
fingerprints were recorded at, on this machine.

The numbers depend on the CPU, the torch release and the thread count: fingerprints are kept per machine
(``machine()``) and every run trains on one thread; on a machine with none recorded the test skips, saying how to
record them.
"""

from __future__ import annotations

import json

import pytest
from conftest import MNIST_T10K

from tools.training_fingerprints import CASES, RECORDED, fingerprint, machine, needs_mnist

STEPS = 10
MACHINE = machine()
RECORD = f"python tools/training_fingerprints.py --tree <a checkout whose training you trust> --steps {STEPS} --record"
NO_MNIST = pytest.mark.skipif(not MNIST_T10K.is_dir(), reason="../shared/data/mnist_t10k is absent")


def recorded(key: str) -> str | None:
    return json.loads(RECORDED.read_text()).get(MACHINE, {}).get(key) if RECORDED.is_file() else None


@pytest.mark.parametrize("case", [pytest.param(c, marks=NO_MNIST) if needs_mnist(c) else c for c in CASES])
def test_training_ends_in_the_recorded_state(case, tmp_path):
    expected = recorded(f"{case}@{STEPS}")
    if expected is None:
        pytest.skip(f"no fingerprint of {case}@{STEPS} recorded for {MACHINE!r}: {RECORD}")
    assert fingerprint(case, STEPS, tmp_path / "run") == expected, (
        f"{case}: {STEPS} steps no longer end in the recorded state (weights, optimizer states or random streams); "
        f"python tools/training_fingerprints.py --check names every case that changed")
