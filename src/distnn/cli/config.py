"""The options of the ``distnn`` command: one table, frozen config dataclasses, TOML files.

Every option is declared once in ``OPTIONS`` (name, kind, default, help, --help group,
config section, subcommands). The table builds the argparse parser, reads TOML config
files (whose keys are the same option names) and validates the dataclasses in their
``__post_init__``, so a value is checked the same way whether it comes from the command
line, a file, or Python code. Precedence: defaults < ``--config FILE`` < command line.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

__all__ = [
    "ConfigError", "Option", "OPTIONS", "OPTION_BY_NAME", "GROUPS", "DataConfig", "ModelConfig",
    "OptimizerConfig", "ScheduleConfig", "TrainConfig", "ParallelConfig", "OutputConfig",
    "PredictConfig", "RunConfig", "load_toml", "resolve_values", "build_config",
]


class ConfigError(ValueError):
    """A bad option value: the message names the option, the rule and the value."""


# -- kinds of values -----------------------------------------------------------------------
class Kind:
    """Parses a command-line string and checks a value from anywhere (TOML, Python)."""

    metavar = "VALUE"

    def parse(self, text: str) -> Any:
        return self.check(text)

    def check(self, value: Any) -> Any:
        return value


class Int(Kind):
    metavar = "N"

    def __init__(self, low: int = 1):
        self.low = low

    def parse(self, text):
        try:
            return self.check(int(text))
        except ValueError:
            raise ValueError(f"must be an integer >= {self.low}, got {text!r}") from None

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low:
            raise ValueError(f"must be an integer >= {self.low}, got {value!r}")
        return int(value)


class Float(Kind):
    metavar = "X"

    def __init__(self, low: float = 0.0, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        lo = "(" if low_open else "["
        hi = ")" if high_open or high == math.inf else "]"
        self.rule = f"must be a number in {lo}{low:g}, {high:g}{hi}"

    def parse(self, text):
        try:
            return self.check(float(text))
        except (TypeError, ValueError):
            raise ValueError(f"{self.rule}, got {text!r}") from None

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{self.rule}, got {value!r}")
        v = float(value)
        ok = (not math.isnan(v) and (v > self.low if self.low_open else v >= self.low)
              and (v < self.high if self.high_open else v <= self.high))
        if not ok:
            raise ValueError(f"{self.rule}, got {value!r}")
        return v


class Bool(Kind):
    metavar = "BOOL"
    TRUE = {"true", "yes", "on", "1", "y", "t"}
    FALSE = {"false", "no", "off", "0", "n", "f"}

    def parse(self, text):
        low = str(text).strip().lower()
        if low in self.TRUE:
            return True
        if low in self.FALSE:
            return False
        raise ValueError(f"must be true or false, got {text!r}")

    def check(self, value):
        if isinstance(value, str):
            return self.parse(value)
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value


class Str(Kind):
    metavar = "TEXT"

    def __init__(self, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
                 metavar: str | None = None, lower: bool = True):
        self._choices, self.lower = choices, lower
        if metavar:
            self.metavar = metavar

    @property
    def choices(self):
        c = self._choices() if callable(self._choices) else self._choices
        return sorted(c) if c is not None else None

    def check(self, value):
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {value!r}")
        choices = self.choices
        if choices is not None:
            key = value.lower().replace("-", "_") if self.lower else value
            if key not in choices:
                raise ValueError(f"must be one of {', '.join(choices)}; got {value!r}")
            return key
        if not value:
            raise ValueError("must not be empty, got ''")
        return value


class List(Kind):
    """Comma-separated names on the command line; a list (or such a string) in TOML."""

    metavar = "A,B"

    def __init__(self, choices: Callable[[], Sequence[str]] | Sequence[str] | None = None):
        self._choices = choices

    def check(self, value):
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = [v.strip() for v in value if v.strip()]
        else:
            raise ValueError(f"must be comma-separated names, got {value!r}")
        choices = self._choices() if callable(self._choices) else self._choices
        if choices is not None:
            items = [v.lower().replace("-", "_") for v in items]
            bad = [v for v in items if v not in choices]
            if bad:
                raise ValueError(f"must list names from {', '.join(sorted(choices))}; got "
                                 f"{', '.join(bad)!r}")
        return tuple(items)


class Shape(Kind):
    metavar = "C,H,W"

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = [int(v) for v in value.replace("x", ",").split(",")]
            except ValueError:
                raise ValueError(f"must be positive integers like 1,28,28, got {value!r}") from None
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                           for v in value)):
            raise ValueError(f"must be positive integers like 1,28,28, got {value!r}")
        return tuple(value)


class Maybe(Kind):
    """Another kind that also accepts None ('' or 'none' on the command line)."""

    def __init__(self, inner: Kind):
        self.inner = inner
        self.metavar = inner.metavar

    def parse(self, text):
        return None if str(text).strip().lower() in ("", "none") else self.inner.parse(text)

    def check(self, value):
        return None if value is None else self.inner.check(value)


# -- registries the choices come from (imported lazily: --help stays fast) ---------------
def _models():
    from ..models import MODELS
    return MODELS


def _datasets():
    from ..data import DATASETS
    return DATASETS


def _optimizers():
    from ..optim import OPTIMIZERS
    return OPTIMIZERS


def _losses():
    from ..nn.losses import LOSSES
    return LOSSES


def _schedulers():
    from ..callbacks import CALLBACKS
    return CALLBACKS


# -- the option table -----------------------------------------------------------------------
TRAIN, EVAL, PRED = "train", "evaluate", "predict"
ALL = (TRAIN, EVAL, PRED)


@dataclass(frozen=True)
class Option:
    """One option: ``--name`` (also ``--name-with-dashes`` and ``aliases``) and config key."""

    name: str
    kind: Kind
    default: Any
    help: str
    group: str
    section: str
    commands: tuple[str, ...] = ALL
    aliases: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        names = [self.name, *self.aliases]
        out = []
        for n in names:
            for spelling in (n, n.replace("_", "-")):
                if f"--{spelling}" not in out:
                    out.append(f"--{spelling}")
        return out


GROUPS = {
    "model": "Model", "data": "Dataset", "train": "Training", "optim": "Optimizer",
    "sched": "Learning-rate schedulers and callbacks", "parallel": "Parallel execution",
    "output": "Output, profiling and tracing", "predict": "Prediction",
}

_O = Option
OPTIONS: list[Option] = [
    # Model
    _O("model", Str(_models), "simplecnn", "Model of the zoo (simplecnn, simplemlp, lenet, "
       "alexnet, vgg16, resnet20, ...).", "model", "model"),
    _O("dtype", Str(("float32", "float64")), "float32", "Floating-point type of weights and "
       "data.", "model", "model"),
    _O("weights_and_bias_filename", Maybe(Str(metavar="FILE")), None, "Load weights and "
       "biases from this .npz before training/evaluating (required by evaluate and predict).",
       "model", "model", aliases=("weights",)),
    _O("random_seed", Int(0), 0, "Seed of the initial weights, shuffles and augmentation.",
       "model", "model", aliases=("seed",)),
    # Dataset
    _O("dataset", Str(_datasets), "fashion_mnist", "Dataset: fashion_mnist, mnist, cifar10, "
       "imagenet, hdf5, digits, synthetic.", "data", "data"),
    _O("dataset_path", Maybe(Str(metavar="PATH")), None, "Folder (or file) of the "
       "dataset; default: the usual places (/usr/share/datasets, $DISTNN_DATA, the cache).",
       "data", "data", aliases=("dataset_train_path",)),
    _O("dataset_test_path", Maybe(Str(metavar="PATH")), None, "Read the test split "
       "from this folder instead of --dataset_path.", "data", "data"),
    _O("test_as_validation", Bool(), False, "Validate on the test split after every epoch "
       "(instead of a part of the training set).", "data", "data"),
    _O("validation_split", Float(0.0, 1.0, high_open=True), 0.2, "Fraction of the training "
       "set (from its end) held out for validation after every epoch (ignored with "
       "--test_as_validation).", "data", "data", (TRAIN,)),
    _O("flip_images", Bool(), False, "Randomly flip training images horizontally.", "data",
       "data", (TRAIN,)),
    _O("flip_images_prob", Float(0.0, 1.0), 0.5, "Probability of a flip.", "data", "data",
       (TRAIN,)),
    _O("crop_images", Bool(), False, "Randomly shift training images (pad and crop back).",
       "data", "data", (TRAIN,)),
    _O("crop_images_padding", Int(1), 4, "Zero pixels padded on each side before the "
       "random crop.", "data", "data", (TRAIN,), aliases=("crop_images_size",)),
    _O("crop_images_prob", Float(0.0, 1.0), 0.5, "Probability of a crop.", "data", "data",
       (TRAIN,)),
    _O("download", Bool(), True, "Download the dataset when it is not found (mnist, "
       "fashion_mnist, cifar10).", "data", "data"),
    _O("normalize", Bool(), True, "Scale stored pixel values to [0, 1].", "data", "data"),
    _O("prefetch", Bool(), True, "Prepare the next batch in a background thread.", "data",
       "data"),
    _O("train_list", Maybe(Str(metavar="FILE")), None, "hdf5: text file listing the "
       "training HDF5 files.", "data", "data"),
    _O("val_list", Maybe(Str(metavar="FILE")), None, "hdf5: list of validation files.",
       "data", "data"),
    _O("test_list", Maybe(Str(metavar="FILE")), None, "hdf5: list of test files.",
       "data", "data"),
    _O("features_name", Str(lower=False), "features", "hdf5: dataset name of the features.",
       "data", "data"),
    _O("labels_name", Str(lower=False), "labels", "hdf5: dataset name of the labels.",
       "data", "data"),
    _O("input_shape", Maybe(Shape()), None, "synthetic: per-sample shape C,H,W (default "
       "1,28,28).", "data", "data"),
    _O("num_classes", Maybe(Int(1)), None, "synthetic/hdf5: number of classes.", "data",
       "data"),
    _O("num_samples", Maybe(Int(1)), None, "synthetic: number of training samples.",
       "data", "data"),
    # Training
    _O("batch_size", Int(1), 64, "Batch size PER RANK (global = batch_size x ranks).",
       "train", "train"),
    _O("global_batch_size", Maybe(Int(1)), None, "Global batch size over all ranks "
       "(overrides --batch_size).", "train", "train"),
    _O("num_epochs", Int(0), 3, "Number of epochs (in total, when resuming).", "train",
       "train", (TRAIN,), aliases=("epochs",)),
    _O("steps_per_epoch", Int(0), 0, "Use at most this many batches per epoch (0: all); "
       "evaluation is trimmed alike.", "train", "train"),
    _O("evaluate", Bool(), True, "Evaluate on the test split after training.", "train",
       "train", (TRAIN,)),
    _O("evaluate_only", Bool(), False, "Only evaluate the model (with "
       "--weights_and_bias_filename) on the test split.", "train", "train", (TRAIN,)),
    _O("history_file", Maybe(Str(metavar="FILE")), None, "Write the per-epoch history "
       "here (JSON, or CSV for a .csv name).", "train", "train", (TRAIN,)),
    _O("save_weights", Maybe(Str(metavar="FILE")), None, "Write the final weights "
       "(.npz) here (rank 0).", "train", "train", (TRAIN,)),
    _O("checkpoint", Maybe(Str(metavar="FILE")), None, "Write the full training state "
       "here every --checkpoint_freq epochs (atomic; for --resume).", "train", "train",
       (TRAIN,)),
    _O("checkpoint_freq", Int(1), 1, "Epochs between full-state checkpoints.", "train",
       "train", (TRAIN,)),
    _O("resume", Maybe(Str(metavar="FILE")), None, "Continue the run saved in this "
       "checkpoint (same model, optimizer and schedulers).", "train", "train", (TRAIN,)),
    _O("shuffle", Bool(), True, "Shuffle the training set every epoch.", "train", "train",
       (TRAIN,)),
    # Optimizer
    _O("optimizer", Str(_optimizers), "sgd", "Optimizer: sgd, rmsprop, adam, adamw, nadam, "
       "adadelta.", "optim", "optim", (TRAIN,)),
    _O("learning_rate", Float(0.0), 0.01, "Learning rate.", "optim", "optim", (TRAIN,),
       aliases=("lr",)),
    _O("learning_rate_scaling", Bool(), False, "Multiply the learning rate by the number of "
       "ranks (use with warm-up).", "optim", "optim", (TRAIN,)),
    _O("momentum", Float(0.0), 0.9, "Momentum (sgd, rmsprop).", "optim", "optim", (TRAIN,),
       aliases=("optimizer_momentum",)),
    _O("nesterov", Bool(), False, "Nesterov momentum (sgd).", "optim", "optim", (TRAIN,)),
    _O("decay", Maybe(Float(0.0)), None, "Weight decay (default: the optimizer's own).",
       "optim", "optim", (TRAIN,), aliases=("weight_decay",)),
    _O("beta1", Maybe(Float(0.0, 1.0, high_open=True)), None, "beta1 (adam, adamw, "
       "nadam; default 0.9).", "optim", "optim", (TRAIN,)),
    _O("beta2", Maybe(Float(0.0, 1.0, high_open=True)), None, "beta2 (adam, adamw, "
       "nadam; default 0.999).", "optim", "optim", (TRAIN,)),
    _O("epsilon", Maybe(Float(0.0, low_open=True)), None, "epsilon (rmsprop, adam*, "
       "nadam, adadelta; default: the optimizer's own).", "optim", "optim", (TRAIN,)),
    _O("rho", Maybe(Float(0.0, 1.0, high_open=True)), None, "rho (rmsprop's alpha, "
       "adadelta; default: the optimizer's own).", "optim", "optim", (TRAIN,)),
    _O("loss_func", Str(_losses), "categorical_cross_entropy", "Loss: "
       "categorical_cross_entropy, binary_cross_entropy, mse, mae.", "optim", "optim"),
    _O("metrics", List(), ("categorical_accuracy",), "Comma-separated metrics: "
       "categorical_accuracy, top5, categorical_hinge, categorical_mse, categorical_mae, mse, "
       "mae.", "optim", "optim"),
    # Schedulers and callbacks
    _O("lr_schedulers", List(_schedulers), (), "Comma-separated: warm_up, early_stopping, "
       "reduce_lr_on_plateau, reduce_lr_every_nepochs, stop_at_loss, model_checkpoint.",
       "sched", "sched", (TRAIN,), aliases=("schedulers",)),
    _O("warm_up_epochs", Float(0.0), 5.0, "warm_up: epochs of linear warm-up.", "sched",
       "sched", (TRAIN,)),
    _O("warm_up_batches", Int(0), 0, "warm_up: batches of linear warm-up (overrides "
       "--warm_up_epochs).", "sched", "sched", (TRAIN,)),
    _O("early_stopping", Maybe(Str(lower=False, metavar="SPEC")), None, "NNLO syntax "
       "'metric,op,patience', e.g. 'val_loss,~<,4' ('~' compares the mean of the last "
       "patience epochs with the patience before; '<'/'>' compare with the best).", "sched",
       "sched", (TRAIN,)),
    _O("early_stopping_metric", Str(lower=False), "val_loss", "early_stopping: metric.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_patience", Int(1), 10, "early_stopping: epochs without improvement.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_min_delta", Float(0.0), 0.0, "early_stopping: minimum improvement.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_restore_best", Bool(), False, "early_stopping: restore the weights "
       "of the best epoch at the end.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_metric", Str(lower=False), "val_loss", "reduce_lr_on_plateau: "
       "metric.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_factor", Float(0.0, 1.0, True, True), 0.1,
       "reduce_lr_on_plateau: new_lr = lr * factor.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_patience", Int(1), 5, "reduce_lr_on_plateau: epochs without "
       "improvement.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_min_lr", Float(0.0), 0.0, "reduce_lr_on_plateau: lower bound.",
       "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_factor", Float(0.0, 1.0, low_open=True), 0.1,
       "reduce_lr_every_nepochs: new_lr = lr * factor.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_nepochs", Int(1), 5, "reduce_lr_every_nepochs: period in "
       "epochs.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_min_lr", Float(0.0), 0.0, "reduce_lr_every_nepochs: lower "
       "bound.", "sched", "sched", (TRAIN,)),
    _O("stop_at_loss_metric", Str(lower=False), "val_accuracy", "stop_at_loss: metric.",
       "sched", "sched", (TRAIN,)),
    _O("stop_at_loss_threshold", Float(-math.inf), 0.0, "stop_at_loss: stop once the metric "
       "reaches this value (>= for accuracies, <= for losses).", "sched", "sched", (TRAIN,)),
    _O("target_metric", Maybe(Str(lower=False, metavar="SPEC")), None, "NNLO syntax "
       "'metric,op,value', e.g. 'val_acc,>,0.97': stop when reached.", "sched", "sched",
       (TRAIN,)),
    _O("model_checkpoint_metric", Str(lower=False), "val_loss", "model_checkpoint: metric "
       "for --model_checkpoint_best_only.", "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_save_freq", Int(1), 2, "model_checkpoint: epochs between saves.",
       "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_best_only", Bool(), False, "model_checkpoint: save only when the "
       "metric improved.", "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_file", Str(lower=False, metavar="PATTERN"),
       "checkpoint-{epoch:03d}.npz", "model_checkpoint: weights file name ({epoch} and "
       "logged keys are filled in).", "sched", "sched", (TRAIN,)),
    # Parallel execution
    _O("parallel", Str(("auto", "sequential", "data")), "auto", "sequential (one process), "
       "data (data parallelism over MPI ranks) or auto (data when started with mpiexec -n "
       "N>1).", "parallel", "parallel"),
    _O("non_blocking_mpi", Bool(), True, "Overlap the gradient all-reduce with backward.",
       "parallel", "parallel", (TRAIN,)),
    _O("bucket_size_mb", Float(0.0), 4.0, "Gradient all-reduce bucket size in MiB.",
       "parallel", "parallel", (TRAIN,)),
    _O("sync_batchnorm", Bool(), False, "Batch-norm statistics over the global batch.",
       "parallel", "parallel", (TRAIN,)),
    _O("gradient_compression", Str(("none", "fp16")), "none", "Gradients travel as: none "
       "(own dtype) or fp16.", "parallel", "parallel", (TRAIN,)),
    _O("threads", Int(0), 0, "BLAS threads per rank (0: 1 per rank with several ranks, "
       "else the library default).", "parallel", "parallel"),
    # Output
    _O("quiet", Bool(), False, "No progress bars, parameters or summary; only results.",
       "output", "output"),
    _O("profile", Bool(), False, "Per-layer forward/backward time and all-reduce wait per "
       "epoch (printed on rank 0).", "output", "output", (TRAIN,)),
    _O("trace", Maybe(Str(metavar="FILE")), None, "Write a Chrome-trace JSON of layer "
       "forward/backward and communication (rank r writes FILE.rank{r}).", "output",
       "output", (TRAIN,)),
    _O("trace_merged", Bool(), False, "Gather the traces of all ranks into the one --trace "
       "FILE.", "output", "output", (TRAIN,)),
    _O("cprofile", Maybe(Str(metavar="FILE")), None, "Dump cProfile statistics here "
       "(FILE.rank{r} with several ranks).", "output", "output"),
    _O("traceback", Bool(), False, "Show Python tracebacks for user errors too.", "output",
       "output"),
    # Prediction
    _O("split", Str(("train", "val", "test")), "test", "Split to predict.", "predict",
       "predict", (PRED,)),
    _O("output", Maybe(Str(metavar="FILE")), None, "Predictions file: .npy (logits), "
       ".npz (logits, predicted, labels) or .csv (index, predicted, label).", "predict",
       "predict", (PRED,)),
]
OPTION_BY_NAME = {o.name: o for o in OPTIONS}
_ALIAS = {a: o.name for o in OPTIONS for a in o.aliases}


def canonical(key: str) -> str:
    """Option name of a command-line or TOML key (dashes, aliases accepted)."""
    k = key.strip().lstrip("-").replace("-", "_")
    return _ALIAS.get(k, k)


def _check_section(obj) -> None:
    """Validate (and normalize) every field of a config dataclass through its option."""
    for f in fields(obj):
        option = OPTION_BY_NAME[f.name]
        value = getattr(obj, f.name)
        try:
            value = option.kind.check(value)
        except ValueError as exc:
            raise ConfigError(f"--{f.name}: {exc}") from None
        object.__setattr__(obj, f.name, value)


def _section(name: str):
    """Decorator: a frozen dataclass whose fields are the options of config section
    ``name``, with their defaults, validated in ``__post_init__``."""

    def wrap(cls):
        cls.__annotations__ = {o.name: Any for o in OPTIONS if o.section == name}
        for o in OPTIONS:
            if o.section == name:
                setattr(cls, o.name, o.default)
        user_post = cls.__dict__.get("_check")

        def __post_init__(self):
            _check_section(self)
            if user_post is not None:
                user_post(self)

        cls.__post_init__ = __post_init__
        return dataclass(frozen=True)(cls)

    return wrap


@_section("model")
class ModelConfig:
    """Model name, dtype, initial weights and the run's seed."""


