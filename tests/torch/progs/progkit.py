"""What several of these programs share: a small convolutional net, training on sklearn
digits under distnn.torch, and a group of ranks forked on this machine. The programs run as
scripts, so this folder is first on their ``sys.path``."""
from __future__ import annotations

import os
import socket
from typing import Iterator, Sequence

import torch


def small_net(seed: int) -> torch.nn.Module:
    """A conv-tanh net for 1x6x6 inputs and 4 classes, seeded, in the default dtype."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 4 * 4, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 4))


def digits_net() -> torch.nn.Module:
    """A float64 conv net for sklearn digits (1x8x8, 10 classes), seed 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 36, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 10)).double()


def digits_steps(model: torch.nn.Module, opt, batches: Sequence[int]) -> Iterator[None]:
    """Train ``model`` with ``opt`` on sklearn digits (float64), one step per global batch
    size in ``batches``, taken in order and split over distnn.torch's ranks with
    ``np.array_split`` (uneven; a rank may get none: it steps all the same); yields after
    each step. The loss is summed over a rank's share and divided by the global batch."""
    import numpy as np

    import distnn.torch as hvd
    from distnn.data import load_dataset
    x, y = load_dataset("digits", dtype=np.float64).train.arrays()
    x = torch.from_numpy(x.astype(np.float64))  # preprocessed: scaled to [0, 1]
    y = torch.from_numpy(y)
    start = 0
    for b in batches:
        ids = np.array_split(np.arange(start, start + b), hvd.size())[hvd.rank()]
        start += b
        opt.zero_grad()
        if len(ids):
            loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids], reduction="sum") / b
            loss.backward()
        opt.step()
        yield


def fork_ranks(size: int) -> tuple[int, int]:
    """This process as rank 0 of ``size`` on this machine, ranks 1..size-1 forked from it
    (one torch import for the whole group): (this process's rank, a free port on
    127.0.0.1 for the group to meet at)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank = 0
    for r in range(1, size):
        if os.fork() == 0:
            rank = r
            break
    return rank, port
