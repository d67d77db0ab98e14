"""The sections of a run's configuration that say what is trained: the model, the data,
the training loop, the optimizer and the learning-rate schedule; and what every section
is made of (``option``, ``Section``, ``ConfigError``). The sections that say how the run
goes and what it writes are in ``execution``; ``config`` assembles them (``RunConfig``)
and is where to import them from.

Each field is one option of the ``distnn`` command, with its type, default, help and kind
written here, once; a field's kind (``run.kinds``) checks and normalizes its value in
``__post_init__``, whether it comes from the command line, a TOML file or Python.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .kinds import (Bool, FileList, Float, Int, KeyValues, Kind, List, Maybe,
                    ModelSpec, Shape, Str, datasets, losses, models, optimizers,
                    schedulers)

TRAIN, EVAL, PRED = "train", "evaluate", "predict"
ALL = (TRAIN, EVAL, PRED)


class ConfigError(ValueError):
    """A bad option value: the message names the option, the rule and the value."""


def option(default: Any, kind: Kind, help: str, *, commands: tuple[str, ...] | None = None,
           aliases: tuple[str, ...] = (), argument: str | None = None) -> Any:
    """A config field that is an option: ``--NAME`` (also with dashes, and ``--ALIAS``),
    the key ``NAME`` in TOML files. ``kind`` parses and checks its values; ``commands``
    take it (default: those of its section, ``Section.commands``); ``argument``: the
    training rule's constructor argument it sets, when that is not the field's own name
    (``ParallelConfig.rule_arguments``)."""
    meta = {"kind": kind, "help": help, "commands": commands, "aliases": aliases}
    if argument is not None:
        meta["argument"] = argument
    return field(default=default, metadata=meta)


class Section:
    """Base of the section dataclasses: ``__post_init__`` checks every field by its kind
    (the error names the option); ``title`` heads the section's options in ``--help``;
    ``commands`` take its options, but those that name their own (``option(commands=)``)."""

    title: ClassVar[str] = ""
    commands: ClassVar[tuple[str, ...]] = ALL

    @classmethod
    def commands_of(cls, f) -> tuple[str, ...]:
        """The commands that take the option of field ``f``."""
        return f.metadata["commands"] or cls.commands

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                value = f.metadata["kind"].check(getattr(self, f.name))
            except ValueError as exc:
                raise ConfigError(f"--{f.name}: {exc}") from None
            object.__setattr__(self, f.name, value)


@dataclass(frozen=True)
class ModelConfig(Section):
    """Model name, dtype, initial weights and the run's seed."""

    title: ClassVar[str] = "Model"
    model: str = option("simplecnn", ModelSpec(models),
        "Model of the zoo (simplecnn, simplemlp, lenet, alexnet, vgg16, resnet20, ...), or your "
        "own: FILE.py (calls its build_model() or get_model()), FILE.py:NAME or MODULE:NAME, "
        "returning a distnn Sequential or a torch.nn.Module.")
    dtype: str = option("float32", Str(("float32", "float64")),
        "Floating-point type of weights and data.")
    weights_and_bias_filename: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Load weights and biases from this .npz before training/evaluating (required by "
        "evaluate and predict).", aliases=("weights",))
    random_seed: int = option(0, Int(0),
        "Seed of the initial weights, shuffles and augmentation.", aliases=("seed",))
    model_args: tuple[tuple[str, Any], ...] = option((), KeyValues(),
        "Keyword arguments for the --model file's callable: NAME=VALUE,... (e.g. "
        "dense=100,dropout=0.25); distnn search sets the keys of its space that are the "
        "callable's parameters, not options.")
    engine: str = option("auto", Str(("auto", "distnn", "torch")),
        "Engine that runs the model: auto (distnn's layers on distnn's engine, a "
        "torch.nn.Module on PyTorch); distnn (a torch module's layers converted to distnn's, "
        "through ONNX: docs/interchange.md); torch (distnn's layers as a torch module).")


