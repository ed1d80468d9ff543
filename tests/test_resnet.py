"""model=resnet (R3GAN's residual G and D): the network's own properties, then the options a DCGAN trains with,
through the real training loop at tiny sizes: conditioning, latent codes, spectral norm, channels_last, bf16
autocast, the audit, exact resume, fine-tuning by residual block, the snapshot and its export. (Float16 autocast
needs a GPU, where benchmarks/cuda_checks.sh trains it; Fabric runs 16-mixed as bf16 on a CPU.)"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import compose_config, run_train
from test_bad_input import one_line
from test_resume import assert_identical

from gan import train as api_train
from gan.core import snapshot
from gan.core.freezing import blocks, freeze
from gan.core.models import ResNetGenerator, build_models
from gan.core.resnet import LowPass, ResidualBlock
from gan.training.loop import train

RESNET = {"name": "resnet", "width": 4, "blocks": 1, "cardinality": 2, "expansion": 2, "spectral_norm": False,
          "conditional": False}
TINY_RESNET = ["model=resnet", "model.width=4", "model.cardinality=2"]


def load(path):
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("size", [8, 12, 16, 28, 32, 64])
@pytest.mark.parametrize("channels", [1, 3])
def test_resnet_handles_sizes_8_to_64_and_1_or_3_channels(size, channels):
    g, d = build_models(RESNET, z_dim=10, shape=(channels, size, size))
    x = g(torch.randn(4, 10))
    assert x.shape == (4, channels, size, size) and d(x).shape == (4,)


def test_no_layer_normalizes_and_every_residual_block_starts_as_the_identity():
    g, d = build_models(RESNET | {"blocks": 2}, z_dim=10, shape=(1, 16, 16))
    for network in (g, d):
        names = {type(m).__name__ for m in network.modules()}
        assert not any("Norm" in name for name in names), names
        residual = [m for m in network.modules() if isinstance(m, ResidualBlock)]
        assert len(residual) == 2 * 3  # two a resolution: 4, 8 and 16 pixels
        for block in residual:
            x = torch.randn(2, block.expand.in_channels, 5, 5)
            assert torch.equal(block(x), x)


def test_the_blocks_scale_shrinks_as_the_fourth_root_of_the_network_s_depth():
    """R3GAN's fix-up initialisation: a block's first two layers scaled by L^(-1/4) for L blocks, so deeper networks
    start with smaller branches; 16 times the blocks, half the weights' spread."""
    torch.manual_seed(0)
    spread = {}
    for per_stage in (1, 16):
        g, _ = build_models(RESNET | {"width": 32, "blocks": per_stage}, z_dim=10, shape=(1, 8, 8))
        spread[per_stage] = torch.cat([m.grouped.weight.flatten() for m in g.modules()
                                       if isinstance(m, ResidualBlock)]).std().item()
    assert spread[16] / spread[1] == pytest.approx(16 ** -0.25, rel=0.05)


def test_low_pass_up_keeps_each_pixel_and_interpolates_between_and_down_averages_with_1_2_1_weights():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    up = LowPass(1, up=True)(x)
    assert up.shape == (1, 1, 8, 8)
    assert torch.equal(up[..., ::2, ::2], x)  # the original samples stay where they were
    assert torch.equal(up[..., :-1:2, 1:-1:2], (x[..., :-1] + x[..., 1:]) / 2)  # the means of their neighbours
    down = LowPass(1, up=False)(torch.ones(1, 1, 8, 8))
    assert down.shape == (1, 1, 4, 4)
    assert torch.equal(down[..., 1:, 1:], torch.ones(1, 1, 3, 3))  # a constant stays constant inside the border


def test_a_residual_block_is_one_block_to_freeze():
    _, d = build_models(RESNET, z_dim=10, shape=(1, 16, 16))
    grouped = blocks(d)
    assert list(grouped) == ["net.0", "net.1", "net.2", "net.3", "net.4", "net.5", "net.6"]
    assert grouped["net.1"] == ["net.1.expand.weight", "net.1.expand.bias", "net.1.grouped.weight",
                                "net.1.grouped.bias", "net.1.project.weight"]
    frozen = freeze(d, 2, "finetune.freeze_d")
    assert frozen == ["net.0.weight", "net.0.bias", *grouped["net.1"]]
    assert all(p.requires_grad == (name not in frozen) for name, p in d.named_parameters())


def test_spectral_norm_starts_the_blocks_last_layer_off_zero_and_scores_finitely():
    g, d = build_models(RESNET | {"spectral_norm": True}, z_dim=10, shape=(1, 16, 16))
    assert any(name.endswith("_u") for name, _ in d.named_buffers())
    assert torch.isfinite(d(g(torch.randn(3, 10)))).all()


