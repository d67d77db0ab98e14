"""--parallel partial (SINGA's partial update) on real data, float64, real mpiexec: every
rank's weights after every step against a NumPy reference (1e-10), each chunk identical on
all ranks right after its turn, exact --resume (also the chunk position), a resume on
another number of ranks, and the traffic of a step (one chunk)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rulejobs import run_jobs
from helpers import needs_mpi

sys.path.insert(0, str(Path(__file__).parent / "progs"))
from partial_prog import CLASSES, digits  # noqa: E402

from distnn.rules.partial import chunk_edges  # noqa: E402

pytestmark = needs_mpi
PROG = Path(__file__).parent / "progs" / "partial_prog.py"
TOL = 1e-10
LR, MOMENTUM = 0.5, 0.9
# 1150 training images: a global batch of 82 leaves 2 (shares 1, 1, 0 on 3 ranks), one of 83
# leaves 71 (shares 36, 35 on 2 ranks)
GBS = {3: 82, 2: 83}


def launch(n: int, jobs: list[dict], out: Path) -> dict:
    return run_jobs(n, jobs, out, timeout=180, prog=PROG, stdout=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("partial")
    ckpt = str(out / "partial.ckpt.npz")
    common = {"lr": LR, "momentum": MOMENTUM}
    three = launch(3, [
        {**common, "name": "k4", "chunks": 4, "epochs": 2, "gbs": GBS[3]},
        {**common, "name": "first", "chunks": 4, "epochs": 1, "gbs": GBS[3],
         "checkpoint": ckpt},
        {**common, "name": "resumed", "chunks": 4, "epochs": 2, "gbs": GBS[3],
         "resume": ckpt},
        {**common, "name": "rechunked", "chunks": 3, "epochs": 2, "gbs": GBS[3],
         "resume": ckpt},
    ], out)
    two = launch(2, [
        {**common, "name": "k3", "chunks": 3, "epochs": 2, "gbs": GBS[2]},
        {**common, "name": "other_ranks", "chunks": 4, "epochs": 2, "gbs": GBS[3],
         "resume": ckpt},
    ], out)
    return {3: three, 2: two}


# -- the NumPy reference ----------------------------------------------------------------------
def grad(flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the mean softmax cross-entropy of Flatten + Dense (w, then b, flat)."""
    x = x.reshape(len(x), -1)
    features = x.shape[1]
    w = flat[:features * CLASSES].reshape(features, CLASSES)
    z = x @ w + flat[features * CLASSES:]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return np.concatenate([(x.T @ p).ravel(), p.sum(axis=0)])


