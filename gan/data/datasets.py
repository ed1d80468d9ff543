"""The datasets that feed the GAN.

Every dataset is a map-style dataset of ``(x, label)`` with ``x`` in [-1, 1] (images) or in data
coordinates (2D mixtures); ``label`` is -1 where a dataset has none. Batches come from
gan/data/loader.py's ``StepBatchSampler``, whose batch for generator step ``s`` is a pure function of ``(seed, s)``:
a resumed run sees exactly the data an uninterrupted run would have seen.
"""

from __future__ import annotations

import gzip
import logging
import math
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from gan.errors import ConfigError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


# --- 2D mixtures (the benchmark protocol: docs/protocols.md) ---------------------------------------

# Datasets of 2D points rather than images: plotted as scatter plots, scored by the mode protocol.
POINT_DATASETS = ("ring", "grid")


def is_points(shape: tuple[int, ...]) -> bool:
    """Whether samples of ``shape`` (:func:`data_shape`) are 2D points rather than (C, H, W) images: the one
    test of points-or-images, made on the shape wherever one is at hand."""
    return len(shape) == 1


def mixture_means(name: str) -> torch.Tensor:
    """Means of the ring (8 on the unit circle) or grid (25 at even coordinates) mixture."""
    if name == "ring":
        # k/8 of a full turn for k = 0..7; linspace(0, 2*pi, 8) would repeat the first centre.
        angles = 2 * math.pi * torch.arange(8, dtype=torch.float64) / 8
        return torch.stack([angles.cos(), angles.sin()], dim=1).float()
    if name == "grid":
        axis = torch.tensor([-4.0, -2.0, 0.0, 2.0, 4.0])
        return torch.cartesian_prod(axis, axis)
    raise ConfigError(f"unknown mixture '{name}': use data=ring or data=grid")


def mixture_dataset(name: str, num_points: int, std: float, seed: int) -> TensorDataset:
    """``num_points`` samples, equally likely from each mode; the label is the mode index."""
    generator = torch.Generator().manual_seed(seed)
    means = mixture_means(name)
    labels = torch.randint(len(means), (num_points,), generator=generator)
    points = means[labels] + std * torch.randn(num_points, 2, generator=generator)
    return TensorDataset(points, labels)


# --- images --------------------------------------------------------------------------------------

