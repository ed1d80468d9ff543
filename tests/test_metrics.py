"""gan/evaluation/metrics.py and gan/evaluation/features.py on constructed inputs whose answers are known."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from conftest import eval_settings
from torch import nn
from torch.utils.data import TensorDataset

from gan.core.models import balanced_labels
from gan.data.datasets import StackedMNIST, build_dataset, mixture_means, stack_modes
from gan.errors import ConfigError
from gan.evaluation.features import (
    FeatureExtractor,
    classifier_features,
    inception_features,
    per_channel_features,
    read_verified,
    rotations,
)
from gan.evaluation.metrics import (
    MIN_CLASS_SAMPLES,
    ImageMetrics,
    MixtureMetrics,
    StackedMetrics,
    build_metrics,
    class_balance,
    frechet_distance,
    kl_from_uniform,
    knn_density_coverage,
    knn_precision_recall,
    mixture_metrics,
    quantize,
    real_images,
    scalars,
    stacked_modes,
)

RING, RING_STD = mixture_means("ring"), 0.01
GRID, GRID_STD = mixture_means("grid"), 0.05


@pytest.fixture(scope="session")
def feature_cache(tmp_path_factory):
    """One classifier cache for the session: test_evaluate.py names the same folder, so it trains once."""
    return tmp_path_factory.getbasetemp() / "feature_cache"


# --- 2D mixtures ---------------------------------------------------------------------------------

def test_samples_on_five_of_eight_ring_means():
    samples = RING[[0, 1, 2, 4, 6]].repeat(500, 1)  # 2,500 samples exactly on 5 means
    assert mixture_metrics(samples, RING, RING_STD) == {
        "modes": 5, "modes_total": 8, "high_quality": 1.0, "reverse_kl": pytest.approx(math.log(8 / 5)),
        "spread": 0.0, "spread_min": 0.0, "spread_max": 0.0}  # point masses: no spread at all


def test_uniform_over_all_modes_has_zero_reverse_kl():
    generator = torch.Generator().manual_seed(0)
    for means, std in ((RING, RING_STD), (GRID, GRID_STD)):
        samples = means.repeat(100, 1) + std * torch.randn(100 * len(means), 2, generator=generator)
        result = mixture_metrics(samples, means, std)
        assert result["modes"] == result["modes_total"] == len(means)
        assert result["reverse_kl"] == pytest.approx(0.0, abs=1e-12)  # every mode holds exactly 100
        assert result["high_quality"] > 0.97  # 3 std of a 2D Gaussian hold 98.9 %


def test_data_drawn_from_the_mixture_spreads_like_the_data():
    # r^2 / std^2 of a 2D Gaussian is exponential with mean 2; cut at the 3-std radius (r^2 <= 9 std^2)
    # its mean is 2 - 9 e^-4.5 / (1 - e^-4.5), so real data's spread is sqrt(that / 2) = 0.974, not 1.
    truncated = math.sqrt((2 - 9 * math.exp(-4.5) / (1 - math.exp(-4.5))) / 2)
    generator = torch.Generator().manual_seed(0)
    for means, std in ((RING, RING_STD), (GRID, GRID_STD)):
        samples = means.repeat(4000, 1) + std * torch.randn(4000 * len(means), 2, generator=generator)
        result = mixture_metrics(samples, means, std)
        assert result["spread"] == pytest.approx(truncated, abs=0.02)
        assert truncated - 0.04 < result["spread_min"] <= result["spread"] <= result["spread_max"] < truncated + 0.04


def test_spread_is_the_median_mode_of_the_rms_radius_over_the_datas():
    # Three modes, each of points at one radius from its mean: rms radius / (std sqrt 2) = radius / (std sqrt 2).
    radii = torch.tensor([0.5, 1.0, 2.0]) * RING_STD * math.sqrt(2)
    angles = torch.linspace(0, 2 * math.pi, 9)[:-1]
    circle = torch.stack([angles.cos(), angles.sin()], dim=1)
    samples = torch.cat([RING[k] + radius * circle for k, radius in enumerate(radii)])
    result = mixture_metrics(samples, RING, RING_STD)
    assert result["modes"] == 3 and result["high_quality"] == 1.0
    assert (result["spread"], result["spread_min"], result["spread_max"]) == pytest.approx((1.0, 0.5, 2.0), rel=1e-5)


def test_spread_of_an_even_number_of_modes_is_the_mean_of_the_middle_two():
    radii = torch.tensor([0.2, 0.4, 0.6, 1.0]) * RING_STD * math.sqrt(2)
    samples = torch.cat([RING[k] + torch.tensor([radius, 0.0]) for k, radius in enumerate(radii)]).view(-1, 2)
    assert mixture_metrics(samples, RING, RING_STD)["spread"] == pytest.approx(0.5, rel=1e-5)  # float32 points


def test_no_captured_mode_has_no_spread():
    result = mixture_metrics(torch.zeros(10, 2), RING, RING_STD)  # the ring's centre is 1 from every mean
    assert result["modes"] == 0 and result["spread"] is None  # nothing to measure: null in metrics.json
    assert "metrics/spread" not in scalars(result) and scalars(result)["metrics/modes"] == 0.0  # and not logged


def test_all_samples_in_one_mode_give_log_k():
    result = mixture_metrics(GRID[[7]].repeat(2500, 1), GRID, GRID_STD)
    assert result["modes"] == 1 and result["reverse_kl"] == pytest.approx(math.log(25))


def test_points_far_from_every_mean_are_not_high_quality():
    between = (RING + RING.roll(1, dims=0)) / 2  # midway between neighbouring ring means
    result = mixture_metrics(between.repeat(300, 1), RING, RING_STD)
    assert result["high_quality"] == 0.0 and result["modes"] == 0


def test_high_quality_threshold_is_three_std():
    inside, outside = GRID[0] + torch.tensor([2.9 * GRID_STD, 0.0]), GRID[0] + torch.tensor([0.0, 3.1 * GRID_STD])
    assert mixture_metrics(torch.stack([inside, outside]), GRID, GRID_STD)["high_quality"] == 0.5


# --- images: FID, KID, precision/recall on constructed features ----------------------------------

def flat_metrics() -> ImageMetrics:
    """ImageMetrics whose "images" are (N, 8, 1, 1) tensors and whose features are those 8 numbers."""
    return ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 8))


def test_fid_is_zero_against_itself_and_grows_with_a_shift():
    features = torch.randn(200, 8, 1, 1, generator=torch.Generator().manual_seed(0))
    metrics = flat_metrics()
    metrics.add_real(features)
    same = metrics.score(features)
    assert same["fid"] == pytest.approx(0.0, abs=1e-3)
    assert same["precision"] == same["recall"] == same["coverage"] == 1.0 and same["density"] >= 1.0
    fids = [metrics.score(features + shift)["fid"] for shift in (0.1, 0.5, 1.0)]
    assert fids[0] < fids[1] < fids[2]
    # Same covariance, means apart by `shift` in each of 8 dimensions: FID = 8 shift^2.
    assert fids[2] == pytest.approx(8.0, rel=1e-3)


def test_kid_is_near_zero_for_one_distribution_and_reproducible_per_seed():
    generator = torch.Generator().manual_seed(1)
    real, fake = torch.randn(2, 300, 8, 1, 1, generator=generator)  # two draws of one distribution
    metrics = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 8), kid_subset_size=100)
    metrics.add_real(real)
    same = [metrics.score(fake, seed=s) for s in (0, 0, 1)]
    assert abs(same[0]["kid"]) < 0.02 and same[0]["fid"] < 0.3
    assert same[0] == same[1] and same[0]["kid"] != same[2]["kid"]  # KID's random subsets follow the seed
    assert metrics.score(fake + 1.0)["kid"] > 1.0


def test_precision_and_recall_of_known_sets():
    generator = torch.Generator().manual_seed(0)
    real = torch.randn(500, 4, generator=generator)
    assert knn_precision_recall(real, real.clone()) == (1.0, 1.0)
    assert knn_precision_recall(real, real + 100.0) == (0.0, 0.0)
    # Fakes cover only the real points with a positive first coordinate: all realistic, half the data.
    half = real[real[:, 0] > 0]
    precision, recall = knn_precision_recall(real, half)
    assert precision == 1.0 and 0.4 < recall < 0.7


def test_density_and_coverage_of_a_point_set_worked_by_hand():
    """Reals 0, 1, 3, 7 on a line. k = 1: each real's ball reaches its nearest real neighbour -- radii
    1, 1, 2, 4, balls [-1, 1], [0, 2], [1, 5], [3, 11]. Fakes 0.5, 4, 20: 0.5 lies in the first two
    balls, 4 in the last two, 20 in none: density = (2 + 2 + 0) / (1 x 3) = 4/3; every ball holds a
    fake: coverage 1. Without the fake at 4, the balls of 3 and 7 hold none: coverage 2/4, density
    (2 + 0) / (1 x 2) = 1. k = 2: radii 3, 2, 3, 6 (second-nearest reals), balls [-3, 3], [-1, 3],
    [0, 6], [1, 13]; 0.5 lies in the first three, 4 in the last two: density (3 + 2 + 0) / (2 x 3) = 5/6."""
    real = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    fakes = torch.tensor([[0.5], [4.0], [20.0]])
    assert knn_density_coverage(real, fakes, k=1) == (pytest.approx(4 / 3), 1.0)
    assert knn_density_coverage(real, fakes[[0, 2]], k=1) == (pytest.approx(1.0), 0.5)
    assert knn_density_coverage(real, fakes, k=2) == (pytest.approx(5 / 6), 1.0)
    # Beside them, precision/recall of the same sets (k = 1): 20 is outside every real ball; the fakes'
    # balls (radii 3.5, 3.5, 16) hold every real.
    assert knn_precision_recall(real, fakes, k=1) == (pytest.approx(2 / 3), 1.0)
    # Chunking changes nothing: one fake row, one real row at a time.
    assert knn_density_coverage(real, fakes, k=1, chunk=1) == knn_density_coverage(real, fakes, k=1)


def test_density_is_about_one_for_one_distribution_and_counts_crowding():
    generator = torch.Generator().manual_seed(0)
    real, fake = torch.randn(2, 2000, 4, generator=generator)
    density, coverage = knn_density_coverage(real, fake)
    # Naeem et al.: for one distribution and as many fakes as reals, coverage is about 1 - (1/2)^k = 0.875 (k = 3).
    assert density == pytest.approx(1.0, abs=0.05) and coverage == pytest.approx(0.875, abs=0.02)
    # Every fake on one real point: that point's ball and its neighbours' hold them all (density well above
    # 1 where only ~k balls would), yet they cover almost nothing.
    crowded, covered = knn_density_coverage(real, real[:1].expand(500, -1))
    assert crowded > 1.0 and covered < 0.01


def test_density_and_coverage_match_the_prdc_package():
    prdc = pytest.importorskip("prdc")
    generator = torch.Generator().manual_seed(2)
    real = torch.randn(300, 6, generator=generator)
    fake = 0.8 * torch.randn(250, 6, generator=generator) + 0.3
    metrics = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 6))
    metrics.add_real(real[:, :, None, None])
    ours = metrics.score(fake[:, :, None, None])
    theirs = prdc.compute_prdc(real_features=real.double().numpy(), fake_features=fake.double().numpy(), nearest_k=3)
    for name in ("precision", "recall", "density", "coverage"):
        assert ours[name] == pytest.approx(float(theirs[name]), abs=1e-12), name


def test_saved_state_reloads_without_recomputing_real_features():
    generator = torch.Generator().manual_seed(0)
    real, fake = torch.randn(300, 8, 1, 1, generator=generator), torch.randn(200, 8, 1, 1, generator=generator) + 0.3
    real_labels, fake_labels = torch.arange(300) % 2, balanced_labels(200, 2)
    metrics = flat_metrics()
    metrics.add_real(real, real_labels)
    expected = metrics.score(fake, labels=fake_labels)
    assert "fid" in expected["per_class"]["1"]
    state = metrics.state_dict()
    assert {"fid.real_features_sum", "fid.real_features_cov_sum", "kid.real_features", "real_labels"} <= set(state)

    fresh = flat_metrics()
    seen: list[int] = []
    fresh.extractor.net.register_forward_hook(lambda module, inputs, output: seen.append(len(inputs[0])))
    fresh.load_state_dict(state)  # per-class FID needs the real labels: they reload too
    assert fresh.score(fake, labels=fake_labels) == expected
    assert sum(seen) == len(fake)  # one pass over the fakes, which FID and KID share; no real image was embedded


def test_frechet_distance_of_feature_sets_is_torchmetrics_fid():
    generator = torch.Generator().manual_seed(2)
    real, fake = torch.randn(300, 8, generator=generator), 0.5 * torch.randn(250, 8, generator=generator) + 0.2
    metrics = flat_metrics()
    metrics.add_real(real.view(300, 8, 1, 1))
    assert frechet_distance(real, fake) == pytest.approx(metrics.score(fake.view(250, 8, 1, 1))["fid"], rel=1e-5)
    assert frechet_distance(real, real) == pytest.approx(0.0, abs=1e-6)


def test_score_without_real_images_is_an_error():
    with pytest.raises(RuntimeError, match="add_real"):
        flat_metrics().score(torch.randn(10, 8, 1, 1))


# --- feature spaces ------------------------------------------------------------------------------

def digits(image_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    return real_images(build_dataset({"name": "digits", "image_size": image_size, "channels": 1}, 0), 10000)


def test_digits_classifier_reaches_95_percent_and_is_cached_with_checksum(feature_cache):
    images, labels = digits()
    extractor = classifier_features("classifier", "digits", images, labels, str(feature_cache))
    path = feature_cache / "classifier-digits-1x16x16-500steps.pt"
    accuracy = read_verified(path)["accuracy"]
    print(f"digits classifier test accuracy: {accuracy:.2%}")
    assert accuracy >= 0.95
    assert (feature_cache / "classifier-digits-1x16x16-500steps.pt.sha256").read_text().endswith(f"  {path.name}\n")
    assert not list(feature_cache.glob(".*"))  # written atomically: no temporary file left behind
    with torch.no_grad():
        features = extractor(images[:10])
    assert features.shape == (10, extractor.num_features) and extractor.name == "classifier"
    assert not features.requires_grad and features.grad_fn is None
    # Loaded again from the cache: the same feature space.
    again = classifier_features("classifier", "digits", images, labels, str(feature_cache))
    with torch.no_grad():
        assert torch.equal(again(images[:10]), features)


def test_corrupted_or_unverified_cache_is_refused(feature_cache, tmp_path):
    images, labels = digits()
    classifier_features("classifier", "digits", images, labels, str(feature_cache))  # trained or cached
    for name in ("classifier-digits-1x16x16-500steps.pt", "classifier-digits-1x16x16-500steps.pt.sha256"):
        shutil.copy(feature_cache / name, tmp_path / name)
    cached = tmp_path / "classifier-digits-1x16x16-500steps.pt"
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="does not match its checksum.*delete both files"):
        classifier_features("classifier", "digits", images, labels, str(tmp_path))
    (tmp_path / "classifier-digits-1x16x16-500steps.pt.sha256").unlink()
    with pytest.raises(ConfigError, match="checksum"):
        classifier_features("classifier", "digits", images, labels, str(tmp_path))


def test_unlabelled_images_default_to_rotation_features(tmp_path):
    images, _ = digits(image_size=8)
    unlabelled = TensorDataset(images, torch.full((len(images),), -1))
    data_cfg = {"name": "folder", "path": str(tmp_path)}
    settings = eval_settings("num_samples=50", f"cache_dir={tmp_path / 'cache'}", "classifier_steps=150")
    metrics = build_metrics(data_cfg, unlabelled, settings)
    assert metrics.extractor.name == "rotation"
    accuracy = read_verified(next((tmp_path / "cache").glob("rotation-folder-*-1x8x8-150steps.pt")))["accuracy"]
    print(f"digits rotation task test accuracy: {accuracy:.2%}")
    assert accuracy > 0.6  # chance is 25 %; a 0, 1 or 8 looks much the same upside down
    result = metrics.score(quantize(images[:50]))
    assert result["features"] == "rotation" and result["precision"] == 1.0
    with pytest.raises(ConfigError, match="features=classifier needs class labels"):
        build_metrics(data_cfg, unlabelled, eval_settings("features=classifier", f"cache_dir={tmp_path}"))


def test_rotations_are_labelled_by_quarter_turns():
    image = torch.arange(4.0).view(1, 1, 2, 2)
    rotated, labels = rotations(image)
    assert labels.tolist() == [0, 1, 2, 3]
    assert torch.equal(rotated[2], image[0].flip(1, 2))  # two quarter turns: upside down


def test_inception_offline_stops_with_where_to_put_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty torch.hub cache: nothing to find
    expected = tmp_path / "hub" / "checkpoints" / "weights-inception-2015-12-05-6726825d.pth"
    with pytest.raises(ConfigError) as error:
        inception_features()
    message = str(error.value)
    assert str(expected) in message and "https://github.com/toshas/torch-fidelity/releases" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="no Inception weights at /nonexistent/inception.pth"):
        inception_features("/nonexistent/inception.pth")
    assert not list(tmp_path.rglob("*"))  # nothing was downloaded


def test_feature_spaces_are_for_images_only():
    with pytest.raises(ConfigError, match="features=classifier is for images; data=ring"):
        build_metrics({"name": "ring", "std": RING_STD}, TensorDataset(RING), eval_settings("features=classifier"))


def test_settings_are_validated():
    with pytest.raises(ConfigError, match="features=vgg"):
        eval_settings("features=vgg")
    with pytest.raises(ConfigError, match=r"num_samples=1: it must be >= 4"):
        eval_settings("num_samples=1")


# --- class-conditional generators ----------------------------------------------------------------

def test_balanced_labels_give_every_class_an_equal_share():
    assert torch.bincount(balanced_labels(500, 10)).tolist() == [50] * 10
    assert torch.bincount(balanced_labels(2500, 8)).tolist() == [313] * 4 + [312] * 4  # up to one sample
    assert balanced_labels(5, 0).tolist() == [0] * 5  # unconditional: a placeholder the generator ignores


def test_ring_samples_on_their_conditioned_mean_are_recognised():
    metrics = MixtureMetrics(RING, RING_STD)
    labels = balanced_labels(2400, 8)
    right = metrics.score(RING[labels], labels=labels)
    assert right["class_accuracy"] == 1.0 and right["modes"] == 8
    assert right["per_class"] == {str(k): {"num_samples": 300, "accuracy": 1.0} for k in range(8)}
    # Perfect samples of the wrong mode: every mode is still captured, none is the one asked for.
    wrong = metrics.score(RING[(labels + 1) % 8], labels=labels)
    assert wrong["class_accuracy"] == 0.0 and wrong["modes"] == 8
    # Mode 0's samples all land on mode 4: only class 0 is wrong.
    mixed = metrics.score(RING[torch.where(labels == 0, 4, labels)], labels=labels)
    assert mixed["class_accuracy"] == 7 / 8 and mixed["per_class"]["0"]["accuracy"] == 0.0
    assert "class_accuracy" not in metrics.score(RING[labels])  # unconditional: the usual keys only


def one_hot_images(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """(N, 4, 1, 1) "images" near the one-hot vector of their label: a flat extractor's features."""
    noise = 0.1 * torch.randn(len(labels), 4, generator=torch.Generator().manual_seed(seed))
    return (torch.nn.functional.one_hot(labels, 4).float() + noise).view(-1, 4, 1, 1)