@dataclass(frozen=True)
class DataConfig(Section):
    """Dataset, paths, validation, augmentation and reader options."""

    title: ClassVar[str] = "Dataset"
    dataset: str = option("fashion_mnist", Str(datasets),
        "Dataset: fashion_mnist, mnist, cifar10, imagenet, hdf5, digits, synthetic, text "
        "(UTF-8 files as token windows; default corpus: Debian's fortunes).")
    dataset_path: str | None = option(None, Maybe(Str(metavar="PATH")),
        "Folder (or file) of the dataset; default: the usual places (/usr/share/datasets, "
        "$DISTNN_DATA, the cache).")
    dataset_test_path: str | None = option(None, Maybe(Str(metavar="PATH")),
        "Read the test split from this folder instead of --dataset_path.")
    test_as_validation: bool = option(False, Bool(),
        "Validate on the test split after every epoch (instead of a part of the training set).")
    validation_split: float | None = option(None, Maybe(Float(0.0, 1.0, high_open=True)),
        "Fraction of the training set (from its end) held out for validation after every epoch "
        "(ignored with --test_as_validation); none: 0.2, or 0 when the dataset has its own "
        "validation files (hdf5 --val_list).", commands=(TRAIN, PRED))
    flip_images: bool = option(False, Bool(),
        "Randomly flip training images horizontally.", commands=(TRAIN,))
    flip_images_prob: float = option(0.5, Float(0.0, 1.0),
        "Probability of a flip.", commands=(TRAIN,))
    crop_images: bool = option(False, Bool(),
        "Randomly shift training images (pad and crop back).", commands=(TRAIN,))
    crop_images_padding: int = option(4, Int(1),
        "Zero pixels padded on each side before the random crop.", commands=(TRAIN,))
    crop_images_prob: float = option(0.5, Float(0.0, 1.0),
        "Probability of a crop.", commands=(TRAIN,))
    crop_images_padding_mode: str = option(
        "constant", Str(("constant", "symmetric", "reflect", "edge")),
        "What the crop's padding holds: constant (zeros), symmetric (the border mirrored, "
        "SINGA's augmentation), reflect or edge.", commands=(TRAIN,))
    download: bool = option(True, Bool(),
        "Download the dataset when it is not found (mnist, fashion_mnist, cifar10).")
    normalize: bool = option(True, Bool(),
        "Scale stored pixel values to [0, 1].")
    prefetch: bool = option(True, Bool(),
        "Prepare the next batch in a background thread.")
    train_list: str | tuple[str, ...] | None = option(None, Maybe(FileList()),
        "hdf5: text file listing the training HDF5 files (implies --dataset hdf5). With several "
        "ranks each rank reads only its part: whole files when there are at least as many files "
        "as ranks, else its rows of each file.")
    val_list: str | tuple[str, ...] | None = option(None, Maybe(FileList()),
        "hdf5: list of validation files.")
    test_list: str | tuple[str, ...] | None = option(None, Maybe(FileList()),
        "hdf5: list of test files.")
    features_name: str = option("features", Str(lower=False),
        "hdf5: dataset name of the features.")
    labels_name: str = option("labels", Str(lower=False),
        "hdf5: dataset name of the labels.")
    data_layout: str = option("auto", Str(("auto", "nchw", "nhwc")),
        "hdf5: the layout images are given to the model in: nchw (channels-last files are "
        "transposed), nhwc (as channels-last files store them, for models written for NHWC "
        "input); auto: nhwc when the --model file sets data_layout = 'nhwc', else nchw.")
    input_shape: tuple[int, ...] | None = option(None, Maybe(Shape()),
        "synthetic: per-sample shape C,H,W (default 1,28,28).")
    num_classes: int | None = option(None, Maybe(Int(1, 1 << 24)),
        "synthetic/hdf5: number of classes.")
    num_samples: int | None = option(None, Maybe(Int(1)),
        "synthetic: number of training samples.")
    # text (data/text.py): windows of tokens for language models
    context: int = option(128, Int(1),
        "text: tokens per sample (the model's sequence length); targets are the same "
        "window shifted by one token.")
    tokenizer: str = option("bytes", Str(("bytes", "char", "bpe")),
        "text: bytes (UTF-8 bytes, 256 ids), char (the training text's characters) or bpe "
        "(byte-level BPE learned from the training text; needs pip install 'distnn[text]').")
    vocab_size: int | None = option(None, Maybe(Int(1)),
        "text: bpe: the vocabulary to learn (default 1024); char: pad the vocabulary to this "
        "size; bytes: at most 256.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.validation_split is None:  # hdf5 --val_list, text: own validation data
            object.__setattr__(self, "validation_split",
                               0.0 if self.val_list or self.dataset == "text" else 0.2)
        if self.data_layout == "nhwc" and (self.flip_images or self.crop_images):
            raise ConfigError("--flip_images and --crop_images work on NCHW images; drop them "
                              "or use --data_layout nchw (got --data_layout nhwc)")


@dataclass(frozen=True)
class TrainConfig(Section):
    """Batch sizes, epochs, evaluation, history, weights and checkpoints."""

    title: ClassVar[str] = "Training"
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    batch_size: int = option(64, Int(1),
        "Batch size PER RANK (global = batch_size x ranks).", commands=ALL)
    global_batch_size: int | None = option(None, Maybe(Int(1)),
        "Global batch size over all ranks (overrides --batch_size).", commands=ALL)
    num_epochs: int = option(3, Int(0),
        "Number of epochs (in total, when resuming).")
    steps_per_epoch: int = option(0, Int(0),
        "Use at most this many batches per epoch (0: all); evaluation is trimmed alike.",
        commands=ALL)
    evaluate: bool | None = option(None, Maybe(Bool()),
        "true: evaluate on the test split before and after training (PyDTNN); false: never; "
        "none: after training only.")
    evaluate_only: bool = option(False, Bool(),
        "Only evaluate the model (with --weights_and_bias_filename) on the test split.")
    history_file: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Write the per-epoch history here (JSON, or CSV for a .csv name).")
    validate_every: int = option(0, Int(0),
        "NNLO: also validate every N updates (0: only after each epoch); the results are "
        "printed on rank 0.")
    save_weights: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Write the final weights (.npz) here (rank 0).")
    weights_layout: str = option("distnn", Str(("distnn", "pydtnn")),
        "Layout of the --save_weights file: distnn ('layer/name' keys) or pydtnn (PyDTNN's "
        "'1_Conv2D_w' keys, which PyDTNN loads; --weights_and_bias_filename reads either).")
    every_rank_writes: bool = option(False, Bool(),
        "Every rank writes its own copy of --history_file and --save_weights, and the first "
        "rank of every node its node's --checkpoint (for node-local disks; '{rank}' in a name "
        "is replaced by the rank); default: rank 0 writes them.")
    checkpoint: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Write the full training state here every --checkpoint_freq epochs (atomic; for "
        "--resume).")
    checkpoint_freq: int = option(1, Int(1),
        "Epochs between full-state checkpoints.",
        aliases=("checkpoint_interval",))
    checkpoint_steps: int = option(0, Int(0),
        "Also write the checkpoint every N training steps (0: only at epoch ends); a resume "
        "continues mid-epoch at the exact batch, so a restart redoes at most N steps "
        "(synchronous rules).")
    progress_file: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Rank 0 keeps this file holding 'global_step epoch epoch_step global_batch' after every "
        "step (distnn launch reads it to say how many samples a restart redoes).")
    resume: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Continue the run saved in this checkpoint (same model, optimizer and schedulers; keeps "
        "its global batch) and keep checkpointing to it (unless --checkpoint names another "
        "file).")
    overwrite: bool = option(False, Bool(),
        "Replace an existing --checkpoint file, or an existing --save_weights, --history_file, "
        "--trace, --plot or --cprofile file (without it, a run refuses to start over a file "
        "it does not --resume).")
    ignore_nan: bool = option(False, Bool(),
        "Keep training when the loss becomes NaN or infinite (default: stop at the first such "
        "step, exit status 3).")
    shuffle: bool = option(True, Bool(),
        "Shuffle the training set every epoch.")