@_section("data")
class DataConfig:
    """Dataset, paths, validation, augmentation and reader options."""



@_section("train")
class TrainConfig:
    """Batch sizes, epochs, evaluation, history, weights and checkpoints."""


@_section("optim")
class OptimizerConfig:
    """Optimizer, its hyper-parameters (PyDTNN names), loss and metrics."""

    def _check(self):
        if self.nesterov and self.optimizer == "sgd" and self.momentum <= 0:
            raise ConfigError(f"--nesterov needs --momentum > 0, got momentum={self.momentum}")
        if not self.metrics:
            raise ConfigError("--metrics: give at least one metric, got ''")
        from ..metrics import get_metric
        for name in self.metrics:
            try:
                get_metric(name)
            except ValueError as exc:
                raise ConfigError(f"--metrics: {exc}") from None


@_section("sched")
class ScheduleConfig:
    """LR schedulers and callbacks and their parameters."""

    def _check(self):
        from ..callbacks import parse_early_stopping, parse_target_metric
        for spec, parse in ((self.early_stopping, parse_early_stopping),
                            (self.target_metric, parse_target_metric)):
            if spec is not None:
                try:
                    parse(spec)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None


@_section("parallel")
class ParallelConfig:
    """Data parallelism over MPI: mode, all-reduce options, threads."""