def test_generated_images_that_are_the_real_class_images_score_perfectly():
    # Features = the 4 numbers, and a class head reading the logits straight off them: an image is
    # recognised as the class of its largest coordinate. Class 3 has too few real images for a FID.
    real_labels = torch.tensor([0] * 60 + [1] * 60 + [2] * 60 + [3] * (MIN_CLASS_SAMPLES - 1))
    real = one_hot_images(real_labels, seed=0)
    metrics = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 4, head=nn.Identity()))
    metrics.add_real(real, real_labels)

    exact = metrics.score(real, labels=real_labels)  # the generator's output is exactly the real images
    assert exact["class_accuracy"] == 1.0
    assert list(exact["per_class"]) == ["0", "1", "2", "3"]
    for label in ("0", "1", "2"):
        entry = exact["per_class"][label]
        assert entry["accuracy"] == 1.0 and entry["num_samples"] == entry["num_real"] == 60
        assert entry["fid"] == pytest.approx(0.0, abs=1e-9)
    assert exact["per_class"]["3"] == {"num_samples": 49, "accuracy": 1.0, "num_real": 49}  # no fid

    # The same images, generated "for" the next class: never recognised, and far from that class.
    shifted = metrics.score(real, labels=(real_labels + 1) % 4)
    assert shifted["class_accuracy"] == 0.0
    assert all(e["accuracy"] == 0.0 for e in shifted["per_class"].values())
    assert shifted["per_class"]["1"]["fid"] > 1.0  # class 0's images against real 1s: means sqrt(2) apart


