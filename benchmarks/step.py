"""How fast is a training step? The framework against bare PyTorch and against pytorch/examples' DCGAN.

Usage: python benchmarks/step.py [--device cpu|cuda] [--rounds 3] [--steps 40] [--only NAME ...]
                                 [--write docs/benchmarks.md]

Everything runs in this one process, on the same models, batch, data and seed; variants alternate
round by round so that load on a shared machine hits them alike; each figure is a median of
step-to-step times, and comparisons are ratios. Sections:

(a) the framework's step through the real ``gan.training.train`` path (data pipeline, callbacks,
    logging, timing) vs a bare PyTorch loop written below with the same models, losses and features:
    DCGAN 64x64x3 batch 64 from an image folder, and the ring preset (MLP, batch 512, R1, EMA);
(b) the framework vs the step structure of pytorch/examples' DCGAN (its G/D layout at 64x64, Sigmoid +
    BCELoss, one G forward reused, D not frozen in the G step, the losses read every step), written
    below: with fp32 defaults and with the fastest configuration measured in (e);
(c) the detach and freeze decisions, from ``python -m gan.patterns`` (the training step's own code);
(d) evaluation under no_grad vs with autograd: time and memory held;
(e) each speed option alone and combined vs fp32 eager, through ``train``: bf16 autocast
    (``trainer.precision=bf16-mixed``), ``train.channels_last=true``, ``train.compile=true``;
(f) the cost of the per-phase timing itself: ``timing.enabled`` true vs false.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from PIL import Image
from torch import Tensor, nn

from gan.core.contexts import evaluating
from gan.core.models import build_models
from gan.core.phases import PHASES, PhaseTimer
from gan.data.datasets import build_dataset
from gan.patterns import gan_step, measure
from gan.training.builder import train

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
WARMUP = 5  # steps dropped from every measurement: allocator, caches, first logging


# --- measuring ---------------------------------------------------------------------------------------------

def median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[WARMUP:])


def compose_train(*overrides: str, run_dir: Path) -> OmegaConf:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["trainer.enable_progress_bar=false", "log.sample_every=100000",
                                          "checkpoint.every=100000", *overrides])
    OmegaConf.update(cfg, "paths.run_dir", str(run_dir), force_add=True)
    return cfg


class StepClock(L.Callback):
    """The time at the end of every generator step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: object) -> None:
        self.ends.append(time.perf_counter())


def framework_ms(overrides: list[str], steps: int, device: str) -> float:
    """Median step-to-step milliseconds of ``python train.py <overrides>``: the real train(), with its
    data pipeline, callbacks, logging (every 10 steps) and timing."""
    with tempfile.TemporaryDirectory() as tmp:
        accelerator = "gpu" if device == "cuda" else "cpu"
        cfg = compose_train(*overrides, f"trainer.max_steps={steps}", f"trainer.accelerator={accelerator}",
                            run_dir=Path(tmp) / "run")
        clock = StepClock()
        train(cfg, [clock])
        return median_after_warmup([(b - a) * 1e3 for a, b in zip(clock.ends, clock.ends[1:])])


def bare_ms(step: Callable[[], object], steps: int, device: torch.device) -> float:
    """Median step-to-step milliseconds of ``step`` called in a plain loop."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return median_after_warmup(times)


def alternate(rounds: int, **variants: Callable[[], float]) -> dict[str, float]:
    """Each variant once per round, in turn, the order reversed every other round (so that no variant
    always runs first, after the same neighbour); the median over rounds of each variant's figure."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name in list(variants)[:: -1 if round_ % 2 else 1]:
            results[name].append(variants[name]())
    return {name: statistics.median(values) for name, values in results.items()}


# --- data --------------------------------------------------------------------------------------------------

