"""Training one candidate of ``distnn search``: the run ``distnn train`` makes with the
candidate's options (the same ``distnn.run.build_run``), quietly, on a block's
communicator, with the threads per rank the job decided."""
from __future__ import annotations

import os
from typing import Any, Callable

from ..run import RunConfig, agreed, build_config, build_run, load_data
from ..run.config import TRAIN

__all__ = ["CandidateTrainer"]


class CandidateTrainer:
    """Trains one candidate on a block's communicator as ``distnn train`` does, quietly.
    The dataset is read once per block and reused while the candidates do not change how
    it is read.

    Args:
        values: the base run's option values (distnn's names).
        n_fold: folds of the training set that replace the validation split (1: none).
        to_options: a candidate's parameters as option values (default: as they are).
        threads: threads per rank, decided once for the job (its world communicator knows
            which ranks share a node; a block alone does not); None: from the block.
    """

    def __init__(self, values: dict[str, Any], n_fold: int = 1, *,
                 to_options: Callable[[dict[str, Any]], dict[str, Any]] = dict,
                 threads: int | None = None):
        self.values = dict(values)
        self.n_fold = n_fold
        self.to_options = to_options
        self.threads = threads
        self._cached: tuple[Any, Any] | None = None

    def config(self, params: dict[str, Any], fold: int | None = None) -> RunConfig:
        # --tensorboard DIR: each trial is its own run under DIR (see _tensorboard).
        values = {**self.values, **self.to_options(params), "quiet": True,
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
        from .folds import kfold_split
        cfg = self.config(params, fold)
        splits = self._splits(cfg, comm)
        train, val = splits.train, splits.val
        if fold is not None:
            train, val = agreed(comm, "--n_fold", lambda: kfold_split(
                splits.train, self.n_fold, fold, cfg.model.random_seed))
        # a failed check (the model's outputs, a metric) is a failed trial, with its reason
        run = build_run(cfg, comm, splits=splits, train=train, val=val, threads=self.threads,
                        callbacks=[*callbacks, *self._tensorboard(params, fold, callbacks,
                                                                 cfg, comm)])
        return run.fit()

    def _tensorboard(self, params, fold, callbacks, cfg: RunConfig, comm) -> list:
        """With --tensorboard DIR, a TensorBoard callback writing DIR/trial_NNNN (or
        trial_NNNN_foldK) with the trial's parameters as hyper-parameters (HParams view)."""
        folder = self.values.get("tensorboard")
        if not folder:
            return []
        from ..training.tensorboard import TensorBoard
        from .driver import TrialWatch
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
