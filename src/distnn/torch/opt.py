"""SINGA's ``opt`` names over distnn.torch: ``SGD`` built without parameters and ``DistOpt``,
which all-reduces the gradients of whatever a loss tensor depends on.

SINGA scripts port by changing the import (docs/horovod.md, "Coming from SINGA")::

    from distnn.torch import opt                      # was: from singa import opt
    sgd = opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5)
    sgd = opt.DistOpt(sgd)                            # under mpiexec -n N
    for x, y in batches:                              # this rank's partition
        loss = F.cross_entropy(model(x), y)           # a torch scalar, as SINGA's tensor
        sgd.backward_and_update(loss)                 # backward, all-reduce, update
    sgd.all_reduce(correct); sgd.wait()               # sum a metric tensor over ranks

Which models: torch modules. SINGA's ``backward_and_update(loss)`` takes only the loss, and
finds the parameters by running backward through the graph the loss carries; a torch loss
carries one, so the parameters are the leaf tensors of that graph (collected on the first
call, in the same order on every rank). distnn's NumPy models have no such graph (their
loss is a number and ``model.backward(dlogits)`` needs the model): use
``distnn.distributed.DistributedOptimizer`` with them.

The update is SINGA's SGD (the same as ``torch.optim.SGD``): ``g += weight_decay * p;
buf = momentum * buf + (1 - dampening) * g; p -= lr * buf`` (Nesterov: ``g + momentum *
buf``). Gradients are the average over ranks (SINGA divides the sum by ``world_size``), so
N ranks with local batch B make the update of one process with batch N*B.
"""
from __future__ import annotations

import collections
import numbers

import numpy as np
import torch

from ..distributed import Communicator
from .basics import channel
from .compression import Compression
from .distributed_optimizer import DistributedOptimizer

SINGA_THRESHOLD = 2097152  # SINGA's default fusion threshold, in elements


