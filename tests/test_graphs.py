"""The autograd graphs of gan/evaluation/graphs.py: their structure (which parameters each loss reaches, where the
detach cuts, what D's freeze leaves out), the pictures Graphviz draws, and the one every run logs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import read_events, run_train
from mutation import D_NOT_FROZEN, mutated_step
from PIL import Image

from gan.evaluation import graphs
from gan.patterns import graph as demo
from gan.patterns.claims import main as patterns_main
from gan.patterns.models import training_module
from gan.training.outputs import Samples

CPU = torch.device("cpu")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt-get install graphviz): no pictures")


def parameter_names(module: torch.nn.Module, owner: str) -> set[str]:
    return {f"{owner}.{name}" for name, _ in module.named_parameters()}


# The parameters of the GANModule the graphs are drawn from: G.net.1.weight, ...
MODULE = training_module(CPU)
G_PARAMETERS, D_PARAMETERS = parameter_names(MODULE.G, "G"), parameter_names(MODULE.D, "D")


@pytest.fixture(scope="module")
def step_graphs() -> dict[str, graphs.Graph]:
    return demo.step_graphs(CPU)


def test_the_d_loss_reaches_every_d_parameter_and_stops_at_the_detached_fake(step_graphs):
    d_loss = step_graphs["d_loss"]
    assert d_loss.parameters == D_PARAMETERS
    assert set(d_loss.absent) == G_PARAMETERS
    assert d_loss.operations("G") == []
    # G's output enters D as a constant: held by D's first convolution, with no edge into G's graph.
    assert d_loss.held("cut") == ["G's output, detached"]
    holders = [d_loss.nodes[a] for a, b, gradient in d_loss.edges if b == "G's output, detached"]
    assert [(n.name, n.owner) for n in holders] == [("ConvolutionBackward0", "D")]
    assert "real images" in d_loss.held()


def test_the_g_loss_passes_through_d_and_reaches_only_g_parameters(step_graphs):
    g_loss = step_graphs["g_loss"]
    assert g_loss.parameters == G_PARAMETERS
    assert set(g_loss.absent) == D_PARAMETERS
    # Backward runs through D's operations (to reach fake) without making D's weights leaves; the
    # frozen weights its convolutions and BatchNorm hold are marked, and nothing is cut.
    assert g_loss.operations("D").count("ConvolutionBackward0") == 3
    frozen = {g_loss.nodes[name].name for name in g_loss.held() if g_loss.nodes[name].detail == "frozen"}
    assert frozen and frozen <= D_PARAMETERS
    assert g_loss.held("cut") == []


def test_without_detach_the_d_loss_reaches_into_g(step_graphs):
    without = step_graphs["d_loss_without_detach"]
    assert without.parameters == D_PARAMETERS | G_PARAMETERS
    assert "TanhBackward0" in without.operations("G") and without.held("cut") == []


def test_with_d_not_frozen_the_g_loss_makes_d_weights_leaves(step_graphs):
    assert step_graphs["g_loss_d_not_frozen"].parameters == G_PARAMETERS | D_PARAMETERS


def test_sampling_builds_no_graph(step_graphs):
    sampling = step_graphs["sampling"]
    assert list(sampling.nodes) == ["tensor"] and sampling.edges == [] and sampling.parameters == set()
    assert "no graph" in graphs.text_tree(sampling)


def test_the_graphs_are_those_of_the_training_step():
    # Break gan/core/step.py's freeze: the G loss graph drawn from the step now makes D's weights leaves.
    with mutated_step(*D_NOT_FROZEN):
        broken = demo.step_graphs(CPU)
    assert broken["g_loss"].parameters == G_PARAMETERS | D_PARAMETERS


def test_the_text_tree_shows_the_leaves_and_the_frozen_weights(step_graphs):
    text = graphs.text_tree(step_graphs["g_loss"])
    assert text.splitlines()[0] == "G loss: the G update: through D(fake), with D frozen"
    assert all(f"{name} (" in text for name in G_PARAMETERS)
    assert "D.net.0.weight (frozen)  [held, no gradient]" in text
    assert text.splitlines()[-1].startswith("parameters reached: G 8/8, D 0/7; no leaf: D.net.0.weight")


@needs_dot
def test_graph_command_prints_the_trees_and_draws_svg_and_png(tmp_path: Path, capsys):
    assert patterns_main(["graph", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("parameters reached:") == 5 and "G's output, detached" in out
    for stem in ("autograd_step", "autograd_contrast"):
        assert (tmp_path / f"{stem}.svg").read_text().lstrip().startswith("<?xml")
        with Image.open(tmp_path / f"{stem}.png") as image:
            assert image.format == "PNG" and image.width > 800 and image.height > 600


def test_graph_command_without_dot_prints_the_trees_and_says_how_to_draw_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dot on it
    assert patterns_main(["graph", "--out", str(tmp_path / "pictures")]) == 0
    out = capsys.readouterr().out
    assert out.count("parameters reached:") == 5 and "apt-get install graphviz" in out
    assert not (tmp_path / "pictures").exists()


def test_graph_command_keeps_the_table_options_apart(capsys):
    assert patterns_main(["--only", "leaf", "graph"]) == 2
    assert "--only" in capsys.readouterr().err


@needs_dot
def test_every_run_logs_the_g_loss_graph_at_step_0(digits_run):
    images = read_events(digits_run / "tensorboard").Images(Samples.GRAPH_TAG)
    assert [e.step for e in images] == [0]
    assert min(images[0].height, images[0].width) > 500  # the chain of the loss, D and G: a drawn graph


def test_without_dot_a_run_logs_no_graph_and_says_so_in_the_debug_log(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dot on it
    run = tmp_path / "run"
    assert run_train(run, "hydra.verbose=gan.training.outputs") == 0  # its debug lines into train.log
    assert Samples.GRAPH_TAG not in read_events(run / "tensorboard").Tags()["images"]
    assert "[DEBUG] - no autograd graph in TensorBoard: Graphviz's dot is not installed" in (
        run / "train.log").read_text()


@needs_dot
def test_picture_is_an_rgb_image(step_graphs):
    image = graphs.picture([step_graphs["d_loss"], step_graphs["g_loss"]], "title")
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.shape[1] > image.shape[0] / 2  # two panels side by side


def test_the_resnet_step_s_losses_reach_the_same_networks_as_dcgan_s():
    """`python -m gan.patterns graph --model resnet`: the detach and the freeze do the same on R3GAN's networks."""
    module = training_module(CPU, model="resnet")
    g_parameters, d_parameters = parameter_names(module.G, "G"), parameter_names(module.D, "D")
    drawn = demo.step_graphs(CPU, model="resnet")
    assert drawn["d_loss"].parameters == d_parameters and drawn["d_loss"].held("cut") == ["G's output, detached"]
    assert drawn["g_loss"].parameters == g_parameters and set(drawn["g_loss"].absent) == d_parameters
    assert "ConvolutionBackward0" in drawn["g_loss"].operations("D")  # through D's blocks, none of them leaves
