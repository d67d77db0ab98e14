"""Every foreign spelling in one place: what users of PyDTNN, NNLO and Theano-MPI type,
turned into distnn's own options before the configuration is built (``translate``), so
``distnn.run``'s configuration holds only distnn's names and meanings.

* ``ALIASES``, ``SEARCH_ALIASES``: their names of distnn's options (``--epochs`` is
  ``--num_epochs``);
* ``FOREIGN_OPTIONS``: their options with no option of the same meaning here, accepted by
  the parser and translated (``--use_blocking_mpi``, ``--shared_storage``) or answered with
  a note saying what distnn does instead (``NOTES``);
* ``WIDE_KINDS`` and the ``*_SPELLINGS``: their values of distnn's options (PyDTNN's
  ``--loss_func`` list, ``vgg16_cifar10``, NNLO's ``--model mnist``);
* Theano-MPI's session files (``-cfg=session.cfg``) and tmlauncher's flags;
* the door of a foreign command line, ``--like pydtnn`` (``DOORS``): where a system gives
  one of distnn's options another meaning (PyDTNN's ``--learning_rate`` is per sample),
  that meaning holds only through its door, and distnn's everywhere else; every other
  spelling here means the same with or without it.

The tables and ``name_of``/``option_of`` are in ``spellings``, the session files in
``theanompi``; this module re-exports them and holds ``NOTES`` and ``translate``.
A note is printed once, on rank 0, to stderr: nothing is silently ignored.
"""
from __future__ import annotations

from typing import Any

from .pydtnn_rate import DISTNN, DOORS, PYDTNN, learning_rate
from .spellings import (ALIASES, FOREIGN, FOREIGN_BY_NAME, FOREIGN_OPTIONS, GROUPS, HELP,
                        LOSS_SPELLINGS, METRIC_SPELLINGS, PYDTNN_MODELS, SEARCH_ALIASES,
                        SEED_MODELS, WIDE_KINDS, LossList, name_of, option_of)
from .theanompi import (LAUNCHER_FLAGS, RULES, SESSION_KEYS, is_session_file,
                        session_options, session_values)

__all__ = ["ALIASES", "DISTNN", "DOORS", "PYDTNN", "FOREIGN", "FOREIGN_BY_NAME",
           "FOREIGN_OPTIONS", "GROUPS", "HELP",
           "LAUNCHER_FLAGS", "LOSS_SPELLINGS", "METRIC_SPELLINGS", "NOTES", "PYDTNN_MODELS",
           "RULES", "SEARCH_ALIASES", "SEED_MODELS", "SESSION_KEYS", "WIDE_KINDS", "LossList",
           "is_session_file", "name_of", "option_of", "session_options", "session_values",
           "translate"]


# -- options with no counterpart: what distnn does instead ----------------------------------
NOTES = {
    "timeline": "NNLO's activity timeline is distnn's Chrome trace (layers and "
                "communication of every rank, gathered into one file; open it in Perfetto)",
    "max_gpus": "not applicable, this build has no GPU backend",
    "master_gpu": "not applicable, this build has no GPU backend",
    "tf": "distnn trains its own models, torch.nn.Module ones and Keras 3 ones on Keras's "
          "torch backend (--model FILE.py|FILE.json); TensorFlow does no training here",
    "backend": "distnn trains its own, torch and Keras 3 models (Keras on its torch "
               "backend; --model FILE.py|FILE.json)",
    "monitor": "use --profile for per-layer times and all-reduce waits, --trace for a "
               "timeline",
    "tensor_format": "distnn computes in NCHW; the data is read in that layout",
    "use_mpi_buffers": "distnn always communicates NumPy buffers (flat gradient buckets)",
}


# -- from their options to distnn's ----------------------------------------------------------
# PyDTNN 3.x's --model-sync-* options: distnn's localsgd options of the same meaning.
_MODEL_SYNC = {"model_sync_algo": ("sync_weighting", "avg"),
               "model_sync_participation": ("sync_participation", "all"),
               "model_sync_min_avail": ("sync_min_avail", 0)}


