"""The process a run trains in: torch's threads (train.threads, or shared under Hydra's joblib launcher),
Hydra's launcher and sweeper, and the GPU probe that importing Lightning turns on."""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig, OmegaConf


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


def torch_threads(threads: int | None) -> tuple[int | None, str]:
    """The intra-op threads this run sets (None: torch's default), and why. ``train.threads`` when given; under
    Hydra's joblib launcher, whose jobs run side by side in processes of their own, the cores this process
    may use shared evenly among ``hydra.launcher.n_jobs`` of them (-1: one per core, -2 all but one, as
    joblib counts), so that jobs x threads = cores."""
    if threads is not None:
        return threads, "train.threads"
    launcher = launched_by("launcher")
    if "joblib" not in str(launcher.get("_target_", "")):
        return None, "torch's default"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    jobs = int(launcher.get("n_jobs", -1))
    jobs = max(cores + 1 + jobs, 1) if jobs < 0 else jobs
    return max(cores // jobs, 1), f"{cores} cores shared by hydra.launcher.n_jobs={jobs} jobs"


def slow_bf16_warning(device: torch.device, precision: str) -> str | None:
    """A line to warn with when bf16 autocast would slow this run down: on a CPU without bf16 instructions
    (AVX512-BF16 or AMX) every bf16 convolution is emulated, several times slower than float32 (measured on
    an AMD EPYC: docs/results.md). None when it would not. ``torch.cpu``'s checks are the ones its x86
    kernels dispatch on; on other CPUs they answer False, hence "may" in the line."""
    if device.type != "cpu" or not precision.startswith("bf16"):
        return None
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return None
    return (f"trainer.precision={precision} on a CPU without AVX512-BF16 or AMX instructions: bf16 convolutions may "
            "run several times slower than float32 here; add trainer.precision=32-true to train in float32")
