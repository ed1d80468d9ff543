"""Fine-tuning: init_from= (another run's weights, everything else fresh), finetune.freeze_d/freeze_g (blocks frozen
once, out of the optimizers, never moving), data.classes/data.limit (a few-shot subset). Real training runs from
the shared digits run, real checkpoints read back, the entry point's real main() for bad input."""

from __future__ import annotations

import contextlib
import math
import re
import shutil

import pytest
import torch
from conftest import TINY, compose_config, run_train
from test_bad_input import one_line
from test_resume import FilesLoaded, assert_identical
from torch import nn
from torch.nn.utils.parametrizations import orthogonal, weight_norm

import gan.core.step
import gan.training.assemble
import gan.training.checks
from gan.core.audit import AuditError
from gan.core.freezing import block_names, blocks, freeze
from gan.core.models import DCGANDiscriminator
from gan.core.step import g_update
from gan.data.datasets import build_dataset, population
from gan.errors import ConfigError
from gan.evaluation.metrics import class_balance
from gan.run.load import load_module
from gan.training.loop import train
from gan.training.observer import Observer

FINETUNE = ["finetune.freeze_d=2", "finetune.freeze_g=[net.1]", "data.classes=[5,6,7,8,9]", "data.limit=100",
            "trainer.max_steps=6"]


