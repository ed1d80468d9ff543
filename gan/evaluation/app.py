"""``python evaluate.py``: score a trained run's checkpoint; write ``<run>/eval/`` and the run's TensorBoard.

It loads a run through the run layer (gan/run/load.py) -- its config, checkpoint and networks, as
training saved them -- and scores it with the same sampling, metrics and pictures as training uses.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter

from gan.config.eval_settings import EvalSettings
from gan.config.schema import EvaluateConfig, conform
from gan.core import snapshot
from gan.core.devices import resolve_device
from gan.data.datasets import data_shape, is_points, mixture_means, population
from gan.errors import ConfigError
from gan.evaluation.features import to_uint8
from gan.evaluation.metrics import build_metrics, scalars
from gan.evaluation.pictures import real_points_for_plot, render_interpolation, render_samples, save_pngs
from gan.evaluation.sampling import interpolate, sample_and_score
from gan.files import atomic_write
from gan.run.hold import EVALUATE_FIX, Held, holding, take
from gan.run.load import find_checkpoint, load_module
from gan.run.module import GANModule

log = logging.getLogger(__name__)

# Latent interpolation: paths between pairs of noise vectors. Images: a row of IMAGE_STEPS per path;
# points: POINT_STEPS along each path, drawn as a line. A conditional run gets one path per class.
PATHS, IMAGE_STEPS, POINT_STEPS = 8, 10, 24


def choose_generator(module: GANModule, ema: bool) -> tuple[str, str]:
    """Which generator of a loaded run evaluate.py samples, and the TensorBoard tag prefix of its metrics.

    ``ema=false`` sets the module's EMA copy aside (the module was loaded for this evaluation only), so
    its ``sampling_generator`` is the raw G of the same checkpoint: same seed, same noise, and the
    difference in the metrics is the effect of EMA. Returns ("ema" or "G", prefix). ``metrics/*`` is
    what training logs for the sampling generator -- the EMA copy where the run has one -- so the raw G
    of such a run logs as ``metrics_G/*``, and the two never mix on one curve.
    """
    had_ema = module.ema is not None
    if not ema:
        module.ema = None
    generator = "G" if module.ema is None else "ema"
    return generator, "metrics_G" if had_ema and generator == "G" else "metrics"


def with_run_classifier_steps(cfg: DictConfig, run_cfg: dict[str, Any]) -> DictConfig:
    """evaluate.py's settings, with ``classifier_steps=null`` (evaluate.yaml's default) replaced by the
    run's own ``eval.classifier_steps``: a run is scored in the feature space its recipe chose (the MNIST
    preset trains its classifier longer than the default), unless the command line names another."""
    if cfg.classifier_steps is not None:
        return cfg
    steps = run_cfg.get("eval", {}).get("classifier_steps")
    if steps is None:
        raise ConfigError("the run's config has no eval.classifier_steps (an older run): pass classifier_steps=<N> "
                          "(the default of configs/eval/default.yaml is the one older runs used)")
    return OmegaConf.merge(cfg, {"classifier_steps": steps})


def image_directory(images: str | None, data: dict[str, Any]) -> Path | None:
    """Where ``images=<dir>`` puts the samples as PNGs: a new or empty directory (an FID tool reads every
    image in it), for a run that makes images."""
    if images is None:
        return None
    if is_points(data_shape(data)):
        raise ConfigError(f"images={images}: data={data['name']} makes 2D points, not images; its samples are in "
                          "eval/samples.npz")
    path = Path(images).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"images={images} {'is not a directory' if not path.is_dir() else 'is not empty'}: give a "
                          "new or empty directory (an FID tool would count every image in it)")
    return path


def export_kinds(export: Any) -> list[str]:
    """``export=torch``, ``export=[torch,onnx]``: the exports asked for, each with its packages installed."""
    kinds = [export] if isinstance(export, str) else list(export or [])
    for kind in kinds:
        if missing := snapshot.missing_packages(str(kind)):
            raise ConfigError(f"export={kind} needs {', '.join(missing)}: pip install -e \".[onnx]\"")
    return [str(kind) for kind in kinds]


def evaluate_run(cfg: DictConfig) -> dict[str, Any]:
    """``python evaluate.py``: score a run's checkpoint; write ``<run>/eval/`` and TensorBoard, and what
    ``images=``, ``snapshot=true`` and ``export=`` ask for.

    Every check that can fail on bad input runs before the first file is written. The run and its ``eval/`` are
    held while it is scored (gan/run/hold.py): another evaluation is refused, and so is a resume. A run another
    process is still training is scored as it is, from the checkpoint asked for (``last.ckpt``: written whole, or
    not at all), holding ``eval/`` alone: the evaluation writes only ``eval/`` and a TensorBoard file of its own,
    and refuses ``snapshot=true`` and ``export=``, whose files sit beside the ones the run writes.
    """
    cfg = conform(cfg, EvaluateConfig)
    run_dir = None if OmegaConf.is_missing(cfg, "run_dir") else cfg.run_dir
    path = None if run_dir is None else Path(run_dir).expanduser()
    if path is None or not path.is_dir():  # refused by find_checkpoint, with what to give
        return score(cfg, run_dir, training=None)
    try:
        hold, training = take(path, "evaluating", EVALUATE_FIX, create=False), None
    except Held as held:
        if held.doing != "training":
            raise
        hold, training = None, held.holder
    try:
        with holding(path / "eval", "evaluating", EVALUATE_FIX):
            return score(cfg, run_dir, training)
    finally:
        if hold is not None:
            hold.release()


def score(cfg: DictConfig, run_dir: str | None, training: str | None) -> dict[str, Any]:
    """:func:`evaluate_run`, with what it writes held; ``training``: who trains the run meanwhile (None: no one)."""
    run, ckpt_path = find_checkpoint(run_dir, cfg.ckpt)
    exports = export_kinds(cfg.export)
    if training is not None and (cfg.snapshot or exports):
        asked = "snapshot=true" if cfg.snapshot else f"export={cfg.export}"
        raise ConfigError(f"{asked}: {run} is still training ({training}), and writes its generator.pt at its end: "
                          f"drop {asked} to score its checkpoint now, or ask again once the run has ended")
    device = resolve_device(cfg.device)
    module = load_module(ckpt_path).to(device)
    run_cfg = module.cfg
    images = image_directory(cfg.images, run_cfg["data"])
    settings = EvalSettings.from_config(with_run_classifier_steps(cfg, run_cfg), run_cfg["data"]["name"])
    # The scored samples' labels cycle through the classes G was trained on; a latent code was drawn at random
    # (sampling.py).
    classes = module.condition.classes
    if settings.num_samples < classes:  # a class without samples: no row of the grid, no per-class scores
        raise ConfigError(f"num_samples={settings.num_samples}: this run's G was trained on {classes} classes, and "
                          f"each needs its samples: give num_samples >= {classes}")
    generator, tag = choose_generator(module, cfg.ema)
    dataset = population(run_cfg["data"], run_cfg["seed"])  # all images of data.classes, not only data.limit
    metrics = build_metrics(run_cfg["data"], dataset, settings, device)
    samples, values = sample_and_score(module, metrics, settings, cfg.seed)
    step = int(module.counters.g_updates)
    # The long per-class table goes last, after the numbers a reader looks for first.
    headline = {k: v for k, v in values.items() if k != "per_class"}
    trained = run / "health.json"  # the conditions the run's health check met while it trained, and when
    health = json.loads(trained.read_text())["conditions"] if trained.is_file() else None
    result = {**headline, "generator": generator, "step": step, "num_samples": settings.num_samples,
              "seed": cfg.seed, "checkpoint": str(ckpt_path.resolve()), "health": health,
              **({"per_class": values["per_class"]} if "per_class" in values else {})}

    out = run / "eval"
    atomic_write(out / "metrics.json", lambda f: f.write((json.dumps(result, indent=2) + "\n").encode()))
    points = is_points(module.data_shape)
    # Points keep their coordinates; images are stored as the 8-bit pixels a PNG would hold.
    stored = samples.cpu().numpy().astype(np.float32) if points else to_uint8(samples).cpu().numpy()
    atomic_write(out / "samples.npz", lambda f: np.savez_compressed(f, samples=stored))
    writer = SummaryWriter(str(run / "tensorboard"))
    title = (f"step {step}: {values['modes']}/{values['modes_total']} modes, "
             f"{values['high_quality']:.0%} high quality"
             + ("" if values["spread"] is None else f", spread {values['spread']:.2f}")) if points else ""
    real_points = real_points_for_plot(dataset) if points else None
    means = mixture_means(run_cfg["data"]["name"]) if points else None
    suffix = "" if tag == "metrics" else f"_{generator}"
    render_samples(samples, out / "grid.png", writer, f"eval/grid{suffix}", step, num_classes=classes,
                   real_points=real_points, means=means, title=title)
    steps = POINT_STEPS if points else IMAGE_STEPS
    render_interpolation(interpolate(module, len(module.condition.seen) or PATHS, steps, cfg.seed), steps,
                         out / "interpolation.png", writer, f"eval/interpolation{suffix}", step,
                         real_points=real_points, means=means,
                         title=f"step {step}: paths between noise vectors (slerp)" if points else "")
    for name, value in scalars(values, tag).items():
        writer.add_scalar(name, value, step)
    writer.close()
    written = [out / "metrics.json", out / "samples.npz", out / "grid.png", out / "interpolation.png"]
    if images is not None:  # the scored samples themselves, as the 8-bit pixels samples.npz holds
        labels = module.condition.cycle(len(stored)).numpy() if classes else None
        save_pngs(stored, labels, images)
        written.append(images)
    if cfg.snapshot or exports:
        saved = module.snapshot(checkpoint=str(ckpt_path.resolve()))
        if cfg.snapshot:
            snapshot.save_snapshot(run / snapshot.FILE, saved)
            written.append(run / snapshot.FILE)
        G = snapshot.load_generator(saved)
        for kind in exports:
            path = run / snapshot.EXPORTS[kind][0]
            difference = snapshot.export(G, kind, path)
            log.info(f"{kind} export {path}: at most {difference:.2g} from the eager generator on the same noise")
            written.append(path)
    log.info(f"{run} at generator step {step} ({generator}): " + ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in headline.items()))
    if "per_class" in values:
        log.info("per class: " + "; ".join(
            f"{label} " + ", ".join(f"{k} {v:.3g}" for k, v in entry.items() if isinstance(v, float))
            for label, entry in values["per_class"].items()))
    log.info(f"wrote {', '.join(map(str, written))}")
    return result
