"""Feature spaces for the image metrics: FID, KID and precision/recall compare images through one of these.

* ``classifier``: a small CNN trained on the dataset's own images and labels, offline, in seconds on a
  CPU; its globally pooled last convolution is the feature space (as Inception's pool3 is for FID).
* ``rotation``: the same CNN trained to tell which of four rotations (0, 90, 180, 270 degrees) an image
  was given (Gidaris et al. 2018). Every image carries that label, so an unlabelled folder still gets a
  feature space *learned from its own images*: telling upright from rotated needs shapes and layout,
  where a randomly initialised network would only measure colour and texture statistics, and Inception
  needs weights these machines cannot download. Weak where orientation is ambiguous (textures, aerial
  views): use ``inception`` there.
* ``inception``: the standard FID space, Inception-v3 pool3 (2,048 features), from one of two files
  already on disk (nothing is downloaded), each checked against its sha256 before it is loaded:
  StyleGAN2-ADA's TorchScript ``inception-2015-12-05.pt``, or torch-fidelity's weights, run by
  torchmetrics.

Only the ``classifier`` space keeps its network's head (a linear layer from the features to logits
over the dataset's classes): conditional runs use it to ask whether a sample shows the class it was
generated for. The rotation head predicts quarter turns and Inception's ImageNet classes are not the
dataset's, so those spaces have no class head, and conditional runs get per-class FID there but no
class accuracy.

A trained classifier is the identity of its feature space -- FIDs are comparable only within one -- so
it is trained once per dataset, image size and number of steps with a fixed seed, and cached on disk next to a SHA-256
checksum in ``sha256sum`` format. A file that fails its checksum is an error, not a silent retrain: a
retrained classifier is a new feature space, and numbers measured before would no longer compare.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import time
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from filelock import FileLock, Timeout
from torch import Tensor, nn
from torchmetrics.image.fid import NoTrainInceptionV3

from gan.errors import ConfigError
from gan.files import atomic_write

log = logging.getLogger(__name__)

# torch-fidelity's Inception-v3 weights (the TensorFlow FID network, ported); torch.hub caches them
# under this file name, which is where torchmetrics would look for them. By torch.hub's convention the
# name ends in the first 8 hex digits of the file's sha256.
TORCH_FIDELITY_URL = ("https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/"
                      "weights-inception-2015-12-05-6726825d.pth")
TORCH_FIDELITY_SHA256_PREFIX = "6726825d"
# StyleGAN2-ADA's metrics network: the TensorFlow FID graph translated to TorchScript, and the sha256 of
# that file as the projects that check their download of it (k-diffusion among them) record it.
STYLEGAN_URL = "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt"
STYLEGAN_SHA256 = "f58cb9b6ec323ed63459aa4fb441fe750cfe39fafad6da5cb504a16f19e958f4"


def to_uint8(images: Tensor) -> Tensor:
    """[-1, 1] float images -> uint8 in 0..255, as they would be saved to a PNG."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class FeatureExtractor(nn.Module):
    """A frozen network from [-1, 1] images (N, C, H, W) to features (N, num_features).

    ``num_features`` is read by torchmetrics' FID, which otherwise pushes a dummy 299x299 image
    through the network to find it. ``head``, when given, maps features to logits over the dataset's
    classes (the trained classifier's last layer); ``None`` where the network was not trained on them.
    """

    def __init__(self, name: str, net: nn.Module, num_features: int, head: nn.Module | None = None):
        super().__init__()
        self.name, self.net, self.num_features, self.head = name, net, num_features, head
        self.requires_grad_(False)
        self.eval()
        self.last: tuple[Tensor, Tensor] | None = None  # the last batch embedded and its features

    def forward(self, images: Tensor) -> Tensor:
        # FID and KID each embed the batch they are given, and ImageMetrics gives both the same tensor: the second
        # takes the first's features rather than run the network again (half of an evaluation's embedding time).
        if self.last is None or self.last[0] is not images:
            self.last = images, self.net(images)
        return self.last[1]


