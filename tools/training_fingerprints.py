"""Training fingerprints: one sha256 of the state a short real training run ends in, per recipe.

Why: a refactor of the training code (the loop, the step, the builders) must leave training bit-identical:
the same config and seed give the same weights, optimizer states and random streams. A fingerprint recorded
at a commit whose training is trusted, compared with one computed now, proves that (tests/test_same_training.py).

The numbers depend on more than the code: the CPU (which kernels torch picks: its capability, e.g. AVX512),
the number of threads (the order of every sum) and the torch release. So every fingerprint is stored under
the machine it was recorded on (:func:`machine`), runs on the CPU with one torch thread (train.threads=1,
trainer.accelerator=cpu), and is compared only on a machine with the same key.

    python tools/training_fingerprints.py                                  # print this tree's fingerprints
    python tools/training_fingerprints.py --tree /tmp/bitid/old --record   # record another checkout's
    python tools/training_fingerprints.py --check                          # compare this tree's with them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "training_fingerprints.json"
# The real MNIST test set, where the tests find it (tests/conftest.py's MNIST_T10K); its cases skip without it.
MNIST = ROOT.parent / "shared" / "data" / "mnist_t10k"
MNIST_DATA = (f"data.root={MNIST}", "data.split=test")  # as tests/test_experiments.py trains the MNIST recipes

# Each case: the overrides of gan.api.train that choose its recipe. "default" is what `python train.py` trains.
CASES: dict[str, tuple[str, ...]] = {
    "default": (),
    "ring": ("experiment=ring",),
    "grid": ("experiment=grid",),
    "mnist": ("experiment=mnist", *MNIST_DATA),
    "stacked_mnist": ("experiment=stacked_mnist", *MNIST_DATA),
    "mnist_acgan": ("experiment=mnist_acgan", *MNIST_DATA),
    # Fine-tuning: the default run's networks (trained first, for as many steps, into a directory beside this
    # one), D's first block frozen, on 200 of the digits.
    "finetune": ("init_from={source}", "finetune.freeze_d=1", "data.limit=200"),
}
NEEDS_MNIST = {"mnist", "stacked_mnist", "mnist_acgan"}

# Settings that pin where and how the numbers are computed, and nothing about what trains: one thread, the CPU,
# no in-training metrics, no progress bar. Logging, samples and checkpoints stay at the recipe's own settings
# (they only read the state; the sample grids use their own fixed noise, in eval mode, without gradients).
# And the health check's feature network at 20 training steps: trained in a forked random stream, it moves no hashed
# state, and a cold cache trains it in seconds (the MNIST recipes' 2,000 steps took five minutes of a fresh CI run).
PINNED = ("train.threads=1", "trainer.accelerator=cpu", "eval.every=0", "trainer.enable_progress_bar=false",
          "eval.classifier_steps=20")

# What is hashed: everything an exact resume reads from last.ckpt -- weights, buffers and counters (state_dict),
# optimizer and schedule states, the precision plugin's state and every RNG stream. Not hyper_parameters: it
# holds the composed config, whose key names a refactor may change without changing what trains.
HASHED = ("state_dict", "optimizer_states", "lr_schedulers", "precision", "rng")


def machine() -> str:
    """What decides the numbers besides the code: the CPU's model name, the CPU capability torch dispatches
    to, and the torch release; e.g. "AMD EPYC | AVX512 | torch 2.14.1+cu130"."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    cpu = cpu or platform.processor() or platform.machine() or "unknown CPU"
    return f"{cpu} | {torch.backends.cpu.get_cpu_capability()} | torch {torch.__version__}"


def needs_mnist(case: str) -> bool:
    return case in NEEDS_MNIST


def mnist_missing(case: str) -> bool:
    """Whether ``case`` cannot run here: it trains on the real MNIST test set, and that folder is absent."""
    return needs_mnist(case) and not MNIST.is_dir()


def fingerprint(case: str, steps: int, run_dir: Path) -> str:
    """Train ``case`` for ``steps`` generator steps into ``run_dir`` (a fresh directory) and return the sha256
    of the state its last checkpoint holds (:data:`HASHED`)."""
    from gan.api import train

    overrides = CASES[case]
    if any("{source}" in o for o in overrides):  # a run to start from: the default case's, trained first
        source = Path(f"{run_dir}-source")
        train(*CASES["default"], f"trainer.max_steps={steps}", *PINNED, run_dir=source)
        overrides = tuple(o.format(source=source) for o in overrides)
    train(*overrides, f"trainer.max_steps={steps}", *PINNED, run_dir=run_dir)
    checkpoint = torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    for key in HASHED:
        update(digest, key, checkpoint.get(key, "<absent>"))
    return digest.hexdigest()


