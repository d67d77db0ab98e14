"""``distnn search``: hyper-parameter search over blocks of MPI ranks.

The command takes every option of ``distnn train`` (the base configuration of each
candidate) and the options of the "Search" group below (NNLO's spellings too:
``--block-size``, ``--num-iterations``, ``--n-fold``, ``--checkpoint-interval``,
``--opt-restore``). The searched options and their ranges come from ``--space FILE`` or
the ``[space]`` table of ``--config FILE`` (see ``distnn.search.space``), else
``search.DEFAULT_SPACE``. Each candidate is trained exactly as ``distnn train`` would
train it, so ``distnn train --config best.toml`` on a block's rank count repeats the best
trial.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tomllib
from dataclasses import dataclass
from typing import Any

from ..run import (OPTION_BY_NAME, OPTIONS, ConfigError, Option, RunConfig, RunError, agreed,
                   build_config, build_run, load_data, load_toml)
from ..run.kinds import Bool, Int, Maybe, Str
from ..run.options import TRAIN
from ..run.preflight import check_model_outputs
from ..models.files import check_model_args, is_model_spec
from . import compat
from .builders import make_comm, threads
from .nnlo import as_options
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


def _read_toml(path: str, what: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what}: file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what}: {path!r} is not valid TOML: {exc}") from None


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

    if s["space"]:
        raw = _read_toml(s["space"], "--space")
        table, space_from = raw.get("space", raw), s["space"]
        where = f"--space {s['space']!r}"
    elif file_space is not None:
        table, space_from, where = file_space, config_file, f"[space] of --config {config_file!r}"
    else:
        table, space_from, where = DEFAULT_SPACE, "default", "the default space"
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


# -- training one candidate ------------------------------------------------------------------
class CandidateTrainer:
    """Trains one candidate on a block's communicator as ``distnn train`` does (the same
    ``distnn.run.build_run``), quietly. The dataset is read once per block and reused while
    the candidates do not change how it is read."""

    def __init__(self, cfg: SearchConfig):
        self.values = dict(cfg.values)
        self.n_fold = cfg.settings.n_fold
        self._cached: tuple[Any, Any] | None = None

    def config(self, params: dict[str, Any], fold: int | None = None) -> RunConfig:
        # --tensorboard DIR: each trial is its own run under DIR (see _tensorboard).
        values = {**self.values, **as_options(self.values, params), "quiet": True,
                  "tensorboard": None}
        if fold is not None:  # the folds replace the validation split
            values.update(validation_split=0.0, test_as_validation=False)
        return build_config(TRAIN, values)

    def _splits(self, cfg: RunConfig, comm):
        key = (cfg.data, cfg.model.dtype, cfg.model.random_seed, cfg.optim.loss_func)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        self._cached = None
        splits = load_data(cfg, comm)
        self._cached = (key, splits)
        return splits

    def __call__(self, params: dict[str, Any], comm, fold: int | None, callbacks: list):
        from ..search import kfold_split
        cfg = self.config(params, fold)
        splits = self._splits(cfg, comm)
        train, val = splits.train, splits.val
        if fold is not None:
            train, val = agreed(comm, "--n_fold", lambda: kfold_split(
                splits.train, self.n_fold, fold, cfg.model.random_seed))
        run = build_run(cfg, comm, splits=splits, train=train, val=val,
                        callbacks=[*callbacks, *self._tensorboard(params, fold, callbacks,
                                                                 cfg, comm)])
        check_model_outputs(cfg, run.model, train)  # a failed trial, with its reason
        return run.fit()

    def _tensorboard(self, params, fold, callbacks, cfg: RunConfig, comm) -> list:
        """With --tensorboard DIR, a TensorBoard callback writing DIR/trial_NNNN (or
        trial_NNNN_foldK) with the trial's parameters as hyper-parameters (HParams view)."""
        folder = self.values.get("tensorboard")
        if not folder:
            return []
        from ..search.driver import TrialWatch
        from ..training.tensorboard import TensorBoard
        number = next((cb.trial for cb in callbacks if isinstance(cb, TrialWatch)), None)
        name = f"trial_{number:04d}" if number is not None else "trial"
        if fold is not None:
            name += f"_fold{fold + 1}"
        hparams = {k: (",".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
                   for k, v in params.items()}
        if fold is not None:
            hparams["fold"] = fold + 1
        return [TensorBoard(os.path.join(folder, name), self.values["tensorboard_every"],
                            options=cfg.summary(ranks=comm.size), hparams=hparams)]


# -- the command -----------------------------------------------------------------------------
def _check_folder(option: str, folder: str) -> None:
    """Create ``folder`` if needed and make sure a file can be written in it."""
    import tempfile
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".distnn-probe.", suffix=".part")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{option}: cannot write in {folder!r}: {exc.strerror or exc}; "
                         "choose a folder you can write to") from None


