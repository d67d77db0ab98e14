"""The options of the ``distnn`` command: one table, frozen config dataclasses, TOML files.

Every option is declared once in ``OPTIONS`` (name, kind, default, help, --help group,
config section, subcommands). The table builds the argparse parser, reads TOML config
files (whose keys are the same option names) and validates the dataclasses in their
``__post_init__``, so a value is checked the same way whether it comes from the command
line, a file, or Python code. Precedence: defaults < ``--config FILE`` < command line.

The value kinds are in ``cli.kinds`` and the table in ``cli.options``; this module holds
the config dataclasses, their validation and the TOML reader.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from .options import (EVAL, GROUPS, METRIC_SPELLINGS, OPTION_BY_NAME, OPTIONS, PRED, TRAIN,
                      Option, canonical)

# The kinds and the table were defined here before they had modules of their own.
from .kinds import Bool, Float, Int, Kind, List, Maybe, Shape, Str  # noqa: F401
from .options import ALL  # noqa: F401


__all__ = [
    "ConfigError", "Option", "OPTIONS", "OPTION_BY_NAME", "GROUPS", "DataConfig", "ModelConfig",
    "OptimizerConfig", "ScheduleConfig", "TrainConfig", "ParallelConfig", "OutputConfig",
    "PredictConfig", "RunConfig", "load_toml", "load_config", "resolve_values", "build_config",
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



@_section("train")
class TrainConfig:
    """Batch sizes, epochs, evaluation, history, weights and checkpoints."""


@_section("optim")
class OptimizerConfig:
    """Optimizer, its hyper-parameters (PyDTNN names), loss and metrics."""

    def _check(self):
        if self.nesterov and self.optimizer == "sgd" and self.momentum <= 0:
            raise ConfigError(f"--nesterov needs --momentum > 0, got momentum={self.momentum}")
        # PyDTNN's --loss_func lists metrics and the loss (last, after LossList.check).
        *listed, loss = self.loss_func.split(",")
        from ..nn.metrics import get_metric
        from ..training.evaluation import metric_key
        metrics: dict[str, str] = {}
        for name in [*self.metrics, *listed]:
            name = METRIC_SPELLINGS.get(name.lower(), name)
            try:
                get_metric(name)
            except ValueError as exc:
                raise ConfigError(f"--metrics: {exc}") from None
            metrics.setdefault(metric_key(name), name)
        if not metrics:
            raise ConfigError("--metrics: give at least one metric, got ''")
        object.__setattr__(self, "loss_func", loss)
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
    """Data parallelism over MPI: mode, all-reduce options, threads."""

    def _check(self):
        for name in ("enable_gpu", "enable_gpudirect", "enable_nccl"):
            if getattr(self, name):
                raise ConfigError(f"--{name}: no GPU backend in this build (distnn computes "
                                  "on CPUs with NumPy; start more ranks with mpiexec -n N "
                                  f"instead); drop --{name} or set it to false, got true")
        if self.use_blocking_mpi is not None:
            object.__setattr__(self, "non_blocking_mpi", not self.use_blocking_mpi)


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


def load_config(path: str, notes: list[str] | None = None) -> dict[str, Any]:
    """Option values from ``--config FILE``: a Theano-MPI session file (``KEY=VALUE``
    lines with RULE, MODELFILE, MODELCLASS, DEVICES...) or TOML. Notes on what the
    Theano-MPI keys do here are appended to ``notes``."""
    from . import seeds
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"--config: file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path!r}: {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    if seeds.is_session_file(text):
        try:
            values, session_notes = seeds.session_options(text, path)
        except ValueError as exc:
            raise ConfigError(f"--config: {path!r}: {exc}") from None
        if notes is not None:
            notes += session_notes
        return values
    return load_toml(path)


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


def resolve_values(given: dict[str, Any], file_values: dict[str, Any] | None = None,
                   notes: list[str] | None = None) -> dict[str, Any]:
    """Defaults < config file < command line, for every option; then the other systems'
    spellings that depend on several options (``cli.seeds.translate``), whose notes are
    appended to ``notes``."""
    from . import seeds
    values = {o.name: o.default for o in OPTIONS}
    explicit = set()
    for source in (file_values or {}, given):
        for name, value in source.items():
            values[canonical(name)] = value
            explicit.add(canonical(name))
    try:
        said = seeds.translate(values, explicit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if notes is not None:
        notes += said
    return values


def build_config(command: str, values: dict[str, Any], notes=()) -> RunConfig:
    """The validated ``RunConfig`` of ``command`` from option values by name."""
    sections = {}
    for key, cls in SECTIONS.items():
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        sections[key] = cls(**kwargs)
    return RunConfig(command=command, **sections, notes=tuple(notes))
