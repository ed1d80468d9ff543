"""Each claim of gan/patterns.py, asserted on the values its demonstration measured.

The demonstrations run here on small models with few repetitions. Timings on a shared 2-core machine
are not asserted: where a claim is about cost, the tests assert the counted FLOPs or saved bytes
instead, and leave the milliseconds to the table of ``python -m gan.patterns``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from gan import patterns

CPU = torch.device("cpu")
SMALL = {"size": 16, "width": 8, "batch": 8, "repeats": 1}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread while these tests run: their ops are tiny, and when other processes share
    the 2 cores, OpenMP's second thread waits to be scheduled at every op (seconds per test instead of
    milliseconds). Nothing here asserts a timing, so nothing measured changes meaning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_to_device_copies_tensors_and_moves_modules_in_place() -> None:
    v = patterns.to_device(CPU).values
    assert v["tensor_new_object"] and v["tensor_moved"] and v["tensor_original_unchanged"]
    assert v["tensor_no_op_is_self"]
    assert v["module_returns_self"] and v["same_parameter_objects"] and v["parameters_moved"]
    assert v["optimizer_sees_moved"]
    assert v["float_buffers_moved"] and v["buffer_new_object"]
    assert not v["integer_buffer_moved"]  # float64 is a dtype cast: integer tensors keep theirs
    assert not v["plain_attribute_moved"]


def test_requires_grad_propagates_from_any_input() -> None:
    v = patterns.requires_grad(CPU).values
    assert v["one_input_requires"] is True
    assert v["no_input_requires"] is False
    assert v["z_requires"] is False and v["g_output_requires"] is True
    assert v["frozen_g_output_requires"] is False


def test_freezing_skips_weight_gradients() -> None:
    v = patterns.freeze(CPU, **SMALL).values
    assert v["finetune_body_no_grad"] and v["finetune_head_grad"]
    assert v["g_step_d_no_grad"] and v["g_step_g_grad"] and v["trainable_d_grad"]
    assert v["flops_frozen"] < v["flops_trainable"]  # D's weight gradients are not computed


def test_volatile_warns_and_has_no_effect() -> None:
    v = patterns.volatile(CPU).values
    assert any("volatile was removed" in w for w in v["warnings"])
    assert v["variable_is_plain_tensor"] and v["volatile_flag"] is False
    assert v["volatile_output_requires_grad"] is True
    assert v["no_grad_output_requires_grad"] is False


def test_detach_shares_storage_and_detach__makes_a_leaf() -> None:
    v = patterns.detach(CPU).values
    assert v["same_storage"] and v["edit_visible"]
    assert v["detached_requires_grad"] is False
    assert v["original_requires_grad"] and v["original_backprops"]
    assert v["detach__grad_fn_none"] and v["detach__is_leaf"] and v["detach__requires_grad"] is False


def test_gan_d_step_three_ways() -> None:
    v = patterns.gan_d_step(CPU, **SMALL).values
    assert v["g_grads_touched"] == {"detach": False, "retain_graph": True, "neither": True}
    assert v["d_weights_max_diff"] <= 1e-6  # identical D updates with and without detach (one Adam step: ~2e-4)
    assert v["d_step_flops"]["detach"] < v["d_step_flops"]["retain_graph"]  # the wasted backward through G
    assert v["held_bytes"]["detach"] == 0 < v["held_bytes"]["retain_graph"]
    assert v["g_step_error"]["detach"] is None and v["g_step_error"]["retain_graph"] is None
    assert "Trying to backward through the graph a second time" in v["g_step_error"]["neither"]
    assert v["cuda_peak_bytes"] == {"detach": None, "retain_graph": None}


def test_reusing_d_output_after_the_d_step_fails() -> None:
    v = patterns.reuse_d_fake(CPU).values
    before, after = v["weight_version"]
    assert after > before
    assert "modified by an inplace operation" in v["stale_error"]
    assert v["fresh_error"] is None and v["fresh_g_grads"]


def test_conditional_input_splits_gradients_like_unconditional() -> None:
    v = patterns.conditional(CPU, num_classes=3).values
    assert v["d_in_channels"] == 1 + 3
    assert v["condition_requires_grad"] is False
    assert v["d_step_input_requires_grad"] is False and v["g_step_input_requires_grad"] is True
    expected = {"d_step_d_grads": True, "d_step_g_untouched": True, "g_step_g_grads": True,
                "g_step_d_untouched": True}
    assert v["unconditional"] == expected
    assert v["conditional"] == expected


def test_timing_is_skipped_on_cpu_with_the_reason() -> None:
    result = patterns.timing(CPU)
    assert result.ok is None and result.verdict == "skipped (CPU)"
    assert "synchronously" in result.measured


@needs_cuda
def test_timing_without_sync_under_reports_on_cuda() -> None:
    v = patterns.timing(torch.device("cuda"), size=2048, matmuls=10).values
    assert v["unsynced_ms"] < v["synced_ms"]
    assert v["events_ms"] == pytest.approx(v["synced_ms"], rel=0.2)


def test_no_grad_evaluation() -> None:
    v = patterns.no_grad(CPU, **SMALL).values
    assert v["output_requires_grad"] is False and v["output_grad_fn_none"]
    assert v["saved_bytes_no_grad"] == 0 < v["saved_bytes_grad"]
    assert v["created_inside_requires_grad"] is True
    assert v["computed_inside_requires_grad"] is False
    assert v["parameter_inside_requires_grad"] is True
    # What inference_mode skips, and why its tensors cannot enter autograd:
    assert isinstance(v["no_grad_sample_version"], int)
    assert "do not track version counter" in v["inference_sample_version_error"]
    assert v["no_grad_sample_error"] is None
    assert "Inference tensors cannot be saved for backward" in v["inference_sample_error"]


def test_non_blocking_is_skipped_on_cpu_with_the_reason() -> None:
    result = patterns.non_blocking(CPU)
    assert result.ok is None and result.verdict == "skipped (CPU)"
    assert "host-to-GPU" in result.measured


@needs_cuda
def test_non_blocking_copy_overlaps_on_cuda() -> None:
    v = patterns.non_blocking(torch.device("cuda"), batch=256, steps=5).values
    assert v["pinned"]
    assert v["non_blocking_call_ms"] < v["blocking_call_ms"]
    assert v["non_blocking_step_ms"] < v["blocking_step_ms"]


def test_leaf_gradients() -> None:
    v = patterns.leaf(CPU).values
    assert v["is_leaf"] == {"x": True, "a": True, "y": False}
    assert v["backward_grads"] == {"a": 28.0, "b": 14.0, "c": 14.0}
    assert v["x_grad"] is None and v["y_grad"] is None
    assert "retain_grad" in v["y_grad_warning"]
    assert v["retained_y_grad"] == 14.0
    assert v["autograd_grad"] == {"a": 28.0, "b": 14.0, "c": 14.0, "y": 14.0}
    assert v["autograd_grad_left_dot_grad_none"]


def test_backward_needs_a_loss_that_requires_grad() -> None:
    v = patterns.backward_needs_grad(CPU).values
    assert v["wrong_requires_grad"] is False
    assert "element 0 of tensors does not require grad" in v["error"]
    assert v["right_requires_grad"] is True


def test_optimizer_refuses_non_leaf_and_sgd_step() -> None:
    v = patterns.optimizer_leaf(CPU).values
    assert v["moved_is_leaf"] is False
    assert "can't optimize a non-leaf Tensor" in v["error"]
    assert v["after_step"] == pytest.approx([0.72, 1.86, 2.86])


def test_parameter_buffer_plain_attribute() -> None:
    v = patterns.parameter_buffer(CPU).values
    kinds = ("parameter", "buffer", "buffer_nonpersistent", "plain")

    def row(*flags: bool) -> dict[str, bool]:
        return dict(zip(kinds, flags))

    assert v["in_parameters"] == row(True, False, False, False)
    assert v["in_state_dict"] == row(True, True, False, False)
    assert v["follows_to"] == row(True, True, True, False)
    assert v["optimizer_updates"] == row(True, False, False, False)
    assert v["updated_explicitly"] == {"buffer": True, "plain": True}
    assert v["survives_save_load"] == row(True, True, False, False)


def test_every_claim_is_listed_once() -> None:
    assert len(patterns.DEMOS) == 15
    assert all(name == demo.__name__ for name, demo in patterns.DEMOS.items())


def test_only_runs_one_demonstration(capsys: pytest.CaptureFixture[str]) -> None:
    assert patterns.main(["--only", "leaf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| claim | what was run | what was measured | verdict |"
    assert len(lines) == 3 and lines[2].startswith("| `leaf`:") and lines[2].endswith("| holds |")


def test_unknown_name_is_one_line_listing_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert patterns.main(["--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'nope'" in err
    assert all(name in err for name in patterns.DEMOS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --device cuda is valid here")
def test_missing_cuda_is_one_line_and_exit_2() -> None:
    # Through `python -m`, as a user runs it.
    done = subprocess.run([sys.executable, "-m", "gan.patterns", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "cuda" in done.stderr