def shards(size: int, gbs: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per step of one epoch (no shuffle), per rank: that rank's (x, y)."""
    train = digits()
    per_rank = [list(train.batches(gbs, shuffle=False, rank=r, size=size))
                for r in range(size)]
    return [[(b.x, b.y) for b in step] for step in zip(*per_rank)]


class Replicas:
    """Every rank's weights and torch-style SGD momentum, with partial averaging."""

    def __init__(self, weights: list[np.ndarray], chunks: int, position: int = 0,
                 buffers: list | None = None):
        self.w = [w.copy() for w in weights]
        self.buf = list(buffers) if buffers is not None else [None] * len(weights)
        self.edges = chunk_edges(weights[0].size, chunks)
        self.chunks, self.position = chunks, position
        self.samples = np.zeros((len(weights), chunks))
        self.stale = np.zeros(chunks, bool)

    def _average(self, c: int) -> None:
        lo, hi = self.edges[c], self.edges[c + 1]
        total = self.samples[:, c].sum()
        if total:
            avg = sum(w[lo:hi] * s for w, s in zip(self.w, self.samples[:, c])) / total
            for w in self.w:
                w[lo:hi] = avg
        self.samples[:, c] = 0
        self.stale[c] = False

    def step(self, data) -> None:
        for r, (x, y) in enumerate(data):
            if len(y):
                g = grad(self.w[r], x, y)
                self.buf[r] = g.copy() if self.buf[r] is None else MOMENTUM * self.buf[r] + g
                self.w[r] = self.w[r] - LR * self.buf[r]
                self.samples[r] += len(y)
        self.stale[:] = True
        c, self.position = self.position, (self.position + 1) % self.chunks
        self._average(c)

    def end_epoch(self) -> None:
        for c in range(self.chunks):
            if self.stale[c]:
                self._average(c)


def reference(initial, size, chunks, epochs, gbs, **start):
    reps = Replicas([initial] * size, chunks, **start)
    steps = []
    for _ in range(epochs):
        for data in shards(size, gbs):
            reps.step(data)
            steps.append([w.copy() for w in reps.w])
        reps.end_epoch()
    return reps, steps


# -- the tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size,name,chunks", [(3, "k4", 4), (2, "k3", 3)])
def test_every_step_matches_the_numpy_reference(runs, size, name, chunks):
    ranks = runs[size][name]
    reps, steps = reference(ranks[0]["initial"], size, chunks, 2, GBS[size])
    assert len(steps) == len(ranks[0]["steps"]) == 2 * ranks[0]["steps_per_epoch"]
    for s, want in enumerate(steps):
        for r in range(size):
            np.testing.assert_allclose(ranks[r]["steps"][s], want[r], rtol=0, atol=TOL,
                                       err_msg=f"step {s}, rank {r}")
    for r in range(size):  # the epoch ends with a full average: every rank the same model
        np.testing.assert_allclose(ranks[r]["final"], reps.w[0], rtol=0, atol=TOL)
    # the replicas really trained apart between the turns
    assert np.abs(ranks[0]["steps"][2] - ranks[1]["steps"][2]).max() > 1e-3


@pytest.mark.parametrize("size,name,chunks", [(3, "k4", 4), (2, "k3", 3)])
def test_each_chunk_is_averaged_once_every_k_steps(runs, size, name, chunks):
    ranks = runs[size][name]
    n = ranks[0]["initial"].size
    edges = chunk_edges(n, chunks)
    steps = [np.array([ranks[r]["steps"][s] for r in range(size)])
             for s in range(len(ranks[0]["steps"]))]
    for s, w in enumerate(steps):
        turn = s % chunks  # the turns run on across epochs
        for c in range(chunks):
            lo, hi = edges[c], edges[c + 1]
            apart = np.abs(w[:, lo:hi] - w[0, lo:hi]).max()
            if c == turn:  # right after its turn the chunk is the same on every rank ...
                assert apart < 1e-13, (s, c, apart)
            else:  # ... and only then: the other chunks hold each rank's own weights
                assert apart > 1e-6, (s, c, apart)
    # one message per step (its chunk and a count) and one full average per epoch
    stats = ranks[0]["stats"]
    sizes = np.diff(edges)
    want = sum(8 * (sizes[s % chunks] + 1) for s in range(len(steps))) + 2 * 8 * (n + chunks)
    assert stats["messages"] == len(steps) + 2
    assert stats["bytes"] == want
    assert ranks[0]["position"] == len(steps) % chunks


def test_resume_continues_exactly_with_the_chunk_position(runs):
    three = runs[3]
    for r in range(3):
        np.testing.assert_allclose(three["resumed"][r]["final"], three["k4"][r]["final"],
                                   rtol=0, atol=1e-12)
        # every step of the second epoch, on every rank (own optimizer, same chunk turns)
        epoch = three["k4"][r]["steps_per_epoch"]
        np.testing.assert_allclose(three["resumed"][r]["steps"], three["k4"][r]["steps"][epoch:],
                                   rtol=0, atol=1e-12)
    first = three["first"][0]
    assert first["position"] == first["steps_per_epoch"] % 4 != 0  # mid-cycle checkpoint
    assert np.abs(first["final"] - three["k4"][0]["final"]).max() > 1e-4


def test_resume_on_another_number_of_ranks_starts_from_rank_0s_optimizer(runs):
    """A 3-rank checkpoint resumed on 2 ranks: the averaged weights and the chunk position
    carry over, both ranks take rank 0's momentum, and the run goes on as partial on 2."""
    first = runs[3]["first"][0]
    other = runs[2]["other_ranks"]
    assert "every rank starts from rank 0's" in runs[2]["stdout"]
    reps, _ = reference(first["initial"], 3, 4, 1, GBS[3])
    np.testing.assert_allclose(reps.w[0], first["final"], rtol=0, atol=TOL)
    cont, steps = reference(reps.w[0], 2, 4, 1, GBS[3], position=reps.position,
                            buffers=[reps.buf[0].copy(), reps.buf[0].copy()])
    for r in range(2):
        np.testing.assert_allclose(other[r]["steps"], np.array([s[r] for s in steps]),
                                   rtol=0, atol=TOL)
        np.testing.assert_allclose(other[r]["final"], cont.w[0], rtol=0, atol=TOL)


def test_resume_with_other_chunks_starts_the_turns_at_chunk_0(runs):
    first = runs[3]["first"][0]
    assert "the turns start at chunk 0" in runs[3]["stdout"]
    reps, _ = reference(first["initial"], 3, 4, 1, GBS[3])
    cont, steps = reference(reps.w[0], 3, 3, 1, GBS[3], position=0,
                            buffers=[b.copy() for b in reps.buf])
    for r in range(3):
        np.testing.assert_allclose(runs[3]["rechunked"][r]["steps"],
                                   np.array([s[r] for s in steps]), rtol=0, atol=TOL)


def test_chunk_edges_cover_every_weight_once():
    for n, k in [(10, 1), (10, 3), (10, 10), (563722, 4), (7, 6)]:
        edges = chunk_edges(n, k)
        sizes = np.diff(edges)
        assert edges[0] == 0 and edges[-1] == n and len(sizes) == k
        assert sizes.max() - sizes.min() <= 1 and (sizes > 0).all()
