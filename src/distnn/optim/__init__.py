"""Optimizers: classes that hold state (``optimizers``) over pure update functions
(``functional``)."""
from .functional import (adadelta_update_, adam_update_, adamw_update_, nadam_update_,
                         rmsprop_update_, sgd_update_)
from .optimizers import (OPTIMIZERS, SGD, Adadelta, Adam, AdamW, Nadam, Optimizer, RMSprop,
                         get_optimizer)

__all__ = [
    "Optimizer", "SGD", "RMSprop", "Adam", "AdamW", "Nadam", "Adadelta", "OPTIMIZERS",
    "get_optimizer", "sgd_update_", "rmsprop_update_", "adam_update_", "adamw_update_",
    "nadam_update_", "adadelta_update_",
]
