"""Bad input to train.py and evaluate.py: one line on stderr naming the problem and the fix, no traceback, a non-zero
exit code, and what the config's checks refuse leaves an existing run's files as they were. Real Hydra composition,
the entry points' real main(), real files."""

from __future__ import annotations

import gzip
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, compose_config, run_main, run_train
from hydra.errors import HydraException
from PIL import Image

from gan.errors import ConfigError
from gan.training.checks import validate


def one_line(capsys) -> str:
    """What the last command printed on stderr, which must be one line."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under ``directory``."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


# Refused while Hydra composes the config, or by the checks that run before Hydra writes the run directory.
CONFIG_ERRORS = {
    ("data=foo",): "error: data=foo is not an option: use data=cifar10|digits|fashion_mnist|folder|grid|mnist|ring|"
                      "stacked_mnist",
    ("trainer.max_stepz=3",): "error: trainer.max_stepz is not a config key (did you mean trainer.max_steps?): "
                              "check its spelling; --cfg job prints every key",
    ("seed=[1",): "error: seed=[1: no viable alternative at input '[1' See "
                  "https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
    ("+trainer.max_step=3",): "error: trainer.max_step is not a config key (did you mean trainer.max_steps?): check "
                              "its spelling; --cfg job prints every key, and a new key needs its type in "
                              "gan/config/schema.py",
    ("trainer.max_steps=abc",): "error: trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted to "
                                "Integer",
    ("ema.enabled=maybe",): "error: ema.enabled=maybe: Value 'maybe' is not a valid bool (type str)",
    ("data=folder",): "error: data.path has no value: give one, e.g. python train.py data.path=<value>",
    ("trainer.max_steps=0",): "error: trainer.max_steps=0: it must be >= 1 (the number of generator steps)",
    ("data.batch_size=0",): "error: data.batch_size=0: it must be >= 1 (real images per D update)",
    ("loss.d_steps=0",): "error: loss.d_steps=0: it must be >= 1 (D updates per generator step)",
    # Old names of keys (gan/config/schema.py's was=): refused by Hydra, or by the schema where + added them.
    ("train.batch_size=32",): "error: train.batch_size is now data.batch_size: use data.batch_size=32",
    ("+train.batch_size=32",): "error: train.batch_size is now data.batch_size: use data.batch_size=32",
    ("train.d_steps=2",): "error: train.d_steps is now loss.d_steps: use loss.d_steps=2",
    ("train.channels_last=true",): "error: train.channels_last is now data.channels_last: use data.channels_last=true",
    ("loss=wgan_gp", "loss.batchnorm_in_d=false"): "error: loss.batchnorm_in_d is now model.d_batchnorm: use "
                                                   "model.d_batchnorm=false",
    ("+loss.batchnorm_in_d=false",): "error: loss.batchnorm_in_d is now model.d_batchnorm: use model.d_batchnorm=false",
    ("model.width=0",): "error: model.width=0: it must be >= 1 (model=dcgan's and model=resnet's channels at their "
                        "highest resolution)",
    # The objective's intervals, once refused only when the run was built, after .hydra/ was written (reg.every), or
    # a ZeroDivisionError after the first step (ADA's).
    ("reg.every=0",): "error: reg.every=0: it must be >= 1 (D updates between the gradient penalties of reg=r1 and "
                      "reg=r1r2, each weighted by it; 1: every D update)",
    ("augment=ada", "augment.interval=0"): "error: augment.interval=0: it must be >= 1 (generator steps between ADA's "
                                           "adjustments of augment.p)",
    ("augment=ada", "augment.speed_images=0"): "error: augment.speed_images=0: it must be >= 1 (real images over which "
                                               "ADA's augment.p may move by 1.0)",
    ("experiment=ring", "model.hidden=0"): "error: model.hidden=0: it must be >= 1 (model=mlp's units per hidden "
                                           "layer)",
    ("data=mnist", "data.split=dev"): "error: data.split=dev: use data.split=train or data.split=test",
    ("model.codes=-1",): "error: model.codes=-1: it must be >= 0 (values of G's latent code; 0: none, e.g. "
                         "model.codes=8)",
    ("trainer.profiler=fancy",): "error: trainer.profiler=fancy: choose simple, advanced, pytorch or null",
    ("data=folder", "data.path=.", "data.preload=maybe"): "error: data.preload=maybe: use data.preload=auto, true or "
                                                          "false",
    ("model.d_condition=projection",): "error: model.d_condition=projection: use model.d_condition=input "
                                       "(labels beside D's input) or model.d_condition=classifier (D predicts them, "
                                       "AC-GAN)",
    ("model.conditional=true", "model.codes=8"): "error: model.codes=8 with model.conditional=true: G takes the "
                                                  "data's classes or a latent code, not both: use model.codes=0 or "
                                                  "model.conditional=false",
    ("trainer.devices=0",): "error: trainer.devices=0: it must be >= 1 (devices per node; -1: all of them; or auto, or "
                            "a list of device indices)",
    ("trainer.num_nodes=0",): "error: trainer.num_nodes=0: it must be >= 1 (machines the run spans)",
    ("optim.d.lr=0",): "error: optim.d.lr=0.0: it must be > 0 and finite (a learning rate, e.g. optim.d.lr=2e-4)",
    ("optim.g.lr=-1e-4",): "error: optim.g.lr=-0.0001: it must be > 0 and finite (a learning rate, e.g. "
                           "optim.g.lr=2e-4)",
    ("optim.g.lr=inf",): "error: optim.g.lr=inf: it must be > 0 and finite (a learning rate, e.g. optim.g.lr=2e-4)",
    ("optim.g.lr=nan",): "error: optim.g.lr=nan: it must be > 0 and finite (a learning rate, e.g. optim.g.lr=2e-4)",
    ("optim.d.betas=[0.5,1.5]",): "error: optim.d.betas=[0.5, 1.5]: Adam's betas are two numbers in [0, 1), the decay "
                                  "rates of its running gradient mean and square: e.g. optim.d.betas=[0.5,0.999]",
    ("optim.g.betas=[0.9]",): "error: optim.g.betas=[0.9]: Adam's betas are two numbers in [0, 1), the decay rates of "
                              "its running gradient mean and square: e.g. optim.g.betas=[0.5,0.999]",
    ("optim.g.betas=[-0.1,0.9]",): "error: optim.g.betas=[-0.1, 0.9]: Adam's betas are two numbers in [0, 1), the "
                                   "decay rates of its running gradient mean and square: e.g. "
                                   "optim.g.betas=[0.5,0.999]",
    ("optim.decay=cosine",): "error: optim.decay=cosine: use optim.decay=constant (the same learning rates "
                             "throughout) or optim.decay=linear (each falls linearly to 0 at the last generator step)",
    ("optim.g._target_=torch.optim.SGD",): "error: optim.g._target_=torch.optim.SGD cannot be built with lr, betas, "
                                           "fused (TypeError: SGD.__init__() got an unexpected keyword argument "
                                           "'betas'): give a torch.optim optimizer that takes them, e.g. "
                                           "optim.g._target_=torch.optim.Adam",
    ("optim.d._partial_=false",): "error: optim.d._partial_=false: the run passes each network's parameters to its "
                                  "optimizer: set optim.d._partial_=true",
    ("log.num_samples=0",): "error: log.num_samples=0: it must be >= 1 (images in the sample grid of an "
                            "unconditional run)",
    ("model.conditional=true", "log.samples_per_class=0"): "error: log.samples_per_class=0: it must be >= 1 (images "
                                                           "per row of a conditional run's grid, a row per class or "
                                                           "code)",
    ("experiment=ring", "log.num_points=-5"): "error: log.num_points=-5: it must be >= 1 (generated points in the "
                                              "scatter plots of 2D data)",
    ("log.every=0",): "error: log.every=0: it must be >= 1 (generator steps between logged scalars)",
    ("log.sample_every=-1",): "error: log.sample_every=-1: it must be >= 1 (generator steps between sample grids)",
    ("checkpoint.every=0",): "error: checkpoint.every=0: it must be >= 1 (generator steps between periodic "
                             "checkpoints)",
    ("eval.every=-1",): "error: eval.every=-1: it must be >= 0 (generator steps between evaluations; 0: none)",
    ("eval.every=3", "eval.num_samples=2"): "error: eval.num_samples=2: it must be >= 4 (generated samples per "
                                            "evaluation; precision/recall looks at each sample's 3 nearest neighbours)",
    ("eval.num_real=3",): "error: eval.num_real=3: it must be >= 4 (real images behind the image metrics; "
                          "precision/recall looks at each sample's 3 nearest neighbours)",
    ("eval.every=3", "eval.batch_size=0"): "error: eval.batch_size=0: it must be >= 1 (samples per forward pass)",
    ("eval.classifier_steps=0",): "error: eval.classifier_steps=0: it must be >= 1 (training steps of a feature "
                                  "classifier)",
    ("eval.features=vgg",): "error: eval.features=vgg: use classifier | rotation | inception, or null (classifier "
                            "where the data has labels, else rotation)",
    ("eval.inception_sha256=abc",): "error: eval.inception_sha256=abc: give the file's 64 hex digits, as sha256sum "
                                    "prints them, or null for the published file's",
    ("train.threads=0",): "error: train.threads=0: it must be >= 1 (torch's intra-op threads for this run; null: "
                          "OMP_NUM_THREADS, else the cores other work leaves free at the start)",
    ("metric=loss",): "error: metric=loss: train.py returns loss/d, loss/g or a metrics/<name> of eval.every",
    ("experiment=ring", "+data.classes=[0,1]"): "error: data.classes and data.limit choose images of labelled image "
                                                "data; data=ring draws its 2D points from every mode: drop them "
                                                "(data.num_points sets how many points)",
    ("ema.decay=1",): "error: ema.decay=1.0: it must be in [0, 1) (how slowly the EMA copy follows G: 0.999 averages "
                      "over about the last 1,000 generator steps)",
    ("ema.decay=-0.5",): "error: ema.decay=-0.5: it must be in [0, 1) (how slowly the EMA copy follows G: 0.999 "
                         "averages over about the last 1,000 generator steps)",
    ("data.channels=2",): "error: data.channels=2: images have 1 (grayscale) or 3 (RGB) channels: use data.channels=1 "
                          "or data.channels=3",
    ("data.image_size=0",): "error: data.image_size=0: it must be >= 1 (the images' height and width in pixels; "
                            "model=dcgan and model=resnet: >= 4)",
    ("ckpt_path=/nonexistent.ckpt",): "error: ckpt_path=/nonexistent.ckpt does not exist: give the path of a .ckpt "
                                      "file, e.g. <run>/checkpoints/last.ckpt",
    ("health.start=1",): "error: health.start=1.0: it must be in [0, 1) (the share of trainer.max_steps from which "
                         "a health condition whose figure stopped improving short of healthy is judged)",
    ("health.every=0",): "error: health.every=0: it must be >= 1 (generator steps between health checks)",
    # A key every run needs, deleted: of train.yaml itself, of a shared base (trainer/default.yaml), of an option.
    ("~seed",): "error: seed is not in the config, and every run of these options needs it: drop the ~seed override, "
                "or add the key back with +seed=<value>",
    ("~trainer.max_steps",): "error: trainer.max_steps is not in the config, and every run of these options needs it: "
                             "drop the ~trainer.max_steps override, or add the key back with "
                             "+trainer.max_steps=<value>",
    ("model=resnet", "~model.cardinality"): "error: model.cardinality is not in the config, and every run of these "
                                            "options needs it: drop the ~model.cardinality override, or add the key "
                                            "back with +model.cardinality=<value>",
}


def test_a_deleted_key_added_back_as_the_refusal_says_trains(tmp_path):
    assert run_train(tmp_path / "run", "~trainer.max_steps", "+trainer.max_steps=2") == 0
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_an_option_file_edited_between_two_runs_of_one_process_is_read_again(tmp_path):
    """A run reads the keys its option files set once per version of each file (it checks its config twice), not
    once per process: a notebook's user who edits a file between two runs is checked against the edit."""
    from gan.config.schema import keys_of

    option = tmp_path / "option.yaml"
    option.write_text("defaults: [base]\na: 1\n")
    assert keys_of(option, option.stat().st_mtime_ns) == (False, ("a",))
    modified = option.stat().st_mtime_ns
    option.write_text("# @package _global_\na: 1\nb: {c: 2}\n")
    os.utime(option, ns=(modified + 10**9, modified + 10**9))  # a later version, whatever the clock's resolution
    assert keys_of(option, option.stat().st_mtime_ns) == (True, ("a", "b.c"))


