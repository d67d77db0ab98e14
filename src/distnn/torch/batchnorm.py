"""Batch normalization with statistics over the global batch (all ranks).

The per-channel sums travel through an autograd function whose forward and backward are
both sums over ranks, so gradients flow through the global mean and variance exactly:
N ranks with SyncBatchNorm compute the forward, backward and running statistics of one
process on the whole global batch.
"""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .. import distributed as dist


class _SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        out = x.detach().clone().contiguous()
        comm.allreduce_(out.numpy(), "sum")
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.detach().clone().contiguous()
        ctx.comm.allreduce_(grad.numpy(), "sum")
        return grad, None


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm{1,2,3}d`` whose training statistics are those of the global
    batch. Every rank must run forward and backward of every training batch (a rank with
    an empty shard too: zero rows are allowed). Build with ``convert_sync_batchnorm``.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as torch's BatchNorm.
        comm: communicator (default ``distnn.distributed.get_comm()``).

    Shape:
        (N, C) or (N, C, *spatial).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, comm=None,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.comm = comm

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got shape "
                             f"{tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comm = self.comm if self.comm is not None else dist.get_comm()
        use_batch = self.training or not self.track_running_stats
        if not use_batch or comm.size == 1:
            return super().forward(x)
        self._check_input_dim(x)
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() // max(x.shape[1], 1)], dtype=x.dtype)
        totals = _SumOverRanks.apply(torch.cat([x.sum(dims), count]), comm)
        n = totals[-1]
        mean = totals[:-1] / n
        centred = x - mean.reshape(shape)
        var = _SumOverRanks.apply((centred * centred).sum(dims), comm) / n
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                unbiased = var * (n / (n - 1)) if float(n) > 1 else var
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * unbiased.detach())
        y = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y


def convert_sync_batchnorm(module: torch.nn.Module, comm=None) -> torch.nn.Module:
    """Replace every ``BatchNorm{1,2,3}d`` in ``module`` by a ``SyncBatchNorm`` that keeps
    its parameters and buffers (the same tensors); returns the (possibly new) module."""
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, comm=comm)
        if module.affine:
            out.weight = module.weight
            out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        new = convert_sync_batchnorm(child, comm)
        if new is not child:
            out.add_module(name, new)
    return out
