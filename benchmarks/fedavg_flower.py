"""FedAvg on Fashion-MNIST: distnn's ``fedavg`` rule over MPI ranks against Flower's FedAvg
strategy, the same model, partitions, clients per round and local training.

Setup: 10 clients (Dirichlet(0.5) over the labels of the 60,000 training images,
``distnn.data.partition``), half of them drawn per round (the same draw on both sides:
``FedAvg.drawn``), each training 1 local epoch of plain SGD (lr 0.05, batch 32, the same
shuffles) of an MLP 784-128-10 from the same initial weights; test accuracy on the 10,000
test images after every round.

* distnn: ``mpiexec -n R python benchmarks/fedavg_flower.py distnn`` (the clients dealt
  round-robin to the R ranks; ``--secure`` sums with pairwise masks), writing
  fedavg_distnn.json and the initial weights.
* Flower: ``python benchmarks/fedavg_flower.py flower`` (one process): each client a
  ``flwr.client.NumPyClient`` training a torch module, the server step Flower's
  ``flwr.server.strategy.FedAvg.aggregate_fit`` (its sample-weighted average), the
  clients called in-process, in the order of the draw.
* Flower's simulation engine: ``python benchmarks/fedavg_flower.py flower-sim`` runs the
  same clients through ``flwr.simulation.start_simulation`` (Flower's legacy, Ray-based
  Virtual Client Engine; Ray comes with the ``fed`` extra, ``flwr[simulation]``, which
  pins ``ray==2.55.1``; the run recorded in RESULTS.md had Ray installed beside the venv
  with ``pip install --target``), 1 CPU per client actor and at most 2 actors, the server a
  ``FedAvg`` subclass whose ``configure_fit`` picks the clients of distnn's draw and whose
  ``evaluate_fn`` measures the test accuracy after every round; writes flower_sim.json.
  Without an initial.npz from a distnn run it writes one from the same construction
  (``Sequential(..., rng=3)``, what rank 0 broadcasts).
* ``python benchmarks/fedavg_flower.py table`` prints the table of all that exist.

Usage:
    mpiexec -n 2 python benchmarks/fedavg_flower.py distnn --rounds 15
    python benchmarks/fedavg_flower.py flower --rounds 15
    PYTHONPATH=/tmp/raysite python benchmarks/fedavg_flower.py flower-sim --rounds 15
    python benchmarks/fedavg_flower.py table
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank (2 cores; spinning costs)

import numpy as np  # noqa: E402

CLIENTS, FRACTION, ALPHA, SEED = 10, 0.5, 0.5, 3
LR, BATCH, LOCAL_EPOCHS, HIDDEN = 0.05, 32, 1, 128
OUT = Path("fedavg_bench")


def load():
    from distnn.data import load_dataset
    splits = load_dataset("fashion_mnist", download=False)
    x, y = splits.train.arrays()
    xt, yt = splits.test.arrays()
    return splits, x.reshape(len(x), -1), y, xt.reshape(len(xt), -1), yt


def rule(secure: bool = False):
    from distnn.rules.fedavg import FedAvg
    return FedAvg(clients=CLIENTS, client_fraction=FRACTION, local_epochs=LOCAL_EPOCHS,
                  partition="dirichlet", dirichlet_alpha=ALPHA, secure_aggregation=secure)


def run_distnn(rounds: int, secure: bool) -> None:
    from distnn import distributed as dist
    from distnn.nn import Dense, Flatten, ReLU, Sequential
    from distnn.optim import SGD
    from distnn.training import Trainer
    from distnn.data import load_dataset
    comm = dist.init()
    splits = load_dataset("fashion_mnist", download=False)
    model = Sequential([Flatten(), Dense(HIDDEN), ReLU(), Dense(10)], input_shape=(1, 28, 28),
                       rng=SEED)
    r = rule(secure)
    trainer = Trainer(model, SGD(model, lr=LR), comm=comm, rule=r, progress=False,
                      verbose=False, seed=SEED)
    dist.broadcast_parameters(model, comm=comm)
    initial = [p.copy() for layer in model.walk() for p in layer.params.values()]
    t0 = time.perf_counter()
    history = trainer.fit(splits.train, epochs=rounds, batch_size=BATCH,
                          validation=splits.test)
    wall = time.perf_counter() - t0
    if comm.rank == 0:
        OUT.mkdir(exist_ok=True)
        np.savez(OUT / "initial.npz", *initial)
        acc = [rec["val_accuracy"] for rec in history.records]
        name = "distnn_secure" if secure else "distnn"
        (OUT / f"{name}.json").write_text(json.dumps(
            {"accuracy": acc, "ranks": comm.size, "wall_s": wall,
             "clients_per_round": r.participants}))
        print(f"{name} on {comm.size} ranks: {rounds} rounds in {wall:.1f} s; "
              f"test accuracy {acc}")


def _local_training(net, xc, yc, round_: int, cid: int) -> None:
    """A Flower client's local epochs: plain SGD over its shard, the shuffles of
    ``default_rng([SEED, round, client])`` (the same on both Flower sides)."""
    import torch
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    rng = np.random.default_rng([SEED, round_, cid])
    for _ in range(LOCAL_EPOCHS):
        order = rng.permutation(len(xc))
        for lo in range(0, len(xc), BATCH):
            ids = torch.from_numpy(order[lo:lo + BATCH])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xc[ids]), yc[ids]).backward()
            opt.step()


def run_flower(rounds: int) -> None:
    import flwr
    import torch
    from flwr.common import FitRes, Status, Code, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg as FlowerFedAvg
    from distnn.data.partition import client_partition
    torch.set_num_threads(1)
    _, x, y, xt, yt = load()
    parts = client_partition(y, CLIENTS, "dirichlet", alpha=ALPHA, seed=SEED)
    with np.load(OUT / "initial.npz") as z:
        w1, b1, w2, b2 = (z[f"arr_{i}"] for i in range(4))
    net = torch.nn.Sequential(torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, 10))

    def set_weights(arrays):
        with torch.no_grad():
            for p, a in zip(net.parameters(), arrays):
                p.copy_(torch.from_numpy(np.ascontiguousarray(a)))

    def get_weights():
        return [p.detach().numpy().copy() for p in net.parameters()]

    class Client(flwr.client.NumPyClient):
        def __init__(self, cid: int, round: int):
            self.cid, self.round = cid, round

        def fit(self, parameters, config):
            set_weights(parameters)
            xc = torch.from_numpy(x[parts[self.cid]])
            yc = torch.from_numpy(y[parts[self.cid]].astype(np.int64))
            _local_training(net, xc, yc, self.round, self.cid)
            return get_weights(), len(xc), {}

    def accuracy() -> float:
        with torch.no_grad():
            return float((net(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())

    strategy = FlowerFedAvg(fraction_fit=FRACTION, fraction_evaluate=0.0)
    weights = [w1.T, b1, w2.T, b2]  # distnn's Dense keeps (in, out); torch's Linear (out, in)
    draws = rule()
    draws.n_clients, draws.seed = CLIENTS, SEED  # as the trainer's seed sets it
    acc = []
    t0 = time.perf_counter()
    for r in range(rounds):
        results = []
        for cid in draws.drawn(r):
            new, n, _ = Client(cid, r).fit(weights, {})
            results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(new), n,
                                         {})))
        aggregated, _ = strategy.aggregate_fit(r + 1, results, [])
        weights = parameters_to_ndarrays(aggregated)
        set_weights(weights)
        acc.append(accuracy())
    wall = time.perf_counter() - t0
    (OUT / "flower.json").write_text(json.dumps({"accuracy": acc, "wall_s": wall,
                                                 "flwr": flwr.__version__}))
    print(f"flower {flwr.__version__}: {rounds} rounds in {wall:.1f} s; test accuracy {acc}")


def initial_weights() -> list:
    """distnn's initial weights (initial.npz of a distnn run, else the same construction)."""
    path = OUT / "initial.npz"
    if not path.exists():
        from distnn.nn import Dense, Flatten, ReLU, Sequential
        model = Sequential([Flatten(), Dense(HIDDEN), ReLU(), Dense(10)],
                           input_shape=(1, 28, 28), rng=SEED)
        OUT.mkdir(exist_ok=True)
        np.savez(path, *[p.copy() for layer in model.walk() for p in layer.params.values()])
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(4)]