def image_folder(directory: Path, count: int = 512, size: int = 64) -> Path:
    """``count`` RGB PNGs of coloured discs on gradients: an image folder that needs no download."""
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[:size, :size]
    for i in range(count):
        base = (rng.random(3) * 255 * (xx[..., None] / size)).astype(np.uint8)
        cx, cy, r = rng.integers(8, size - 8, 2).tolist() + [int(rng.integers(4, 16))]
        base[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = (rng.random(3) * 255).astype(np.uint8)
        Image.fromarray(base).save(directory / f"{i:04d}.png")
    return directory


# --- (a) the bare loop: the framework's models, losses and features, in plain PyTorch ----------------------

def bare_step(cfg: OmegaConf, device: torch.device) -> Callable[[], object]:
    """One generator step in plain PyTorch, as the framework computes it: same models (built from the
    same config and seed), non-saturating loss, Adam, the R1 and EMA the preset uses, batches drawn
    from the dataset held as one tensor on the device."""
    container = OmegaConf.to_container(cfg, resolve=True)
    torch.manual_seed(cfg.seed)
    dataset = build_dataset(container["data"], cfg.seed)
    data = torch.stack([dataset[i][0] for i in range(len(dataset))]).to(device)
    shape = tuple(data.shape[1:])
    g, d = build_models(container["model"], cfg.train.z_dim, shape)
    g, d = g.to(device), d.to(device)
    if data.dim() == 4 and cfg.train.channels_last:  # images, in the layout the framework uses
        g, d = g.to(memory_format=torch.channels_last), d.to(memory_format=torch.channels_last)
        data = data.contiguous(memory_format=torch.channels_last)
    ema = [p.detach().clone() for p in g.parameters()] if cfg.ema.enabled else []
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    r1_gamma = cfg.reg.gamma if cfg.reg.name == "r1" else 0.0
    batch = cfg.train.batch_size

    def step() -> None:
        real = data[torch.randint(len(data), (batch,), device=device)]
        fake = g(torch.randn(batch, cfg.train.z_dim, device=device))
        if r1_gamma:
            real.requires_grad_(True)
        real_logits, fake_logits = d(real), d(fake.detach())
        loss_d = F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()
        if r1_gamma:
            (grad,) = torch.autograd.grad(real_logits.sum(), real, create_graph=True)
            loss_d = loss_d + r1_gamma / 2 * grad.pow(2).flatten(1).sum(1).mean()
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        d.requires_grad_(False)
        loss_g = F.softplus(-d(fake)).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        d.requires_grad_(True)
        opt_g.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, [p.detach() for p in g.parameters()], 1 - cfg.ema.decay)
    return step


# --- (b) pytorch/examples' DCGAN step structure ------------------------------------------------------------

def examples_dcgan(nz: int = 100, ngf: int = 64, ndf: int = 64, nc: int = 3) -> tuple[nn.Module, nn.Module]:
    """G and D laid out as pytorch/examples' dcgan/main.py at 64x64 (BatchNorm, Sigmoid output)."""
    def up(i: int, o: int, *args: int) -> list[nn.Module]:
        return [nn.ConvTranspose2d(i, o, 4, *args, bias=False), nn.BatchNorm2d(o), nn.ReLU(True)]

    def down(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 4, 2, 1, bias=False), nn.BatchNorm2d(o), nn.LeakyReLU(0.2, inplace=True)]

    g = nn.Sequential(*up(nz, ngf * 8, 1, 0), *up(ngf * 8, ngf * 4, 2, 1), *up(ngf * 4, ngf * 2, 2, 1),
                      *up(ngf * 2, ngf, 2, 1), nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())
    d = nn.Sequential(nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                      *down(ndf, ndf * 2), *down(ndf * 2, ndf * 4), *down(ndf * 4, ndf * 8),
                      nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())
    return g, d


