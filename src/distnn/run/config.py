"""The configuration of a run: frozen dataclasses, one per section of ``run.options``.

A section's fields are the options of that section (``OPTIONS``), with their defaults,
validated in ``__post_init__`` by the option's kind, so a value is checked the same way
whether it comes from the command line, a TOML file or Python code::

    cfg = build_config("train", {"model": "lenet", "num_epochs": 2})
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .options import EVAL, GROUPS, OPTION_BY_NAME, OPTIONS, PRED, TRAIN, Option, canonical


__all__ = [
    "ConfigError", "Option", "OPTIONS", "OPTION_BY_NAME", "GROUPS", "DataConfig", "ModelConfig",
    "OptimizerConfig", "ScheduleConfig", "TrainConfig", "ParallelConfig", "OutputConfig",
    "PredictConfig", "RunConfig", "load_toml", "option_values", "build_config",
]


class ConfigError(ValueError):
    """A bad option value: the message names the option, the rule and the value."""


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

    def _check(self):
        if self.validation_split is None:  # hdf5 --val_list has its own validation files
            object.__setattr__(self, "validation_split", 0.0 if self.val_list else 0.2)
        if self.data_layout == "nhwc" and (self.flip_images or self.crop_images):
            raise ConfigError("--flip_images and --crop_images work on NCHW images; drop them "
                              "or use --data_layout nchw (got --data_layout nhwc)")



@_section("train")
class TrainConfig:
    """Batch sizes, epochs, evaluation, history, weights and checkpoints."""


@_section("optim")
class OptimizerConfig:
    """Optimizer, its hyper-parameters (PyDTNN names), loss and metrics."""

    def _check(self):
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


@_section("sched")
class ScheduleConfig:
    """LR schedulers and callbacks and their parameters."""

    def _check(self):
        from ..training.callbacks import parse_early_stopping, parse_target_metric
        for spec, parse in ((self.early_stopping, parse_early_stopping),
                            (self.target_metric, parse_target_metric)):
            if spec is not None:
                try:
                    parse(spec)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None


@_section("parallel")
class ParallelConfig:
    """Data parallelism over MPI: training rule and its options, all-reduce, threads."""


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
    notes: tuple[str, ...] = field(default=(), compare=False)

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

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The options that describe this run (the main ones and those not at their
        default; not where its outputs go), JSON-able, then ``extra`` (e.g. ranks): what a
        history file and TensorBoard record, and what ``distnn plot`` labels runs with."""
        out: dict[str, Any] = {}
        for o in OPTIONS:
            if self.command not in o.commands or o.section in ("output", "predict") \
                    or o.name in NOT_DESCRIBING:
                continue
            value = getattr(getattr(self, o.section), o.name)
            if value == o.default and o.name not in DESCRIBING:
                continue
            out[o.name] = list(value) if isinstance(value, tuple) else value
        out.update(extra)
        return out

    def items(self) -> list[tuple[str, list[tuple[str, Any]]]]:
        """(group title, [(option, value)]) for the options of this command, for printing."""
        out: dict[str, list] = {}
        for o in OPTIONS:
            if self.command in o.commands:
                out.setdefault(GROUPS[o.group], []).append(
                    (o.name, getattr(getattr(self, o.section), o.name)))
        return list(out.items())


# Options in every run's summary, and options that say where outputs go, not what ran.
DESCRIBING = ("model", "dataset", "parallel", "num_epochs", "batch_size", "optimizer",
              "learning_rate")
NOT_DESCRIBING = ("dataset_path", "dataset_test_path", "history_file", "save_weights",
                  "every_rank_writes", "checkpoint", "checkpoint_freq", "resume", "overwrite",
                  "weights_and_bias_filename", "model_checkpoint_file", "download", "prefetch")

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
            "optim": OptimizerConfig, "sched": ScheduleConfig, "parallel": ParallelConfig,
            "output": OutputConfig, "predict": PredictConfig}


def _option(key: str) -> Option | None:
    return OPTION_BY_NAME.get(canonical(key))


def load_toml(path: str, lookup: Callable[[str], Option | None] = _option, keep=(),
              keys: str = "the command-line option names (see distnn train --help)",
              what: str = "--config") -> dict[str, Any]:
    """Option values from a TOML file: top-level keys, or keys inside one level of tables
    (e.g. ``[optimizer]``; the table names are only for grouping). ``lookup`` gives the
    option of a key (default: distnn's names, dashes or underscores, aliases). Values are
    checked like command-line values. The tables named in ``keep`` (``[space]``) are
    returned as they are, under their name."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what}: file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what}: {path!r} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {name: raw.pop(name) for name in keep if name in raw}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if isinstance(v, dict):
                raise ConfigError(f"{what}: {path!r}: table [{key}.{k}] is nested too deep; "
                                  "use top-level keys or one level of tables")
            option = lookup(k)
            if option is None:
                raise ConfigError(f"{what}: {path!r}: unknown option {k!r}; keys are {keys}")
            if option.name in flat:
                raise ConfigError(f"{what}: {path!r}: option {option.name!r} is set twice")
            try:
                flat[option.name] = option.kind.check(v)
            except ValueError as exc:
                raise ConfigError(f"{what}: {path!r}: {option.name}: {exc}") from None
    return flat


def option_values(given: dict[str, Any]) -> dict[str, Any]:
    """Every option's default, replaced by ``given`` (option names or aliases)."""
    values = {o.name: o.default for o in OPTIONS}
    values.update({canonical(k): v for k, v in given.items()})
    return values


def build_config(command: str, values: dict[str, Any], notes=()) -> RunConfig:
    """The validated ``RunConfig`` of ``command`` from option values by name."""
    sections = {}
    for key, cls in SECTIONS.items():
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        sections[key] = cls(**kwargs)
    return RunConfig(command=command, **sections, notes=tuple(notes))
