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
* Theano-MPI's session files (``-cfg=session.cfg``) and tmlauncher's flags.

A note is printed once, on rank 0, to stderr: nothing is silently ignored.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

from ..run.kinds import Bool, Int, Kind, Maybe, Str
from ..run.options import OPTION_BY_NAME, TRAIN, ModelSpec, Option, canonical

# -- their names of distnn's options --------------------------------------------------------
ALIASES = {
    # PyDTNN
    "dataset_train_path": "dataset_path", "augment_flip": "flip_images",
    "augment_flip_prob": "flip_images_prob", "crop_images_size": "crop_images_padding",
    "augment_crop_prob": "crop_images_prob", "synthetic_input_shape": "input_shape",
    "synthetic_train_samples": "num_samples", "optimizer_momentum": "momentum",
    "optimizer_nesterov": "nesterov", "optimizer_beta1": "beta1", "optimizer_beta2": "beta2",
    "optimizer_epsilon": "epsilon", "optimizer_rho": "rho", "schedulers": "lr_schedulers",
    "tracer_output": "trace",
    # NNLO
    "train_data": "train_list", "val_data": "val_list", "batch": "batch_size",
    "epochs": "num_epochs", "restore": "resume", "checkpoint_int": "checkpoint_freq",
    "loss": "loss_func", "early": "early_stopping", "mode": "parallel",
}
SEARCH_ALIASES = {"opt_restore": "resume"}  # NNLO's names of distnn search's options

# -- their values of distnn's options -------------------------------------------------------
LOSS_SPELLINGS = {"categorical_crossentropy": "categorical_cross_entropy",
                  "binary_crossentropy": "binary_cross_entropy", "regression_mse": "mse",
                  "regression_mae": "mae", "mean_squared_error": "mse",
                  "mean_absolute_error": "mae"}
METRIC_SPELLINGS = {"regression_mse": "mse", "regression_mae": "mae"}
# NNLO's built-in example models (TrainingDriver --model mnist|cifar10): distnn's zoo
# model of the same kind (with a note).
SEED_MODELS = {"mnist": "simplecnn", "mnist_torch": "simplecnn", "cifar10": "simplecnn"}
# PyDTNN's names of the CIFAR-10 models of the zoo (the same architectures).
PYDTNN_MODELS = {"alexnet_cifar10": "alexnet_cifar",
                 **{f"vgg{d}{bn}_cifar10": f"vgg{d}{bn}" for d in (11, 13, 16, 19)
                    for bn in ("", "bn")}}


def _model_names():
    from ..models import MODELS
    return [*MODELS, *SEED_MODELS, *PYDTNN_MODELS]


def _is_metric(name: str) -> bool:
    from ..nn.metrics import get_metric
    try:
        get_metric(METRIC_SPELLINGS.get(name, name))
    except ValueError:
        return False
    return True


class LossList(Kind):
    """``--loss_func``: a loss name, or PyDTNN's comma list of metrics and one loss
    ('categorical_accuracy,categorical_cross_entropy'), Keras/PyDTNN spellings translated
    (``categorical_crossentropy``, ``regression_mse``). The value is the normalized list
    with the loss LAST; ``translate`` moves the metrics to ``--metrics``."""

    metavar = "LOSS"

    def check(self, value):
        from ..nn.losses import LOSSES
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"must name a loss, got {value!r}")
        items = [v.strip().lower().replace("-", "_") for v in value.split(",") if v.strip()]
        items = [LOSS_SPELLINGS.get(v, v) for v in items]
        losses = set(LOSSES)
        unknown = [v for v in items if v not in losses and not _is_metric(v)]
        if unknown:
            raise ValueError(f"must be a loss ({', '.join(sorted(losses))}) optionally with "
                             f"metrics in a comma list; got unknown name(s) "
                             f"{', '.join(unknown)!r}")
        # A name that is only a loss is THE loss; mse/mae (also metrics) are the loss only
        # when nothing else is.
        pure = [v for v in items if v in losses and not _is_metric(v)]
        if len(pure) > 1:
            raise ValueError(f"lists {len(pure)} losses ({', '.join(pure)}); give one loss "
                             f"(the other names may be metrics), got {value!r}")
        dual = [v for v in items if v in losses]
        if not pure and not dual:
            raise ValueError(f"lists only metrics; add a loss such as "
                             f"categorical_cross_entropy, got {value!r}")
        loss = (pure or dual)[0]
        rest = [v for v in dict.fromkeys(items) if v != loss]
        return ",".join([*rest, loss])


