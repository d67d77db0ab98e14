"""The training loop: epochs of sharded global batches, exact metrics, callbacks, progress.

Everything here is written for a communicator of any size, 1 included (``LocalComm``):

* ``batch_size`` is per rank, so the global batch is ``batch_size * comm.size`` unless
  ``global_batch_size`` is given; each rank gets its ``np.array_split`` share of every
  global batch (possibly empty on the last one).
* The loss of a step is the SUM over this rank's samples divided by the *global* batch
  size. What happens to the gradients is the training rule's (``distnn.rules``): the
  default ``DataParallel`` sums them with ``DistributedOptimizer(op="sum")``, so the update
  is exactly that of one process on the whole global batch, also with uneven or empty
  shards. A rank with no samples zeroes its gradients and still steps, so collectives
  stay in step.
* Epoch metrics are exact: every rank all-reduces ``[loss_sum, metric_sums..., count]``
  and divides afterwards, so each sample counts once whatever the sharding.
* Only rank 0 prints, draws progress bars and writes files.

The step and epoch machinery (and ``NonFiniteLossError``) is in ``distnn.training.epoch``.

Example:
    trainer = Trainer(model, get_optimizer("sgd", model, lr=0.01, momentum=0.9),
                      metrics=["accuracy"])
    history = trainer.fit(splits.train, epochs=3, batch_size=64, validation=splits.val)
    print(trainer.evaluate(splits.test))
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable, Sequence, TextIO

import numpy as np

from .. import distributed as dist
from ..rules import DataParallel, Rule
from .callbacks import Callback, TrainingCheckpoint
from .epoch import EpochLoop, NonFiniteLossError
from .evaluation import MetricSet, evaluate, predict, resolve_batch_sizes
from .history import History, Reporter

__all__ = ["Trainer", "fit", "NonFiniteLossError"]


class Trainer(EpochLoop):
    """Trains, evaluates and runs a model on sharded datasets, over a communicator.

    Args:
        model: a built ``distnn.nn.Model`` (outputs logits): a ``Sequential`` or a
            ``distnn.torch.TorchModel``.
        optimizer: a distnn optimizer over ``model`` (the rule may wrap it: the default
            ``DataParallel`` wraps it in a ``DistributedOptimizer``, op="sum"), or a
            ``distributed.DistributedOptimizer``.
        loss: loss name for ``distnn.nn.losses.get_loss`` or a callable
            ``loss(logits, y, denom=...) -> (value, dlogits)``.
        metrics: metric names for ``distnn.metrics.get_metric`` (or callables with a
            ``__name__``); each returns the SUM over a batch.
        comm: communicator (default ``distributed.get_comm()``; size 1 without mpiexec).
        rule: a ``distnn.rules.Rule``: how the replicas cooperate (default
            ``DataParallel()``; pass ``DataParallel(bucket_size_mb=...)`` for its options).
        callbacks: ``distnn.callbacks.Callback`` objects, called in order (a
            ``TrainingCheckpoint`` is always called last).
        progress: draw a tqdm bar per epoch on rank 0 (stderr).
        verbose: print per-epoch and final summary lines on rank 0 (stdout).
        seed: base seed of the epoch shuffles and augmentations.
        profiler: a ``distnn.training.Profiler`` (None: no timing at all).
        ignore_nan: keep training when the loss becomes NaN/inf (default: stop at the first
            such step on every rank with ``NonFiniteLossError``).
        out: where the summary lines go (default sys.stdout).
        stall: a ``distributed.stall.StallInspector`` watching ``comm`` (``watch_stalls``):
            the trainer, its checkpoints and the rule's reducer tell it where this rank is
            (None: no phases are published).

    Attributes:
        lr: the scheduled learning rate, read-only: the optimizer owns it
            (``optimizer.scheduled_lr``; LR schedules set it there, a warm-up sets
            ``optimizer.lr_scale``).
        history: ``History`` of the finished epochs.
        metrics: the ``MetricSet`` (loss and metric functions).
        reporter: the ``Reporter`` writing rank 0's lines and bars.
        epoch, global_step: the current epoch (0-based) and number of steps taken.
        stop_training, stop_reason: set by callbacks to end ``fit`` after this epoch.

    Example:
        trainer = Trainer(model, SGD(model, lr=0.01, momentum=0.9), metrics=["accuracy"])
        trainer.fit(train, epochs=2, batch_size=64, validation=val)
    """

    loss_key = MetricSet.loss_key

    def __init__(self, model, optimizer, *, loss: str | Callable = "categorical_cross_entropy",
                 metrics: Sequence[str | Callable] = ("accuracy",), comm=None,
                 callbacks: Sequence[Callback] = (), progress: bool = True,
                 verbose: bool = True, seed: int = 0, rule: Rule | None = None,
                 profiler=None, out: TextIO | None = None,
                 ignore_nan: bool = False, stall=None):
        self.comm = comm if comm is not None else dist.get_comm()
        self.stall = stall  # before the rule binds: DataParallel hands it to its reducer
        self.model = model
        self.metrics = MetricSet(loss, metrics)
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks must be distnn.training.Callback objects, got "
                                f"{type(cb).__name__}")
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        self.reporter = Reporter(self.comm.rank == 0, progress=progress, verbose=verbose,
                                 out=out)
        self.profiler = profiler
        if rule is None:
            rule = DataParallel()
        if not isinstance(rule, Rule):
            raise TypeError(f"rule must be a distnn.rules.Rule, got {type(rule).__name__}")
        self.rule = rule
        self.optimizer = rule.bind(self, optimizer)
        self.history = History()
        self.epoch = 0
        self.global_step = 0
        self.num_epochs = 0
        self.steps_per_epoch = 0
        self.stop_training = False
        self.stop_reason: str | None = None
        self.log_keys: list[str] = []
        self.train_time = 0.0
        self.train_samples = 0
        self.last_eval_count = 0
        self.ignore_nan = bool(ignore_nan)
        self.batch_loss = 0.0
        self.global_batch_size = 0
        self.run_info: dict = {}  # the run's settings, saved with the history (History.run)
        self.epoch_step = 0          # batches done in the current epoch
        self.epoch_sums = None       # this rank's metric sums of the current epoch
        self._resume_position = None  # (batches to skip, global sums) of a mid-epoch resume

    # -- shortcuts to the collaborators ---------------------------------------------------
    @property
    def lr(self) -> float:
        """The scheduled learning rate (the optimizer's ``scheduled_lr``; read-only here)."""
        return float(self.optimizer.scheduled_lr)

    @property
    def is_root(self) -> bool:
        return self.comm.rank == 0

    @property
    def verbose(self) -> bool:
        return self.reporter.verbose

    @property
    def loss_fn(self) -> Callable:
        return self.metrics.loss_fn

    @property
    def metric_fns(self) -> dict[str, Callable]:
        return self.metrics.metric_fns

    def print(self, message: str, force: bool = False) -> None:
        """Print a line on rank 0 (see ``Reporter.print``)."""
        self.reporter.print(message, force)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, dataset, *, batch_size: int | None = None,
                 global_batch_size: int | None = None, steps: int = 0,
                 prefix: str = "") -> dict[str, float]:
        """Loss and metrics over ``dataset``, exact over the ranks (collective; see
        ``distnn.training.evaluate``)."""
        if self.stall is not None:
            self.stall.phase("evaluate")
        logs, self.last_eval_count = evaluate(
            self.model, self.metrics, self.comm, dataset, batch_size=batch_size,
            global_batch_size=global_batch_size, steps=steps, prefix=prefix)
        return logs

    def predict(self, data, *, batch_size: int = 256, steps: int = 0,
                return_labels: bool = False, gather: bool = True):
        """Model outputs for a Dataset or an array (see ``distnn.training.predict``)."""
        return predict(self.model, self.comm, data, batch_size=batch_size, steps=steps,
                       return_labels=return_labels, gather=gather)

    # -- fit ----------------------------------------------------------------------------
    def fit(self, train, *, epochs: int = 1, batch_size: int | None = 64,
            global_batch_size: int | None = None, validation=None, steps_per_epoch: int = 0,
            shuffle: bool = True, drop_last: bool = False, augment=None,
            prefetch: bool = False, history_file: str | None = None,
            resume: str | None = None, eval_batch_size: int | None = None,
            validation_steps: int = 0, resume_lr: float | None = None) -> History:
        """Train for ``epochs`` epochs (in total: a resumed run continues to this number).

        Args:
            train: a ``distnn.data`` Dataset.
            epochs: total number of epochs.
            batch_size: per-rank batch size (global = batch_size * comm.size).
            global_batch_size: the global batch size instead (wins over batch_size).
            validation: Dataset evaluated after each epoch (logged as "val_*").
            steps_per_epoch: use at most this many batches per epoch (0: all).
            shuffle, drop_last, augment, prefetch: passed to ``Dataset.batches``.
            history_file: rank 0 rewrites it (JSON, or CSV for a .csv name) after each epoch.
            resume: a checkpoint written by ``TrainingCheckpoint``/``save_checkpoint`` (its
                path, or a loaded ``Checkpoint``); the run continues from its state
                (weights, optimizer, epoch, callbacks, RNGs).
            eval_batch_size: per-rank batch size of validation (default max(batch_size, 256)).
            validation_steps: validate on at most this many batches (0: all).
            resume_lr: with ``resume``, the scheduled learning rate to continue at instead
                of the checkpoint's (set on the optimizer, which owns it).

        Returns:
            the ``History``.
        """
        plan = self._plan_fit(train, epochs, batch_size, global_batch_size, steps_per_epoch,
                              drop_last, validation is not None)
        start_epoch = self._resume_fit(resume, resume_lr)
        self.rule.begin(self)
        self.stop_training = False
        self.stop_reason = None
        ordered = ([cb for cb in self.callbacks if not isinstance(cb, TrainingCheckpoint)]
                   + [cb for cb in self.callbacks if isinstance(cb, TrainingCheckpoint)])
        for cb in ordered:
            cb.on_train_begin(self)
        if self.profiler is not None:
            self.profiler.attach(self)
        t_fit = time.perf_counter()
        try:
            for epoch in range(start_epoch, self.num_epochs):
                self._fit_epoch(epoch, train, plan, ordered, validation, validation_steps,
                                eval_batch_size or max(plan.local_bs, 256), shuffle,
                                drop_last, augment, prefetch, history_file)
                if self.stop_training:
                    self.history.stop_reason = self.stop_reason
                    self.print(f"Stopping after epoch {epoch + 1}: {self.stop_reason}")
                    break
        finally:
            if self.profiler is not None:
                self.profiler.detach()
        self.rule.end(self)
        for cb in ordered:
            cb.on_train_end(self)
        self._report_fit(time.perf_counter() - t_fit, len(self.history) - start_epoch,
                         plan.gbs)
        return self.history

    # The steps of fit, in order.
    def _plan_fit(self, train, epochs, batch_size, global_batch_size, steps_per_epoch,
                  drop_last, validating: bool) -> SimpleNamespace:
        """Check the arguments, ask the rule for this rank's share of each batch, and agree
        on the step plan with every rank; sets what the epochs and callbacks read."""
        comm = self.comm
        if isinstance(epochs, bool) or int(epochs) != epochs or epochs < 0:
            raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
        if isinstance(steps_per_epoch, bool) or int(steps_per_epoch) != steps_per_epoch \
                or steps_per_epoch < 0:
            raise ValueError(f"steps_per_epoch must be an integer >= 0 (0: whole dataset), "
                             f"got {steps_per_epoch!r}")
        # The rule says which share of each global batch this rank trains on (None: none,
        # e.g. a parameter-server master) and among how many ranks the batches are split.
        self.rule.attach_data(train)
        shard, n_shards = self.rule.data_shard(self)
        local_bs, gbs = resolve_batch_sizes(batch_size, global_batch_size, n_shards)
        self.global_batch_size = gbs
        # A per-step check of the loss over the ranks needs every rank to take the steps
        # together: not under rules that let ranks run ahead (localsgd, gossip, masters).
        self._nan_sync = (comm.size > 1 and self.rule.lockstep
                          and all(comm.allgather_obj(shard is not None)))
        self._first_nan = None
        if any(getattr(cb, "steps", 0) for cb in self.callbacks
               if isinstance(cb, TrainingCheckpoint)) and comm.size > 1 and not self._nan_sync:
            raise ValueError(f"checkpoint_steps needs a rule whose ranks all train every step "
                             f"together (e.g. data); rule {self.rule.name!r} does not: "
                             "checkpoint by epochs (checkpoint_freq) instead")
        self.num_epochs = int(epochs)
        n_batches = train.num_batches(gbs, drop_last=drop_last)
        if steps_per_epoch:
            n_batches = min(n_batches, int(steps_per_epoch))
        # Every rank must post the same collectives: check the step plan agrees (one small
        # allgather per fit) so a mismatch is an error on every rank, not a hang.
        plans = comm.allgather_obj((len(train), gbs, n_batches, self.num_epochs))
        if any(plan != plans[0] for plan in plans):
            detail = "; ".join(f"rank {r}: {n} samples, global batch {g}, {b} batches/epoch, "
                               f"{e} epochs" for r, (n, g, b, e) in enumerate(plans))
            raise RuntimeError(f"ranks disagree on the training plan ({detail}); give every "
                               "rank the same dataset and options")
        if n_batches == 0:
            raise ValueError(f"the training set has {len(train)} samples: no full batch of "
                             f"global size {gbs} (drop_last={drop_last}); lower batch_size")
        self.steps_per_epoch = n_batches
        self.log_keys = list(self.metrics.names)
        if validating:
            self.log_keys += [f"val_{k}" for k in self.log_keys]
        self.log_keys += ["lr", "time", "samples_per_s"]
        return SimpleNamespace(shard=(shard, n_shards), local_bs=local_bs, gbs=gbs,
                               n_batches=n_batches,
                               epoch_samples=min(n_batches * gbs, len(train)))

    def _resume_fit(self, resume, resume_lr) -> int:
        """Restore the state of the checkpoint ``resume`` (if any); the first epoch to run."""
        self.resumed = None
        if resume is None:
            return 0
        from .checkpoint import Checkpoint, load_latest
        state = resume if isinstance(resume, Checkpoint) else load_latest(resume)
        if state.bad_newest is not None and not isinstance(resume, Checkpoint):
            self.print(state.fallback_note(resume))
        state.restore(self, lr=resume_lr)
        self.resumed = state  # TrainingCheckpoint names it as the last good one
        start_epoch = state.epochs_done
        if state.epoch_step:
            sums = state.arrays["epoch_sums"]
            self._resume_position = (state.epoch_step,
                                     sums if self.comm.rank == 0 else np.zeros_like(sums))
            self.print(f"resuming from epoch {start_epoch + 1} step {state.epoch_step} of "
                       f"{state.path}: skipping its {state.epoch_step} done batches, "
                       f"training to epoch {self.num_epochs}")
        elif start_epoch >= self.num_epochs:
            self.print(f"checkpoint {state.path!r} already holds {start_epoch} epochs "
                       f"(>= epochs={self.num_epochs}); nothing to train")
        else:
            self.print(f"resuming from epoch {start_epoch} of {state.path}: training "
                       f"epochs {start_epoch + 1}..{self.num_epochs}")
        return start_epoch

    def _fit_epoch(self, epoch, train, plan, ordered, validation, validation_steps, eval_bs,
                   shuffle, drop_last, augment, prefetch, history_file) -> None:
        """One epoch: its steps, then validation, the callbacks and the history."""
        self.epoch = epoch
        for cb in ordered:
            cb.on_epoch_begin(self, epoch)
        if self.profiler is not None:
            self.profiler.epoch_begin(epoch)
        logs = self._train_epoch(train, epoch, plan.gbs, plan.n_batches, plan.epoch_samples,
                                 shuffle, drop_last, augment, prefetch, ordered, plan.shard)
        # Validation, callbacks and checkpoints see the weights the rule reports (the
        # master's, the centre, the average), not a worker's local replica.
        with self.rule.evaluation_weights(self):
            if validation is not None:
                logs.update(self.evaluate(validation, global_batch_size=eval_bs * self.comm.size,
                                          steps=validation_steps, prefix="val_"))
            record = {"epoch": epoch + 1, **logs}
            self.history.append(record)
            for cb in ordered:
                cb.on_epoch_end(self, epoch, record)
        self.reporter.epoch_line(record, self.num_epochs)
        if self.profiler is not None:
            self.profiler.epoch_end(epoch)
        self.history.run = dict(self.run_info)
        if history_file:
            self.history.save_on_root(history_file, self.comm)

    def _report_fit(self, elapsed: float, epochs_run: int, gbs: int) -> None:
        if epochs_run > 0:
            rate = self.train_samples / self.train_time if self.train_time else float("nan")
            size = self.comm.size
            self.print(f"Training: {epochs_run} epoch{'s' * (epochs_run != 1)} in "
                       f"{elapsed:.2f} s, {rate:,.0f} samples/s "
                       f"(global batch {gbs}, {size} rank{'s' * (size != 1)})")


def fit(model, train, *, optimizer=None, lr: float = 0.01, epochs: int = 1,
        batch_size: int = 64, validation=None, loss="categorical_cross_entropy",
        metrics=("accuracy",), callbacks=(), comm=None, progress: bool = True,
        **fit_options) -> History:
    """One-call training: build a ``Trainer`` (SGD with momentum 0.9 unless ``optimizer``)
    and run ``fit``. Extra keyword arguments go to ``Trainer.fit``.

    Example:
        history = distnn.training.fit(model, splits.train, epochs=2, validation=splits.val)
    """
    if optimizer is None:
        from ..optim import get_optimizer
        optimizer = get_optimizer("sgd", model, lr=lr, momentum=0.9)
    trainer = Trainer(model, optimizer, loss=loss, metrics=metrics, comm=comm,
                      callbacks=callbacks, progress=progress)
    return trainer.fit(train, epochs=epochs, batch_size=batch_size, validation=validation,
                       **fit_options)