def _number(name: str, value, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < low:
        raise ValueError(f"SGD: {name} must be a number >= {low:g}, got {value!r} (distnn "
                         "takes constant values; change sgd.lr between steps to decay it)")
    return float(value)


def parameters_of(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors requiring gradients that ``loss`` depends on, first layers first
    (found by walking the autograd graph from the loss, breadth-first, then reversed)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"backward_and_update(loss): loss must be a torch tensor computed "
                        f"from the model (e.g. F.cross_entropy(model(x), y)), got "
                        f"{type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"backward_and_update(loss): loss must hold one value, got shape "
                         f"{tuple(loss.shape)}; reduce it with .mean() or .sum()")
    if loss.grad_fn is None:
        raise ValueError("backward_and_update(loss): the loss does not depend on any "
                         "parameter (no autograd graph); compute it from the model's output "
                         "outside torch.no_grad()")
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    queue = collections.deque([loss.grad_fn])
    while queue:
        node = queue.popleft()
        for nxt, _ in node.next_functions:
            if nxt is None or id(nxt) in seen:
                continue
            seen.add(id(nxt))
            var = getattr(nxt, "variable", None)  # AccumulateGrad: a leaf tensor
            if var is not None:
                if var.requires_grad:
                    found.append(var)
            else:
                queue.append(nxt)
    found.reverse()
    return found


def _chunks(params: list[torch.Tensor], threshold: int) -> list[list[int]]:
    """Consecutive parameter indices grouped into runs of at most ``threshold`` elements."""
    chunks: list[list[int]] = [[]]
    size = 0
    for i, p in enumerate(params):
        if chunks[-1] and size + p.numel() > threshold:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += p.numel()
    return chunks


class SGD:
    """SINGA's ``opt.SGD``: built from hyper-parameters alone; the parameters are those of
    the first loss it is called with. Calling it (``sgd(loss)`` or
    ``sgd.backward_and_update(loss)``) runs backward and updates, on this process only;
    wrap it in ``DistOpt`` to train over ranks.

    Args:
        lr: learning rate (a number; set ``sgd.lr`` to change it between steps).
        momentum, dampening, weight_decay, nesterov: as SINGA's (and torch's) SGD; Nesterov
            needs momentum > 0 and dampening 0.
        dtype: accepted for SINGA's signature; the parameters keep the module's dtype.

    Example:
        sgd = SGD(lr=0.05, momentum=0.9, weight_decay=1e-5)
        sgd(F.cross_entropy(model(x), y))
    """

    def __init__(self, lr: float = 0.1, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, dtype=None):
        self._lr = _number("lr", lr)
        self.momentum = _number("momentum", momentum)
        self.dampening = _number("dampening", dampening)
        self.weight_decay = _number("weight_decay", weight_decay)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov=True needs momentum > 0 and dampening=0, got "
                             f"momentum={momentum!r}, dampening={dampening!r}")
        self.dtype = dtype
        self.params: list[torch.Tensor] | None = None
        self.torch_optimizer: torch.optim.SGD | None = None

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = _number("lr", value)
        if self.torch_optimizer is not None:
            for group in self.torch_optimizer.param_groups:
                group["lr"] = self._lr

    def bind(self, loss: torch.Tensor) -> list[torch.Tensor]:
        """Collect the parameters from ``loss`` on the first call (later losses must depend
        on no other parameters) and build the torch optimizer over them."""
        if self.params is None:
            params = parameters_of(loss)
            if not params:
                raise ValueError("backward_and_update(loss): the loss depends on no tensor "
                                 "with requires_grad=True; nothing to train")
            self.params = params
            self.torch_optimizer = torch.optim.SGD(
                params, lr=self._lr, momentum=self.momentum, dampening=self.dampening,
                weight_decay=self.weight_decay, nesterov=self.nesterov)
        elif loss.grad_fn is None:
            parameters_of(loss)  # raises the clear error
        return self.params

    def backward_and_update(self, loss: torch.Tensor) -> None:
        """Backward from ``loss`` and one SGD update of the parameters it depends on."""
        self.bind(loss)
        self.torch_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.torch_optimizer.step()

    __call__ = backward_and_update

    def __repr__(self) -> str:
        return (f"SGD(lr={self._lr}, momentum={self.momentum}, dampening={self.dampening}, "
                f"weight_decay={self.weight_decay}, nesterov={self.nesterov})")


