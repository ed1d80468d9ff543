"""How good are samples? The mode protocol for 2D mixtures; FID, KID, precision/recall and density/coverage
for images.

* 2D mixtures: ``modes`` captured out of ``modes_total``, the ``high_quality`` fraction (within 3 std
  of a mean), ``reverse_kl`` of the mode shares from uniform, and the ``spread`` of the samples
  around each mode against the data's (the protocol: docs/protocols.md).
* Images: ``fid`` and ``kid`` from torchmetrics, k-NN ``precision`` / ``recall`` (Kynkäänniemi et
  al. 2019, k = 3) and ``density`` / ``coverage`` (Naeem et al. 2020, the same k and balls), all in one
  feature space (gan/evaluation/features.py), named by ``features``.
* StackedMNIST, besides the image metrics: ``stacked_modes`` of its 1,000 modes and ``stacked_kl`` from the
  uniform, each channel recognised by the MNIST classifier, and the same of as many real stacks, the floor
  (``stacked_modes_real``, ``stacked_kl_real``; the protocol: docs/protocols.md).
* Class-conditional generators, besides those: ``class_accuracy``, the share of samples recognised as
  the class they were generated for, and ``per_class``: {"<label>": {...}} with each class's
  ``accuracy`` and, for images, its ``fid`` against the real images of that class. 2D mixtures'
  labels are mode indices, so "recognised" means "nearest to that mode's mean"; images are recognised
  by the feature classifier's head, which only the ``classifier`` space has (rotation and Inception
  spaces give per-class FID but no accuracy).

Nothing here knows how samples are made or when they are measured: gan/evaluation/sampling.py draws them,
gan/training/outputs.py's Metrics measures during training and gan/evaluation/app.py is ``python
evaluate.py``. Every random draw here comes from a seeded generator of its own or a forked RNG: same
seed, same numbers.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance
from torchmetrics.utilities import dim_zero_cat

from gan.config.eval_settings import EvalSettings
from gan.core.contexts import evaluating
from gan.data.datasets import STACKED_MODES, StackedMNIST, build_dataset, is_points, mixture_means, stack_modes
from gan.errors import ConfigError
from gan.evaluation.features import (
    FeatureExtractor,
    classifier_features,
    inception_features,
    per_channel_features,
    to_uint8,
)

KID_SUBSET_SIZE = 1000  # torch-fidelity's default; smaller sample sets use all they have
# Per-class FID only where the class has at least this many generated and this many real images. FID
# fits a mean and a covariance to each set, and its estimate is biased upward by a term that shrinks
# like 1/N (Chong & Forsyth 2020): with few images that floor is a large part of the number. Measured
# floors, and why 50: docs/results.md, "Per-class FID and sample size". Above the threshold the floor
# is small but not zero, so compare per-class FIDs between similar counts (balanced labels give the
# generated side equal counts; real classes are as the data has them).
MIN_CLASS_SAMPLES = 50
# A generated image counts as recognised (``confident``) when the feature classifier gives its most
# likely class at least this probability.
CONFIDENCE = 0.9




# --- 2D mixtures ---------------------------------------------------------------------------------

def mixture_metrics(samples: Tensor, means: Tensor, std: float) -> dict[str, float | int | None]:
    """The PacGAN / VEEGAN protocol: each sample belongs to its nearest mean.

    A sample is high quality within 3 std of that mean; a mode is captured when at least one high
    quality sample belongs to it; ``reverse_kl`` = sum_k p_k log(K p_k) over the shares p_k of all
    samples (empty modes add 0): 0 when the samples spread evenly over the modes.
    """
    distance, nearest = nearest_mean(samples, means)
    high_quality = distance <= 3 * std
    num_modes = len(means)
    captured = torch.bincount(nearest[high_quality], minlength=num_modes) > 0
    return {"modes": int(captured.sum()), "modes_total": num_modes,
            "high_quality": high_quality.double().mean().item(),
            "reverse_kl": kl_from_uniform(nearest, num_modes),
            **spread(distance[high_quality], nearest[high_quality], num_modes, std)}


def spread(distance: Tensor, nearest: Tensor, num_modes: int, std: float) -> dict[str, float | None]:
    """Each captured mode's rms distance of its samples to its mean, over the data's (``std * sqrt(2)``, a
    2D Gaussian's): ``spread`` is the median mode's, ``spread_min`` / ``spread_max`` the extremes (None when
    no mode is captured: nothing to measure, and nothing logged). Real data scores 0.974; a mode learned as
    a near point scores near 0, which the high-quality share cannot see. ``distance`` and ``nearest``: the
    high-quality samples' distances to their nearest means and those means' indices."""
    counts = torch.bincount(nearest, minlength=num_modes)
    squares = torch.zeros(num_modes, dtype=distance.dtype, device=distance.device)
    squares.index_add_(0, nearest, distance.pow(2))
    ratios = (squares[counts > 0] / counts[counts > 0]).sqrt() / (std * 2 ** 0.5)
    if not len(ratios):
        return {"spread": None, "spread_min": None, "spread_max": None}
    # torch.median picks the lower of the two middle values; the mean of both is the usual median
    middle = ratios.sort().values
    median = (middle[(len(middle) - 1) // 2] + middle[len(middle) // 2]) / 2
    return {"spread": median.item(), "spread_min": middle[0].item(), "spread_max": middle[-1].item()}


def kl_from_uniform(assigned: Tensor, num_groups: int) -> float:
    """sum_k p_k log(K p_k), p_k the share of ``assigned`` (group indices) equal to k, K ``num_groups``:
    the KL divergence of the shares from uniform. Empty groups add 0; all in one group gives log K."""
    shares = torch.bincount(assigned, minlength=num_groups).double() / len(assigned)
    present = shares[shares > 0]
    return (present * (num_groups * present).log()).sum().item()


def nearest_mean(samples: Tensor, means: Tensor) -> tuple[Tensor, Tensor]:
    """(distance to the nearest mean, its index) of each sample."""
    return torch.cdist(samples.double(), means.to(samples.device).double()).min(dim=1)


def class_accuracy(predicted: Tensor, labels: Tensor) -> dict[str, Any]:
    """How often a conditional generator's samples are recognised as the class they were generated for.

    ``predicted``: the recognised class of each sample; ``labels``: the class it was generated for.
    Returns ``class_accuracy`` over all samples and ``per_class``: {"<label>": {"num_samples",
    "accuracy"}} for every label present (a share, so classes of unequal counts still compare).
    """
    correct = predicted.to(labels.device) == labels
    per_class = {}
    for label in labels.unique().tolist():
        mine = labels == label
        per_class[str(label)] = {"num_samples": int(mine.sum()), "accuracy": correct[mine].double().mean().item()}
    return {"class_accuracy": correct.double().mean().item(), "per_class": per_class}


class MixtureMetrics(nn.Module):
    """:func:`mixture_metrics` for one mixture, with the ``score`` interface of :class:`ImageMetrics`;
    the means are a buffer, so they follow ``.to(device)``."""

    def __init__(self, means: Tensor, std: float):
        super().__init__()
        self.register_buffer("means", means)
        self.std = std

    def score(self, samples: Tensor, seed: int = 0, labels: Tensor | None = None) -> dict[str, Any]:
        """:func:`mixture_metrics`; with the ``labels`` of a conditional generator (mode indices, as in
        the data) also :func:`class_accuracy`, a sample counting as right when its nearest mean is the
        mode it was generated for. Deterministic: the seed is not needed."""
        values: dict[str, Any] = mixture_metrics(samples, self.means, self.std)
        if labels is not None:
            values.update(class_accuracy(nearest_mean(samples, self.means)[1], labels.to(samples.device)))
        return values


# --- images --------------------------------------------------------------------------------------

def knn_radii(points: Tensor, k: int, chunk: int = 1024) -> Tensor:
    """Distance from each point to its k-th nearest neighbour among the others."""
    # k + 1 smallest: the point itself is at distance 0 and comes first.
    return torch.cat([torch.cdist(rows, points).topk(k + 1, largest=False).values[:, k]
                      for rows in points.split(chunk)])


def inside(points: Tensor, centres: Tensor, radii: Tensor, chunk: int = 1024) -> Tensor:
    """For each point: does it lie within ``radii[j]`` of some ``centres[j]``?"""
    return torch.cat([(torch.cdist(rows, centres) <= radii).any(dim=1) for rows in points.split(chunk)])


def knn_precision_recall(real: Tensor, fake: Tensor, k: int = 3,
                         real_radii: Tensor | None = None) -> tuple[float, float]:
    """k-NN precision and recall (Kynkäänniemi et al. 2019) of feature sets (N, D) and (M, D).

    Each set's manifold is the union of balls around its points reaching their k-th nearest neighbour.
    Precision: the share of fakes inside the real manifold (are samples realistic?). Recall: the share
    of reals inside the fake manifold (is the data covered?). Written here because torchmetrics has
    only the classification kind of precision/recall. ``real_radii``: ``knn_radii(real, k)``, if known.
    """
    real, fake = real.double(), fake.double()
    radii = knn_radii(real, k) if real_radii is None else real_radii.double()
    precision = inside(fake, real, radii).double().mean().item()
    recall = inside(real, fake, knn_radii(fake, k)).double().mean().item()
    return precision, recall


def knn_density_coverage(real: Tensor, fake: Tensor, k: int = 3, real_radii: Tensor | None = None,
                         chunk: int = 1024) -> tuple[float, float]:
    """Density and coverage (Naeem et al. 2020) of feature sets (N, D) and (M, D), with the balls of
    :func:`knn_precision_recall`'s real manifold: around each real point, reaching its k-th nearest
    real neighbour. Only real balls count, so a few outlying fakes cannot inflate a manifold as
    they inflate recall's.

    Density: (1 / kM) times the number of (fake, real ball) pairs with the fake inside the ball -- how
    many real balls a fake lies in, over k: about 1 for fakes distributed as the reals, above 1 where
    they crowd into dense regions, below where they stray. Coverage: the share of real balls holding at
    least one fake (is every region of the data reached?).
    """
    real, fake = real.double(), fake.double()
    radii = knn_radii(real, k) if real_radii is None else real_radii.double()
    pairs = sum(int((torch.cdist(rows, real) <= radii).sum()) for rows in fake.split(chunk))
    nearest_fake = torch.cat([torch.cdist(rows, fake).min(dim=1).values for rows in real.split(chunk)])
    return pairs / (k * len(fake)), (nearest_fake <= radii).double().mean().item()


def frechet_distance(real: Tensor, fake: Tensor) -> float:
    """FID between feature sets (N, D) and (M, D): the Fréchet distance of Gaussians fitted to each.

    ||mu_r - mu_f||^2 + tr(S_r) + tr(S_f) - 2 tr((S_r S_f)^(1/2)), in float64. The trace of the matrix
    square root is the sum of the square roots of the eigenvalues of S_r S_f (real and >= 0 in exact
    arithmetic; rounding can leave tiny imaginary parts, dropped by ``.real``), the formula torchmetrics
    uses, so the full sets give ImageMetrics' ``fid`` (a test checks it). Written here for subsets:
    torchmetrics' FID only holds running sums of all images it was given.
    """
    real, fake = real.double(), fake.double()
    cov_real, cov_fake = torch.cov(real.T), torch.cov(fake.T)
    mean_term = (real.mean(0) - fake.mean(0)).square().sum()
    root_trace = torch.linalg.eigvals(cov_real @ cov_fake).sqrt().real.sum()
    return (mean_term + cov_real.trace() + cov_fake.trace() - 2 * root_trace).item()


class ImageMetrics(nn.Module):
    """FID and KID (torchmetrics) and k-NN precision/recall of generated images, in one feature space.

    The real images go in once (:meth:`add_real`). Their statistics are the metrics' states, made
    persistent: they are in ``state_dict()``, so a saved ImageMetrics reloads without seeing a real
    image again. :meth:`score` then only embeds the generated images. The real images' labels (-1
    where unknown) are a buffer too, in the order of KID's stored features: per-class FID needs them.
    """

    def __init__(self, extractor: FeatureExtractor, k: int = 3, kid_subset_size: int = KID_SUBSET_SIZE,
                 batch_size: int = 250, classes: list[int] | None = None):
        super().__init__()
        self.extractor, self.k, self.classes = extractor, k, classes  # classes: data.classes, the ones to learn
        self.kid_subset_size, self.batch_size = kid_subset_size, batch_size
        # The one extractor instance is FID's and KID's `feature`: one feature space by construction.
        # reset_real_features=False: reset() before each score forgets only the generated images.
        # sync_on_compute=False: scored on one process, with no collective call for others to join.
        options = {"feature": extractor, "reset_real_features": False, "sync_on_compute": False}
        self.fid = FrechetInceptionDistance(**options)
        with warnings.catch_warnings():  # "will save all extracted features": wanted, for precision/recall
            warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
            self.kid = KernelInceptionDistance(subset_size=kid_subset_size, **options)
        self.fid.persistent(True)
        self.kid.persistent(True)
        self.register_buffer("real_labels", torch.empty(0, dtype=torch.long))
        # The saved labels' count is unknown until loading: take their shape first, or
        # load_state_dict would refuse to copy them into the empty buffer.
        self.register_load_state_dict_pre_hook(resize_real_labels)

    def add_real(self, images: Tensor, labels: Tensor | None = None) -> None:
        """Real images (and their class labels, if known) to compare with; may be called repeatedly."""
        if labels is None:
            labels = torch.full((len(images),), -1, dtype=torch.long)
        self.real_labels = torch.cat((self.real_labels, labels.to(self.real_labels.device)))
        self.embed(images, real=True)

    def embed(self, images: Tensor, real: bool) -> None:
        """Pass ``images`` through the extractor into FID's and KID's states."""
        with evaluating(self.extractor):
            for batch in images.split(self.batch_size):
                self.fid.update(batch, real=real)
                self.kid.update(batch, real=real)  # the batch FID just embedded: the extractor's features again
        self.extractor.last = None  # which would hold the images' storage until the next embedding

    def score(self, fake: Tensor, seed: int = 0, labels: Tensor | None = None) -> dict[str, Any]:
        """The metrics of generated images ``fake`` against the real ones; ``seed`` picks KID's subsets.

        ``labels``: the class each image was generated for (conditional generators); adds
        :meth:`class_scores`.
        """
        if int(self.fid.real_features_num_samples) == 0:
            raise RuntimeError("ImageMetrics.score before add_real: there is nothing to compare with")
        self.fid.reset()
        self.kid.reset()
        self.embed(fake, real=False)
        # KID's own stored features: the same embeddings, without a third pass through the extractor.
        real_features, fake_features = dim_zero_cat(self.kid.real_features), dim_zero_cat(self.kid.fake_features)
        self.kid.subset_size = min(self.kid_subset_size, len(real_features), len(fake_features))
        with torch.random.fork_rng(devices=[]):  # KID draws its subsets from the global CPU generator
            torch.manual_seed(seed)
            kid, _ = self.kid.compute()
        radii = knn_radii(real_features.double(), self.k)  # the real manifold's balls, shared by all four
        precision, recall = knn_precision_recall(real_features, fake_features, self.k, radii)
        density, coverage = knn_density_coverage(real_features, fake_features, self.k, radii)
        values = {"fid": self.fid.compute().item(), "kid": kid.item(), "precision": precision,
                  "recall": recall, "density": density, "coverage": coverage, "features": self.extractor.name}
        if self.extractor.head is not None:
            with torch.no_grad():
                values.update(class_balance(self.extractor.head(fake_features), self.classes))
        if labels is not None:
            values.update(self.class_scores(real_features, fake_features, labels.to(fake_features.device)))
        return values

    def class_scores(self, real_features: Tensor, fake_features: Tensor, labels: Tensor) -> dict[str, Any]:
        """``class_accuracy`` and ``per_class`` of generated images, from features already computed.

        Accuracy needs the feature space's class head (``classifier`` only: see gan/evaluation/features.py);
        without one, ``per_class`` holds counts and FIDs alone. Each class's ``fid`` compares its
        generated images with the real images of that class, when both number at least
        ``MIN_CLASS_SAMPLES``.
        """
        head = self.extractor.head
        if head is not None:
            with torch.no_grad():
                values = class_accuracy(head(fake_features).argmax(dim=1), labels)
        else:
            values = {"per_class": {str(label): {"num_samples": int((labels == label).sum())}
                                    for label in labels.unique().tolist()}}
        real_labels = self.real_labels.to(real_features.device)
        for label, entry in values["per_class"].items():
            real_of_class = real_features[real_labels == int(label)]
            fake_of_class = fake_features[labels == int(label)]
            entry["num_real"] = len(real_of_class)
            if min(len(real_of_class), len(fake_of_class)) >= MIN_CLASS_SAMPLES:
                entry["fid"] = frechet_distance(real_of_class, fake_of_class)
        return values


def class_balance(logits: Tensor, classes: list[int] | None = None,
                  confidence: float = CONFIDENCE) -> dict[str, float]:
    """How the feature classifier sees a set of images, from its ``logits`` (N, K).

    ``class_kl``: the KL divergence of the predicted classes' shares from the uniform distribution,
    sum_k p_k log(K p_k) (0: every class equally often; log K: one class only) -- the image analogue
    of the 2D mixtures' ``reverse_kl``. ``confident``: the share of images whose most likely class has
    probability >= ``confidence``: images the classifier recognises, rather than strokes between classes.

    ``classes`` (a run's ``data.classes``): only those are to be learned. ``confident`` then counts an image
    recognised as one of them, ``class_kl`` compares the predicted shares with the uniform over them (images
    predicted as another class count toward no share), and ``classes_present`` counts those predicted
    confidently for at least a quarter of their fair share of the images.
    """
    probabilities = logits.double().softmax(dim=1)
    best, predicted = probabilities.max(dim=1)
    sure = best >= confidence
    if classes is None:
        return {"class_kl": kl_from_uniform(predicted, probabilities.shape[1]),
                "confident": sure.double().mean().item()}
    position = torch.full_like(predicted, -1)  # each image's predicted class, as its place in `classes` (-1: other)
    for i, label in enumerate(classes):
        position[predicted == label] = i
    inside = position >= 0
    counts = torch.bincount(position[inside & sure], minlength=len(classes))
    return {"class_kl": kl_from_uniform(position[inside], len(classes)) if inside.any() else math.log(len(classes)),
            "confident": (sure & inside).double().mean().item(),
            "classes_present": int((counts >= len(predicted) / len(classes) / 4).sum())}


def resize_real_labels(module: ImageMetrics, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Before loading a state: give ``real_labels`` the saved tensor's shape (a load_state_dict pre-hook)."""
    saved = state_dict.get(prefix + "real_labels")
    if saved is not None:
        module.real_labels = torch.empty_like(saved, device=module.real_labels.device)


def quantize(images: Tensor) -> Tensor:
    """Round [-1, 1] images to the 256 levels a PNG holds: what is scored is what would be saved."""
    return to_uint8(images).float() / 127.5 - 1.0


def real_images(dataset: Dataset, limit: int) -> tuple[Tensor, Tensor]:
    """(images, labels) of all of ``dataset``, or of a fixed subset of ``limit`` items.

    The subset is drawn with seed 0, not the run's seed: every evaluation on this data compares
    against the same real images.
    """
    n = len(dataset)
    index = torch.arange(n)
    if n > limit:
        index = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:limit].sort().values
    if isinstance(dataset, TensorDataset):
        images, labels = (t[index] for t in dataset.tensors)
    else:  # image folders decode lazily: read the subset once
        batches = list(DataLoader(Subset(dataset, index.tolist()), batch_size=256))
        images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    return quantize(images), labels


