"""Per-layer timing, all-reduce wait and Chrome traces of a training run.

``Profiler`` wraps the ``forward``/``backward`` of every top-level layer of the model, the
gradient synchronization of the ``DistributedOptimizer`` and the optimizer update with
timers, for the duration of ``Trainer.fit`` only (the wrappers are instance attributes,
removed by ``detach``): a run without a profiler runs the unwrapped methods, at no cost.

After each epoch it prints (rank 0) a table of milliseconds per training step spent in each
layer's forward and backward, in waiting for the gradient all-reduce and in the update, with
the all-reduce wait of every rank. With ``trace=True`` it also records every call as a
Chrome-trace event (open the file in chrome://tracing or https://ui.perfetto.dev), like
Horovod's timeline: one process row per rank, compute on thread 0, communication on 1.

Example:
    prof = Profiler(trace=True)
    Trainer(model, opt, profiler=prof).fit(train, epochs=1)
    prof.write_trace("trace.json", comm)   # trace.json.rank0, trace.json.rank1, ...
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Any, Callable

__all__ = ["Profiler"]

_COMPUTE, _COMM = 0, 1


class Profiler:
    """Timers around layers and communication, enabled only while attached.

    Args:
        trace: also keep one Chrome-trace event per call (memory grows with the run).
        report: print the per-epoch table on rank 0.

    Attributes:
        epochs: one dict per profiled epoch: "epoch", "steps", "time", "layers"
            ({name: {"type", "forward", "backward", "calls"}} in seconds), "comm_wait",
            "update", and "comm_wait_ranks" (every rank's wait).
        events: the trace events of this rank.
    """

    def __init__(self, *, trace: bool = False, report: bool = True):
        self.trace = bool(trace)
        self.report_tables = bool(report)
        self.epochs: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._trainer = None
        self._wrapped: list[tuple[Any, str]] = []
        self._reset()

    def _reset(self) -> None:
        self._fwd: dict[str, float] = defaultdict(float)
        self._bwd: dict[str, float] = defaultdict(float)
        self._calls: dict[str, int] = defaultdict(int)
        self._wait = 0.0
        self._update = 0.0
        self._steps0 = 0
        self._t_epoch = time.perf_counter()

    # -- wrapping -----------------------------------------------------------------------
    def _event(self, name: str, cat: str, t0: float, t1: float, tid: int,
               args: dict | None = None) -> None:
        event = {"name": name, "cat": cat, "ph": "X", "pid": self._rank,
                 "tid": tid, "ts": (self._wall0 + t0 - self._perf0) * 1e6,
                 "dur": (t1 - t0) * 1e6}
        if args:
            event["args"] = args
        self.events.append(event)

    def _wrap(self, obj, attr: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(obj, attr)
        setattr(obj, attr, make(original))
        self._wrapped.append((obj, attr))

    def attach(self, trainer) -> None:
        """Start timing ``trainer``'s model and optimizer (the trainer calls this)."""
        if self._trainer is not None:
            raise RuntimeError("Profiler is already attached to a trainer")
        self._trainer = trainer
        self._rank = trainer.comm.rank
        self._perf0, self._wall0 = time.perf_counter(), time.time()
        perf = time.perf_counter
        trace = self.trace

        self._layer_types: dict[str, str] = {}
        for layer in trainer.model.layers:
            name = layer.name
            self._layer_types[name] = type(layer).__name__

            def forward_wrapper(fn, name=name):
                def forward(x, training=False):
                    t0 = perf()
                    y = fn(x, training)
                    t1 = perf()
                    if training:
                        self._fwd[name] += t1 - t0
                        self._calls[name] += 1
                    if trace:
                        self._event(f"{name}.forward", "forward" if training else "eval",
                                    t0, t1, _COMPUTE)
                    return y
                return forward

            def backward_wrapper(fn, name=name):
                def backward(dy):
                    t0 = perf()
                    dx = fn(dy)
                    t1 = perf()
                    self._bwd[name] += t1 - t0
                    if trace:
                        self._event(f"{name}.backward", "backward", t0, t1, _COMPUTE)
                    return dx
                return backward

            self._wrap(layer, "forward", forward_wrapper)
            self._wrap(layer, "backward", backward_wrapper)

        dopt = trainer.optimizer
        if hasattr(dopt, "synchronize"):
            def counters():
                return (getattr(dopt, "bytes_reduced", 0),
                        getattr(dopt, "bytes_dense", getattr(dopt, "bytes_reduced", 0)))

            def sync_wrapper(fn):
                def synchronize():
                    before = counters() if trace else None
                    t0 = perf()
                    fn()
                    t1 = perf()
                    self._wait += t1 - t0
                    if trace:
                        after = counters()
                        # bytes this step handed to collectives, after and before compression
                        self._event("allreduce.wait", "comm", t0, t1, _COMM,
                                    {"bytes": after[0] - before[0],
                                     "bytes_dense": after[1] - before[1]})
                return synchronize
            self._wrap(dopt, "synchronize", sync_wrapper)
        base = getattr(dopt, "optimizer", dopt)

        def step_wrapper(fn):
            def step():
                t0 = perf()
                fn()
                t1 = perf()
                self._update += t1 - t0
                if trace:
                    self._event("optimizer.update", "update", t0, t1, _COMPUTE)
            return step
        self._wrap(base, "step", step_wrapper)

    def detach(self) -> None:
        """Remove every wrapper (the trainer calls this at the end of ``fit``)."""
        for obj, attr in reversed(self._wrapped):
            if attr in vars(obj):
                delattr(obj, attr)
        self._wrapped = []
        self._trainer = None

    # -- epochs -------------------------------------------------------------------------
    def epoch_begin(self, epoch: int) -> None:
        self._reset()
        self._steps0 = self._trainer.global_step

    def epoch_end(self, epoch: int) -> None:
        """Store this epoch's figures and print the table on rank 0 (collective: the
        all-reduce waits of all ranks are gathered)."""
        trainer = self._trainer
        steps = trainer.global_step - self._steps0
        layers = {name: {"type": self._layer_types[name], "forward": self._fwd[name],
                         "backward": self._bwd[name], "calls": self._calls[name]}
                  for name in self._layer_types}
        waits = trainer.comm.allgather_obj(self._wait)
        # The training rule's counters (messages, bytes, seconds waiting), this epoch's share.
        totals = trainer.comm.allgather_obj(trainer.rule.stats())
        last = getattr(self, "_rule_totals", None) or [{} for _ in totals]
        self._rule_totals = totals
        rule_ranks = [{k: v - before.get(k, 0.0) for k, v in now.items()}
                      for now, before in zip(totals, last)]
        record = {"epoch": epoch + 1, "steps": steps,
                  "time": time.perf_counter() - self._t_epoch, "layers": layers,
                  "comm_wait": self._wait, "update": self._update,
                  "comm_wait_ranks": [float(w) for w in waits], "rule": trainer.rule.name,
                  "rule_ranks": rule_ranks}
        self.epochs.append(record)
        if self.report_tables:
            trainer.print(self.table(record), force=True)

    @staticmethod
    def table(record: dict[str, Any]) -> str:
        """The per-epoch table: ms per step of each layer's forward and backward, the
        all-reduce wait and the update."""
        steps = max(record["steps"], 1)
        ms = lambda s: 1e3 * s / steps  # noqa: E731
        rows = [("layer", "type", "forward ms", "backward ms", "total %")]
        total = sum(v["forward"] + v["backward"] for v in record["layers"].values())
        total += record["comm_wait"] + record["update"]
        pct = lambda s: f"{100 * s / total:.1f}" if total > 0 else "-"  # noqa: E731
        for name, v in record["layers"].items():
            rows.append((name, v["type"], f"{ms(v['forward']):.3f}", f"{ms(v['backward']):.3f}",
                         pct(v["forward"] + v["backward"])))
        rows.append(("allreduce wait", "comm", "", f"{ms(record['comm_wait']):.3f}",
                     pct(record["comm_wait"])))
        rows.append(("optimizer update", "update", "", f"{ms(record['update']):.3f}",
                     pct(record["update"])))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"Profile of epoch {record['epoch']} (rank 0, {record['steps']} steps, "
                 f"{record['time']:.2f} s):"]
        for i, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) if j < 2 else c.rjust(w)
                                          for j, (c, w) in enumerate(zip(r, widths))))
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        waits = record["comm_wait_ranks"]
        if len(waits) > 1:
            lines.append("  allreduce wait per rank (s): "
                         + ", ".join(f"{r}: {w:.3f}" for r, w in enumerate(waits)))
        for r, st in enumerate(record.get("rule_ranks", [])):
            if st:
                extra = (f", master idle {st['idle_s']:.2f} s / busy {st['busy_s']:.2f} s"
                         f" (CPU {st['serve_cpu_s']:.2f} s)" if st.get("serve_s") else "")
                if st.get("received"):
                    extra += f", {st['received']:.0f} messages received"
                if "top_received" in st:  # several masters: what reached the top one
                    extra += f", {st['top_received']:.0f} of them from the sub-masters"
                if "ups" in st:
                    extra += f", {st['ups']:.0f} exchanges with the top master"
                dense = st.get("bytes_dense")
                per_step = (f" ({st.get('bytes', 0) / steps / 1e3:.1f} kB/step; "
                            f"{dense / steps / 1e3:.1f} kB/step before compression)"
                            if dense is not None else "")
                lines.append(f"  {record['rule']} rank {r}: {st.get('messages', 0):.0f} "
                             f"messages sent, {st.get('bytes', 0) / 2**20:.2f} MB{per_step}, "
                             f"waited {st.get('wait_s', 0):.3f} s{extra}")
        return "\n".join(lines)

    # -- output -------------------------------------------------------------------------
    def write_trace(self, path: str, comm, *, merged: bool = False) -> list[str]:
        """Write the Chrome trace (collective). Each rank writes ``path.rank{r}`` (just
        ``path`` with one rank), or with ``merged`` rank 0 writes all events to ``path``.
        Returns the files written by this rank."""
        from .history import atomic_write_text
        meta = [{"name": "process_name", "ph": "M", "pid": comm.rank,
                 "args": {"name": f"rank {comm.rank}"}},
                {"name": "thread_name", "ph": "M", "pid": comm.rank, "tid": _COMPUTE,
                 "args": {"name": "compute"}},
                {"name": "thread_name", "ph": "M", "pid": comm.rank, "tid": _COMM,
                 "args": {"name": "communication"}}]
        events = meta + self.events
        if merged and comm.size > 1:
            everyone = comm.allgather_obj(events)
            if comm.rank != 0:
                return []
            events = [e for evs in everyone for e in evs]
            target = path
        else:
            target = path if comm.size == 1 else f"{path}.rank{comm.rank}"

        def write(f):
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

        atomic_write_text(os.fspath(target), write)
        return [target]