def to_model_range(images: torch.Tensor, image_size: int) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float (N, C, S, S) in [-1, 1], resized bilinearly when S != H."""
    x = images.float() / 127.5 - 1.0
    if x.shape[-1] != image_size or x.shape[-2] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False,
                          antialias=True).clamp(-1, 1)
    return x


def digits_dataset(image_size: int) -> TensorDataset:
    from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

    digits = load_digits()
    images = torch.from_numpy(digits.images).float().unsqueeze(1)  # (1797, 1, 8, 8), values 0..16
    images = (images * (255.0 / 16.0)).round().to(torch.uint8)
    return TensorDataset(to_model_range(images, image_size), torch.from_numpy(digits.target).long())


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (MNIST's format), gzipped or not; a damaged file is a ConfigError naming it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # cut short, or bytes changed inside the stream
        raise ConfigError(f"{path} is a truncated or corrupt gzip file ({e}): re-download it") from None
    magic = int.from_bytes(data[0:4], "big")
    if len(data) < 4 or magic not in (2049, 2051):  # 2049: labels (N,), 2051: images (N, H, W), both uint8
        raise ConfigError(f"{path} is not an MNIST IDX file (magic {magic}): re-download it")
    ndim = magic & 0xFF
    offset = 4 + 4 * ndim
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    # The header says how many bytes follow; a file of any other length would be misread as other images.
    expected = offset + math.prod(shape) if len(data) >= offset else offset
    unzipped = " unzipped" if path.suffix == ".gz" else ""  # the sizes count the IDX bytes, not the .gz file's
    if len(data) < expected:
        raise ConfigError(f"{path} is truncated ({len(data)} bytes{unzipped}, {expected} expected): re-download it")
    if len(data) > expected:
        raise ConfigError(f"{path} is corrupt ({len(data)} bytes{unzipped}, {expected} expected from its header): "
                          "re-download it")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def find_idx(raw_dirs: list[Path], stem: str) -> Path | None:
    for directory in raw_dirs:
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    return None


def split_files(name: str, root: str, split: str) -> tuple[list[Path], list[Path | None]]:
    """Where MNIST-like data ``name`` may hold ``split``'s two files under ``root`` (torchvision's layout, or a bare
    ``raw/``), and each file found there (None: absent)."""
    root_path = Path(root).expanduser()
    raw_dirs = [root_path / {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}[name] / "raw", root_path / "raw"]
    prefix = {"train": "train", "test": "t10k"}[split]
    return raw_dirs, [find_idx(raw_dirs, f"{prefix}-{kind}-idx{dims}-ubyte") for kind, dims in (("images", 3),
                                                                                                  ("labels", 1))]


def mnist_like_dataset(name: str, root: str, split: str, download: bool, image_size: int) -> TensorDataset:
    """MNIST / Fashion-MNIST from torchvision's on-disk layout, needing only the requested split.

    torchvision's classes insist on all four files, unzipped; here the two files of ``split`` are
    enough, gzipped or not, under ``<root>/<Class>/raw/`` or ``<root>/raw/``. With
    ``data.download=true`` the real torchvision download fills in what is missing.
    """
    from torchvision import datasets

    tv_class = {"mnist": datasets.MNIST, "fashion_mnist": datasets.FashionMNIST}[name]
    root_path = Path(root).expanduser()
    raw_dirs, paths = split_files(name, root, split)
    if None in paths and download:
        tv_class(str(root_path), train=split == "train", download=True)
        raw_dirs, paths = split_files(name, root, split)
    if None in paths:
        raise ConfigError(
            f"{name} {split} files not found under {raw_dirs[0]} or {raw_dirs[1]}: "
            f"set data.root to the folder that holds them, or add data.download=true")
    images = torch.from_numpy(read_idx(paths[0]).copy()).unsqueeze(1)
    labels = torch.from_numpy(read_idx(paths[1]).astype(np.int64))
    return TensorDataset(to_model_range(images, image_size), labels)


# StackedMNIST (VEEGAN, PacGAN): three MNIST digits as the channels of one image, 10 x 10 x 10 modes.
STACKED_MODES = 1000


def stack_modes(digits: Tensor) -> Tensor:
    """(..., 3) digits of the three channels -> the mode 100 c0 + 10 c1 + c2 (a StackedMNIST label)."""
    return (digits * torch.tensor([100, 10, 1], device=digits.device)).sum(dim=-1)


class StackedMNIST(Dataset):
    """``num_stacks`` images of three MNIST digits drawn independently at random (from a generator seeded with
    ``seed``), one per channel; the label of a stack is its mode, :func:`stack_modes` of the digits' labels.

    Stacks are kept as index triples into ``digits`` and assembled when read: 24 bytes a stack instead of
    12 KiB of float32 pixels at 32x32. Indexing takes an int or a tensor of indices (a whole batch at once).
    """

    def __init__(self, digits: TensorDataset, num_stacks: int, seed: int):
        self.digits = digits  # MNIST's images (N, 1, S, S) in [-1, 1] and labels, as data=mnist reads them
        generator = torch.Generator().manual_seed(seed)
        self.triples = torch.randint(len(digits), (num_stacks, 3), generator=generator)
        self.labels = stack_modes(digits.tensors[1][self.triples])

    def __len__(self) -> int:
        return len(self.triples)

    def __getitem__(self, index: int | Tensor) -> tuple[Tensor, Tensor]:
        # (..., 3, 1, S, S) -> (..., 3, S, S): each digit's one channel becomes a channel of the stack
        return self.digits.tensors[0][self.triples[index]].squeeze(-3), self.labels[index]


CIFAR10_FOLDER = "cifar-10-batches-py"  # what torchvision's CIFAR10 looks for under its root


def cifar10_dataset(root: str, split: str, download: bool, image_size: int) -> TensorDataset:
    from torchvision import datasets

    root_path = Path(root).expanduser()
    try:
        ds = datasets.CIFAR10(str(root_path), train=split == "train", download=download)
    except RuntimeError:  # torchvision: "Dataset not found or corrupted..."
        raise ConfigError(f"cifar10 not found (or incomplete) in {root_path / CIFAR10_FOLDER}: set data.root to "
                          f"the folder that holds {CIFAR10_FOLDER}/, or add data.download=true") from None
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, 32, 32, 3) uint8 -> NCHW
    return TensorDataset(to_model_range(images, image_size), torch.tensor(ds.targets, dtype=torch.long))


# data.preload=auto decodes a folder into memory (then served like the tensor datasets, from the
# device) up to this size; past it, images are decoded per step by DataLoader workers.
PRELOAD_LIMIT = 2**30


class ImageFolderDataset(Dataset):
    """Images from a directory, flat or one subfolder per class; decoded lazily, square-cropped."""

    def __init__(self, path: str, image_size: int, channels: int):
        root = self.root = Path(path).expanduser()
        if not root.is_dir():
            raise ConfigError(f"data.path={path} is not a directory: point it at a folder of images")
        try:
            subfolders = sorted(p for p in root.iterdir() if p.is_dir())
            if subfolders:
                self.classes = [p.name for p in subfolders]
                self.files = [(f, i) for i, d in enumerate(subfolders) for f in sorted(d.iterdir())
                              if f.suffix.lower() in IMAGE_EXTENSIONS]
            else:
                self.classes = []
                self.files = [(f, -1) for f in sorted(root.iterdir()) if f.suffix.lower() in IMAGE_EXTENSIONS]
        except OSError as e:  # e.g. a folder without read permission
            raise ConfigError(f"cannot read data.path={path} ({e.strerror}: {e.filename}): "
                              "make it readable, or point data.path at another folder") from None
        if not self.files:
            raise ConfigError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in data.path={path}")
        self.image_size, self.mode = image_size, "L" if channels == 1 else "RGB"

    def __len__(self) -> int:
        return len(self.files)

    def decoded(self) -> TensorDataset:
        """Every image decoded once, as one tensor (labels -1 where the folder has no classes)."""
        start = time.perf_counter()
        images = torch.stack([self[i][0] for i in range(len(self))])
        log.info(f"decoded {len(self)} images of {self.root} into memory in {time.perf_counter() - start:.1f} s")
        return TensorDataset(images, torch.tensor([label for _, label in self.files], dtype=torch.long))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Image ``index``, whatever its size and mode: converted to ``data.channels`` (grayscale or RGB),
        centre-cropped to a square and resized to ``data.image_size``.

        A file that cannot be decoded (truncated, corrupt, unreadable) stops the run with its name,
        rather than being skipped: dropping it would change which image every later index is, and so
        the data of every step -- an exact resume needs the same dataset.
        """
        file, label = self.files[index]
        try:
            with Image.open(file) as img:
                img = img.convert(self.mode)
                side = min(img.size)  # centre square crop, then resize: no distortion
                left, top = (img.width - side) // 2, (img.height - side) // 2
                img = img.crop((left, top, left + side, top + side)).resize(
                    (self.image_size, self.image_size), Image.BICUBIC)
                array = np.asarray(img, dtype=np.uint8).reshape(self.image_size, self.image_size, -1)
        except OSError as e:  # PIL's errors for corrupt and truncated files are OSErrors too
            raise ConfigError(f"cannot decode image {file} ({e.strerror or e}): replace or delete it") from None
        x = torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 127.5 - 1.0
        return x, label