def data_id(data_cfg: dict[str, Any]) -> str:
    """Names the real data in cache file names: ``digits``, ``mnist-test``, ``folder-faces-1a2b3c4d``."""
    if data_cfg["name"] == "folder":
        path = Path(data_cfg["path"]).expanduser().resolve()
        return f"folder-{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    split = data_cfg.get("split", "train")
    return data_cfg["name"] if split == "train" else f"{data_cfg['name']}-{split}"


def build_metrics(data_cfg: dict[str, Any], dataset: Dataset, settings: EvalSettings,
                  device: torch.device | str = "cpu") -> MixtureMetrics | ImageMetrics:
    """The metrics for a run's data, with the real side already in place."""
    name = data_cfg["name"]
    if is_points(tuple(dataset[0][0].shape)):
        if settings.features is not None:
            raise ConfigError(f"features={settings.features} is for images; data={name} is scored by the "
                              "mode protocol (modes, high_quality, reverse_kl)")
        return MixtureMetrics(mixture_means(name), data_cfg["std"]).to(device)
    if isinstance(dataset, StackedMNIST):
        return stacked_metrics(data_cfg, dataset, settings, device)
    images, labels = real_images(dataset, settings.num_real)
    images = images.to(device)
    metrics = ImageMetrics(image_space(data_cfg, images, labels, settings, device), batch_size=settings.batch_size,
                           classes=data_cfg.get("classes")).to(device)
    metrics.add_real(images, labels)
    return metrics


