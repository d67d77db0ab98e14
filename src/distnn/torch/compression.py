"""Gradient compression objects (Horovod's ``hvd.Compression``): ``compress(tensor)``
returns (tensor to send, context) and ``decompress(tensor, context)`` undoes it.

``DistributedOptimizer`` reads their ``wire_dtype`` and compresses whole buckets of its flat
buffer into preallocated float16 buffers (no per-tensor copies); the collectives
(``allreduce(..., compression=)``) call ``compress``/``decompress`` per tensor.
"""
from __future__ import annotations

import numpy as np
import torch

from ..distributed.compression import PowerSGD, Threshold, TopK


class NoneCompressor:
    """No compression: tensors travel in their own dtype."""

    wire_dtype = None

    @staticmethod
    def compress(tensor: torch.Tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor


class FP16Compressor:
    """Floating tensors travel as float16 (half the bytes of float32) and come back in
    their dtype; integer tensors are left alone. Values beyond float16's range (65504)
    become inf."""

    wire_dtype = np.float16

    @staticmethod
    def compress(tensor: torch.Tensor):
        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod; ``Compression.topk(r)``,
    ``.threshold(v)`` and ``.powersgd(r)`` send less (``DistributedOptimizer`` only, with
    error feedback: ``distnn.distributed.compression``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    topk = TopK
    threshold = Threshold
    powersgd = PowerSGD
