"""Full training state in one file, written atomically, to continue a run exactly.

A checkpoint is an ``.npz`` file holding:

* ``model/<layer>/<name>``: every parameter and buffer (``model.named_arrays()``);
* ``optim/...``: the optimizer's ``state_dict()`` arrays;
* ``callbacks/<i>/...``: arrays in callback states (e.g. best weights);
* ``__meta__``: JSON with the format version, epochs done, global step, seed, history,
  callback states, the optimizer's scalars (its scheduled learning rate among them: the
  optimizer owns the rate, ``Checkpoint.lr`` reads it), and the state of every random
  generator found in the model's layers (dropout), per rank.

``save_checkpoint`` is collective (every rank calls it; RNG states are gathered) and only
rank 0 writes, through a temporary file in the target folder and ``os.replace``, so a
crash (even SIGKILL) never leaves a half-written checkpoint and the previous one stays
intact; a write error is raised on every rank. The file it replaces is kept, whole, as
the previous checkpoint (``ck.npz`` -> ``ck.prev.npz``, ``previous_path``), and
``load_latest`` falls back to it when the newest will not load. The metadata also
records the number of ranks, the global batch size and the ``run`` settings of the
command that wrote it, so a resume can keep the global batch and compare its settings.
``load_checkpoint(path).restore(trainer)`` puts everything back, so that training 2 epochs
equals training 1 epoch, saving, and resuming for 1 more (bit-identical weights).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..distributed.coordination import on_ranks
from ..fileio import WriteError, atomic_open, guarded_write, npz_kind, read_npz
from .checkpoint_check import meta_problem
from . import checkpoint_files
from .checkpoint_shards import is_sharded, load_shards, remove_stale, save_shards
from .checkpoint_files import keep_previous, previous_path

__all__ = ["save_checkpoint", "load_checkpoint", "load_latest", "previous_path", "Checkpoint",
           "CheckpointError", "pack", "unpack"]

# callbacks that keep no state: a resume may add or drop them
STATELESS = ("TrainingCheckpoint", "ProgressFile")


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit this run; the message names the file,
    what is wrong and what to do."""


FORMAT = "distnn-checkpoint"
VERSION = 1


def pack(obj: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON-able skeleton of ``obj`` with its arrays moved into ``arrays`` by path."""
    if isinstance(obj, np.ndarray):
        arrays[prefix] = obj
        return {"__array__": prefix}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: pack(v, f"{prefix}/{k}", arrays) for k, v in obj.items()}
        return {"__items__": [[k, pack(v, f"{prefix}/{i}", arrays)]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(v, f"{prefix}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [pack(v, f"{prefix}/{i}", arrays) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} at {prefix!r}; state "
                    "dicts may hold arrays, numbers, strings, lists, tuples and dicts")


def unpack(obj: Any, arrays) -> Any:
    """Inverse of ``pack``."""
    if isinstance(obj, dict):
        if "__array__" in obj:
            return np.array(arrays[obj["__array__"]])
        if "__tuple__" in obj:
            return tuple(unpack(v, arrays) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {k: unpack(v, arrays) for k, v in obj["__items__"]}
        return {k: unpack(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unpack(v, arrays) for v in obj]
    return obj


def _generators(model) -> dict[str, np.random.Generator]:
    """Random generators held by the model's layers (dropout masks), by "<layer>.<attr>"."""
    out = {}
    for layer in model.walk():
        for attr, value in vars(layer).items():
            if isinstance(value, np.random.Generator):
                out[f"{layer.name}.{attr}"] = value
    return out


def _base_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)


