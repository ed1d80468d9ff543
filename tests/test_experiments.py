"""The image presets (configs/experiment/{mnist,fashion_mnist,cifar10}.yaml) compose, read their data and
build a GAN whose networks fit it; and evaluate.py scores a run in the feature space its preset chose."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_config
from omegaconf import OmegaConf
from test_data import make_mnist_split

from gan.data import build_dataset, data_shape
from gan.errors import ConfigError
from gan.evaluation import with_run_classifier_steps
from gan.module import GANModule


@pytest.mark.parametrize("name, folder, shape", [("mnist", "MNIST", (1, 32, 32)),
                                                 ("fashion_mnist", "FashionMNIST", (1, 32, 32)),
                                                 ("cifar10", None, (3, 32, 32))])
def test_image_presets_build_a_gan_for_their_data(tmp_path, name, folder, shape):
    cfg = compose_config(f"experiment={name}", f"data.root={tmp_path}", "data.split=test")
    assert cfg.data.name == name and cfg.trainer.max_steps > 0 and cfg.eval.classifier_steps > 500
    container = OmegaConf.to_container(cfg, resolve=True)
    if folder:  # the IDX files of a tiny split, in torchvision's layout (CIFAR-10's need real checksums)
        make_mnist_split(tmp_path / folder / "raw", "t10k", 8)
        images, _ = build_dataset(container["data"], cfg.seed).tensors
        assert images.shape == (8, *shape)
    module = GANModule(container, data_shape(container["data"]))
    with torch.no_grad():
        fake = module.G(torch.randn(4, cfg.train.z_dim))
        assert fake.shape == (4, *shape) and module.D(fake).shape[0] == 4


def test_evaluate_takes_the_runs_classifier_steps_unless_given():
    evaluate_cfg = OmegaConf.create({"classifier_steps": None})
    run_cfg = {"eval": {"classifier_steps": 2000}}
    assert with_run_classifier_steps(evaluate_cfg, run_cfg).classifier_steps == 2000
    assert with_run_classifier_steps(OmegaConf.create({"classifier_steps": 300}), run_cfg).classifier_steps == 300
    with pytest.raises(ConfigError, match="pass classifier_steps="):
        with_run_classifier_steps(evaluate_cfg, {"data": {}})


def test_classifiers_trained_for_different_steps_are_cached_apart(tmp_path):
    """A classifier trained longer is another network, so another feature space: never a cache hit."""
    from gan.features import classifier_features

    images, labels = torch.rand(40, 1, 8, 8) * 2 - 1, torch.arange(40) % 4
    for steps in (3, 5):
        classifier_features("classifier", "tiny", images, labels, str(tmp_path), steps)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["classifier-tiny-1x8x8-3steps.pt",
                                                             "classifier-tiny-1x8x8-5steps.pt"]