# The kinds the command parses these options with (their values too); ``translate`` then
# gives distnn's value, which distnn's own kind checks.
WIDE_KINDS: dict[str, Kind] = {
    "model": ModelSpec(_model_names),
    "loss_func": LossList(),
}

# What --help adds to distnn's help of an option about the values accepted here.
HELP = {"loss_func": " Keras spellings (categorical_crossentropy) and PyDTNN's comma list of "
                     "metrics and one loss are accepted too: the metrics join --metrics.",
        "metrics": " PyDTNN's regression_mse and regression_mae are mse and mae."}

# -- their options with no option of the same meaning here ------------------------------------
FOREIGN = "foreign"
GROUPS = {FOREIGN: "PyDTNN / NNLO options with no counterpart here (accepted; a note says what "
                 "happens instead)"}
_O = Option
FOREIGN_OPTIONS: list[Option] = [
    _O("trial_name", Maybe(Str(lower=False, metavar="NAME")), None, "NNLO: name of the run; "
       "the history goes to MODEL_NAME_history.json unless --history_file is given.",
       "train", FOREIGN, (TRAIN,)),
    _O("use_blocking_mpi", Maybe(Bool()), None, "PyDTNN: true = --non_blocking_mpi false "
       "(and the reverse).", "parallel", FOREIGN, (TRAIN,), aliases=("blocking_mpi",)),
    _O("enable_gpu", Bool(), False, "PyDTNN: this build has no GPU backend; true is an "
       "error.", "parallel", FOREIGN),
    _O("enable_gpudirect", Bool(), False, "PyDTNN: no GPU backend; true is an error.",
       "parallel", FOREIGN),
    _O("enable_nccl", Bool(), False, "PyDTNN: no GPU backend; true is an error.",
       "parallel", FOREIGN),
    _O("tracing", Bool(), False, "PyDTNN: write the Chrome trace (to distnn-trace.json "
       "unless --trace FILE).", "output", FOREIGN, (TRAIN,)),
    _O("shared_storage", Bool(), True, "PyDTNN: false = --every_rank_writes (every rank "
       "writes its own copy of the history and weights files); true = rank 0 writes them.",
       "output", FOREIGN, (TRAIN,)),
    _O("timeline", Bool(), False, "NNLO: the Chrome trace of every rank in one file, "
       "MODEL_TRIAL_timeline.json unless --trace FILE.", FOREIGN, FOREIGN, (TRAIN,)),
    _O("n_processes", Maybe(Int(1)), None, "NNLO: processes per worker; here each rank is "
       "one worker.", FOREIGN, FOREIGN, (TRAIN,)),
    _O("n_masters", Maybe(Int(1)), None, "NNLO: number of masters; here rank 0 is the one "
       "master of the parameter-server rules.", FOREIGN, FOREIGN, (TRAIN,)),
    _O("max_gpus", Maybe(Int(0)), None, "NNLO: no GPU backend here.", FOREIGN, FOREIGN),
    _O("master_gpu", Bool(), False, "NNLO: no GPU backend here.", FOREIGN, FOREIGN),
    _O("tf", Bool(), False, "NNLO: TensorFlow models; here distnn or torch models (--model "
       "FILE.py).", FOREIGN, FOREIGN),
    _O("backend", Maybe(Str(("keras", "torch", "tf"))), None, "NNLO: here distnn or torch "
       "models (--model FILE.py).", FOREIGN, FOREIGN),
    _O("monitor", Bool(), False, "NNLO: CPU/GPU monitoring; here --profile.", FOREIGN,
       FOREIGN, (TRAIN,)),
    _O("tensor_format", Maybe(Str(("nhwc", "nchw", "auto"))), None, "PyDTNN: distnn "
       "computes in NCHW.", FOREIGN, FOREIGN),
    _O("use_mpi_buffers", Maybe(Bool()), None, "PyDTNN: distnn always communicates buffers.",
       FOREIGN, FOREIGN, (TRAIN,)),
    # Theano-MPI's tmlauncher flags: the keys of its session file (see --config)
    _O("rule", Maybe(Str(("bsp", "easgd", "gosgd"))), None, "Theano-MPI: RULE (bsp = "
       "--parallel data, easgd, gosgd = gossip).", FOREIGN, FOREIGN, (TRAIN,),
       short=("r",)),
    _O("modelfile", Maybe(Str(lower=False, metavar="MODULE")), None, "Theano-MPI: "
       "MODELFILE, with --modelclass: --model MODELFILE:MODELCLASS.", FOREIGN, FOREIGN,
       short=("file",)),
    _O("modelclass", Maybe(Str(lower=False, metavar="NAME")), None, "Theano-MPI: "
       "MODELCLASS.", FOREIGN, FOREIGN, short=("class",)),
    _O("size", Maybe(Int(1)), None, "Theano-MPI: SIZE; the ranks are mpiexec -n's.",
       FOREIGN, FOREIGN, (TRAIN,), short=("s",)),
    _O("bsp_sync_type", Maybe(Str(lower=False)), None, "Theano-MPI: BSP_SYNC_TYPE (a note).",
       FOREIGN, FOREIGN, (TRAIN,), short=("bsp_sync_type",)),
    _O("bsp_exch_strategy", Maybe(Str(lower=False)), None, "Theano-MPI: BSP_EXCH_STRATEGY "
       "(*16: --gradient_compression fp16).", FOREIGN, FOREIGN, (TRAIN,),
       short=("bsp_exch_strategy",)),
    _O("bind", Bool(), False, "Theano-MPI: bind ranks to cores (a note: use mpiexec's "
       "binding).", FOREIGN, FOREIGN, (TRAIN,), short=("b",)),
]
FOREIGN_BY_NAME = {o.name: o for o in FOREIGN_OPTIONS}
_FOREIGN_ALIAS = {a: o.name for o in FOREIGN_OPTIONS for a in o.aliases}