def save_checkpoint(path: str | os.PathLike, trainer, *, epochs_done: int | None = None,
                    run: dict[str, Any] | None = None, epoch_step: int = 0,
                    per_node: bool = False, keep_previous: bool = True) -> None:
    """Write the trainer's full state to ``path`` (collective; rank 0 writes atomically,
    or with ``per_node`` the first rank of every node, for node-local disks).

    Args:
        path: target file (.npz).
        trainer: a ``distnn.training.Trainer``.
        epochs_done: number of finished epochs (default ``trainer.epoch + 1``).
        run: JSON-able settings of the run that wrote it (the command stores its options
            here, so a resume can compare them); kept as ``meta["run"]``.
        epoch_step: batches done of epoch ``epochs_done`` (0: at an epoch's end); a
            mid-epoch checkpoint also keeps the epoch's metric sums over all ranks.
        keep_previous: the file it replaces becomes ``previous_path(path)``; False (the
            first write of a run that did not resume): a previous file there, of another
            run, is removed instead.

    Raises:
        fileio.WriteError (an OSError), on every rank, when rank 0 could not write the file;
        the previous file at ``path`` is then untouched.
    """
    comm = trainer.comm
    path = os.fspath(path)
    if trainer.stall is not None:
        trainer.stall.phase("checkpoint write")
    prepare = getattr(trainer.rule, "prepare_checkpoint", None)
    if prepare is not None:
        prepare(trainer)  # collective: per-rank rule state (compression residuals)
    # sharded state: every rank writes its own slice first (checkpoint_shards.py)
    sharded = save_shards(path, trainer) if is_sharded(trainer.optimizer) else None
    rng_states = {k: g.bit_generator.state for k, g in _generators(trainer.model).items()}
    all_rng = comm.allgather_obj(rng_states)
    done = trainer.epoch + 1 if epochs_done is None else int(epochs_done)
    position = None
    if epoch_step:
        sums = np.array(trainer.epoch_sums, dtype=np.float64)
        comm.allreduce_(sums, "sum")
        position = (int(epoch_step), sums)

    def write():
        guarded_write(path, lambda: _write(path, trainer, all_rng, done, run, position,
                                           keep_previous, sharded), "checkpoint")

    if per_node and comm.size > 1:
        # every node keeps its own copy: a resume reads the file on its own node
        on_ranks(comm, lambda: comm.local_rank == 0 and write(), catch=WriteError)
    else:
        on_ranks(comm, write, root=0, catch=WriteError)


def _parameter_keys(model) -> set[str]:
    return {f"{layer.name}/{key}" for layer in model.walk() for key in layer.params}


def _write(path: str, trainer, all_rng: list, epochs_done: int, run, position=None,
           keep: bool = True, sharded: dict | None = None) -> None:
    arrays: dict[str, np.ndarray] = {}
    if position is not None:
        arrays["epoch_sums"] = position[1]
    skip = _parameter_keys(trainer.model) if sharded else set()  # in the shard files
    for key, value in trainer.model.named_arrays().items():
        if key not in skip:
            arrays[f"model/{key}"] = np.asarray(value)
    optimizer = trainer.optimizer if sharded else _base_optimizer(trainer.optimizer)
    optim_state = pack(optimizer.state_dict(), "optim", arrays)
    callbacks = [{"type": type(cb).__name__, "checkpointed": keeps_state(cb),
                  "state": pack(cb.state_dict(), f"callbacks/{i}", arrays)}
                 for i, cb in enumerate(trainer.callbacks)]
    meta = {
        "format": FORMAT, "version": VERSION, "epochs_done": epochs_done,
        "epoch_step": position[0] if position is not None else 0,
        "global_step": trainer.global_step, "seed": trainer.seed,
        "history": trainer.history.records, "stop_reason": trainer.stop_reason,
        "optimizer": optim_state, "callbacks": callbacks, "rng": all_rng,
        "rule": {"name": trainer.rule.name,
                 "state": pack(trainer.rule.state_dict(), "rule", arrays)},
        "model": {"name": trainer.model.name, "dtype": trainer.model.dtype.name,
                  "input_shape": list(trainer.model.input_shape or ())},
        "ranks": trainer.comm.size,
        "global_batch_size": getattr(trainer, "global_batch_size", None),
        "run": dict(run or {}),
    }
    if sharded:
        meta["sharded"] = sharded
    arrays["__meta__"] = np.array(json.dumps(meta))
    if not keep and os.path.lexists(previous_path(path)):
        os.unlink(previous_path(path))
    with atomic_open(path, fsync=True,
                     before_replace=(lambda: keep_previous(path)) if keep else None) as f:
        np.savez(f, **arrays)
    if sharded:
        remove_stale(path, meta)


def keeps_state(callback) -> bool:
    """Whether a resume needs ``callback``'s state: not for the STATELESS ones
    (TrainingCheckpoint, ProgressFile) nor for a callback with ``checkpointed = False``
    (TensorBoard), which a resume may add or drop."""
    return callback.checkpointed and type(callback).__name__ not in STATELESS


