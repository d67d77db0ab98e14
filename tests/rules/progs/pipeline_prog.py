"""Trains tiny float64 models under the ``pipeline`` rule and, on rank 0, the same model
unsplit with gradient accumulation over the same micro-batches (model.forward/backward and
an optimizer, no rule), and writes both for tests/rules/test_pipeline.py.
Usage: pipeline_prog.py OUT_DIR JOBS_JSON (a list of jobs; one MPI job runs them all)."""
from __future__ import annotations

import json
import sys

import numpy as np

from distnn import distributed as dist
from distnn.data import ArrayDataset, Preprocess
from distnn.nn import (BatchNormalization, Conv2D, Dense, Dropout, Flatten, MaxPool2D, ReLU,
                       Sequential, Tanh)
from distnn.nn.losses import get_loss
from distnn.optim import get_optimizer
from distnn.rules import Pipeline
from distnn.training import Trainer

CLASSES = 4


def build(kind: str, seed: int) -> Sequential:
    if kind == "mlp":  # 7 top-level layers, batch norm and dropout inside
        layers = [Dense(8), BatchNormalization(), ReLU(), Dense(8), Tanh(), Dropout(0.3),
                  Dense(CLASSES)]
        shape = (6,)
    else:  # a small CNN
        layers = [Conv2D(3, 3, padding="same"), BatchNormalization(), ReLU(), MaxPool2D(2),
                  Flatten(), Dense(CLASSES)]
        shape = (1, 6, 6)
    return Sequential(layers, input_shape=shape, dtype=np.float64, rng=seed)


def dataset(kind: str, n: int) -> ArrayDataset:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 6) if kind == "mlp" else (n, 1, 6, 6))
    y = rng.integers(0, CLASSES, size=n)
    return ArrayDataset(x, y, CLASSES, preprocess=Preprocess(dtype=np.float64,
                                                             normalize=False))


def buffers(model) -> np.ndarray:
    arrays = [np.ravel(l.buffers[k]) for l in model.walk() for k in sorted(l.buffers)]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def reference(job: dict, replicas: int) -> dict:
    """The unsplit model: per global batch, each replica's share cut into M micro-batches,
    their gradients summed (each loss over the global batch), one step."""
    model = build(job["model"], job["seed"])
    opt = get_optimizer(job["optimizer"], model, lr=job["lr"], **job.get("hyper", {}))
    loss_fn = get_loss("categorical_cross_entropy")
    ds = dataset(job["model"], job["n"])
    gbs = job["batch"] * replicas
    grads = model.gradients_flat()
    losses = []
    for _ in range(job["epochs"]):
        shares = [ds.batches(gbs, shuffle=False, rank=d, size=replicas)
                  for d in range(replicas)]
        for parts in zip(*shares):
            acc = np.zeros_like(grads)
            total = 0.0
            for part in parts:
                bounds = np.linspace(0, len(part.x), job["micro"] + 1).round().astype(int)
                for a, b in zip(bounds[:-1], bounds[1:]):
                    logits = model.forward(part.x[a:b], training=True)
                    loss, dlogits = loss_fn(logits, part.y[a:b], denom=gbs)
                    model.backward(dlogits)
                    np.add(acc, grads, out=acc)
                    total += float(loss)
            grads[...] = acc
            opt.step()
            losses.append(total)
    return {"weights": model.parameters_flat().copy(), "buffers": buffers(model),
            "losses": losses}


def _stage_views(rule) -> list:
    return [p for l in rule.model.walk() for p in l.params.values()]


