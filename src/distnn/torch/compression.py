"""Horovod's ``hvd.Compression`` for torch users: the one facade of
``distnn.distributed.compressors`` (its ``none`` and ``fp16`` objects compress NumPy arrays
and torch tensors alike; ``topk``, ``threshold`` and ``powersgd`` work inside
``DistributedOptimizer``), under the names Horovod's ``horovod.torch.compression`` has.

``DistributedOptimizer`` reads their ``wire_dtype`` and compresses whole buckets of its flat
buffer into preallocated float16 buffers (no per-tensor copies); the collectives
(``allreduce(..., compression=)``) call ``compress``/``decompress`` per tensor.
"""
from __future__ import annotations

from ..distributed.compressors import (Compression, FP16Compressor,  # noqa: F401
                                       NoneCompressor, PowerSGD, Threshold, TopK)

__all__ = ["Compression", "NoneCompressor", "FP16Compressor"]