@pytest.mark.parametrize("overrides,expected", CONFIG_ERRORS.items(), ids=[" ".join(o) for o in CONFIG_ERRORS])
def test_config_errors_are_one_line_and_nothing_is_written(tmp_path, capsys, overrides, expected):
    assert run_train(tmp_path / "run", *overrides) == 2
    assert one_line(capsys) == expected
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run directory


# A refused optimizer or schedule, and the override its line advises.
OPTIMIZER_ADVICE = {
    "optim.d.betas=[0.5,1.5]": "optim.d.betas=[0.5,0.999]",
    "optim.g.betas=[0.9]": "optim.g.betas=[0.5,0.999]",
    "optim.g.lr=inf": "optim.g.lr=2e-4",
    "optim.decay=cosine": "optim.decay=linear",
    "optim.g._target_=torch.optim.SGD": "optim.g._target_=torch.optim.Adam",
    "optim.d._partial_=false": "optim.d._partial_=true",
}


def test_the_advice_of_each_optimizer_refusal_trains(tmp_path):
    for bad, fix in OPTIMIZER_ADVICE.items():
        with pytest.raises(ConfigError, match=re.escape(fix)):
            validate(compose_config(*TINY, bad))
        validate(compose_config(*TINY, bad, fix))
    # Every fix at once, each after its refused value (the last override wins): a real run.
    fixed = [o for pair in OPTIMIZER_ADVICE.items() for o in pair]
    assert run_train(tmp_path / "run", *fixed, "trainer.max_steps=2") == 0
    assert (tmp_path / "run" / "samples" / "step_000002.png").is_file()