def model_sync(values: dict[str, Any], explicit: set[str]) -> list[str]:
    """PyDTNN's model synchronization options as distnn's rule and its options (in place);
    ValueError naming the option for what is not built here."""
    freq = values.get("model_sync_freq") or 0
    rule = values.get("parallel")
    given = [n for n in (*_MODEL_SYNC, "model_sync_quantize", "model_sync_dtype")
             if n in explicit]
    for name in ("initial_model_sync", "final_model_sync"):
        if values.get(name) is False:
            raise ValueError(f"--{name.replace('_', '-')} false: distnn always starts every "
                             "rank from rank 0's weights and averages them at every epoch "
                             f"end; drop --{name.replace('_', '-')}")
    if values.get("parallel_pipeline"):
        if freq > 0:
            raise ValueError(f"--parallel-pipeline delays the gradient all-reduce of every "
                             f"step; --model-sync-freq {freq} averages weights instead: "
                             "give one of them")
        if rule not in ("auto", "data", "bsp", "pipeline", "delayed"):
            raise ValueError(f"--parallel-pipeline is --parallel pipeline; drop --parallel "
                             f"{rule} or --parallel-pipeline")
        values["parallel"] = "pipeline"
        return []
    if freq < 0:
        raise ValueError(f"--model-sync-freq {freq}: PyDTNN's independent replicas (never "
                         "synchronized) are not built; give N > 0 to average every N batches "
                         "(0: gradients every batch)")
    if freq == 0:
        if given and rule != "localsgd":
            raise ValueError(f"--{given[0].replace('_', '-')} sets how the weights are "
                             "averaged every --model-sync-freq N batches; with "
                             "--model-sync-freq 0 the gradients are all-reduced every batch: "
                             "give --model-sync-freq N > 0")
        if rule != "localsgd":
            return []
    elif rule not in ("auto", "data", "bsp", "localsgd", "local_sgd"):
        raise ValueError(f"--model-sync-freq {freq} averages the weights every {freq} batches "
                         f"(--parallel localsgd); drop --parallel {rule} or --model-sync-freq")
    if freq > 0:
        values["parallel"], values["sync_every"] = "localsgd", freq
    # PyDTNN's defaults (avg, ...) only where PyDTNN's model sync is asked for: a distnn
    # localsgd run keeps distnn's own (wavg)
    for name, (option, default) in _MODEL_SYNC.items():
        if name in explicit or (freq > 0 and option not in explicit):
            values[option] = values.get(name, default)
    if values.get("model_sync_quantize"):
        values["sync_dtype"] = values.get("model_sync_dtype") or "float16"
    return []


def translate(values: dict[str, Any], explicit: set[str],
              spelled: frozenset[str] = frozenset(), command: str = "train",
              like: str = DISTNN) -> list[str]:
    """Turn, in place, the foreign options and values in ``values`` (every option by name)
    into distnn's, removing the foreign options; return notes for what is done differently
    here. ``spelled``: the command line's flags as typed; ``command``: train, evaluate...
    (only training has a learning rate); ``like``: the door the line came through
    (``pydtnn``: PyDTNN's meanings, its --learning_rate per sample; ``distnn``: distnn's).
    A foreign spelling means the same through either door. Raises ValueError naming the
    option."""
    if like not in DOORS:
        raise ValueError(f"--like: must be one of {', '.join(DOORS)}; got {like!r}")
    from . import nnlo
    notes: list[str] = nnlo.model_file_data(values, explicit)
    if command == "train":
        notes += learning_rate(values, explicit, spelled, {*PYDTNN_MODELS, "alexnet_cifar10"},
                               like)
    notes += _models(values)
    _loss_and_data(values, explicit)
    notes += _notes(values)
    notes += _launcher(values, explicit)
    notes += _trace(values)
    notes += model_sync(values, explicit)
    _flags(values)
    for name in FOREIGN_BY_NAME:
        values.pop(name, None)
    return notes


