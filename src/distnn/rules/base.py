"""The seam between the ``Trainer`` and a training rule (how the replicas cooperate).

The trainer runs the same loop under every rule: forward and backward on this rank's
shard of each global batch, then ``rule.step(trainer)``. What "applying the gradients"
means — an all-reduce and a local update (``data``), a local update and an occasional
average (``localsgd``), a push to a master (``downpour``), an elastic pull toward a centre
(``easgd``), a gossip exchange (``gossip``) — is the rule's. The trainer never looks at a
rule's name; a new rule is one new file in this package plus one entry in ``RULES``.

A rule is stateful per run: ``bind`` is called once by the ``Trainer`` constructor, the
other hooks in this order::

    begin(trainer)                        # fit() start, after a resume restored the state
    for each epoch:
        for each batch:  step(trainer)    # after backward: apply this rank's gradients
        end_epoch(trainer, epoch)         # before the epoch metrics and validation
    end(trainer)                          # after the last epoch (also on early stop)

Every hook is collective in the sense of DESIGN rule 6: all ranks call it the same number
of times, so a rule may communicate inside any of them.
"""
from __future__ import annotations

from typing import Any


class Rule:
    """Base class of training rules. Subclasses override the hooks they need.

    Attributes:
        name: the word that picks the rule (``--parallel NAME``).
    """

    name = ""

    def bind(self, trainer, optimizer):
        """Return the optimizer object the trainer drives (``trainer.optimizer``): the
        given one, or a wrapper around it. Called once, from ``Trainer.__init__``."""
        return optimizer

    def begin(self, trainer) -> None:
        """Make the replicas consistent before the first step of ``fit``."""

    def step(self, trainer) -> None:
        """Apply this rank's gradients (already computed by backward; zero on a rank with
        no samples in this global batch)."""
        trainer.optimizer.step()

    def end_epoch(self, trainer, epoch: int) -> None:
        """Called after the last batch of an epoch, before its metrics are all-reduced."""

    def end(self, trainer) -> None:
        """Called once after training (the model then holds the run's final weights)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this rule exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"rule {self.name!r} keeps no state, got keys {sorted(state)}")

    def stats(self) -> dict[str, float]:
        """Communication counters for the profile: messages, bytes, seconds waiting."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
