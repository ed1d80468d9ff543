"""What an evaluation measures: the settings shared by train.py (``eval.*``) and evaluate.py."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

FEATURES = ("classifier", "rotation", "inception")
# Generated samples per evaluation where num_samples is null (configs/eval/default.yaml): the count of the data's
# protocol (docs/protocols.md). StackedMNIST's mode count is published at VEEGAN's 26,000; the 2D mixtures'
# protocol, and every other dataset by default, scores 2,500.
PROTOCOL_SAMPLES = {"stacked_mnist": 26_000}
DEFAULT_SAMPLES = 2_500


@dataclass(frozen=True)
class EvalSettings:
    """What to measure. No defaults here: configs/eval/default.yaml holds the only copy of them, read
    by train.py (under ``eval``) and evaluate.py (at the top level) alike; its ``num_samples: null`` is the
    one value that depends on the data, resolved by :meth:`from_config`."""

    num_samples: int  # generated samples per evaluation (null in a config: the data's protocol count)
    num_real: int  # at most this many real images behind the image metrics
    features: str | None  # classifier | rotation | inception; None: classifier if labelled, else rotation
    inception_weights: str | None  # features=inception: the weights file; None: torch.hub's cache
    inception_sha256: str | None  # that file's sha256; None: the published file's of its kind
    cache_dir: str  # trained feature classifiers and their checksums
    classifier_steps: int  # training steps of a feature classifier (once per dataset, then cached)
    batch_size: int  # samples per forward pass

    @classmethod
    def from_config(cls, cfg: Any, data: str | None = None) -> EvalSettings:
        """The settings in a composed config (``cfg.eval`` of train.py's, or evaluate.py's), which
        gan/config/schema.py's ``conform`` has checked (its ``MEASURED`` declares their bounds); ``num_samples=null``
        becomes the protocol count of the data named ``data`` (:data:`PROTOCOL_SAMPLES`)."""
        values = {f.name: cfg[f.name] for f in fields(cls)}
        if values["num_samples"] is None:
            values["num_samples"] = PROTOCOL_SAMPLES.get(data, DEFAULT_SAMPLES)
        return cls(**values)
