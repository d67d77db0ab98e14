"""Checks a run makes before its first training step, so that a bad path,
a misspelt metric or a checkpoint that does not fit is one clear line (exit status 2) on
every rank, not a traceback after hours of training:

* ``check_outputs``: every file the run will write can be written (rank 0 looks, the
  verdict is broadcast), and an existing checkpoint or output is not replaced by accident
  (only with ``--overwrite``, or by the run that ``--resume`` continues);
* ``check_weights_file``: ``--weights_and_bias_filename`` is a readable weights file;
* ``check_model_outputs``: the model outputs one value per class of the dataset;
* ``check_monitors``: metric names in callbacks exist in this run's logs;
* ``plan_resume``: what a resumed run keeps from its checkpoint (the global batch, the
  optimizer, the seed), what it applies (a new ``--learning_rate``) and what it refuses.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..fileio import check_writable, npz_kind
from .errors import RunError, agreed
from .config import PRED, TRAIN, RunConfig

__all__ = ["check_outputs", "missing_packages", "check_weights_file", "check_model_outputs",
           "check_monitors",
           "plan_resume", "ResumePlan"]


class _AnyKey(dict):
    def __missing__(self, key):
        return 0.0


def _rank0(path: str, comm, per_rank: bool) -> str:
    path = path.replace("{rank}", "0")
    return f"{path}.rank0" if per_rank and comm.size > 1 else path


def output_paths(cfg: RunConfig, comm) -> list[tuple[str, str]]:
    """(option, rank 0's file) for every file the command will write."""
    out: list[tuple[str, str]] = []
    if cfg.command == TRAIN:
        t = cfg.train
        for option, path in (("--save_weights", t.save_weights),
                             ("--checkpoint", t.checkpoint or t.resume),
                             ("--history_file", t.history_file)):
            if path:
                out.append((option, _rank0(path, comm, False)))
        if cfg.output.trace:
            out.append(("--trace", _rank0(cfg.output.trace, comm,
                                          not cfg.output.trace_merged)))
        if cfg.output.plot:
            out.append(("--plot", cfg.output.plot))
        if cfg.output.tensorboard:  # a folder: can its train/ folder get a file?
            out.append(("--tensorboard", os.path.join(cfg.output.tensorboard, "train",
                                                      "events.out.tfevents")))
        if "model_checkpoint" in cfg.sched.lr_schedulers:
            try:
                sample = cfg.sched.model_checkpoint_file.format_map(_AnyKey(epoch=1))
            except (ValueError, IndexError, KeyError, AttributeError) as exc:
                raise RunError(f"--model_checkpoint_file: {cfg.sched.model_checkpoint_file!r} "
                                f"is not a valid pattern ({exc}); write e.g. "
                                "'weights-{epoch:03d}.npz'") from None
            out.append(("--model_checkpoint_file", sample))
    if cfg.command == PRED and cfg.predict.output:
        out.append(("--output", cfg.predict.output))
    if cfg.output.cprofile:
        out.append(("--cprofile", _rank0(cfg.output.cprofile, comm, True)))
    return out


def _existing_checkpoint(cfg: RunConfig) -> str | None:
    t = cfg.train
    path = t.checkpoint or t.resume
    if not path or t.overwrite or not os.path.isfile(path):
        return None
    if t.resume and os.path.abspath(t.resume) == os.path.abspath(path):
        return None
    try:
        kind = "a checkpoint" if npz_kind(path) == "checkpoint" else "a file"
    except (OSError, ValueError):
        kind = "a file"
    return (f"--checkpoint: {path!r} already holds {kind}; pass --resume {path} to continue "
            "that run, --overwrite to replace it, or choose another file")


# Outputs a training run replaces only with --overwrite (or when it resumes: a continued
# run writes its own files again). --checkpoint: _existing_checkpoint.
_KEPT_OUTPUTS = ("--save_weights", "--history_file", "--trace", "--plot", "--cprofile")


def _existing_output(cfg: RunConfig, paths: list[tuple[str, str]]) -> str | None:
    t = cfg.train
    if t.overwrite or t.resume:
        return None
    for option, path in paths:
        if option in _KEPT_OUTPUTS and os.path.isfile(path) and os.path.getsize(path):
            return (f"{option}: {path!r} already exists; pass --overwrite to replace it, or "
                    "choose another file")
    return None


def missing_packages(cfg: RunConfig) -> str | None:
    """What to install for the outputs asked for (--tensorboard: tensorboardX, --plot:
    matplotlib), as one line naming the option; None when nothing is missing."""
    if cfg.output.tensorboard:
        from ..training.tensorboard import tensorboard_missing
        missing = tensorboard_missing()
        if missing:
            return f"--tensorboard: {missing}"
    if cfg.output.plot:
        from ..training.plots import matplotlib_missing
        missing = matplotlib_missing()
        if missing:
            return f"--plot: {missing}"
    return None


def check_outputs(cfg: RunConfig, comm) -> None:
    """Every output file can be written and none is named twice; an existing checkpoint
    is only replaced with --resume or --overwrite. Rank 0 checks; RunError on all ranks."""
    paths = output_paths(cfg, comm)

    def verdict() -> None:
        if cfg.command == TRAIN:
            refused = _existing_checkpoint(cfg) or _existing_output(cfg, paths)
            if refused:
                raise RunError(refused)
            missing = missing_packages(cfg)
            if missing:
                raise RunError(missing)
        seen: dict[str, str] = {}
        for option, path in paths:
            full = os.path.abspath(path)
            if full in seen:
                raise RunError(f"{seen[full]} and {option} both write {path!r}; give them "
                               "different files")
            seen[full] = option
            reason = check_writable(path)
            if reason is not None:
                raise RunError(f"{option}: cannot write {path!r}: {reason}")

    agreed(comm, None, verdict, root=0)


def check_weights_file(cfg: RunConfig, comm) -> None:
    """--weights_and_bias_filename is a complete .npz of arrays (not a checkpoint)."""
    path = cfg.model.weights_and_bias_filename
    if not path:
        return
    option = "--weights_and_bias_filename"

    def check() -> None:
        if path.endswith(".weights.h5"):  # Keras's save_weights: a Keras model loads it
            if not os.path.isfile(path):
                raise ValueError(f"weights file {path!r} does not exist")
            return
        try:
            kind = npz_kind(path)
        except FileNotFoundError:
            raise ValueError(f"weights file {path!r} does not exist; pass the file "
                             "--save_weights wrote") from None
        except ValueError as exc:
            raise ValueError(f"weights file {exc}; pass the file --save_weights wrote") from None
        if kind == "checkpoint":
            hint = ("continue that run with --resume " + path if cfg.command == TRAIN else
                    "write its weights with distnn train --resume " + path +
                    " --num_epochs 0 --save_weights w.npz")
            raise ValueError(f"{path!r} is a training checkpoint, not a weights file; {hint}")

    agreed(comm, option, check)


def check_model_outputs(cfg: RunConfig, model, dataset) -> None:
    """A model that outputs a vector per sample outputs one value per class of
    ``dataset`` (else the loss fails mid-epoch on the first label it cannot hold). Every
    rank has the same model and dataset sizes, so every rank raises the same RunError."""
    shape = tuple(getattr(model, "output_shape", None) or ())
    classes = int(getattr(dataset, "num_classes", 0) or 0)
    vocab = getattr(dataset, "vocab_size", None)
    if vocab is not None and len(shape) == 2 and shape[-1] < vocab:
        raise RunError(f"--model {cfg.model.model}: the model scores {shape[-1]} tokens per "
                       f"position but the data's vocabulary ({cfg.data.dataset}, --tokenizer "
                       f"{cfg.data.tokenizer}) has {vocab}: its tokens would lie outside the "
                       f"model's vocabulary; make its last layer output {vocab} (the zoo's "
                       "models take num_classes=)")
    if len(shape) != 1 or not classes or shape[0] == classes:
        return
    raise RunError(f"--model {cfg.model.model}: the model outputs {shape[0]} values per "
                   f"sample but the dataset ({cfg.data.dataset}) has {classes} classes; make "
                   f"its last layer output {classes} (a model file's build_model() or "
                   "get_model() may take num_classes=)")


_MONITORED = (  # (scheduler that uses it, option naming the metric)
    ("early_stopping", "early_stopping_metric"),
    ("reduce_lr_on_plateau", "reduce_lr_on_plateau_metric"),
    ("stop_at_loss", "stop_at_loss_metric"),
)


def check_monitors(cfg: RunConfig, keys: list[str]) -> None:
    """Every metric a callback watches is one this run logs (``keys``); the
    model_checkpoint file pattern uses only logged keys."""
    from ..training.callback_base import resolve_key
    s = cfg.sched
    checks: list[tuple[str, str]] = []
    for scheduler, option in _MONITORED:
        if scheduler in s.lr_schedulers and not (scheduler == "early_stopping"
                                                 and s.early_stopping):
            checks.append((f"--{option}", getattr(s, option)))
    if "model_checkpoint" in s.lr_schedulers and s.model_checkpoint_best_only:
        checks.append(("--model_checkpoint_metric", s.model_checkpoint_metric))
    for option, spec in (("--early_stopping", s.early_stopping),
                         ("--target_metric", s.target_metric)):
        if spec:
            checks.append((option, str(spec).split(",")[0].strip()))
    for option, name in checks:
        try:
            resolve_key(name, keys)
        except ValueError as exc:
            raise RunError(f"{option}: {exc}") from None
    if "model_checkpoint" in s.lr_schedulers:
        from ..training.stopping import ModelCheckpoint
        try:
            ModelCheckpoint(s.model_checkpoint_file).file_for(0, {k: 0.0 for k in keys})
        except ValueError as exc:
            raise RunError(f"--model_checkpoint_file: {exc}") from None


# -- resume -------------------------------------------------------------------------------
# Optimizer hyper-parameter -> the option that sets it.
_HP_OPTION = {"momentum": "momentum", "nesterov": "nesterov", "weight_decay": "decay",
              "betas": "beta1", "eps": "epsilon", "alpha": "rho", "rho": "rho"}


@dataclass
class ResumePlan:
    """What a resumed run uses. ``cfg`` holds the values in effect (for the header)."""

    cfg: RunConfig
    global_batch_size: int
    batch_size: int
    lr: float
    notes: list[str] = field(default_factory=list)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _uses(model, kind: str) -> bool:
    return any(kind in type(layer).__name__ for layer in model.walk())


def plan_resume(cfg: RunConfig, comm, explicit: set[str], state, trainer) -> ResumePlan:
    """Compare the run's settings with the checkpoint ``state`` (``Checkpoint``): keep its
    global batch (re-deriving the per-rank batch), optimizer settings and seed; take an
    explicitly given new --learning_rate (``plan.lr``: ``fit(resume_lr=plan.lr)`` sets it
    on the optimizer after the restore; the checkpoint is not changed); refuse explicit
    changes that cannot be honoured. Raises RunError naming the option and the fix."""
    from ..training.checkpoint import keeps_state, stored_callbacks
    meta, path = state.meta, state.path
    # first: under another rule the optimizer may be the rule's own (diloco's inner one)
    stored_rule = (meta.get("rule") or {}).get("name", "data")
    if stored_rule != trainer.rule.name:
        raise RunError(f"--parallel {cfg.parallel.parallel}: {path} was trained under "
                        f"training rule {stored_rule}; resume with --parallel {stored_rule}")
    notes = _resume_optimizer(cfg, explicit, state, trainer)
    seed = int(meta.get("seed", cfg.model.random_seed))
    if seed != cfg.model.random_seed and "random_seed" in explicit:
        raise RunError(f"--random_seed {cfg.model.random_seed}: {path} was trained with seed "
                        f"{seed}, which a resumed run keeps; drop --random_seed")
    lr, base_lr = _resume_lr(cfg, explicit, state, trainer.lr, notes)
    stored_gbs, local = _resume_batch(cfg, comm, explicit, state, trainer, notes)

    rule_note = getattr(trainer.rule, "resume_note", None)
    if rule_note is not None:
        note = rule_note((meta.get("rule") or {}).get("state") or {}, comm.size)
        if note:
            notes.append(note)

    stored_cbs = [c["type"] for c in stored_callbacks(meta)]
    mine_cbs = [type(cb).__name__ for cb in trainer.callbacks if keeps_state(cb)]
    if stored_cbs != mine_cbs:
        raise RunError(f"--lr_schedulers: {path} holds the state of callbacks "
                        f"{stored_cbs or 'none'}, this run has {mine_cbs or 'none'}; resume "
                        "with the same --lr_schedulers, --early_stopping and --target_metric")
    t = cfg.train
    eff = dataclasses.replace(
        cfg, train=dataclasses.replace(t, global_batch_size=stored_gbs, batch_size=local),
        optim=dataclasses.replace(cfg.optim, learning_rate=base_lr),
        model=dataclasses.replace(cfg.model, random_seed=seed))
    return ResumePlan(eff, stored_gbs, local, lr, notes)


def _resume_optimizer(cfg: RunConfig, explicit: set[str], state, trainer) -> list[str]:
    """Refuse another model or optimizer than the checkpoint's, or explicitly changed
    optimizer settings; notes for the settings kept from it."""
    from ..training.checkpoint import unpack
    meta, path = state.meta, state.path
    run = meta.get("run") or {}
    notes: list[str] = []
    stored_model = (meta.get("model") or {}).get("name")
    if stored_model and stored_model != trainer.model.name:
        theirs = run.get("model", stored_model)
        raise RunError(f"--model {cfg.model.model}: {path} holds a {theirs} model; resume "
                        f"with --model {theirs}")
    base = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    stored_opt = meta["optimizer"]
    if stored_opt.get("optimizer") != getattr(base, "name", None):
        theirs = run.get("optimizer", stored_opt.get("optimizer"))
        raise RunError(f"--optimizer {cfg.optim.optimizer}: {path} was trained with "
                        f"{theirs}; resume with --optimizer {theirs}")
    stored_hp = unpack(stored_opt.get("hyperparameters") or {}, state.arrays)
    mine_hp = base.hyperparameters()
    for key in sorted(set(stored_hp) | set(mine_hp)):
        if _same(stored_hp.get(key), mine_hp.get(key)):
            continue
        option = _HP_OPTION.get(key, key)
        if option in explicit or (key == "betas" and "beta2" in explicit):
            raise RunError(f"--{option}: {path} was trained with {key}={stored_hp.get(key)}, "
                            f"this run asks for {mine_hp.get(key)}; a resumed run keeps the "
                            f"optimizer's settings: drop --{option}, or start a new run")
        notes.append(f"{key}={stored_hp.get(key)} kept from {path}")
    return notes


def _resume_lr(cfg: RunConfig, explicit: set[str], state, built_lr: float,
               notes: list[str]) -> tuple[float, float]:
    """(the rate to set after the restore, the run's base --learning_rate): the
    checkpoint's scheduled rate, or an explicitly given new one (``built_lr``: the rate
    the optimizer was built with, --learning_rate times ``lr_factor``)."""
    path, run = state.path, state.meta.get("run") or {}
    stored_lr = run.get("learning_rate")
    lr = state.lr
    base_lr = stored_lr if stored_lr is not None else cfg.optim.learning_rate
    if "learning_rate" in explicit and (stored_lr is None
                                        or cfg.optim.learning_rate != stored_lr):
        new = built_lr
        notes.append(f"learning rate {new:.6g} applied from --learning_rate (the checkpoint's "
                     f"scheduled rate was {lr:.6g})")
        return new, cfg.optim.learning_rate
    if stored_lr is not None and stored_lr != cfg.optim.learning_rate:
        notes.append(f"learning rate {lr:.6g} continues from {path} (run with "
                     f"--learning_rate {stored_lr}; give --learning_rate to change it)")
    return lr, base_lr


def _resume_batch(cfg: RunConfig, comm, explicit: set[str], state, trainer,
                  notes: list[str]) -> tuple[int, int]:
    """(the checkpoint's global batch, the per-rank batch from it on this run's ranks);
    refuses an explicit batch that would change the global one."""
    from ..training.evaluation import resolve_batch_sizes
    meta, path = state.meta, state.path
    run = meta.get("run") or {}
    shards = comm.size
    data_shard = getattr(trainer.rule, "data_shard", None)
    if data_shard is not None:
        shards = data_shard(trainer)[1]
    t = cfg.train
    _, mine_gbs = resolve_batch_sizes(t.batch_size, t.global_batch_size, shards)
    stored_gbs = meta.get("global_batch_size") or run.get("global_batch_size")
    stored_ranks = meta.get("ranks")
    if not stored_gbs:
        stored_gbs = mine_gbs
        notes.append(f"{path} records no global batch; using {mine_gbs}")
    if t.global_batch_size is not None and t.global_batch_size != stored_gbs:
        raise RunError(f"--global_batch_size {t.global_batch_size}: {path} was trained with "
                        f"global batch {stored_gbs}, which a resumed run keeps; drop "
                        "--global_batch_size, or start a new run")
    if ("batch_size" in explicit and t.global_batch_size is None and mine_gbs != stored_gbs
            and stored_ranks == comm.size):
        raise RunError(f"--batch_size {t.batch_size}: that is global batch {mine_gbs} on "
                        f"{comm.size} rank(s), but {path} was trained with global batch "
                        f"{stored_gbs}, which a resumed run keeps; drop --batch_size (the "
                        "per-rank batch is derived from the global one), or start a new run")
    local = -(-stored_gbs // shards)
    if mine_gbs != stored_gbs or (stored_ranks and stored_ranks != comm.size):
        split = (f"{local} per rank" if stored_gbs % shards == 0 else
                 f"{stored_gbs // shards} to {local} per rank")
        text = (f"global batch {stored_gbs} kept from {path} (written on {stored_ranks} "
                f"rank(s)); on {comm.size} rank(s) that is {split}")
        if stored_ranks and stored_ranks != comm.size:
            why = ["each update is the same sum over the same global batch, equal to the "
                   "original run up to floating-point rounding"]
            if _uses(trainer.model, "Dropout"):
                why.append("dropout masks are drawn per rank, so they differ")
            if _uses(trainer.model, "BatchNorm") and not cfg.parallel.sync_batchnorm:
                why.append("batch-norm statistics are per rank (--sync_batchnorm makes them "
                           "global)")
            text += "; " + "; ".join(why)
        notes.append(text)
    return stored_gbs, local
