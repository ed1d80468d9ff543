"""gan/core/devices.py: the one parser of ``device`` options, on this machine's real devices."""

from __future__ import annotations

import pytest
import torch

from gan.core.devices import resolve_device
from gan.errors import ConfigError

CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_auto_and_cpu():
    assert resolve_device("auto") == torch.device("cuda" if CUDA_COUNT else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "mps", "meta", "cpu:0", "cuda:", "", " cpu", "CPU"])
def test_other_names_are_one_line_listing_the_choices(name):
    with pytest.raises(ConfigError) as error:
        resolve_device(name)
    message = str(error.value)
    assert "\n" not in message and f"'{name}'" in message and "auto, cpu, cuda, cuda:<n>" in message


def test_a_cuda_device_this_machine_lacks_names_the_fix():
    # One past the last device: cuda:0 on a machine without CUDA, cuda:<count> on one with it.
    with pytest.raises(ConfigError) as error:
        resolve_device(f"cuda:{CUDA_COUNT}")
    message = str(error.value)
    assert "\n" not in message
    assert ("use cuda:0 to" in message) if CUDA_COUNT else ("use cpu or auto" in message)
    if not CUDA_COUNT:
        with pytest.raises(ConfigError, match="no CUDA device here: use cpu or auto"):
            resolve_device("cuda")
    else:
        assert resolve_device("cuda") == torch.device("cuda")
        assert resolve_device(f"cuda:{CUDA_COUNT - 1}") == torch.device(f"cuda:{CUDA_COUNT - 1}")