def test_class_balance_of_known_logits():
    # 4 classes, 100 images: 50 clear 0s, 25 clear 1s, 25 torn between 2 and 3 (both 0.5).
    clear = torch.tensor([10.0, 0.0, 0.0, 0.0])
    logits = torch.cat([clear.expand(50, 4), clear.roll(1).expand(25, 4), torch.tensor([[0.0, 0, 5, 5]]).expand(25, 4)])
    values = class_balance(logits)
    # The torn ones go to class 2 (argmax takes the first): shares 0.5, 0.25, 0.25, 0.
    assert values["class_kl"] == pytest.approx(0.5 * math.log(2) + 2 * 0.25 * math.log(1))
    assert values["confident"] == 0.75  # softmax of (10, 0, 0, 0) gives 0.9999; (0, 0, 5, 5) gives 0.5
    assert class_balance(torch.eye(4).repeat(5, 1) * 10)["class_kl"] == pytest.approx(0.0, abs=1e-12)


def test_unconditional_samples_get_class_balance_from_the_class_head():
    real_labels = balanced_labels(200, 4)
    metrics = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 4, head=nn.Identity()))
    metrics.add_real(one_hot_images(real_labels, seed=0), real_labels)
    one_class = metrics.score(one_hot_images(torch.zeros(200, dtype=torch.long), seed=1))
    assert one_class["class_kl"] == pytest.approx(math.log(4))
    balanced = metrics.score(one_hot_images(real_labels, seed=1))
    assert balanced["class_kl"] == pytest.approx(0.0, abs=1e-12)
    # Features 1 +- 0.1 on the class head's logits: softmax gives the class below 0.9 (e / (e + 3) = 0.48).
    assert balanced["confident"] == 0.0
    no_head = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 4))
    no_head.add_real(one_hot_images(real_labels, seed=0), real_labels)
    assert "class_kl" not in no_head.score(one_hot_images(real_labels, seed=1))