def update(digest: Any, path: str, value: Any) -> None:
    """Feed ``value`` to ``digest``: each leaf with its path; dicts in sorted key order; tensors as their dtype,
    shape and bytes (in logical order: the same values in another memory layout hash the same); other leaves
    (numbers, strings, None) as their repr, exact for floats."""
    if isinstance(value, dict):
        for key in sorted(value, key=repr):
            update(digest, f"{path}.{key!r}", value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{path}: {type(value).__name__} of {len(value)}\n".encode())
        for i, item in enumerate(value):
            update(digest, f"{path}[{i}]", item)
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"{path}: tensor {t.dtype} {tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # bytes of any dtype, bfloat16 too
    else:
        digest.update(f"{path}: {value!r}\n".encode())


def fingerprints(cases: list[str], steps: int) -> dict[str, dict[str, Any]]:
    """Each case trained in this process, in a fresh temporary directory: ``{"<case>@<steps>": {"sha256": ...,
    "seconds": ...}}``, or ``{"skipped": why}`` for a case without its data."""
    results: dict[str, dict[str, Any]] = {}
    for case in cases:
        key = f"{case}@{steps}"
        if mnist_missing(case):
            results[key] = {"skipped": f"{MNIST} is absent"}
            continue
        with tempfile.TemporaryDirectory(prefix=f"fingerprint-{case}-") as tmp:
            start = time.perf_counter()
            sha = fingerprint(case, steps, Path(tmp) / "run")
            results[key] = {"sha256": sha, "seconds": round(time.perf_counter() - start, 2)}
        print(f"{key}: {sha} ({results[key]['seconds']} s)", file=sys.stderr, flush=True)
    return results


def in_tree(tree: Path, cases: list[str], steps: int) -> tuple[str, dict[str, dict[str, Any]]]:
    """:func:`fingerprints` of another checkout's training code: this script again, in a process whose ``gan``
    is ``tree``'s (PYTHONPATH, which comes before the editable install of this checkout). Returns the
    machine key the child computed and its results."""
    tree = tree.resolve()
    with tempfile.TemporaryDirectory(prefix="fingerprints-") as tmp:
        out = Path(tmp) / "fingerprints.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(Path(__file__).resolve()), "--steps", str(steps), "--cases", ",".join(cases),
                   "--expect-tree", str(tree), "--emit", str(out)]
        done = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.exit(f"training in {tree} failed (exit {done.returncode}):\n{done.stdout[-6000:]}")
        emitted = json.loads(out.read_text())
    return emitted["machine"], emitted["results"]


def check_gan_under(tree: Path) -> None:
    """Fail loudly unless the ``gan`` this process imports is ``tree``'s (not the editable install's)."""
    import gan

    where = Path(gan.__file__).resolve()
    if not where.is_relative_to(tree.resolve()):
        sys.exit(f"--tree {tree}: this process imports gan from {where}, not from {tree}; its fingerprints "
                 "would be of another checkout")


def read_recorded() -> dict[str, dict[str, str]]:
    return json.loads(RECORDED.read_text()) if RECORDED.is_file() else {}


def record(key_of_machine: str, results: dict[str, dict[str, Any]]) -> None:
    """Merge the results into :data:`RECORDED`, under the machine they were computed on."""
    everything = read_recorded()
    mine = everything.setdefault(key_of_machine, {})
    for key, result in results.items():
        if "sha256" not in result:
            print(f"{key}: skipped ({result['skipped']})")
            continue
        previous = mine.get(key)
        mine[key] = result["sha256"]
        note = "" if previous in (None, result["sha256"]) else f" (replaces a different one: {previous})"
        print(f"{key}: recorded {result['sha256']}{note}{took(result)}")
    everything[key_of_machine] = dict(sorted(mine.items()))
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(json.dumps(dict(sorted(everything.items())), indent=2) + "\n")
    print(f"in {RECORDED.relative_to(ROOT)} under {key_of_machine!r}")


def check(key_of_machine: str, results: dict[str, dict[str, Any]]) -> bool:
    """One line per case: same / DIFFERENT / not recorded (or skipped); True when none differs."""
    recorded = read_recorded().get(key_of_machine, {})
    all_same = True
    for key, result in results.items():
        if "sha256" not in result:
            line = f"skipped ({result['skipped']})"
        elif key not in recorded:
            line = "not recorded"
        elif recorded[key] == result["sha256"]:
            line = "same"
        else:
            line, all_same = f"DIFFERENT (recorded {recorded[key]}, now {result['sha256']})", False
        print(f"{key}: {line}{took(result)}")
    if not recorded:
        print(f"nothing is recorded for {key_of_machine!r} in {RECORDED.relative_to(ROOT)}")
    return all_same


def took(result: dict[str, Any]) -> str:
    return f" ({result['seconds']} s)" if "seconds" in result else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--tree", type=Path, help="train with this checkout's code (e.g. a git worktree)")
    parser.add_argument("--steps", type=int, default=10, help="generator steps per run (default: 10)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--record", action="store_true", help=f"merge into {RECORDED.relative_to(ROOT)}")
    mode.add_argument("--check", action="store_true", help="compare with those recorded for this machine")
    # Internal: how --tree runs this script in the other checkout.
    parser.add_argument("--expect-tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--emit", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := [c for c in cases if c not in CASES]:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")

    if args.expect_tree is not None:
        check_gan_under(args.expect_tree)
    if args.tree is not None:
        key_of_machine, results = in_tree(args.tree, cases, args.steps)
    else:
        key_of_machine, results = machine(), fingerprints(cases, args.steps)
    if args.emit is not None:
        args.emit.write_text(json.dumps({"machine": key_of_machine, "results": results}))
        return 0

    print(f"machine: {key_of_machine}; trained by {args.tree or ROOT}")
    if args.record:
        record(key_of_machine, results)
    elif args.check:
        return 0 if check(key_of_machine, results) else 1
    else:
        for key, result in results.items():
            print(f"{key}: {result.get('sha256') or 'skipped (' + result['skipped'] + ')'}{took(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