def name_of(key: str) -> str:
    """The option name of a command-line or file key: distnn's, or a foreign option's."""
    k = canonical(key)
    k = _FOREIGN_ALIAS.get(k, k)
    return ALIASES.get(k, k)


def option_of(key: str) -> Option | None:
    """The option a key names (its kind widened to the foreign values), or None."""
    name = name_of(key)
    option = OPTION_BY_NAME.get(name) or FOREIGN_BY_NAME.get(name)
    if option is not None and name in WIDE_KINDS:
        option = dataclasses.replace(option, kind=WIDE_KINDS[name])
    return option


# -- Theano-MPI session files (tmlauncher -cfg=session.cfg) ---------------------------------
# RULE of Theano-MPI -> distnn's --parallel (the training rule).
RULES = {"BSP": "data", "EASGD": "easgd", "GOSGD": "gossip"}
SESSION_KEYS = ("RULE", "MODELFILE", "MODELCLASS", "SIZE", "DEVICES", "BSP_SYNC_TYPE",
                "BSP_EXCH_STRATEGY", "BIND")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def _statements(text: str) -> list[str]:
    """Shell assignments of a session file, a parenthesized array joined onto one line."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        line = line.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.count("(") <= pending.count(")"):
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def is_session_file(text: str) -> bool:
    """Whether ``text`` is a Theano-MPI session file: shell ``KEY=VALUE`` lines (no spaces
    around '=') with at least one of Theano-MPI's upper-case keys."""
    statements = _statements(text)
    if not statements or not all(_ASSIGN.match(s) for s in statements):
        return False
    return any(_ASSIGN.match(s).group(1) in SESSION_KEYS for s in statements)