@pytest.mark.parametrize("overrides", [("log.num_samples=1",), ("model.conditional=true", "log.samples_per_class=1"),
                                       ("experiment=ring", "log.num_points=1")])
def test_the_smallest_grid_a_bound_allows_is_drawn(tmp_path, overrides):
    assert run_train(tmp_path / "run", *overrides, "trainer.max_steps=1") == 0
    assert (tmp_path / "run" / "samples" / "step_000001.png").stat().st_size > 100


def test_a_run_directory_set_as_paths_run_dir_is_refused_and_hydra_run_dir_keeps_the_run_whole(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    assert run_train(tmp_path / "run", f"paths.run_dir={elsewhere}") == 2
    assert one_line(capsys) == (f"error: paths.run_dir={elsewhere}: train.py puts a run where Hydra runs it, so set "
                                f"hydra.run.dir={elsewhere} instead")
    assert not (tmp_path / "run").exists() and not elsewhere.exists()
    assert run_train(elsewhere) == 0  # the advice: hydra.run.dir=<dir> (run_train passes it)
    assert (elsewhere / ".hydra" / "config.yaml").is_file() and (elsewhere / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_an_accelerator_this_machine_lacks_is_one_line_and_its_advice_runs(tmp_path, capsys):
    assert run_train(tmp_path / "run", "trainer.accelerator=gpu") == 2
    assert one_line(capsys) == ("error: trainer.accelerator=gpu: this machine has no such device (torch sees none): "
                                "use trainer.accelerator=auto, which takes what there is, or trainer.accelerator=cpu")
    assert not (tmp_path / "run").exists()
    for fix in ("trainer.accelerator=auto", "trainer.accelerator=cpu"):
        validate(compose_config(*TINY, fix))
    assert run_train(tmp_path / "cpu", "trainer.accelerator=cpu") == 0


def test_bounds_hold_only_where_the_chosen_option_has_the_key_and_minus_one_devices_means_all():
    validate(compose_config(*TINY, "experiment=ring"))  # model=mlp: no model.width
    validate(compose_config(*TINY, "trainer.devices=-1"))
    with pytest.raises(ConfigError, match=r"^trainer\.devices=-2: it must be >= 1"):
        validate(compose_config(*TINY, "trainer.devices=-2"))


def test_a_latent_code_beside_the_datas_labels_is_refused_and_either_fix_it_names_passes():
    both = ("model.conditional=true", "model.codes=8")
    with pytest.raises(ConfigError, match="not both"):
        validate(compose_config(*TINY, *both))
    for fix in ("model.codes=0", "model.conditional=false"):
        validate(compose_config(*TINY, *both, fix))


def test_the_lines_a_run_ends_with_can_be_pasted_when_its_directory_has_a_space(tmp_path, capsys):
    run = tmp_path / "my runs" / "run 1"
    assert run_train(run, "trainer.max_steps=1") == 0
    lines = (run / "train.log").read_text().splitlines()
    tensorboard = next(line for line in lines if "curves and samples: " in line).partition("curves and samples: ")[2]
    evaluate = next(line for line in lines if "metrics: " in line).partition("metrics: ")[2]
    assert shlex.split(tensorboard) == ["tensorboard", "--logdir", str(run / "tensorboard")]
    assert shlex.split(evaluate) == ["python", "evaluate.py", f"run_dir={run}"]
    assert run_main("evaluate", *shlex.split(evaluate)[2:], "num_samples=50") == 0  # as a shell passes it
    capsys.readouterr()
    assert run_train(run) == 2  # a new run over it: the line says how to resume it
    resume = one_line(capsys).rpartition("or resume it with ")[2]
    assert shlex.split(resume) == [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"]


def test_an_image_size_the_model_cannot_build(tmp_path, capsys):
    assert run_train(tmp_path / "run", "data.image_size=3") == 2
    assert one_line(capsys) == "error: model=dcgan needs data.image_size >= 4, got 3"


def test_an_unwritable_run_directory_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    assert run_train(tmp_path / "file" / "run") == 2
    assert one_line(capsys) == (f"error: hydra.run.dir={tmp_path / 'file' / 'run'} cannot be written: "
                                f"{tmp_path / 'file'} is not a directory; choose another hydra.run.dir")


def test_a_refused_run_leaves_the_run_in_its_directory_untouched(digits_run, capsys):
    """Hydra would write <run>/.hydra/ before train.py ran: the checks run before it does."""
    before = snapshot(digits_run)
    for overrides in [(), ("ema.decay=2",), ("trainer.max_steps=abc",)]:
        assert run_train(digits_run, *overrides) == 2
    assert "already holds a run's checkpoints" in capsys.readouterr().err
    assert snapshot(digits_run) == before


def test_hydra_full_error_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(HydraException, match="Could not override 'trainer.max_stepz'"):
        run_train(tmp_path / "run", "trainer.max_stepz=3")
    with pytest.raises(ConfigError, match="model=dcgan needs data.image_size >= 4"):
        run_train(tmp_path / "run", "data.image_size=3")


def test_cli_type_error_is_one_line_without_traceback(tmp_path):
    out = subprocess.run([sys.executable, "train.py", *TINY, f"hydra.run.dir={tmp_path}/run", "trainer.max_steps=abc"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    # All of stderr: no traceback, no warning, no line of Hydra's own.
    assert out.stderr == ("error: trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted to "
                          "Integer\n")
    assert not (tmp_path / "run").exists()


def test_a_corrupt_image_read_by_a_dataloader_worker_is_one_line(tmp_path, capsys):
    """Decoded per step (preload=false) in a worker process, which sends the error back with its traceback."""
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(images / f"{i}.png")
    (images / "2.png").write_bytes((images / "2.png").read_bytes()[:-30])  # truncated
    assert run_train(tmp_path / "run", "data=folder", f"data.path={images}", "data.image_size=8",
                     "data.preload=false", "data.num_workers=1") == 2
    # Found while training: Lightning's own lines may come before it.
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: cannot decode image {images / '2.png'} (image file is truncated): replace or delete it")


def test_a_damaged_mnist_file_is_one_line_naming_it(tmp_path, capsys):
    """Damaged copies of a split's images file, each stopping train.py with one line that names the file and
    says to re-download it, before a step is trained."""
    from test_data import make_mnist_split

    make_mnist_split(tmp_path / "good" / "raw", "t10k", 50)
    good = tmp_path / "good" / "raw" / "t10k-images-idx3-ubyte.gz"
    unzipped = gzip.decompress(good.read_bytes())  # 16 header bytes, then 50 images of 28 x 28
    middle = len(good.read_bytes()) // 2
    damaged = {
        "truncated.gz": good.read_bytes()[:middle],
        "corrupt.gz": good.read_bytes()[:middle] + bytes(256) + good.read_bytes()[middle + 256:],
        "truncated": unzipped[:-100],
        "truncated_inside.gz": gzip.compress(unzipped[:-100]),  # a complete gzip file of a truncated IDX file
    }
    expected = {
        "truncated.gz": r"is a truncated or corrupt gzip file \(Compressed file ended before the end-of-stream marker "
                        r"was reached\): re-download it",
        "corrupt.gz": r"is a truncated or corrupt gzip file \(.+\): re-download it",
        "truncated": r"is truncated \(39116 bytes, 39216 expected\): re-download it",
        "truncated_inside.gz": r"is truncated \(39116 bytes unzipped, 39216 expected\): re-download it",
    }
    for case, data in damaged.items():
        root = tmp_path / case
        shutil.copytree(tmp_path / "good", root)
        (root / "raw" / good.name).unlink()
        path = root / "raw" / ("t10k-images-idx3-ubyte" + (".gz" if case.endswith(".gz") else ""))
        path.write_bytes(data)
        run = tmp_path / f"run_{case}"
        assert run_train(run, "data=mnist", f"data.root={root}", "data.split=test") == 2, case
        assert re.fullmatch(f"error: {re.escape(str(path))} {expected[case]}", one_line(capsys)), case
        assert not (run / "checkpoints").exists() and not (run / "tensorboard").exists()  # nothing trained


class Payload:
    """Unpickling it calls open(marker, "w"): it creates the marker file, as any code could run instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_files_that_are_no_checkpoint_are_refused_by_train_and_evaluate(digits_run, tmp_path, capsys):
    last = digits_run / "checkpoints" / "last.ckpt"
    marker = tmp_path / "code_ran"
    bad = {"truncated.ckpt": last.read_bytes()[: last.stat().st_size // 2],
           "random.ckpt": random.Random(0).randbytes(4096)}  # seeded: other bytes fail in other ways
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    torch.save({**torch.load(last, weights_only=True), "payload": Payload(marker)}, tmp_path / "unsafe.ckpt")
    # The file is what it claims: loading it without weights_only runs its code.
    torch.load(tmp_path / "unsafe.ckpt", weights_only=False)
    assert marker.exists()
    marker.unlink()

    unreadable = ("is not a readable checkpoint ({}: truncated, or no checkpoint): give another, e.g. a step_*.ckpt "
                  "beside it")
    expected = {"truncated.ckpt": unreadable.format("RuntimeError"),
                "random.ckpt": unreadable.format("UnpicklingError"),
                "unsafe.ckpt": "refused: it holds a pickled io.open, which loading it would call; load only "
                               "checkpoints train.py wrote"}
    run = shutil.copytree(digits_run, tmp_path / "evaluated")
    for name, message in expected.items():
        path = tmp_path / name
        assert run_train(tmp_path / f"resumed_{name}", f"ckpt_path={path}") == 2
        assert one_line(capsys) == f"error: ckpt_path={path} {message}"
        assert run_main("evaluate", f"run_dir={run}", f"ckpt={path}") == 2
        assert one_line(capsys) == f"error: ckpt={path} {message}"
    assert not marker.exists()  # nothing in the file ran
    assert not (run / "eval").exists()


def test_a_checkpoint_of_other_networks_lists_the_mismatched_tensors(digits_run, tmp_path, capsys):
    """Networks the checkpoint cannot fill, even where the changed config is allowed (resume.allow_changes):
    without it, the config's own comparison refuses model.width=4 first (tests/test_resume.py)."""
    last = digits_run / "checkpoints" / "last.ckpt"
    more = "trainer.max_steps=8"  # steps left to train: a resume at the run's end is refused before this
    assert run_train(tmp_path / "run", f"ckpt_path={last}", "model.width=4", more) == 2
    assert one_line(capsys).startswith(f"error: ckpt_path={last} was trained with other networks, objective or data "
                                       "(model.width=8 there, 4 here): resume with model.width=8 to go on as trained")
    assert run_train(tmp_path / "run", f"ckpt_path={last}", "model.width=4", "resume.allow_changes=true", more) == 2
    assert one_line(capsys) == (
        f"error: ckpt_path={last} holds other networks than this config builds (G.net.1.weight (64, 16, 4, 4) in the "
        "checkpoint, (64, 8, 4, 4) here; G.net.2.weight (16,) in the checkpoint, (8,) here; G.net.2.bias (16,) in the "
        "checkpoint, (8,) here; 27 more): resume with the overrides its run was trained with "
        f"({digits_run / '.hydra' / 'overrides.yaml'})")
    assert not list((tmp_path / "run").rglob("events.out.tfevents*"))  # refused before the loggers write a thing
