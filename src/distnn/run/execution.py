"""The sections of a run's configuration that say how it runs and what it writes: the
parallel training (the rule, its arguments, compression, threads, the stall inspector),
the outputs, and ``distnn predict``'s. The other sections are in ``sections``; import
them all from ``config``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .kinds import (Bool, CompressionSpec, Float, Int, KernelPlan, KeyValues, Maybe,
                    Str, optimizers,
                    parallel_modes)
from .sections import ALL, PRED, TRAIN, Section, option


@dataclass(frozen=True)
class ParallelConfig(Section):
    """Data parallelism over MPI: training rule and its options, all-reduce, threads."""

    title: ClassVar[str] = "Parallel execution"
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    parallel: str = option("auto", Str(parallel_modes),
        "Training rule: data (synchronous all-reduce, alias bsp), localsgd (periodic "
        "averaging), downpour (asynchronous parameter server on rank 0), easgd (elastic "
        "averaging), gossip (GoSGD, alias gosgd), gem (gradient energy matching), partial "
        "(local steps, one chunk of the weights averaged per step), pipeline (delayed SGD: "
        "gradients one step stale, their all-reduce behind the next step; alias delayed), "
        "fedavg (federated averaging: rounds of clients training locally on their own part), "
        "diloco (DiLoCo: --sync_every H steps of each rank's own inner optimizer, then an outer "
        "Nesterov step on the ranks' averaged moves; --rule_args outer_lr, outer_momentum, "
        "inner_optimizer); sequential (one process) or auto (data).", commands=ALL)
    stall_warning: float = option(60.0, Float(0.0, low_open=True),
        "Seconds a rank waits in a collective (or for a master/peer) before it names the ranks "
        "that have not arrived and where each last was (step, phase).")
    stall_timeout: float | None = option(None, Maybe(Float(0.0, low_open=True)),
        "Seconds of such waiting after which the job ends with exit status 4, naming those "
        "ranks (default: never); the last checkpoint stays resumable.")
    sync_every: int | None = option(None, Maybe(Int(1)),
        "Batches between two exchanges: downpour/gem pushes, easgd's tau, localsgd's averaging "
        "period, diloco's inner steps H (default: 1, 1, 4, 8, 50).", aliases=("localsgd_period",))
    synchronous: bool = option(False, Bool(),
        "downpour/gem: the master waits for every worker each round; easgd: all-reduce EASGD "
        "without a master; gossip: shared, deterministic push schedule.")
    group_size: int = option(1, Int(1),
        "downpour, easgd, gem, localsgd, gossip: ranks per worker (NNLO's --n-processes). A "
        "group's ranks train synchronously (gradients summed inside it, as --parallel data) and "
        "its first rank exchanges for it (with the master, or the other groups' first ranks); "
        "groups are cut host by host. Under data every rank "
        "already trains synchronously with all the others: it changes nothing.")
    # localsgd's averages (PyDTNN's --model-sync-algo/-participation/-min-avail/-dtype)
    sync_weighting: str = option("wavg", Str(("wavg", "avg", "invwavg")),
        "localsgd: weights of the replicas in an average: wavg (samples each trained since "
        "the last average), avg (equal), invwavg (inverse: min + max - samples).",
        argument="weighting")
    sync_participation: str = option("all", Str(("all", "avail2all", "ready")),
        "localsgd: ranks taking part in an average: all, avail2all (those that trained "
        "on a sample since the last one; the others take the average) or ready (rank 0 "
        "averages the first --sync_min_avail replicas to reach it, a late rank is left out "
        "and not waited for).",
        argument="participation")
    sync_min_avail: int = option(0, Int(0),
        "localsgd: skip an average fewer ranks than this take part in (never the epoch "
        "end's).", argument="min_avail")
    sync_dtype: str = option("none", Str(("none", "float16", "float32", "float64")),
        "localsgd: dtype the replicas are all-reduced in (none: the model's).")
    # fedavg's rounds and how its clients' data is cut (data/partition.py)
    clients: int = option(0, Int(0),
        "fedavg: the number of clients, dealt to the ranks round-robin (0: one per rank).")
    client_fraction: float = option(1.0, Float(0.0, 1.0, low_open=True),
        "fedavg: the share of the clients drawn each round (an epoch is a round).")
    local_epochs: int = option(1, Int(1),
        "fedavg: epochs each drawn client trains on its part per round.")
    fedprox_mu: float = option(0.0, Float(0.0),
        "fedavg: FedProx's proximal term mu (0: plain FedAvg).")
    partition: str = option("iid", Str(("iid", "dirichlet", "shards")),
        "fedavg: how the training set is cut among the clients: iid, dirichlet (each "
        "class split in Dirichlet(--dirichlet_alpha) proportions) or shards (sorted by "
        "label, --shards_per_client shards each).")
    dirichlet_alpha: float = option(0.5, Float(0.0, low_open=True),
        "--partition dirichlet: the concentration (small: few classes per client).")
    shards_per_client: int = option(2, Int(1),
        "--partition shards: label shards per client.")
    secure_aggregation: bool = option(False, Bool(),
        "fedavg: sum the clients' updates with pairwise masks (Bonawitz et al.): no client's "
        "update leaves its process unmasked; the sum is exact in 64-bit fixed point.")
    encryption: str = option("none", Str(("none", "ckks", "tenseal")),
        "fedavg: encrypt each rank's sum of its clients' updates with CKKS (TenSEAL, "
        "python -m pip install tenseal; tenseal is PyDTNN's name of it) before the "
        "exchange; the ranks share the keys.")
    encryption_slots: int = option(4096, Int(1),
        "--encryption: values per ciphertext (4096 or 8192).")
    encryption_scale: float = option(2.0 ** 40, Float(0.0, low_open=True),
        "--encryption: CKKS's scale (a power of two, 2**20 to 2**50).")
    encryption_security: int = option(128, Int(1),
        "--encryption: bits of security (128).")
    masters: int = option(1, Int(1),
        "downpour, easgd: sub-masters under a top master (NNLO's --n-masters): ranks 1..M "
        "serve the workers and exchange with rank 0 every --sync_every of their updates.")
    elastic_force: float = option(0.9, Float(0.0, 1.0),
        "easgd: rho; the moving rate is elastic_force x elastic_lr (0: independent workers).")
    elastic_lr: float | None = option(None, Maybe(Float(0.0, 1.0, low_open=True)),
        "easgd: eta (default 1 / number of workers).")
    elastic_momentum: float = option(0.0, Float(0.0, 1.0, high_open=True),
        "easgd: momentum of the centre's moves.")
    worker_optimizer: str | None = option(None, Maybe(Str(optimizers)),
        "easgd: optimizer of the workers' local steps (default: --optimizer).")
    gem_lr: float | None = option(None, Maybe(Float(0.0, low_open=True)),
        "gem: learning rate eta (default: --learning_rate and its schedule).")
    gem_momentum: float = option(0.9, Float(0.0, 1.0, high_open=True),
        "gem: momentum of the energy proxy.")
    gem_kappa: float = option(1.0, Float(0.0, low_open=True),
        "gem: proxy amplification kappa.")
    gossip_probability: float = option(0.25, Float(0.0, 1.0, low_open=True),
        "gossip: probability that a rank pushes its weights to a random peer after a step.",
        aliases=("gossip_p",), argument="probability")
    gossip_alpha: float | None = option(None, Maybe(Float(0.0, 1.0, low_open=True)),
        "gossip: initial mixing weight of each rank (default 1 / ranks).",
        argument="alpha")
    partial_chunks: int = option(4, Int(1),
        "partial: cut the flat weights into this many contiguous chunks; after each local step "
        "one chunk is averaged over the ranks, in turn (each once every N steps; 1: all, every "
        "step).", argument="chunks")
    rule_args: tuple[tuple[str, Any], ...] = option((), KeyValues(),
        "Arguments of the --parallel rule's constructor that no option of their own sets "
        "(a rule declares them in its own file): NAME=VALUE,... (values read as numbers, "
        "true/false or text; in TOML a table).")
    non_blocking_mpi: bool = option(True, Bool(),
        "Overlap the gradient all-reduce with backward.",
        argument="non_blocking")
    bucket_size_mb: float = option(4.0, Float(0.0),
        "Gradient all-reduce bucket size in MiB; under --shard 2 and 3 the least size of "
        "the runs of layers exchanged by one reduce-scatter/all-gather (0: layer by "
        "layer).")
    autotune: bool = option(False, Bool(),
        "data: try gradient bucket sizes during the first steps and keep the fastest (the "
        "slowest rank's median step time), printing the choice (Horovod's HOROVOD_AUTOTUNE).")
    autotune_steps: int = option(5, Int(1),
        "data: timed steps per bucket size that --autotune tries.")
    sync_batchnorm: bool = option(False, Bool(),
        "Batch-norm statistics over the global batch.")
    gradient_compression: str = option("none", CompressionSpec(),
        "Gradients travel as: none (own dtype), fp16, topk:RATIO (each tensor's largest RATIO "
        "share), threshold:VALUE (entries with |g| >= VALUE) or powersgd:RANK (low-rank "
        "factors); --parallel data only. topk/threshold/powersgd keep what they did not send "
        "(--error_feedback) and send 1-D and small tensors dense.",
        argument="compression")
    compression_warmup_steps: int = option(0, Int(0),
        "Dense steps before --gradient_compression topk/threshold/powersgd starts (PowerSGD's "
        "start_powerSGD_iter).")
    error_feedback: bool = option(True, Bool(),
        "topk/threshold/powersgd: add what a rank did not send to its next gradient (false: "
        "drop it).")
    shard: int = option(0, Int(0, 3),
        "data: shard the training state over the ranks (ZeRO stages): 1 the optimizer state, "
        "2 also the gradients (reduce-scattered during backward), 3 also the parameters "
        "(all-gathered layer by layer before its forward and backward); 0: a whole replica "
        "on every rank. The same updates as 0; a checkpoint is written by every rank, its "
        "own slice, and resumes on any number of ranks.")
    pipeline_stages: int = option(1, Int(1),
        "Cut the model's top-level layers into this many pipeline stages, one per rank; "
        "ranks = replicas x stages (each stage's gradients all-reduced over its replicas). "
        "--parallel data only; 1: no pipeline.", argument="stages")
    micro_batches: int = option(1, Int(1),
        "--pipeline_stages: micro-batches per replica's batch (must divide --batch_size); "
        "gradients are summed over them before the step.")
    pipeline_schedule: str = option("gpipe", Str(("gpipe", "1f1b")),
        "--pipeline_stages: gpipe (all forwards, then all backwards) or 1f1b (one forward, "
        "one backward in turn: fewer live activations). Not a learning-rate schedule.",
        aliases=("schedule",), argument="schedule")
    pipeline_balance: str = option("time", Str(),
        "--pipeline_stages: where the stages are cut: time (each layer's forward+backward "
        "timed on one micro-batch), params (parameter counts: reproducible) or the first "
        "layer of each stage after the first, e.g. 2,5.",
        argument="balance")
    threads: int = option(0, Int(0, 1 << 12),
        "Threads per rank, for BLAS and the compiled kernels (0: DISTNN_NUM_THREADS or "
        "OMP_NUM_THREADS when set, else the rank's cores shared among the ranks of its node "
        "that share them: distnn.distributed.threads_per_rank).", commands=ALL)

    kernels: str = option("fixed", KernelPlan(),
        "How each layer's kernel method is chosen: fixed (the planner's thresholds: the "
        "same on every run and rank, N ranks = 1 rank bit for bit), measure (at a layer's "
        "first use every eligible method is timed on its shape and the fastest kept; "
        "choices cached in ~/.cache/distnn/kernel-plans.json, so a second run plans at "
        "once) or plan:FILE (the choices of such a file).", commands=ALL)

    def rule_arguments(self) -> dict[str, Any]:
        """Every field by the name of the training rules' constructor argument it sets
        (``rules.build_rule`` takes those its rule has), and ``rule_args``' pairs: the
        arguments no field sets (``run.rule.build_rule`` checks that its rule takes them)."""
        out = {f.metadata.get("argument", f.name): getattr(self, f.name)
               for f in fields(self) if f.name != "rule_args"}
        out.update(self.rule_args)
        return out

    @staticmethod
    def rule_arguments_of(option: str) -> str:
        """The training rules' constructor argument that ``option`` sets."""
        return next(f.metadata.get("argument", f.name) for f in fields(ParallelConfig)
                    if f.name == option)

    @staticmethod
    def option_of(argument: str | None) -> str | None:
        """The option that sets a training rule's constructor ``argument``, if any."""
        for f in fields(ParallelConfig):
            if f.metadata.get("argument", f.name) == argument:
                return f.name
        return None


