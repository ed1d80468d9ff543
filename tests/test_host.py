"""The process a run trains in (gan/training/host.py): torch's threads leave out the cores other work keeps busy
when the run starts, unless the user chose a count, and a run leaves torch's thread count as it found it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY, compose_config

from gan.training.host import busy_cores, torch_threads
from gan.training.loop import train

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.skipif(CORES < 2 or not os.path.isfile("/proc/stat"), reason="needs 2 cores and Linux's /proc/stat")
def test_a_core_kept_busy_by_another_process_is_left_out_of_torchs_threads(monkeypatch):
    """Beside one busy process, the run takes the other cores; a count the user gives (train.threads, or
    OMP_NUM_THREADS, which torch reads) is theirs."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert busy_cores() >= 1
        threads, why = torch_threads(None)
        assert threads is not None and 1 <= threads <= CORES - 1 and "busy at the start" in why
        assert torch_threads(2) == (2, "train.threads")
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert torch_threads(None) == (None, "torch's default")
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert torch_threads(None, devices=2) == (None, "torch's default")  # DDP ranks: each its own process
    finally:
        busy.kill()
        busy.wait()


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