@pytest.fixture(scope="module")
def finetuned(digits_run, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finetune") / "run"
    assert run_train(run_dir, f"init_from={digits_run}", *FINETUNE) == 0  # debug=tiny: audit on
    return run_dir


def load(path):
    return torch.load(path, weights_only=True)


def test_frozen_blocks_stay_bit_identical_and_out_of_the_optimizer_while_the_rest_moves(digits_run, finetuned):
    source = load(digits_run / "checkpoints" / "last.ckpt")["state_dict"]
    tuned = load(finetuned / "checkpoints" / "last.ckpt")
    state = tuned["state_dict"]
    # D's first two blocks (the 16x16 digits' D: net.0, then net.2 with its BatchNorm net.3) and G's first.
    frozen = ["D.net.0.weight", "D.net.0.bias", "D.net.2.weight", "D.net.3.weight", "D.net.3.bias",
              "G.net.1.weight", "G.net.2.weight", "G.net.2.bias"]
    for name in frozen:
        assert torch.equal(state[name], source[name]), name
    for name in ("D.net.5.weight", "G.net.4.weight", "G.net.7.weight"):
        assert not torch.equal(state[name], source[name]), name
    # The optimizers hold the trainable parameters alone, and keep state for those alone.
    trainable = {"G": 0, "D": 0}
    for name in state:
        network, _, rest = name.partition(".")
        if network in trainable and name not in frozen and not any(b in rest for b in ("running_", "num_batches")):
            trainable[network] += 1
    for optimizer, network in zip(tuned["optimizer_states"], "GD"):
        assert len(optimizer["param_groups"][0]["params"]) == trainable[network]
        assert len(optimizer["state"]) == trainable[network]
    # Fresh counters (6 steps of its own, not the source's 6 more), and the record of where it started.
    assert int(state["counters.g_updates"]) == 6
    record = tuned["hyper_parameters"]["init_from"]
    assert record == {"checkpoint": str((digits_run / "checkpoints" / "last.ckpt").resolve()), "step": 6}
    assert load(finetuned / "generator.pt")["init_from"] == record
    assert (finetuned / ".hydra" / "config.yaml").read_text().count(f"init_from: {digits_run}") == 1


def test_a_finetuning_run_resumes_exactly_and_refuses_another_init_from(digits_run, finetuned, tmp_path, capsys):
    middle = finetuned / "checkpoints" / "step_000003.ckpt"
    assert run_train(tmp_path / "resumed", f"init_from={digits_run}", *FINETUNE, f"ckpt_path={middle}") == 0
    straight, resumed = load(finetuned / "checkpoints" / "last.ckpt"), load(tmp_path / "resumed" / "checkpoints" /
                                                                             "last.ckpt")
    for key in ("state_dict", "optimizer_states", "rng"):
        assert_identical(straight[key], resumed[key], key)
    assert resumed["hyper_parameters"]["init_from"] == straight["hyper_parameters"]["init_from"]
    # Given both, the run resumes: init_from is its record, which a resume may not change, even on purpose.
    other = tmp_path / "other"
    shutil.copytree(digits_run, other)
    for allow in ([], ["resume.allow_changes=true"]):
        capsys.readouterr()
        assert run_train(tmp_path / "changed", f"init_from={other}", *FINETUNE, f"ckpt_path={middle}", *allow) == 2
        line = one_line(capsys)
        assert f"init_from={digits_run} there, {other} here" in line
        assert line.endswith(f"not even with resume.allow_changes=true: resume with init_from={digits_run}")
        assert not (tmp_path / "changed").exists()


def test_a_finetuning_run_resumes_after_the_run_it_started_from_is_gone(digits_run, tmp_path):
    source, run = tmp_path / "source", tmp_path / "run"
    shutil.copytree(digits_run, source)
    assert run_train(run, f"init_from={source}", *FINETUNE) == 0
    shutil.rmtree(source)
    middle = run / "checkpoints" / "step_000003.ckpt"
    assert run_train(tmp_path / "resumed", f"init_from={source}", *FINETUNE, f"ckpt_path={middle}") == 0
    # It continued as the uninterrupted run did, and kept its record of the source.
    straight = load(run / "checkpoints" / "last.ckpt")
    resumed = load(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for key in ("state_dict", "optimizer_states", "rng"):
        assert_identical(straight[key], resumed[key], key)
    assert resumed["hyper_parameters"]["init_from"]["checkpoint"] == str(source / "checkpoints" / "last.ckpt")


def test_a_resume_that_freezes_other_blocks_is_refused_even_on_purpose_and_the_advice_starts_a_new_run(
        digits_run, finetuned, tmp_path, capsys):
    middle = finetuned / "checkpoints" / "step_000003.ckpt"
    changed = [o.replace("freeze_d=2", "freeze_d=1") for o in FINETUNE]
    capsys.readouterr()
    assert run_train(tmp_path / "resumed", f"init_from={digits_run}", *changed, f"ckpt_path={middle}",
                     "resume.allow_changes=true") == 2
    line = one_line(capsys)
    assert "finetune.freeze_d=2 there, 1 here: the checkpoint's optimizers hold the parameters that trained" in line
    assert "not even with resume.allow_changes=true: resume with finetune.freeze_d=2" in line
    assert not (tmp_path / "resumed").exists()
    # Followed: the same overrides, init_from=<the checkpoint> in place of ckpt_path and of init_from, a new run.
    start = re.search(r"the same overrides with (init_from=\S+) in place of ckpt_path \(and of any init_from\), in a "
                      r"new hydra.run.dir", line).group(1)
    assert run_train(tmp_path / "new", start, *changed) == 0
    source, tuned = load(middle)["state_dict"], load(tmp_path / "new" / "checkpoints" / "last.ckpt")
    assert tuned["hyper_parameters"]["init_from"] == {"checkpoint": str(middle.resolve()), "step": 3}
    assert torch.equal(tuned["state_dict"]["D.net.0.weight"], source["D.net.0.weight"])
    assert not torch.equal(tuned["state_dict"]["D.net.2.weight"], source["D.net.2.weight"])  # frozen no longer


def test_a_spectrally_normed_block_freezes_with_the_weight_its_optimizer_steps(tmp_path, capsys):
    source, tuned = tmp_path / "source", tmp_path / "tuned"
    assert run_train(source, "model.spectral_norm=true") == 0
    assert run_train(tuned, f"init_from={source}", "model.spectral_norm=true", "finetune.freeze_d=1") == 0  # audited
    before, after = load(source / "checkpoints" / "last.ckpt")["state_dict"], load(tuned / "checkpoints" / "last.ckpt")
    D = load_module(tuned / "checkpoints" / "last.ckpt").D
    # Block net.0 holds the tensor spectral norm computes its weight from, which its optimizer steps.
    frozen = [f"D.{name}" for name in blocks(D)["net.0"]]
    assert frozen == ["D.net.0.bias", "D.net.0.parametrizations.weight.original"]
    for name in frozen:
        assert torch.equal(after["state_dict"][name], before[name]), name
    for name in ("D.net.2.parametrizations.weight.original", "D.net.3.weight",
                 "D.net.5.parametrizations.weight.original"):
        assert not torch.equal(after["state_dict"][name], before[name]), name
    trainable = len(list(D.parameters())) - len(frozen)
    assert len(after["optimizer_states"][1]["state"]) == trainable == 5
    # Counted by their layers: this D has 3 blocks, not one per parametrization.
    capsys.readouterr()
    assert run_train(tmp_path / "all", f"init_from={source}", "model.spectral_norm=true", "finetune.freeze_d=3") == 2
    assert "finetune.freeze_d=3: this network has 3 blocks (['net.0', 'net.2', 'net.5'])" in one_line(capsys)


def test_every_parametrization_freezes_with_its_layer_and_tied_blocks_freeze_together_or_not_at_all():
    net = nn.Sequential(weight_norm(nn.Linear(4, 4)), nn.ReLU(), orthogonal(nn.Linear(4, 4)), nn.Linear(4, 1))
    assert blocks(net) == {
        "0": ["0.bias", "0.parametrizations.weight.original0", "0.parametrizations.weight.original1"],
        "2": ["2.bias", "2.parametrizations.weight.original"], "3": ["3.weight", "3.bias"]}
    frozen = freeze(net, 2, "finetune.freeze_d")
    assert [name for name, p in net.named_parameters() if not p.requires_grad] == frozen == [*blocks(net)["0"],
                                                                                            *blocks(net)["2"]]
    tied = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Linear(4, 1))
    tied[2].weight = tied[0].weight
    with pytest.raises(ConfigError, match=r"^finetune.freeze_d: 2.weight, of block 2, is the frozen 0.weight \(tied "
                                          r"weights: one tensor\), so block 2 could not train in full: freeze both "
                                          r"blocks or neither$"):
        freeze(tied, 1, "finetune.freeze_d")
    assert all(p.requires_grad for p in tied.parameters())  # refused before anything was frozen
    assert freeze(tied, ["0", "2"], "finetune.freeze_d") == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [name for name, p in tied.named_parameters() if p.requires_grad] == ["3.weight", "3.bias"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["data.image_size=32"], "layer G.net.1.weight is [64, 16, 4, 4] there and [64, 32, 4, 4] here"),
    (["model.width=16"], "layer G.net.1.weight is [64, 16, 4, 4] there and [64, 32, 4, 4] here"),
    (["finetune.freeze_d=3"], "finetune.freeze_d=3: this network has 3 blocks (['net.0', 'net.2', 'net.5']); "
                              "freeze 0 to 2 of them"),
    (["finetune.freeze_g=[net.9]"], "finetune.freeze_g: no block named net.9; this network's blocks are "
                                    "['net.1', 'net.4', 'net.7']"),
    (["data.classes=[4,11]"], "data.classes=[4, 11]: data=digits has no class 11"),
    (["data.limit=2000"], "data.limit=2000: data=digits has 1,797 images: give 1 to 1797"),
])
def test_what_cannot_be_finetuned_is_refused_in_one_line_before_anything_is_written(
        digits_run, tmp_path, capsys, overrides, expected):
    capsys.readouterr()
    assert run_train(tmp_path / "run", f"init_from={digits_run}", *overrides) == 2
    assert expected in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_the_refusal_of_a_missing_init_from_names_what_to_give(tmp_path, capsys):
    capsys.readouterr()
    assert run_train(tmp_path / "run", f"init_from={tmp_path / 'nowhere'}") == 2
    assert "give a train.py run directory or one of its checkpoints/*.ckpt" in one_line(capsys)


