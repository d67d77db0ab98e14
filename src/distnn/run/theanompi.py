"""Theano-MPI's model classes trained by distnn's rules, and Theano-MPI's Python form.

A Theano-MPI user writes a ModelClass against ``theano`` (served by PyTensor:
``distnn.models.theano_shim``) and starts it from a session file (``distnn train
--config session.cfg`` with RULE, MODELFILE, MODELCLASS) or from Python::

    from distnn.run.theanompi import BSP
    rule = BSP()
    rule.init(devices=["cuda0", "cuda1"], modelfile="models.cnn", modelclass="CNN")
    rule.wait()

``train_model_class`` is Theano-MPI's worker loop (``worker.py``'s ``BSP_run``): for each
epoch, ``train_iter(batch, recorder)`` for every batch (and sub-batch) with the rule's
exchange after each, then ``val_iter`` over the validation batches with the rule's
evaluation weights, the recorder's gathered validation line, and ``adjust_hyperp(epoch)``;
``cleanup()`` at the end. The rules are distnn's: BSP -> ``data``, EASGD -> ``easgd``
(rank 0 the server, as Theano-MPI's first device), GOSGD -> ``gossip``; they exchange
``model.params`` through ``ModelClassModel``.

Not honoured, named in ``NOT_HONOURED``: GPU devices (each rank runs on CPU), Theano-MPI's
exchange strategies (nccl/copper/asa: distnn all-reduces over MPI) and its BSP learning
rate warm-up (the model class's ``adjust_hyperp`` owns the learning rate here).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from .. import distributed as dist
from ..models.theano_model import DeltaStep, ModelClassModel, is_model_class
from ..rules import get_rule
from ..rules.base import Rule
from .errors import RunError
from .recorder import Recorder

RULES = {"BSP": "data", "EASGD": "easgd", "GOSGD": "gossip"}
NOT_HONOURED = ("Theano-MPI: devices run as CPU ranks (no GPU backend), exchange "
                "strategies (nccl/copper/asa) are MPI all-reduces, and BSP's learning-rate "
                "warm-up is left to the model's adjust_hyperp")


class _Run:
    """What a rule reads of its trainer, over a ``ModelClassModel``."""

    stall = None

    def __init__(self, model: ModelClassModel, rule, comm, seed: int, verbose: bool):
        self.model, self.rule, self.comm, self.seed = model, rule, comm, seed
        self.batch_samples = 1
        self.global_step = 0
        self._verbose = verbose
        self.optimizer = rule.bind(self, DeltaStep(model))

    def print(self, message: str, force: bool = False) -> None:
        if self._verbose or force:
            print(message, flush=True)


def load_model_class(modelfile: str, modelclass: str):
    """The class ``modelclass`` of ``modelfile`` (a dotted module, DIR/module or a .py
    path), imported with ``theano`` served by PyTensor."""
    from ..models.files import ModelFileError, load_module
    from ..models.theano_shim import theano_names
    with theano_names():  # nested in train_model_class's: the hook is installed twice
        module = load_module(f"{modelfile}:{modelclass}")
    cls = getattr(module, modelclass, None)
    if cls is None:
        raise ModelFileError(f"MODELCLASS={modelclass}: {modelfile} defines no {modelclass}")
    if not is_model_class(cls):
        raise ModelFileError(f"MODELCLASS={modelclass}: not a Theano-MPI model class (it "
                             "needs compile_iter_fns, train_iter and val_iter)")
    return cls


def model_class_spec(spec: str) -> tuple[str, str] | None:
    """(modelfile, modelclass) when ``--model`` names a Theano-MPI model class (a class
    with compile_iter_fns, train_iter and val_iter), else None (the file is imported to
    see; one that does not import is left to the ordinary model loader to report)."""
    from ..models.files import ModelFileError, is_model_spec, split_spec
    if not is_model_spec(spec) or spec.lower().endswith((".onnx", ".json")):
        return None
    try:
        target, name = split_spec(spec)
    except ModelFileError:
        return None
    if name is None or not name[:1].isupper():  # Theano-MPI's MODELCLASS is a class
        return None
    try:
        import pytensor  # noqa: F401
    except ImportError:
        return None
    try:
        load_model_class(target, name)
    except (ModelFileError, ImportError):
        return None
    return target, name


def _check_batches(instance, comm) -> None:
    data = getattr(instance, "data", None)
    for name in ("n_batch_train", "n_batch_val"):
        if not isinstance(getattr(data, name, None), (int, np.integer)):
            raise RunError(f"{type(instance).__name__}.data.{name} must be an int (the "
                             "DataClass's number of batches), got "
                             f"{getattr(data, name, None)!r}")


def train_model_class(modelfile: str, modelclass: str, rule: "str | Rule" = "BSP", *,
                      comm=None, epochs: int | None = None, rule_args: dict | None = None,
                      model_config: dict | None = None, seed: int = 0, print_freq: int = 40,
                      verbose: bool | None = None) -> dict[str, list]:
    """Train Theano-MPI's ``modelclass`` of ``modelfile`` under ``rule`` (BSP, EASGD or
    GOSGD, or a distnn rule object) on the ranks of ``comm``; every rank calls it.
    ``model_config`` is added to the ``config`` dict the class is built with
    (Theano-MPI's: verbose, rank, size...).
    Returns the recorder's ``info_dict`` (train_info, val_info [count, cost, error,
    top5], epoch_time, lr)."""
    from ..models.theano_shim import theano_names
    with theano_names():  # the model class may import theano in its methods too
        return _train(modelfile, modelclass, rule, comm=comm, epochs=epochs,
                      rule_args=rule_args, model_config=model_config, seed=seed,
                      print_freq=print_freq, verbose=verbose)


def _resolve_rule(rule, rule_args, comm) -> tuple[Rule, str]:
    """The distnn rule of ``rule`` (a Theano-MPI name or a distnn rule) and the name the
    messages give it (Theano-MPI's, BSP..., where the distnn rule is one of them); checks
    that ``comm`` has the ranks it needs."""
    if isinstance(rule, Rule):
        distnn_rule = rule
        key = {v: k for k, v in RULES.items()}.get(rule.name, rule.name)
    else:
        key = str(rule).upper()
        if key not in RULES:
            raise RunError(f"rule={rule!r}: Theano-MPI's rules are {', '.join(RULES)}")
        distnn_rule = get_rule(RULES[key], **(rule_args or {}))
    if comm.size < distnn_rule.min_ranks:
        raise RunError(f"{key}: rank 0 is the server and the others are workers, so it needs "
                       f"at least {distnn_rule.min_ranks} ranks, got {comm.size}; run it "
                       f"under mpiexec -n {distnn_rule.min_ranks + 1}")
    return distnn_rule, key


def _model_instance(modelfile, modelclass, share, shares, verbose, model_config, comm):
    """The model class built with Theano-MPI's ``config`` dict (plus ``model_config``) for
    the share ``share`` of ``shares`` (None: the server), its batches checked."""
    from ..models.files import ModelFileError
    try:
        cls = load_model_class(modelfile, modelclass)
    except ModelFileError as exc:
        raise RunError(str(exc)) from None
    config = {"verbose": verbose, "rank": share if share is not None else 0,
              "size": shares, "mname": modelclass, "sync_type": "avg",
              "worker_type": "server" if share is None else "worker",
              **(model_config or {})}
    instance = cls(config)
    _check_batches(instance, comm)
    return instance


def _train_epoch(instance, model, distnn_rule, run, recorder, scale, shares, n_subb) -> int:
    """A worker's training part of an epoch: every batch's sub-batches, each a move, a
    rule step and a push; returns the last batch number."""
    batch = 0
    for batch in range(1, int(instance.data.n_batch_train) + 1):
        for _ in range(n_subb):
            instance.train_iter(batch - 1, recorder)
            recorder.start()
            model.record_move(scale)
            distnn_rule.step(run)
            run.global_step += 1
            model.push()
            recorder.end("comm")
        recorder.print_train_info(batch * shares)
    return batch


def _train(modelfile, modelclass, rule, *, comm, epochs, rule_args, model_config, seed,
           print_freq, verbose) -> dict[str, list]:
    comm = comm if comm is not None else dist.get_comm()
    distnn_rule, key = _resolve_rule(rule, rule_args, comm)
    share, shares = distnn_rule.shard_of(comm)
    verbose = comm.rank == 0 if verbose is None else verbose
    instance = _model_instance(modelfile, modelclass, share, shares, verbose, model_config,
                               comm)
    try:
        model = ModelClassModel(instance)
    except ValueError as exc:
        raise RunError(f"MODELCLASS={modelclass}: {exc}") from None
    run = _Run(model, distnn_rule, comm, seed, verbose)
    recorder = Recorder(comm, print_freq, modelclass, verbose)
    n_epochs = int(epochs if epochs is not None else getattr(instance, "n_epochs", 1))
    n_subb = int(getattr(instance, "n_subb", 1))
    data = instance.data
    counts = comm.allgather_obj(int(data.n_batch_train) if share is not None else None)
    trained = {c for c in counts if c is not None}
    if len(trained) > 1 and distnn_rule.lockstep:
        raise RunError(f"{key}: the ranks' {modelclass}.data.n_batch_train differ "
                       f"({counts}); BSP steps together: shard the data evenly")
    instance.compile_iter_fns(sync_type="avg")
    # each rank's move counts 1/N under a rule that sums them (data), 1 under local rules
    scale = 1.0 / distnn_rule.loss_denominator(SimpleNamespace(global_size=shares, x=[0]))
    distnn_rule.begin(run)
    model.push()
    for epoch in range(n_epochs):
        instance.epoch = epoch
        recorder.start_epoch()
        batch = 0
        if share is None:
            distnn_rule.serve(run, epoch)
        else:
            batch = _train_epoch(instance, model, distnn_rule, run, recorder, scale, shares,
                                 n_subb)
        recorder.clear_train_info()
        if hasattr(instance, "reset_iter"):
            instance.reset_iter("train")
        distnn_rule.end_epoch(run, epoch)
        stop = False
        with distnn_rule.evaluation_weights(run):
            model.push()
            if share is not None:
                for _ in range(int(data.n_batch_val)):
                    for _ in range(n_subb):
                        stop = instance.val_iter(batch * shares, recorder) == "stop" or stop
            if hasattr(instance, "reset_iter"):
                instance.reset_iter("val")
            recorder.gather_val_info()
            recorder.print_val_info(batch * shares)
        model.push()
        instance.current_info = recorder.get_latest_val_info()
        lr = getattr(instance, "shared_lr", None)
        recorder.save(batch * shares, lr.get_value() if lr is not None else float("nan"))
        instance.adjust_hyperp(epoch)
        recorder.end_epoch(batch * shares, epoch)
        if any(comm.allgather_obj(stop)):
            break
    distnn_rule.end(run)
    model.push()
    if hasattr(instance, "cleanup"):
        instance.cleanup()
    return dict(recorder.info_dict)


def run_model_class(cfg, comm, modelfile: str, modelclass: str,
                    explicit: frozenset[str] = frozenset()) -> dict[str, list]:
    """``distnn train`` of a Theano-MPI model class (a session file's MODELFILE and
    MODELCLASS): the rule of ``--parallel`` with its options, ``--num_epochs`` when given
    (else the class's ``n_epochs``), ``--model_args`` added to the class's config."""
    from .rule import build_rule
    if comm.rank == 0:
        print(NOT_HONOURED, flush=True)
    return train_model_class(
        modelfile, modelclass, build_rule(cfg, comm), comm=comm,
        epochs=cfg.train.num_epochs if "num_epochs" in explicit else None,
        model_config=dict(cfg.model.model_args), seed=cfg.model.random_seed)


class _Rule:
    """Theano-MPI's ``rule = BSP(); rule.init(devices, modelfile, modelclass); rule.wait()``.

    Under ``mpiexec -n N`` every rank trains in ``wait()`` on the N ranks; started alone
    with several devices, ``init`` starts ``mpiexec -n len(devices)`` itself, as
    Theano-MPI starts ``mpirun``, and ``wait`` waits for it.
    """

    rule = ""

    def __init__(self, **rule_args: Any):
        self.rule_args = rule_args
        self._job: tuple | None = None
        self._process: subprocess.Popen | None = None
        self.info: dict[str, list] | None = None

    def init(self, devices: Sequence[str], modelfile: str, modelclass: str,
             epochs: int | None = None, model_config: dict | None = None) -> None:
        """Train ``modelclass`` of ``modelfile`` on ``len(devices)`` ranks (``epochs``:
        None for the class's ``n_epochs``; ``model_config``: added to its config)."""
        comm = dist.get_comm()
        if comm.rank == 0:
            print(NOT_HONOURED, flush=True)
        if comm.size == 1 and len(devices) > 1:
            launcher = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable),
                                                               "mpiexec")
            command = [launcher, "-n", str(len(devices)), sys.executable, "-m",
                       "distnn.run.theanompi", self.rule, modelfile, modelclass,
                       json.dumps({"epochs": epochs, "model_config": model_config,
                                   "rule_args": self.rule_args})]
            self._process = subprocess.Popen(command)
            return
        if comm.size != len(devices) and comm.rank == 0:
            print(f"devices={list(devices)}: {len(devices)} devices, training on the "
                  f"{comm.size} ranks mpiexec started", flush=True)
        self._job = (modelfile, modelclass, epochs, model_config)

    def wait(self) -> int:
        if self._process is not None:
            return self._process.wait()
        if self._job is None:
            raise RuntimeError(f"{type(self).__name__}.wait(): call init(devices, modelfile, "
                               "modelclass) first")
        modelfile, modelclass, epochs, model_config = self._job
        self.info = train_model_class(modelfile, modelclass, self.rule, epochs=epochs,
                                      rule_args=self.rule_args, model_config=model_config)
        return 0


class BSP(_Rule):
    """Bulk synchronous parallel: distnn's ``data`` rule (the ranks' moves averaged every
    step). Keyword arguments go to ``distnn.rules.data.DataParallel``."""
    rule = "BSP"


class EASGD(_Rule):
    """Elastic averaging, rank 0 the server (Theano-MPI's first device): distnn's
    ``easgd``. Keyword arguments go to ``distnn.rules.easgd.EASGD``."""
    rule = "EASGD"


class GOSGD(_Rule):
    """Gossip SGD: distnn's ``gossip``. Keyword arguments go to
    ``distnn.rules.gossip.Gossip``."""
    rule = "GOSGD"


if __name__ == "__main__":  # the ranks a _Rule.init started
    _rule, _file, _class, _options = sys.argv[1:]
    train_model_class(_file, _class, _rule, **json.loads(_options))
