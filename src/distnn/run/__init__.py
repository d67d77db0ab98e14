"""A run from its configuration, without the command: the options (``options.OPTIONS``),
the frozen configuration they make (``config``), and the one pipeline that applies the
threads per rank, checks the outputs, reads the data, builds the model, optimizer,
training rule, callbacks and trainer, and plans a resume (``build``)::

    from distnn.run import build_config, build_run
    cfg = build_config("train", {"model": "lenet", "batch_size": 32, "num_epochs": 2})
    history = build_run(cfg).fit()    # the run `distnn train --model lenet ...` makes
"""
from .build import Run, build_model, build_run, given_options
from .callbacks import build_callbacks, build_optimizer
from .config import ConfigError, RunConfig, build_config, load_toml, option_values
from .datasets import load_data
from .errors import RunError, TrainingDiverged, agreed
from .options import OPTION_BY_NAME, OPTIONS, Option, canonical
from .rule import build_rule
from .threads import apply_threads, threads_scope

__all__ = ["build_run", "Run", "RunError", "TrainingDiverged", "agreed", "build_config",
           "option_values", "load_toml", "RunConfig", "ConfigError", "OPTIONS",
           "OPTION_BY_NAME", "Option", "canonical", "load_data", "build_model", "build_rule",
           "build_optimizer", "build_callbacks", "given_options", "apply_threads",
           "threads_scope"]