# --- classifier and rotation features ------------------------------------------------------------

class ConvClassifier(nn.Module):
    """3x3 convolutions with 2x2 max pooling between them down to at most 4x4 pixels, global average
    pooling, a linear head. Channels: width, 2 width, then 4 width.

    Pooling down to 4x4 before the global average lets the last convolution see the whole image (the
    layout of the strokes, not just which strokes exist). No BatchNorm or dropout: features must not
    depend on train/eval mode or on the rest of the batch.
    """

    def __init__(self, channels: int, image_size: int, num_classes: int, width: int = 32):
        super().__init__()
        layers: list[nn.Module] = []
        size, stage = image_size, 0
        while True:
            out = width * 2 ** min(stage, 2)
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU()]
            channels, stage = out, stage + 1
            if size <= 4:
                break
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
            size = -(-size // 2)  # ceil
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(channels, num_classes)
        self.width, self.num_features = width, channels

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.body(images))


def rotations(images: Tensor) -> tuple[Tensor, Tensor]:
    """Each image at 0, 90, 180 and 270 degrees, labelled 0..3: the ``rotation`` task's examples."""
    rotated = torch.cat([torch.rot90(images, k, dims=(2, 3)) for k in range(4)])
    return rotated, torch.arange(4, device=images.device).repeat_interleave(len(images))


def train_classifier(images: Tensor, labels: Tensor | None, steps: int = 500, batch_size: int = 64,
                     seed: int = 0) -> tuple[ConvClassifier, float, int]:
    """Train on a seeded 80 % of ``images``; returns (net, accuracy on the other 20 %, held-out count).

    ``labels=None`` trains the rotation task: each image of a batch appears at all four rotations
    (made per batch, so memory stays at one copy of the images). Adam with a cosine learning-rate
    decay for a fixed number of steps bounds the cost on any dataset (accuracies and times of the
    default 500 steps: docs/results.md). Runs in a forked RNG: training a classifier does not move the
    caller's random streams.
    """
    def examples(index: Tensor) -> tuple[Tensor, Tensor]:
        return rotations(images[index]) if labels is None else (images[index], labels[index])

    num_classes = 4 if labels is None else int(labels.max()) + 1
    per_batch = batch_size // 4 if labels is None else batch_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Indices drawn on the CPU even for GPU images: only the CPU stream is seeded and forked here.
        order = torch.randperm(len(images))
        held_out, train = order[: len(images) // 5], order[len(images) // 5:]
        net = ConvClassifier(images.shape[1], images.shape[-1], num_classes).to(images.device)
        optimizer = torch.optim.Adam(net.parameters(), lr=2e-3)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        for _ in range(steps):
            x, y = examples(train[torch.randint(len(train), (per_batch,))])
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    net.requires_grad_(False).eval()
    correct, total = 0, 0
    with torch.no_grad():
        for index in held_out.split(256):
            x, y = examples(index)
            correct += int((net(x).argmax(1) == y).sum())
            total += len(y)
    return net, correct / total, total


def classifier_features(kind: str, data_id: str, images: Tensor, labels: Tensor | None, cache_dir: str,
                        steps: int = 500) -> FeatureExtractor:
    """The ``classifier`` (``labels`` given) or ``rotation`` (``labels=None``) feature space, cached.

    ``images`` are real training images in [-1, 1]. The cache file is named after the task, the data,
    the image shape and the training steps, so every run on that data shares one feature space, and a
    classifier trained for another number of steps (another network) never answers for this one.
    """
    channels, height, width = images.shape[1:]
    path = Path(cache_dir).expanduser() / f"{kind}-{data_id}-{channels}x{height}x{width}-{steps}steps.pt"
    if not path.exists():  # a cached file is whole (write_verified), so reading it needs no lock
        path.parent.mkdir(parents=True, exist_ok=True)
        # Runs side by side that share the cache (a joblib sweep, a test suite's workers) train a classifier once:
        # the first trains it, the others wait for its file rather than train it again beside it.
        with waiting_for(FileLock(f"{path}.lock"), f"another process is training {path}: waiting for it"):
            if not path.exists():
                start = time.perf_counter()
                labels = None if labels is None else labels.to(images.device)
                net, accuracy, held_out = train_classifier(images, labels, steps)
                log.info(f"{kind} features for {data_id}: trained a CNN in {time.perf_counter() - start:.1f} s, "
                         f"test accuracy {accuracy:.1%} on {held_out} held-out examples; cached in {path}")
                write_verified(path, {"state_dict": net.state_dict(), "num_classes": net.head.out_features,
                                      "width": net.width, "accuracy": accuracy})
    saved = read_verified(path)
    with torch.random.fork_rng(devices=[]):  # the layers' initial draws, overwritten below, leave the run's alone
        net = ConvClassifier(channels, width, saved["num_classes"], saved["width"])
    try:
        net.load_state_dict(saved["state_dict"])
    except RuntimeError:  # written by an older version of ConvClassifier
        raise ConfigError(f"{path} holds a classifier of another architecture: delete it and its "
                          ".sha256 file to retrain") from None
    # The head is kept only where it predicts the dataset's classes: the rotation head predicts turns.
    head = net.head if kind == "classifier" else None
    return FeatureExtractor(kind, net.body, net.num_features, head).to(images.device)


@contextmanager
def waiting_for(lock: FileLock, why: str) -> Iterator[None]:
    """Hold ``lock``; where another process holds it, log ``why`` once and wait for it."""
    try:
        lock.acquire(blocking=False)
    except Timeout:
        log.info(why)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class PerChannel(nn.Module):
    """A network of 1-channel images run on each channel of an image on its own, its outputs side by side:
    (N, C, H, W) -> (N, C * F)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images.flatten(0, 1).unsqueeze(1)).unflatten(0, images.shape[:2]).flatten(1)


def per_channel_features(digits: FeatureExtractor, channels: int) -> FeatureExtractor:
    """The ``classifier`` space of StackedMNIST: the MNIST classifier's features of each channel (a digit the
    network was trained on), side by side. No class head: a stack's class is a triple of digits."""
    return FeatureExtractor(digits.name, PerChannel(digits.net), channels * digits.num_features)


