"""The seam between the ``Trainer`` and a training rule (how the replicas cooperate).

The trainer runs the same loop under every rule: forward and backward on this rank's
shard of each global batch, then ``rule.step(trainer)``. What "applying the gradients"
means — an all-reduce and a local update (``data``), a local update and an occasional
average (``localsgd``), a push to a master (``downpour``), an elastic pull toward a centre
(``easgd``), a gossip exchange (``gossip``) — is the rule's. The trainer never looks at a
rule's name; a new rule is one new file in this package (``RULES`` finds it).

A rule is stateful per run: ``bind`` is called once by the ``Trainer`` constructor, the
other hooks in this order::

    attach_data(train)                    # fit() start: the training set (fedavg cuts it)
    data_shard(trainer)                   # fit() start: (share, shares) of each batch
    begin(trainer)                        # fit() start, after a resume restored the state
    for each epoch:
        for each batch:  train_batch(...)  # None: the trainer runs forward and backward
                         step(trainer)    # after backward: apply this rank's gradients
          (or, on a rank whose share is None:  serve(trainer, epoch, progress))
        end_epoch(trainer, epoch)         # before the epoch metrics and validation
        with evaluation_weights(trainer): # validation, on_epoch_end callbacks, checkpoint
    end(trainer)                          # after the last epoch (also on early stop)

Every hook but ``step``/``serve`` is collective (docs/design.md §Rule 6): all ranks call it
the same number of times, so a rule may communicate inside any of them; ``step`` and
``serve`` are where a rule's point-to-point protocol lives.
"""
from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator


class RuleArgumentError(ValueError):
    """A constructor argument of a rule that does not fit (``argument`` names it), e.g.
    more chunks than the model has weights. Rules know nothing of command lines: whoever
    set the argument (``distnn.run``: an option) says where it came from."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


class RuleStateError(ValueError):
    """A checkpoint's rule state that this run cannot take back (the per-rank states of
    another number of ranks); the message says how to resume it."""


def whole_argument(rule: str, argument: str, value, *, least: int = 1, what: str = "",
                   default: int | None = None) -> int:
    """``value`` of a rule's whole-number constructor ``argument`` (``default`` for None), or
    the ``RuleArgumentError`` that says it must be an integer >= ``least`` (``what``: the
    argument in words, after its name)."""
    if value is None and default is not None:
        value = default
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value \
            or value < least:
        raise RuleArgumentError(argument, f"{rule}: {argument}{what} must be an integer >= "
                                f"{least}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Message:
    """One kind of message a rule sends, as it declares it for the cost model (``distnn
    plan``): ``nbytes`` each sending, ``per_step`` sendings a step on average (1/k for
    every k steps, p for a push with probability p), and its ``shape``:

    - ``"gradients"``: the gradients all-reduced bucket by bucket as backward makes them
      (the Reducer: compression and buckets apply);
    - ``"allreduce"``: one all-reduce after the step;
    - ``"master"``: to a master and its reply back, the master's link carrying every
      worker's in turn (the master computes nothing);
    - ``"push"``: point to point and asynchronous, sent while the rank computes on;
    - ``"behind"``: one all-reduce that runs while the next step computes (its wait is
      what it takes longer than a step);
    - ``"reduce_scatter"``: the gradients reduce-scattered top-level layer by layer as
      backward makes them (sharded stages 2 and 3: each rank keeps its slice's sum);
    - ``"allgather"``: the parameters all-gathered from every rank's slice (``nbytes`` the
      whole model's), not hidden behind compute (sharded stage 1 after the step; stage 3
      before each layer's forward and backward, ``per_step`` 2).
    """
    what: str
    nbytes: float
    per_step: float
    shape: str


class Rule:
    """Base class of training rules. Subclasses override the hooks they need.

    Attributes:
        name: the word that picks the rule (``RULES[name]``).
        min_ranks: the fewest ranks the rule runs on (2 with a master).
    """

    name = ""
    min_ranks = 1
    chosen_by_name = True  # False: a run picks it by options of its own (rules/__init__.py)
    # True when all ranks take every step together (a collective in each step), so the
    # trainer may add a small per-step collective of its own (the NaN check).
    lockstep = False

    def bind(self, trainer, optimizer):
        """Return the optimizer object the trainer drives (``trainer.optimizer``): the
        given one, or a wrapper around it. Called once, from ``Trainer.__init__``."""
        return optimizer

    def attach_data(self, train) -> None:
        """The training set ``fit`` was given, for rules that partition it themselves
        (federated clients); called before ``data_shard``."""

    def data_shard(self, trainer) -> tuple[int | None, int]:
        """(share, shares): this rank trains on share ``share`` of ``np.array_split(batch,
        shares)`` of every global batch; ``share`` None means no data (it ``serve``s)."""
        return self.shard_of(trainer.comm)

    def shard_of(self, comm) -> tuple[int | None, int]:
        """``data_shard`` of the rank of ``comm``, known before any trainer exists (the
        readers that read only this rank's part of the files ask it)."""
        return comm.rank, comm.size

    # -- what the rule sends a step, declared for the cost model (costmodel/predict.py) --
    default_period = 1  # the period (sync_every, chunks) when none is given
    plan_format = "{name}"  # the rule in the cost model's tables, of name, period, probability
    # where the rule's row (at its defaults) stands in ``distnn plan``'s table, after the
    # data rule's; None: no row of its own
    plan_order: float | None = None

    @classmethod
    def plan_label(cls, period: int, probability: float) -> str:
        """The rule in the cost model's tables (``plan_format``)."""
        return cls.plan_format.format(name=cls.name, period=period, probability=probability)

    @classmethod
    def step_messages(cls, *, size: int, itemsize: int, period: int,
                      probability: float) -> list[Message]:
        """The messages one rank sends a step for a model of ``size`` parameters of
        ``itemsize`` bytes (see ``Message``)."""
        raise NotImplementedError(f"rule {cls.name!r} declares no traffic for the cost "
                                  "model")

    def loss_denominator(self, batch) -> int:
        """What the loss of a batch is divided by: the global batch size (gradients are
        then summed over the ranks) or, for rules that update locally, the local size."""
        return batch.global_size

    def serve(self, trainer, epoch: int, progress: Callable[[int], Any] | None = None) -> None:
        """The epoch of a rank with no data share (a master): serve the training ranks
        until they are done; ``progress(n)`` counts n trained samples."""
        raise NotImplementedError(f"rule {self.name!r} gives every rank a data share")

    @contextlib.contextmanager
    def evaluation_weights(self, trainer) -> Iterator[None]:
        """Within it every rank's model holds the weights the run reports (validation,
        callbacks, checkpoints): its own under ``data``, the master's or the centre's."""
        yield

    def begin(self, trainer) -> None:
        """Make the replicas consistent before the first step of ``fit``."""

    def train_batch(self, trainer, batch, sums) -> float | None:
        """Forward and backward of this rank's share ``batch`` done by the rule itself (a
        pipeline stage: its micro-batches and messages), adding the batch's metric sums to
        ``sums``; returns the batch's loss. None (the default): the trainer does them."""
        return None

    def step(self, trainer) -> None:
        """Apply this rank's gradients (already computed by backward; zero on a rank with
        no samples in this global batch)."""
        trainer.optimizer.step()

    def end_epoch(self, trainer, epoch: int) -> None:
        """Called after the last batch of an epoch, before its metrics are all-reduced."""

    def end(self, trainer) -> None:
        """Called once after training (the model then holds the run's final weights)."""

    def prepare_checkpoint(self, trainer) -> None:
        """Collective, on every rank before a checkpoint reads ``state_dict`` (on the
        writing rank): gather per-rank state (gradient-compression residuals)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this rule exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"rule {self.name!r} keeps no state, got keys {sorted(state)}")

    def role(self, rank: int) -> str:
        """What rank ``rank`` does in this rule, in words, once bound ('' where every rank
        does the same): the line that names a lost rank (``distnn launch``) says it."""
        return ""

    def stats(self) -> dict[str, float]:
        """Communication counters for the profile: messages, bytes, seconds waiting."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