@dataclass(frozen=True)
class OptimizerConfig(Section):
    """Optimizer, its hyper-parameters (PyDTNN names), loss and metrics."""

    title: ClassVar[str] = "Optimizer"
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    optimizer: str = option("sgd", Str(optimizers),
        "Optimizer: sgd, rmsprop, adam, adamw, nadam, adadelta.")
    learning_rate: float = option(0.01, Float(0.0),
        "Learning rate.", aliases=("lr",))
    learning_rate_scaling: bool = option(False, Bool(),
        "Multiply the learning rate by the number of ranks (use with warm-up).")
    lr_per_sample: bool = option(False, Bool(),
        "--learning_rate is a rate per sample (PyDTNN's meaning): each step applies it divided "
        "by the global batch size (batch_size x ranks). distnn train --like pydtnn sets it "
        "(a note says so); give true or false to decide.")
    momentum: float = option(0.9, Float(0.0),
        "Momentum (sgd, rmsprop).")
    nesterov: bool = option(False, Bool(),
        "Nesterov momentum (sgd).")
    decay: float | None = option(None, Maybe(Float(0.0)),
        "Weight decay (default: the optimizer's own).",
        aliases=("weight_decay",))
    beta1: float | None = option(None, Maybe(Float(0.0, 1.0, high_open=True)),
        "beta1 (adam, adamw, nadam; default 0.9).")
    beta2: float | None = option(None, Maybe(Float(0.0, 1.0, high_open=True)),
        "beta2 (adam, adamw, nadam; default 0.999).")
    epsilon: float | None = option(None, Maybe(Float(0.0, low_open=True)),
        "epsilon (rmsprop, adam*, nadam, adadelta; default: the optimizer's own).")
    rho: float | None = option(None, Maybe(Float(0.0, 1.0, high_open=True)),
        "rho (rmsprop's alpha, adadelta; default: the optimizer's own).")
    clip_grad_norm: float | None = option(None, Maybe(Float(0.0, low_open=True)),
        "Clip the gradients of every step to this global L2 norm (after the all-reduce: every "
        "rank clips the same sum).")
    loss_func: str = option("categorical_cross_entropy", Str(losses),
        "Loss: categorical_cross_entropy, binary_cross_entropy, mse, mae. mse, mae and bce "
        "train on one-hot labels.", commands=ALL)
    metrics: tuple[str, ...] = option(("categorical_accuracy",), List(),
        "Comma-separated metrics: categorical_accuracy (acc), top5, categorical_hinge, "
        "categorical_mse, categorical_mae, mse, mae.", commands=ALL)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nesterov and self.optimizer == "sgd" and self.momentum <= 0:
            raise ConfigError(f"--nesterov needs --momentum > 0, got momentum={self.momentum}")
        from ..nn.metrics import get_metric
        from ..training.evaluation import metric_key
        metrics: dict[str, str] = {}
        for name in self.metrics:
            try:
                get_metric(name)
            except ValueError as exc:
                raise ConfigError(f"--metrics: {exc}") from None
            metrics.setdefault(metric_key(name), name)
        if not metrics:
            raise ConfigError("--metrics: give at least one metric, got ''")
        object.__setattr__(self, "metrics", tuple(metrics.values()))