class MovesAFrozenWeight(Observer):
    """Changes a frozen D weight before the second step, as an optimizer that held it would: what the audit must
    catch."""

    def on_step_start(self, run, batch):
        if run.module.counters.g == 1:
            with torch.no_grad():
                run.module.D.net[0].weight.mul_(1.5)


def test_the_audit_catches_a_frozen_weight_that_moved(digits_run, tmp_path):
    cfg = compose_config(*TINY, f"init_from={digits_run}", "finetune.freeze_d=1", run_dir=tmp_path / "run")
    with pytest.raises(AuditError, match=r"^the D update moved frozen D.net.0.weight"):
        train(cfg, probes=[MovesAFrozenWeight()])


def test_the_audit_catches_a_g_update_that_unfreezes_all_of_d(digits_run, tmp_path, monkeypatch):
    """Planted: the classic freeze that sets every flag back to True, which unfreezes a fine-tuning run's D."""

    @contextlib.contextmanager
    def frozen_then_all_true(*modules):
        for m in modules:
            m.requires_grad_(False)
        yield
        for m in modules:
            m.requires_grad_(True)

    monkeypatch.setattr(gan.core.step, "frozen", frozen_then_all_true)
    cfg = compose_config(*TINY, f"init_from={digits_run}", "finetune.freeze_d=1", run_dir=tmp_path / "run")
    with pytest.raises(AuditError, match=r"^D.net.0.weight.requires_grad is True after the G update, False before"):
        train(cfg)


