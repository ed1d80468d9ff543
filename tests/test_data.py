"""Datasets on real files in torchvision's on-disk formats, written by the tests (no download)."""

from __future__ import annotations

import gzip
import hashlib
import math
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MNIST_T10K
from PIL import Image
from torch.utils.data import TensorDataset

import gan.data.datasets
from gan.data.datasets import (
    ImageFolderDataset,
    StackedMNIST,
    build_dataset,
    data_shape,
    mixture_dataset,
    mixture_means,
    num_classes,
)
from gan.data.loader import StepBatchSampler
from gan.errors import ConfigError


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> None:
    """An IDX file as MNIST ships it: magic (0x0000, type 0x08 = uint8, ndim), sizes, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_mnist_split(raw: Path, prefix: str, n: int, gz: bool = True, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    suffix = ".gz" if gz else ""
    write_idx(raw / f"{prefix}-images-idx3-ubyte{suffix}", images, gz)
    write_idx(raw / f"{prefix}-labels-idx1-ubyte{suffix}", labels, gz)
    return images, labels


@pytest.fixture
def serve(tmp_path):
    """Serve a folder over HTTP on 127.0.0.1: the stand-in for the dataset hosts (no internet here)."""
    import functools
    import http.server
    import threading

    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
        handler.log_message = lambda *args: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def mnist_cfg(root: Path, split: str = "test", name: str = "mnist", download: bool = False) -> dict:
    return {"name": name, "root": str(root), "split": split, "download": download, "image_size": 28,
            "channels": 1}


def test_ring_and_grid_means_follow_the_protocol():
    ring = mixture_means("ring")
    assert ring.shape == (8, 2)
    assert torch.allclose(ring.norm(dim=1), torch.ones(8))
    assert torch.cdist(ring, ring).add(torch.eye(8)).min() > 0.7  # 8 distinct centres, 45 degrees apart
    assert torch.allclose(ring[2], torch.tensor([0.0, 1.0]), atol=1e-6)
    grid = mixture_means("grid")
    assert grid.shape == (25, 2)
    assert set(grid[:, 0].tolist()) == {-4.0, -2.0, 0.0, 2.0, 4.0}


@pytest.mark.parametrize("name,std", [("ring", 0.01), ("grid", 0.05)])
def test_mixture_samples_sit_on_their_modes(name, std):
    ds = mixture_dataset(name, 20000, std, seed=0)
    points, labels = ds.tensors
    offsets = points - mixture_means(name)[labels]
    assert offsets.std().item() == pytest.approx(std, rel=0.05)
    counts = torch.bincount(labels).float()
    assert counts.min() / counts.max() > 0.85  # modes equally likely
    assert data_shape({"name": name}) == (2,)


def test_digits_are_scaled_to_model_range():
    ds = build_dataset({"name": "digits", "image_size": 16, "channels": 1}, seed=0)
    images, labels = ds.tensors
    assert images.shape == (1797, 1, 16, 16)
    assert images.min() == -1.0 and images.max() == 1.0
    assert num_classes(ds) == 10


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_split_loads_from_its_own_two_files(tmp_path, gz):
    images, labels = make_mnist_split(tmp_path / "MNIST" / "raw", "t10k", 12, gz=gz)
    ds = build_dataset(mnist_cfg(tmp_path), seed=0)
    x, y = ds.tensors
    assert x.shape == (12, 1, 28, 28)
    assert torch.equal(y, torch.from_numpy(labels.astype(np.int64)))
    assert torch.allclose(x[3, 0], torch.from_numpy(images[3]).float() / 127.5 - 1)
    # The train split's files are absent: a clear error naming where they were looked for and what to set.
    expected = f"not found under {tmp_path}/MNIST/raw or {tmp_path}/raw: .*data.download=true"
    with pytest.raises(ConfigError, match=expected):
        build_dataset(mnist_cfg(tmp_path, split="train"), seed=0)
    # MNIST is grayscale: an RGB model for it is refused, naming the setting that fits.
    with pytest.raises(ConfigError, match="data=mnist has 1-channel images and data.channels=3: set data.channels=1"):
        build_dataset(mnist_cfg(tmp_path) | {"channels": 3}, seed=0)


def test_fashion_mnist_reads_its_own_folder_and_resizes(tmp_path):
    make_mnist_split(tmp_path / "FashionMNIST" / "raw", "train", 5)
    cfg = mnist_cfg(tmp_path, split="train", name="fashion_mnist") | {"image_size": 32}
    x, _ = build_dataset(cfg, seed=0).tensors
    assert x.shape == (5, 1, 32, 32) and x.min() >= -1 and x.max() <= 1


def test_mnist_download_path_is_torchvision_s(tmp_path, monkeypatch, serve):
    """data.download=true runs torchvision's real download code against a local HTTP mirror of
    files the test makes (the only stand-in: these machines have no internet)."""
    from torchvision import datasets

    mirror = tmp_path / "mirror"
    make_mnist_split(mirror, "t10k", 7)
    files = ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    resources = [(f, hashlib.md5((mirror / f).read_bytes()).hexdigest()) for f in files]
    monkeypatch.setattr(datasets.MNIST, "mirrors", [serve(mirror)])
    monkeypatch.setattr(datasets.MNIST, "resources", resources)
    root = tmp_path / "root"
    x, y = build_dataset(mnist_cfg(root, download=True), seed=0).tensors
    assert x.shape == (7, 1, 28, 28)
    assert (root / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").is_file()


@pytest.mark.skipif(not MNIST_T10K.is_dir(), reason="../shared/data/mnist_t10k is absent")
def test_real_mnist_test_split_from_shared_data():
    x, y = build_dataset(mnist_cfg(MNIST_T10K) | {"image_size": 32}, seed=0).tensors
    assert x.shape == (10000, 1, 32, 32)
    assert torch.bincount(y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def stacked_cfg(root: Path, **changes) -> dict:
    return {"name": "stacked_mnist", "root": str(root), "split": "test", "download": False, "image_size": 28,
            "channels": 3, "num_stacks": 500} | changes


def test_stacked_mnist_stacks_three_digits_labelled_by_their_mode(tmp_path):
    images, labels = make_mnist_split(tmp_path / "raw", "t10k", 30)  # <root>/raw/, as the shared copy has it
    ds = build_dataset(stacked_cfg(tmp_path), seed=0)
    assert isinstance(ds, StackedMNIST) and len(ds) == 500 and num_classes(ds) == 1000
    assert data_shape(stacked_cfg(tmp_path)) == (3, 28, 28)
    x, y = ds[7]
    assert x.shape == (3, 28, 28) and y.dtype == torch.long
    # Each channel is one of the split's digits, and the label is 100 c0 + 10 c1 + c2 of their labels.
    picked = ds.triples[7]
    for channel, index in enumerate(picked.tolist()):
        assert torch.equal(x[channel], torch.from_numpy(images[index]).float() / 127.5 - 1)
    c0, c1, c2 = (int(labels[i]) for i in picked)
    assert y == 100 * c0 + 10 * c1 + c2
    # A batch of indices at once: the same stacks a DataLoader assembles one by one.
    batch_x, batch_y = ds[torch.tensor([7, 3])]
    assert torch.equal(batch_x[0], x) and torch.equal(batch_y, torch.stack([ds[7][1], ds[3][1]]))
    # The stacks follow the seed: the same seed draws them again, another seed draws others.
    assert torch.equal(build_dataset(stacked_cfg(tmp_path), seed=0).triples, ds.triples)
    assert not torch.equal(build_dataset(stacked_cfg(tmp_path), seed=1).triples, ds.triples)
    with pytest.raises(ConfigError, match="data=stacked_mnist has 3-channel images and data.channels=1: set "
                                          "data.channels=3"):
        build_dataset(stacked_cfg(tmp_path, channels=1), seed=0)


@pytest.mark.skipif(not MNIST_T10K.is_dir(), reason="../shared/data/mnist_t10k is absent")
def test_real_stacked_mnist_holds_every_one_of_its_1000_modes():
    digits_x, digits_y = build_dataset(mnist_cfg(MNIST_T10K) | {"image_size": 32}, seed=0).tensors
    ds = build_dataset(stacked_cfg(MNIST_T10K, image_size=32, num_stacks=100_000), seed=0)
    assert len(ds.labels.unique()) == 1000  # about 100 stacks a mode
    x, y = ds[torch.arange(64)]
    assert x.shape == (64, 3, 32, 32)
    # Every channel is a real MNIST test digit, and its digit of the label is that image's label.
    for channel in range(3):
        assert torch.equal(x[:, channel], digits_x[ds.triples[:64, channel], 0])
    assert torch.equal(y, 100 * digits_y[ds.triples[:64, 0]] + 10 * digits_y[ds.triples[:64, 1]]
                       + digits_y[ds.triples[:64, 2]])


def write_cifar_batch(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
             "labels": (np.arange(n) % 10).tolist()}
    path.write_bytes(pickle.dumps(batch))


def test_cifar10_through_torchvision_download_and_integrity_checks(tmp_path, monkeypatch, serve):
    """A CIFAR-10 archive in torchvision's format, downloaded by torchvision from a local HTTP
    server (no internet here); torchvision's own md5 checks run against the test's files."""
    from torchvision import datasets

    src = tmp_path / "src" / "cifar-10-batches-py"
    src.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        write_cifar_batch(src / name, 4, seed=i)
    (src / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="cifar-10-batches-py")

    def md5(p: Path) -> str:
        return hashlib.md5(p.read_bytes()).hexdigest()

    monkeypatch.setattr(datasets.CIFAR10, "url", serve(tmp_path) + archive.name)
    monkeypatch.setattr(datasets.CIFAR10, "tgz_md5", md5(archive))
    monkeypatch.setattr(datasets.CIFAR10, "train_list", [[n, md5(src / n)] for n in names[:5]])
    monkeypatch.setattr(datasets.CIFAR10, "test_list", [["test_batch", md5(src / "test_batch")]])
    monkeypatch.setattr(datasets.CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                                   "md5": md5(src / "batches.meta")})
    cfg = {"name": "cifar10", "root": str(tmp_path / "root"), "split": "train", "download": True,
           "image_size": 32, "channels": 3}
    x, y = build_dataset(cfg, seed=0).tensors
    assert x.shape == (20, 3, 32, 32) and y.tolist()[:3] == [0, 1, 2]
    x_test, _ = build_dataset(cfg | {"split": "test", "download": False}, seed=0).tensors
    assert x_test.shape == (4, 3, 32, 32)
    with pytest.raises(ConfigError, match=f"in {tmp_path}/empty/cifar-10-batches-py: .*data.download=true"):
        build_dataset(cfg | {"root": str(tmp_path / "empty"), "download": False}, seed=0)


def write_png(path: Path, size: tuple[int, int], color) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_folder_flat_and_per_class(tmp_path):
    write_png(tmp_path / "flat" / "a.png", (40, 30), (255, 0, 0))
    write_png(tmp_path / "flat" / "b.jpg", (30, 40), (0, 0, 255))
    (tmp_path / "flat" / "notes.txt").write_text("not an image")
    flat = ImageFolderDataset(str(tmp_path / "flat"), image_size=8, channels=3)
    x, label = flat[0]
    assert len(flat) == 2 and x.shape == (3, 8, 8) and label == -1
    assert x[0].mean() > 0.9 and x[2].mean() < -0.9  # red stays red
    write_png(tmp_path / "classes" / "cat" / "1.png", (16, 16), (255, 255, 255))
    write_png(tmp_path / "classes" / "dog" / "1.png", (16, 16), (0, 0, 0))
    write_png(tmp_path / "classes" / "dog" / "2.png", (16, 16), (0, 0, 0))
    per_class = ImageFolderDataset(str(tmp_path / "classes"), image_size=16, channels=1)
    assert [per_class[i][1] for i in range(3)] == [0, 1, 1]
    assert per_class[0][0].shape == (1, 16, 16) and num_classes(per_class) == 2


def test_folder_preload_decodes_once_into_the_same_tensors(tmp_path, monkeypatch):
    for i, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        write_png(tmp_path / "classes" / f"c{i % 2}" / f"{i}.png", (20, 20), color)
    cfg = {"name": "folder", "path": str(tmp_path / "classes"), "image_size": 8, "channels": 3}
    lazy = build_dataset(cfg | {"preload": False}, seed=0)
    loaded = build_dataset(cfg | {"preload": "auto"}, seed=0)
    assert isinstance(lazy, ImageFolderDataset) and isinstance(loaded, TensorDataset)
    images, labels = loaded.tensors
    assert torch.equal(images, torch.stack([lazy[i][0] for i in range(3)]))
    assert labels.tolist() == [lazy[i][1] for i in range(3)] and num_classes(loaded) == num_classes(lazy) == 2
    monkeypatch.setattr(gan.data.datasets, "PRELOAD_LIMIT", images.nbytes - 1)  # auto: only what fits
    assert isinstance(build_dataset(cfg | {"preload": "auto"}, seed=0), ImageFolderDataset)
    assert isinstance(build_dataset(cfg | {"preload": True}, seed=0), TensorDataset)


def test_folder_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        ImageFolderDataset(str(tmp_path / "missing"), 8, 3)
    (tmp_path / "file.png").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a directory"):
        ImageFolderDataset(str(tmp_path / "file.png"), 8, 3)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no images"):
        ImageFolderDataset(str(tmp_path / "empty"), 8, 3)


def test_folder_images_of_any_size_and_mode_are_converted(tmp_path):
    """Sizes and channel counts differ from data.image_size / data.channels: each image is converted to
    the channels asked for, centre-cropped and resized."""
    for name, mode, size in [("rgba.png", "RGBA", (10, 30)), ("gray.png", "L", (64, 64)), ("palette.gif", "P", (7, 5)),
                             ("rgb.jpg", "RGB", (3, 3))]:
        Image.new(mode, size, 200).save(tmp_path / name)
    for channels in (1, 3):
        images, _ = build_dataset({"name": "folder", "path": str(tmp_path), "image_size": 8, "channels": channels,
                                   "preload": True}, seed=0).tensors
        assert images.shape == (4, channels, 8, 8)


def test_a_corrupt_image_stops_with_its_name(tmp_path):
    """Chosen: stop, naming the file (skipping it would change every later image's index, and so the data
    of every step, which exact resume relies on)."""
    write_png(tmp_path / "a.png", (16, 16), (255, 0, 0))
    good = (tmp_path / "a.png").read_bytes()
    cases = {"b.png": lambda p: p.write_bytes(good[: len(good) // 2]),  # truncated
             "c.png": lambda p: p.write_bytes(bytes(range(256)) * 4),  # not an image
             "d.png": lambda p: p.symlink_to(tmp_path / "gone.png")}  # unreadable: its target is gone
    cfg = {"name": "folder", "path": str(tmp_path), "image_size": 8, "channels": 3}
    for name, make in cases.items():
        make(tmp_path / name)
        message = rf"cannot decode image {re.escape(str(tmp_path / name))} \(.+\): replace or delete it"
        with pytest.raises(ConfigError, match=message):  # preloaded: when the dataset is built
            build_dataset(cfg | {"preload": True}, seed=0)
        lazy = build_dataset(cfg | {"preload": False}, seed=0)
        with pytest.raises(ConfigError, match=message):  # decoded per step: when the step reads it
            lazy[[file for file, _ in lazy.files].index(tmp_path / name)]
        (tmp_path / name).unlink()


def test_step_sampler_is_a_function_of_seed_and_step():
    uninterrupted = StepBatchSampler(50, 8, seed=3)
    resumed = StepBatchSampler(50, 8, seed=3, start_step=5)
    first = [b for _, b in zip(range(10), uninterrupted)]
    assert [b for _, b in zip(range(5), resumed)] == first[5:]
    # Epochs are permutations: the first 50 indices drawn cover the dataset exactly once.
    flat = [i for b in first for i in b]
    assert sorted(flat[:48]) == sorted(set(flat[:48])) and len(set(flat[:50])) == 50
    assert [b for _, b in zip(range(3), StepBatchSampler(50, 8, seed=4))] != first[:3]


def test_step_sampler_gives_each_rank_its_own_share():
    ranks = [StepBatchSampler(100, 10, seed=0, rank=r, world_size=2) for r in range(2)]
    for step in range(4):
        a, b = (s.indices_for_step(step) for s in ranks)
        assert not set(a) & set(b)
    # Together the ranks see what one process with the global batch would.
    single = StepBatchSampler(100, 20, seed=0)
    assert ranks[0].indices_for_step(1) + ranks[1].indices_for_step(1) == single.indices_for_step(1)
    assert math.isclose(len(single.indices_for_step(7)), 20)
