"""Running ``distnn search``: preparing (or resuming) the optuna study, the header, and the
reports (best.toml, trials.json, objective.png). Each candidate is trained by
``distnn.search.CandidateTrainer`` (the run ``distnn train`` makes, ``distnn.run``); the
options, the parser and ``SearchConfig`` are in ``distnn.cli.search``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..run import OPTION_BY_NAME, OPTIONS, ConfigError, RunError, agreed
from ..run.options import TRAIN
from .builders import make_comm, threads
from .nnlo import as_options
from .search import ALWAYS_WRITTEN, EXCLUDED, SearchConfig, search_config


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


def _check_block_topology(cfg: SearchConfig) -> None:
    """A trial's block of ranks runs the rule as ``mpiexec -n BLOCK distnn train`` would:
    a block too small for the masters and worker groups asked for (NNLO's --n-masters,
    --n-processes), or whose workers make no whole groups, is refused before any trial."""
    from types import SimpleNamespace

    from ..run.rule import build_rule
    b, p = cfg.settings.block_size, cfg.base.parallel
    if p.group_size == 1 and p.masters == 1:
        return
    rule = build_rule(cfg.base, SimpleNamespace(size=1 << 20))
    first = getattr(rule, "first_worker", 0)
    if getattr(rule, "group_size", 1) == 1 and getattr(rule, "masters", 1) == 1:
        return  # --parallel data: groups change nothing (a note says so)
    what = (f"--parallel {p.parallel} with --masters {p.masters} (--n-masters) and "
            f"--group_size {p.group_size} (--n-processes)")
    fits = [n for n in range(rule.min_ranks, rule.min_ranks + 4 * p.group_size)
            if (n - first) % p.group_size == 0][:3]
    if b < rule.min_ranks or (b - first) % p.group_size:
        need = (f"at least {rule.min_ranks} ranks" if b < rule.min_ranks else
                f"{first} master rank{'s' * (first != 1)} + a multiple of {p.group_size} "
                "worker ranks")
        ranks = f"{b} rank{'s' * (b != 1)}"
        raise RunError(f"--block_size {b}: each trial runs on one block of {ranks}, and "
                       f"{what} needs {need} there; give --block_size "
                       f"{' or '.join(map(str, fits))} (and mpiexec -n 1 + a multiple of it)")


def run_search_command(cfg: SearchConfig, comm) -> int:
    """``distnn search`` on every rank of ``comm``."""
    from ..search import LayoutError, block_count, run_search
    try:
        block_count(comm.size, cfg.settings.block_size)
    except LayoutError as exc:
        raise RunError(str(exc)) from None
    _check_block_topology(cfg)
    started = time.time()
    study = agreed(comm, "--checkpoint", lambda: _prepare_study(cfg), root=0, lazy=True)
    if comm.rank == 0 and not cfg.base.output.quiet:
        print(_header(cfg, comm.size, study.study), flush=True)
    from .. import distributed as dist
    from ..search import CandidateTrainer
    # Threads per rank from the job's communicator (a block alone does not know which
    # ranks share its node), decided once for every candidate.
    trainer = CandidateTrainer(cfg.values, cfg.settings.n_fold,
                               to_options=lambda params: as_options(cfg.values, params),
                               threads=dist.threads_per_rank(comm, cfg.base.parallel.threads))
    run_search(comm, cfg.settings, cfg.space, trainer, study=study,
               finalize=lambda c: _write_reports(cfg, c, comm.size, started))
    return 0


def main_search(args: argparse.Namespace, prog: str, show_config_errors: bool) -> int:
    """``distnn search`` from parsed arguments; returns the exit status (2: a user error,
    printed once, on every rank)."""
    try:
        cfg = search_config(args)
    except ConfigError as exc:
        if show_config_errors or getattr(exc, "local", False):
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