def image_space(data_cfg: dict[str, Any], images: Tensor, labels: Tensor, settings: EvalSettings,
                device: torch.device | str) -> FeatureExtractor:
    """The feature space of a run's real ``images`` (and ``labels``), as :func:`feature_space` picks it; for a run
    on some of the data's classes (``data.classes``), the classifier of every class, which can tell a sample of
    the chosen classes from one of the others."""
    if data_cfg.get("classes") is None:
        return feature_space(data_cfg, images, labels, settings, device)
    whole = build_dataset({**data_cfg, "classes": None, "limit": None}, 0)
    every, every_label = real_images(whole, settings.num_real)
    return feature_space(data_cfg, every.to(device), every_label, settings, device)


def feature_space(data_cfg: dict[str, Any], images: Tensor, labels: Tensor, settings: EvalSettings,
                  device: torch.device | str) -> FeatureExtractor:
    """The feature space ``settings.features`` names (null: ``classifier`` for labelled data, else ``rotation``),
    trained on the real ``images`` (and ``labels``) where it is learned from the data."""
    labelled = bool((labels >= 0).all()) and int(labels.max()) >= 1
    features = settings.features or ("classifier" if labelled else "rotation")
    if features == "classifier" and not labelled:
        raise ConfigError(f"features=classifier needs class labels and data={data_cfg['name']} has none: use "
                          "features=rotation or features=inception")
    if features == "inception":
        return inception_features(settings.inception_weights, settings.inception_sha256).to(device)
    return classifier_features(features, data_id(data_cfg), images, labels if features == "classifier" else None,
                               settings.cache_dir, settings.classifier_steps)


