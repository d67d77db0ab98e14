"""``distnn export --model NAME|FILE --format onnx|torch -o FILE``: a model (with its
weights) for another runtime: ONNX (opset 17, ``nn/onnx_export.py``) for onnxruntime and
every ONNX runtime, or TorchScript (``nn/torch_export.py``), which ``torch.jit.load`` reads
with torch alone. Inference only: batch norm on its running statistics, no dropout.
One process; a bad model, weights file or output is one line (exit status 2).
"""
from __future__ import annotations

import argparse

import numpy as np

from ..run import RunError

__all__ = ["add_export_parser", "run_export"]

FORMATS = {"onnx": ".onnx", "torch": ".pt"}


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers C,H,W, got {text!r}")
    return shape


def add_export_parser(sub) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to the ``distnn`` subparsers."""
    text = "write a model and its weights as ONNX or TorchScript (inference)"
    p = sub.add_parser("export", help=text, allow_abbrev=False,
                       description=text[0].upper() + text[1:] + "; see docs/interchange.md.")
    p.add_argument("--model", default="simplecnn", metavar="NAME|FILE",
                   help="Zoo model, or a model file (FILE.py[:NAME], FILE.onnx; a torch "
                   "module's layers are converted to distnn's first). Default: simplecnn.")
    p.add_argument("--format", choices=sorted(FORMATS), default="onnx",
                   help="onnx (opset 17) or torch (TorchScript). Default: onnx.")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="File to write. Default: MODEL.onnx or MODEL.pt.")
    p.add_argument("--weights_and_bias_filename", "--weights", default=None, metavar="FILE",
                   help="Weights (.npz, as distnn train --save_weights writes) to load first; "
                   "default: the model's initial weights.")
    p.add_argument("--input_shape", "--input-shape", type=_shape, default=None,
                   metavar="C,H,W", help="Per-sample input shape. Default: the zoo model's "
                   "usual input; required for a model file.")
    p.add_argument("--num_classes", "--num-classes", type=int, default=None, metavar="N",
                   help="Outputs of the last layer. Default: the zoo model's (10 for a file).")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of the torch module (ONNX is always float32). Default: float32.")
    return p


def _build(args):
    from ..models import get_model
    from ..models.files import is_model_spec
    dtype = np.dtype(args.dtype)
    if is_model_spec(args.model):
        from ..run.build import model_from_spec
        if args.input_shape is None:
            raise RunError(f"--input_shape: exporting the model file {args.model!r} needs the "
                           "per-sample input shape, e.g. --input_shape 3,32,32")
        return model_from_spec(args.model, input_shape=args.input_shape,
                               num_classes=args.num_classes or 10, dtype=dtype, engine="distnn")
    return get_model(args.model, input_shape=args.input_shape, num_classes=args.num_classes,
                     dtype=dtype)


def run_export(args: argparse.Namespace) -> int:
    """``distnn export``; prints where it wrote what."""
    import os
    try:
        model = _build(args)
    except (ValueError, OSError) as exc:
        raise RunError(f"--model {args.model}: {exc}" if not str(exc).startswith("--")
                       else str(exc)) from None
    if args.weights_and_bias_filename:
        try:
            model.load_weights(args.weights_and_bias_filename)
        except (ValueError, OSError, KeyError) as exc:
            raise RunError(f"--weights_and_bias_filename: {exc}") from None
    label = os.path.splitext(os.path.basename(args.model.split(":")[0]))[0]
    path = args.output or f"{label}{FORMATS[args.format]}"
    try:
        if args.format == "onnx":
            model.to_onnx(path)
        else:
            from ..nn.torch_export import save_torch
            save_torch(model, path)
    except ImportError as exc:
        raise RunError(f"--format {args.format}: {exc}") from None
    except ValueError as exc:  # a layer with no such form
        raise RunError(f"--format {args.format}: {exc}") from None
    except OSError as exc:
        from ..fileio import describe_os_error
        raise RunError(f"--output {path}: {describe_os_error(exc)}") from None
    shape = "x".join(map(str, model.input_shape))
    print(f"Exported {args.model} ({model.parameters_flat().size:,} parameters, input "
          f"{shape}) as {args.format} to {path}")
    return 0