def resumed(job: dict, comm, out: str) -> dict:
    """One epoch with a checkpoint at its end, then a fresh model and trainer resuming it
    for the rest: the weights and buffers it ends with."""
    from distnn.training.stopping import TrainingCheckpoint
    path = f"{out}/{job['name']}.ck.npz"
    weights = {}
    for epochs, callbacks, resume in ((1, [TrainingCheckpoint(path)], None),
                                      (job["epochs"], [], path)):
        model = build(job["model"], job["seed"] + 7 * (resume is not None))  # not the start
        opt = get_optimizer(job["optimizer"], model, lr=job["lr"], **job.get("hyper", {}))
        rule = Pipeline(stages=job["stages"], micro_batches=job["micro"],
                        schedule=job["schedule"], balance=job["balance"])
        trainer = Trainer(model, opt, comm=comm, rule=rule, progress=False, verbose=False,
                          callbacks=callbacks)
        trainer.fit(dataset(job["model"], job["n"]), epochs=epochs, batch_size=job["batch"],
                    shuffle=False, resume=resume)
        weights = {"weights": model.parameters_flat().tolist(),
                   "buffers": buffers(model).tolist()}
    import glob
    weights["files"] = sorted(f.rsplit("/", 1)[1] for f in glob.glob(f"{out}/{job['name']}.ck*"))
    return weights


def run(job: dict, comm, out: str) -> None:
    model = build(job["model"], job["seed"])
    opt = get_optimizer(job["optimizer"], model, lr=job["lr"], **job.get("hyper", {}))
    rule = Pipeline(stages=job["stages"], micro_batches=job["micro"],
                    schedule=job["schedule"], balance=job["balance"])
    from distnn.training import Callback

    class Record(Callback):
        def __init__(self):
            self.losses, self.held = [], set()

        def on_batch_end(self, trainer, step, logs):
            self.losses.append(trainer.batch_loss)
            # what this rank keeps in its steps: the model's whole buffers, the stage's,
            # and the bytes of the other layers' parameter views (placeholders: none)
            others = sum(np.asarray(p).base.nbytes if np.asarray(p).base is not None else
                         np.asarray(p).nbytes
                         for l in model.walk() for p in l.params.values()
                         if not any(p is q for q in _stage_views(rule)))
            self.held.add((trainer.model.parameters_flat().size,
                           trainer.model.gradients_flat().size,
                           rule.model.parameters_flat().size,
                           rule.model.gradients_flat().size, int(others)))

    record = Record()
    initial = model.parameters_flat().tolist()
    trainer = Trainer(model, opt, comm=comm, rule=rule, progress=False, verbose=False,
                      callbacks=[record])
    trainer.fit(dataset(job["model"], job["n"]), epochs=job["epochs"],
                batch_size=job["batch"], shuffle=False)
    result = {"initial": initial, "weights": model.parameters_flat().tolist(),
              "buffers": buffers(model).tolist(),
              "held": sorted(record.held), "total": model.parameters_flat().size,
              "losses": record.losses, "history": trainer.history.records,
              "starts": list(rule.starts), "stats": rule.stats(), "role": rule.role(comm.rank)}
    if job.get("resume"):
        result["resumed"] = resumed(job, comm, out)
    if comm.rank == 0:
        ref = reference(job, comm.size // job["stages"])
        result["ref"] = {k: np.asarray(v).tolist() for k, v in ref.items()}
    with open(f"{out}/{job['name']}.rank{comm.rank}.json", "w") as f:
        json.dump(result, f)


def refusal(job: dict, comm, out: str) -> None:
    """A pipeline that does not fit: the error each rank raises, before any step."""
    model = build(job["model"], job["seed"])
    opt = get_optimizer("sgd", model, lr=0.1)
    message = ""
    try:
        rule = Pipeline(stages=job["stages"], micro_batches=job["micro"],
                        balance=job.get("balance", "params"))
        trainer = Trainer(model, opt, comm=comm, rule=rule, progress=False, verbose=False)
        trainer.fit(dataset(job["model"], job["n"]), epochs=1, batch_size=job["batch"],
                    shuffle=False)
    except ValueError as exc:
        message = f"{type(exc).__name__}({getattr(exc, 'argument', '')}): {exc}"
    with open(f"{out}/{job['name']}.rank{comm.rank}.json", "w") as f:
        json.dump({"error": message}, f)


if __name__ == "__main__":
    world = dist.init()
    try:
        for job in json.loads(sys.argv[2]):
            (refusal if job.get("refuse") else run)(job, world, sys.argv[1])
    except BaseException:  # end every rank at once, not a neighbour waiting forever
        import traceback
        traceback.print_exc()
        world.abort(1)
