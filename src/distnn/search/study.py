"""The optuna side of a search (coordinator only): samplers, pruners, and the study saved
as an SQLite optuna storage.

A ``SearchStudy`` that is to be saved lives in a private in-memory SQLite database (an
optuna ``RDBStorage``); ``save`` copies that database with SQLite's backup API into a new
file renamed over ``DIR/study.db``, so saving takes milliseconds and a search killed while
saving keeps its last checkpoint. ``SearchStudy.load`` reads the file back into memory and
turns the trials that were still running into waiting ones: ``study.ask()`` re-runs them
under the same trial numbers with the same parameters, and finished trials are never run
again. The file is a plain optuna storage: ``optuna.load_study(study_name=None,
storage="sqlite:///DIR/study.db")`` and the ``optuna`` command open it.
"""
from __future__ import annotations

import itertools
import os
import sqlite3
import tempfile
import warnings
from typing import Any

from .space import SearchSpace

__all__ = ["SAMPLERS", "PRUNERS", "STUDY_FILE", "SETTINGS_KEY", "make_sampler", "make_pruner",
           "SearchStudy", "save_study", "storage_url"]

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median")
STUDY_FILE = "study.db"
SETTINGS_KEY = "distnn_search"  # study user attribute: what the search was run with


def _optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage_url(path: str) -> str:
    return "sqlite:///" + os.path.abspath(path)


