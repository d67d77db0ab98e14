"""ZeroRedundancyOptimizer over MPI: PyTorch's ``torch.distributed.optim.
ZeroRedundancyOptimizer`` (ZeRO stage 1), same signature and semantics, on distnn's
communicator instead of a torch.distributed process group.

Each parameter belongs to one rank, chosen by PyTorch's rule (per parameter group, the
largest parameters first, each to the rank that holds the fewest elements so far), so a
state dict written by either class loads into the other. A rank's local optimizer
(``optim``) holds the state of its own parameters only; ``step()`` updates them and then
one ``Allgatherv`` hands every rank the parameters of all the others (where PyTorch sends
one broadcast per parameter, or per rank with ``parameters_as_bucket_view``).

Like PyTorch's, it does not combine gradients: wrap it in ``hvd.DistributedOptimizer``
(the Horovod way) or all-reduce the gradients yourself before ``step()``.
"""
from __future__ import annotations

import copy
import io
from typing import Any, Callable, Iterable

import numpy as np
import torch

from ..distributed import Communicator
from .basics import channel
from .collectives import as_numpy


def _greedy(groups: list[list[torch.Tensor]], size: int) -> list[list[list[torch.Tensor]]]:
    """``out[rank][group]``: each group's parameters, largest first (a stable sort: ties
    keep their order), each to the rank with the fewest elements so far (the lowest
    such rank); the counts carry over from one group to the next (PyTorch's rule)."""
    held = [0] * size
    out: list[list[list[torch.Tensor]]] = [[] for _ in range(size)]
    for params in groups:
        mine: list[list[torch.Tensor]] = [[] for _ in range(size)]
        for p in sorted(params, key=lambda t: t.numel(), reverse=True):
            r = held.index(min(held))
            mine[r].append(p)
            held[r] += p.numel()
        for r in range(size):
            out[r].append(mine[r])
    return out


def _to_bytes(obj: Any) -> np.ndarray:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8).copy()