def test_a_cardinality_that_does_not_split_the_channels_is_refused_in_one_line(tmp_path, capsys):
    assert run_train(tmp_path / "run", *TINY_RESNET, "model.cardinality=3", "model.expansion=2") == 2
    assert one_line(capsys) == ("error: model.cardinality=3 does not divide the 8 channels of model=resnet's "
                                "blocks at full resolution (model.width=4 x model.expansion=2): choose a "
                                "cardinality that divides 8")
    assert not (tmp_path / "run" / "checkpoints").exists()
    # The advice, followed: a cardinality that divides 8 trains.
    assert run_train(tmp_path / "run", *TINY_RESNET, "model.cardinality=8", "model.expansion=2",
                     "trainer.max_steps=1") == 0


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory):
    """6 steps of a class-conditional resnet whose D also names the class (AC-GAN), NHWC, audit on (debug=tiny),
    checkpoints at steps 3 and 6."""
    run_dir = tmp_path_factory.mktemp("resnet") / "run"
    assert run_train(run_dir, *TINY_RESNET, "model.conditional=true", "model.d_condition=classifier",
                     "data.channels_last=true") == 0
    return run_dir


def test_a_conditional_resnet_trains_in_nhwc_under_the_audit_and_resumes_exactly(resnet_run, tmp_path):
    state = load(resnet_run / "checkpoints" / "last.ckpt")["state_dict"]
    assert int(state["counters.g_updates"]) == 6
    assert state["D.net.6.linear.weight"].shape[0] == 1 + 10  # its real/fake logit and the ten classes
    assert state["G.net.0.linear.weight"].shape[1] == 64 + 10  # noise and the one-hot class
    middle = resnet_run / "checkpoints" / "step_000003.ckpt"
    assert run_train(tmp_path / "resumed", *TINY_RESNET, "model.conditional=true", "model.d_condition=classifier",
                     "data.channels_last=true", f"ckpt_path={middle}") == 0
    straight, resumed = load(resnet_run / "checkpoints" / "last.ckpt"), load(tmp_path / "resumed" / "checkpoints" /
                                                                             "last.ckpt")
    for key in ("state_dict", "optimizer_states", "rng"):
        assert_identical(straight[key], resumed[key], key)


def test_finetuning_freezes_whole_residual_blocks_and_names_them(resnet_run, tmp_path):
    run_dir = tmp_path / "tuned"
    assert run_train(run_dir, *TINY_RESNET, "model.conditional=true", "model.d_condition=classifier",
                     f"init_from={resnet_run}", "finetune.freeze_d=2", "finetune.freeze_g=1") == 0
    assert re.search(r"G blocks net\.0 frozen of \['net\.0', 'net\.1', .*\]; D blocks net\.0, net\.1 frozen of",
                     (run_dir / "train.log").read_text())
    source, tuned = (load(run / "checkpoints" / "last.ckpt")["state_dict"] for run in (resnet_run, run_dir))
    for name in ("G.net.0.basis", "G.net.0.linear.weight", "D.net.0.weight", "D.net.1.expand.weight",
                 "D.net.1.grouped.weight", "D.net.1.project.weight"):
        assert torch.equal(tuned[name], source[name]), name
    for name in ("G.net.1.expand.weight", "D.net.2.conv.weight", "D.net.3.grouped.weight"):
        assert not torch.equal(tuned[name], source[name]), name


@pytest.mark.parametrize("options", [
    ["model.codes=4", "model.spectral_norm=true", "trainer.precision=bf16-mixed", "reg=r1"],
    ["model.conditional=true", "reg=r1r2"],  # labels beside D's input
], ids=["code-sn-bf16", "input-condition"])
def test_codes_spectral_norm_and_autocast_train_with_the_double_backward(tmp_path, options):
    module = train(compose_config("debug=tiny", "trainer.enable_progress_bar=false", "trainer.max_steps=2",
                                  *TINY_RESNET, *options, run_dir=tmp_path)).module
    assert int(module.counters.g_updates) == 2
    assert all(torch.isfinite(p).all() for network in (module.G, module.D) for p in network.parameters())


def test_the_python_api_trains_a_resnet_and_its_snapshot_exports_to_torch(tmp_path):
    run = api_train(*TINY_RESNET, "trainer.max_steps=2", "trainer.enable_progress_bar=false", "debug=tiny",
                    f"hydra.run.dir={tmp_path / 'run'}")
    G = snapshot.load_generator(run.dir / "generator.pt")
    assert isinstance(G, ResNetGenerator) and not G.training
    assert snapshot.export(G, "torch", tmp_path / "g.pt2") <= snapshot.TOLERANCE
    inputs = snapshot.example_inputs(G, 5, seed=3)
    assert torch.allclose(torch.export.load(tmp_path / "g.pt2").module()(*inputs), G(*inputs), atol=1e-6)