def write_verified(path: Path, payload: dict[str, Any]) -> None:
    """Save ``payload`` and ``<path>.sha256``, each with :func:`atomic_write` (the checksum last: a crash
    between the two leaves a file that fails its check, never one that passes it half-written)."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    atomic_write(path, lambda f: f.write(data))
    checksum = f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode()
    atomic_write(Path(f"{path}.sha256"), lambda f: f.write(checksum))


def read_verified(path: Path) -> dict[str, Any]:
    """Load a file written by :func:`write_verified`, refusing it unless its checksum matches."""
    data = path.read_bytes()
    checksum = Path(f"{path}.sha256")
    expected = checksum.read_text().partition(" ")[0] if checksum.is_file() else None
    if hashlib.sha256(data).hexdigest() != expected:
        raise ConfigError(f"{path} does not match its checksum in {checksum.name} (corrupted or modified): "
                          "delete both files to retrain this feature classifier")
    return torch.load(io.BytesIO(data), weights_only=True)


# --- inception -----------------------------------------------------------------------------------

class InceptionInput(nn.Module):
    """[-1, 1] images, 1 or 3 channels -> the uint8 RGB batches both Inception files expect (grayscale
    replicated to 3 channels; each network resizes to 299x299 itself)."""

    def forward(self, images: Tensor) -> Tensor:
        pixels = to_uint8(images)
        return pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels


class PoolFeatures(nn.Module):
    """StyleGAN's TorchScript Inception called as its metrics call it: ``return_features=True`` gives the
    2,048 pool3 features where a plain call gives the class probabilities."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, pixels: Tensor) -> Tensor:
        return self.net(pixels, return_features=True)