def _from_bytes(a: np.ndarray) -> Any:
    return torch.load(io.BytesIO(a.tobytes()), weights_only=False)


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Shard an optimizer's state over the ranks (PyTorch's ``ZeroRedundancyOptimizer``
    on distnn's MPI communicator): each rank keeps the state of about 1/N of the
    parameters, updates those in ``step()`` and receives the others from their owners.

    Args:
        params: the parameters (tensors) or parameter groups (dicts), as for any torch
            optimizer; CPU tensors of one floating dtype (float16/32/64), the same on
            every rank.
        optimizer_class: the local optimizer's class (``torch.optim.Adam``, ...).
        parameters_as_bucket_view: make each parameter's ``.data`` a view into one flat
            buffer laid out owner by owner, so the exchange copies nothing on its way out
            (PyTorch's per-rank buckets); default False keeps every ``.data`` as it is.
        overlap_with_ddp: refused (it needs DDP's communication hooks); gradients are
            combined before ``step()``, e.g. by ``hvd.DistributedOptimizer``.
        process_set: a ``hvd.ProcessSet`` to shard over (default: every rank).
        comm: a distnn Communicator to shard over (default: the process set's).
        **defaults: the local optimizer's arguments (``lr=``, ``momentum=``, ...).

    ``process_group`` (PyTorch's third argument) is accepted as None only: the ranks come
    from ``comm``/``process_set``. Every rank calls ``step()``, ``add_param_group`` and
    ``consolidate_state_dict`` alike (they communicate); ``hvd.join`` is not supported.

    Example:
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.consolidate_state_dict(to=0)
        if hvd.rank() == 0:
            torch.save(opt.state_dict(), "opt.pt")
    """

    def __init__(self, params: Iterable, optimizer_class: type[torch.optim.Optimizer],
                 process_group: Any = None, *, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, process_set=None,
                 comm: Communicator | None = None, **defaults: Any):
        if process_group is not None:
            raise ValueError(f"ZeroRedundancyOptimizer: process_group={process_group!r} "
                             "is a torch.distributed group; distnn shards over MPI ranks: "
                             "pass process_set= (a hvd.ProcessSet) or comm=, or nothing "
                             "for every rank")
        if overlap_with_ddp:
            raise ValueError("ZeroRedundancyOptimizer: overlap_with_ddp=True needs "
                             "torch DDP's communication hooks, which distnn does not run; "
                             "pass overlap_with_ddp=False and combine the gradients "
                             "before step() (hvd.DistributedOptimizer)")
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("ZeroRedundancyOptimizer: optimizer_class must be a "
                            f"torch.optim.Optimizer class, got {optimizer_class!r}")
        if isinstance(params, torch.Tensor):
            raise TypeError("ZeroRedundancyOptimizer: params must be an iterable of "
                            "tensors or dicts, got one tensor; pass model.parameters()")
        params = list(params)
        if not params:
            raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
        self.initialized = False
        super().__init__(params, defaults)
        self._check_params([p for g in self.param_groups for p in g["params"]])
        self._zero_comm = channel(comm, process_set)
        self.rank, self.world_size = self._zero_comm.rank, self._zero_comm.size
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._zero_partition_cache: list[list[dict]] = []
        self._zero_all_state_dicts: list[dict] = []
        self._check_same_everywhere()
        self.optim = optimizer_class(self._partition_parameters()[self.rank], **defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._build_layout()
        self.initialized = True

    # -- the partition -------------------------------------------------------------------
    def _check_params(self, params: list[torch.Tensor]) -> None:
        kinds = {(p.dtype, p.device.type, p.is_sparse) for p in params}
        if len(kinds) > 1:
            raise ValueError("ZeroRedundancyOptimizer: parameters must share one dense "
                             f"dtype and device, got {sorted(map(str, kinds))}; convert "
                             "the model (model.double(), model.cpu()) first")
        as_numpy(params[0], "ZeroRedundancyOptimizer")

    def _check_same_everywhere(self) -> None:
        if self.world_size == 1:
            return
        mine = [[tuple(p.shape) for p in g["params"]] for g in self.param_groups]
        everyone = self._zero_comm.allgather_obj((str(self.param_groups[0]["params"][0].dtype),
                                            mine))
        bad = [r for r, e in enumerate(everyone) if e != everyone[0]]
        if bad:
            raise RuntimeError(f"ZeroRedundancyOptimizer: rank {bad[0]} has parameters "
                               f"{everyone[bad[0]]}, rank 0 {everyone[0]} (dtype, shapes "
                               "per group); build the same model on every rank")

    def _partition_parameters(self) -> list[list[dict]]:
        """``[rank][group]``: the parameter groups each rank updates (its copies of this
        optimizer's groups with its own parameters only, possibly none)."""
        if not self._zero_partition_cache:
            groups = self.param_groups
            owned = _greedy([g["params"] for g in groups], self.world_size)
            self._zero_partition_cache = [[{**g, "params": owned[r][i]}
                                      for i, g in enumerate(groups)]
                                     for r in range(self.world_size)]
        return self._zero_partition_cache

    @property
    def _index_to_param(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @staticmethod
    def _sync_param_groups(src: list[dict], dst: list[dict]) -> None:
        """Hyper-parameters (lr, betas, what a scheduler sets) from src to dst."""
        for s, d in zip(src, dst):
            d.update({k: v for k, v in s.items() if k != "params"})

    # -- the exchange --------------------------------------------------------------------
    def _build_layout(self) -> None:
        """What each rank sends after its step, owner by owner: its parameters (only the
        trainable ones with bucket views, which then live in one flat buffer)."""
        bucket = self.parameters_as_bucket_view
        self._zero_trainable = [p.requires_grad for p in self._index_to_param]
        self._zero_sent = [[p for g in groups for p in g["params"] if p.requires_grad or not bucket]
                      for groups in self._partition_parameters()]
        self._zero_counts = [sum(p.numel() for p in ps) for ps in self._zero_sent]
        first = self._index_to_param[0]
        self._zero_flat = None
        if bucket:
            dtype = as_numpy(first, "ZeroRedundancyOptimizer").dtype
            self._zero_flat = np.empty(max(1, sum(self._zero_counts)), dtype=dtype)
            flat_t = torch.from_numpy(self._zero_flat)
            at = 0
            for ps in self._zero_sent:
                for p in ps:
                    view = flat_t[at:at + p.numel()].view_as(p)
                    view.copy_(p.detach())
                    p.data = view
                    at += p.numel()

    def _sync_params(self) -> None:
        """Every rank gets every owner's parameters (one all-gather)."""
        if self.world_size == 1:
            return
        lo = sum(self._zero_counts[:self.rank])
        mine = self._zero_sent[self.rank]
        if self._zero_flat is not None:
            send = self._zero_flat[lo:lo + self._zero_counts[self.rank]]
        else:
            send = (np.concatenate([as_numpy(p, "step").reshape(-1) for p in mine])
                    if mine else np.empty(0, as_numpy(self._index_to_param[0], "step").dtype))
        everyone = self._zero_comm.allgatherv(send, self._zero_counts)
        if self._zero_flat is not None:
            self._zero_flat[:everyone.size] = everyone
            return
        at = 0
        with torch.no_grad():
            for r, ps in enumerate(self._zero_sent):
                for p in ps:
                    if r != self.rank:
                        p.copy_(torch.from_numpy(everyone[at:at + p.numel()]).view_as(p))
                    at += p.numel()

    # -- the optimizer -------------------------------------------------------------------
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        """Update this rank's parameters with the local optimizer, then receive the
        others' from their owners; returns what the local step returns."""
        if [p.requires_grad for p in self._index_to_param] != self._zero_trainable:
            self._build_layout()  # trainability changed: the exchange follows it
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        loss = (self.optim.step(**kwargs) if closure is None
                else self.optim.step(closure=closure, **kwargs))
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._sync_params()
        return loss

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (on every rank alike): its parameters are partitioned after those
        already there, whose owners stay the same."""
        super().add_param_group(param_group)
        if not getattr(self, "initialized", False):
            return
        self._check_params([p for g in self.param_groups for p in g["params"]])
        self._zero_partition_cache = []
        self._check_same_everywhere()
        self.optim.add_param_group(self._partition_parameters()[self.rank][-1])
        self._build_layout()

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's local state on rank ``to`` (collective: every rank calls
        it); ``state_dict()`` on ``to`` then returns the whole optimizer's state."""
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict: to={to!r} is not a rank of this "
                             f"group (0..{self.world_size - 1})")
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        mine = copy.deepcopy(self.optim.state_dict())  # a snapshot, as the others' are
        if self.world_size == 1:
            self._zero_all_state_dicts = [mine]
            return
        payload = _to_bytes(mine) if self.rank != to else np.empty(0, np.uint8)
        sizes = self._zero_comm.allgather_obj(payload.size)
        if self.rank != to:
            self._zero_all_state_dicts = []
            self._zero_comm.send_(payload, to)
            return
        self._zero_all_state_dicts = []
        for r in range(self.world_size):
            if r == to:
                self._zero_all_state_dicts.append(mine)
                continue
            buf = np.empty(sizes[r], np.uint8)
            self._zero_comm.recv_(buf, r)
            self._zero_all_state_dicts.append(_from_bytes(buf))

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer's state as of the last ``consolidate_state_dict`` on this
        rank, indexed as one unsharded optimizer's (PyTorch's format)."""
        if not self._zero_all_state_dicts:
            raise RuntimeError("ZeroRedundancyOptimizer: the state has not been "
                               f"consolidated on rank {self.rank}; call "
                               f"consolidate_state_dict(to={self.rank}) on every rank first")
        out = super().state_dict()
        index = {p: i for i, p in enumerate(self._index_to_param)}
        for local, groups in zip(self._zero_all_state_dicts, self._partition_parameters()):
            for lg, gg in zip(local["param_groups"], groups):
                for li, p in zip(lg["params"], gg["params"]):
                    if li in local["state"]:
                        out["state"][index[p]] = local["state"][li]
        out["state"] = dict(sorted(out["state"].items()))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole optimizer's state (from ``state_dict()``, or an unsharded
        optimizer's of the same parameters): each rank keeps its own parameters' part."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("ZeroRedundancyOptimizer.load_state_dict: the state has groups "
                             f"of {[len(g['params']) for g in groups]} parameters, this "
                             f"optimizer {[len(g['params']) for g in self.param_groups]}")
        self._sync_param_groups(groups, self.param_groups)
        index = {p: i for i, p in enumerate(self._index_to_param)}
        local_state, local_groups, at = {}, [], 0
        for g, mine in zip(self.param_groups, self._partition_parameters()[self.rank]):
            ids = []
            for p in mine["params"]:
                if index[p] in state_dict["state"]:
                    local_state[at] = state_dict["state"][index[p]]
                ids.append(at)
                at += 1
            local_groups.append({**{k: v for k, v in g.items() if k != "params"},
                                 "params": ids})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._sync_param_groups(self.optim.param_groups, self.param_groups)

    def __repr__(self) -> str:
        return (f"ZeroRedundancyOptimizer({type(self.optim).__name__}, rank {self.rank} of "
                f"{self.world_size}, {self._zero_counts[self.rank]} of {sum(self._zero_counts)} "
                "elements)")
