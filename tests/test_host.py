"""The process a run trains in (gan/__init__.py, gan/training/host.py): torch's idle pool threads sleep instead of
spinning, unless the user chose otherwise, and a run leaves torch's thread count as it found it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY, compose_config

from gan.training.loop import train

# CPU seconds the process spends over ten 50-ms pauses, each after one parallel operation: a pool thread that spins
# while it waits burns the pauses; one that sleeps burns only the operations.
IDLE_CPU = """
import resource, time
import gan  # first: it chooses the wait policy before torch loads its OpenMP runtime
import torch
torch.set_num_threads(2)
x = torch.ones(4_000_000)
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
for _ in range(3):
    x.add_(1)
start = cpu()
for _ in range(10):
    x.add_(1)
    time.sleep(0.05)
print(cpu() - start)
"""


def idle_cpu_seconds(**variables: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", IDLE_CPU], cwd=ROOT, env={**env, **variables}, capture_output=True,
                         text=True, timeout=120, check=True)
    return float(out.stdout)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch's pool has no second thread to wait")
def test_idle_pool_threads_sleep_unless_the_user_sets_a_wait_policy():
    """A user's OMP_WAIT_POLICY=ACTIVE is kept (its threads spin through the pauses); without one, gan's choice of
    PASSIVE makes the pauses cost next to nothing."""
    sleeping, spinning = idle_cpu_seconds(), idle_cpu_seconds(OMP_WAIT_POLICY="ACTIVE")
    assert spinning > 0.2 and sleeping < spinning / 2, (sleeping, spinning)


def test_a_run_that_sets_its_threads_leaves_torchs_count_as_it_found_it(tmp_path):
    """train.threads applies to the run alone: a notebook or a test suite that trains goes on with its own count."""
    before = torch.get_num_threads()
    cfg = compose_config(*TINY, "train.threads=1", "trainer.max_steps=1", run_dir=tmp_path / "run")
    torch.set_num_threads(2)
    try:
        train(cfg)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