def stored_callbacks(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The callbacks with state a checkpoint's ``meta`` holds (older files have no
    "checkpointed" entry: every callback but TrainingCheckpoint)."""
    return [c for c in meta.get("callbacks", [])
            if c.get("checkpointed", True) and c["type"] not in STATELESS]


@dataclass
class Checkpoint:
    """A loaded checkpoint; ``restore(trainer)`` applies it.

    Attributes:
        path: the file it came from.
        meta: the JSON metadata (see the module doc).
        arrays: every stored array by key.
    """

    path: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(repr=False)
    bad_newest: str | None = None  # load_latest: why the newest file would not load

    @property
    def global_step(self) -> int:
        return int(self.meta["global_step"])

    def describe(self) -> str:
        """"'ck.npz' (epoch 3 step 40, global step 140)"."""
        return f"{self.path!r} ({self.where()}, global step {self.global_step})"

    def fallback_note(self, newest: str) -> str | None:
        """One line when this is the previous checkpoint because ``newest`` would not load."""
        if self.bad_newest is None:
            return None
        return (f"checkpoint {newest!r} {self.bad_newest}; using the previous one, "
                f"{self.describe()}: the steps after global step {self.global_step} are "
                "redone")

    @property
    def epochs_done(self) -> int:
        return int(self.meta["epochs_done"])

    @property
    def epoch_step(self) -> int:
        """Batches done of epoch ``epochs_done + 1`` (0: the checkpoint is at an epoch end)."""
        return int(self.meta.get("epoch_step", 0))

    @property
    def lr(self) -> float:
        """The scheduled learning rate the run continues with (the optimizer's; files
        written before the optimizer owned the rate keep it as ``meta["lr"]``, their
        optimizer's "lr" then possibly scaled by a warm-up)."""
        if "lr" in self.meta:
            return float(self.meta["lr"])
        return float(self.meta["optimizer"]["lr"])

    def where(self) -> str:
        """'epoch E' or 'epoch E step S' (1-based E: the epoch it continues)."""
        if self.epoch_step:
            return f"epoch {self.epochs_done + 1} step {self.epoch_step}"
        return f"epoch {self.epochs_done}"

    def model_arrays(self) -> dict[str, np.ndarray]:
        return {k[len("model/"):]: v for k, v in self.arrays.items() if k.startswith("model/")}

    def restore_model(self, model) -> None:
        """Copy the stored parameters and buffers into ``model`` (same architecture); a
        sharded checkpoint's parameters are in its shard files (``checkpoint_shards``)."""
        stored = self.model_arrays()
        target = model.named_arrays()
        if "sharded" in self.meta:
            params = _parameter_keys(model)
            target = {k: v for k, v in target.items() if k not in params}
        missing = sorted(set(target) - set(stored))
        extra = sorted(set(stored) - set(target))
        if missing or extra:
            raise CheckpointError(
                f"checkpoint {self.path!r} was saved from a different architecture "
                f"(model {self.meta.get('model', {}).get('name')!r}): missing {missing[:4]}, "
                f"unexpected {extra[:4]}; use the same --model as the run that wrote it")
        for key, value in target.items():
            if stored[key].shape != value.shape:
                raise CheckpointError(f"checkpoint {self.path!r}: {key!r} has shape "
                                 f"{stored[key].shape}, the model expects {value.shape}; "
                                 "use the same --model and dataset as the run that wrote it")
        for key, value in target.items():
            value[...] = stored[key]

    def restore(self, trainer, *, lr: float | None = None) -> None:
        """Put the model, optimizer (its learning rate included), history, callbacks and
        RNG states back; ``lr``: continue at this scheduled learning rate instead of the
        stored one (a resumed run given a new ``--learning_rate``).

        Raises CheckpointError naming the file when a stored state does not fit (a
        corrupt or foreign file whose metadata has the right entries of the wrong shape).
        """
        try:
            self._restore(trainer, lr)
        except CheckpointError:
            raise
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            what = " ".join(str(exc).split())[:200]
            raise CheckpointError(f"checkpoint {self.path!r} is corrupt: a stored state does "
                                  f"not fit ({type(exc).__name__}: {what}); pass the file a "
                                  "run wrote with --checkpoint") from None

    def _restore(self, trainer, lr: float | None) -> None:
        from .history import History
        meta = self.meta
        self.restore_model(trainer.model)
        sharded = is_sharded(trainer.optimizer)
        if "sharded" in meta and not sharded:
            info = meta["sharded"]
            raise CheckpointError(f"checkpoint {self.path!r} holds sharded training state "
                                  f"(stage {info.get('stage')} on {info.get('ranks')} ranks); "
                                  "resume it with --shard 1, 2 or 3 (any stage, any number "
                                  "of ranks)")
        base = trainer.optimizer if sharded else _base_optimizer(trainer.optimizer)
        state = unpack(meta["optimizer"], self.arrays)
        try:
            base.load_state_dict(state)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {self.path!r}: cannot restore the optimizer: {exc}; "
                             "resume with the same --optimizer as the run that wrote it") from None
        if "sharded" in meta:
            load_shards(self, trainer.optimizer, CheckpointError)
        # Callbacks that keep no state (TrainingCheckpoint, ProgressFile, TensorBoard): a
        # resume may add or drop one (--resume alone keeps checkpointing to the same file).
        stored_cbs = stored_callbacks(meta)
        mine_cbs = [cb for cb in trainer.callbacks if keeps_state(cb)]
        mine = [type(cb).__name__ for cb in mine_cbs]
        theirs = [c["type"] for c in stored_cbs]
        if mine != theirs:
            raise CheckpointError(f"checkpoint {self.path!r} holds the state of callbacks "
                                  f"{theirs or 'none'}, this run has {mine or 'none'}; resume "
                                  "with the same schedulers/callbacks (--lr_schedulers, "
                                  "--early_stopping, --target_metric)")
        for cb, c in zip(mine_cbs, stored_cbs):
            cb.load_state_dict(unpack(c["state"], self.arrays))
        stored_rule = meta.get("rule", {"name": "data", "state": {}})
        if stored_rule["name"] != trainer.rule.name:
            raise CheckpointError(f"checkpoint {self.path!r} was written under training rule "
                             f"{stored_rule['name']!r}, this run uses {trainer.rule.name!r}; "
                             f"resume with --parallel {stored_rule['name']}")
        trainer.rule.load_state_dict(unpack(stored_rule["state"], self.arrays))
        base.scheduled_lr = self.lr if lr is None else float(lr)
        trainer.global_step = int(meta["global_step"])
        trainer.seed = int(meta["seed"])
        trainer.history = History(meta["history"])
        trainer.epoch = max(self.epochs_done - 1, 0) if not self.epoch_step \
            else self.epochs_done
        rng = meta["rng"]
        rank = trainer.comm.rank
        if rank < len(rng):
            gens = _generators(trainer.model)
            for key, value in rng[rank].items():
                if key in gens:
                    gens[key].bit_generator.state = value


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by ``save_checkpoint``.

    Raises:
        FileNotFoundError / CheckpointError: naming the file and what is wrong with it.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist; pass the file a run "
                                "wrote with --checkpoint")
    try:
        kind = npz_kind(path)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {exc}; pass the file a run wrote with "
                              "--checkpoint (an interrupted write never replaces it)") from None
    if kind != "checkpoint":
        raise CheckpointError(f"{path!r} is not a distnn checkpoint (no __meta__ entry); a "
                              "weights file goes to --weights_and_bias_filename, not --resume")
    try:  # plain arrays only (never a pickle); the weights finite
        arrays = read_npz(path, finite=("model/",))
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {exc}; pass the file a run wrote with "
                              "--checkpoint") from None
    try:
        meta = json.loads(str(arrays.pop("__meta__")))
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a corrupt file
        raise CheckpointError(f"checkpoint {path!r} is corrupt ({type(exc).__name__}); pass "
                              "the file a run wrote with --checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT \
            or int(meta.get("version", 0)) > VERSION:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        version = meta.get("version") if isinstance(meta, dict) else None
        raise CheckpointError(f"checkpoint {path!r} has format {fmt!r} version {version!r}; "
                              f"this distnn reads {FORMAT!r} <= {VERSION}")
    problem = meta_problem(meta, arrays)
    if problem:
        raise CheckpointError(f"checkpoint {path!r} is corrupt: {problem}; pass the file a "
                              "run wrote with --checkpoint")
    return Checkpoint(path, meta, arrays)




def load_latest(path: str | os.PathLike) -> Checkpoint:
    """``load_checkpoint(path)``, or the previous checkpoint kept beside it (``ck.prev.npz``)
    when that one is missing, truncated or corrupt; ``Checkpoint.bad_newest`` says why."""
    return checkpoint_files.load_latest(path, load_checkpoint)