def test_blocks_group_each_layer_with_its_batchnorm_in_the_order_they_run():
    D = DCGANDiscriminator(1, 32, 8)  # 32x32: three strided convolutions, then the scoring one
    assert block_names(D) == ["net.0", "net.2", "net.5", "net.8"]
    assert blocks(D)["net.2"] == ["net.2.weight", "net.3.weight", "net.3.bias"]  # conv (no bias) and its BatchNorm
    assert freeze(D, ["net.5", "net.0"], "k") == ["net.0.weight", "net.0.bias", "net.5.weight", "net.6.weight",
                                                 "net.6.bias"]
    assert [n for n, p in D.named_parameters() if p.requires_grad] == ["net.2.weight", "net.3.weight", "net.3.bias",
                                                                        "net.8.weight", "net.8.bias"]
    with pytest.raises(ConfigError, match="names every block"):
        freeze(DCGANDiscriminator(1, 32, 8), ["net.0", "net.2", "net.5", "net.8"], "finetune.freeze_d")
    with pytest.raises(ConfigError, match="finetune.freeze_d=True: give how many"):
        freeze(D, True, "finetune.freeze_d")


def test_g_update_with_a_partly_frozen_d_gives_back_each_flag_as_it_was():
    torch.manual_seed(0)
    D = DCGANDiscriminator(1, 16, 4)
    freeze(D, 1, "finetune.freeze_d")
    flags = [p.requires_grad for p in D.parameters()]
    assert flags.count(False) == 2 and flags.count(True) > 0
    G = nn.Linear(8, 256)
    fake = G(torch.randn(4, 8)).view(4, 1, 16, 16)
    opt_g = torch.optim.SGD(G.parameters(), lr=0.1)
    g_update(D, opt_g, lambda D, fake, real, labels: D(fake).mean(), fake, fake.detach(), None)
    assert [p.requires_grad for p in D.parameters()] == flags
    assert all(p.grad is None for p in D.parameters()) and G.weight.grad is not None


def test_a_subset_holds_the_chosen_classes_and_a_seeded_draw_of_them():
    cfg = {**compose_config().data, "classes": [3, 5], "limit": 50}
    a, b, other = (build_dataset(cfg, seed) for seed in (0, 0, 1))
    assert len(a) == 50 and set(a.tensors[1].tolist()) <= {3, 5} and len(set(a.tensors[1].tolist())) == 2
    assert torch.equal(a.tensors[0], b.tensors[0]) and not torch.equal(a.tensors[0], other.tensors[0])
    every = build_dataset({**cfg, "classes": None, "limit": None}, 0)
    wanted = int(((every.tensors[1] == 3) | (every.tensors[1] == 5)).sum())
    assert len(population(cfg, 0)) == wanted  # measured against all of those classes' images
    assert any(torch.equal(a.tensors[0][0], image) for image in every.tensors[0])  # real images, unchanged


