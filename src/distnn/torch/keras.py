"""KerasModel: a Keras 3 model (torch backend) trained as a torch module by distnn.

On Keras's torch backend a ``keras.Model`` is a ``torch.nn.Module`` and every Keras
``Variable`` holds a ``torch.nn.Parameter``; ``KerasModel`` is a ``TorchModel`` of an adapter
module that gives distnn's trainer what it expects from a torch module:

* *one unit per Keras layer*: the adapter registers each layer's variables (the very
  ``Parameter`` objects Keras computes with) under a submodule named after the layer,
  trainable ones as parameters and non-trainable float ones (BatchNormalization's moving
  statistics) as buffers, so the flat buffers, the Reducer's buckets in backward order,
  broadcasts of initial weights and checkpoints all reach what Keras uses (Keras's own
  ``torch_params`` dicts hold the same parameters in one dict sorted by name, and are not
  registered with the adapter);
* *the layout*: distnn's image batches are NCHW; a model whose input is channels-last
  (Keras's default) gets them transposed to NHWC, a model built for the data as read
  (``--data_layout nhwc``, or ``channels_first``) gets them as they are, and a model with a
  flat input gets them flattened;
* *the training flag and float type*: Keras layers (Dropout, BatchNormalization) read
  ``training`` from their call, not from ``module.train()``: the adapter passes it; a
  float64 model computes in float64 (``_float_type``: Keras alone computes its Dense
  layers' products in float32 on the torch backend);
* *probabilities*: a Sequential or functional model whose last layer is a softmax outputs
  probabilities; distnn's losses take logits, so the adapter returns ``log(max(p, eps))``
  (the log-probabilities Keras's ``categorical_crossentropy`` computes from probabilities,
  clipped at ``keras.config.epsilon()``); predictions are the same classes.

Weights files named ``*.weights.h5`` are Keras's (``model.save_weights`` /
``load_weights``), others distnn's.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import torch

from .model import TorchModel

KERAS_WEIGHTS = ".weights.h5"


def _keras():
    import keras
    return keras


def is_keras_model(obj) -> bool:
    import sys
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def _input_shape(model) -> tuple | None:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs or len(inputs) != 1:
        return None
    return tuple(inputs[0].shape[1:])


def choose_layout(model, input_shape: Sequence[int]) -> str:
    """How distnn's samples of ``input_shape`` (C, H, W for images) are given to ``model``:
    "same", "nhwc" (transposed from NCHW) or "flat"."""
    shape = tuple(int(s) for s in input_shape)
    expected = _input_shape(model)
    nhwc = shape[1:] + shape[:1] if len(shape) == 3 else None
    if expected is not None:
        fits = [s == e or e is None for s, e in zip(shape, expected)] \
            if len(expected) == len(shape) else [False]
        if all(fits):
            return "same"
        if nhwc is not None and len(expected) == 3 and all(
                s == e or e is None for s, e in zip(nhwc, expected)):
            return "nhwc"
        if len(expected) == 1 and expected[0] == int(np.prod(shape)):
            return "flat"
        return "same"  # the dry run then names both shapes
    if nhwc is not None and _keras().config.image_data_format() == "channels_last":
        return "nhwc"
    return "same"


def _softmax_output(model) -> bool:
    keras = _keras()
    from keras.src.models.functional import Functional
    if not isinstance(model, (keras.Sequential, Functional)) or not model.layers:
        return False
    last = model.layers[-1]
    if isinstance(last, keras.layers.Softmax):
        return True
    return getattr(last, "activation", None) is keras.activations.softmax


@contextlib.contextmanager
def _float_type(dtype: str):
    """Keras computing in ``dtype`` for one call of the model. Keras converts constants to
    its float type (``floatx``) in some ops, and its type promotion (which follows JAX's
    default) turns float64 results into float32 on every backend but TensorFlow
    (``keras.ops.matmul`` of two float64 tensors is float32, so Dense layers would compute
    in float32): for a float64 model both are set to float64 while it runs."""
    config = _keras().config
    from keras.src.backend.common import dtypes
    table = getattr(dtypes, "BIT64_TO_BIT32_DTYPE", None)
    floatx = config.floatx()
    narrowed = table.get("float64") if isinstance(table, dict) else None
    config.set_floatx(dtype)
    if dtype == "float64" and narrowed is not None:
        table["float64"] = "float64"
    try:
        yield
    finally:
        config.set_floatx(floatx)
        if dtype == "float64" and narrowed is not None:
            table["float64"] = narrowed


class KerasAdapter(torch.nn.Module):
    """The torch module ``KerasModel`` trains (see the module doc). Args: the Keras model
    (built or not; an unbuilt one is built by one inference call) and distnn's per-sample
    input shape."""

    def __init__(self, model, input_shape: Sequence[int], dtype=torch.float32):
        super().__init__()
        self.__dict__["keras_model"] = model  # not a registered child (see the module doc)
        self.layout = choose_layout(model, input_shape)
        if not model.built:
            with torch.no_grad():
                model(self._arrange(torch.zeros((1, *input_shape), dtype=dtype)),
                      training=False)
        self.probabilities = _softmax_output(model)
        self.eps = float(_keras().config.epsilon())
        holders: dict[str, torch.nn.Module] = {}
        seen: set[int] = set()
        for v in model.variables:
            value = v.value
            if id(value) in seen or not value.dtype.is_floating_point:
                continue  # shared, or a seed generator's state (per rank, not a weight)
            seen.add(id(value))
            layer, _, key = v.path.rpartition("/")
            name = layer.partition("/")[2].replace("/", "_") or layer or "model"
            holder = holders.get(name)
            if holder is None:
                holder = holders[name] = torch.nn.Module()
                self.add_module(name, holder)
            while hasattr(holder, key):
                key += "_"
            if v.trainable:
                holder.register_parameter(key, value)
            else:
                holder.register_buffer(key, value)

    def _arrange(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "nhwc":
            return x.permute(0, 2, 3, 1)
        if self.layout == "flat":
            return x.reshape(x.shape[0], -1)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _float_type(str(x.dtype).removeprefix("torch.")):
            y = self.keras_model(self._arrange(x), training=self.training)
        if self.probabilities:
            y = torch.log(torch.clamp(y, min=self.eps))
        return y


class KerasModel(TorchModel):
    """A Keras 3 model (torch backend) as a distnn model: a ``TorchModel`` of its
    ``KerasAdapter``.

    Args:
        model: the ``keras.Model``; its variables must be of ``dtype`` (build it under
            ``keras.config.set_floatx``; distnn's model-file loader does).
        input_shape: distnn's per-sample shape (C, H, W for images).
        dtype: float32 or float64.
        name: the model's name (default: Keras's).

    Example:
        model = KerasModel(keras.Sequential([keras.Input((28, 28, 1)),
                                             keras.layers.Flatten(), keras.layers.Dense(10)]),
                           (1, 28, 28))
    """

    def __init__(self, model, input_shape: Sequence[int], *, dtype=np.float32,
                 name: str | None = None):
        if not is_keras_model(model):
            raise TypeError(f"KerasModel wraps a keras.Model, got {type(model).__name__}")
        dtype = np.dtype(dtype)
        wrong = sorted({v.dtype for v in model.variables
                        if "float" in str(v.dtype) and v.dtype != dtype.name})
        if wrong:
            raise ValueError(f"the Keras model's variables are {', '.join(wrong)} but the run "
                             f"computes in {dtype.name}; build it with "
                             f"keras.config.set_floatx({dtype.name!r}) or give --dtype "
                             f"{wrong[0]}")
        torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
        self.keras_model = model
        super().__init__(KerasAdapter(model, input_shape, torch_dtype), input_shape,
                         dtype=dtype, name=name or model.name)

    def save_weights(self, path) -> None:
        """Keras's file for a ``*.weights.h5`` name (``keras.Model.load_weights`` reads it),
        else distnn's."""
        if str(path).endswith(KERAS_WEIGHTS):
            self.keras_model.save_weights(str(path))
        else:
            super().save_weights(path)

    def load_weights(self, path) -> None:
        """Keras's ``*.weights.h5`` (written by ``model.save_weights``) or distnn's file; the
        values land in the flat buffers (Keras assigns in place)."""
        if str(path).endswith(KERAS_WEIGHTS):
            try:
                self.keras_model.load_weights(str(path))
            except Exception as exc:
                raise ValueError(f"{path!r}: Keras cannot load these weights into model "
                                 f"{self.name!r}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        else:
            super().load_weights(path)

    def summary(self) -> str:
        return super().summary().replace("torch module KerasAdapter",
                                         f"Keras model {type(self.keras_model).__name__}", 1)