def _shell_value(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith("(") and raw.endswith(")"):
        raw = raw[1:-1]
    try:
        words = shlex.split(raw, comments=True)
    except ValueError:
        words = [raw]
    return " ".join(words)


def _model_file(module: str, config_path: str) -> str:
    """MODELFILE for --model: a .py path as is; a dotted module (models.alex_net) as the
    file models/alex_net.py when it is in the working folder or next to the config file,
    else as the module to import."""
    if module.endswith(".py") or "/" in module:
        return module
    relative = module.replace(".", "/") + ".py"
    for base in (Path.cwd(), Path(config_path).resolve().parent):
        if (base / relative).is_file():
            return str(base / relative)
    return module


def session_options(text: str, path: str) -> tuple[dict[str, Any], list[str]]:
    """Option values and notes from a Theano-MPI session file. Lower-case keys are distnn
    options (as in TOML); upper-case ones are Theano-MPI's."""
    raw: dict[str, str] = {}
    for statement in _statements(text):
        key, value = _ASSIGN.match(statement).groups()
        if key in raw:
            raise ValueError(f"{key} is set twice")
        raw[key] = _shell_value(value)
    return session_values(raw, path)


def session_values(raw: dict[str, str], path: str) -> tuple[dict[str, Any], list[str]]:
    """Option values and notes of Theano-MPI's keys (a session file's, or tmlauncher's
    flags: -r=, -file=, -class=, -s=...); ``path``: the config file (its folder is
    searched for MODELFILE)."""
    values: dict[str, Any] = {}
    notes: list[str] = []

    def put(name: str, value: str, source: str) -> None:
        option = option_of(name)
        try:
            values[name] = option.kind.parse(value)
        except ValueError as exc:
            raise ValueError(f"{source} -> --{name} {value}: {exc}") from None

    for key, value in raw.items():
        if key in SESSION_KEYS:
            continue
        name = name_of(key)
        if option_of(name) is None:
            raise ValueError(f"unknown key {key!r}; a session file takes Theano-MPI's "
                             f"{', '.join(SESSION_KEYS)} or distnn option names")
        put(name, value, key)
    if "RULE" in raw:
        rule = raw["RULE"].upper()
        if rule not in RULES:
            raise ValueError(f"RULE={raw['RULE']}: must be one of {', '.join(RULES)}")
        put("parallel", RULES[rule], f"RULE={raw['RULE']}")
    if ("MODELFILE" in raw) != ("MODELCLASS" in raw):
        given = "MODELFILE" if "MODELFILE" in raw else "MODELCLASS"
        raise ValueError(f"{given} needs MODELFILE and MODELCLASS together (the module and "
                         f"the class or function in it that builds the model)")
    if "MODELFILE" in raw:
        spec = f"{_model_file(raw['MODELFILE'], path)}:{raw['MODELCLASS']}"
        put("model", spec, f"MODELFILE={raw['MODELFILE']} MODELCLASS={raw['MODELCLASS']}")
    if "DEVICES" in raw:
        notes.append(f"DEVICES={raw['DEVICES']}: not applicable, this build has no GPU "
                     "backend; distnn runs one CPU process per MPI rank (start them with "
                     "mpiexec -n N)")
    if "SIZE" in raw:
        notes.append(f"SIZE={raw['SIZE']}: distnn trains on as many ranks as mpiexec -n "
                     "starts; launch with mpiexec -n " + raw["SIZE"])
    if "BSP_SYNC_TYPE" in raw:
        notes.append(f"BSP_SYNC_TYPE={raw['BSP_SYNC_TYPE']}: distnn's BSP sums the gradients "
                     "of all ranks every step (an exact synchronous update); there is no "
                     "other exchange type")
    if "BSP_EXCH_STRATEGY" in raw:
        strategy = raw["BSP_EXCH_STRATEGY"]
        if strategy.endswith("16"):
            put("gradient_compression", "fp16", f"BSP_EXCH_STRATEGY={strategy}")
            notes.append(f"BSP_EXCH_STRATEGY={strategy}: gradients travel as float16 over "
                         "MPI (--gradient_compression fp16)")
        else:
            notes.append(f"BSP_EXCH_STRATEGY={strategy}: gradients are all-reduced over MPI "
                         "(bucketed, overlapped with backward)")
    if "BIND" in raw:
        notes.append("BIND: bind ranks to cores with your mpiexec's options (e.g. mpiexec "
                     "-bind-to core); --threads sets BLAS threads per rank")
    return values, notes


# tmlauncher's flags (-r=BSP, -file=..., -class=..., -s=2, ...) -> session-file keys
LAUNCHER_FLAGS = {"rule": "RULE", "modelfile": "MODELFILE", "modelclass": "MODELCLASS",
                  "size": "SIZE", "bsp_sync_type": "BSP_SYNC_TYPE",
                  "bsp_exch_strategy": "BSP_EXCH_STRATEGY", "bind": "BIND"}


# -- options with no counterpart: what distnn does instead ----------------------------------
NOTES = {
    "timeline": "NNLO's activity timeline is distnn's Chrome trace (layers and "
                "communication of every rank, gathered into one file; open it in Perfetto)",
    "n_processes": "every distnn rank is one worker training on its share of each global "
                   "batch; start more ranks with mpiexec -n instead of processes per worker",
    "n_masters": "distnn's parameter-server rules (--parallel downpour, easgd, gem) have one "
                 "master, rank 0",
    "max_gpus": "not applicable, this build has no GPU backend",
    "master_gpu": "not applicable, this build has no GPU backend",
    "tf": "distnn trains its own models or torch.nn.Module ones (--model FILE.py), not "
          "TensorFlow/Keras ones",
    "backend": "distnn trains its own models or torch.nn.Module ones (--model FILE.py)",
    "monitor": "use --profile for per-layer times and all-reduce waits, --trace for a "
               "timeline",
    "tensor_format": "distnn computes in NCHW; the data is read in that layout",
    "use_mpi_buffers": "distnn always communicates NumPy buffers (flat gradient buckets)",
}


# -- from their options to distnn's ----------------------------------------------------------
def translate(values: dict[str, Any], explicit: set[str]) -> list[str]:
    """Turn, in place, the foreign options and values in ``values`` (every option by name)
    into distnn's, removing the foreign options; return notes for what is done differently
    here. Raises ValueError naming the option."""
    from . import nnlo
    notes: list[str] = nnlo.model_file_data(values, explicit)
    model = values.get("model")
    if values.get("trial_name") or values.get("timeline"):
        nnlo.trial_files(values, nnlo.model_name(model))
    if isinstance(model, str) and model in PYDTNN_MODELS:
        values["model"] = PYDTNN_MODELS[model]
    if isinstance(model, str) and model in SEED_MODELS:
        values["model"] = SEED_MODELS[model]
        notes.append(f"--model {model}: NNLO's example model; distnn trains its zoo model "
                     f"{SEED_MODELS[model]} (a small CNN of the same kind)")
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
    for name, note in NOTES.items():
        value = values.get(name)
        if value not in (None, False) and not (name == "n_processes" and value == 1):
            notes.append(f"--{name} {value}: {note}" if value is not True
                         else f"--{name}: {note}")
    launcher = {key: values.get(name) for name, key in LAUNCHER_FLAGS.items()
                if values.get(name) not in (None, False)}
    if launcher:
        raw = {k: "1" if v is True else str(v) for k, v in launcher.items()}
        given, said = session_values(raw, "tmlauncher")
        for name, value in given.items():
            if name not in explicit:
                values[name] = value
        notes += said
    if values.get("tracing") and not values.get("trace"):
        values["trace"] = "distnn-trace.json"
        notes.append("--tracing: distnn writes a Chrome trace (layers and communication) to "
                     "distnn-trace.json (choose the file with --trace FILE); PyDTNN's "
                     "Extrae/Simple tracers are not available")
    if values.get("use_blocking_mpi") is not None:
        values["non_blocking_mpi"] = not values["use_blocking_mpi"]
    if values.get("shared_storage") is False:
        values["every_rank_writes"] = True
    for name in ("enable_gpu", "enable_gpudirect", "enable_nccl"):
        if values.get(name):
            raise ValueError(f"--{name}: no GPU backend in this build (distnn computes on "
                             "CPUs with NumPy; start more ranks with mpiexec -n N instead); "
                             f"drop --{name} or set it to false, got true")
    for name in FOREIGN_BY_NAME:
        values.pop(name, None)
    return notes
