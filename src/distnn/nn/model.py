"""The model interface: what the trainer, the optimizers, the distributed layer and the
checkpoints ask of a model. ``Sequential`` (distnn's layers) and ``distnn.torch.TorchModel``
(a torch module) both implement ``Model``; ``ModelMethods`` holds the members they can
share (prediction in batches, arrays by name, weights files), written once over the rest.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import numpy as np

__all__ = ["Model", "ModelMethods"]


@runtime_checkable
class Model(Protocol):
    """A model trained by ``distnn.training.Trainer``.

    Attributes:
        name: its name (summary, checkpoints); dtype: float32 or float64;
        input_shape, output_shape: per sample (no batch axis);
        grad_hooks: called with a layer once its gradients are final during ``backward``.

    Its parameters and gradients live in one flat buffer each (``parameters_flat``,
    ``gradients_flat``); ``layer_ranges`` gives each layer's slice of them in the order
    backward finishes them in reverse.
    """

    name: str
    dtype: np.dtype
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    grad_hooks: list[Callable]

    def parameters_flat(self) -> np.ndarray: ...
    def gradients_flat(self) -> np.ndarray: ...
    def layer_ranges(self) -> list[tuple[Any, int, int]]: ...
    def sublayers(self) -> list: ...
    def walk(self) -> Iterator: ...
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray: ...
    def backward(self, dy: np.ndarray): ...
    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray: ...
    def named_arrays(self) -> dict[str, np.ndarray]: ...
    def summary(self) -> str: ...
    def save_weights(self, path) -> None: ...
    def load_weights(self, path) -> None: ...


# distnn.nn.inference (imported with distnn.nn) puts its ``runner`` here: predict asks it for
# a program of oneDNN primitives for the model, and runs the layers where it gives none
PREDICT_RUNNER: list = []


class ModelMethods:
    """The members of ``Model`` that follow from the others (mixed into the models)."""

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Outputs of ``x`` in inference mode, ``batch_size`` samples at a time."""
        program = PREDICT_RUNNER[0](self) if PREDICT_RUNNER else None
        forward = program or (lambda b: self.forward(b, training=False))
        outs = [forward(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]
        return np.concatenate(outs) if outs else np.empty((0,) + self.output_shape, self.dtype)

    def named_arrays(self) -> dict[str, np.ndarray]:
        """Parameters and buffers by ``"<layer>/<name>"`` key (what save/load uses)."""
        out = {}
        for layer in self.walk():
            for key, value in layer.params.items():
                out[f"{layer.name}/{key}"] = value
            for key, value in layer.buffers.items():
                out[f"{layer.name}/{key}"] = value
        return out

    def save_weights(self, path) -> None:
        from .serialization import save_weights
        save_weights(self, path)

    def load_weights(self, path) -> None:
        from .serialization import load_weights
        load_weights(self, path)
