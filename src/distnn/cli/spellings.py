"""PyDTNN's and NNLO's spellings of distnn's options, for ``distnn.cli.compat``:

* ``ALIASES``, ``SEARCH_ALIASES``: their names of distnn's options (``--epochs`` is
  ``--num_epochs``);
* ``WIDE_KINDS`` and the ``*_SPELLINGS``: their values of distnn's options (PyDTNN's
  ``--loss_func`` list, ``vgg16_cifar10``, NNLO's ``--model mnist``);
* ``FOREIGN_OPTIONS``: their options with no option of the same meaning here;
* ``name_of``, ``option_of``: the option a command-line or file key names.
"""
from __future__ import annotations

import dataclasses

from ..run.kinds import Bool, Float, Int, Kind, Maybe, ModelSpec, Str
from ..run.options import OPTION_BY_NAME, TRAIN, Option, canonical

# -- their names of distnn's options --------------------------------------------------------
ALIASES = {
    # PyDTNN
    "dataset_train_path": "dataset_path", "augment_flip": "flip_images",
    "augment_flip_prob": "flip_images_prob", "crop_images_size": "crop_images_padding",
    "augment_crop_prob": "crop_images_prob", "synthetic_input_shape": "input_shape",
    "synthetic_train_samples": "num_samples", "optimizer_momentum": "momentum",
    "optimizer_nesterov": "nesterov", "optimizer_beta1": "beta1", "optimizer_beta2": "beta2",
    "optimizer_epsilon": "epsilon", "optimizer_rho": "rho", "schedulers": "lr_schedulers",
    "tracer_output": "trace", "decay_rate": "decay",
    # NNLO
    "train_data": "train_list", "val_data": "val_list", "batch": "batch_size",
    "epochs": "num_epochs", "restore": "resume", "checkpoint_int": "checkpoint_freq",
    "loss": "loss_func", "early": "early_stopping", "mode": "parallel",
    "n_processes": "group_size", "n_masters": "masters",
}
SEARCH_ALIASES = {"opt_restore": "resume"}  # NNLO's names of distnn search's options

# -- their values of distnn's options -------------------------------------------------------
LOSS_SPELLINGS = {"categorical_crossentropy": "categorical_cross_entropy",
                  "binary_crossentropy": "binary_cross_entropy", "regression_mse": "mse",
                  "regression_mae": "mae", "mean_squared_error": "mse",
                  "mean_absolute_error": "mae",
                  # Keras: integer labels (distnn's are integers either way)
                  "sparse_categorical_crossentropy": "categorical_cross_entropy"}
METRIC_SPELLINGS = {"regression_mse": "mse", "regression_mae": "mae",
                    "sparse_categorical_accuracy": "accuracy"}
# NNLO's built-in example models (TrainingDriver --model mnist|cifar10): distnn's zoo
# model of the same kind (with a note).
SEED_MODELS = {"mnist": "simplecnn", "mnist_torch": "simplecnn", "cifar10": "simplecnn"}
# PyDTNN's names of the CIFAR-10 models of the zoo (the same convolutions; PyDTNN's vggNbn
# also normalizes its head). alexnet_cifar10 is in the zoo under its own name.
PYDTNN_MODELS = {f"vgg{d}{bn}_cifar10": f"vgg{d}{bn}" for d in (11, 13, 16, 19)
                 for bn in ("", "bn")}


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
    _O("effective_learning_rate", Maybe(Float(0.0)), None, "PyDTNN: the rate each step "
       "applies (its learning_rate / global batch): --learning_rate with --lr_per_sample "
       "false.", "optim", FOREIGN, (TRAIN,)),
    # PyDTNN 3.x's model synchronization (``compat.model_sync`` translates them)
    _O("model_sync_freq", Int(-(1 << 31)), 0, "PyDTNN: N > 0 averages the weights every N batches "
       "(--parallel localsgd --sync_every N); 0: gradients every batch (--parallel data).",
       "parallel", FOREIGN, (TRAIN,)),
    _O("model_sync_algo", Str(("avg", "wavg", "invwavg")), "avg", "PyDTNN: avg | wavg | "
       "invwavg = --sync_weighting.", "parallel", FOREIGN, (TRAIN,),
       aliases=("model_sync_alg",)),
    _O("model_sync_participation", Str(("all", "avail2all")), "all", "PyDTNN: "
       "= --sync_participation.", "parallel", FOREIGN, (TRAIN,)),
    _O("model_sync_min_avail", Int(0), 0, "PyDTNN: = --sync_min_avail.", "parallel",
       FOREIGN, (TRAIN,)),
    _O("model_sync_quantize", Bool(), False, "PyDTNN: all-reduce the weights in "
       "--model_sync_dtype (= --sync_dtype).", "parallel", FOREIGN, (TRAIN,)),
    _O("model_sync_dtype", Str(("float16", "float32", "float64")), "float16", "PyDTNN: "
       "the dtype of --model_sync_quantize.", "parallel", FOREIGN, (TRAIN,)),
    _O("initial_model_sync", Bool(), True, "PyDTNN: distnn always starts from rank 0's "
       "weights; false is refused.", "parallel", FOREIGN, (TRAIN,)),
    _O("final_model_sync", Bool(), True, "PyDTNN: distnn's localsgd averages at every "
       "epoch end; false is refused.", "parallel", FOREIGN, (TRAIN,)),
    _O("parallel_pipeline", Bool(), False, "PyDTNN: = --parallel pipeline (gradients one "
       "step stale, their all-reduce behind the next step).", "parallel", FOREIGN, (TRAIN,)),
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