def build_dataset(cfg: dict[str, Any], seed: int, split: str | None = None) -> Dataset:
    """The dataset named by ``cfg['name']`` (the ``data`` config group)."""
    name = cfg["name"]
    split = split or cfg.get("split", "train")
    if name in POINT_DATASETS:
        if cfg.get("classes") is not None or cfg.get("limit") is not None:
            raise ConfigError(f"data.classes and data.limit choose images of labelled image data; data={name} draws "
                              "its 2D points from every mode: drop them (data.num_points sets how many points)")
        # The test split is a fresh draw from the same mixture.
        return mixture_dataset(name, cfg["num_points"], cfg["std"], seed + (split == "test"))
    if name in ("digits", "mnist", "fashion_mnist", "cifar10", "stacked_mnist"):
        if name == "digits":
            dataset = digits_dataset(cfg["image_size"])
        elif name == "cifar10":
            dataset = cifar10_dataset(cfg["root"], split, cfg["download"], cfg["image_size"])
        elif name == "stacked_mnist":  # the stacks are drawn from the run's seed: the same in training and evaluation
            digits = mnist_like_dataset("mnist", cfg["root"], split, cfg["download"], cfg["image_size"])
            dataset = StackedMNIST(digits, cfg["num_stacks"], seed)
        else:
            dataset = mnist_like_dataset(name, cfg["root"], split, cfg["download"], cfg["image_size"])
        # A stack holds one digit per channel; a folder's images are converted to data.channels instead.
        channels = 3 if name == "stacked_mnist" else dataset.tensors[0].shape[1]
        if channels != cfg["channels"]:
            raise ConfigError(f"data={name} has {channels}-channel images and data.channels={cfg['channels']}: "
                              f"set data.channels={channels}")
        return subset(dataset, cfg, seed) if name != "stacked_mnist" else dataset
    if name == "folder":
        folder = ImageFolderDataset(cfg["path"], cfg["image_size"], cfg["channels"])
        preload = cfg.get("preload", "auto")
        size = len(folder) * cfg["channels"] * cfg["image_size"] ** 2 * 4  # float32 bytes
        if preload is True or (preload == "auto" and size <= PRELOAD_LIMIT):
            return subset(folder.decoded(), cfg, seed)
        if cfg.get("classes") is not None or cfg.get("limit") is not None:
            raise ConfigError("data.classes and data.limit choose among images held in memory: add data.preload=true")
        return folder
    raise ConfigError(f"unknown dataset '{name}': use "
                      "data=digits|ring|grid|mnist|fashion_mnist|stacked_mnist|cifar10|folder")