@dataclass(frozen=True)
class OutputConfig(Section):
    """Verbosity, profiling and tracing."""

    title: ClassVar[str] = "Output, profiling and tracing"
    commands: ClassVar[tuple[str, ...]] = (TRAIN,)
    quiet: bool = option(False, Bool(),
        "No progress bars, parameters or summary; only results.", commands=ALL)
    verbose: bool = option(False, Bool(),
        "Print every option's value and the model summary (by default: one summary line).",
        commands=ALL)
    profile: bool = option(False, Bool(),
        "Per-layer forward/backward time and all-reduce wait per epoch, and (PyDTNN's meaning) "
        "the cProfile functions with the most cumulative time at the end (rank 0); --cprofile "
        "FILE keeps the full statistics.")
    trace: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Write a Chrome-trace JSON of layer forward/backward and communication (rank r writes "
        "FILE.rank{r}).")
    trace_merged: bool = option(False, Bool(),
        "Gather the traces of all ranks into the one --trace FILE.")
    tensorboard: str | None = option(None, Maybe(Str(lower=False, metavar="DIR")),
        "Write TensorBoard event files in DIR (rank 0): training loss, metrics, learning rate, "
        "samples/s and communication per step, every logged value per epoch, the options as "
        "text (needs tensorboardX: pip install 'distnn[tensorboard]'; then tensorboard --logdir "
        "DIR).")
    tensorboard_every: int = option(10, Int(0),
        "--tensorboard: write the per-step values every N steps (0: per epoch only).")
    plot: str | None = option(None, Maybe(Str(lower=False, metavar="FILE.png")),
        "At the end, draw the loss and every metric per epoch, training and validation, into "
        "this PNG (needs matplotlib; distnn plot compares the history files of several runs).")
    cprofile: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Dump cProfile statistics here (FILE.rank{r} with several ranks).", commands=ALL)
    traceback: bool = option(False, Bool(),
        "Show Python tracebacks for user errors too.", commands=ALL)


@dataclass(frozen=True)
class PredictConfig(Section):
    """What ``distnn predict`` writes."""

    title: ClassVar[str] = "Prediction"
    commands: ClassVar[tuple[str, ...]] = (PRED,)
    split: str = option("test", Str(("train", "val", "test")),
        "Split to predict.")
    output: str | None = option(None, Maybe(Str(metavar="FILE")),
        "Predictions file: .npy (logits), .npz (logits, predicted, labels) or .csv (index, "
        "predicted, label).")
    predictions_per_rank: bool = option(False, Bool(),
        "Every rank writes its own rows (with their dataset index) to --output with '{rank}' "
        "replaced, or .rank<r> before the extension; nothing is gathered on rank 0 (outputs "
        "too big for one rank). .npz or .csv only.")
