"""Claims about CUDA: timing asynchronous kernels, and overlapping pinned-memory copies with other work.
Both need a GPU: on a CPU they return a skipped Result that says why."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch

from gan.core.models import DCGANDiscriminator
from gan.patterns.measure import PYTORCH, Result, below, median_ms

# --- timing CUDA work ---------------------------------------------------------------------------------


def timing(device: torch.device, *, size: int = 4096, matmuls: int = 20) -> Result:
    claim = ("timing CUDA work without `torch.cuda.synchronize()` under-reports; CUDA events agree with "
             "synchronized wall time")
    if device.type != "cuda":
        return Result(
            "timing", PYTORCH, claim, "nothing: CPU run",
            "CPU ops run synchronously in the calling thread: when an op returns its work is done, so "
            "`time.perf_counter()` around it measures it and there is nothing to synchronize",
            {}, None)
    a = torch.randn(size, size, device=device)

    def work() -> None:
        for _ in range(matmuls):
            a @ a  # the result is dropped; the kernel runs all the same

    work()  # warm-up: cuBLAS handles and workspaces
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    work()
    unsynced = (time.perf_counter() - start) * 1e3  # only the kernel launches have happened by now
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    work()
    torch.cuda.synchronize(device)
    synced = (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    work()
    end.record()
    end.synchronize()
    events = begin.elapsed_time(end)
    values = {"unsynced_ms": unsynced, "synced_ms": synced, "events_ms": events,
              "unsynced_share": unsynced / synced, "events_deviation": abs(events - synced) / synced}
    expected = {"unsynced_share": below(0.5), "events_deviation": below(0.1)}
    return Result(
        "timing", PYTORCH, claim, f"{matmuls} matmuls {size}x{size} on {device}: wall time without sync, with "
        "sync, and between two CUDA events",
        f"without sync {unsynced:.2f} ms, with sync {synced:.2f} ms, CUDA events {events:.2f} ms",
        values, expected)


# --- non_blocking copies from pinned memory -------------------------------------------------------------


def busy(ms: float) -> None:
    """Keep the host busy for ``ms``: stands for a data loader preparing the next batch."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def non_blocking(device: torch.device, *, batch: int = 1024, size: int = 64, steps: int = 10,
                 repeats: int = 3) -> Result:
    claim = "`.to(device, non_blocking=True)` from pinned memory lets the copy overlap with other work"
    if device.type != "cuda":
        return Result(
            "non_blocking", PYTORCH, claim, "nothing: CPU run",
            "pinned (page-locked) memory and non_blocking copies concern host-to-GPU transfers; on the CPU "
            "`.to('cpu')` copies nothing, so there is no transfer to overlap",
            {}, None)
    d = DCGANDiscriminator(3, size, 16).to(device)
    pinned = [torch.randn(batch, 3, size, size).pin_memory() for _ in range(2)]

    def step(i: int, non_blocking: bool) -> None:
        x = pinned[i % 2].to(device, non_blocking=non_blocking)
        d(x).mean().backward()

    # The host work lasts as long as the GPU's copy + compute of one step, so that overlapping them
    # could at best halve a step.
    gpu_ms = median_ms(device, repeats, gpu=lambda: partial(step, 0, False))["gpu"]

    def loop(non_blocking: bool) -> Callable[[], object]:
        def run() -> None:
            for i in range(steps):
                step(i, non_blocking)
                busy(gpu_ms)
        return run

    ms = median_ms(device, repeats, blocking=lambda: loop(False), non_blocking=lambda: loop(True))

    def call_ms(non_blocking: bool) -> float:
        """How long the host is held inside the ``.to()`` call itself."""
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        pinned[0].to(device, non_blocking=non_blocking)
        held = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize(device)
        return held

    values = {
        "pinned": pinned[0].is_pinned(),
        "gpu_step_ms": gpu_ms,
        "blocking_step_ms": ms["blocking"] / steps,
        "non_blocking_step_ms": ms["non_blocking"] / steps,
        "blocking_call_ms": call_ms(False),
        "non_blocking_call_ms": call_ms(True),
    }
    values["step_ratio"] = values["non_blocking_step_ms"] / values["blocking_step_ms"]
    values["call_ratio"] = values["non_blocking_call_ms"] / values["blocking_call_ms"]
    expected = {"pinned": True, "step_ratio": below(0.9), "call_ratio": below(1.0)}
    mb = pinned[0].nbytes / 2**20
    return Result(
        "non_blocking", PYTORCH, claim,
        f"{steps} steps: copy a pinned {mb:.0f} MiB batch to {device}, D forward+backward, then "
        f"{gpu_ms:.2f} ms of host work (busy loop, as long as the GPU part); blocking vs non_blocking copy",
        f"per step {values['blocking_step_ms']:.2f} ms blocking vs {values['non_blocking_step_ms']:.2f} ms "
        f"non_blocking; host held inside `.to()` {values['blocking_call_ms']:.3f} ms vs "
        f"{values['non_blocking_call_ms']:.3f} ms",
        values, expected)