def inception_features(weights: str | None = None, sha256: str | None = None) -> FeatureExtractor:
    """Inception-v3 pool3 features from a file already on disk, checked against its sha256; never downloads.

    ``weights``: StyleGAN's TorchScript ``inception-2015-12-05.pt`` or torch-fidelity's weights (told
    apart by :func:`is_torchscript`); ``None`` looks where torch.hub caches torch-fidelity's download.
    ``sha256``: the file's expected digest; ``None`` expects the published file of its kind. The one
    Inception module is built here and handed to FID and KID alike (KID's own constructor cannot take a
    weights path).
    """
    cached = Path(torch.hub.get_dir()) / "checkpoints" / TORCH_FIDELITY_URL.rsplit("/", 1)[1]
    path = Path(weights).expanduser() if weights else cached
    if not path.is_file():
        raise ConfigError(f"features=inception: no Inception weights at {path}: download {TORCH_FIDELITY_URL} "
                          f"to {cached}, or pass inception_weights=<file>, that file or StyleGAN's "
                          f"inception-2015-12-05.pt ({STYLEGAN_URL})")
    if path.suffix == ".pkl":  # StyleGAN3's download of the network: a pickle, which runs code when loaded
        raise ConfigError(f"features=inception: {path} is a pickle (StyleGAN3's inception-2015-12-05.pkl?), which "
                          f"is never loaded here: give StyleGAN2-ADA's TorchScript inception-2015-12-05.pt "
                          f"({STYLEGAN_URL})")
    if is_torchscript(path):
        network = torchscript_inception(path, sha256)
    else:
        network = torch_fidelity_inception(path, sha256)
    return FeatureExtractor("inception", nn.Sequential(InceptionInput(), network), 2048)


def is_torchscript(path: Path) -> bool:
    """Is ``path`` a TorchScript archive? torch.jit.save writes the module's code under ``<name>/code/``
    in its zip; torch.save's zips, and its older pickles, have no such folder."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())


def check_sha256(path: Path, expected: str, whose: str) -> None:
    """Refuse ``path`` unless its sha256 starts with ``expected`` (a full digest, or torch.hub's prefix):
    another file is another feature space, and its FIDs would compare with nothing measured before."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    actual = digest.hexdigest()
    if not actual.startswith(expected.lower()):
        raise ConfigError(f"features=inception: {path} has sha256 {actual}, not {expected} ({whose}): give the "
                          f"file that digest belongs to, or pass inception_sha256={actual} to measure with this one")


def torchscript_inception(path: Path, sha256: str | None) -> nn.Module:
    """StyleGAN's TorchScript Inception (or another file called as it is), verified, then loaded on the CPU."""
    check_sha256(path, sha256 or STYLEGAN_SHA256,
                 "inception_sha256" if sha256 else "StyleGAN's inception-2015-12-05.pt")
    with warnings.catch_warnings():  # "torch.jit.load is deprecated": StyleGAN's network exists only as TorchScript
        warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated.*", category=FutureWarning)
        net = torch.jit.load(str(path), map_location="cpu")
    arguments = [argument.name for argument in net.forward.schema.arguments[1:]]  # [0] is self
    if "return_features" not in arguments:
        raise ConfigError(f"features=inception: {path} is TorchScript, but its forward({', '.join(arguments)}) "
                          "takes no return_features: give StyleGAN's inception-2015-12-05.pt, or a network called "
                          "as it is (uint8 RGB images, return_features=True -> (N, 2048))")
    return PoolFeatures(net)


def torch_fidelity_inception(path: Path, sha256: str | None) -> nn.Module:
    """torch-fidelity's weights in torchmetrics' Inception-v3, verified first."""
    if importlib.util.find_spec("torch_fidelity") is None:  # torchmetrics' Inception is torch-fidelity's
        raise ConfigError("features=inception with torch-fidelity's weights needs torch-fidelity: pip install -e "
                          "'.[inception]' (StyleGAN's inception-2015-12-05.pt needs nothing more)")
    check_sha256(path, sha256 or TORCH_FIDELITY_SHA256_PREFIX,
                 "inception_sha256" if sha256 else "the prefix in torch-fidelity's file name")
    return NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"],
                              feature_extractor_weights_path=str(path))
