"""An hvd.elastic job for tests/torch/test_elastic.py and tests/cluster/test_elastic_hosts.py.

``memory`` (under mpiexec): commit, change everything, raise HorovodInternalError inside
``@hvd.elastic.run``; prints per rank, as JSON, what the second call found.

``job`` (under ``distnn launch``): trains a linear model on ``--samples`` samples (24)
through an ElasticSampler, committing every ``--commit_every`` steps; every rank logs,
per world, the indices it consumed at each step (``OUT/r{rank}.w{world}.jsonl``) and
what it started from; rank 0 logs each commit's values (``OUT/events.jsonl``).
``--kill_at S``: in world 0, rank 1 kills itself (SIGKILL) at step S, after the step and
before its commit. ``--add_slot_at S``: in world 0, rank 0 writes ``localhost:2`` into
``--hosts_file`` at step S (the host discovery script prints that file).
"""
import argparse
import json
import os
import signal
import time

import torch

import distnn.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("mode", choices=["memory", "job"])
p.add_argument("--out", default=".")
p.add_argument("--kill_at", type=int, default=0)
p.add_argument("--add_slot_at", type=int, default=0)
p.add_argument("--hosts_file", default="")
p.add_argument("--commit_every", type=int, default=2)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--samples", type=int, default=24)
args = p.parse_args()

hvd.init()
torch.manual_seed(0)
WORLD = int(os.environ.get("DISTNN_ELASTIC_WORLD", "0"))
data = torch.arange(3 * args.samples, dtype=torch.float64).reshape(-1, 3) / 72
target = data.sum(1, keepdim=True) * 0.5
model = torch.nn.Linear(3, 1).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(list(range(args.samples)), shuffle=True, seed=3)
resets = []


def weights():
    return [repr(v) for v in torch.cat([q.detach().flatten() for q in model.parameters()])
            .tolist()]


def log(name, **record):
    with open(os.path.join(args.out, name), "a") as f:
        f.write(json.dumps(record) + "\n")


def step(indices):
    opt.zero_grad()
    x, y = data[indices], target[indices]
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


@hvd.elastic.run
def memory_run(state):
    state.calls += 1  # counts within this call only: restored below
    if len(resets) == 0:
        step([0, 1])
        state.batch, state.log = 5, ["a"]
        state.sampler.record_batch(0, 2)
        state.commit()
        state.committed = weights()
        state.commit()
        step([2, 3])
        state.batch = 9
        state.log.append("b")
        state.sampler.record_batch(1, 2)
        state.check_host_updates()  # never raises without distnn launch
        raise hvd.elastic.HorovodInternalError("test")
    print(json.dumps({"rank": hvd.rank(), "resets": len(resets), "batch": state.batch,
                      "log": state.log, "calls": state.calls,
                      "processed": state.sampler.processed_num,
                      "same_weights": weights() == state.committed}), flush=True)


@hvd.elastic.run
def train(state):
    log(f"r{hvd.rank()}.w{WORLD}.jsonl", start=state.step, size=hvd.size(),
        processed=state.sampler.processed_num, weights=weights())
    indices = list(iter(state.sampler))
    batch = 2
    for i in range(0, len(indices), batch):
        mine = indices[i:i + batch]
        step(mine)
        state.step += 1
        state.sampler.record_batch(i // batch, batch)
        log(f"r{hvd.rank()}.w{WORLD}.jsonl", step=state.step, indices=mine)
        if WORLD == 0 and state.step == args.kill_at and hvd.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if WORLD == 0 and state.step == args.add_slot_at and hvd.rank() == 0:
            with open(args.hosts_file, "w") as f:
                f.write("localhost:2\n")
        time.sleep(args.sleep)
        if state.step % args.commit_every == 0:
            if hvd.rank() == 0:  # what this commit holds, logged before it can be lost
                log("events.jsonl", committing=state.step, world=WORLD, weights=weights())
            try:
                state.commit()
            except hvd.elastic.HostsUpdatedInterrupt:
                if hvd.rank() == 0:
                    log("events.jsonl", interrupt=state.step, world=WORLD)
                raise
            if hvd.rank() == 0:
                log("events.jsonl", commit=state.step, world=WORLD, weights=weights())


if args.mode == "memory":
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, batch=0, log=[], calls=0,
                                   committed=None)
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    memory_run(state)
else:
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, step=0)
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    train(state)
    if hvd.rank() == 0:
        log("events.jsonl", done=state.step, world=WORLD, resets=len(resets),
            weights=weights())
