"""Hyper-parameter search over blocks of MPI ranks (what ``distnn search`` runs).

    space.py    SearchSpace: the searched options and their ranges (a TOML [space] table)
    blocks.py   the world as 1 coordinator + blocks (Communicator.split), Channel messages,
                waiting without spinning
    driver.py   the loop: optuna ask/tell on the coordinator, one trial per block at a time,
                k-fold, divergence and pruning, failed trials recorded
    study.py    samplers, pruners, the study saved/resumed as an SQLite optuna storage
    folds.py    k-fold splits of an in-memory dataset
    candidate.py  CandidateTrainer: one candidate trained as ``distnn train`` (distnn.run)
    report.py   live lines, ranked table, trials.json, best TOML, objective PNG

optuna and matplotlib are imported on the coordinator only, when used.

Example (every rank; rank 0 holds the study):
    space = SearchSpace.from_dict({"learning_rate": {"log_uniform": [1e-4, 1e-1]}})
    settings = SearchSettings(num_trials=6, block_size=2)
    study = SearchStudy.create("s", "minimize", make_sampler("tpe", space, 0),
                               make_pruner("none"), {}) if comm.rank == 0 else None
    run_search(comm, settings, space, train_fn, study=study)
"""
from .blocks import BlockLayout, Channel, LayoutError, block_count
from .candidate import CandidateTrainer
from .driver import (Coordinator, SearchSettings, TrainFn, TrialWatch, execute_trial,
                     parse_objective, run_search)
from .folds import kfold_split
from .report import (TrialRecord, live_line, plot_objective, ranked, ranked_table,
                     records_from_study, toml_value, write_toml, write_trials_json)
from .space import DEFAULT_SPACE, KINDS, Param, SearchSpace
from .study import (PRUNERS, SAMPLERS, SETTINGS_KEY, STUDY_FILE, SearchStudy, make_pruner,
                    make_sampler, save_study, storage_url)

__all__ = [
    "BlockLayout", "Channel", "LayoutError", "block_count", "CandidateTrainer",
    "Coordinator", "SearchSettings", "TrainFn", "TrialWatch", "execute_trial",
    "parse_objective", "run_search", "kfold_split", "TrialRecord", "live_line",
    "plot_objective", "ranked", "ranked_table", "records_from_study", "toml_value",
    "write_toml", "write_trials_json", "DEFAULT_SPACE", "KINDS", "Param", "SearchSpace",
    "PRUNERS", "SAMPLERS", "SETTINGS_KEY", "STUDY_FILE", "SearchStudy", "make_pruner",
    "make_sampler", "save_study", "storage_url",
]
