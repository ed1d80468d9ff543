"""How fast is a training step? The framework against bare PyTorch, against earlier code, and against
pytorch/examples' DCGAN.

Usage: python benchmarks/step.py [--device cpu|cuda] [--rounds 5] [--steps 60] [--pairs 30] [--only a ...]
                                 [--recipes ring ...] [--against COMMIT] [--threads N] [--write docs/benchmarks.md]

Variants alternate round by round in one process (``--against``: in fresh processes, alternately), so
that load on a shared machine hits them alike, and (a) and (b) alternate within one run, about every half
second (the framework's steps with the bare loop's, and with the examples' step);
figures are mean times per generator step over windows that include the recipe's logging steps (what a
user pays), and comparisons are ratios. Sections:

(a) every recipe users train (experiment=ring, grid, digits, mnist, folder; mnist with model=resnet in float32)
    through the real ``train()`` -- data pipeline, outputs, the non-finite guard, logging, timing -- against a bare
    PyTorch loop doing the recipe's work as fast as plain PyTorch allows (:func:`bare_step`);
(against) this commit's ``train()`` against an earlier commit's, on the same recipes;
(b) the framework vs the step structure of pytorch/examples' DCGAN (its G/D layout at 64x64, Sigmoid +
    BCELoss, one G forward reused, D not frozen in the G step, the losses read every step), written
    below: with fp32 defaults and with the fastest configuration measured in (e);
(c) the detach and freeze decisions, from ``python -m gan.patterns`` (the training step's own code);
(d) evaluation under no_grad vs with autograd: time and memory held;
(e) each speed option alone and combined vs fp32 eager, through ``train``: bf16 autocast
    (``trainer.precision=bf16-mixed``), ``data.channels_last=true``, ``train.compile=true``;
(f) the cost of the per-phase timing itself: ``timing.enabled`` true vs false;
(h) the health check's cost on every recipe: its own calls timed in a real run, against the recipe's step time;
(r) model=resnet beside each image recipe's DCGAN at its sizes: per layout, precision and thread count, and against
    pytorch/examples' DCGAN step;
(threads) each recipe on one thread against every core; (compile) ``train.compile`` against eager per
    recipe, the cold compile included; (variants) what width, batch or precision would buy the default
    recipe's step; (l) the loop's own fixed cost per generator step, apart from any network, and the GPU
    probe ``train()`` turns off.

``--write`` puts each section into its generated block of the file (tools/blocks.py), stamped with
the command, the commit and the machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from gan.config.compose import compose
from gan.core.augment import build_augment
from gan.core.contexts import evaluating
from gan.core.losses import get_loss
from gan.core.models import build_models, condition_input, d_classifies, latent_codes
from gan.core.phases import NAMES, PhaseTimer, StepPhases
from gan.data.datasets import build_dataset, num_classes
from gan.data.loader import GANData
from gan.patterns import gan_step, measure
from gan.run.build import penalty_weight
from gan.run.module import GANModule
from gan.training import after_step, loop
from gan.training.host import NVML_CHECK, no_gpu_probe_per_step
from gan.training.loop import train
from gan.training.observer import Observer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.blocks import recipe_inputs, write_block  # noqa: E402

# what the numbers depend on: a change to any, beyond comments, makes the blocks stale
INPUTS = ["gan", *recipe_inputs("ring", "grid", "digits", "mnist", "stacked_mnist", "folder"), "benchmarks/step.py"]

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
WARMUP = 5  # steps dropped from every measurement: allocator, caches, first logging
DEFAULT_THREADS = torch.get_num_threads()  # before anything sets them: torch's default, or --threads


# --- measuring ---------------------------------------------------------------------------------------------

def compose_train(*overrides: str, run_dir: Path) -> DictConfig:
    """A recipe as train() runs it here; train.threads null becomes the bare loop's count, so that a core busy at
    one train()'s start (gan/training/host.py) never gives the two loops different counts."""
    cfg = compose("trainer.enable_progress_bar=false", "log.sample_every=100000", "checkpoint.every=100000",
                  *overrides, run_dir=run_dir)
    if cfg.train.threads is None:
        cfg.train.threads = DEFAULT_THREADS
    return cfg


class StepClock(Observer):
    """The time training starts, and the time at the end of every generator step."""

    def __init__(self) -> None:
        self.start = 0.0
        self.ends: list[float] = []

    def on_start(self, *args: object) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, *args: object) -> None:
        self.ends.append(time.perf_counter())


def framework_ms(overrides: list[str], steps: int, device: str) -> float:
    """Mean milliseconds per generator step of ``python train.py <overrides>``: the real train(), with its
    data pipeline, callbacks, guard, logging every ``log.every`` steps and timing -- what a user pays --
    over the steps after the first WARMUP (samples and checkpoints, which the bare loop does not make, off)."""
    with tempfile.TemporaryDirectory() as tmp:
        accelerator = "gpu" if device == "cuda" else "cpu"
        cfg = compose_train(*overrides, f"trainer.max_steps={steps + WARMUP}", f"trainer.accelerator={accelerator}",
                            run_dir=Path(tmp) / "run")
        clock = StepClock()
        train(cfg, [clock])
        if device == "cuda":
            torch.cuda.synchronize()
        return (clock.ends[-1] - clock.ends[WARMUP - 1]) * 1e3 / (len(clock.ends) - WARMUP)


class Interleaved(Observer):
    """Runs ``block`` steps of the bare loop after every ``block`` generator steps of the run it watches, so
    that the two loops alternate every fraction of a second in one process: the host's speed drifts by
    several percent over seconds, and a drift then moves both sides of each pair alike. ``framework`` and
    ``bare``: mean milliseconds per step of each block, in the order run (the first WARMUP steps dropped)."""

    def __init__(self, bare: Callable[[], object], block: int, device: torch.device):
        self.bare_step, self.block, self.device = bare, block, device
        self.framework: list[float] = []
        self.bare: list[float] = []
        self.steps, self.mark = 0, 0.0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_step_end(self, *args: object) -> None:
        self.steps += 1
        if self.steps < WARMUP or (self.steps - WARMUP) % self.block:
            return
        end = self.now()
        if self.steps > WARMUP:
            self.framework.append((end - self.mark) * 1e3 / self.block)
        for _ in range(self.block):
            self.bare_step()
        self.mark = self.now()
        if self.steps > WARMUP:
            self.bare.append((self.mark - end) * 1e3 / self.block)