@dataclass(frozen=True)
class ScheduleConfig(Section):
    """LR schedulers and callbacks and their parameters."""

    title: ClassVar[str] = "Learning-rate schedulers and callbacks"
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    lr_schedulers: tuple[str, ...] = option((), List(schedulers),
        "Comma-separated: warm_up, early_stopping, reduce_lr_on_plateau, "
        "reduce_lr_every_nepochs, stop_at_loss, model_checkpoint.")
    lr_schedule: str = option("constant", Str(("constant", "cosine")),
        "Learning rate over the steps: constant, or cosine (decay to --min_lr_ratio of it at "
        "the last step); both after --warmup_steps of linear warm-up.")
    warmup_steps: int = option(0, Int(0),
        "--lr_schedule: steps of linear warm-up.")
    min_lr_ratio: float = option(0.0, Float(0.0, 1.0),
        "--lr_schedule cosine: the fraction of the learning rate left at the end.")
    warm_up_epochs: float = option(5.0, Float(0.0),
        "warm_up: epochs of linear warm-up.")
    warm_up_batches: int = option(0, Int(0),
        "warm_up: batches of linear warm-up (overrides --warm_up_epochs).")
    early_stopping: str | None = option(None, Maybe(Str(lower=False, metavar="SPEC")),
        "NNLO syntax 'metric,op,patience', e.g. 'val_loss,~<,4' ('~' compares the mean of the "
        "last patience epochs with the patience before; '<'/'>' compare with the best).")
    early_stopping_metric: str = option("val_loss", Str(lower=False),
        "early_stopping: metric.")
    early_stopping_patience: int = option(10, Int(1),
        "early_stopping: epochs without improvement.")
    early_stopping_min_delta: float = option(0.0, Float(0.0),
        "early_stopping: minimum improvement.")
    early_stopping_restore_best: bool = option(False, Bool(),
        "early_stopping: restore the weights of the best epoch at the end.")
    reduce_lr_on_plateau_metric: str = option("val_loss", Str(lower=False),
        "reduce_lr_on_plateau: metric.")
    reduce_lr_on_plateau_factor: float = option(0.1, Float(0.0, 1.0, True, True),
        "reduce_lr_on_plateau: new_lr = lr * factor.")
    reduce_lr_on_plateau_patience: int = option(5, Int(1),
        "reduce_lr_on_plateau: epochs without improvement.")
    reduce_lr_on_plateau_min_lr: float = option(0.0, Float(0.0),
        "reduce_lr_on_plateau: lower bound.")
    reduce_lr_every_nepochs_factor: float = option(0.1, Float(0.0, 1.0, low_open=True),
        "reduce_lr_every_nepochs: new_lr = lr * factor.")
    reduce_lr_every_nepochs_nepochs: int = option(5, Int(1),
        "reduce_lr_every_nepochs: period in epochs.")
    reduce_lr_every_nepochs_min_lr: float = option(0.0, Float(0.0),
        "reduce_lr_every_nepochs: lower bound.")
    stop_at_loss_metric: str = option("val_accuracy", Str(lower=False),
        "stop_at_loss: metric.")
    stop_at_loss_threshold: float | None = option(None, Maybe(Float(-math.inf)),
        "stop_at_loss: stop once the metric reaches this value (>= for accuracies, <= for "
        "losses); required by stop_at_loss.")
    target_metric: str | None = option(None, Maybe(Str(lower=False, metavar="SPEC")),
        "NNLO syntax 'metric,op,value', e.g. 'val_acc,>,0.97': stop when reached.")
    model_checkpoint_metric: str = option("val_loss", Str(lower=False),
        "model_checkpoint: metric for --model_checkpoint_best_only.")
    model_checkpoint_save_freq: int = option(2, Int(1),
        "model_checkpoint: epochs between saves.")
    model_checkpoint_best_only: bool = option(False, Bool(),
        "model_checkpoint: save only when the metric improved.")
    model_checkpoint_file: str = option(
        "checkpoint-{epoch:03d}.npz", Str(lower=False, metavar="PATTERN"),
        "model_checkpoint: weights file name ({epoch} and logged keys are filled in).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if "warm_up" in self.lr_schedulers and (self.lr_schedule != "constant"
                                                or self.warmup_steps):
            raise ConfigError(f"--lr_schedulers warm_up and --lr_schedule {self.lr_schedule} "
                              f"--warmup_steps {self.warmup_steps} both set the learning rate's "
                              "warm-up; keep one (--warmup_steps with --lr_schedule)")
        from ..training.callbacks import parse_early_stopping, parse_target_metric
        for spec, parse in ((self.early_stopping, parse_early_stopping),
                            (self.target_metric, parse_target_metric)):
            if spec is not None:
                try:
                    parse(spec)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