@_section("output")
class OutputConfig:
    """Verbosity, profiling and tracing."""


@_section("predict")
class PredictConfig:
    """What ``distnn predict`` writes."""


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``distnn`` command needs, by section."""

    command: str
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    optim: OptimizerConfig
    sched: ScheduleConfig
    parallel: ParallelConfig
    output: OutputConfig
    predict: PredictConfig

    def __post_init__(self):
        needs_weights = self.command in (EVAL, PRED) or self.train.evaluate_only
        if needs_weights and not self.model.weights_and_bias_filename:
            what = "--evaluate_only" if self.command == TRAIN else f"distnn {self.command}"
            raise ConfigError(f"--weights_and_bias_filename: {what} needs a weights file, "
                              "got none")
        if self.command == PRED and not self.predict.output:
            raise ConfigError("--output: distnn predict needs an output file (.npy, .npz or "
                              ".csv), got none")
        if self.train.resume and self.model.weights_and_bias_filename:
            raise ConfigError("--resume restores the weights itself; drop "
                              "--weights_and_bias_filename")

    def items(self) -> list[tuple[str, list[tuple[str, Any]]]]:
        """(group title, [(option, value)]) for the options of this command, for printing."""
        out: dict[str, list] = {}
        for o in OPTIONS:
            if self.command in o.commands:
                out.setdefault(GROUPS[o.group], []).append(
                    (o.name, getattr(getattr(self, o.section), o.name)))
        return list(out.items())


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
            "optim": OptimizerConfig, "sched": ScheduleConfig, "parallel": ParallelConfig,
            "output": OutputConfig, "predict": PredictConfig}


def load_toml(path: str) -> dict[str, Any]:
    """Option values from a TOML file: top-level keys, or keys inside one level of tables
    (e.g. ``[optimizer]``; the table names are only for grouping). Keys are option names
    (dashes or underscores). Values are checked like command-line values."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config: file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path!r} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if isinstance(v, dict):
                raise ConfigError(f"--config: {path!r}: table [{key}.{k}] is nested too deep; "
                                  "use top-level keys or one level of tables")
            name = canonical(k)
            if name not in OPTION_BY_NAME:
                raise ConfigError(f"--config: {path!r}: unknown option {k!r}; keys are the "
                                  "command-line option names (see distnn train --help)")
            if name in flat:
                raise ConfigError(f"--config: {path!r}: option {name!r} is set twice")
            try:
                flat[name] = OPTION_BY_NAME[name].kind.check(v)
            except ValueError as exc:
                raise ConfigError(f"--config: {path!r}: {name}: {exc}") from None
    return flat


def resolve_values(given: dict[str, Any],
                   file_values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults < config file < command line, for every option."""
    values = {o.name: o.default for o in OPTIONS}
    for source in (file_values or {}, given):
        for name, value in source.items():
            values[canonical(name)] = value
    return values


def build_config(command: str, values: dict[str, Any]) -> RunConfig:
    """The validated ``RunConfig`` of ``command`` from option values by name."""
    sections = {}
    for key, cls in SECTIONS.items():
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        sections[key] = cls(**kwargs)
    return RunConfig(command=command, **sections)