def _prepare_study(cfg: SearchConfig):
    """Check the outputs, then create the study or load the saved one (coordinator)."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ValueError("distnn search needs optuna (and matplotlib for the plot): pip "
                         "install 'distnn[search]'") from None
    from ..search import SETTINGS_KEY, STUDY_FILE, SearchStudy, make_pruner, make_sampler
    _check_folder("--output_dir", cfg.output_dir)
    if cfg.base.output.tensorboard:
        from ..training.tensorboard import tensorboard_missing
        missing = tensorboard_missing()
        if missing:
            raise ValueError(f"--tensorboard: {missing}")
        _check_folder("--tensorboard", cfg.base.output.tensorboard)
    s = cfg.settings
    wanted = {"space": cfg.space.spec(), "objective": s.objective, "direction": s.direction,
              "n_fold": s.n_fold}
    folder = s.checkpoint
    pruner = make_pruner(s.pruner)
    saved = folder and os.path.exists(os.path.join(folder, STUDY_FILE))
    if folder:
        _check_folder("--checkpoint", folder)
    if saved and not cfg.resume:
        raise ValueError(f"--checkpoint: {folder!r} already holds a study ({STUDY_FILE}); add "
                         "--resume to continue it, or choose another folder")
    if cfg.resume:
        if not saved:
            raise ValueError(f"--resume: there is no saved study in {folder!r} (no "
                             f"{STUDY_FILE}); run without --resume to start one there")
        saved_study = SearchStudy.load(folder, make_sampler(s.sampler, cfg.space, s.seed),
                                       pruner)
        study = saved_study.study
        old = study.user_attrs[SETTINGS_KEY]
        differ = [k for k in wanted if old.get(k) != wanted[k]]
        if differ:
            detail = "; ".join(f"{k}: saved {old.get(k)!r}, now {wanted[k]!r}" for k in differ)
            raise ValueError(f"--resume: the study in {folder!r} was searched with other "
                             f"settings ({detail}); resume it with the same ones, or start a "
                             "new study in another --checkpoint folder")
        # A sampler seeded as before would draw the old candidates again.
        study.sampler = make_sampler(s.sampler, cfg.space, s.seed + len(study.trials))
        return saved_study
    return SearchStudy.create(cfg.study_name, s.direction,
                              make_sampler(s.sampler, cfg.space, s.seed), pruner,
                              {**wanted, "block_size": s.block_size,
                               "options": _best_values(cfg, {})}, saved=bool(folder))


def _best_values(cfg: SearchConfig, params: dict) -> dict[str, Any]:
    """The options of a candidate that differ from distnn train's defaults (and the main
    ones always), as TOML-able values."""
    params = as_options(cfg.values, params)
    values = {**cfg.values, **params}
    out = {}
    for o in OPTIONS:
        if TRAIN not in o.commands or o.name in EXCLUDED:
            continue
        v = values.get(o.name)
        if v is None or (v == o.default and o.name not in params
                         and o.name not in ALWAYS_WRITTEN):
            continue
        out[o.name] = list(v) if isinstance(v, tuple) else v
    return out


def _best_tables(cfg: SearchConfig, params: dict) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    for name, value in _best_values(cfg, params).items():
        tables.setdefault(OPTION_BY_NAME[name].section, {})[name] = value
    return tables


def _write_reports(cfg: SearchConfig, coordinator, size: int, started: float) -> None:
    from ..search import (plot_objective, ranked_table, records_from_study, write_toml,
                          write_trials_json)
    s = cfg.settings
    study = coordinator.study
    records = records_from_study(study)
    counts = {state: sum(r.state == state for r in records)
              for state in ("complete", "pruned", "fail")}
    print(f"Search finished: {len(records)} trials ({counts['complete']} complete, "
          f"{counts['pruned']} pruned, {counts['fail']} failed); this run "
          f"{len(coordinator.records)} trials in {time.time() - started:.1f} s", flush=True)
    print(ranked_table(records, s.objective, s.direction, s.n_fold), flush=True)
    out = cfg.output_dir
    summary: dict[str, Any] = {"study": study.study_name, "objective": s.objective,
                               "direction": s.direction, "n_fold": s.n_fold,
                               "block_size": s.block_size, "sampler": s.sampler,
                               "pruner": s.pruner, "space": cfg.space.spec(),
                               "ranks": size, "coordinator_wall_s": coordinator.loop_wall_s,
                               "coordinator_cpu_s": coordinator.loop_cpu_s}
    best = [r for r in records if r.state == "complete"]
    if best:
        top = study.best_trial
        summary.update(best_trial=top.number, best_value=top.value, best_params=top.params)
        folds = (f"the mean of {s.n_fold} folds of the training set; distnn train validates "
                 "on --validation_split instead" if s.n_fold > 1 else "on the validation split")
        write_toml(os.path.join(out, "best.toml"), _best_tables(cfg, top.params), (
            f"Best configuration of distnn search (study {study.study_name!r}): trial "
            f"{top.number}, {s.objective} = {top.value!r} ({s.direction}; {folds}).\n"
            f"Trained on blocks of {s.block_size} rank{'s' * (s.block_size != 1)}: "
            f"'mpiexec -n {s.block_size} distnn train --config best.toml' repeats it.\n"
            f"Searched: {', '.join(top.params)}."))
        params = " ".join(f"{k}={v}" for k, v in top.params.items())
        print(f"Best: trial {top.number} {s.objective}={top.value:.6g} {params}; written to "
              f"{os.path.join(out, 'best.toml')} (distnn train --config "
              f"{os.path.join(out, 'best.toml')})", flush=True)
    else:
        print("No trial completed: no best.toml written", flush=True)
    write_trials_json(os.path.join(out, "trials.json"), records, summary)
    plot_objective(os.path.join(out, "objective.png"), records, s.objective, s.direction)
    saved = (f"; study saved in {os.path.join(s.checkpoint, 'study.db')}" if s.checkpoint
             else "")
    print(f"Trials in {os.path.join(out, 'trials.json')}, plot in "
          f"{os.path.join(out, 'objective.png')}{saved}", flush=True)


def _header(cfg: SearchConfig, size: int, study) -> str:
    from ..search import block_count
    s = cfg.settings
    b = cfg.base
    blocks = block_count(size, s.block_size)
    who = ("1 process (no coordinator rank; trials one after another)" if size == 1 else
           f"{size} ranks = 1 coordinator + {blocks} block{'s' * (blocks != 1)} of "
           f"{s.block_size}")
    folds = f", {s.n_fold}-fold" if s.n_fold > 1 else ""
    n = b.train.steps_per_epoch
    steps = f" of at most {n} step{'s' * (n != 1)}" if n else ""
    trials = s.num_trials
    if s.sampler == "grid" and cfg.space.grid_size() < trials:
        trials = f"{cfg.space.grid_size()} (all the grid has)"
    lines = [f"distnn search: {who}; {trials} trial{'s' * (trials != 1)}, {s.sampler} "
             f"sampler, pruner {s.pruner}; objective {s.objective} ({s.direction}{folds})",
             f"base: {b.model.model} on {b.data.dataset}, {b.train.num_epochs} "
             f"epoch{'s' * (b.train.num_epochs != 1)}{steps}",
             f"space ({cfg.space_from}): {cfg.space.describe()}"]
    trials = study.get_trials(deepcopy=False)
    if cfg.resume:
        done = [t.number for t in trials if t.state.is_finished()]
        again = [t.number for t in trials if not t.state.is_finished()]
        lines.append(f"resuming {s.checkpoint}: {len(done)} finished trial(s) kept"
                     + (f", trial(s) {', '.join(map(str, again))} to run again" if again
                        else ""))
    return "\n".join(lines)


def run_search_command(cfg: SearchConfig, comm) -> int:
    """``distnn search`` on every rank of ``comm``."""
    from ..search import LayoutError, block_count, run_search
    try:
        block_count(comm.size, cfg.settings.block_size)
    except LayoutError as exc:
        raise RunError(str(exc)) from None
    started = time.time()
    study = agreed(comm, "--checkpoint", lambda: _prepare_study(cfg), root=0, lazy=True)
    if comm.rank == 0 and not cfg.base.output.quiet:
        print(_header(cfg, comm.size, study.study), flush=True)
    run_search(comm, cfg.settings, cfg.space, CandidateTrainer(cfg), study=study,
               finalize=lambda c: _write_reports(cfg, c, comm.size, started))
    return 0


def main_search(args: argparse.Namespace, prog: str, show_config_errors: bool) -> int:
    """``distnn search`` from parsed arguments; returns the exit status (2: a user error,
    printed once, on every rank)."""
    try:
        cfg = search_config(args)
    except ConfigError as exc:
        if show_config_errors:
            sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    comm = make_comm(cfg.base.parallel.parallel)
    from .. import distributed as dist
    with dist.abort_on_error(comm):
        try:
            if comm.rank == 0:
                for note in cfg.notes:
                    sys.stderr.write(f"{prog}: note: {note}\n")
            with threads(cfg.base, comm):
                return run_search_command(cfg, comm)
        except (RunError, ConfigError) as exc:
            if cfg.base.output.traceback:
                raise
            if comm.rank == 0:
                sys.stderr.write(f"{prog}: error: {exc}\n")
                sys.stderr.flush()
            return getattr(exc, "exit_code", 2)
        except KeyboardInterrupt:
            if comm.rank == 0:
                sys.stderr.write(f"{prog}: interrupted\n")
            return 130