def test_class_balance_over_a_runs_classes():
    # 12 images of a 4-class classifier, for a run of classes [2, 3]: ten sure 2s, one sure 3, one unsure 0.
    logits = torch.full((12, 4), -10.0)
    logits[:10, 2] = logits[10, 3] = 10.0
    logits[11] = torch.tensor([0.1, 0.0, 0.0, 0.0])
    values = class_balance(logits, [2, 3])
    assert values["confident"] == pytest.approx(11 / 12)
    assert values["class_kl"] == pytest.approx(10 / 11 * math.log(2 * 10 / 11) + 1 / 11 * math.log(2 / 11))
    assert values["classes_present"] == 1  # class 3's one image in twelve is under a quarter of its half (1.5)
    assert class_balance(logits)["class_kl"] == pytest.approx(
        10 / 12 * math.log(4 * 10 / 12) + 2 * (1 / 12 * math.log(4 / 12)))  # over all four classes as before


def test_the_python_api_refuses_before_writing_too(digits_run, tmp_path):
    import gan

    with pytest.raises(ConfigError, match=r"layer G.net.1.weight is \[64, 16, 4, 4\] there"):
        gan.train(*TINY, f"init_from={digits_run}", "data.image_size=32", run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_source_whose_fourier_features_have_another_scale_is_refused_in_one_line(ring_run, tmp_path, capsys):
    """D's Fourier features come with D's weights, which learned on them: the scale must be the source's."""
    ring = ["experiment=ring", "loss=hinge", "trainer.max_steps=2"]
    capsys.readouterr()
    assert run_train(tmp_path / "other", f"init_from={ring_run}", *ring, "model.d_fourier_scale=5") == 2
    assert one_line(capsys).endswith(f"init_from={ring_run / 'checkpoints' / 'last.ckpt'}: D's Fourier features were "
                                     "drawn at model.d_fourier_scale=15.0 there and 5.0 here, and D's weights learned "
                                     "on them: fine-tune with model.d_fourier_scale=15.0")
    assert not (tmp_path / "other").exists()
    assert run_train(tmp_path / "same", f"init_from={ring_run}", *ring) == 0
    assert torch.equal(load(tmp_path / "same" / "checkpoints" / "last.ckpt")["state_dict"]["D.net.1.frequencies"],
                       load(ring_run / "checkpoints" / "last.ckpt")["state_dict"]["D.net.1.frequencies"])


@pytest.mark.parametrize("resuming", [False, True], ids=["new", "resumed"])
def test_a_finetuning_run_builds_its_data_and_networks_once_and_reads_each_checkpoint_once(digits_run, finetuned,
                                                                                           tmp_path, monkeypatch,
                                                                                           resuming):
    """train.py checks init_from, the frozen blocks and the subset on the data and networks it builds before anything
    is written, and keeps nothing; the loop's checks build them again as the run starts, and it trains those (their
    bit-identity with a build of the loop's own: tools/training_fingerprints.py's finetune case). A resume of such a
    run puts its checkpoint's state into those same networks, and never reads init_from's run (its checkpoint holds
    the weights)."""
    built = {"data": 0, "networks": 0}

    def counting(original, kind):
        def counted(*args, **kwargs):
            built[kind] += 1
            return original(*args, **kwargs)
        return counted

    for module, name, kind in ((gan.training.checks, "build_module", "networks"),
                               (gan.training.assemble, "build_module", "networks"),
                               (gan.training.checks, "build_dataset", "data"),
                               (gan.training.assemble, "build_dataset", "data")):
        monkeypatch.setattr(module, name, counting(getattr(module, name), kind))
    source = digits_run / "checkpoints" / "last.ckpt"
    middle = finetuned / "checkpoints" / "step_000003.ckpt"
    loaded = FilesLoaded(monkeypatch)
    resume = [f"ckpt_path={middle}"] if resuming else []
    assert run_train(tmp_path / "run", f"init_from={digits_run}", *FINETUNE, *resume) == 0
    assert built == {"data": 2, "networks": 2}  # by the callback's checks, then by the loop's
    assert (loaded.count(source), loaded.count(middle)) == ((0, 2) if resuming else (2, 0))