class DistOpt:
    """SINGA's ``opt.DistOpt``: wrap ``SGD`` so that every update uses gradients averaged
    over all ranks (a ``distnn.torch.DistributedOptimizer`` underneath: buckets of about
    ``threshold`` elements, all-reduced during backward).

    Args:
        opt: the ``SGD`` to wrap (default ``SGD()``).
        nccl_id, local_rank, world_size: SINGA's launch by Python multiprocessing; not
            available (one process per MPI rank): giving them raises with what to do.
        buffSize: accepted for SINGA's signature (distnn sizes buckets by ``threshold``).
        comm: distnn communicator (default: the global one, ``distnn.torch.init()``).

    Attributes:
        world_size, global_rank (``rank_in_global``), local_rank (``rank_in_local``): the
            number of ranks, this rank, and its rank on its host.
        communicator: the distnn communicator.
        optimizer: the ``distnn.torch.DistributedOptimizer`` after the first update.

    Example:
        sgd = DistOpt(SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
        sgd.backward_and_update(F.cross_entropy(model(x), y))
    """

    def __init__(self, opt: SGD | None = None, nccl_id=None, local_rank=None, world_size=None,
                 buffSize: int = 4194304, *, comm: Communicator | None = None):
        if opt is None:
            opt = SGD()
        if not isinstance(opt, SGD):
            raise TypeError(f"DistOpt(opt) wraps distnn.torch.opt.SGD(lr=..., momentum=..., "
                            f"weight_decay=...), got {type(opt).__name__}; wrap a "
                            "torch.optim optimizer in distnn.torch.DistributedOptimizer")
        given = {k: v for k, v in (("nccl_id", nccl_id), ("local_rank", local_rank),
                                   ("world_size", world_size)) if v is not None}
        if given:
            raise ValueError(f"DistOpt({', '.join(f'{k}=' for k in given)}...) is SINGA's "
                             "launch through Python multiprocessing and NCCL; distnn runs one "
                             "process per MPI rank: call DistOpt(sgd) and start the script "
                             "with `mpiexec -n N python script.py`")
        self.opt = opt
        self.communicator = channel(comm)
        self.world_size = self.communicator.size
        self.global_rank = self.communicator.rank
        self.local_rank = self.communicator.local_rank
        self.optimizer: DistributedOptimizer | None = None
        self._setup: tuple | None = None
        self._pending: list = []
        self._chunks: tuple | None = None
        self.partial = 0  # the chunk the next backward_and_partial_update averages

    rank_in_global = property(lambda self: self.global_rank)
    rank_in_local = property(lambda self: self.local_rank)

    def _wrapped(self, loss, threshold, compression, clip: bool, key=None,
                 error_feedback: bool = True) -> DistributedOptimizer:
        """The DistributedOptimizer for these settings, kept while they stay the same (so a
        compressor's residuals live on); ``key`` names the compression when ``compression``
        is a factory that makes a new (stateful) compressor."""
        params = self.opt.bind(loss)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) \
                or threshold < 0:
            raise ValueError(f"threshold must be an int >= 0 (elements per fused all-reduce), "
                             f"got {threshold!r}")
        setup = (int(threshold), compression if key is None else key, clip)
        if self.optimizer is None or self._setup != setup:
            if key is not None:
                compression = compression()
            if self.optimizer is not None:
                self.optimizer.remove_hooks()
            itemsize = params[0].element_size()
            # clipping edits the gradients between backward and the all-reduce, so the
            # buckets are reduced in step() instead of during backward
            self.optimizer = DistributedOptimizer(
                self.opt.torch_optimizer, compression=compression,
                bucket_size_mb=int(threshold) * itemsize / (1 << 20),
                non_blocking=not clip, comm=self.communicator,
                error_feedback=error_feedback)
            self._setup = setup
        return self.optimizer

    def backward_and_update(self, loss: torch.Tensor, threshold: int = SINGA_THRESHOLD) -> None:
        """Backward from ``loss``, average the gradients over ranks (buckets of about
        ``threshold`` elements, started as backward produces them), update."""
        opt = self._wrapped(loss, threshold, Compression.none, False)
        opt.zero_grad()
        loss.backward()
        opt.step()

    __call__ = backward_and_update

    def backward_and_update_half(self, loss: torch.Tensor, threshold: int = SINGA_THRESHOLD,
                                 clipping: bool = False, clip_Value: float = 100) -> None:
        """As ``backward_and_update``, with the gradients sent as float16 (distnn's fp16
        compression); ``clipping`` first clamps every gradient to ``[-clip_Value,
        clip_Value]``, as SINGA does, which keeps large gradients inside float16's range."""
        if clipping and not (isinstance(clip_Value, numbers.Real) and clip_Value > 0):
            raise ValueError(f"clip_Value must be a number > 0, got {clip_Value!r}")
        opt = self._wrapped(loss, threshold, Compression.fp16, bool(clipping))
        opt.zero_grad()
        loss.backward()
        if clipping:
            with torch.no_grad():
                for p in self.opt.params:
                    if p.grad is not None:
                        p.grad.clamp_(-float(clip_Value), float(clip_Value))
        opt.step()

    def backward_and_sparse_update(self, loss: torch.Tensor, threshold: int = SINGA_THRESHOLD,
                                   spars: float = 0.05, topK: bool = False,
                                   corr: bool = True) -> None:
        """As ``backward_and_update``, sending only part of each gradient: with
        ``topK=True`` the ``spars`` fraction of largest magnitudes (distnn's
        ``topk:spars``), else the entries with ``|g| >= spars`` (``threshold:spars``), as
        (index, value) pairs summed on every rank. ``corr`` keeps what was not sent and adds
        it to the next step's gradient (SINGA's local accumulation = error feedback).
        Tensors under 1024 elements and 1-D ones travel dense; the exchange falls back to a
        dense all-reduce where the pairs would not be smaller
        (``distnn.distributed.lossy``)."""
        if isinstance(spars, bool) or not isinstance(spars, numbers.Real) or spars <= 0 \
                or (topK and spars > 1):
            raise ValueError(f"spars must be a number in (0, 1] with topK=True (the fraction "
                             f"sent) or > 0 with topK=False (the magnitude threshold), got "
                             f"{spars!r}")
        kind = Compression.topk if topK else Compression.threshold
        opt = self._wrapped(loss, threshold, lambda: kind(float(spars)), False,
                            key=("topk" if topK else "threshold", float(spars), bool(corr)),
                            error_feedback=bool(corr))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def backward_and_partial_update(self, loss: torch.Tensor,
                                    threshold: int = SINGA_THRESHOLD) -> None:
        """SINGA's partial update: backward from ``loss`` and a LOCAL update (this rank's
        gradients only), then one chunk of the parameters is averaged over the ranks. Chunks
        are runs of consecutive parameters (first layers first) of about ``threshold``
        elements (a larger parameter is a chunk of its own); each call averages the next
        chunk, so every parameter is averaged once every ``len(chunks)`` calls. With one
        chunk (``threshold`` >= the model's size) every call averages everything: local SGD
        averaged every step (the command's ``--parallel partial``, for distnn models)."""
        params = self.opt.bind(loss)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) \
                or threshold < 1:
            raise ValueError(f"threshold must be an int >= 1 (elements averaged per call), "
                             f"got {threshold!r}")
        if self._chunks is None or self._chunks[0] != threshold:
            self._chunks = (int(threshold), _chunks(params, int(threshold)))
            self.partial = 0
        if self.optimizer is not None:  # leaving all-reduce mode: its hooks must not fire
            self.optimizer.remove_hooks()
            self.optimizer, self._setup = None, None
        self.opt.torch_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.torch_optimizer.step()
        chunks = self._chunks[1]
        chunk = chunks[self.partial % len(chunks)]
        with torch.no_grad():
            flat = torch.cat([params[i].detach().reshape(-1) for i in chunk])
            buf = flat.numpy()
            self.communicator.allreduce_(buf, "sum")
            flat /= self.world_size
            at = 0
            for i in chunk:
                n = params[i].numel()
                params[i].copy_(flat[at:at + n].view_as(params[i]))
                at += n
        self.partial = (self.partial + 1) % len(chunks)

    def all_reduce(self, tensor) -> None:
        """Start summing ``tensor`` (a CPU torch tensor or a NumPy array, contiguous) over
        all ranks, in place; ``wait()`` completes it. Every rank must make the same calls."""
        if isinstance(tensor, torch.Tensor):
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise ValueError(f"all_reduce: the tensor must be a contiguous CPU tensor, got "
                                 f"device={tensor.device}, contiguous={tensor.is_contiguous()}"
                                 "; pass t.contiguous().cpu() and read the result from it")
            arr = tensor.detach().numpy()
        elif isinstance(tensor, np.ndarray):
            if not tensor.flags.c_contiguous or not tensor.flags.writeable:
                raise ValueError("all_reduce: the array must be C-contiguous and writeable; "
                                 "pass np.ascontiguousarray(a) and read the result from it")
            arr = tensor
        else:
            raise TypeError(f"all_reduce: expected a torch tensor or a NumPy array, got "
                            f"{type(tensor).__name__}")
        self._pending.append(self.communicator.iallreduce_(arr, "sum"))

    def wait(self) -> None:
        """Complete every ``all_reduce`` started since the last ``wait()``."""
        pending, self._pending = self._pending, []
        for handle in pending:
            handle.wait()

    @property
    def lr(self) -> float:
        return self.opt.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.opt.lr = value

    def __repr__(self) -> str:
        return f"DistOpt({self.opt!r}, world_size={self.world_size})"