# --- StackedMNIST --------------------------------------------------------------------------------

def stacked_modes(logits: Tensor) -> dict[str, int | float]:
    """The mode count of StackedMNIST images (VEEGAN, PacGAN) from the MNIST classifier's ``logits`` (N, 3, 10)
    for each channel: the three recognised digits make one of 1,000 modes (:func:`stack_modes`).

    ``stacked_modes``: how many modes occur; ``stacked_kl``: :func:`kl_from_uniform` of their shares (0: every
    mode equally often; log 1000: one mode only).
    """
    modes = stack_modes(logits.argmax(dim=-1))
    return {"stacked_modes": int(modes.unique().numel()), "stacked_kl": kl_from_uniform(modes, STACKED_MODES)}


def digit_logits(classifier: FeatureExtractor, digits: Tensor, batch_size: int) -> Tensor:
    """The MNIST classifier's logits (N, 10) of 1-channel images (N, 1, S, S) in [-1, 1]."""
    with evaluating(classifier), torch.no_grad():
        return torch.cat([classifier.head(classifier(batch)) for batch in digits.split(batch_size)])


class StackedMetrics(ImageMetrics):
    """:class:`ImageMetrics` of StackedMNIST images, and its protocol's mode count (docs/protocols.md):
    ``stacked_modes`` and ``stacked_kl`` of the generated stacks, each channel recognised by the MNIST
    classifier ``digits`` as the 1-channel image it was trained on, beside ``stacked_modes_real`` and
    ``stacked_kl_real``, the same figures of real stacks (:meth:`add_real_stacks`): the floor. ``digits`` maps
    (N, 1, S, S) images to features, and its head those to 10 logits."""

    def __init__(self, extractor: FeatureExtractor, digits: FeatureExtractor, **kwargs: Any):
        super().__init__(extractor, **kwargs)
        self.digits = digits
        self.real_modes: dict[str, int | float] = {}

    def add_real_stacks(self, stacks: StackedMNIST) -> None:
        """``stacked_modes_real`` and ``stacked_kl_real``: what data itself scores, at as many stacks as are
        generated, each channel classified as a generated one is (8-bit, the same size). A real stack's channels
        are MNIST digits, so each digit the stacks hold is classified once."""
        drawn, where = stacks.triples.unique(return_inverse=True)
        images, device = stacks.digits.tensors[0], self.real_labels.device
        logits = torch.cat([digit_logits(self.digits, quantize(images[index]).to(device), self.batch_size)
                            for index in drawn.split(self.batch_size)])
        self.real_modes = {f"{key}_real": value for key, value in stacked_modes(logits[where.to(device)]).items()}

    def score(self, fake: Tensor, seed: int = 0, labels: Tensor | None = None) -> dict[str, Any]:
        """:meth:`ImageMetrics.score`, and the mode count of ``fake`` (N, 3, S, S) and of the real stacks."""
        values = super().score(fake, seed, labels)
        channels = digit_logits(self.digits, fake.flatten(0, 1).unsqueeze(1), self.batch_size)
        return {**values, **stacked_modes(channels.unflatten(0, fake.shape[:2])), **self.real_modes}


