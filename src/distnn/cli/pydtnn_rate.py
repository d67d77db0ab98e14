"""PyDTNN's learning rate: its ``--learning_rate`` is a rate per sample (each step applies
it divided by the global batch size, PyDTNN's ``effective_learning_rate``), distnn's is the
rate of a step. Which one a command line means is said by its door, never guessed from its
other options: ``distnn train --like pydtnn`` reads it as PyDTNN does (``--lr_per_sample
true``, said in one note line); without ``--like`` it is distnn's, whatever else the line
spells (a line with PyDTNN's spellings gets a note pointing at the door). ``--lr_per_sample``
given either way decides, and ``--effective_learning_rate`` is the rate of a step. Used by
``cli.compat``.
"""
from __future__ import annotations

from typing import Any

# The doors of ``--like``: whose meanings a command line has.
DISTNN, PYDTNN = "distnn", "pydtnn"
DOORS = (DISTNN, PYDTNN)

# Flags only PyDTNN spells so. They mean the same with or without --like pydtnn; outside
# the door they only make the note that points at it.
PYDTNN_FLAGS = frozenset({
    "dataset_train_path", "augment_flip", "augment_flip_prob", "crop_images_size",
    "augment_crop_prob", "synthetic_input_shape", "synthetic_train_samples",
    "optimizer_momentum", "optimizer_nesterov", "optimizer_beta1", "optimizer_beta2",
    "optimizer_epsilon", "optimizer_rho", "schedulers", "tracer_output", "decay_rate",
    "use_blocking_mpi", "blocking_mpi", "enable_gpu", "enable_gpudirect", "enable_nccl",
    "tracing", "shared_storage", "tensor_format", "use_mpi_buffers",
    "effective_learning_rate"})


def pydtnn_spellings(values: dict[str, Any], spelled: frozenset[str],
                     models: set[str]) -> list[str]:
    """The PyDTNN-only spellings of a command line: its flags as typed (``spelled``) and
    its values (a metrics-and-loss ``--loss_func`` list, a ``*_cifar10`` model name)."""
    found = sorted(f for f in spelled
                   if f.lstrip("-").replace("-", "_") in PYDTNN_FLAGS)
    if "," in str(values.get("loss_func", "")):
        found.append(f"--loss_func={values['loss_func']}")
    if values.get("model") in models:
        found.append(f"--model={values['model']}")
    return found


def learning_rate(values: dict[str, Any], explicit: set[str], spelled: frozenset[str],
                  models: set[str], like: str = DISTNN) -> list[str]:
    """Set ``lr_per_sample`` (and ``learning_rate``) in ``values`` from PyDTNN's
    ``--effective_learning_rate`` or the door (``like``: ``pydtnn`` reads --learning_rate
    per sample); return the notes saying so. ``spelled`` (the flags as typed) and
    ``models`` (PyDTNN's model names) only decide whether a line outside the door is
    told of it."""
    effective = values.get("effective_learning_rate")
    if effective is not None:
        if values.get("lr_per_sample") and "lr_per_sample" in explicit:
            raise ValueError(f"--effective_learning_rate {effective} is the rate applied "
                             "each step; drop --lr_per_sample true (or give --learning_rate "
                             "per sample instead)")
        said = []
        if "learning_rate" in explicit and values["learning_rate"] != effective:
            said = [f"--learning_rate {values['learning_rate']}: not used, "
                    f"--effective_learning_rate {effective} is the rate each step applies"]
        values["learning_rate"], values["lr_per_sample"] = effective, False
        return said
    if "lr_per_sample" in explicit:
        return []
    lr = values["learning_rate"]
    if like == PYDTNN:
        values["lr_per_sample"] = True
        batch = (f"--global_batch_size {values['global_batch_size']}"
                 if values.get("global_batch_size") else f"{values['batch_size']} x ranks")
        return [f"--learning_rate {lr} is per sample, PyDTNN's meaning (--like pydtnn): "
                f"each step applies {lr} / global batch ({batch}), PyDTNN's "
                f"effective_learning_rate; --lr_per_sample false applies {lr} as given"]
    found = pydtnn_spellings(values, spelled, models)
    if not found or "learning_rate" not in explicit:
        return []
    return [f"--learning_rate {lr} is the rate each step applies, distnn's meaning, though "
            f"this command line uses PyDTNN's {', '.join(found[:3])}; for PyDTNN's rate per "
            f"sample run distnn train --like pydtnn (or give --lr_per_sample true)"]
