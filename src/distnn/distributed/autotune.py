"""Tuning the gradient bucket size by measurement at the start of a run (Horovod's
autotuner tunes its fusion buffer the same way, ``HOROVOD_AUTOTUNE``).

The first steps of training try each candidate bucket size in turn: a few steps at the
starting size (the warm-up: first-step allocations, caches), then for every candidate
that gives a bucket layout of its own (sizes that cut the model into the same buckets are
tried once), one step to settle and ``steps`` timed steps. A step's time is the wall time
between the ends of consecutive steps (forward, backward, the exchange and the update
together: the overlap of communication with backward is what the size changes). Each
rank takes the median of its timed steps; the ranks then agree on the slowest rank's
median per candidate (one all-reduce, at the same step on every rank) and keep the size
with the lowest. The arithmetic of a dense or float16 exchange does not depend on the
bucket size on 2 ranks; on more, MPI may sum a message of another size in another order,
so a run that must repeat bit for bit passes the printed size as ``bucket_size_mb``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

# MiB; 0 is one bucket per layer.
CANDIDATES_MB = (0.0, 0.25, 1.0, 4.0, 16.0, 64.0)


class BucketTuner:
    """Which bucket size to use next, step by step, until the choice is made.

    Args:
        layout: ``layout(mb)`` -> the buckets ([(start, stop, names)]) of size ``mb``.
        comm: the communicator the choice is agreed on (its ``allreduce_``).
        start_mb: the size the run starts with (tried first, during the warm-up).
        candidates: the sizes to try (MiB).
        warmup_steps: untimed steps at the start.
        steps: timed steps per candidate.

    Example:
        tuner = BucketTuner(lambda mb: make_buckets(ranges, 4, mb), comm, start_mb=4.0)
        after every step: mb = tuner.step(time.perf_counter()); if mb is not None: rebuild
    """

    def __init__(self, layout: Callable[[float], list], comm, *, start_mb: float,
                 candidates=CANDIDATES_MB, warmup_steps: int = 2, steps: int = 5):
        if int(steps) < 1 or int(warmup_steps) < 0:
            raise ValueError(f"autotune needs steps >= 1 and warmup_steps >= 0, got {steps} "
                             f"and {warmup_steps}")
        distinct: dict[tuple, float] = {}
        for mb in (float(start_mb), *map(float, candidates)):
            key = tuple((lo, hi) for lo, hi, _ in layout(mb))
            distinct.setdefault(key, mb)
        self.trials = list(distinct.values())
        self.buckets = [len(key) for key in distinct]
        self.comm = comm
        self.warmup, self.steps = int(warmup_steps), int(steps)
        self.times: list[list[float]] = [[] for _ in self.trials]
        self.current = 0  # index of the size in use
        self._skip = self.warmup  # untimed steps left before the current trial's timing
        self._last: float | None = None
        self.chosen: float | None = None
        self.medians: list[float] | None = None

    @property
    def done(self) -> bool:
        return self.chosen is not None

    @property
    def steps_needed(self) -> int:
        """Training steps the tuning takes (the size is chosen at the end of the last)."""
        return self.warmup + 1 + len(self.trials) * (self.steps + 1) - 1

    def step(self, now: float) -> float | None:
        """Tell the tuner that a step ended at ``now`` (seconds); returns the bucket size
        to use from the next step on, or None to keep the current one."""
        if self.done:
            return None
        last, self._last = self._last, now
        if last is None or self._skip > 0:
            if last is not None:
                self._skip -= 1
            return None
        times = self.times[self.current]
        times.append(now - last)
        if len(times) < self.steps:
            return None
        if self.current + 1 < len(self.trials):
            self.current += 1
            self._skip = 1  # the first step on new buckets settles them
            return self.trials[self.current]
        return self._choose()

    def _choose(self) -> float | None:
        mine = np.array([np.median(t) for t in self.times], dtype=np.float64)
        self.comm.allreduce_(mine, "max")  # the slowest rank's step, per candidate
        self.medians = mine.tolist()
        best = int(np.argmin(mine))
        self.chosen = self.trials[best]
        changed = best != self.current
        self.current = best
        return self.chosen if changed else None

    def report(self) -> str:
        """One line: the size chosen and every candidate's median step time."""
        tried = ", ".join(
            f"{_mb(mb)} ({n} bucket{'s' if n != 1 else ''}) {1e3 * t:.1f} ms"
            for mb, n, t in zip(self.trials, self.buckets, self.medians or []))
        return (f"autotune: bucket_size_mb {_mb(self.chosen)} (median step time of the "
                f"slowest rank over {self.steps} steps: {tried})")


def _mb(mb: float | None) -> str:
    return "?" if mb is None else f"{mb:g}"
