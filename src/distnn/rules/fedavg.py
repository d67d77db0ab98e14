"""``fedavg``: federated averaging (McMahan et al. 2017), with FedProx's proximal term
(Li et al. 2020) and secure aggregation by pairwise masks (``distributed.secagg``).

The training set is cut into ``clients`` parts (``data.partition``: iid, Dirichlet over
the labels, or label shards), dealt to the ranks round-robin (client k lives on rank
k mod ranks; several clients per rank are trained one after the other). A trainer epoch
is one round: a fraction of the clients is drawn (the same draw on every rank), each drawn
client starts from the global weights with a fresh optimizer state and trains
``local_epochs`` epochs on its own part (batches of the per-rank batch size, loss averaged
over each batch), and the server's new weights are the average of the clients' weights
weighted by their sample counts. That average is one all-reduce of
``[sum n_k w_k, sum n_k]`` (plain), or the same sums masked so that no client's update
leaves its process unmasked (``secure_aggregation``).

A client whose training raises is dropped from that round (a note names it and the
error); the others' average is the round's result. With FedProx (``mu`` > 0) each local
gradient gets ``mu (w - w_global)``.

Every rank trains no share of the trainer's global batches (``data_shard`` is None), so
the trainer calls ``serve`` once an epoch on every rank: the round.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import distributed as dist
from ..distributed.secagg import (ENCRYPTIONS, CKKSAggregator, SecureAggregator, check_ckks,
                                  load_tenseal)
from ..data.partition import PARTITIONS, client_partition
from ._p2p import Traffic
from .base import Rule, RuleArgumentError, whole_argument


class FedAvg(Rule):
    """Federated averaging over clients that are ranks or several per rank.

    Args:
        clients: the number of clients (0: one per rank).
        client_fraction: the share of clients drawn each round (at least one).
        local_epochs: E, each drawn client's epochs over its part per round.
        fedprox_mu: FedProx's mu (0: plain FedAvg).
        partition: iid | dirichlet | shards, how the training set is cut.
        dirichlet_alpha: the concentration of ``dirichlet`` (small: few classes each).
        shards_per_client: label shards per client of ``shards``.
        secure_aggregation: sum the updates with pairwise masks (no client's update
            leaves its process unmasked).
        encryption: none | ckks (tenseal): each rank's sum of its clients' updates leaves
            it as CKKS ciphertexts (TenSEAL, refused by name when not installed).
        encryption_slots, encryption_scale, encryption_security: CKKS's parameters.

    The partition, the draws and the clients' shuffles follow the trainer's seed.

    Example:
        Trainer(model, SGD(model, lr=0.05), rule=FedAvg(clients=10, client_fraction=0.5,
                partition="dirichlet", dirichlet_alpha=0.5)).fit(train, epochs=20)
    """

    name = "fedavg"

    def __init__(self, *, clients: int = 0, client_fraction: float = 1.0,
                 local_epochs: int = 1, fedprox_mu: float = 0.0, partition: str = "iid",
                 dirichlet_alpha: float = 0.5, shards_per_client: int = 2,
                 secure_aggregation: bool = False, encryption: str = "none",
                 encryption_slots: int = 4096, encryption_scale: float = 2.0 ** 40,
                 encryption_security: int = 128):
        clients = whole_argument(self.name, "clients", clients, least=0)
        if not 0 < client_fraction <= 1:
            raise ValueError(f"fedavg: client_fraction must be in (0, 1], got "
                             f"{client_fraction!r}")
        local_epochs = whole_argument(self.name, "local_epochs", local_epochs)
        if fedprox_mu < 0:
            raise ValueError(f"fedavg: fedprox_mu must be >= 0, got {fedprox_mu!r}")
        if partition not in PARTITIONS:
            raise ValueError(f"fedavg: partition must be one of {', '.join(PARTITIONS)}, "
                             f"got {partition!r}")
        if encryption not in ENCRYPTIONS:
            raise RuleArgumentError("encryption", f"must be one of {', '.join(ENCRYPTIONS)}")
        if encryption != "none":
            if secure_aggregation:
                raise RuleArgumentError("encryption", "and secure aggregation both hide the "
                                        "updates: give one of them")
            try:
                load_tenseal()
                check_ckks(int(encryption_slots), float(encryption_scale),
                           int(encryption_security))
            except (ImportError, ValueError) as exc:
                raise RuleArgumentError("encryption", str(exc)) from None
        self.encryption = "none" if encryption == "none" else "ckks"
        self._ckks_args = (int(encryption_slots), float(encryption_scale),
                           int(encryption_security))
        self.clients, self.client_fraction = int(clients), float(client_fraction)
        self.local_epochs, self.fedprox_mu = int(local_epochs), float(fedprox_mu)
        self.partition, self.dirichlet_alpha = partition, float(dirichlet_alpha)
        self.shards_per_client = int(shards_per_client)
        self.secure_aggregation = bool(secure_aggregation)
        self.seed = 0  # the trainer's seed, set in begin
        self.traffic = Traffic()
        self.rounds = 0
        self.dropped: list[tuple[int, int, str]] = []  # (round, client, error)
        self.participants: list[list[int]] = []
        self._train = None
        self._parts = None
        self._seed_cut = 0
        self._secagg = None
        self._ckks = None

    # -- the data -----------------------------------------------------------------------
    def attach_data(self, train) -> None:
        if train is self._train:
            return
        self._train, self._parts = train, None
        x, y = train.arrays()
        self._arrays = (x, y)
        if self.clients:  # else one client per rank: cut once the ranks are known
            self._parts = self._cut(self.clients)

    def _cut(self, k: int) -> list[np.ndarray]:
        y = self._arrays[1]
        labels = y.argmax(axis=1) if y.ndim > 1 else y
        try:
            return client_partition(labels, k, self.partition, alpha=self.dirichlet_alpha,
                                    shards_per_client=self.shards_per_client, seed=self.seed)
        except ValueError as exc:
            raise RuleArgumentError("clients", f"fedavg: {exc}") from None

    def data_shard(self, trainer):
        return None, trainer.comm.size

    def _setup(self, comm) -> None:
        if self._train is None:
            raise ValueError("fedavg: the rule needs the training set (Trainer.fit gives it)")
        k = self.clients or comm.size
        self.n_clients = k
        x, y = self._arrays
        parts = self._parts if self._parts is not None and self._seed_cut == self.seed \
            else self._cut(k)
        self.owners = [c % comm.size for c in range(k)]
        self.parts = {c: (x[idx], y[idx]) for c, idx in enumerate(parts)
                      if self.owners[c] == comm.rank}
        self.sizes = [len(idx) for idx in parts]
        if self.secure_aggregation:
            self._secagg = SecureAggregator(comm, self.owners)
        if self.encryption == "ckks":
            self._ckks = CKKSAggregator(comm, *self._ckks_args)

    def bind(self, trainer, optimizer):
        self.seed = self._seed_cut = int(trainer.seed)  # the partition follows it
        return optimizer

    def begin(self, trainer) -> None:
        self.seed = int(trainer.seed)
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        self._setup(trainer.comm)
        self._fresh = [{k: np.zeros_like(a) for k, a in state.items()}
                       for state in trainer.optimizer.state_dict()["state"]]

    # -- a round ------------------------------------------------------------------------
    def drawn(self, round: int) -> list[int]:
        """The clients of round ``round`` (the same on every rank)."""
        m = max(1, int(round_half_up(self.client_fraction * self.n_clients)))
        rng = np.random.default_rng([self.seed, round, 104729])
        return sorted(int(c) for c in rng.choice(self.n_clients, m, replace=False))

    def train_client(self, trainer, client: int, round: int, w_global: np.ndarray) -> int:
        """Train client ``client`` from ``w_global`` for ``local_epochs`` epochs on its part;
        return its sample count (the model then holds its weights)."""
        model, opt = trainer.model, trainer.optimizer
        x, y = self.parts[client]
        batch = max(1, trainer.global_batch_size // trainer.comm.size)
        rng = np.random.default_rng([self.seed, round, client])
        sums = trainer.epoch_sums
        for _ in range(self.local_epochs):
            order = rng.permutation(len(x))
            for lo in range(0, len(x), batch):
                ids = order[lo:lo + batch]
                xb, yb = x[ids], y[ids]
                logits = model.forward(xb, training=True)
                loss, dlogits = trainer.loss_fn(logits, yb, denom=len(ids))
                model.backward(dlogits)
                if self.fedprox_mu:
                    g, w = model.gradients_flat(), model.parameters_flat()
                    g += self.fedprox_mu * (w - w_global)
                opt.step()
                if not np.isfinite(loss):
                    raise FloatingPointError(f"client {client}: the loss became {loss}")
                if sums is not None:
                    trainer.metrics.accumulate(sums, logits, yb, loss, len(ids))
        return len(x)

    def serve(self, trainer, epoch: int, progress=None) -> None:
        comm, model = trainer.comm, trainer.model
        w = model.parameters_flat()
        w_global = w.copy()
        mine = [c for c in self.drawn(epoch) if self.owners[c] == comm.rank]
        start = trainer.optimizer.state_dict()
        # each client's optimizer starts afresh (no momentum, step 1) at the run's rate
        fresh = {**start, "iterations": 0, "state": self._fresh}
        updates: dict[int, np.ndarray] = {}
        failed: list[tuple[int, str]] = []
        for c in mine:
            w[...] = w_global
            trainer.optimizer.load_state_dict(fresh)
            try:
                n = self.train_client(trainer, c, epoch, w_global)
            except Exception as exc:  # a failing client is dropped from the round
                failed.append((c, f"{type(exc).__name__}: {exc}"))
                continue
            updates[c] = np.concatenate([w.astype(np.float64) * n, [float(n)]])
            if progress is not None:
                progress(n * self.local_epochs)
        w[...] = w_global
        trainer.optimizer.load_state_dict(start)
        # which clients finished (ids only; their counts travel inside the sums)
        survivors = sorted(c for part in comm.allgather_obj(sorted(updates)) for c in part)
        for part in comm.allgather_obj(failed):
            for c, error in part:
                self.dropped.append((epoch, c, error))
                trainer.print(f"fedavg: round {epoch + 1}: client {c} dropped from the round "
                              f"({error})")
        self.participants.append(survivors)
        n = w.size + 1
        if self._secagg is not None:
            total = self._secagg.sum(updates, survivors, epoch, n)
        elif self._ckks is not None:
            local = np.zeros(n, np.float64)
            for u in updates.values():
                local += u
            total = self._ckks.sum(local)
        else:
            total = np.zeros(n, np.float64)
            for u in updates.values():
                total += u
            comm.allreduce_(total, "sum")
        if self._ckks is None:
            self.traffic.sent(np.empty(n, np.uint64 if self._secagg else np.float64))
        else:
            self.traffic.messages += 1
            self.traffic.bytes = self._ckks.bytes_sent
        if total[-1] > 0:
            w[...] = total[:-1] / total[-1]
        else:
            trainer.print(f"fedavg: round {epoch + 1}: no client finished; the weights stay")
        self.rounds += 1

    def stats(self) -> dict[str, float]:
        out = self.traffic.as_dict()
        out["rounds"] = float(self.rounds)
        out["dropped"] = float(len(self.dropped))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state.get("rounds", 0))

    def __repr__(self) -> str:
        return (f"FedAvg(clients={self.clients}, client_fraction={self.client_fraction}, "
                f"local_epochs={self.local_epochs}, fedprox_mu={self.fedprox_mu}, "
                f"partition={self.partition!r}, secure_aggregation={self.secure_aggregation})")


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))
