"""A cost model of one training step on N hosts x 1 rank: what each rule and compression
sends (taken from the code that sends it), what MPICH's collectives cost on a link of a
given latency and bandwidth, how much of it hides behind backward, and (with a
``CpuCost`` of ``cpu.py``, measured here) the CPU the exchange itself takes on the
rank's core. Equations, assumptions and what it leaves out: docs/costmodel.md; validated
against benchmarks/cluster.py's 2/4/8-host runs with benchmarks/costmodel_check.py.

    model = ModelCost(compute_s=0.012, tensors=parameter_tensors(net), batch=64)
    predict(Config("data", "topk:0.01"), model, hosts=64, link=Link(gbits=10))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from ..distributed.compressors import (FP16Compressor, PowerSGD, Threshold, TopK,
                                       parse_compression)
from ..distributed.halfsum import GATHER_BYTES
from ..distributed.powersgd import matrix_dims
from ..distributed.reducer import make_buckets
from ..distributed.sparse import payload_bytes, sparse_is_cheaper
from ..rules import RULES, rule_name
from ..distributed.coordination import MIN_SLEEP
from .collectives import (Link, allgather_time, allreduce_sends, allreduce_time,
                          alltoall_time, direct_sends, direct_time, master_pickup_s,
                          reduce_scatter_time)

__all__ = ["Link", "allreduce_time", "allgather_time", "alltoall_time", "ModelCost",
           "Config", "Prediction", "HalfBucket", "half_bucket", "half_buckets",
           "bucket_ranges", "data_messages", "slice_messages", "predict", "table", "tier",
           "pick", "DEFAULT_CONFIGS"]


@dataclass(frozen=True)
class ModelCost:
    """What the model needs from the user's model.

    Args:
        compute_s: forward + loss + backward + optimizer step of one rank's batch, measured
            (a rank alone, no communication).
        tensors: [(name, start, stop, shape)] of the flat gradient buffer
            (``distnn.distributed.optimizer.parameter_tensors(model)``).
        batch: samples per rank per step.
        segments: [(name, start, stop)] of the top-level layers (the Reducer's buckets are
            made of these); None: one segment per tensor.
        backward_share: share of ``compute_s`` after forward, in which the gradients
            become ready (assumed 2/3: backward costs about twice forward).
        itemsize: bytes per gradient element (float32: 4).
        cpu: a ``cpu.CpuCost`` (the exchange's own CPU a step, measured here) or None
            (not counted: the model's predictions before that term).
        slowdown: how many ways the rank's core is shared (``compute_s`` is already that
            much slower); the ``cpu`` seconds are multiplied by it.
        sleep_overshoot_s: how much longer than asked a short ``time.sleep`` takes on
            the machine (measured: ``benchmarks/simgrid_scale.py --emulated`` does; 0:
            none), for the sleeps of a master rule's polls (``master_pickup_s``).
    """
    compute_s: float
    tensors: list
    batch: int = 64
    segments: list | None = None
    backward_share: float = 2 / 3
    itemsize: int = 4
    cpu: object = None
    slowdown: float = 1.0
    sleep_overshoot_s: float = 0.0

    def __post_init__(self):
        if not self.compute_s > 0:
            raise ValueError(f"compute_s must be > 0 seconds, got {self.compute_s!r}")
        if not 0 <= self.backward_share <= 1:
            raise ValueError(f"backward_share must be in [0, 1], got {self.backward_share!r}")
        if not self.slowdown >= 1:
            raise ValueError(f"slowdown must be >= 1, got {self.slowdown!r}")

    def exchange(self, seconds: float, sends: tuple) -> float:
        """An exchange of ``seconds`` on the link whose rank sends (and receives)
        ``sends`` = (messages, bytes): with its TCP CPU when ``cpu`` is set."""
        if self.cpu is None:
            return seconds
        return self.cpu.exchange_s(seconds, *sends, self.slowdown)

    @property
    def size(self) -> int:
        return max((hi for _, _, hi, _ in self.tensors), default=0)


@dataclass(frozen=True)
class Config:
    """A rule and its options, with ``compression`` for ``data`` (a --gradient_compression
    spec) and ``shard`` (its ZeRO stage, ``--shard``). Defaults as in the code: localsgd
    sync_every 8, partial 4 chunks, easgd sync_every 4, downpour sync_every 1, gossip
    probability 0.25, buckets of 4 MiB."""
    rule: str = "data"
    compression: str = "none"
    every: int | None = None
    probability: float = 0.25
    bucket_size_mb: float = 4.0
    shard: int = 0

    @property
    def rule_class(self):
        return RULES[rule_name(self.rule)]

    @property
    def label(self) -> str:
        if self.rule == "data":
            base = "data" if self.compression == "none" else f"data+{self.compression}"
            return base + (f" --shard {self.shard}" if self.shard else "")
        return self.rule_class.plan_label(self.period, self.probability)

    @property
    def period(self) -> int:
        return int(self.every or self.rule_class.default_period)


# the data rule's variants, then each rule that declares a row (``Rule.plan_order``), then
# the sharded data rule
DEFAULT_CONFIGS = [Config("data"), Config("data", "fp16"), Config("data", "topk:0.01"),
                   Config("data", "powersgd:2"),
                   *(Config(name) for name, cls in sorted(
                       RULES.items(), key=lambda item: (item[1].plan_order or 0, item[0]))
                     if cls.plan_order is not None),
                   Config("data", shard=1), Config("data", shard=2), Config("data", shard=3)]


@dataclass(frozen=True)
class Prediction:
    """One configuration on ``hosts`` hosts.

    step_s: wall time of a step; exposed_s: of it, time no rank computes (waiting on the
    network); bytes_per_step: what a rank hands to MPI a step (the code's own count,
    ``bytes_reduced`` / ``Traffic``), averaged over the period; ranks_computing: ranks
    that train (a master does not); samples_per_s; efficiency: samples/s against
    ``hosts`` ranks computing alone; messages: [(what, bytes, seconds, algorithm, ready)]
    (``data_messages``)."""
    config: Config
    hosts: int
    step_s: float
    exposed_s: float
    bytes_per_step: float
    ranks_computing: int
    samples_per_s: float
    efficiency: float
    messages: list = field(default_factory=list)


def _compressed(spec: str, tensors) -> tuple[list, list]:
    """(compressed tensors, dense tensors) as ``CompressedReduction`` splits them."""
    cfg = parse_compression(spec)
    comp = [t for t in tensors if cfg.compresses(t[3])]
    return comp, [t for t in tensors if t not in comp]


@dataclass(frozen=True)
class HalfBucket:
    """One bucket of ``elements`` through the Reducer's float16 exchange
    (``HalfSumExchange``, distributed/halfsum.py) on P ranks, as one rank sees it.

    ``whole``: the other ranks' float16 copies are at most ``GATHER_BYTES``: one all-gather
    of the whole bucket, summed on every rank; else an all-to-all of chunks of ceil(n/P)
    elements (phase 1) and an all-gather of the summed chunks (phase 2); each its P-1
    messages posted at once (distributed/oneround.py: one latency). ``counted``: what
    ``Reducer.bytes_reduced`` adds for it (its float16 bytes, once); ``sends``, ``sent``:
    the messages and bytes this rank puts on its link; ``seconds``, ``algorithm``."""
    elements: int
    whole: bool
    counted: int
    sends: int
    sent: float
    seconds: float
    algorithm: str


def half_bucket(elements: int, hosts: int, link: Link) -> HalfBucket:
    """The float16 exchange of one bucket of ``elements`` over ``hosts`` ranks."""
    n, p = int(elements), int(hosts)
    whole = 2 * n * (p - 1) <= GATHER_BYTES  # halfsum._Bucket's rule
    if whole:
        t, alg = direct_time(2 * n, p, link)
        count, sent = direct_sends(2 * n, p)
        return HalfBucket(n, True, 2 * n, count, sent, t, f"all-gather ({alg})")
    chunk = 2 * -(-n // p)  # bytes of ceil(n/p) float16 elements
    t1, a1 = direct_time(chunk, p, link)
    t2, a2 = direct_time(chunk, p, link)
    (c1, s1), (c2, s2) = direct_sends(chunk, p), direct_sends(chunk, p)
    return HalfBucket(n, False, 2 * n, c1 + c2, s1 + s2, t1 + t2,
                      f"all-to-all ({a1}) + all-gather ({a2})")


def bucket_ranges(config: Config, model: ModelCost) -> list[tuple[int, int]]:
    """The Reducer's buckets of ``model``'s gradients, (start, stop) in backward order."""
    segs = model.segments or [(name, lo, hi) for name, lo, hi, _ in model.tensors]
    ranges = [(SimpleNamespace(name=name), lo, hi) for name, lo, hi in segs]
    return [(lo, hi) for lo, hi, _ in make_buckets(ranges, model.itemsize,
                                                   config.bucket_size_mb)]


def half_buckets(config: Config, model: ModelCost, hosts: int,
                 link: Link) -> list[HalfBucket]:
    """Every bucket's float16 exchange a step (``compression="fp16"``), backward order."""
    return [half_bucket(hi - lo, hosts, link) for lo, hi in bucket_ranges(config, model)]


def data_messages(config: Config, model: ModelCost, hosts: int, link: Link) -> list:
    """The exchanges of ``--parallel data`` a step: [(what, bytes, seconds, algorithm,
    ready)] with ``ready`` the share of backward done when it can start (None: after
    backward, blocking). Dense buckets are all-reduced; fp16 buckets go through the float16
    exchange (``half_bucket``: both its phases in the bucket's turn); top-k and PowerSGD's
    P go bucket by bucket as the Reducer's non-blocking path sends them, PowerSGD's Q
    after backward."""
    cfg = parse_compression(config.compression)
    n, item = model.size, model.itemsize
    # a shaped link's token bucket (Link.burst_bytes), full after the compute: the first
    # bytes a rank sends a step pass at once, the rest at the link's rate
    credit = [link.burst_credit(model.compute_s)]

    def on_link(seconds, sends):  # (seconds with the burst and the TCP CPU)
        used = min(credit[0], sends[1])
        credit[0] -= used
        return model.exchange(seconds - used / link.bytes_per_s, sends)

    if cfg is None or isinstance(cfg, FP16Compressor) or config.compression == "none":
        half = isinstance(cfg, FP16Compressor)
        out, done = [], 0
        for lo, hi in bucket_ranges(config, model):
            done += hi - lo  # buckets come in backward order
            if half:
                hb = half_bucket(hi - lo, hosts, link)
                out.append(("bucket", hb.counted, on_link(hb.seconds, (hb.sends, hb.sent)),
                            hb.algorithm, done / n))
            else:
                nb = (hi - lo) * item
                t, alg = allreduce_time(nb, hosts, link, itemsize=item)
                out.append(("bucket", nb, on_link(
                    t, allreduce_sends(nb, hosts, itemsize=item)), alg, done / n))
        return out
    if isinstance(cfg, Threshold):
        raise ValueError("the cost model cannot know how many entries a threshold keeps; "
                         "use topk:RATIO with the share you expect")
    # top-k and PowerSGD: bucket by bucket, each started when its gradients are ready
    # (compressed_buckets.py); PowerSGD's Q all-reduces after backward
    comp_all, _ = _compressed(config.compression, model.tensors)
    out, later, done = [], [], 0

    def allreduce(nbytes):  # (seconds with the TCP CPU, algorithm)
        t, alg = allreduce_time(nbytes, hosts, link)
        return on_link(t, allreduce_sends(nbytes, hosts)), alg

    for lo, hi in bucket_ranges(config, model):
        done += hi - lo
        ready = done / n
        inside = [t for t in model.tensors if lo <= t[1] and t[2] <= hi]
        comp = [t for t in inside if t in comp_all]
        n_dense = sum(t[2] - t[1] for t in inside if t not in comp)
        if isinstance(cfg, PowerSGD):
            dims = [matrix_dims(s) for _, _, _, s in comp]
            ranks = [min(cfg.rank, d[0]) for d in dims]
            p_bytes = (n_dense + sum(d[0] * r for d, r in zip(dims, ranks))) * item
            q_bytes = sum(d[1] * r for d, r in zip(dims, ranks)) * item
            out.append(("P + dense", p_bytes, *allreduce(p_bytes), ready))
            if q_bytes:
                later.append(("Q", q_bytes, *allreduce(q_bytes), None))
            continue
        assert isinstance(cfg, TopK)
        pairs = sum(max(1, int(cfg.ratio * (b - a))) for _, a, b, _ in comp)
        if comp and cfg.exchange != "dense" and (cfg.exchange == "sparse" or
                                                 sparse_is_cheaper([pairs] * hosts,
                                                                   hi - lo, item)):
            payload = payload_bytes(pairs, hi - lo, item)
            if n_dense:
                out.append(("dense tensors", n_dense * item, *allreduce(n_dense * item),
                            ready))
            t, alg = direct_time(payload, hosts, link)  # posted at once (direct.py)
            out.append(("sparse pairs", payload,
                        on_link(t, direct_sends(payload, hosts)), alg, ready))
        else:
            nbytes = (n_dense + sum(t[2] - t[1] for t in comp)) * item
            out.append(("selected, dense", nbytes, *allreduce(nbytes), ready))
    return out + later


def slice_messages(model: ModelCost, hosts: int, link: Link) -> list:
    """The reduce-scatters of sharded stages 2 and 3 a step, one per top-level layer with
    parameters in backward order, each started once backward has made it."""
    segs = model.segments or [(name, lo, hi) for name, lo, hi, _ in model.tensors]
    out, done, n = [], 0, model.size
    for _, lo, hi in sorted(segs, key=lambda seg: -seg[1]):
        done += hi - lo
        nbytes = (hi - lo) * model.itemsize
        t, alg = reduce_scatter_time(nbytes, hosts, link)
        sends = (1 if alg == "recursive halving" else hosts - 1, (hosts - 1) / hosts * nbytes)
        out.append(("layer slices", nbytes, model.exchange(t, sends), alg, done / n))
    return out


def _overlapped_step(msgs: list, model: ModelCost, compression: str, hosts: int) -> float:
    """The step of the gradients' exchange: buckets sent one at a time, each once backward
    has made it, the rest after backward."""
    c = model.compute_s
    overlapped = [m for m in msgs if m[4] is not None]
    # the Reducer's own CPU (cpu.py): compressing as buckets start, during backward
    # (spread like the gradients), and the rest in synchronize, after
    pre, post = ((0.0, 0.0) if model.cpu is None else
                 [model.slowdown * s for s in model.cpu.step_s(compression, hosts)])
    fwd, back = c * (1 - model.backward_share), model.backward_share * c + pre
    end = 0.0
    for _, _, t, _, ready in overlapped:  # one at a time, in order, once ready
        end = max(end, fwd + back * ready) + t
    return max(c + pre, end) + sum(m[2] for m in msgs if m[4] is None) + post


def _max_sleep(config: Config) -> float:
    """The longest sleep between a master's polls (the rule's ``max_sleep``, default)."""
    try:
        return float(getattr(config.rule_class(), "max_sleep", 0.0))
    except (TypeError, ValueError):
        return 0.0


def predict(config: Config, model: ModelCost, hosts: int, link: Link) -> Prediction:
    """The step of ``config`` on ``hosts`` hosts x 1 rank joined by ``link``s."""
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts!r}")
    c, n, item = model.compute_s, model.size, model.itemsize
    computing, msgs = hosts, []
    options = {"shard": config.shard} if config.shard else {}
    try:
        declared = config.rule_class.step_messages(size=n, itemsize=item,
                                                   period=config.period,
                                                   probability=config.probability,
                                                   **options)
    except NotImplementedError as exc:
        raise ValueError(f"the cost model cannot predict rule {config.rule!r}: {exc}") from None
    except TypeError:
        raise ValueError(f"shard={config.shard}: rule {config.rule!r} keeps no sharded "
                         "state (only data does)") from None
    step = c
    if hosts > 1:
        if any(m.shape == "gradients" for m in declared):
            msgs = data_messages(config, model, hosts, link)
            step = _overlapped_step(msgs, model, config.compression, hosts)
        elif any(m.shape == "reduce_scatter" for m in declared):
            msgs = slice_messages(model, hosts, link)
            step = _overlapped_step(msgs, model, config.compression, hosts)
        for m in declared:
            if m.shape == "allgather":
                t, alg = allgather_time(m.nbytes, hosts, link)
                # a rank hands MPI its own slice of each all-gather
                msgs.append((m.what, m.nbytes / hosts * m.per_step, t * m.per_step, alg,
                             None))
                step += t * m.per_step
            elif m.shape == "allreduce":
                t, alg = allreduce_time(m.nbytes, hosts, link, itemsize=item)
                sends = allreduce_sends(m.nbytes, hosts, itemsize=item)
                # the token bucket refills over the 1 / per_step steps of compute
                used = min(link.burst_credit(c / m.per_step), sends[1])
                t = model.exchange(t - used / link.bytes_per_s, sends)
                msgs.append((m.what, m.nbytes * m.per_step, t, alg, None))
                step += t * m.per_step
            elif m.shape == "master":
                # the master's link carries every worker's message, one after another
                computing = hosts - 1
                # each way's token bucket (a shaped link) refills while the worker computes
                used = min(link.burst_credit(c / m.per_step), m.nbytes)
                there_and_back = 2 * (link.send(m.nbytes) - used / link.bytes_per_s)
                # an idle master notices a message late (its polls sleep between them:
                # collectives.master_pickup_s); the workers' messages reach it a period's
                # compute apart, spread over the workers, after its reply went out
                gap = c / m.per_step / computing + there_and_back / 2
                pickup = master_pickup_s(gap, _max_sleep(config), MIN_SLEEP,
                                         model.sleep_overshoot_s)
                worker = step + (there_and_back + pickup) * m.per_step
                step = max(worker, computing * m.nbytes * m.per_step / link.bytes_per_s)
                msgs.append((m.what, 2 * m.nbytes * m.per_step, there_and_back,
                             "point to point", None))
            elif m.shape == "behind":
                t, alg = allreduce_time(m.nbytes, hosts, link, itemsize=item)
                msgs.append((m.what, m.nbytes * m.per_step, t, alg, None))
                step = max(step, m.per_step * t)
            elif m.shape == "push":
                # the link carries it while the rank computes the next step: only a link
                # slower than that shows
                t = link.send(m.nbytes) - min(link.burst_credit(c / m.per_step),
                                              m.nbytes) / link.bytes_per_s
                step = max(step, m.per_step * t) + m.per_step * link.latency_s
                msgs.append((m.what, m.per_step * m.nbytes, t, "point to point", None))
    sps = computing * model.batch / step
    return Prediction(config, hosts, step, max(0.0, step - c), sum(m[1] for m in msgs),
                      computing, sps, sps / (hosts * model.batch / c), msgs)


def table(configs, model: ModelCost, hosts_list, link: Link) -> list[Prediction]:
    """Every config at every host count (rows in that order)."""
    return [predict(cfg, model, h, link) for h in hosts_list for cfg in configs]


def tier(config: Config) -> int:
    """How far a configuration is from exact synchronous SGD: 0 the same updates (dense or
    fp16 gradients), 1 approximate gradients (top-k, PowerSGD, with error feedback),
    2 replicas that drift apart between averages (partial, localsgd, easgd, downpour,
    gossip)."""
    if config.rule != "data":
        return 2
    return 0 if config.compression in ("none", "fp16") else 1


def pick(predictions: list[Prediction], efficiency: float = 0.9) -> Prediction:
    """The configuration to use: the fastest of the lowest ``tier`` whose fastest reaches
    ``efficiency``; when none does, the fastest of all (the first of equals: the list's
    order). The model counts time, not what a step learns: the tiers stand in for that."""
    def fastest(rows):
        return max(rows, key=lambda p: (p.samples_per_s, -predictions.index(p)))
    for t in sorted({tier(p.config) for p in predictions}):
        best = fastest([p for p in predictions if tier(p.config) == t])
        if best.efficiency >= efficiency:
            return best
    return fastest(predictions)