def _grid_sampler_class():
    optuna = _optuna()

    class GridSampler(optuna.samplers.GridSampler):
        """optuna's GridSampler without its ``study.stop()`` once the grid is covered: that
        works only inside ``study.optimize``, and the search stops by its trial count."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return GridSampler


def _GridSampler(grid, seed):
    return _grid_sampler_class()(grid, seed=seed)


def make_sampler(name: str, space: SearchSpace, seed: int):
    """An optuna sampler by name: "tpe" (default), "random" or "grid"."""
    optuna = _optuna()
    if name == "tpe":
        # constant_liar: trials still running count as bad guesses, so blocks that ask at
        # the same time do not all get the same candidate.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return _GridSampler(space.grid(), seed=seed)
    raise ValueError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


def make_pruner(name: str):
    """An optuna pruner by name: "none" or "median" (stop a trial whose intermediate
    objective is worse than the median of earlier trials at the same epoch)."""
    optuna = _optuna()
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    raise ValueError(f"--pruner must be one of {', '.join(PRUNERS)}, got {name!r}")


_DATABASES = itertools.count()


def _temporary(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{STUDY_FILE}.{os.getpid()}.",
                               suffix=".part")
    os.close(fd)
    os.unlink(tmp)  # SQLite creates its own file
    return tmp


def _saved_copy(trial):
    """A finished trial as it is, an unfinished one as a waiting trial with its
    parameters fixed (re-run under the same number after a resume)."""
    optuna = _optuna()
    if trial.state.is_finished() or trial.state == optuna.trial.TrialState.WAITING:
        return trial
    fixed = dict(trial.system_attrs.get("fixed_params", {}))
    fixed.update(trial.params)
    return optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING,
                                     system_attrs={**trial.system_attrs, "fixed_params": fixed},
                                     user_attrs=dict(trial.user_attrs))


def save_study(study, folder: str) -> str:
    """Write any optuna ``study`` to ``folder/study.db`` (atomic: a new file renamed over
    the old; unfinished trials become waiting ones). Returns the file's path.
    ``SearchStudy.save`` is the fast way for a search's own study."""
    optuna = _optuna()
    target = os.path.join(folder, STUDY_FILE)
    tmp = _temporary(folder)
    storage = None
    try:
        storage = optuna.storages.RDBStorage(storage_url(tmp))
        copy = optuna.create_study(storage=storage, study_name=study.study_name,
                                   direction=study.direction)
        for key, value in study.user_attrs.items():
            copy.set_user_attr(key, value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # create_trial's ExperimentalWarning, if any
            copy.add_trials([_saved_copy(t) for t in study.get_trials(deepcopy=False)])
        storage.remove_session()
        storage.engine.dispose()
        os.replace(tmp, target)
    except BaseException:
        if storage is not None:
            storage.engine.dispose()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


class SearchStudy:
    """A search's optuna study, in memory or in a private in-memory SQLite database that
    ``save`` copies to ``DIR/study.db`` in milliseconds.

    Attributes:
        study: the ``optuna.Study`` (ask/tell).

    Example:
        s = SearchStudy.create("s", "minimize", make_sampler("tpe", space, 0),
                               make_pruner("none"), {}, saved=True)
        trial = s.study.ask(); ...; s.save("ck")          # ck/study.db
        s = SearchStudy.load("ck", sampler, pruner)       # same trial numbers
    """

    def __init__(self, study, storage=None, keeper: sqlite3.Connection | None = None):
        self.study = study
        self._storage = storage
        self._keeper = keeper  # keeps the in-memory database alive

    @staticmethod
    def _memory(skip_table_creation: bool = False):
        """(RDBStorage, keeper connection) of a new private in-memory SQLite database; the
        keeper holds it alive and is what ``save`` backs up. A loaded study's file is copied
        into the keeper before the storage opens it."""
        optuna = _optuna()
        from sqlalchemy.pool import SingletonThreadPool
        uri = f"file:distnn_search_{os.getpid()}_{next(_DATABASES)}?mode=memory&cache=shared"
        keeper = sqlite3.connect(uri, uri=True, check_same_thread=False)

        def storage():
            return optuna.storages.RDBStorage(
                f"sqlite:///{uri}&uri=true", engine_kwargs={"poolclass": SingletonThreadPool},
                skip_table_creation=skip_table_creation)
        return storage, keeper

    @classmethod
    def create(cls, name: str, direction: str, sampler, pruner, settings: dict[str, Any],
               saved: bool = False) -> "SearchStudy":
        """A new study with the search ``settings`` as a user attribute; ``saved``: in an
        SQLite database, for ``save``."""
        optuna = _optuna()
        storage = keeper = None
        if saved:
            open_storage, keeper = cls._memory()
            storage = open_storage()
        study = optuna.create_study(study_name=name, direction=direction, sampler=sampler,
                                    pruner=pruner, storage=storage)
        study.set_user_attr(SETTINGS_KEY, settings)
        return cls(study, storage, keeper)

    @classmethod
    def load(cls, folder: str, sampler, pruner) -> "SearchStudy":
        """The study saved in ``folder/study.db``, read into memory, with the trials that
        were running when it was saved waiting to run again under their numbers.

        Raises:
            FileNotFoundError: there is no saved study in ``folder``.
            ValueError: the file is not a study saved by a search.
        """
        path = os.path.join(folder, STUDY_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path!r} does not exist")
        optuna = _optuna()
        open_storage, keeper = cls._memory(skip_table_creation=True)
        try:
            source = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)
            try:
                source.backup(keeper)
            finally:
                source.close()
            storage = open_storage()
            study = optuna.load_study(study_name=None, storage=storage, sampler=sampler,
                                      pruner=pruner)
        except (ValueError, RuntimeError, KeyError) as exc:
            keeper.close()
            raise ValueError(f"{path!r} is not a distnn search study: {exc}") from None
        except Exception as exc:  # sqlite3/sqlalchemy errors of a file that is no database
            keeper.close()
            raise ValueError(f"{path!r} is not a readable optuna study ({type(exc).__name__}: "
                             f"{exc})") from None
        if SETTINGS_KEY not in study.user_attrs:
            keeper.close()
            raise ValueError(f"{path!r} holds an optuna study that distnn search did not "
                             f"write (no {SETTINGS_KEY!r} attribute)")
        study_id = storage.get_study_id_from_name(study.study_name)
        for trial in study.get_trials(deepcopy=False,
                                      states=(optuna.trial.TrialState.RUNNING,)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_state_values(trial_id, optuna.trial.TrialState.WAITING)
        return cls(study, storage, keeper)

    def save(self, folder: str) -> str:
        """Write the study to ``folder/study.db`` (atomic). Returns the file's path."""
        if self._keeper is None:
            return save_study(self.study, folder)
        target = os.path.join(folder, STUDY_FILE)
        tmp = _temporary(folder)
        try:
            dest = sqlite3.connect(tmp)
            try:
                self._keeper.backup(dest)
            finally:
                dest.close()
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return target
