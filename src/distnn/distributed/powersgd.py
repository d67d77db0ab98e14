"""PowerSGD's low-rank step (Vogels et al. 2019; PyTorch's ``powerSGD_hook``), on the
matrices of one gradient exchange.

Each compressed tensor is viewed as a matrix M (its first axis by the rest, transposed
when that makes the rows the smaller side) of n <= m; with Q (m x r) kept from the last
step (warm start; the first Q is drawn from a generator seeded alike on every rank):

    P = M Q;  all-reduce P;  P^ = orthonormal basis of P (QR);
    Q_i = M^T P^;  all-reduce Q;  result = P^ Q^T  (= P^ P^T sum_i M_i)

Rank i's own part of the result is P^ Q_i^T (the sum over ranks of those parts is the
result): that is what it *sent*, and its residual for error feedback is M - P^ Q_i^T.
(PyTorch's hook subtracts the averaged approximation instead; this keeps the sum of the
residuals equal to the total compression error.) With r = n the basis P^ is complete and
the result is the exact sum, whatever Q is.
"""
from __future__ import annotations

import numpy as np


def matrix_view(flat_slice: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The (n x m) matrix view of a tensor's flat slice, n <= m."""
    a = int(shape[0])
    b = flat_slice.size // max(a, 1)
    m = flat_slice.reshape(a, b)
    return m.T if a > b else m


def matrix_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    a = int(shape[0])
    b = int(np.prod(shape[1:], dtype=np.int64))
    return (min(a, b), max(a, b))


def worth_compressing(shape: tuple[int, ...], rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: a tensor of 2 or more axes is compressed when its factors are at
    least ``min_compression_rate`` times smaller than it."""
    if len(shape) < 2:
        return False
    n, m = matrix_dims(shape)
    r = min(rank, n)
    return r >= 1 and (n + m) * r * min_compression_rate < n * m


def orthonormal_basis(p: np.ndarray) -> np.ndarray:
    """An orthonormal basis of p's columns (n x r, r <= n): Householder QR, which stays
    orthonormal when p is rank-deficient or zero (Gram-Schmidt would not)."""
    q, _ = np.linalg.qr(p)
    return q


class LowRankStep:
    """The two phases of one PowerSGD exchange over a list of matrices.

    Args:
        dims: (n, m) of each matrix; rank: r (clipped to n per matrix).
        qs: the Q matrices kept between steps (m x r each), updated in place.
        dtype: the gradients' dtype.
    """

    def __init__(self, dims: list[tuple[int, int]], rank: int, qs: list[np.ndarray], dtype):
        self.dims = dims
        self.ranks = [min(rank, n) for n, _ in dims]
        self.qs = qs
        self.p_sizes = [n * r for (n, _), r in zip(dims, self.ranks)]
        self.q_sizes = [m * r for (_, m), r in zip(dims, self.ranks)]
        self.p_buf = np.zeros(sum(self.p_sizes), dtype)
        self.q_buf = np.zeros(sum(self.q_sizes), dtype)

    def _slices(self, buf, sizes, rows):
        out, lo = [], 0
        for size, n, r in zip(sizes, rows, self.ranks):
            out.append(buf[lo:lo + size].reshape(n, r))
            lo += size
        return out

    def ps(self, buf: np.ndarray | None = None) -> list[np.ndarray]:
        return self._slices(self.p_buf if buf is None else buf, self.p_sizes,
                            [n for n, _ in self.dims])

    def q_parts(self, buf: np.ndarray | None = None) -> list[np.ndarray]:
        return self._slices(self.q_buf if buf is None else buf, self.q_sizes,
                            [m for _, m in self.dims])

    def project(self, matrices: list[np.ndarray], p_out: list[np.ndarray]) -> None:
        """Phase 1, local: P = M Q into ``p_out`` (then all-reduced by the caller)."""
        for mat, q, p in zip(matrices, self.qs, p_out):
            np.matmul(mat, q, out=p)

    def back_project(self, matrices: list[np.ndarray], p_summed: list[np.ndarray],
                     sent: list[np.ndarray]) -> list[np.ndarray]:
        """Phase 2, local: P^ of the summed P, Q_i = M^T P^ into the Q buffer, and this
        rank's part P^ Q_i^T into ``sent``; returns the bases P^."""
        bases = []
        for mat, p, q_i, out in zip(matrices, p_summed, self.q_parts(), sent):
            basis = orthonormal_basis(p)
            np.matmul(mat.T, basis, out=q_i)
            np.matmul(basis, q_i.T, out=out)
            bases.append(basis)
        return bases

    def reconstruct(self, bases: list[np.ndarray], results: list[np.ndarray]) -> None:
        """After the Q all-reduce: result = P^ Q^T, and Q kept for the next step."""
        for basis, q_sum, q_keep, out in zip(bases, self.q_parts(), self.qs, results):
            np.matmul(basis, q_sum.T, out=out)
            q_keep[...] = q_sum
