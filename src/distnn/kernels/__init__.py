"""Kernels behind the layers: convolution, pooling, batch-norm math.

Each op family is one module (``im2col``, ``conv``, ``pooling``, ``batchnorm``) of
functions over arrays; they import nothing from the rest of distnn. The NumPy code in them is the
reference; with the "numba" backend (the default when numba is installed; see ``backend``)
their memory-bound loops run compiled and multi-threaded from ``_numba`` while the GEMMs
stay in NumPy's BLAS. ``DISTNN_KERNELS=numpy|numba`` or ``set_backend()`` choose.
"""
from .attention import attention_backward, attention_forward
from .backend import backend, get_num_threads, matmul, pieces, set_backend, set_num_threads
from .batchnorm import (bn_backward_dx, bn_backward_dx_inference, bn_batch_stats,
                        bn_forward_train, bn_grad_sums, bn_inference, bn_normalize,
                        bn_stats_from_sums, bn_sums, bn_xhat, channel_count, channel_dot,
                        channel_sum)
from .node import loop_threads, node_cores
from .conv import (ConvCache, ConvGeometry, conv2d_backward, conv2d_forward, conv_geometry,
                   conv_output_size, same_padding)
from .im2col import col2im, im2col
from .pooling import (PoolCache, avgpool2d_backward, avgpool2d_forward,
                      global_avgpool2d_backward, global_avgpool2d_forward, maxpool2d_backward,
                      maxpool2d_forward, pool_output_shape)

__all__ = [
    "backend", "set_backend", "set_num_threads", "get_num_threads", "node_cores", "loop_threads",
    "threads_per_rank",
    "im2col", "col2im", "conv2d_forward", "conv2d_backward", "conv_output_size",
    "same_padding", "conv_geometry", "ConvGeometry", "ConvCache",
    "maxpool2d_forward", "maxpool2d_backward", "avgpool2d_forward", "avgpool2d_backward",
    "global_avgpool2d_forward", "global_avgpool2d_backward", "pool_output_shape", "PoolCache",
    "bn_forward_train", "bn_batch_stats", "bn_sums", "bn_stats_from_sums", "bn_normalize",
    "bn_xhat", "bn_inference", "bn_grad_sums", "bn_backward_dx", "bn_backward_dx_inference",
    "channel_sum", "channel_dot", "channel_count", "matmul", "pieces",
    "attention_forward", "attention_backward",
]