def interleaved(overrides: list[str], bare: Callable[[], object], block: int, pairs: int,
                device: torch.device) -> Interleaved:
    """``python train.py <overrides>`` -- the real train(), with its data pipeline, guard, logging every
    ``log.every`` steps and timing: what a user pays (samples and checkpoints, which the bare loop does not
    make, off) -- for ``pairs`` blocks of ``block`` generator steps, each followed by as many bare steps."""
    with tempfile.TemporaryDirectory() as tmp:
        accelerator = "gpu" if device.type == "cuda" else "cpu"
        cfg = compose_train(*overrides, f"trainer.max_steps={WARMUP + pairs * block}",
                            f"trainer.accelerator={accelerator}", run_dir=Path(tmp) / "run")
        probe = Interleaved(bare, block, device)
        train(cfg, [probe])
        return probe


def bare_ms(step: Callable[[], object], steps: int, device: torch.device, threads: int | None = None) -> float:
    """Mean milliseconds per call of ``step`` in a plain loop, after WARMUP calls, on ``threads`` threads
    (as the recipe's train.threads sets them for train())."""
    torch.set_num_threads(threads or DEFAULT_THREADS)
    for _ in range(WARMUP):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / steps


def alternate_rounds(rounds: int, **variants: Callable[[], float]) -> dict[str, list[float]]:
    """Each variant once per round, in turn, the order reversed every other round (so that no variant
    always runs first, after the same neighbour); each variant's figure of every round."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name in list(variants)[:: -1 if round_ % 2 else 1]:
            results[name].append(variants[name]())
    return results


def alternate(rounds: int, **variants: Callable[[], float]) -> dict[str, float]:
    """:func:`alternate_rounds`' median over rounds of each variant's figure."""
    return {name: statistics.median(values) for name, values in alternate_rounds(rounds, **variants).items()}


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


# --- (a) the bare loop: the recipe's work in plain PyTorch, as fast as plain PyTorch allows ------------

def bare_step(cfg: DictConfig, device: torch.device) -> Callable[[], object]:
    """One generator step in plain PyTorch doing the recipe's work: the same models (built from the same
    config and seed, in its memory layout), its loss, R1 (with its interval) or LeCam (running means of
    D's outputs as its anchors), gradient penalty, augmentation (the same DiffAugment/ADA operations),
    ``d_steps`` D updates, its class conditioning (labels into G, and into D's input or named by D: AC-GAN)
    or latent code (drawn for G, named by D on G's samples: InfoGAN),
    its optimizer, betas and learning-rate decay, the EMA generator with its ramp;
    Adam fused (torch's fastest on a CPU and a GPU); batches indexed from the dataset held on the device;
    and, every ``log.every`` steps, the losses read back, as any loop that prints them must."""
    container = OmegaConf.to_container(cfg, resolve=True)
    torch.manual_seed(cfg.seed)
    dataset = build_dataset(container["data"], cfg.seed)
    data = dataset.tensors[0].to(device)
    shape = tuple(data.shape[1:])
    classes = num_classes(dataset) if cfg.model.conditional else 0
    labels = dataset.tensors[1].to(device) if classes else None
    codes = latent_codes(container["model"])
    values = classes or codes  # what G's labels take: the data's classes, or the latent code's values
    classify = values > 0 and d_classifies(container["model"])
    g, d = (m.to(device) for m in build_models(container["model"], cfg.train.z_dim, shape, values))
    if data.dim() == 4 and cfg.data.channels_last:  # images, in the layout the recipe asks for
        g, d = g.to(memory_format=torch.channels_last), d.to(memory_format=torch.channels_last)
        data = data.contiguous(memory_format=torch.channels_last)
    augment = build_augment(container["augment"], shape)
    augment = augment.to(device) if augment is not None else None
    loss = get_loss(cfg.loss.name)
    reg, gp_weight = container["reg"], penalty_weight(container["loss"])
    ema = [p.detach().clone() for p in g.parameters()] if cfg.ema.enabled else []
    optimizers = [torch.optim.Adam(m.parameters(), lr=o["lr"], betas=tuple(o["betas"]), fused=True)
                  for m, o in ((g, container["optim"]["g"]), (d, container["optim"]["d"]))]
    opt_g, opt_d = optimizers
    base_lrs = [o.param_groups[0]["lr"] for o in optimizers]
    batch, z_dim, d_steps = cfg.data.batch_size, cfg.train.z_dim, cfg.loss.d_steps
    means = torch.zeros(2, device=device)  # LeCam's anchors: running means of D(real), D(fake)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=cfg.trainer.precision == "bf16-mixed")
    state = {"g": 0, "d": 0, "log": []}

    def critic(x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
        x = augment(x) if augment is not None else x
        if classify:
            out = d(x)
            return out[:, 0], out[:, 1:]
        return d(x if y is None else torch.cat((condition_input(y, values, shape), x), 1)), None

    def d_update(real: Tensor, fake: Tensor, y: Tensor | None) -> Tensor:
        r1 = reg["name"] in ("r1", "r1r2") and state["d"] % reg["every"] == 0
        r2 = r1 and reg["name"] == "r1r2"
        if r1:
            real = real.detach().requires_grad_(True)
        if r2:
            fake = fake.detach().requires_grad_(True)
        with autocast:
            (real_logits, real_classes), (fake_logits, fake_classes) = critic(real, y), critic(fake, y)
            loss_d = loss.d(real_logits, fake_logits)
            # no adds of zero where there is no class term: every op counts in the ops table
            if classify and not codes:  # a latent code has no value on real data
                loss_d = loss_d + F.cross_entropy(real_classes, y)
            if classify:
                loss_d = loss_d + F.cross_entropy(fake_classes, y)
            if r2:  # R1 and R2 from one inner backward
                grads = torch.autograd.grad((real_logits.sum(), fake_logits.sum()), (real, fake), create_graph=True)
                squares = sum(grad.pow(2).flatten(1).sum(1).mean() for grad in grads)
                loss_d = loss_d + reg["gamma"] / 2 * reg["every"] * squares
            elif r1:
                (grad,) = torch.autograd.grad(real_logits.sum(), real, create_graph=True)
                loss_d = loss_d + reg["gamma"] / 2 * reg["every"] * grad.pow(2).flatten(1).sum(1).mean()
            if reg["name"] == "lecam":
                loss_d = loss_d + reg["weight"] * ((real_logits - means[1]).pow(2).mean()
                                                   + (fake_logits - means[0]).pow(2).mean())
            if gp_weight:
                alpha = torch.rand(len(real), *[1] * (real.dim() - 1), device=device)
                mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
                (grad,) = torch.autograd.grad(critic(mixed, y)[0].sum(), mixed, create_graph=True)
                loss_d = loss_d + gp_weight * (grad.flatten(1).norm(dim=1) - 1).pow(2).mean()
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        with torch.no_grad():
            means.lerp_(torch.stack((real_logits.mean(), fake_logits.mean())).float(), 0.01)
            if augment is not None:
                augment.accumulate(real_logits)
        state["d"] += 1
        return loss_d

    def step() -> None:
        index = torch.randint(len(data), (batch * d_steps,), device=device)
        reals = data[index].chunk(d_steps)
        ys = (labels[index].chunk(d_steps) if classes else
              [torch.randint(codes, (batch,), device=device) for _ in range(d_steps)] if codes else [None] * d_steps)
        for real, y in zip(reals[:-1], ys[:-1]):
            with torch.no_grad(), autocast:
                d_update(real, g(torch.randn(batch, z_dim, device=device), y), y)
        y = ys[-1]
        with autocast:
            fake = g(torch.randn(batch, z_dim, device=device), y)
        loss_d = d_update(reals[-1], fake.detach(), y)
        d.requires_grad_(False)
        with autocast:
            logits, class_logits = critic(fake, y)
            if loss.relativistic:
                with torch.no_grad():
                    real_logits = critic(reals[-1], y)[0]
                loss_g = loss.g(logits, real_logits)
            else:
                loss_g = loss.g(logits)
            if classify:
                loss_g = loss_g + F.cross_entropy(class_logits, y)
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        d.requires_grad_(True)
        opt_g.step()
        state["g"] += 1
        if cfg.optim.decay == "linear":
            for o, lr in zip(optimizers, base_lrs):
                o.param_groups[0]["lr"] = lr * max(0.0, 1.0 - state["g"] / cfg.trainer.max_steps)
        if ema:
            k = state["g"] - 1
            weight = 1.0 - min(cfg.ema.decay, (1 + k) / (10 + k)) if state["g"] > cfg.ema.start else 1.0
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in g.parameters()], weight)
        if augment is not None and state["g"] % augment.interval == 0:
            augment.adjust(batch)
        if state["g"] % cfg.log.every == 0:
            state["log"].append(torch.stack((loss_d.detach(), loss_g.detach())).tolist())
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
    "fp32, NCHW": ["data.channels_last=false"],
    "fp32, channels_last (the default)": [],
    "bf16 autocast, NCHW": ["trainer.precision=bf16-mixed", "data.channels_last=false"],
    "bf16 autocast + channels_last": ["trainer.precision=bf16-mixed"],
    "compile (fp32, channels_last)": ["train.compile=true"],
    "bf16 + channels_last + compile": ["trainer.precision=bf16-mixed", "train.compile=true"],
}
# The ring setting these speed figures were measured with (before the 10-seed quality preset,
# experiment=ring, which trains a smaller MLP with a decaying learning rate).
RING_R1 = ["~experiment", "data=ring", "reg=r1", "data.batch_size=512"]
BASELINE, DEFAULTS = "fp32, NCHW", "fp32, channels_last (the default)"
# About 10 s of bare steps a measurement: 3 s left 10-25 steps a window on a slow host, too few to tell two loops
# within a few percent of each other apart from the noise (docs/benchmarks.md).
WINDOW_MS = 10_000
BLOCK_MS = 500  # (a): the framework's and the bare loop's steps alternate in blocks of about this


def mnist_root(directory: Path) -> tuple[Path, str]:
    """MNIST's test split where this repository's neighbour holds it, else random IDX files of the same
    shape (speed does not depend on the pixels): (data.root, data.split)."""
    shared = ROOT.parent / "shared" / "data" / "mnist_t10k"
    if (shared / "raw").is_dir():
        return shared, "test"
    raw = directory / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, magic, shape in (("t10k-images-idx3-ubyte", 2051, (10000, 28, 28)), ("t10k-labels-idx1-ubyte", 2049,
                                                                                     (10000,))):
        header = magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in shape)
        values = rng.integers(0, 256 if len(shape) > 1 else 10, shape, dtype=np.uint8)
        with gzip.open(raw / f"{stem}.gz", "wb") as f:
            f.write(header + values.tobytes())
    return directory, "test"


def recipes(folder: Path, mnist: tuple[Path, str]) -> dict[str, list[str]]:
    """The configs users train: every recipe, as train.py composes it."""
    return {"ring": ["experiment=ring"], "grid": ["experiment=grid"], "digits (the default run)": ["experiment=digits"],
            "mnist": ["experiment=mnist", f"data.root={mnist[0]}", f"data.split={mnist[1]}"],
            # float32: the residual network's bf16 convolutions are emulated, many times slower, on a CPU without
            # bf16 units (and the resnet trains no recipe, which would have chosen its precision)
            "mnist, model=resnet, fp32": ["experiment=mnist", "model=resnet", "trainer.precision=32-true",
                                          f"data.root={mnist[0]}", f"data.split={mnist[1]}"],
            "DCGAN 64x64x3, image folder": ["experiment=folder", f"data.path={folder}"]}


def image_recipes(folder: Path, mnist: tuple[Path, str]) -> dict[str, list[str]]:
    """The image recipes with the sizes the two networks are compared at: digits 16x16x1, MNIST 32x32x1,
    StackedMNIST 32x32x3, the image folder 64x64x3."""
    root = [f"data.root={mnist[0]}", f"data.split={mnist[1]}"]
    return {"digits 16x16x1": ["experiment=digits"], "mnist 32x32x1": ["experiment=mnist", *root],
            "stacked_mnist 32x32x3": ["experiment=stacked_mnist", *root],
            "folder 64x64x3": ["experiment=folder", f"data.path={folder}"]}


# (r): the layouts and precisions each network is timed in, on one thread, and the defaults on every core.
RESNET_COLUMNS = {"fp32, NCHW": ["trainer.precision=32-true", "data.channels_last=false"],
                  "fp32, channels_last": ["trainer.precision=32-true", "data.channels_last=true"],
                  "bf16, NCHW": ["trainer.precision=bf16-mixed", "data.channels_last=false"],
                  "bf16, channels_last": ["trainer.precision=bf16-mixed", "data.channels_last=true"]}


def section_r(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    """model=resnet beside each recipe's DCGAN at the recipe's sizes: ms per generator step through train() in
    each layout and precision on one thread, and fp32 channels_last on every core; each against the DCGAN of
    the same column, and against pytorch/examples' DCGAN step (64x64x3, batch 64, fp32) timed in the same
    rounds. bf16 is left out on a CPU without bf16 units, where every bf16 convolution is emulated."""
    from gan.core.torch_private import cpu_has_bf16_units

    cores = len(os.sched_getaffinity(0))
    columns = {name: [*options, "train.threads=1"] for name, options in RESNET_COLUMNS.items()
               if "bf16" not in name or device.type == "cuda" or cpu_has_bf16_units()}
    columns[f"fp32, channels_last, {cores} threads"] = ["trainer.precision=32-true", "data.channels_last=true",
                                                        f"train.threads={cores}"]
    cfg = compose_train("data=folder", f"data.path={folder}", *DCGAN64, run_dir=Path("unused"))
    data = torch.stack(list(build_dataset(OmegaConf.to_container(cfg.data), 0).tensors[0])).to(device)
    reference = examples_step(data, 64, device)
    variants: dict[str, Callable[[], float]] = {"examples": lambda: bare_ms(reference, args.steps, device, 1)}
    for recipe, overrides in image_recipes(folder, mnist).items():
        for network in ("dcgan", "resnet"):
            for column, options in columns.items():
                chosen = [*overrides, *options, *([] if network == "dcgan" else ["model=resnet"])]
                variants[f"{recipe}|{network}|{column}"] = (lambda o=chosen: framework_ms(o, args.steps, device.type))
    ms = alternate(args.rounds, **variants)
    examples = ms.pop("examples")
    rows = [f"Each cell: ms per generator step through `train()` (the recipe with `model=resnet`'s defaults or its "
            f"own DCGAN), {args.steps} steps after {WARMUP}, the median of {args.rounds} rounds; in brackets, "
            f"resnet over DCGAN in the same column. pytorch/examples' DCGAN step (64x64x3, batch 64, fp32, one "
            f"thread), timed in the same rounds: {examples:.0f} ms; the last column is each network's fp32 "
            f"channels_last step on one thread over it.", "",
            "| recipe | network | " + " | ".join(columns) + " | / examples' step |",
            "|---|---|" + "---|" * (len(columns) + 1)]
    for recipe in image_recipes(folder, mnist):
        for network in ("dcgan", "resnet"):
            cells = []
            for column in columns:
                here, dcgan = ms[f"{recipe}|{network}|{column}"], ms[f"{recipe}|dcgan|{column}"]
                cells.append(f"{here:.0f} ms" + (f" (**{here / dcgan:.1f}x**)" if network == "resnet" else ""))
            rows.append(f"| {recipe} | {network} | " + " | ".join(cells) +
                        f" | {ms[f'{recipe}|{network}|fp32, channels_last'] / examples:.2f} |")
            print(rows[-1], flush=True)
    if len(columns) < len(RESNET_COLUMNS) + 1:
        rows += ["", "bf16 not measured: this CPU has no bf16 units (AVX512-BF16 or AMX), so every bf16 convolution "
                 "is emulated, several times slower than float32 (the run warns at its start)."]
    return rows


def window_steps(most: int, step_ms: float) -> int:
    """Steps per measurement: at most ``most``, and about WINDOW_MS of bare steps (at least 10), so that a slow
    recipe is not run for minutes and a fast one long enough that a difference of a few percent shows."""
    return max(10, min(most, int(WINDOW_MS / step_ms)))


def section_a(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    rows = [f"Section (a) alternates instead, within one `train()` per recipe: {args.pairs} pairs of a block of "
            f"the run's generator steps (about {BLOCK_MS} ms, at most {args.steps} steps) and as many bare steps, "
            f"after the run's first {WARMUP}; mean time per step over all blocks, logging steps included.", "",
            "| recipe | framework `train()` | bare PyTorch loop | framework / bare (middle half of the pairs) "
            "| target |", "|---|---|---|---|---|"]
    for name, overrides in recipes(folder, mnist).items():
        if args.recipes and not any(r in name for r in args.recipes):
            continue
        cfg = compose_train(*overrides, run_dir=Path("unused"))
        step, threads = bare_step(cfg, device), cfg.train.threads or DEFAULT_THREADS
        block = max(1, min(args.steps, int(BLOCK_MS / bare_ms(step, 3, device, threads))))
        run = interleaved(overrides, step, block, args.pairs, device)
        framework, bare = statistics.mean(run.framework), statistics.mean(run.bare)
        quartiles = statistics.quantiles([f / b for f, b in zip(run.framework, run.bare, strict=True)], n=4)
        rows.append(f"| {name} ({args.pairs} x {block} steps) | {framework:.2f} ms | {bare:.2f} ms | "
                    f"**{framework / bare:.3f}** ({quartiles[0]:.3f}-{quartiles[2]:.3f}) | <= 1.05 |")
        print(rows[-1], flush=True)
    return rows


def section_threads(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    """Each recipe through train() on 1 thread and on every core, alternating: what a recipe's train.threads
    should say (a 2-core machine: OpenMP's second thread pays off only where ops are large enough)."""
    cores = len(os.sched_getaffinity(0))
    rows = [f"| recipe | 1 thread | {cores} threads | {cores} threads / 1 thread | the recipe's train.threads |",
            "|---|---|---|---|---|"]
    for name, overrides in recipes(folder, mnist).items():
        if args.recipes and not any(r in name for r in args.recipes):
            continue
        cfg = compose_train(*overrides, run_dir=Path("unused"))
        steps = window_steps(args.steps, bare_ms(bare_step(cfg, device), 3, device, cores))
        ms = alternate(args.rounds, **{str(n): (lambda o=overrides, n=n, k=steps: framework_ms(
            [*o, f"train.threads={n}"], k, device.type)) for n in (1, cores)})
        own = compose(*overrides, run_dir=Path("unused")).train.threads  # the recipe's, before compose_train's
        rows.append(f"| {name} ({steps} steps) | {ms['1']:.2f} ms | {ms[str(cores)]:.2f} ms | "
                    f"**{ms[str(cores)] / ms['1']:.2f}** | {own or 'null (the free cores)'} |")
        print(rows[-1], flush=True)
    torch.set_num_threads(DEFAULT_THREADS)  # train.threads set them for the process: the next sections start afresh
    return rows


# What a change to the default recipe would buy in step time (docs/results.md has what each gave in FID).
DIGITS_VARIANTS = {"the recipe (width 32, batch 64, fp32, channels_last)": [],
                   "data.channels_last=false (NCHW)": ["data.channels_last=false"],
                   "model.width=64": ["model.width=64"], "data.batch_size=32": ["data.batch_size=32"],
                   "trainer.precision=bf16-mixed": ["trainer.precision=bf16-mixed"]}


def section_variants(args: argparse.Namespace, device: torch.device) -> list[str]:
    """The default recipe's bare step under each variant, alternating: what width, batch or precision buy."""
    steps = {name: bare_step(compose_train("experiment=digits", *o, run_dir=Path("unused")), device)
             for name, o in DIGITS_VARIANTS.items()}
    ms = alternate(args.rounds, **{name: (lambda s=s: bare_ms(s, 20, device)) for name, s in steps.items()})
    recipe = next(iter(DIGITS_VARIANTS))
    rows = ["| digits recipe, bare step | ms | against the recipe |", "|---|---|---|"]
    rows += [f"| {name} | {ms[name]:.1f} | **{ms[name] / ms[recipe]:.2f}** |" for name in DIGITS_VARIANTS]
    print("\n".join(rows), flush=True)
    return rows


def compiled_ms(overrides: list[str], steps: int, device: str) -> tuple[float, float]:
    """(seconds from the start of training to the end of its first step, mean ms per later step) of train()."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_train(*overrides, f"trainer.max_steps={steps + WARMUP}",
                            f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}", run_dir=Path(tmp) / "run")
        clock = StepClock()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp  # an empty cache: the compile is cold, as in a user's first run
        try:
            train(cfg, [clock])
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
        return clock.ends[0] - clock.start, (clock.ends[-1] - clock.ends[WARMUP - 1]) * 1e3 / (len(clock.ends) - WARMUP)


def section_compile(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    """train.compile=true (G, and D where no double backward runs) against eager, per recipe: the first
    step's time (the cold compile) and the steady step. One round each: a compile costs tens of seconds."""
    rows = ["| recipe | eager: first step, then per step | compiled: first step, then per step | compiled / eager |",
            "|---|---|---|---|"]
    for name, overrides in recipes(folder, mnist).items():
        if args.recipes and not any(r in name for r in args.recipes) or "folder" in name:  # folder: section e
            continue
        eager = compiled_ms(overrides, args.steps, device.type)
        compiled = compiled_ms([*overrides, "train.compile=true"], args.steps, device.type)
        rows.append(f"| {name} | {eager[0]:.1f} s, {eager[1]:.2f} ms | {compiled[0]:.1f} s, {compiled[1]:.2f} ms | "
                    f"**{compiled[1] / eager[1]:.2f}** |")
        print(rows[-1], flush=True)
    return rows


class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched, each a kernel launch (and its dispatch cost) on any device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


class OpsPerStep(Observer):
    """The aten operations of each generator step, from its batch start to the next one's."""

    def __init__(self) -> None:
        self.mode: OpCount | None = None
        self.counts: list[int] = []

    def on_step_start(self, *args: Any) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.counts.append(self.mode.count)
        self.mode = OpCount()
        self.mode.__enter__()

    def on_end(self, *args: Any) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)


def section_ops(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    """Operations per generator step that logs nothing, framework against bare: exact and noise-free, where
    times on a shared machine are not; on a CPU each small op costs microseconds of dispatch."""
    rows = ["| recipe | framework ops per step | bare loop ops per step | added by the framework |",
            "|---|---|---|---|"]
    for name, overrides in recipes(folder, mnist).items():
        if args.recipes and not any(r in name for r in args.recipes):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose_train(*overrides, "trainer.max_steps=12", "log.every=1000", run_dir=Path(tmp) / "run")
            counter = OpsPerStep()
            train(cfg, [counter])
        period = OmegaConf.select(cfg, "reg.every", default=1)  # 4 at most in the recipes: 12 steps cover it
        # The mean over one period of lazy R1 (reg.every steps, one of them with R1) on both sides, after the
        # first steps, which set things up: a single step would count R1's ops on one side and not the other.
        framework = sum(counter.counts[4:4 + period]) / period
        step = bare_step(cfg, device)
        for _ in range(3):
            step()
        mode = OpCount()
        with mode:
            for _ in range(period):
                step()
        bare = mode.count / period
        rows.append(f"| {name} | {framework:.0f} | {bare:.0f} | {framework - bare:.0f} |")
        print(rows[-1], flush=True)
    return rows


AGAINST_WORKER = """
import sys, time, tempfile, json
from pathlib import Path
tree, steps, warmup, overrides = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
sys.path.insert(0, str(tree))
from omegaconf import DictConfig, OmegaConf
from hydra import compose, initialize_config_dir
try:  # the Fabric loop, which a probe watches
    from gan.training.loop import train
    from gan.training.observer import Observer
    hook = "on_step_end"
except ImportError:  # before it: Lightning's Trainer, which a callback watches
    import lightning as L
    from gan.training.builder import train
    Probe, hook = L.Callback, "on_train_batch_end"

class Clock(Observer):
    def __init__(self):
        self.ends = []
setattr(Clock, hook, lambda self, *args: self.ends.append(time.perf_counter()))

with tempfile.TemporaryDirectory() as tmp:
    with initialize_config_dir(config_dir=str(tree / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["trainer.enable_progress_bar=false", "log.sample_every=100000",
                                          "checkpoint.every=100000", f"trainer.max_steps={steps + warmup}", *overrides])
    OmegaConf.update(cfg, "paths.run_dir", str(Path(tmp) / "run"), force_add=True)
    clock = Clock()
    train(cfg, [clock])
    print((clock.ends[-1] - clock.ends[warmup - 1]) * 1e3 / (len(clock.ends) - warmup))
"""


def against_ms(tree: Path, overrides: list[str], steps: int) -> float:
    """Mean ms per generator step of ``train()`` as the code in ``tree`` has it, in a fresh process."""
    command = [sys.executable, "-c", AGAINST_WORKER, str(tree), str(steps), str(WARMUP), json.dumps(overrides)]
    out = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def section_against(commit: str, folder: Path, mnist: tuple[Path, str], args: argparse.Namespace) -> list[str]:
    """This commit's train() against ``commit``'s, alternately, each in its own process, on the recipes."""
    rows = [f"| recipe | this commit | {commit} | this / {commit} |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for name, overrides in recipes(folder, mnist).items():
                if args.recipes and not any(r in name for r in args.recipes):
                    continue
                if "folder" in name:  # a recipe older code does not have: the same choices, spelled out
                    overrides = ["~experiment", "data=folder", f"data.path={folder}"]
                ms = alternate(args.rounds, new=lambda o=overrides: against_ms(ROOT, o, args.steps),
                               old=lambda o=overrides: against_ms(old, o, args.steps))
                rows.append(f"| {name} | {ms['new']:.2f} ms | {ms['old']:.2f} ms | **{ms['new'] / ms['old']:.3f}** |")
                print(rows[-1], flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    return rows


def section_b_e(folder: Path, args: argparse.Namespace, device: torch.device) -> tuple[list[str], list[str]]:
    """Each speed option's train() with the examples' step interleaved in it (as section a pairs the bare
    loop), so that every ratio compares steps timed within the same second; the median ratio over rounds."""
    base = ["data=folder", f"data.path={folder}", *DCGAN64]
    cfg = compose_train(*base, run_dir=Path("unused"))
    data = torch.stack([t for t in build_dataset(OmegaConf.to_container(cfg.data), 0).tensors[0]]).to(device)
    reference = examples_step(data, 64, device)
    block = max(1, int(BLOCK_MS / bare_ms(reference, 3, device)))
    pairs = max(1, args.steps // block)
    runs: dict[str, list[Interleaved]] = {name: [] for name, options in SPEED_OPTIONS.items()
                                          if device.type == "cuda" or "compile" not in name or args.compile}
    for round_ in range(args.rounds):
        for name in list(runs)[:: -1 if round_ % 2 else 1]:
            runs[name].append(interleaved([*base, *SPEED_OPTIONS[name]], reference, block, pairs, device))
    ms = {name: statistics.median(statistics.mean(r.framework) for r in rs) for name, rs in runs.items()}
    examples_ms = {name: statistics.median(statistics.mean(r.bare) for r in rs) for name, rs in runs.items()}
    speedup = {name: statistics.median(statistics.mean(r.bare) / statistics.mean(r.framework) for r in rs)
               for name, rs in runs.items()}
    e_rows = [f"Each option's `train()` ran {pairs} blocks of {block} generator step(s), each followed by as many of "
              f"the examples' steps, in each of {args.rounds} rounds; the speed-up is the examples' mean step over "
              "the option's in the same run, the median over rounds.", "",
              f"| option | step | pytorch/examples step, same run | speed-up | vs {BASELINE} |",
              "|---|---|---|---|---|"]
    e_rows += [f"| {name} | {ms[name]:.1f} ms | {examples_ms[name]:.1f} ms | {speedup[name]:.2f}x | "
               f"{speedup[name] / speedup[BASELINE]:.2f}x |" for name in runs]
    fastest = max(runs, key=lambda name: speedup[name])
    b_rows = ["| framework configuration | step | pytorch/examples step, same run | speed-up | target |",
              "|---|---|---|---|---|",
              f"| {DEFAULTS} | {ms[DEFAULTS]:.1f} ms | {examples_ms[DEFAULTS]:.1f} ms | "
              f"**{speedup[DEFAULTS]:.2f}x** | >= 1.10x |",
              f"| fastest: {fastest} | {ms[fastest]:.1f} ms | {examples_ms[fastest]:.1f} ms | "
              f"**{speedup[fastest]:.2f}x** | >= 3x |"]
    print("\n".join(b_rows + e_rows), flush=True)
    return b_rows, e_rows


# --- (l) what the loop itself costs ------------------------------------------------------------------------

def loop_us(steps: int) -> float:
    """Microseconds per generator step of the real loop (train(), the ring recipe's data, timing on, nothing
    logged, sampled or saved inside the window) around a step that does nothing: only the generator
    counter's host copy moves, so that the loop ends."""
    def no_step(run: Any, *args: Any) -> None:
        return None

    def count_only(module: GANModule, result: Any, images: int) -> None:
        module.counters.g += 1

    with tempfile.TemporaryDirectory() as tmp:
        # No health check either: its steps are logging steps, and its cost is section (h)'s.
        # No learning-rate schedule: the loop steps it after the statistics, and it is the step's cost, not the loop's.
        cfg = compose_train("experiment=ring", "log.every=100000000", "health.enabled=false", "optim.decay=constant",
                            f"trainer.max_steps={steps + WARMUP}",
                            "trainer.accelerator=cpu", run_dir=Path(tmp) / "run")
        clock = StepClock()
        saved = loop.run_step, GANModule.update_statistics, after_step.log_step
        # the last step logs whatever log.every says: with no step, nothing to log
        loop.run_step, GANModule.update_statistics, after_step.log_step = no_step, count_only, no_step
        try:
            train(cfg, [clock])
        finally:
            loop.run_step, GANModule.update_statistics, after_step.log_step = saved
    return (clock.ends[-1] - clock.ends[WARMUP - 1]) * 1e6 / (len(clock.ends) - WARMUP)


def bare_loop_us(steps: int, batches: bool) -> float:
    """Microseconds per iteration of a bare Python loop calling a function that does nothing; ``batches``: and
    taking each step's batch of the ring's data as the training loop does (any loop must)."""
    def no_step(batch: Any) -> None:
        return None

    cfg = compose_train("experiment=ring", run_dir=Path("unused"))
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    data = GANData(data_cfg, build_dataset(data_cfg, 0), cfg.loss.d_steps, 0)
    loader = iter(data.loader())
    start = time.perf_counter()
    for _ in range(steps):
        no_step(next(loader) if batches else None)
    return (time.perf_counter() - start) * 1e6 / steps


def adam_step_us(nvml_check: bool, steps: int = 2000) -> float:
    """Microseconds per fused Adam step of one weight, with Lightning's PYTORCH_NVML_BASED_CUDA_CHECK set or not."""
    weight = nn.Parameter(torch.zeros(1))
    weight.grad = torch.ones(1)
    opt = torch.optim.Adam([weight], fused=True)
    if nvml_check:
        os.environ[NVML_CHECK] = "1"
    try:
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        return (time.perf_counter() - start) * 1e6 / steps
    finally:
        os.environ.pop(NVML_CHECK, None)


def section_l(args: argparse.Namespace) -> list[str]:
    """The loop's fixed cost per generator step, apart from any network's work; and the GPU probe train()
    turns off."""
    steps = 20 * args.steps
    us = alternate(args.rounds, loop=lambda: loop_us(steps), bare=lambda: bare_loop_us(steps, False),
                   batches=lambda: bare_loop_us(steps, True),
                   probe=lambda: adam_step_us(True), no_probe=lambda: adam_step_us(False))
    cost = us["loop"] - us["batches"]
    rows = ["| per generator step, around a step that does nothing | us | target |", "|---|---|---|",
            f"| a bare Python loop | {us['bare']:.1f} | |",
            f"| ... taking the ring's batch each step, as any loop must | {us['batches']:.1f} | |",
            f"| the training loop (the same batches, phase timing, the checks of what is due) | {us['loop']:.1f} | |",
            f"| **the loop's fixed cost** (the training loop less the bare loop with batches) | **{cost:.1f}** | "
            f"<= 100 ({'met' if cost <= 100 else 'missed'}) |",
            "", "| one fused Adam step (one weight) | us |", "|---|---|",
            f"| with PYTORCH_NVML_BASED_CUDA_CHECK=1, as importing Lightning leaves it | {us['probe']:.0f} |",
            f"| without it, as train() runs on a machine with no GPU | {us['no_probe']:.0f} |"]
    print("\n".join(rows), flush=True)
    return rows


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
    """Microseconds one ``with phases.phase(...)`` block costs, its timer reading it, over ``calls`` empty blocks."""
    timer = PhaseTimer(enabled)
    phases = StepPhases(timer)
    start = time.perf_counter()
    for i in range(calls):
        with phases.phase("g_forward"):
            pass
        if i % 100 == 99:
            timer.collect()  # as the logging window does
    return (time.perf_counter() - start) / calls * 1e6


class HealthClock(Observer):
    """Times the health check's own calls in a run -- its figures, made on the device, and its judging of the
    numbers read -- a synchronized interval each (the figures' single read rides in the logging step's)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.checks = device, 0.0, 0

    def on_start(self, run: Any) -> None:
        for name in ("figures", "check"):
            setattr(run.health, name, self.timed(getattr(run.health, name), counts=name == "check"))

    def timed(self, call: Callable[..., Any], counts: bool) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            out = call(*args, **kwargs)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds += time.perf_counter() - start
            self.checks += counts
            return out

        return timed_call


def health_check_ms(overrides: list[str], checks: int, device: torch.device) -> float:
    """Milliseconds per health check of a recipe's run, checking every few steps (the figures of a trained
    network cost what those of a fresh one do: the same shapes)."""
    every = 5
    with tempfile.TemporaryDirectory() as tmp:
        accelerator = "gpu" if device.type == "cuda" else "cpu"
        cfg = compose_train(*overrides, f"trainer.max_steps={every * checks}", f"health.every={every}",
                            f"trainer.accelerator={accelerator}", run_dir=Path(tmp) / "run")
        clock = HealthClock(device)
        train(cfg, [clock])
        return clock.seconds * 1e3 / clock.checks


def section_h(folder: Path, mnist: tuple[Path, str], args: argparse.Namespace, device: torch.device) -> list[str]:
    """The health check's cost per generator step: one check's time over health.every steps of the recipe's."""
    rows = ["Each recipe's health check timed in a real run (20 checks, every 5th step; the first dropped), and its "
            "step time with the check off (median of the rounds): the cost per generator step is one check over "
            "`health.every` steps. A whole-run A/B of so small a difference would be lost in this machine's noise.",
            "", "| recipe | one check | step (check off) | `health.every` | cost per step | target |",
            "|---|---|---|---|---|---|"]
    mnist_keys = [f"data.root={mnist[0]}", f"data.split={mnist[1]}"]
    every_recipe = {**recipes(folder, mnist), "mnist_acgan": ["experiment=mnist_acgan", *mnist_keys],
                    "stacked_mnist": ["experiment=stacked_mnist", *mnist_keys]}
    for name, overrides in every_recipe.items():
        if args.recipes and not any(r in name for r in args.recipes):
            continue
        every = compose_train(*overrides, run_dir=Path("unused")).health.every
        check = statistics.median(health_check_ms(overrides, 20, device) for _ in range(args.rounds))
        step = statistics.median(framework_ms([*overrides, "health.enabled=false"], args.steps, device.type)
                                 for _ in range(args.rounds))
        cost = check / (every * step) * 100
        rows.append(f"| {name} | {check:.2f} ms | {step:.2f} ms | {every} | **{cost:.2f}%** | < 2% |")
        print(rows[-1], flush=True)
    return rows


def section_f(args: argparse.Namespace, device: torch.device) -> list[str]:
    """The timer's cost: directly, per phase block (exact enough to matter), and as whole-run A/B
    medians (which a shared machine's noise may swamp)."""
    on, off = statistics.median(phase_cost_us(True) for _ in range(5)), statistics.median(
        phase_cost_us(False) for _ in range(5))
    per_step_us = len(NAMES) + 1  # the phases of one step (g_forward occurs twice)
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


SECTIONS = {
    "a": "The framework's step against a bare PyTorch loop doing the recipe's work",
    "ops": "Operations per generator step: the framework's against the bare loop's",
    "against": "This commit's train() against an earlier commit's",
    "threads": "Threads per recipe: one against every core",
    "compile": "train.compile against eager, per recipe",
    "variants": "What a change to the default recipe buys in step time",
    "b": "Against pytorch/examples' DCGAN step",
    "e": "Speed options, DCGAN 64x64x3 batch 64 through train()",
    "c": "The detach and freeze decisions (the training step's own code)",
    "d": "Evaluation under no_grad against autograd",
    "f": "The cost of per-phase timing (timing.enabled)",
    "h": "The cost of the health check (health.enabled)",
    "l": "What the loop itself costs per generator step",
    "r": "The residual network beside DCGAN",
}
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help=f"steps per measurement, after {WARMUP} dropped")
    parser.add_argument("--pairs", type=int, default=30, help="(a): blocks of framework steps, each followed by a "
                        "block of bare steps")
    parser.add_argument("--only", nargs="*", choices=[k for k in SECTIONS if k not in ("e", "against")],
                        default=["a", "ops", "threads", "variants", "b", "c", "d", "f", "h", "l", "r"],
                        help="sections to run (b includes e; compile only when named)")
    parser.add_argument("--recipes", nargs="*", help="only the recipes whose name contains one of these (a, against)")
    parser.add_argument("--against", metavar="COMMIT", help="also time this commit's train() against COMMIT's")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for everything measured here")
    parser.add_argument("--compile", action="store_true", help="on a CPU, also measure train.compile (slow start)")
    parser.add_argument("--write", type=Path, help="write each section into its generated block of this markdown file")
    args = parser.parse_args()
    no_gpu_probe_per_step()  # the bare loops run as plain PyTorch would, without what importing Lightning set
    if args.threads:
        global DEFAULT_THREADS
        torch.set_num_threads(args.threads)
        DEFAULT_THREADS = args.threads
    device = torch.device(args.device)
    header = (f"{args.rounds} rounds, the variants alternating; {args.steps} generator steps per measurement (per "
              f"recipe: at most that, about {WINDOW_MS // 1000} s of bare steps; each row names its count) after "
              f"{WARMUP} dropped; mean time per step (logging steps included); {torch.get_num_threads()} threads, "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}.")
    print(header, flush=True)
    command = "python benchmarks/step.py " + " ".join(sys.argv[1:])
    sections: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder, mnist = image_folder(Path(tmp) / "images"), mnist_root(Path(tmp) / "mnist")
        if "a" in args.only:
            sections["a"] = section_a(folder, mnist, args, device)
        if "ops" in args.only:
            sections["ops"] = section_ops(folder, mnist, args, device)
        if "threads" in args.only and device.type == "cpu":
            sections["threads"] = section_threads(folder, mnist, args, device)
        if "compile" in args.only:
            sections["compile"] = section_compile(folder, mnist, args, device)
        if args.against:
            sections["against"] = section_against(args.against, folder, mnist, args)
        if "b" in args.only:
            sections["b"], sections["e"] = section_b_e(folder, args, device)
        if "h" in args.only:
            sections["h"] = section_h(folder, mnist, args, device)
        if "r" in args.only:
            sections["r"] = section_r(folder, mnist, args, device)
    if "c" in args.only:
        sections["c"] = section_c(device)
    if "d" in args.only:
        sections["d"] = section_d(device, args.rounds)
    if "f" in args.only:
        sections["f"] = section_f(args, device)
    if "l" in args.only:
        sections["l"] = section_l(args)
    if "variants" in args.only:
        sections["variants"] = section_variants(args, device)
    if args.write:
        for key, rows in sections.items():
            body = [f"### {SECTIONS[key]}", "", header, "", *rows]
            write_block(args.write, f"step-{key}", "\n".join(body), command, INPUTS)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