def _torch_net():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, 10))


def run_flower_sim(rounds: int) -> None:
    """The same clients through Flower's simulation engine (Ray actors)."""
    import flwr
    import ray
    import torch
    from flwr.common import ndarrays_to_parameters
    from flwr.common.typing import FitIns
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg as FlowerFedAvg
    from flwr.simulation import start_simulation
    from distnn.data.partition import client_partition
    torch.set_num_threads(1)
    _, x, y, xt, yt = load()
    parts = client_partition(y, CLIENTS, "dirichlet", alpha=ALPHA, seed=SEED)
    w1, b1, w2, b2 = initial_weights()
    ray_args = {"num_cpus": 2, "include_dashboard": False, "ignore_reinit_error": True,
                "object_store_memory": 1 << 30}
    ray.init(**ray_args)
    data = ray.put({"x": x, "y": y.astype(np.int64), "parts": parts})  # once, zero-copy reads

    class Client(flwr.client.NumPyClient):
        def __init__(self, cid: int):
            self.cid = cid

        def fit(self, parameters, config):
            import torch
            torch.set_num_threads(1)
            d = ray.get(data)
            net = _torch_net()
            with torch.no_grad():
                for p, a in zip(net.parameters(), parameters):
                    p.copy_(torch.from_numpy(np.ascontiguousarray(a)))
            xc = torch.from_numpy(d["x"][d["parts"][self.cid]])
            yc = torch.from_numpy(d["y"][d["parts"][self.cid]])
            _local_training(net, xc, yc, int(config["round"]), self.cid)
            return [p.detach().numpy().copy() for p in net.parameters()], len(xc), {}

    def client_fn(context):
        return Client(int(context.node_config["partition-id"])).to_client()

    draws = rule()
    draws.n_clients, draws.seed = CLIENTS, SEED  # as the trainer's seed sets it

    class DrawnFedAvg(FlowerFedAvg):
        """Flower's FedAvg, its client sampling replaced by distnn's draw."""

        def configure_fit(self, server_round, parameters, client_manager):
            client_manager.wait_for(CLIENTS)
            by_partition = {int(p.partition_id): p for p in client_manager.all().values()}
            ins = FitIns(parameters, {"round": server_round - 1})  # distnn's rounds from 0
            return [(by_partition[cid], ins) for cid in draws.drawn(server_round - 1)]

    net = _torch_net()
    acc, stamps = [], []

    def evaluate(server_round, arrays, config):
        if server_round == 0:
            return None
        with torch.no_grad():
            for p, a in zip(net.parameters(), arrays):
                p.copy_(torch.from_numpy(np.ascontiguousarray(a)))
            a = float((net(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())
        acc.append(a)
        stamps.append(time.perf_counter() - t0)
        print(f"flower-sim round {server_round}: test accuracy {a:.4f} "
              f"({stamps[-1]:.1f} s)", flush=True)
        return 0.0, {"accuracy": a}

    weights = [w1.T, b1, w2.T, b2]  # distnn's Dense keeps (in, out); torch's Linear (out, in)
    strategy = DrawnFedAvg(fraction_fit=FRACTION, fraction_evaluate=0.0,
                           min_available_clients=CLIENTS, evaluate_fn=evaluate,
                           initial_parameters=ndarrays_to_parameters(weights))
    t0 = time.perf_counter()
    start_simulation(client_fn=client_fn, num_clients=CLIENTS, strategy=strategy,
                     config=ServerConfig(num_rounds=rounds),
                     client_resources={"num_cpus": 1, "num_gpus": 0.0},
                     ray_init_args=ray_args, keep_initialised=True)
    wall = time.perf_counter() - t0
    ray.shutdown()
    (OUT / "flower_sim.json").write_text(json.dumps(
        {"accuracy": acc, "wall_s": wall, "round_end_s": stamps, "flwr": flwr.__version__,
         "ray": ray.__version__, "actors": 2}))
    print(f"flower-sim {flwr.__version__} (ray {ray.__version__}): {len(acc)} rounds in "
          f"{wall:.1f} s; test accuracy {acc}")


def table() -> None:
    runs = {}
    for name in ("distnn", "distnn_secure", "flower", "flower_sim"):
        path = OUT / f"{name}.json"
        if path.exists():
            runs[name] = json.loads(path.read_text())
    names = list(runs)
    label = {"distnn": "distnn fedavg", "distnn_secure": "distnn fedavg, secure agg.",
             "flower": "Flower FedAvg", "flower_sim": "Flower FedAvg, simulation (Ray)"}
    print("| round | " + " | ".join(
        f"{label[n]}" + (f" ({runs[n]['ranks']} ranks)" if "ranks" in runs[n] else "")
        for n in names) + " |")
    print("|---|" + "---|" * len(names))
    rounds = max(len(r["accuracy"]) for r in runs.values())
    for i in range(rounds):
        print(f"| {i + 1} | " + " | ".join(
            f"{runs[n]['accuracy'][i]:.4f}" if i < len(runs[n]["accuracy"]) else ""
            for n in names) + " |")
    print("| wall s | " + " | ".join(f"{runs[n]['wall_s']:.1f}" for n in names) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("side", choices=("distnn", "flower", "flower-sim", "table"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--secure", action="store_true")
    args = ap.parse_args()
    if args.side == "distnn":
        run_distnn(args.rounds, args.secure)
    elif args.side == "flower":
        run_flower(args.rounds)
    elif args.side == "flower-sim":
        run_flower_sim(args.rounds)
    else:
        table()


if __name__ == "__main__":
    main()