def test_a_feature_space_without_class_head_reports_per_class_fid_only():
    real_labels = balanced_labels(200, 2)
    real = one_hot_images(real_labels, seed=0)
    metrics = ImageMetrics(FeatureExtractor("flat", nn.Flatten(), 4))  # e.g. rotation, inception
    metrics.add_real(real, real_labels)
    values = metrics.score(one_hot_images(real_labels, seed=1), labels=real_labels)
    assert "class_accuracy" not in values
    assert set(values["per_class"]["0"]) == {"num_samples", "num_real", "fid"}
    assert values["per_class"]["0"]["fid"] < 0.01  # a second draw of the same class


def test_real_digits_scored_as_their_own_class(feature_cache):
    """The digits classifier's head recognises real digits, each class's real images against
    themselves give a per-class FID of 0: the head and the labels line up with the feature space."""
    dataset = build_dataset({"name": "digits", "image_size": 16, "channels": 1}, 0)
    metrics = build_metrics({"name": "digits"}, dataset, eval_settings(f"cache_dir={feature_cache}"))
    assert metrics.extractor.head is not None
    images, labels = real_images(dataset, 10000)
    values = metrics.score(images, labels=labels)
    print(f"digits classifier on all real digits: {values['class_accuracy']:.2%}")
    assert values["class_accuracy"] > 0.97  # 97.5 % on held-out digits; 80 % were its training set
    assert len(values["per_class"]) == 10
    assert all(e["fid"] == pytest.approx(0.0, abs=1e-3) for e in values["per_class"].values())


