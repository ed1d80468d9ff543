"""Generators and discriminators: shapes for every supported size, conditioning, spectral norm."""

from __future__ import annotations

import math

import pytest
import torch

from gan.core.models import UNCONDITIONAL, Condition, build_models, condition_input, g_condition, latent_codes
from gan.errors import ConfigError

DCGAN = {"name": "dcgan", "width": 8, "d_batchnorm": True, "spectral_norm": False}
MLP = {"name": "mlp", "hidden": 16, "layers": 2, "spectral_norm": False}
RESNET = {"name": "resnet", "width": 4, "blocks": 1, "cardinality": 2, "expansion": 2, "spectral_norm": False}


@pytest.mark.parametrize("size", [8, 12, 16, 28, 32, 64])
@pytest.mark.parametrize("channels", [1, 3])
def test_dcgan_handles_sizes_8_to_64_and_1_or_3_channels(size, channels):
    g, d = build_models(DCGAN, z_dim=10, shape=(channels, size, size))
    x = g(torch.randn(4, 10))
    assert x.shape == (4, channels, size, size)
    assert x.min() >= -1 and x.max() <= 1  # tanh output, the data's range
    assert d(x).shape == (4,)


def test_mlp_for_points_and_images():
    g, d = build_models(MLP, z_dim=5, shape=(2,))
    points = g(torch.randn(7, 5))
    assert points.shape == (7, 2) and d(points).shape == (7,)
    g, d = build_models(MLP, z_dim=5, shape=(1, 8, 8))
    images = g(torch.randn(3, 5))
    assert images.shape == (3, 1, 8, 8) and d(images).shape == (3,)


@pytest.mark.parametrize("model,shape", [(DCGAN, (1, 16, 16)), (RESNET, (1, 16, 16)), (MLP, (2,))])
def test_conditional_models_take_labels_and_condition_maps(model, shape):
    g, d = build_models(model, z_dim=6, shape=shape, num_classes=10)
    labels = torch.tensor([0, 3, 9])
    fake = g(torch.randn(3, 6), labels)
    condition = condition_input(labels, 10, shape)
    assert condition.shape == (3, 10, *shape[1:])
    assert condition[1, 3].min() == 1 and condition[1].sum() == condition[1, 3].sum()
    assert d(torch.cat((condition, fake), dim=1)).shape == (3,)


@pytest.mark.parametrize("model,shape", [(DCGAN, (1, 16, 16)), (RESNET, (1, 16, 16)), (MLP, (2,))])
def test_a_classifying_d_sees_the_sample_alone_and_scores_it_and_its_class(model, shape):
    g, d = build_models(model | {"d_condition": "classifier"}, z_dim=6, shape=shape, num_classes=10)
    fake = g(torch.randn(3, 6), torch.tensor([0, 3, 9]))
    assert d(fake).shape == (3, 11)  # no condition channels in; the real/fake logit and 10 class logits out


@pytest.mark.parametrize("model,shape", [(DCGAN, (1, 16, 16)), (RESNET, (1, 16, 16)), (MLP, (2,))])
def test_a_latent_code_goes_into_g_and_d_names_it(model, shape):
    """``codes`` without labels: G takes the code one-hot beside its noise; D sees the sample alone and scores
    it and the code (the d_condition of a conditional D does not apply)."""
    g, d = build_models(model | {"conditional": False, "codes": 4}, z_dim=6, shape=shape, num_classes=4)
    z = torch.randn(3, 6)
    g.eval()  # BatchNorm's running statistics: each sample is then a function of its own inputs alone
    fake = g(z, torch.tensor([0, 1, 3]))
    assert fake.shape == (3, *shape) and d(fake).shape == (3, 5)
    other_codes = g(z, torch.tensor([2, 1, 0]))  # the same noise: only the first and last codes differ
    assert [torch.equal(a, b) for a, b in zip(fake, other_codes)] == [False, True, False]


def test_spectral_norm_keeps_its_power_iteration_vector_in_buffers():
    _, d = build_models(DCGAN | {"spectral_norm": True}, z_dim=4, shape=(1, 16, 16))
    buffers = dict(d.named_buffers())
    assert any(name.endswith("_u") for name in buffers)
    assert all(not name.endswith("_u") for name, _ in d.named_parameters())


def test_unsupported_combinations_are_config_errors():
    with pytest.raises(ConfigError, match="model=mlp"):
        build_models(DCGAN, z_dim=4, shape=(2,))
    with pytest.raises(ConfigError, match="image_size"):
        build_models(DCGAN, z_dim=4, shape=(1, 2, 2))
    with pytest.raises(ConfigError, match="unknown model"):
        build_models({"name": "stylegan"}, z_dim=4, shape=(2,))
    with pytest.raises(ConfigError, match="model=resnet needs image data"):
        build_models(RESNET, z_dim=4, shape=(2,))
    with pytest.raises(ConfigError, match="use model.codes=0 or model.conditional=false"):
        latent_codes(MLP | {"conditional": True, "codes": 8})
    assert latent_codes(MLP) == 0  # configs from before the key existed: no code


def test_g_condition_is_one_of_none_classes_or_a_code_and_its_labels_follow_what_g_learned():
    assert g_condition(MLP | {"conditional": False}, 10) == UNCONDITIONAL  # labelled data, G not told
    classes = g_condition(MLP | {"conditional": True}, 10)
    assert (classes.kind, classes.values, classes.classes) == ("classes", 10, 10)
    assert classes.labels(12).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]  # every class in turn
    code = g_condition(MLP | {"conditional": False, "codes": 4}, 10)
    assert (code.kind, code.values, code.classes) == ("code", 4, 0)  # a code names none of the data's classes
    drawn = code.labels(4000, torch.Generator().manual_seed(0))
    assert drawn.bincount().tolist() != [1000] * 4 and (drawn.bincount() - 1000).abs().max() < 100  # uniform draws
    assert torch.equal(drawn, code.labels(4000, torch.Generator().manual_seed(0)))  # seeded
    for condition in (UNCONDITIONAL, classes, code):  # as a checkpoint and generator.pt keep it
        assert Condition.from_dict(condition.as_dict()) == condition
    with pytest.raises(ConfigError, match="needs labelled data.*use model.conditional=false"):
        g_condition(MLP | {"conditional": True}, 0)


def test_fourier_features_of_d_are_a_fixed_buffer_of_the_configured_width_and_scale():
    torch.manual_seed(0)
    _, d = build_models(MLP | {"d_fourier": 256, "d_fourier_scale": 15.0}, z_dim=4, shape=(2,))
    features = dict(d.named_buffers())["net.1.frequencies"]
    assert features.shape == (2, 256) and not features.requires_grad
    assert "net.1.frequencies" in d.state_dict()  # saved with D, so a resume sees the same features
    # 2 pi times N(0, 15^2) entries: their rms is 2 pi 15 up to sampling (512 draws: within 10 %)
    assert abs(features.pow(2).mean().sqrt().item() / (2 * math.pi * 15) - 1) < 0.1
    x = torch.tensor([[0.3, -0.2]])
    phases = x @ features
    expected = torch.cat((x, phases.sin(), phases.cos()), dim=1)
    assert torch.allclose(d.net[1](x), expected)
    assert d.net[2].in_features == 2 + 2 * 256 and d(x).shape == (1,)
    _, plain = build_models(MLP, z_dim=4, shape=(2,))
    assert not list(plain.buffers()) and plain.net[1].in_features == 2
