"""One interface for what watches a run's steps: :class:`Observer`, told of each with the run as it sees it
(:class:`ObservedRun`). The run's own outputs (checkpoints, samples, metrics, the progress bar, the health check,
the audit, the step timer) are observers, and so is what a test or a benchmark watches a run with
(``train(cfg, probes=[...])``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gan.data.loader import GANData
    from gan.run.module import GANModule


class ObservedRun(Protocol):
    """What an observer reads of a run (gan/training/state.py's ``Training`` holds it, and more)."""

    module: GANModule  # the networks, their running statistics and counters (``counters.g``: the step just ended)
    data: GANData
    logged: bool  # the step just ended logged its scalars
    stopping: bool  # the run stops after this step (a signal, or its health check)
    last_losses: dict[str, float]  # the last logged loss/d and loss/g
    last_metrics: dict[str, float]  # the last evaluation's metrics/* (what gan.train returns)


class Observer:
    """Told where each method's name says; all do nothing here."""

    def on_start(self, run: ObservedRun) -> None:
        """Before the first step (a resume's: with its state put back)."""

    def on_step_start(self, run: ObservedRun, batch: Any) -> None:
        """A generator step's batch drawn, before it is placed and trained on."""

    def on_step_end(self, run: ObservedRun) -> None:
        """After a generator step, its scalars logged where ``run.logged``; ``run.stopping``: the run stops here."""

    def on_end(self, run: ObservedRun) -> None:
        """After the last step, when the steps ended without an error."""

    def on_close(self, run: ObservedRun, status: str) -> None:
        """However the steps ended (``status``: "success" or "failed")."""
