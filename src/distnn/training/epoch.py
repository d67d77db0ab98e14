"""One step and one epoch of ``Trainer.fit``: the forward/backward/rule step of a
batch, the loop over an epoch's shard (resume skipping, callbacks, progress bar), the
non-finite loss check and the exact epoch metrics (``EpochLoop``, a base of ``Trainer``),
and ``NonFiniteLossError``.
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["EpochLoop", "NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite (raised on every rank, at the first step
    where any rank saw it, unless the Trainer was built with ``ignore_nan=True``).

    Attributes:
        epoch, step: 1-based epoch and step within it; global_step: 0-based step count.
        lr: the learning rate of that step; value: the loss seen.
    """

    def __init__(self, epoch: int, step: int, steps: int, global_step: int, lr: float,
                 value: float):
        where = f"epoch {epoch}, step {step}/{steps}" if step else f"epoch {epoch}"
        self.where = (f"the training loss became {value} at {where} (global step "
                      f"{global_step}) with learning rate {lr:.6g}")
        super().__init__(f"{self.where}; lower the learning rate, or build the Trainer with "
                         "ignore_nan=True to go on")
        self.epoch, self.step, self.global_step = epoch, step, global_step
        self.lr, self.value = lr, value


class EpochLoop:
    """The step and epoch machinery of ``distnn.training.Trainer`` (its base class; it
    uses the Trainer's model, comm, rule, optimizer, metrics and reporter)."""

    # -- one step -----------------------------------------------------------------------
    @property
    def _sync_bn(self) -> bool:
        return any(getattr(layer, "stat_reducer", None) is not None
                   for layer in self.model.walk())

    def _train_step(self, batch, sums: np.ndarray) -> None:
        model = self.model
        n = len(batch.x)
        stall = self.stall
        if stall is not None:
            stall.phase("forward", step=self.global_step)
        # A rule may run forward and backward itself (pipeline stages); it returns the loss.
        loss = self.rule.train_batch(self, batch, sums)
        if loss is not None:
            self.batch_loss = loss
        # SyncBatchNorm layers make collectives inside forward/backward, so a rank with an
        # empty shard must still run them (the layers accept 0 rows).
        elif n or self._sync_bn:
            logits = model.forward(batch.x, training=True)
            denom = self.rule.loss_denominator(batch)
            loss_value, dlogits = self.loss_fn(logits, batch.y, denom=denom)
            if stall is not None:
                stall.phase("backward")
            model.backward(dlogits)
            self.metrics.accumulate(sums, logits, batch.y, loss_value, denom)
            self.batch_loss = float(loss_value)
        else:
            self.batch_loss = 0.0
            # This rank has no samples in the last global batch: contribute zeros to the
            # all-reduce so every rank posts the same collectives.
            model.gradients_flat()[...] = 0
        self.batch_samples = n
        if stall is not None:
            stall.phase("exchange")  # the rule's communication (the reducer says its bucket)
        self.rule.step(self)
        if stall is not None:
            stall.phase("loss check")

    # -- the first step's compilation --------------------------------------------------
    def _announce_first_step(self) -> bool:
        """Say, before this process's first step, that it compiles (or loads from numba's
        cache) the model's compiled kernels; False when none run (NumPy, a torch model)."""
        if getattr(self, "_first_step_done", False):
            return False
        self._first_step_done = True
        from ..kernels.backend import compiled
        from ..nn.base import Layer
        if compiled() is None or not isinstance(self.model, Layer):
            return False
        self.reporter.print("First step: loading this model's compiled kernels from numba's "
                            "cache, compiling those not cached yet ...")
        return True

    def _report_first_step(self, seconds: float) -> None:
        from ..kernels.backend import compile_counts
        made, loaded = compile_counts()
        self.reporter.print(f"First step done in {seconds:.2f} s: {made} kernel signatures "
                            f"compiled (cached for the next run), {loaded} loaded from the cache")

    # -- one epoch ----------------------------------------------------------------------
    def _epoch_seed(self, epoch: int) -> int:
        return int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])

    def _train_epoch(self, train, epoch, gbs, n_batches, epoch_samples, shuffle, drop_last,
                     augment, prefetch, callbacks, sharding=None) -> dict[str, float]:
        comm = self.comm
        shard, n_shards = sharding if sharding is not None else (comm.rank, comm.size)
        sums = self.metrics.zeros()
        skip, self._resume_position = (self._resume_position or (0, None)), None
        skip, done_sums = skip
        if done_sums is not None:
            sums[...] = done_sums
        self.epoch_sums, self.epoch_step = sums, skip
        desc = f"Epoch {epoch + 1}/{self.num_epochs}"
        first = shard is not None and self._announce_first_step()
        bar = None if first else self.reporter.open_bar(epoch_samples, desc)
        if shard is None:
            # This rank trains on no data (a master): the rule serves the others instead.
            t0 = time.perf_counter()
            if self.stall is not None:
                self.stall.phase("waiting for workers", step=self.global_step)
            self.rule.serve(self, epoch, progress=bar.update if bar is not None else None)
            self.global_step += n_batches
            return self._end_epoch(epoch, sums, epoch_samples, t0, bar)
        batches = train.batches(gbs, shuffle=shuffle, seed=self._epoch_seed(epoch),
                                rank=shard, size=n_shards, drop_last=drop_last,
                                augment=augment, prefetch=prefetch)
        samples = shown = 0
        t0 = time.perf_counter()
        last_postfix = t0
        try:
            for i, batch in enumerate(batches):
                if i >= n_batches:
                    break
                if i < skip:  # done before the checkpoint this run resumed
                    shown += batch.global_size
                    if bar is not None:
                        bar.update(batch.global_size)
                    continue
                step = self.global_step
                for cb in callbacks:
                    cb.on_batch_begin(self, step)
                self._train_step(batch, sums)
                self._check_loss(epoch, i + 1, n_batches)
                self.global_step += 1
                self.epoch_step = i + 1
                samples += batch.global_size
                self.batch_global_size = batch.global_size
                if first:
                    first = False
                    bar = self._open_bar_after_first_step(time.perf_counter() - t0,
                                                          epoch_samples, desc, shown)
                if callbacks:
                    batch_logs = self.metrics.logs(sums)
                    for cb in callbacks:
                        cb.on_batch_end(self, step, batch_logs)
                if bar is not None:
                    bar.update(batch.global_size)
                    now = time.perf_counter()
                    if now - last_postfix > 0.5 or i + 1 == n_batches:
                        last_postfix = now
                        bar.set_postfix_str(self.reporter.postfix(self.metrics.logs(sums)),
                                            refresh=False)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        return self._end_epoch(epoch, sums, samples, t0, bar)

    def _open_bar_after_first_step(self, seconds, epoch_samples, desc, shown):
        """The first step reported and the epoch's bar opened only now, so its rate and
        time left do not count the kernels' compilation (``shown``: samples skipped on a
        resume)."""
        self._report_first_step(seconds)
        bar = self.reporter.open_bar(epoch_samples, desc)
        if bar is not None:
            bar.update(shown)
        return bar

    def _check_loss(self, epoch: int, step: int, steps: int) -> None:
        """Stop at the first non-finite loss of any rank, on every rank (one small
        all-reduce per step when several ranks train; see ``NonFiniteLossError``)."""
        if self.ignore_nan:
            return
        value = self.batch_loss
        bad = not np.isfinite(value)
        if bad and self._first_nan is None:
            self._first_nan = (epoch + 1, step, steps, self.global_step, self.optimizer.lr, value)
        if self._nan_sync:
            flag = np.array([float(bad)])
            self.comm.allreduce_(flag, "sum")
            bad = flag[0] > 0
            if bad and self._first_nan is None:
                value = float("nan")  # another rank saw it
                self._first_nan = (epoch + 1, step, steps, self.global_step, self.optimizer.lr,
                                   value)
        if bad and (self._nan_sync or self.comm.size == 1):
            raise NonFiniteLossError(*self._first_nan)

    def _end_epoch(self, epoch, sums, samples, t0, bar) -> dict[str, float]:
        elapsed = time.perf_counter() - t0
        if self.stall is not None:
            self.stall.phase("epoch end")
        self.rule.end_epoch(self, epoch)
        # Exact epoch metrics: one all-reduce of [loss_sum, metric sums, count].
        self.comm.allreduce_(sums, "sum")
        logs = self.metrics.logs(sums)
        loss = logs.get(self.loss_key, 0.0)
        if not self.ignore_nan and not np.isfinite(loss):
            # Ranks that could not agree at every step (some do not train) stop here.
            raise NonFiniteLossError(*(self._first_nan or (epoch + 1, 0, 0, self.global_step,
                                                           self.optimizer.lr, loss)))
        logs["lr"] = float(self.optimizer.lr)
        logs["time"] = elapsed
        logs["samples_per_s"] = samples / elapsed if elapsed > 0 else float("nan")
        self.train_time += elapsed
        self.train_samples += samples
        return logs