def stacked_metrics(data_cfg: dict[str, Any], dataset: StackedMNIST, settings: EvalSettings,
                    device: torch.device | str) -> StackedMetrics:
    """StackedMNIST's metrics. Its digits are recognised by data=mnist's own classifier (the same digits and
    settings: the same cached network); the ``classifier`` space is that network's features of each channel.
    The real stacks are drawn with seed 0, not the run's: every run on this data is compared with the same."""
    mnist = stacked_digits(data_cfg, dataset, settings, device)
    images, labels = real_images(StackedMNIST(dataset.digits, settings.num_real, seed=0), settings.num_real)
    images = images.to(device)
    if settings.features in (None, "classifier"):
        extractor = per_channel_features(mnist, images.shape[1])
    else:
        extractor = feature_space(data_cfg, images, labels, settings, device)
    metrics = StackedMetrics(extractor, mnist, batch_size=settings.batch_size).to(device)
    metrics.add_real(images, labels)
    metrics.add_real_stacks(StackedMNIST(dataset.digits, settings.num_samples, seed=0))
    return metrics


def stacked_digits(data_cfg: dict[str, Any], dataset: StackedMNIST, settings: EvalSettings,
                   device: torch.device | str) -> FeatureExtractor:
    """data=mnist's classifier of the digits StackedMNIST stacks (the cached one of that split)."""
    digits, digit_labels = real_images(dataset.digits, settings.num_real)
    return classifier_features("classifier", data_id({"name": "mnist", "split": data_cfg.get("split", "train")}),
                               digits.to(device), digit_labels, settings.cache_dir, settings.classifier_steps)