def examples_step(data: Tensor, batch: int, device: torch.device, nz: int = 100) -> Callable[[], object]:
    g, d = (m.to(device) for m in examples_dcgan(nz))
    criterion = nn.BCELoss()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    ones, zeros = torch.ones(batch, device=device), torch.zeros(batch, device=device)

    def step() -> tuple[float, ...]:
        real = data[torch.randint(len(data), (batch,), device=device)]
        d.zero_grad()
        err_real = criterion(d(real).view(-1), ones)
        err_real.backward()
        fake = g(torch.randn(batch, nz, 1, 1, device=device))
        output = d(fake.detach()).view(-1)
        err_fake = criterion(output, zeros)
        err_fake.backward()
        opt_d.step()
        g.zero_grad()
        output = d(fake).view(-1)  # D is not frozen: its weight gradients are computed, then discarded
        err_g = criterion(output, ones)
        err_g.backward()
        opt_g.step()
        return (err_real + err_fake).item(), err_g.item(), output.mean().item()  # read every step
    return step


# --- (d) evaluation -----------------------------------------------------------------------------------------

def evaluation_cost(device: torch.device, rounds: int) -> dict[str, float]:
    cfg = compose_train("data=folder", "data.path=unused", "train.z_dim=100", run_dir=Path("unused"))
    g, _ = build_models(OmegaConf.to_container(cfg.model, resolve=True), 100, (3, 64, 64))
    g = g.to(device)
    z = torch.randn(256, 100, device=device)

    def with_autograd() -> object:
        g.eval()
        out = g(z)
        g.train()
        return out

    def under_no_grad() -> object:
        with evaluating(g):
            return g(z)

    ms = measure.median_ms(device, rounds * 5, autograd=lambda: with_autograd, no_grad=lambda: under_no_grad)
    exclude = [*measure.state_tensors(g), z]
    held = {"autograd": measure.packed_bytes(with_autograd, exclude),
            "no_grad": measure.packed_bytes(under_no_grad, exclude)}
    return {"autograd_ms": ms["autograd"], "no_grad_ms": ms["no_grad"],
            "autograd_mib": held["autograd"] / 2**20, "no_grad_mib": held["no_grad"] / 2**20}


# --- report ------------------------------------------------------------------------------------------------

def machine(device: torch.device) -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                   if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    return (f"{cpu}, {torch.get_num_threads()} threads{gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}, device {device}")


# --- the sections ------------------------------------------------------------------------------------------

DCGAN64 = ["model.width=64", "train.z_dim=100", "data.image_size=64", "data.batch_size=64", "augment=none",
           "reg=none"]
SPEED_OPTIONS = {
    "fp32, NCHW": ["train.channels_last=false"],
    "fp32, channels_last (the default)": [],
    "bf16 autocast, NCHW": ["trainer.precision=bf16-mixed", "train.channels_last=false"],
    "bf16 autocast + channels_last": ["trainer.precision=bf16-mixed"],
    "compile (fp32, channels_last)": ["train.compile=true"],
    "bf16 + channels_last + compile": ["trainer.precision=bf16-mixed", "train.compile=true"],
}
# The ring setting these speed figures were measured with (before the 10-seed quality preset,
# experiment=ring, which trains a smaller MLP with a decaying learning rate).
RING_R1 = ["~experiment", "data=ring", "reg=r1", "data.batch_size=512"]
BASELINE, DEFAULTS = "fp32, NCHW", "fp32, channels_last (the default)"


def section_a(folder: Path, args: argparse.Namespace, device: torch.device) -> list[str]:
    rows = ["| preset | framework `train()` | bare PyTorch loop | ratio | target |", "|---|---|---|---|---|"]
    presets = {"DCGAN 64x64x3, batch 64, image folder": (["data=folder", f"data.path={folder}", *DCGAN64], 1.05),
               "ring (MLP 3x256, batch 512, R1, EMA)": (RING_R1, 1.10)}
    for name, (overrides, target) in presets.items():
        cfg = compose_train(*overrides, run_dir=Path("unused"))
        step = bare_step(cfg, device)
        ms = alternate(args.rounds, framework=lambda o=overrides: framework_ms(o, args.steps, device.type),
                       bare=lambda s=step: bare_ms(s, args.steps, device))
        ratio = ms["framework"] / ms["bare"]
        rows.append(f"| {name} | {ms['framework']:.1f} ms | {ms['bare']:.1f} ms | **{ratio:.2f}** | <= {target} |")
        print(rows[-1], flush=True)
    return rows