def _models(values: dict[str, Any]) -> list[str]:
    """PyDTNN's and NNLO's model names as the zoo's (and NNLO's trial files)."""
    from . import nnlo
    notes = []
    model = values.get("model")
    if values.get("trial_name") or values.get("timeline"):
        nnlo.trial_files(values, nnlo.model_name(model))
    if isinstance(model, str) and model in PYDTNN_MODELS:
        values["model"] = PYDTNN_MODELS[model]
    if isinstance(model, str) and model in SEED_MODELS:
        values["model"] = SEED_MODELS[model]
        notes.append(f"--model {model}: NNLO's example model; distnn trains its zoo model "
                     f"{SEED_MODELS[model]} (a small CNN of the same kind)")
    return notes


def _loss_and_data(values: dict[str, Any], explicit: set[str]) -> None:
    """PyDTNN's --loss_func (metrics, then the loss) and --train_list (HDF5 files)."""
    # PyDTNN's --loss_func lists metrics and the loss (last, after LossList.check).
    *listed, values["loss_func"] = str(values["loss_func"]).split(",")
    values["metrics"] = tuple(METRIC_SPELLINGS.get(m.lower(), m)
                              for m in [*values["metrics"], *listed])
    if values.get("train_list") is not None:
        if "dataset" not in explicit:
            values["dataset"] = "hdf5"
        elif values["dataset"] != "hdf5":
            raise ValueError(f"--train_list/--train_data lists HDF5 files: use it with "
                             f"--dataset hdf5, got --dataset {values['dataset']}")


def _notes(values: dict[str, Any]) -> list[str]:
    """Notes for the foreign options distnn takes but does differently (or not at all)."""
    notes = []
    if (values.get("group_size") or 1) > 1 and values.get("parallel") in ("auto", "data", "bsp"):
        notes.append(f"--n_processes {values['group_size']}: under --parallel data every rank "
                     "already trains synchronously with all the others, as one group; groups "
                     "of ranks are built for --mode downpour, easgd, gem, localsgd and gossip")
    for name, note in NOTES.items():
        value = values.get(name)
        if value not in (None, False):
            notes.append(f"--{name} {value}: {note}" if value is not True
                         else f"--{name}: {note}")
    return notes


def _launcher(values: dict[str, Any], explicit: set[str]) -> list[str]:
    """The launcher's flags (tmlauncher's) as session values the line did not set."""
    launcher = {key: values.get(name) for name, key in LAUNCHER_FLAGS.items()
                if values.get(name) not in (None, False)}
    if not launcher:
        return []
    raw = {k: "1" if v is True else str(v) for k, v in launcher.items()}
    given, said = session_values(raw, "tmlauncher")
    for name, value in given.items():
        if name not in explicit:
            values[name] = value
    return said


def _trace(values: dict[str, Any]) -> list[str]:
    """PyDTNN's --tracing as a Chrome trace file where --trace names none."""
    if not values.get("tracing") or values.get("trace"):
        return []
    values["trace"] = "distnn-trace.json"
    return ["--tracing: distnn writes a Chrome trace (layers and communication) to "
            "distnn-trace.json (choose the file with --trace FILE); PyDTNN's "
            "Extrae/Simple tracers are not available"]


def _flags(values: dict[str, Any]) -> None:
    """PyDTNN's negated MPI and storage flags as distnn's; its GPU flags refused."""
    if values.get("use_blocking_mpi") is not None:
        values["non_blocking_mpi"] = not values["use_blocking_mpi"]
    if values.get("shared_storage") is False:
        values["every_rank_writes"] = True
    for name in ("enable_gpu", "enable_gpudirect", "enable_nccl"):
        if values.get(name):
            raise ValueError(f"--{name}: no GPU backend in this build (distnn computes on "
                             "CPUs with NumPy; start more ranks with mpiexec -n N instead); "
                             f"drop --{name} or set it to false, got true")