def subset(dataset: TensorDataset, cfg: dict[str, Any], seed: int) -> TensorDataset:
    """The images of ``data.classes`` (null: all), then ``data.limit`` of them (null: all), drawn with ``seed``:
    a few-shot training set. Labels keep their values, so that a classifier of the whole dataset reads them."""
    images, labels = dataset.tensors
    keep = subset_indices(labels, cfg, seed)[0]
    return dataset if len(keep) == len(labels) else TensorDataset(images[keep], labels[keep])


def subset_indices(labels: Tensor, cfg: dict[str, Any], seed: int) -> tuple[Tensor, Tensor]:
    """The indices :func:`subset` keeps, and those of ``data.classes`` that ``data.limit`` leaves out."""
    classes, limit = cfg.get("classes"), cfg.get("limit")
    keep = torch.arange(len(labels))
    if classes is not None:
        present = set(labels.unique().tolist())
        absent = [c for c in classes if c not in present] if classes else [None]
        if absent:
            raise ConfigError(f"data.classes={list(classes)}: data={cfg['name']} has no class {absent[0]} "
                              f"(its classes: {sorted(present)}): choose among those, or null for all")
        keep = keep[torch.isin(labels, torch.tensor(list(classes)))]
    if limit is None:
        return keep, keep[:0]
    if not 1 <= limit <= len(keep):
        chosen = f" of data.classes={list(classes)}" if classes is not None else ""
        raise ConfigError(f"data.limit={limit}: data={cfg['name']} has {len(keep):,} images{chosen}: "
                          f"give 1 to {len(keep)}, or null for all")
    order = torch.randperm(len(keep), generator=torch.Generator().manual_seed(seed))
    return keep[order[:limit]].sort().values, keep[order[limit:]].sort().values


def held_out(cfg: dict[str, Any], seed: int) -> Dataset | None:
    """Real data of the run's distribution that it never trains on, for the health check of a memorising D
    (gan/training/health.py): a fresh draw of a 2D mixture; the images of ``data.classes`` that ``data.limit``
    left out; the other split of MNIST, Fashion-MNIST, StackedMNIST (stacks of its digits) or CIFAR-10, where its
    files are there (nothing is downloaded for it). None where every image trains and there is no other split."""
    name = cfg["name"]
    if name in POINT_DATASETS:
        return build_dataset(cfg, seed, split="test")
    if cfg.get("limit") is None:
        other = "test" if cfg.get("split", "train") == "train" else "train"
        if name in ("mnist", "fashion_mnist", "stacked_mnist"):
            present = None not in split_files("mnist" if name == "stacked_mnist" else name, cfg["root"], other)[1]
        else:
            present = name == "cifar10" and (Path(cfg["root"]).expanduser() / CIFAR10_FOLDER).is_dir()
        return build_dataset({**cfg, "download": False}, seed, split=other) if present else None
    whole = build_dataset({**cfg, "classes": None, "limit": None}, seed)
    if not isinstance(whole, TensorDataset):
        return None
    images, labels = whole.tensors
    rest = subset_indices(labels, cfg, seed)[1]
    return TensorDataset(images[rest], labels[rest]) if len(rest) else None


def population(cfg: dict[str, Any], seed: int) -> Dataset:
    """The images a run is measured against: those of ``data.classes``, without ``data.limit``. A few-shot run
    learns the distribution its few images were drawn from, and is scored against all of it."""
    return build_dataset({**cfg, "limit": None} if cfg.get("limit") is not None else cfg, seed)


def num_classes(dataset: Dataset) -> int:
    """Number of labels (0 for unlabelled data)."""
    if isinstance(dataset, ImageFolderDataset):
        return len(dataset.classes)
    if isinstance(dataset, StackedMNIST):  # every mode, whether or not a draw of few stacks holds it
        return STACKED_MODES
    return int(dataset.tensors[1].max()) + 1


def data_shape(cfg: dict[str, Any]) -> tuple[int, ...]:
    """Shape of one sample: (2,) for 2D mixtures, (C, S, S) for images. Where the data's name decides it."""
    if cfg["name"] in POINT_DATASETS:
        return (2,)
    return (cfg["channels"], cfg["image_size"], cfg["image_size"])


# --- sampling ------------------------------------------------------------------------------------