def section_b_e(folder: Path, args: argparse.Namespace, device: torch.device) -> tuple[list[str], list[str]]:
    base = ["data=folder", f"data.path={folder}", *DCGAN64]
    cfg = compose_train(*base, run_dir=Path("unused"))
    data = torch.stack([t for t in build_dataset(OmegaConf.to_container(cfg.data), 0).tensors[0]]).to(device)
    reference = examples_step(data, 64, device)
    variants = {name: (lambda o=options: framework_ms([*base, *o], args.steps, device.type))
                for name, options in SPEED_OPTIONS.items() if device.type == "cuda" or "compile" not in name
                or args.compile}
    ms = alternate(args.rounds, examples=lambda: bare_ms(reference, args.steps, device), **variants)
    e_rows = [f"| option | step | vs {BASELINE} |", "|---|---|---|"]
    e_rows += [f"| {name} | {ms[name]:.1f} ms | {ms[BASELINE] / ms[name]:.2f}x |" for name in variants]
    fastest = min(variants, key=lambda name: ms[name])
    b_rows = ["| framework configuration | step | pytorch/examples step | speed-up | target |", "|---|---|---|---|---|",
              f"| {DEFAULTS} | {ms[DEFAULTS]:.1f} ms | {ms['examples']:.1f} ms | "
              f"**{ms['examples'] / ms[DEFAULTS]:.2f}x** | >= 1.10x |",
              f"| fastest: {fastest} | {ms[fastest]:.1f} ms | {ms['examples']:.1f} ms | "
              f"**{ms['examples'] / ms[fastest]:.2f}x** | >= 3x |"]
    print("\n".join(b_rows + e_rows), flush=True)
    return b_rows, e_rows


def section_c(device: torch.device) -> list[str]:
    d_step, freeze = gan_step.gan_d_step(device), gan_step.freeze(device)
    v, f = d_step.values, freeze.values
    rows = ["| decision | with | without | ratio |", "|---|---|---|---|",
            f"| D update on `fake.detach()` vs `retain_graph=True`: whole step | {v['step_ms']['detach']:.1f} ms, "
            f"{v['flops']['detach'] / 1e6:.0f} MFLOP | {v['step_ms']['retain_graph']:.1f} ms, "
            f"{v['flops']['retain_graph'] / 1e6:.0f} MFLOP | "
            f"{v['step_ms']['detach'] / v['step_ms']['retain_graph']:.2f} (time), {v['flop_ratio']:.2f} (FLOPs) |",
            f"| D frozen vs trainable in the G update | {f['frozen_ms']:.1f} ms, {f['flops_frozen'] / 1e6:.0f} MFLOP | "
            f"{f['trainable_ms']:.1f} ms, {f['flops_trainable'] / 1e6:.0f} MFLOP | {f['time_ratio']:.2f} (time), "
            f"{f['flop_ratio']:.2f} (FLOPs) |"]
    print("\n".join(rows), flush=True)
    return rows


def section_d(device: torch.device, rounds: int) -> list[str]:
    e = evaluation_cost(device, rounds)
    rows = ["| sampling 256 images, DCGAN G 64x64 | time | activations held for backward |", "|---|---|---|",
            f"| eval mode, autograd on | {e['autograd_ms']:.1f} ms | {e['autograd_mib']:.1f} MiB |",
            f"| `evaluating(G)`: eval mode + no_grad | {e['no_grad_ms']:.1f} ms | {e['no_grad_mib']:.1f} MiB |",
            f"| ratio | {e['no_grad_ms'] / e['autograd_ms']:.2f} | {e['no_grad_mib'] / e['autograd_mib']:.2f} |"]
    print("\n".join(rows), flush=True)
    return rows


