"""The training loop: ``Trainer`` and its collaborators.

    trainer.py     Trainer (epochs, steps, callbacks, the rule seam) and ``fit``
    evaluation.py  MetricSet (loss + metrics and their exact sums), evaluate, predict
    history.py     History (per-epoch logs, saved as JSON/CSV), Reporter (rank-0 output)
    callbacks.py   LR schedules; callback_base.py: the Callback hooks; stopping.py: early
                   stopping, target metric, weight and training checkpoints
    checkpoint.py  full training state, atomic writes, exact resume
    profiler.py    per-layer timing, communication wait, Chrome traces
    tensorboard.py TensorBoard: event files of a run's curves (tensorboardX, optional)
    plots.py       plot_history: training curves of one or several runs as a PNG

The arrows run one way: trainer -> callbacks/evaluation/history -> checkpoint; nothing
here imports the trainer.
"""
from .callbacks import (CALLBACKS, Callback, EarlyStopping, ModelCheckpoint, ReduceLREveryNEpochs,
                        ProgressFile, ReduceLROnPlateau, TargetMetric, TrainingCheckpoint,
                        ValidateEvery, WarmUp, parse_early_stopping, parse_target_metric)
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .evaluation import MetricSet, evaluate, metric_key, predict, resolve_batch_sizes
from .history import History, Reporter, atomic_write_text
from .plots import plot_history
from .profiler import Profiler
from .tensorboard import TensorBoard
from .trainer import Trainer, fit

__all__ = [
    "Trainer", "fit", "History", "Reporter", "MetricSet", "evaluate", "predict",
    "metric_key", "resolve_batch_sizes", "atomic_write_text", "Callback", "WarmUp",
    "EarlyStopping", "ReduceLROnPlateau", "ReduceLREveryNEpochs", "ModelCheckpoint",
    "TargetMetric", "ProgressFile", "TrainingCheckpoint", "ValidateEvery", "CALLBACKS",
    "parse_early_stopping",
    "parse_target_metric", "Checkpoint", "load_checkpoint", "save_checkpoint", "Profiler",
    "TensorBoard", "plot_history",
]
