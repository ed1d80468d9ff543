"""The process a run trains in: torch's threads (train.threads, shared under Hydra's joblib launcher, or the cores
other work leaves free at the start), Hydra's launcher and sweeper, and the GPU probe that importing Lightning
turns on."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gan.core.torch_private import cpu_has_bf16_units

log = logging.getLogger(__name__)


def prepare_host(threads: int | None, devices: Any = 1) -> None:
    """This process, set up for a run before anything is built: torch's intra-op threads (``train.threads``, or
    what :func:`torch_threads` chooses; fixed for the whole run, logged with why), and no GPU probe at every
    optimizer step on a machine without a GPU."""
    no_gpu_probe_per_step()
    count, why = torch_threads(threads, devices)
    if count is not None:
        torch.set_num_threads(count)
        log.info(f"torch threads: {count} ({why})")


def launched_by(node: str) -> DictConfig:
    """Hydra's ``hydra.<node>`` config (``launcher``, ``sweeper``) of the job running now; empty outside Hydra
    (the Python API, tests that compose)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get()[node] if HydraConfig.initialized() else OmegaConf.create({})


def no_gpu_probe_per_step() -> None:
    """Without a GPU, drop the PYTORCH_NVML_BASED_CUDA_CHECK=1 that importing Lightning sets.

    Lightning sets it so that counting GPUs does not initialise CUDA before a fork. But Adam's step asks
    ``torch.cuda.is_available()`` at every call, and until CUDA is initialised, which never happens on a
    CPU run, that variable makes each answer try to load NVML again: about 0.3 ms, twice a generator
    step, with a CUDA build of torch (pip's default on Linux). With no GPU there is no CUDA state a fork
    could inherit, and the plain check costs microseconds (docs/benchmarks.md).
    """
    if os.environ.get(NVML_CHECK) == "1" and torch.cuda.device_count() == 0:
        del os.environ[NVML_CHECK]


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def torch_threads(threads: int | None, devices: Any = 1) -> tuple[int | None, str]:
    """The intra-op threads this run sets (None: torch's default), and why. ``train.threads`` when given; under
    Hydra's joblib launcher, whose jobs run side by side in processes of their own, the cores this process
    may use shared evenly among ``hydra.launcher.n_jobs`` of them (-1: one per core, -2 all but one, as
    joblib counts), so that jobs x threads = cores. Else, for a run on one device where OMP_NUM_THREADS does not
    say, the cores other work leaves free at the start: each of torch's threads waits at every operation for the
    slowest, so a thread that shares a core with a busy process slows every step (3.5x on 2 cores beside one:
    docs/design.md, "Threads"). The count is fixed for the run: a count that followed the load would change
    the order of its sums, and so its numbers, from one step to the next."""
    if threads is not None:
        return threads, "train.threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    launcher = launched_by("launcher")
    if "joblib" in str(launcher.get("_target_", "")):
        jobs = int(launcher.get("n_jobs", -1))
        jobs = max(cores + 1 + jobs, 1) if jobs < 0 else jobs
        return max(cores // jobs, 1), f"{cores} cores shared by hydra.launcher.n_jobs={jobs} jobs"
    if "OMP_NUM_THREADS" in os.environ or str(devices) != "1" or cores < 2:
        return None, "torch's default"
    busy = busy_cores()
    if busy < 1:
        return None, "torch's default"
    free = max(cores - busy, 1)
    return free, (f"other work kept {busy} of {cores} cores busy at the start; train.threads=N chooses, and makes "
                  "the run's numbers independent of the load")


def busy_cores(window: float = 0.2) -> int:
    """How many of this process's cores other processes keep busy, over ``window`` seconds of /proc/stat
    (rounded; 0 where the system has no /proc/stat). This process sleeps meanwhile, so the busy time is theirs."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return 0
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def times() -> dict[str, tuple[int, int]]:
        out = {}
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu" and (allowed is None or int(name[3:]) in allowed):
                values = [int(v) for v in fields]
                out[name] = (sum(values[:8]), values[3] + values[4])  # (all but guest time, idle + iowait)
        return out

    before = times()
    time.sleep(window)
    after = times()
    busy = 0.0
    for name, (total, idle) in after.items():
        elapsed = total - before[name][0]
        if elapsed > 0:
            busy += 1 - (idle - before[name][1]) / elapsed
    return round(busy)


def slow_bf16_warning(device: torch.device, precision: str) -> str | None:
    """A line to warn with when bf16 autocast would slow this run down: on a CPU without bf16 instructions
    (AVX512-BF16 or AMX) every bf16 convolution is emulated, several times slower than float32 (measured on
    an AMD EPYC: docs/results.md). None when it would not. ``torch.cpu``'s checks are the ones its x86
    kernels dispatch on; on other CPUs they answer False, hence "may" in the line."""
    if device.type != "cpu" or not precision.startswith("bf16"):
        return None
    if cpu_has_bf16_units():
        return None
    return (f"trainer.precision={precision} on a CPU without AVX512-BF16 or AMX instructions: bf16 convolutions may "
            "run several times slower than float32 here; add trainer.precision=32-true to train in float32")
