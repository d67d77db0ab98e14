"""``--engine distnn``: a ``torch.nn.Module`` whose layers distnn has, as a distnn model.

The module goes through ONNX: ``torch.onnx.export`` (the TorchScript exporter, which runs
offline and needs no onnxscript) traces it in training mode, so that its batch norms stay
layers of their own instead of being folded into the convolutions, and
``models/onnx_import.py`` builds the ``Sequential``. The module's weights, buffers and
layers are then distnn's: it trains on distnn's engine, under any rule. A layer distnn
lacks is refused in one line naming the module and the op.
"""
from __future__ import annotations

import io
import warnings

import numpy as np

from .onnx_import import ModelFileError, sequential_from_onnx

__all__ = ["sequential_from_torch"]


def sequential_from_torch(module, input_shape, *, dtype=np.float32,
                          label: str | None = None):
    """A built distnn ``Sequential`` computing ``module`` (a ``torch.nn.Module``) on samples
    of ``input_shape``, with its weights and batch-norm statistics."""
    import torch
    try:
        import onnx
    except ImportError:
        raise ModelFileError(f"--engine distnn: converting {label or 'a torch module'} goes "
                             "through ONNX and needs the onnx package: "
                             "pip install 'distnn[onnx]'") from None
    label = label or type(module).__name__
    was_training = module.training
    buffer = io.BytesIO()
    example = torch.zeros((2, *input_shape), dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.float(), (example,), buffer, dynamo=False,
                              opset_version=17, input_names=["input"],
                              output_names=["output"], training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False)
    except Exception as exc:
        raise ModelFileError(f"--engine distnn: torch.onnx.export of {label} failed: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    finally:
        module.load_state_dict(state)  # the trace ran a training step on the batch norms
        module.train(was_training)
    proto = onnx.load_from_string(buffer.getvalue())
    return sequential_from_onnx(proto, input_shape=input_shape, dtype=dtype,
                                label=f"{label} (--engine distnn)", name=label)
