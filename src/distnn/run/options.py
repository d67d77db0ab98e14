"""The options of a distnn run: one table (``OPTIONS``: name, kind, default, help, --help
group, config section, commands). The table makes the frozen config dataclasses of
``run.config`` (a section's fields are its options), the ``distnn`` command's parser and
the keys of TOML files, so an option is declared once, here. Only distnn's own names and
meanings are here; other systems' spellings are the command's (``distnn.cli.compat``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .kinds import Bool, FileList, Float, Int, KeyValues, Kind, List, Maybe, Shape, Str


# -- registries the choices come from (imported lazily: --help stays fast) ---------------
def _models():
    from ..models import MODELS
    return MODELS


def _datasets():
    from ..data import DATASETS
    return DATASETS


def _optimizers():
    from ..optim import OPTIMIZERS
    return OPTIMIZERS


def _losses():
    from ..nn.losses import LOSSES
    return LOSSES


def _parallel_modes():
    from ..rules import ALIASES, RULES
    return ("auto", "sequential", *RULES, *ALIASES)


def _schedulers():
    from ..training.callbacks import CALLBACKS
    return CALLBACKS


class ModelSpec(Str):
    """A zoo name (any case) or a user's model: FILE.py, FILE.py:NAME or MODULE:NAME
    (``distnn.models.files``; kept as written)."""

    metavar = "NAME|FILE.py[:FN]"

    def check(self, value):
        from ..models.files import is_model_spec
        if isinstance(value, str) and is_model_spec(value):
            return value
        try:
            return super().check(value)
        except ValueError as exc:
            raise ValueError(f"{exc} (or a model file: FILE.py, FILE.py:NAME, "
                             "MODULE:NAME)") from None


class CompressionSpec(Str):
    """none, fp16, topk:RATIO, threshold:VALUE or powersgd:RANK (checked, lower-cased)."""

    metavar = "none|fp16|topk:R|threshold:V|powersgd:R"

    def check(self, value):
        from ..distributed.compression import parse_compression
        if not isinstance(value, str):
            raise ValueError(f"must be a string such as topk:0.01, got {value!r}")
        spec = parse_compression(value)
        return spec if isinstance(spec, str) else spec.spec


# -- the option table -----------------------------------------------------------------------
TRAIN, EVAL, PRED = "train", "evaluate", "predict"
ALL = (TRAIN, EVAL, PRED)


@dataclass(frozen=True)
class Option:
    """One option: ``--name`` (also ``--name-with-dashes`` and ``aliases``) and config key."""

    name: str
    kind: Kind
    default: Any
    help: str
    group: str
    section: str
    commands: tuple[str, ...] = ALL
    aliases: tuple[str, ...] = ()
    short: tuple[str, ...] = ()  # single-dash flags (-r=)

    def flags(self, aliases: tuple[str, ...] = ()) -> list[str]:
        """``--name``, ``--name-with-dashes``, the aliases (and ``aliases``) alike, ``-short``."""
        out = []
        for n in (self.name, *self.aliases, *aliases):
            for spelling in (n, n.replace("_", "-")):
                if f"--{spelling}" not in out:
                    out.append(f"--{spelling}")
        return out + [f"-{s}" for s in self.short]


GROUPS = {
    "model": "Model", "data": "Dataset", "train": "Training", "optim": "Optimizer",
    "sched": "Learning-rate schedulers and callbacks", "parallel": "Parallel execution",
    "output": "Output, profiling and tracing", "predict": "Prediction",
}

_O = Option
OPTIONS: list[Option] = [
    # Model
    _O("model", ModelSpec(_models), "simplecnn", "Model of the zoo (simplecnn, simplemlp, "
       "lenet, alexnet, vgg16, resnet20, ...), or your own: FILE.py (calls its build_model() "
       "or get_model()), FILE.py:NAME or MODULE:NAME, returning a distnn Sequential or a "
       "torch.nn.Module.", "model", "model"),
    _O("dtype", Str(("float32", "float64")), "float32", "Floating-point type of weights and "
       "data.", "model", "model"),
    _O("weights_and_bias_filename", Maybe(Str(metavar="FILE")), None, "Load weights and "
       "biases from this .npz before training/evaluating (required by evaluate and predict).",
       "model", "model", aliases=("weights",)),
    _O("random_seed", Int(0), 0, "Seed of the initial weights, shuffles and augmentation.",
       "model", "model", aliases=("seed",)),
    _O("model_args", KeyValues(), (), "Keyword arguments for the --model file's callable: "
       "NAME=VALUE,... (e.g. dense=100,dropout=0.25); distnn search sets the keys of its "
       "space that are the callable's parameters, not options.", "model", "model"),
    # Dataset
    _O("dataset", Str(_datasets), "fashion_mnist", "Dataset: fashion_mnist, mnist, cifar10, "
       "imagenet, hdf5, digits, synthetic.", "data", "data"),
    _O("dataset_path", Maybe(Str(metavar="PATH")), None, "Folder (or file) of the "
       "dataset; default: the usual places (/usr/share/datasets, $DISTNN_DATA, the cache).",
       "data", "data"),
    _O("dataset_test_path", Maybe(Str(metavar="PATH")), None, "Read the test split "
       "from this folder instead of --dataset_path.", "data", "data"),
    _O("test_as_validation", Bool(), False, "Validate on the test split after every epoch "
       "(instead of a part of the training set).", "data", "data"),
    _O("validation_split", Maybe(Float(0.0, 1.0, high_open=True)), None, "Fraction of the "
       "training set (from its end) held out for validation after every epoch (ignored with "
       "--test_as_validation); none: 0.2, or 0 when the dataset has its own validation "
       "files (hdf5 --val_list).", "data", "data", (TRAIN, PRED)),
    _O("flip_images", Bool(), False, "Randomly flip training images horizontally.", "data",
       "data", (TRAIN,)),
    _O("flip_images_prob", Float(0.0, 1.0), 0.5, "Probability of a flip.", "data", "data",
       (TRAIN,)),
    _O("crop_images", Bool(), False, "Randomly shift training images (pad and crop back).",
       "data", "data", (TRAIN,)),
    _O("crop_images_padding", Int(1), 4, "Zero pixels padded on each side before the "
       "random crop.", "data", "data", (TRAIN,)),
    _O("crop_images_prob", Float(0.0, 1.0), 0.5, "Probability of a crop.", "data", "data",
       (TRAIN,)),
    _O("crop_images_padding_mode", Str(("constant", "symmetric", "reflect", "edge")),
       "constant", "What the crop's padding holds: constant (zeros), symmetric (the border "
       "mirrored, SINGA's augmentation), reflect or edge.", "data", "data", (TRAIN,)),
    _O("download", Bool(), True, "Download the dataset when it is not found (mnist, "
       "fashion_mnist, cifar10).", "data", "data"),
    _O("normalize", Bool(), True, "Scale stored pixel values to [0, 1].", "data", "data"),
    _O("prefetch", Bool(), True, "Prepare the next batch in a background thread.", "data",
       "data"),
    _O("train_list", Maybe(FileList()), None, "hdf5: text file listing the "
       "training HDF5 files (implies --dataset hdf5). With several ranks each rank reads "
       "only its part: whole files when there are at least as many files as ranks, else "
       "its rows of each file.", "data", "data"),
    _O("val_list", Maybe(FileList()), None, "hdf5: list of validation files.",
       "data", "data"),
    _O("test_list", Maybe(FileList()), None, "hdf5: list of test files.",
       "data", "data"),
    _O("features_name", Str(lower=False), "features", "hdf5: dataset name of the features.",
       "data", "data"),
    _O("labels_name", Str(lower=False), "labels", "hdf5: dataset name of the labels.",
       "data", "data"),
    _O("data_layout", Str(("auto", "nchw", "nhwc")), "auto", "hdf5: the layout images are "
       "given to the model in: nchw (channels-last files are transposed), nhwc (as "
       "channels-last files store them, for models written for NHWC input); auto: nhwc when "
       "the --model file sets data_layout = 'nhwc', else nchw.", "data", "data"),
    _O("input_shape", Maybe(Shape()), None, "synthetic: per-sample shape C,H,W (default "
       "1,28,28).", "data", "data"),
    _O("num_classes", Maybe(Int(1)), None, "synthetic/hdf5: number of classes.", "data",
       "data"),
    _O("num_samples", Maybe(Int(1)), None, "synthetic: number of training samples.",
       "data", "data"),
    # Training
    _O("batch_size", Int(1), 64, "Batch size PER RANK (global = batch_size x ranks).",
       "train", "train"),
    _O("global_batch_size", Maybe(Int(1)), None, "Global batch size over all ranks "
       "(overrides --batch_size).", "train", "train"),
    _O("num_epochs", Int(0), 3, "Number of epochs (in total, when resuming).", "train",
       "train", (TRAIN,)),
    _O("steps_per_epoch", Int(0), 0, "Use at most this many batches per epoch (0: all); "
       "evaluation is trimmed alike.", "train", "train"),
    _O("evaluate", Maybe(Bool()), None, "true: evaluate on the test split before and after "
       "training (PyDTNN); false: never; none: after training only.", "train", "train",
       (TRAIN,)),
    _O("evaluate_only", Bool(), False, "Only evaluate the model (with "
       "--weights_and_bias_filename) on the test split.", "train", "train", (TRAIN,)),
    _O("history_file", Maybe(Str(metavar="FILE")), None, "Write the per-epoch history "
       "here (JSON, or CSV for a .csv name).", "train", "train", (TRAIN,)),
    _O("validate_every", Int(0), 0, "NNLO: also validate every N updates (0: only after "
       "each epoch); the results are printed on rank 0.", "train", "train", (TRAIN,)),
    _O("save_weights", Maybe(Str(metavar="FILE")), None, "Write the final weights "
       "(.npz) here (rank 0).", "train", "train", (TRAIN,)),
    _O("weights_layout", Str(("distnn", "pydtnn")), "distnn", "Layout of the "
       "--save_weights file: distnn ('layer/name' keys) or pydtnn (PyDTNN's "
       "'1_Conv2D_w' keys, which PyDTNN loads; --weights_and_bias_filename reads either).",
       "train", "train", (TRAIN,)),
    _O("every_rank_writes", Bool(), False, "Every rank writes its own copy of "
       "--history_file and --save_weights, and the first rank of every node its node's "
       "--checkpoint (for node-local disks; '{rank}' in a name is replaced by the rank); "
       "default: rank 0 writes them.", "train", "train", (TRAIN,)),
    _O("checkpoint", Maybe(Str(metavar="FILE")), None, "Write the full training state "
       "here every --checkpoint_freq epochs (atomic; for --resume).", "train", "train",
       (TRAIN,)),
    _O("checkpoint_freq", Int(1), 1, "Epochs between full-state checkpoints.", "train",
       "train", (TRAIN,), aliases=("checkpoint_interval",)),
    _O("checkpoint_steps", Int(0), 0, "Also write the checkpoint every N training steps "
       "(0: only at epoch ends); a resume continues mid-epoch at the exact batch, so a "
       "restart redoes at most N steps (synchronous rules).", "train", "train", (TRAIN,)),
    _O("progress_file", Maybe(Str(metavar="FILE")), None, "Rank 0 keeps this file holding "
       "'global_step epoch epoch_step global_batch' after every step (distnn launch reads "
       "it to say how many samples a restart redoes).", "train", "train", (TRAIN,)),
    _O("resume", Maybe(Str(metavar="FILE")), None, "Continue the run saved in this "
       "checkpoint (same model, optimizer and schedulers; keeps its global batch) and keep "
       "checkpointing to it (unless --checkpoint names another file).", "train", "train",
       (TRAIN,)),
    _O("overwrite", Bool(), False, "Replace an existing --checkpoint file (without it, a "
       "run refuses to start over a checkpoint it does not --resume).", "train", "train",
       (TRAIN,)),
    _O("ignore_nan", Bool(), False, "Keep training when the loss becomes NaN or infinite "
       "(default: stop at the first such step, exit status 3).", "train", "train", (TRAIN,)),
    _O("shuffle", Bool(), True, "Shuffle the training set every epoch.", "train", "train",
       (TRAIN,)),
    # Optimizer
    _O("optimizer", Str(_optimizers), "sgd", "Optimizer: sgd, rmsprop, adam, adamw, nadam, "
       "adadelta.", "optim", "optim", (TRAIN,)),
    _O("learning_rate", Float(0.0), 0.01, "Learning rate.", "optim", "optim", (TRAIN,),
       aliases=("lr",)),
    _O("learning_rate_scaling", Bool(), False, "Multiply the learning rate by the number of "
       "ranks (use with warm-up).", "optim", "optim", (TRAIN,)),
    _O("lr_per_sample", Bool(), False, "--learning_rate is a rate per sample (PyDTNN's "
       "meaning): each step applies it divided by the global batch size (batch_size x "
       "ranks). The command sets it when its line uses PyDTNN's spellings (a note says so); "
       "give true or false to decide.", "optim", "optim", (TRAIN,)),
    _O("momentum", Float(0.0), 0.9, "Momentum (sgd, rmsprop).", "optim", "optim", (TRAIN,)),
    _O("nesterov", Bool(), False, "Nesterov momentum (sgd).", "optim", "optim", (TRAIN,)),
    _O("decay", Maybe(Float(0.0)), None, "Weight decay (default: the optimizer's own).",
       "optim", "optim", (TRAIN,), aliases=("weight_decay",)),
    _O("beta1", Maybe(Float(0.0, 1.0, high_open=True)), None, "beta1 (adam, adamw, "
       "nadam; default 0.9).", "optim", "optim", (TRAIN,)),
    _O("beta2", Maybe(Float(0.0, 1.0, high_open=True)), None, "beta2 (adam, adamw, "
       "nadam; default 0.999).", "optim", "optim", (TRAIN,)),
    _O("epsilon", Maybe(Float(0.0, low_open=True)), None, "epsilon (rmsprop, adam*, "
       "nadam, adadelta; default: the optimizer's own).", "optim", "optim", (TRAIN,)),
    _O("rho", Maybe(Float(0.0, 1.0, high_open=True)), None, "rho (rmsprop's alpha, "
       "adadelta; default: the optimizer's own).", "optim", "optim", (TRAIN,)),
    _O("loss_func", Str(_losses), "categorical_cross_entropy",
       "Loss: categorical_cross_entropy, binary_cross_entropy, mse, mae. mse, mae and bce "
       "train on one-hot labels.",
       "optim", "optim"),
    _O("metrics", List(), ("categorical_accuracy",), "Comma-separated metrics: "
       "categorical_accuracy (acc), top5, categorical_hinge, categorical_mse, categorical_mae, "
       "mse, mae.", "optim", "optim"),
    # Schedulers and callbacks
    _O("lr_schedulers", List(_schedulers), (), "Comma-separated: warm_up, early_stopping, "
       "reduce_lr_on_plateau, reduce_lr_every_nepochs, stop_at_loss, model_checkpoint.",
       "sched", "sched", (TRAIN,)),
    _O("warm_up_epochs", Float(0.0), 5.0, "warm_up: epochs of linear warm-up.", "sched",
       "sched", (TRAIN,)),
    _O("warm_up_batches", Int(0), 0, "warm_up: batches of linear warm-up (overrides "
       "--warm_up_epochs).", "sched", "sched", (TRAIN,)),
    _O("early_stopping", Maybe(Str(lower=False, metavar="SPEC")), None, "NNLO syntax "
       "'metric,op,patience', e.g. 'val_loss,~<,4' ('~' compares the mean of the last "
       "patience epochs with the patience before; '<'/'>' compare with the best).", "sched",
       "sched", (TRAIN,)),
    _O("early_stopping_metric", Str(lower=False), "val_loss", "early_stopping: metric.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_patience", Int(1), 10, "early_stopping: epochs without improvement.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_min_delta", Float(0.0), 0.0, "early_stopping: minimum improvement.",
       "sched", "sched", (TRAIN,)),
    _O("early_stopping_restore_best", Bool(), False, "early_stopping: restore the weights "
       "of the best epoch at the end.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_metric", Str(lower=False), "val_loss", "reduce_lr_on_plateau: "
       "metric.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_factor", Float(0.0, 1.0, True, True), 0.1,
       "reduce_lr_on_plateau: new_lr = lr * factor.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_patience", Int(1), 5, "reduce_lr_on_plateau: epochs without "
       "improvement.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_on_plateau_min_lr", Float(0.0), 0.0, "reduce_lr_on_plateau: lower bound.",
       "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_factor", Float(0.0, 1.0, low_open=True), 0.1,
       "reduce_lr_every_nepochs: new_lr = lr * factor.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_nepochs", Int(1), 5, "reduce_lr_every_nepochs: period in "
       "epochs.", "sched", "sched", (TRAIN,)),
    _O("reduce_lr_every_nepochs_min_lr", Float(0.0), 0.0, "reduce_lr_every_nepochs: lower "
       "bound.", "sched", "sched", (TRAIN,)),
    _O("stop_at_loss_metric", Str(lower=False), "val_accuracy", "stop_at_loss: metric.",
       "sched", "sched", (TRAIN,)),
    _O("stop_at_loss_threshold", Maybe(Float(-math.inf)), None, "stop_at_loss: stop once the "
       "metric reaches this value (>= for accuracies, <= for losses); required by "
       "stop_at_loss.", "sched", "sched", (TRAIN,)),
    _O("target_metric", Maybe(Str(lower=False, metavar="SPEC")), None, "NNLO syntax "
       "'metric,op,value', e.g. 'val_acc,>,0.97': stop when reached.", "sched", "sched",
       (TRAIN,)),
    _O("model_checkpoint_metric", Str(lower=False), "val_loss", "model_checkpoint: metric "
       "for --model_checkpoint_best_only.", "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_save_freq", Int(1), 2, "model_checkpoint: epochs between saves.",
       "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_best_only", Bool(), False, "model_checkpoint: save only when the "
       "metric improved.", "sched", "sched", (TRAIN,)),
    _O("model_checkpoint_file", Str(lower=False, metavar="PATTERN"),
       "checkpoint-{epoch:03d}.npz", "model_checkpoint: weights file name ({epoch} and "
       "logged keys are filled in).", "sched", "sched", (TRAIN,)),
    # Parallel execution
    _O("parallel", Str(_parallel_modes), "auto", "Training rule: data (synchronous "
       "all-reduce, alias bsp), localsgd (periodic averaging), downpour (asynchronous "
       "parameter server on rank 0), easgd (elastic averaging), gossip (GoSGD, alias gosgd), "
       "gem (gradient energy matching), partial (local steps, one chunk of the weights "
       "averaged per step); sequential (one process) or auto (data).",
       "parallel", "parallel"),
    _O("stall_warning", Float(0.0, low_open=True), 60.0, "Seconds a rank waits in a "
       "collective (or for a master/peer) before it names the ranks that have not arrived "
       "and where each last was (step, phase).", "parallel", "parallel", (TRAIN,)),
    _O("stall_timeout", Maybe(Float(0.0, low_open=True)), None, "Seconds of such waiting "
       "after which the job ends with exit status 4, naming those ranks (default: never); "
       "the last checkpoint stays resumable.", "parallel", "parallel", (TRAIN,)),
    _O("sync_every", Maybe(Int(1)), None, "Batches between two exchanges: downpour/gem "
       "pushes, easgd's tau, localsgd's averaging period (default: 1, 1, 4, 8).",
       "parallel", "parallel", (TRAIN,), aliases=("localsgd_period",)),
    _O("synchronous", Bool(), False, "downpour/gem: the master waits for every worker each "
       "round; easgd: all-reduce EASGD without a master; gossip: shared, deterministic push "
       "schedule.", "parallel", "parallel", (TRAIN,)),
    _O("elastic_force", Float(0.0, 1.0), 0.9, "easgd: rho; the moving rate is "
       "elastic_force x elastic_lr (0: independent workers).", "parallel", "parallel",
       (TRAIN,)),
    _O("elastic_lr", Maybe(Float(0.0, 1.0, low_open=True)), None, "easgd: eta (default "
       "1 / number of workers).", "parallel", "parallel", (TRAIN,)),
    _O("elastic_momentum", Float(0.0, 1.0, high_open=True), 0.0, "easgd: momentum of the "
       "centre's moves.", "parallel", "parallel", (TRAIN,)),
    _O("worker_optimizer", Maybe(Str(_optimizers)), None, "easgd: optimizer of the workers' "
       "local steps (default: --optimizer).", "parallel", "parallel", (TRAIN,)),
    _O("gem_lr", Maybe(Float(0.0, low_open=True)), None, "gem: learning rate eta (default: "
       "--learning_rate and its schedule).", "parallel", "parallel", (TRAIN,)),
    _O("gem_momentum", Float(0.0, 1.0, high_open=True), 0.9, "gem: momentum of the energy "
       "proxy.", "parallel", "parallel", (TRAIN,)),
    _O("gem_kappa", Float(0.0, low_open=True), 1.0, "gem: proxy amplification kappa.",
       "parallel", "parallel", (TRAIN,)),
    _O("gossip_probability", Float(0.0, 1.0, low_open=True), 0.25, "gossip: probability "
       "that a rank pushes its weights to a random peer after a step.", "parallel",
       "parallel", (TRAIN,), aliases=("gossip_p",)),
    _O("gossip_alpha", Maybe(Float(0.0, 1.0, low_open=True)), None, "gossip: initial mixing "
       "weight of each rank (default 1 / ranks).", "parallel", "parallel", (TRAIN,)),
    _O("partial_chunks", Int(1), 4, "partial: cut the flat weights into this many "
       "contiguous chunks; after each local step one chunk is averaged over the ranks, in "
       "turn (each once every N steps; 1: all, every step).", "parallel", "parallel",
       (TRAIN,)),
    _O("non_blocking_mpi", Bool(), True, "Overlap the gradient all-reduce with backward.",
       "parallel", "parallel", (TRAIN,)),
    _O("bucket_size_mb", Float(0.0), 4.0, "Gradient all-reduce bucket size in MiB.",
       "parallel", "parallel", (TRAIN,)),
    _O("sync_batchnorm", Bool(), False, "Batch-norm statistics over the global batch.",
       "parallel", "parallel", (TRAIN,)),
    _O("gradient_compression", CompressionSpec(), "none", "Gradients travel as: none "
       "(own dtype), fp16, topk:RATIO (each tensor's largest RATIO share), threshold:VALUE "
       "(entries with |g| >= VALUE) or powersgd:RANK (low-rank factors); --parallel data "
       "only. topk/threshold/powersgd keep what they did not send (--error_feedback) and "
       "send 1-D and small tensors dense.", "parallel", "parallel", (TRAIN,)),
    _O("compression_warmup_steps", Int(0), 0, "Dense steps before --gradient_compression "
       "topk/threshold/powersgd starts (PowerSGD's start_powerSGD_iter).", "parallel",
       "parallel", (TRAIN,)),
    _O("error_feedback", Bool(), True, "topk/threshold/powersgd: add what a rank did not "
       "send to its next gradient (false: drop it).", "parallel", "parallel", (TRAIN,)),
    _O("threads", Int(0), 0, "Threads per rank, for BLAS and the compiled kernels (0: 1 per "
       "rank with several ranks, else the libraries' defaults).", "parallel", "parallel"),
    # Output
    _O("quiet", Bool(), False, "No progress bars, parameters or summary; only results.",
       "output", "output"),
    _O("verbose", Bool(), False, "Print every option's value and the model summary (by "
       "default: one summary line).", "output", "output"),
    _O("profile", Bool(), False, "Per-layer forward/backward time and all-reduce wait per "
       "epoch, and (PyDTNN's meaning) the cProfile functions with the most cumulative time "
       "at the end (rank 0); --cprofile FILE keeps the full statistics.", "output",
       "output", (TRAIN,)),
    _O("trace", Maybe(Str(metavar="FILE")), None, "Write a Chrome-trace JSON of layer "
       "forward/backward and communication (rank r writes FILE.rank{r}).", "output",
       "output", (TRAIN,)),
    _O("trace_merged", Bool(), False, "Gather the traces of all ranks into the one --trace "
       "FILE.", "output", "output", (TRAIN,)),
    _O("tensorboard", Maybe(Str(lower=False, metavar="DIR")), None, "Write TensorBoard "
       "event files in DIR (rank 0): training loss, metrics, learning rate, samples/s and "
       "communication per step, every logged value per epoch, the options as text (needs "
       "tensorboardX: pip install 'distnn[tensorboard]'; then tensorboard --logdir DIR).",
       "output", "output", (TRAIN,)),
    _O("tensorboard_every", Int(0), 10, "--tensorboard: write the per-step values every N "
       "steps (0: per epoch only).", "output", "output", (TRAIN,)),
    _O("plot", Maybe(Str(lower=False, metavar="FILE.png")), None, "At the end, draw the "
       "loss and every metric per epoch, training and validation, into this PNG (needs "
       "matplotlib; distnn plot compares the history files of several runs).", "output",
       "output", (TRAIN,)),
    _O("cprofile", Maybe(Str(metavar="FILE")), None, "Dump cProfile statistics here "
       "(FILE.rank{r} with several ranks).", "output", "output"),
    _O("traceback", Bool(), False, "Show Python tracebacks for user errors too.", "output",
       "output"),
    # Prediction
    _O("split", Str(("train", "val", "test")), "test", "Split to predict.", "predict",
       "predict", (PRED,)),
    _O("output", Maybe(Str(metavar="FILE")), None, "Predictions file: .npy (logits), "
       ".npz (logits, predicted, labels) or .csv (index, predicted, label).", "predict",
       "predict", (PRED,)),
]
OPTION_BY_NAME = {o.name: o for o in OPTIONS}
_ALIAS = {a: o.name for o in OPTIONS for a in o.aliases}


def canonical(key: str) -> str:
    """Option name of a command-line or TOML key (dashes, aliases accepted)."""
    k = key.strip().lstrip("-").replace("-", "_")
    return _ALIAS.get(k, k)
