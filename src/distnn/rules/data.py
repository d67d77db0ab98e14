"""``data``: synchronous data parallelism (BSP), the default rule.

Every step all-reduces the gradients (bucketed, overlapped with backward, through
``distnn.distributed.DistributedOptimizer``) and every rank applies the same update, so N
ranks with batch B make exactly the update of one process with batch N·B. With a
compression that sends less (topk, threshold, powersgd) the update is the sum of what the
ranks sent, and each rank keeps its residual (error feedback) for its next steps.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from .. import distributed as dist
from .base import Message, Rule, RuleArgumentError


class DataParallel(Rule):
    """Synchronous all-reduce of gradients (Horovod/DDP; Theano-MPI's BSP).

    Args:
        bucket_size_mb: gradient bucket size of the all-reduce (MiB).
        non_blocking: start each bucket's all-reduce during backward (``Iallreduce``).
        compression: None (or "none"), "fp16", "topk:RATIO", "threshold:VALUE",
            "powersgd:RANK" or a compression object (``distnn.distributed.lossy``).
        error_feedback: keep what topk/threshold/powersgd did not send for the next step.
        compression_warmup_steps: dense steps before the compression starts.
        autotune: try bucket sizes during the first steps and keep the fastest
            (``distnn.distributed.autotune``; the choice is printed).
        autotune_steps: timed steps per bucket size tried.
        shard: 0 (a whole replica on every rank) or the ZeRO stage 1, 2 or 3 of
            ``distnn.distributed.ShardedOptimizer``: each rank keeps the optimizer state
            (1), and the summed gradients (2), and the parameters (3) of its own slice
            of the flat buffers only; the same updates as 0.

    With ``shard`` a checkpoint's parameters and optimizer state are written by every rank,
    its own slice (``distnn.training.checkpoint_shards``), and a resume on any number of
    ranks re-slices them.

    Checkpoints keep the compression's step count, PowerSGD's Q matrices and every rank's
    residual; a resume on another number of ranks sums the residuals and splits them
    evenly over the new ranks (the unsent gradient is kept; a note says so).

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=DataParallel())
    """

    name = "data"

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability, shard=0):
        whole = size * itemsize
        if shard == 0:
            return [Message("gradients", whole, 1.0, "gradients")]
        # ZeRO: the gradients summed (all-reduced under stage 1, reduce-scattered layer by
        # layer under 2 and 3), the updated slices all-gathered (stage 3: the parameters
        # before each layer's forward and backward instead of after the step)
        grads = (Message("gradients", whole, 1.0, "gradients") if shard == 1 else
                 Message("gradient slices", whole, 1.0, "reduce_scatter"))
        return [grads, Message("parameters", whole, 2.0 if shard == 3 else 1.0, "allgather")]
    lockstep = True

    def __init__(self, *, bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 compression: Any = None, error_feedback: bool = True,
                 compression_warmup_steps: int = 0, autotune: bool = False,
                 autotune_steps: int = 5, shard: int = 0):
        if isinstance(shard, bool) or shard not in (0, 1, 2, 3):
            raise RuleArgumentError("shard", f"shard must be 0 (no sharding) or a ZeRO stage "
                                    f"1, 2 or 3, got {shard!r}")
        if shard and autotune:
            raise RuleArgumentError("shard", "autotune tunes the dense all-reduce's buckets; "
                                    f"it does not apply with shard={shard}: drop one of them")
        self.shard = int(shard)
        self.bucket_size_mb = bucket_size_mb
        self.autotune, self.autotune_steps = bool(autotune), int(autotune_steps)
        self._tuner = None
        self.non_blocking = non_blocking
        # parsed once; None stands for no compression (the object is Compression.none)
        spec = dist.Compression.parse(compression)
        self.compression = None if spec is dist.Compression.none else spec
        self.error_feedback = error_feedback
        self.compression_warmup_steps = compression_warmup_steps
        self._residuals = None

    def bind(self, trainer, optimizer):
        if self.shard:
            if isinstance(optimizer, (dist.DistributedOptimizer, dist.ShardedOptimizer)):
                raise TypeError(f"DataParallel(shard={self.shard}) wraps a plain distnn "
                                f"optimizer itself, got {type(optimizer).__name__}")
            try:
                optimizer = dist.ShardedOptimizer(
                    optimizer, trainer.model, stage=self.shard, comm=trainer.comm, op="sum",
                    bucket_size_mb=self.bucket_size_mb, non_blocking=self.non_blocking,
                    compression=self.compression, error_feedback=self.error_feedback,
                    compression_warmup_steps=self.compression_warmup_steps,
                    stall=trainer.stall)
            except ValueError as exc:
                raise RuleArgumentError("shard", str(exc)) from None
            self._optimizer = optimizer
            return optimizer
        if not isinstance(optimizer, dist.DistributedOptimizer):
            # op="sum": the trainer's loss is already divided by the *global* batch size.
            optimizer = dist.DistributedOptimizer(
                optimizer, trainer.model, comm=trainer.comm, op="sum",
                bucket_size_mb=self.bucket_size_mb, non_blocking=self.non_blocking,
                compression=self.compression, error_feedback=self.error_feedback,
                compression_warmup_steps=self.compression_warmup_steps,
                stall=trainer.stall)
        self._optimizer = optimizer
        if self.autotune and trainer.comm.size > 1 and hasattr(optimizer, "rebucket"):
            self._tuner = dist.BucketTuner(optimizer.layout, trainer.comm,
                                           start_mb=self.bucket_size_mb,
                                           steps=self.autotune_steps)
        return optimizer

    def step(self, trainer) -> None:
        trainer.optimizer.step()
        tuner = self._tuner
        if tuner is None:
            return
        size = tuner.step(time.perf_counter())
        if size is not None:
            self._optimizer.rebucket(size)
        if tuner.done:
            self.bucket_size_mb, self._tuner = tuner.chosen, None
            trainer.print(tuner.report(), force=True)

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        if self.shard:
            self._optimizer.shard()

    @contextlib.contextmanager
    def evaluation_weights(self, trainer) -> Iterator[None]:
        if self.shard:  # stage 3: the parameters gathered for validation, then dropped
            with self._optimizer.gathered():
                yield
        else:
            yield

    def end(self, trainer) -> None:
        if self.shard:  # the model holds the run's final weights, whole
            self._optimizer.unshard()

    def _compressor(self):
        return getattr(getattr(self, "_optimizer", None), "compressor", None)

    def prepare_checkpoint(self, trainer) -> None:
        comp = self._compressor()
        if comp is not None and comp.error_feedback:
            self._residuals = trainer.comm.allgather_obj(comp.residual.copy())

    def state_dict(self) -> dict[str, Any]:
        comp = self._compressor()
        if comp is None:
            return {}
        residuals, self._residuals = self._residuals, None
        return {"compression": comp.state_dict(residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the compression state (what a resume does with it on another number of
        ranks or under another compression: ``resume_note``)."""
        stored = state.get("compression")
        comp = self._compressor()
        if stored and comp is not None:
            comp.load_state_dict(stored)

    def resume_note(self, stored: dict[str, Any], size: int) -> str | None:
        """What a resume does with the compression state of a checkpoint's rule state
        ``stored`` (as written, before unpacking) on ``size`` ranks; None: kept as it is."""
        comp = (stored or {}).get("compression")
        if not comp:
            return None
        mine = self._compressor()
        if mine is None or comp.get("spec") != mine.config.spec:
            return (f"gradient compression state of {comp.get('spec')} dropped (this run "
                    f"uses {mine.config.spec if mine is not None else 'none'})")
        n = len(comp.get("residuals") or [])
        if n and n != size and mine.error_feedback:
            return (f"gradient compression residuals of {n} ranks summed and split evenly "
                    f"over {size} ranks (the unsent gradient is kept, not where it was)")
        return None

    def stats(self) -> dict[str, float]:
        opt = getattr(self, "_optimizer", None)
        if opt is None:
            return {}
        return {"messages": float(opt.allreduce_calls), "bytes": float(opt.bytes_reduced),
                "bytes_dense": float(getattr(opt, "bytes_dense", opt.bytes_reduced)),
                "wait_s": float(opt.comm_wait_time)}

    def __repr__(self) -> str:
        return (f"DataParallel(bucket_size_mb={self.bucket_size_mb}, "
                f"non_blocking={self.non_blocking}, compression={self.compression!r}"
                + (f", shard={self.shard})" if self.shard else ")"))