# --- StackedMNIST --------------------------------------------------------------------------------

def sure_of(digits: torch.Tensor) -> torch.Tensor:
    """The logits (N, 3, 10) of a classifier sure of each channel's digit in ``digits`` (N, 3)."""
    return 10.0 * nn.functional.one_hot(digits, 10).float()


def test_stacked_modes_of_hand_made_classifier_outputs():
    assert stack_modes(torch.tensor([7, 0, 4])) == 704  # red's digit first
    assert stacked_modes(sure_of(torch.tensor([[7, 0, 4]]).expand(260, 3))) == {
        "stacked_modes": 1, "stacked_kl": pytest.approx(math.log(1000))}
    every = torch.arange(1000)
    uniform = torch.stack([every // 100, every // 10 % 10, every % 10], dim=1).repeat(26, 1)  # each mode 26 times
    assert stacked_modes(sure_of(uniform)) == {"stacked_modes": 1000, "stacked_kl": pytest.approx(0.0, abs=1e-12)}
    halves = stacked_modes(sure_of(torch.tensor([[7, 0, 4], [4, 0, 7]]).repeat(50, 1)))
    assert halves == {"stacked_modes": 2, "stacked_kl": pytest.approx(math.log(500))}


LEVELS = torch.linspace(-0.9, 0.9, 10)  # test digit k: an image of the one value LEVELS[k]


class Brightness(nn.Module):
    """The features of a test digit classifier: an image's mean value. It takes 1-channel images only."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        assert images.shape[1] == 1, images.shape
        return images.mean(dim=(1, 2, 3)).unsqueeze(1)


class NearestLevel(nn.Module):
    """Its head: the highest logit for the level nearest the feature."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return -(features - LEVELS).square()


def test_stacked_metrics_recognise_each_channel_and_count_real_stacks_alike():
    labels = torch.arange(40) % 10
    digits = TensorDataset(LEVELS[labels].view(-1, 1, 1, 1).expand(-1, 1, 8, 8).clone(), labels)
    classifier = FeatureExtractor("classifier", Brightness(), 1, head=NearestLevel())
    metrics = StackedMetrics(per_channel_features(classifier, 3), classifier)
    metrics.add_real(*StackedMNIST(digits, 300, seed=0)[torch.arange(300)])
    floor = StackedMNIST(digits, 2000, seed=1)
    metrics.add_real_stacks(floor)
    # The classifier knows every test digit: real stacks score the modes of their own labels.
    real = {"stacked_modes_real": len(floor.labels.unique()), "stacked_kl_real": kl_from_uniform(floor.labels, 1000)}
    assert metrics.real_modes == pytest.approx(real) and 800 < real["stacked_modes_real"] < 1000
    generated = StackedMNIST(digits, 300, seed=2)
    values = metrics.score(generated[torch.arange(300)][0])
    assert values["stacked_modes"] == len(generated.labels.unique())
    assert values["stacked_kl"] == pytest.approx(kl_from_uniform(generated.labels, 1000))
    assert values["fid"] < 0.01 and values["features"] == "classifier" and values.items() >= real.items()
    collapsed = metrics.score(StackedMNIST(digits, 300, seed=2)[torch.zeros(300, dtype=torch.long)][0])
    assert (collapsed["stacked_modes"], collapsed["stacked_kl"]) == (1, pytest.approx(math.log(1000)))