def phase_cost_us(enabled: bool, calls: int = 20000) -> float:
    """Microseconds one ``with timer.phase(...)`` block costs, timed over ``calls`` empty blocks."""
    timer = PhaseTimer(enabled)
    start = time.perf_counter()
    for i in range(calls):
        with timer.phase("g_forward"):
            pass
        if i % 100 == 99:
            timer.collect()  # as the logging window does
    return (time.perf_counter() - start) / calls * 1e6


def section_f(args: argparse.Namespace, device: torch.device) -> list[str]:
    """The timer's cost: directly, per phase block (exact enough to matter), and as whole-run A/B
    medians (which a shared machine's noise may swamp)."""
    on, off = statistics.median(phase_cost_us(True) for _ in range(5)), statistics.median(
        phase_cost_us(False) for _ in range(5))
    per_step_us = len(PHASES) + 1  # the phases of one step (g_forward occurs twice)
    rows = [f"One phase block costs {on:.2f} us timed and {off:.2f} us with timing off: "
            f"{(on - off) * per_step_us:.0f} us per generator step ({per_step_us} blocks).", "",
            "| preset | timing on | timing off | difference (A/B medians) | direct cost per step |",
            "|---|---|---|---|---|"]
    for name, overrides in {"digits (the default run)": [], "ring": RING_R1}.items():
        ms = alternate(args.rounds,
                       on=lambda o=overrides: framework_ms(o, args.steps, device.type),
                       off=lambda o=overrides: framework_ms([*o, "timing.enabled=false"], args.steps, device.type))
        difference = (ms["on"] / ms["off"] - 1) * 100
        direct = (on - off) * per_step_us / 1e3 / ms["off"] * 100
        rows.append(f"| {name} | {ms['on']:.2f} ms | {ms['off']:.2f} ms | {difference:+.1f}% | **{direct:.2f}%** |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="steps per measurement (the first 5 are dropped)")
    parser.add_argument("--only", nargs="*", choices=["a", "b", "c", "d", "f"],
                        default=["a", "b", "c", "d", "f"], help="sections to run (b includes e)")
    parser.add_argument("--compile", action="store_true", help="on a CPU, also measure train.compile (slow start)")
    parser.add_argument("--write", type=Path, help="write the report to this markdown file")
    args = parser.parse_args()
    device = torch.device(args.device)
    header = [f"Machine: {machine(device)}.", f"Rounds: {args.rounds} alternating; {args.steps} steps per "
              f"measurement, the first {WARMUP} dropped; medians of step-to-step times."]
    print("\n".join(header), flush=True)
    report = ["# Step benchmarks", "", "`python benchmarks/step.py " + " ".join(sys.argv[1:]) + "`", "", *header]
    with tempfile.TemporaryDirectory() as tmp:
        folder = image_folder(Path(tmp) / "images")
        if "a" in args.only:
            report += ["", "## (a) The framework's step vs a bare PyTorch loop", "", *section_a(folder, args, device)]
        if "b" in args.only:
            b_rows, e_rows = section_b_e(folder, args, device)
            report += ["", "## (b) vs pytorch/examples' DCGAN step", "", *b_rows,
                       "", "## (e) Speed options, DCGAN 64x64x3 batch 64 through `train()`", "", *e_rows]
    if "c" in args.only:
        report += ["", "## (c) The detach and freeze decisions (the training step's own code)", "", *section_c(device)]
    if "d" in args.only:
        report += ["", "## (d) Evaluation under no_grad vs with autograd", "", *section_d(device, args.rounds)]
    if "f" in args.only:
        report += ["", "## (f) The cost of per-phase timing (`timing.enabled`)", "", *section_f(args, device)]
    if args.write:
        args.write.write_text("\n".join(report) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
