"""``distnn search``: hyper-parameter search over blocks of MPI ranks.

The command takes every option of ``distnn train`` (the base configuration of each
candidate) and the options of the "Search" group below (NNLO's spellings too:
``--block-size``, ``--num-iterations``, ``--n-fold``, ``--checkpoint-interval``,
``--opt-restore``). The searched options and their ranges come from ``--space FILE`` or
the ``[space]`` table of ``--config FILE`` (see ``distnn.search.space``), else
``search.DEFAULT_SPACE``. Each candidate is trained exactly as ``distnn train`` would
train it, so ``distnn train --config best.toml`` on a block's rank count repeats the best
trial.

This module holds the options, the parser and ``SearchConfig`` (with the TOML and space
reading); running the study and writing the reports is in ``distnn.cli.search_run``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..run import (OPTION_BY_NAME, ConfigError, Option, RunConfig, build_config,
                   load_toml)
from ..run.config import read_toml
from ..run.kinds import Bool, Int, Maybe, Str
from ..run.options import TRAIN
from ..models.files import check_model_args, is_model_spec
from . import compat
from .options import (_argtype, _default_text, add_options, aliases_of, given_options,
                      resolve_values)

SEARCH = "search"

# Options of distnn train that mean nothing per candidate (search writes its own outputs),
# or that search defines its own way (--checkpoint DIR, --resume).
EXCLUDED = ("checkpoint", "checkpoint_freq", "resume", "overwrite", "save_weights",
            "history_file", "evaluate", "evaluate_only", "profile", "trace", "trace_merged",
            "tracing", "cprofile", "trial_name", "validate_every", "plot")
# Written to best.toml even when they have their default value.
ALWAYS_WRITTEN = ("model", "dataset", "num_epochs", "random_seed", "batch_size",
                  "learning_rate", "optimizer")

_S = Option
SEARCH_OPTIONS: list[Option] = [
    _S("block_size", Int(1), 1, "Ranks per block; each block trains one candidate at a time, "
       "data-parallel. Run 1 + blocks x block_size ranks.", SEARCH, SEARCH, (SEARCH,)),
    _S("num_iterations", Int(1), 10, "Number of trials (candidates) in the study, in total "
       "(a resumed study counts its finished ones).", SEARCH, SEARCH, (SEARCH,),
       aliases=("n_trials",)),
    _S("n_fold", Int(1), 1, "Train each candidate on K folds of the training set (inside its "
       "block) and score it by the mean (1: train once, validate on --validation_split).",
       SEARCH, SEARCH, (SEARCH,)),
    _S("objective", Str(lower=False, metavar="METRIC[,min|max]"), "val_loss", "Logged value "
       "scored at the last epoch, e.g. val_loss or val_accuracy,max (default direction: max "
       "for accuracies, min otherwise).", SEARCH, SEARCH, (SEARCH,)),
    _S("space", Maybe(Str(lower=False, metavar="FILE")), None, "TOML file with the [space] "
       "table (default: the [space] table of --config, else learning_rate, optimizer and "
       "batch_size).", SEARCH, SEARCH, (SEARCH,)),
    _S("sampler", Str(("tpe", "random", "grid")), "tpe", "optuna sampler.", SEARCH, SEARCH,
       (SEARCH,)),
    _S("pruner", Str(("none", "median")), "none", "Stop candidates whose objective after an "
       "epoch is worse than the median of earlier trials (median).", SEARCH, SEARCH,
       (SEARCH,)),
    _S("checkpoint", Maybe(Str(lower=False, metavar="DIR")), None, "Save the study in "
       "DIR/study.db (an optuna SQLite storage).", SEARCH, SEARCH, (SEARCH,)),
    _S("checkpoint_interval", Int(1), 1, "Save the study after every N finished trials (and "
       "at the end).", SEARCH, SEARCH, (SEARCH,)),
    _S("resume", Bool(), False, "Continue the study saved in --checkpoint DIR (same trial "
       "numbers; finished trials are not run again).", SEARCH, SEARCH, (SEARCH,)),
    _S("output_dir", Maybe(Str(lower=False, metavar="DIR")), None, "Folder of best.toml, "
       "trials.json and objective.png (default: the --checkpoint DIR, else search_results).",
       SEARCH, SEARCH, (SEARCH,)),
    _S("study_name", Str(lower=False, metavar="NAME"), "distnn-search", "Name of the optuna "
       "study.", SEARCH, SEARCH, (SEARCH,)),
]
SEARCH_BY_NAME = {o.name: o for o in SEARCH_OPTIONS}
_SEARCH_ALIAS = {**{a: o.name for o in SEARCH_OPTIONS for a in o.aliases},
                 **compat.SEARCH_ALIASES}


def _search_name(key: str) -> str | None:
    k = key.strip().lstrip("-").replace("-", "_")
    k = _SEARCH_ALIAS.get(k, k)
    return k if k in SEARCH_BY_NAME else None


# -- the parser ----------------------------------------------------------------------------
_INSTEAD = {
    "checkpoint_freq": "the study is saved every --checkpoint_interval N trials",
    "resume": "--resume (NNLO: --opt-restore) continues the study in --checkpoint DIR",
    "evaluate": "candidates are scored on validation data (--objective)",
    "evaluate_only": "candidates are scored on validation data (--objective)",
}


class _Rejected(argparse.Action):
    """A train option that has no meaning for search: an error that says so."""

    def __call__(self, parser, namespace, values, option_string=None):
        instead = _INSTEAD.get(self.dest, "distnn search writes best.toml, trials.json and "
                               "objective.png (see --output_dir)")
        parser.error(f"{option_string} is an option of distnn train; here {instead}")


def _flags(option: Option) -> list[str]:
    return option.flags(tuple(a for a, n in compat.SEARCH_ALIASES.items() if n == option.name))


def add_search_parser(sub) -> argparse.ArgumentParser:
    """Add the ``search`` subcommand to the ``distnn`` subparsers."""
    text = "hyper-parameter search over blocks of MPI ranks (optuna)"
    p = sub.add_parser(SEARCH, help=text, description=text[0].upper() + text[1:] + ". "
                       "Takes the options of distnn train as the base configuration of every "
                       "candidate.", argument_default=argparse.SUPPRESS, allow_abbrev=False,
                       conflict_handler="resolve")
    add_options(p, TRAIN)
    group = p.add_argument_group("Search")
    for option in SEARCH_OPTIONS:
        extra: dict[str, Any] = {"nargs": "?", "const": True} if isinstance(option.kind, Bool) \
            else {}
        choices = getattr(option.kind, "choices", None)
        text = f" Choices: {', '.join(choices)}." if choices else ""
        group.add_argument(*_flags(option), dest=f"search_{option.name}", type=_argtype(option),
                           metavar=option.kind.metavar, help=f"{option.help}{text} Default: "
                           f"{_default_text(option.default)}.", **extra)
    # conflict_handler="resolve": the flags above took over train's --checkpoint and
    # --resume; the other flags of the excluded train options now say they do not apply.
    taken = {f for o in SEARCH_OPTIONS for f in _flags(o)}
    for name in EXCLUDED:
        option = compat.option_of(name)
        if option is None or TRAIN not in option.commands:
            continue
        flags = [f for f in option.flags(aliases_of(name)) if f not in taken]
        if flags:
            p.add_argument(*flags, dest=name, nargs="?", action=_Rejected,
                           help=argparse.SUPPRESS)
    return p


# -- the configuration ---------------------------------------------------------------------
@dataclass(frozen=True)
class SearchConfig:
    """Everything ``distnn search`` needs: the base configuration of the candidates, the
    search settings and the space."""

    base: RunConfig
    values: dict
    settings: Any
    space: Any
    space_from: str
    output_dir: str
    resume: bool
    study_name: str
    objective_spec: str
    notes: tuple[str, ...] = ()


def _search_or_train_option(key: str) -> Option | None:
    name = _search_name(key)
    if name:
        return SEARCH_BY_NAME[name]
    option = compat.option_of(key)
    return None if option is None or option.name in EXCLUDED else option


def load_search_toml(path: str) -> tuple[dict, dict, dict | None]:
    """(train option values, search option values, [space] table or None) of a ``--config``
    file: keys are option names (one level of tables for grouping), plus ``[space]``."""
    flat = load_toml(path, _search_or_train_option, keep=("space",),
                     keys="the option names of distnn search --help, and [space]")
    space = flat.pop("space", None)
    search = {k: v for k, v in flat.items() if k in SEARCH_BY_NAME}
    return {k: v for k, v in flat.items() if k not in search}, search, space


def _check_param(name: str, value: Any) -> Any:
    option = OPTION_BY_NAME.get(compat.name_of(name))
    return value if option is None else option.kind.check(value)  # None: a model argument


def _space_table(table: Any, where: str, model: str = "") -> dict:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table like learning_rate = {{log_uniform = "
                          f"[1e-4, 1e-1]}}, got {table!r}")
    out = {}
    model_keys = [k for k in table if OPTION_BY_NAME.get(compat.name_of(k)) is None]
    if model_keys and is_model_spec(model):  # the model file's own hyper-parameters
        try:
            check_model_args(model, model_keys)
        except ValueError as exc:
            raise ConfigError(f"{where}: {model_keys} are not options of distnn train, so "
                              f"they go to the model file's callable: {exc}") from None
    for key, value in table.items():
        name = compat.name_of(key)
        option = OPTION_BY_NAME.get(name)
        if key in model_keys and is_model_spec(model):
            out[key] = value
            continue
        if option is None or TRAIN not in option.commands:
            raise ConfigError(f"{where}: {key!r} is not an option of distnn train; the keys "
                              "of [space] are option names (e.g. learning_rate, optimizer, "
                              "batch_size, momentum), or with --model FILE.py parameters of "
                              "its model callable (NNLO's get_model(**args))")
        if name in EXCLUDED or name == "parallel":
            raise ConfigError(f"{where}: --{name} cannot be searched (it is not a property "
                              "of one candidate)")
        if name in out:
            raise ConfigError(f"{where}: {name!r} is given twice")
        out[name] = value
    return out


def _model_ranges(model: str) -> tuple[dict, str] | None:
    """(space table, where) of a model file's NNLO ``parameter_range``, else None."""
    if not (is_model_spec(model) and model.split(":")[0].endswith(".py")):
        return None
    from ..models.ranges import space_table
    try:
        table = space_table(model)
    except ValueError as exc:
        error = ConfigError(str(exc))
        error.local = getattr(exc, "local", False)  # a module missing on this rank
        raise error from None
    return None if table is None else (table, f"--model {model}: parameter_range")


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The validated ``SearchConfig`` of a parsed ``distnn search`` command line."""
    from ..search import DEFAULT_SPACE, SearchSettings, SearchSpace, parse_objective
    from ..training.evaluation import metric_key
    given = given_options(args, TRAIN, EXCLUDED)
    file_train, file_search, file_space = {}, {}, None
    config_file = getattr(args, "config", None)
    if config_file:
        file_train, file_search, file_space = load_search_toml(config_file)
    s = {o.name: o.default for o in SEARCH_OPTIONS}
    s.update(file_search)
    s.update({o.name: getattr(args, f"search_{o.name}") for o in SEARCH_OPTIONS
              if hasattr(args, f"search_{o.name}")})
    notes: list[str] = []  # what other systems' spellings do here
    values = resolve_values(given, file_train, notes)
    base = build_config(TRAIN, values)

    ranges = _model_ranges(base.model.model)
    if s["space"]:
        raw = read_toml(s["space"], "--space")
        table, space_from = raw.get("space", raw), s["space"]
        where = f"--space {s['space']!r}"
    elif file_space is not None:
        table, space_from, where = file_space, config_file, f"[space] of --config {config_file!r}"
    elif ranges is not None:  # NNLO's get_model.parameter_range (scikit-optimize)
        table, space_from = ranges
        where = space_from
    else:
        table, space_from, where = DEFAULT_SPACE, "default", "the default space"
    if ranges is not None and table is not ranges[0]:
        notes.append(f"{where} is searched; {ranges[1]} is not used (a space given wins)")
    try:
        space = SearchSpace.from_dict(_space_table(table, where, base.model.model), where,
                                      _check_param)
        if s["sampler"] == "grid":
            space.grid()
        key, direction = parse_objective(s["objective"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    names = ["loss", *(metric_key(m) for m in base.optim.metrics)]
    d = base.data
    has_val = (s["n_fold"] > 1 or d.test_as_validation or d.validation_split != 0
               or getattr(d, "val_list", None))
    logged = names + ([f"val_{n}" for n in names] if has_val else [])
    if "metrics" not in space.names and key not in logged:
        hint = "" if has_val else (" (the val_ values need --validation_split > 0, "
                                   "--test_as_validation or --n_fold K)")
        raise ConfigError(f"--objective {s['objective']!r}: the candidates log "
                          f"{', '.join(logged)}; choose one of them{hint}")
    if s["resume"] and not s["checkpoint"]:
        raise ConfigError("--resume continues the study saved by --checkpoint DIR; give "
                          "--checkpoint DIR too")
    try:
        settings = SearchSettings(num_trials=s["num_iterations"], block_size=s["block_size"],
                                  n_fold=s["n_fold"], objective=key, direction=direction,
                                  sampler=s["sampler"], pruner=s["pruner"],
                                  seed=base.model.random_seed, checkpoint=s["checkpoint"],
                                  checkpoint_interval=s["checkpoint_interval"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    output_dir = s["output_dir"] or s["checkpoint"] or "search_results"
    return SearchConfig(base=base, values=values, settings=settings, space=space,
                        space_from=space_from, output_dir=output_dir, resume=s["resume"],
                        study_name=s["study_name"], objective_spec=s["objective"],
                        notes=tuple(notes))