# --- training health -----------------------------------------------------------------------------

class ReferenceSpace(nn.Module):
    """A space that does not train with D, in which the health check (gan/training/health.py) compares G's samples
    with real data: a 2D mixture's own points, each classified by its nearest mode; or the image metrics' learned
    feature network (``classifier``, or ``rotation`` for unlabelled data: Inception costs too much to run at every
    check), whose class head, where it has one, classifies."""

    def __init__(self, extractor: FeatureExtractor | None = None, means: Tensor | None = None):
        super().__init__()
        self.extractor = extractor
        self.register_buffer("means", means)

    def forward(self, x: Tensor) -> Tensor:
        """The features of samples or real data ``x``, (N, F)."""
        return x.flatten(1).float() if self.extractor is None else self.extractor.net(x.float())

    @property
    def classifies(self) -> bool:
        return self.means is not None or self.extractor.head is not None

    def classify(self, features: Tensor) -> Tensor:
        """The class of each of ``features`` (from :meth:`forward`), where :attr:`classifies`."""
        if self.means is not None:
            return torch.cdist(features, self.means).argmin(dim=1)
        return self.extractor.head(features).argmax(dim=1)


def reference_space(data_cfg: dict[str, Any], dataset: Dataset, settings: EvalSettings,
                    device: torch.device | str) -> ReferenceSpace:
    """The health check's :class:`ReferenceSpace` for a run on ``dataset`` (its population); an image space is
    evaluate.py's, trained once per dataset and cached, so the two share one network."""
    if is_points(tuple(dataset[0][0].shape)):
        return ReferenceSpace(means=mixture_means(data_cfg["name"])).to(device)
    settings = replace(settings, features=None if settings.features == "inception" else settings.features)
    if isinstance(dataset, StackedMNIST):
        digits = stacked_digits(data_cfg, dataset, settings, device)
        return ReferenceSpace(per_channel_features(digits, dataset[0][0].shape[0])).to(device)
    images, labels = real_images(dataset, settings.num_real)
    return ReferenceSpace(image_space(data_cfg, images.to(device), labels, settings, device)).to(device)


def precision_coverage(reference: Tensor, radii: Tensor, points: Tensor) -> tuple[Tensor, Tensor]:
    """k-NN precision and coverage (the balls of :func:`knn_precision_recall`: ``radii``, from
    :func:`knn_radii` of ``reference``) of feature sets ``points`` against ``reference``, on the device: the share
    of ``points`` inside some reference ball, and the share of reference balls holding some point."""
    distance = torch.cdist(points.double(), reference.double())
    return (distance <= radii).any(dim=1).double().mean(), (distance.min(dim=0).values <= radii).double().mean()


# --- TensorBoard ---------------------------------------------------------------------------------

def scalars(values: dict[str, Any], prefix: str = "metrics") -> dict[str, float]:
    """The numeric metrics as plain floats, tagged ``<prefix>/<name>`` for TensorBoard (``per_class``,
    a dict, stays in metrics.json)."""
    return {f"{prefix}/{k}": float(v) for k, v in values.items() if isinstance(v, (int, float))}
