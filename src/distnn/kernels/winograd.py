"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for 3x3, stride-1, undilated kernels.

F(m x m, 3x3): each (m+2)x(m+2) input tile d (stride m, overlapping by 2) of every
channel becomes V = B^T d B, each filter g becomes U = G g G^T, and an m x m output tile
is Y = A^T (sum_c U ⊙ V) A. The sum over channels at each of the P = (m+2)^2 transformed
positions is one GEMM, so a block of tiles costs one batched ``np.matmul`` (P, F, C) @
(P, C, T) in BLAS: F(2x2) does 16 multiplies per 4 outputs instead of 36 (2.25x fewer),
F(4x4) 36 per 16 (4x fewer), and its V and M hold 2.25 values per output instead of 4.
Tiles are processed in blocks of samples sized so that V and M = U V stay in cache between
the transform and the GEMM. ``planner.winograd_tile`` picks the tile per layer shape from
measurements: F(4x4) from 32x32 channel pairs (C*F >= 1024) or 16x16 outputs, F(2x2) for
small planes with few channels (a tie there, and F(2x2) rounds less). F(4x4)'s
transforms run vectorized over tiles on big planes (``_winograd4w``), tile by tile on
small ones.

Backward is the exact adjoint of that computed map (not a second, flipped convolution):
dM = A dY A^T per tile, dV = U^T dM and dx = scatter-add of B dV B^T (backward-data),
dU = dM V^T and dw = G^T dU G (backward-weights), each again one batched GEMM. So the
layer's gradients are the true gradients of the function it computes, and gradient checks
hold to rounding.

The tile loops are compiled (``_winograd`` for F(2x2), ``_winograd4`` and ``_winograd4w``
for F(4x4), the same four kernels with the same signatures); the GEMMs run in BLAS, or, in
float32 F(4x4) layers of up to 64x64 filter pairs on AVX2/AVX-512 CPUs, the whole loop over
a thread's blocks runs compiled with the GEMMs on register tiles (``_winograd4``;
F(2x2) has no drivers: the planner gives it only to layers they do not take, the 2x2 and
3x3 planes of 512x512 filters and, off the zoo, small planes with few channels).
With more than one thread, small GEMMs (m*n*k <= 2^18, one BLAS thread anyway) let each
thread take whole blocks of samples (no copies; dw summed in a fixed order), bigger ones
split every kernel.

Matrices and rounding (which points, and the forward-error bound per tile size that
tests/kernels/test_winograd.py checks per layer shape): docs/kernels.md, "Winograd's
matrices and rounding".
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._numba_runtime import get_num_threads, scratch
from . import _vgemm, _winograd, _winograd4
from . import planner
from ._threads import blas_for, kernel, pieces, run, run_jobs, sum_shares

# G (4x3): U = G g G^T
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
BT = np.array([[1.0, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
AT = np.array([[1.0, 1, 1, 0], [0, 1, -1, -1]])


# F(4x4, 3x3), Lavin & Gray, points 0, 1, -1, 2, -2, infinity: V = BT4 d BT4^T on 6x6
# tiles (stride 4), U = G4 g G4^T, Y = AT4 M AT4^T (4x4 outputs)
BT4 = np.array([[4.0, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]])
G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
AT4 = np.array([[1.0, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                [0, 1, -1, 8, -8, 1]])


class Tiling(NamedTuple):
    """One Winograd F(m x m, 3x3): output tile m, the weight transform KG (P, 9) of a
    flattened 3x3 kernel (KG[(a, b), (i, j)] = G[a, i] * G[b, j], P = (m + 2)^2 transformed
    positions) and its four compiled tile transforms."""
    m: int
    kg: np.ndarray
    kernels: object

    @property
    def p(self) -> int:
        return (self.m + 2) ** 2


F2 = Tiling(2, np.kron(G, G), _winograd)
F4 = Tiling(4, np.kron(G4, G4), _winograd4)
TILINGS = {2: F2, 4: F4}
KG = F2.kg


def tiles(oh: int, ow: int, m: int = 2) -> tuple[int, int]:
    """Tile rows and columns of m x m output tiles covering an (oh, ow) output."""
    return -(-oh // m), -(-ow // m)


def weights_transform(w: np.ndarray, tiling: Tiling = F2, workers: int = 1) -> np.ndarray:
    """U (P, F, C) = G w G^T for w (F, C, 3, 3), row (a, b) of the transform: one GEMM
    (an einsum measured 100 ms for 512x512 filters), its columns split among ``workers``
    threads from the planner's split_weights filter pairs. U is the calling thread's
    scratch (16 MB for 512x512 filters at F(2x2): a new array per call is kept by the
    allocator)."""
    f, c = w.shape[:2]
    p = tiling.p
    u = scratch("wino_u", (p, f, c), w.dtype)
    kg, w2, u2 = tiling.kg.astype(w.dtype), w.reshape(f * c, 9), u.reshape(p, f * c)
    if workers <= 1 or f * c < planner.LIMITS.split_weights:
        np.matmul(kg, w2.T, out=u2)
        return u
    step = -(-f * c // workers)

    def body(indices, serial):
        for i in indices:
            a, b = i * step, min(f * c, (i + 1) * step)
            np.matmul(kg, w2[a:b].T, out=u2[:, a:b])

    run(workers, workers, body)
    return u




def weights_transform_adjoint(du: np.ndarray, out: np.ndarray, tiling: Tiling = F2,
                              split: bool = False) -> np.ndarray:
    """dw (F, C, 3, 3) = G^T dU G for dU (P, F, C), written into ``out``. ``split`` (a
    caller outside ``run``'s bodies): with 2+ threads and split_weights filter pairs, the
    pairs split among the threads (``pieces``), each on one BLAS thread: a threaded GEMM
    with 9 columns was slower at 2 threads than at 1 (512x512 filters: 9.3 ms against 8.2;
    split 8.1; 256x256 1.7 against 1.1 split)."""
    p, f, c = du.shape
    kg = tiling.kg.astype(du.dtype)
    if (split and out.flags.c_contiguous and f * c >= planner.LIMITS.split_weights
            and get_num_threads() > 1):
        du2, dw2 = du.reshape(p, f * c), out.reshape(f * c, 9)
        pieces(f * c, lambda a, b: np.matmul(du2[:, a:b].T, kg, out=dw2[a:b]), 2)
    elif out.flags.c_contiguous:
        np.matmul(du.reshape(p, f * c).T, kg, out=out.reshape(f * c, 9))
    else:
        out[...] = np.matmul(du.reshape(p, f * c).T, kg).reshape(out.shape)
    return out



# Elements added to the row stride of the (16, rows * tiles) work arrays: with a stride of
# a power of two the 16 rows that every tile reads or writes land in the same cache sets
# (measured 16->16 32x32: the input transform 22 ms without, ms with).
PAD = 16


# Backward transforms the input again instead of keeping V from forward: V is 4x the
# input (16 values per 2x2 tile) and every layer's V was alive at the end of forward
# (resnet20 batch 64: peak RSS 558 -> 350 MiB without it), for 0-4% more time per layer
# (measured, thread CPU time, fwd+bwd batch 64: 16->16 32x32 16.1 ms kept vs 16.8 ms
# recomputed, 32->32 16x16 11.1 vs 10.8, 256->256 8x8 80.4 vs 82.0).


def _work(name: str, rows: int, t: int, dtype, p: int = 16):
    """A (P, rows * t + PAD) work array and its (P, rows, t) view for the GEMMs."""
    a2 = scratch(name, (p, rows * t + PAD), dtype)
    return a2, a2[:, :rows * t].reshape(p, rows, t)


def _product(a, b, out, serial: bool) -> None:
    """out[p] = a[p] @ b[p]; with 2+ threads splitting every kernel (not ``serial``), the
    positions p split among them (``pieces``), each GEMM on one BLAS thread, rather than
    each position's GEMM threaded by BLAS (a barrier a position). At 2 threads, ms (P, F,
    C, tiles): 36x512x512x64 10.9 against 12.3, 36x256x256x128 5.0 against 5.9; vgg11bn's
    step 1.03-1.10x faster with the weights' adjoint split too (24-50 rounds alternated)."""
    if serial or get_num_threads() == 1:
        _vgemm.product(a, b, out)
    else:
        pieces(a.shape[0], lambda i, j: _vgemm.product(a[i:j], b[i:j], out[i:j]), 2)


def _product_nt(a, b, out, add: bool, part, serial: bool) -> None:
    """out[p] (+)= a[p] @ b[p]^T, split as ``_product``."""
    if serial or get_num_threads() == 1:
        _vgemm.product_nt(a, b, out, add, part)
    else:
        pieces(a.shape[0], lambda i, j: _vgemm.product_nt(
            a[i:j], b[i:j], out[i:j], add, None if part is None else part[i:j]), 2)


def _plan(n: int, c: int, f: int, th: int, tw: int, itemsize: int, p: int = 16,
          dtype=None):
    """(k, blocks, workers) of this layer at the threads set (``planner.winograd_blocks``);
    ``dtype`` for a forward pass (its blocks by ``planner.forward_cols`` where the drivers
    take it: F(4x4))."""
    threads = get_num_threads()
    cols = 0 if dtype is None or p != 36 else planner.forward_cols(dtype, c, f, threads)
    return planner.winograd_blocks(n, c, f, th, tw, itemsize, p, threads, cols=cols)


def _compiled(dtype, c: int, f: int, workers: int, tiling: Tiling = F4) -> bool:
    """Whether the blocks run in ``_winograd4``' compiled drivers: F(4x4) where
    ``planner.winograd_drivers`` says."""
    return tiling.m == 4 and planner.winograd_drivers(dtype, c, f, workers,
                                                      get_num_threads())


def _team_work(team, i: int, name: str, rows: int, t: int, dtype, p: int) -> np.ndarray:
    """``_work``'s (P, rows * t + PAD) array for helper i of a team's compiled job."""
    return team.scratch(i, name, (p, rows * t + PAD), dtype)


def _run_shares(workers: int, share, job) -> None:
    """The drivers' shares, one a thread: share((workers - 1,), True) here and, on the
    helpers, job(board row, i, team) as compiled jobs (``_threads.run_jobs``: no GIL taken
    on their side), or share((i,), True) through ``run`` when the team is in use."""
    if workers > 1 and run_jobs(workers, job, lambda: share((workers - 1,), True)):
        return
    run(workers, workers, share)


def _taking(blocks, workers: int, free: bool):
    """(blocks as an (n, 2) int64 array, the shared counter, step) for the drivers: step 0
    (each thread takes the counter's next block) when ``free`` and the planner's ``dynamic``,
    else every ``workers``-th block from the thread's first (``run``'s round-robin)."""
    step = 0 if free and workers > 1 and planner.LIMITS.dynamic else workers
    return np.asarray(blocks, np.int64).reshape(-1, 2), np.zeros(1, np.int64), step


def _backward_compiled(dy, x, u, blocks, k, workers, pt, pl, th, tw, tiling, dw_out, db_out,
                       dx):
    """``backward`` on the drivers: dU and db per block (when they fit in SLOT_BYTES, with
    2+ threads: taken freely, summed in block order) or per thread, summed in order."""
    p, f, c = u.shape
    per_block = workers > 1 and len(blocks) * p * f * c * x.itemsize <= SLOT_BYTES
    slots = len(blocks) if per_block else min(workers, len(blocks))
    du = scratch("wino_du_blocks", (slots, p, f, c), x.dtype)
    db = np.empty((slots, f), np.float64)
    bl, counter, step = _taking(blocks, workers, per_block)
    dbp_size = f * k

    t = k * th * tw
    dxa = x[:0] if dx is None else dx

    def share(indices, serial):
        i = indices[0]
        _winograd4.backward_blocks(dy, x, u, bl, counter, i, step, pt, pl, th, tw,
                                _work("wino_v", c, t, x.dtype, p)[0],
                                _work("wino_m", f, t, x.dtype, p)[0],
                                np.empty(dbp_size, np.float64), du, db, -1 if per_block else i,
                                dx is not None, dxa)

    def job(row, i, team):
        _winograd4.encode_backward(row, dy, x, u, bl, counter, i, step, pt, pl, th, tw,
                              _team_work(team, i, "wino_v", c, t, x.dtype, p),
                              _team_work(team, i, "wino_m", f, t, x.dtype, p),
                              team.scratch(i, "wino_dbp", (dbp_size,), np.float64), du, db,
                              -1 if per_block else i, dx is not None, dxa)

    _run_shares(workers, share, job)
    total = du[0]
    for i in range(1, slots):  # fixed order: the same sums whichever thread took a block
        total += du[i]
    weights_transform_adjoint(total, dw_out, tiling, split=True)
    if db_out is not None:
        db_out[...] = db.sum(axis=0)
    return dx, dw_out, db_out


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pt: int, pb: int, pl: int,
            pr: int, relu: bool = False, tile: int = 2) -> np.ndarray:
    """y (N, F, OH, OW) = conv2d(x, w) + b (then ReLU when ``relu``) for w (F, C, 3, 3),
    stride 1, zero padding (top, bottom, left, right), by F(tile x tile, 3x3) (2 or 4). The
    work arrays are per-thread scratch shared by all layers (one block of V and one of M)."""
    n, c, h, wd = x.shape
    f = w.shape[0]
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    tiling = TILINGS[tile]
    p, ks = tiling.p, tiling.kernels
    th, tw = tiles(oh, ow, tiling.m)
    x = np.ascontiguousarray(x)
    k, blocks, workers = _plan(n, c, f, th, tw, x.itemsize, p, x.dtype)
    with blas_for(workers):
        u = weights_transform(w, tiling, get_num_threads())
    y = np.empty((n, f, oh, ow), x.dtype)
    bias = np.zeros(1, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
    if _compiled(x.dtype, c, f, workers, tiling):
        bl, counter, step = _taking(blocks, workers, True)
        t = k * th * tw

        def share(indices, serial):
            _winograd4.forward_blocks(x, u, bias, b is not None, relu, bl, counter, indices[0],
                                   step, pt, pl, th, tw, _work("wino_v", c, t, x.dtype, p)[0],
                                   _work("wino_m", f, t, x.dtype, p)[0], y)

        def job(row, i, team):
            _winograd4.encode_forward(row, x, u, bias, b is not None, relu, bl, counter, i, step,
                                 pt, pl, th, tw, _team_work(team, i, "wino_v", c, t, x.dtype, p),
                                 _team_work(team, i, "wino_m", f, t, x.dtype, p), y)

        _run_shares(workers, share, job)
        return y

    def body(indices, serial):
        for i in indices:
            n0, n1 = blocks[i]
            t = (n1 - n0) * th * tw
            v2, v = _work("wino_v", c, t, x.dtype, p)
            m2, m = _work("wino_m", f, t, x.dtype, p)
            kernel(ks.input_transform, serial)(x, n0, n1, pt, pl, th, tw, v2)
            _product(u, v, m, serial)
            kernel(ks.output_transform, serial)(m2, bias, b is not None, relu, n0, n1 - n0, th,
                                             tw, y)

    run(len(blocks), workers, body, dynamic=True)  # each block writes its own samples
    return y


def backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, pt: int, pl: int,
             dw_out: np.ndarray, db_out: np.ndarray | None, need_dx: bool, tile: int = 2
             ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """(dx or None, dw, db or None) of ``forward`` (without ReLU) for dy (N, F, OH, OW):
    the exact adjoint of the Winograd map. dw and db are overwritten into the outputs."""
    n, c, h, wd = x.shape
    f, oh, ow = dy.shape[1:]
    tiling = TILINGS[tile]
    p, ks = tiling.p, tiling.kernels
    th, tw = tiles(oh, ow, tiling.m)
    dy = np.ascontiguousarray(dy)
    k, blocks, workers = _plan(n, c, f, th, tw, x.itemsize, p)
    with blas_for(workers):
        u = weights_transform(w, tiling, get_num_threads())
    ut = u.transpose(0, 2, 1)
    dx = np.empty((n, c, h, wd), x.dtype) if need_dx else None
    if _compiled(x.dtype, c, f, workers, tiling) and blocks:
        return _backward_compiled(dy, x, u, blocks, k, workers, pt, pl, th, tw, tiling,
                                  dw_out, db_out, dx)

    def block(i, serial, du, add, part, dbpbuf):
        """Block i's transforms and products: its dU into du (added when ``add``; ``part``:
        the products' scratch for that sum), its dx written; its db (float64) returned."""
        n0, n1 = blocks[i]
        t = (n1 - n0) * th * tw
        v2, v = _work("wino_v", c, t, x.dtype, p)
        m2, dm = _work("wino_m", f, t, x.dtype, p)
        dbp = dbpbuf[:f * (n1 - n0)]
        kernel(ks.output_transform_adjoint, serial)(dy, n0, n1, th, tw, m2, dbp)
        kernel(ks.input_transform, serial)(x, n0, n1, pt, pl, th, tw, v2)
        _product_nt(dm, v, du, add, part, serial)
        if need_dx:
            _product(ut, dm, v, serial)
            kernel(ks.input_transform_adjoint, serial)(v2, n0, n1, pt, pl, th, tw, dx)
        return dbp.reshape(f, n1 - n0).sum(axis=1)

    if (workers > 1 and len(blocks) > workers
            and len(blocks) * p * f * c * x.itemsize <= SLOT_BYTES):
        # blocks taken as threads come free; dU and db kept per block, summed in block
        # order: the same sums whoever took which block
        du_blocks = scratch("wino_du_blocks", (len(blocks), p, f, c), x.dtype)
        db_blocks = np.empty((len(blocks), f), np.float64)

        def body_by_block(indices, serial):
            dbpbuf = np.empty(f * k, np.float64)
            for i in indices:
                db_blocks[i] = block(i, serial, du_blocks[i], False, None, dbpbuf)

        run(len(blocks), workers, body_by_block, dynamic=True)
        du = du_blocks[0]
        for i in range(1, len(blocks)):
            du += du_blocks[i]
        weights_transform_adjoint(du, dw_out, tiling, split=True)
        if db_out is not None:
            db_out[...] = db_blocks.sum(axis=0)
        return dx, dw_out, db_out

    def body(indices, serial):
        # dU and its per-block part: this thread's scratch (16 MB each for 512x512 filters;
        # new arrays per call were kept by each thread's malloc arena: +40 MiB peak RSS on
        # vgg11bn at 2 threads)
        du = scratch("wino_du", (p, f, c), x.dtype)
        part = scratch("wino_part", (p, f, c), x.dtype) if len(indices) > 1 else None
        db64 = np.zeros(f, np.float64)
        dbpbuf = np.empty(f * k, np.float64)
        for j, i in enumerate(indices):
            db64 += block(i, serial, du, j > 0, part, dbpbuf)
        if workers > 1 and len(indices):
            # each thread takes the adjoint of its own dU (linear: the dw parts add up),
            # so that the serial sum after reads 9 values a filter pair, not P
            return weights_transform_adjoint(du, scratch("wino_dw", w.shape, x.dtype),
                                             tiling), db64
        return (du if len(indices) else None), db64

    du, db64 = sum_shares(run(len(blocks), workers, body))
    if du is None:  # an empty batch
        dw_out.fill(0)
    elif workers > 1:
        dw_out[...] = du
    else:
        weights_transform_adjoint(du, dw_out, tiling, split=True)
    if db_out is not None:
        db_out[...] = db64
    return dx, dw_out, db_out


# dU of all blocks, up to which a backward at 2+ threads keeps one per block (and sums them
# in block order after) so that the threads can take the blocks as they come free
# (``run``'s ``dynamic``) with the same dw whichever thread took which block: resnet20's
# 16->16 32x32 layers at F(4x4) keep 22 blocks of 37 KB, its 32->32 16x16 ones 10 of 147 KB.
SLOT_BYTES = 4 << 20
