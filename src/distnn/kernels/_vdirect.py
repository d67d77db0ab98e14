"""Direct stride-1 convolution with register tiles of 16-float vectors (float32; LLVM IR
through numba intrinsics, as ``_vgemm``).

A sample's padded planes are read as flat rows (``_direct``'s layout): output position k =
p*Wp + q of filter f is sum over channels c and taps (i, j) of w[f, c, i, j] *
xp[c, k + i*dh*Wp + j*dw], so for each tap and channel the 32 positions of a tile are one
contiguous run of the input plane. A tile of 8 filters x 32 positions (16 accumulators)
stays in registers over all C*KH*KW terms: 16 FMAs for 2 vector loads and 8 broadcasts,
nothing written until the end, no column matrix and no transform. The Wp - OW columns
between output rows are computed and dropped (2 of 34 on a 32x32 'same' plane).

dw is the sum over positions of dy (as flat rows of Wp, zeros between rows) times the
shifted input rows: ``_vgemm._tile_nt`` 4 x 4 tiles of 16-lane partial sums per tap, summed
per sample into float64 (so the result does not depend on how the batch is split).
With filters a multiple of 16, dw instead keeps the filters in the vector lanes
(``weight_grad_t``): dy of a sample transposed to (positions, F) (16 x 16 blocks in
registers, ``_transpose16``), and a tile of 24 (or 12) (channel, tap) rows x 16 (or 32)
filters stays in registers over all positions of the sample: per position one or two
vector loads of dy and 24 broadcasts of the input, no horizontal sums, no long rows in L1.
Each sample's float32 sums go to float64 as above, into dw as (C*taps, F) so that a tile's
filters are added as contiguous runs.
dx is the forward kernel over dy padded for a full correlation with the flipped weights.

The input buffers carry SLACK zeros past their last plane: a tile reads up to 31
positions past a plane's last output, which lands in the next plane or in that tail.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._numba_runtime import _U
from ._vgemm import (_I32, _I64, _accumulators, _data, _outer_fma, _splat, _tap_channel_steps,
                     _store_tile, _tile_nt, _vptr)

_jit = nb.njit(cache=True, nogil=True)
# reassoc: the row sums of db vectorize
_jit_sums = nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
ROWS = 8
COLS = 32
SLACK = 64  # zeros after the last plane of a padded buffer


@intrinsic
def _tile_conv(typingctx, a, ao, ars, b, bo, offs, ntaps, cs, nc, c, co, crs):
    """c[co + r*crs + j] = sum over taps t < ntaps, channels k < nc of
    a[ao + r*ars + k*ntaps + t] * b[bo + offs[t] + k*cs + j], r < 8, j < 32."""
    sig = types.void(a, ao, ars, b, bo, offs, ntaps, cs, nc, c, co, crs)

    def codegen(context, builder, sig, args):
        _, ao_, ars_, _, bo_, _, nt_, cs_, nc_, _, co_, crs_ = args
        ap, bp, op, cp = (_data(context, builder, sig, args, i) for i in (0, 3, 5, 9))
        acc = _accumulators(builder, ROWS, 2)
        _tap_channel_steps(builder, acc, ap, ao_, ars_, bp, bo_, op, nt_, nc_, cs_)
        _store_tile(builder, cp, co_, crs_, acc)
        return context.get_dummy_value()
    return sig, codegen


def tap_offsets(kh: int, kw: int, dh: int, dw: int, wp: int) -> np.ndarray:
    return np.array([i * dh * wp + j * dw for i in range(kh) for j in range(kw)], np.int64)


def tiles_of(oh: int, ow: int, wp: int) -> int:
    """Flat output positions computed per filter: (OH-1)*Wp + OW rounded up to COLS."""
    ll = (oh - 1) * wp + ow
    return -(-ll // COLS) * COLS


@_jit
def forward(xpf, c_, cs, wp, w, b, n0, n1, offs, oh, ow, acc, y, oy0, ox0, sy, sx):
    """Output (p, q), p < oh, q < ow, of the padded planes of samples n0..n1-1 (flat in xpf
    from its start, channel planes cs apart, rows wp apart) with w (F, C, taps) (F a
    multiple of 8) plus b, written to y[n, f, oy0 + p*sy, ox0 + q*sx] where inside y
    (N, F, YH, YW); acc: F*L work."""
    f_ = w.shape[0]
    yh, yw = y.shape[2], y.shape[3]
    ntaps = offs.shape[0]
    wf = w.ravel()
    ll = (oh - 1) * wp + ow
    lp = -(-ll // COLS) * COLS
    yr = y.ravel()
    p0 = max(0, -(oy0 // sy)) if oy0 < 0 else 0
    q0 = max(0, -(ox0 // sx)) if ox0 < 0 else 0
    p1 = min(oh, (yh - 1 - oy0) // sy + 1)
    q1 = min(ow, (yw - 1 - ox0) // sx + 1)
    for n in range(n0, n1):
        base = (n - n0) * c_ * cs
        for t0 in range(0, lp, COLS):
            for f0 in range(0, f_, ROWS):
                _tile_conv(wf, f0 * c_ * ntaps, c_ * ntaps, xpf, base + t0, offs, ntaps,
                           cs, c_, acc, f0 * lp + t0, lp)
        for f in range(f_):
            bias = b[f]
            for p in range(p0, p1):
                src = f * lp + p * wp
                dst = ((n * f_ + f) * yh + oy0 + p * sy) * yw + ox0
                if sx == 1:
                    for q in range(q0, q1):
                        yr[_U(dst + q)] = acc[_U(src + q)] + bias
                else:
                    for q in range(q0, q1):
                        yr[_U(dst + q * sx)] = acc[_U(src + q)] + bias


_EVEN = ir.Constant(ir.VectorType(_I32, 16), list(range(0, 32, 2)))
_ODD = ir.Constant(ir.VectorType(_I32, 16), list(range(1, 32, 2)))


@intrinsic
def _deinterleave(typingctx, a, ao, c, ce, co):
    """c[ce + k] = a[ao + 2k] and c[co + k] = a[ao + 2k + 1], k < 16 (two vector loads,
    two shuffles)."""
    sig = types.void(a, ao, c, ce, co)

    def codegen(context, builder, sig, args):
        _, ao_, _, ce_, co_ = args
        ap, cp = (_data(context, builder, sig, args, i) for i in (0, 2))
        v0 = builder.load(_vptr(builder, ap, ao_), align=4)
        v1 = builder.load(_vptr(builder, ap, builder.add(ao_, ir.Constant(_I64, 16))), align=4)
        builder.store(builder.shuffle_vector(v0, v1, _EVEN), _vptr(builder, cp, ce_), align=4)
        builder.store(builder.shuffle_vector(v0, v1, _ODD), _vptr(builder, cp, co_), align=4)
        return context.get_dummy_value()
    return sig, codegen


@_jit
def pad_phases(x, n0, n1, pt, pl, hph, wph, out):
    """out = the planes of x[n0:n1] padded (pt rows, pl columns before) and split into
    their 4 phases: out[n - n0, c, 2a + b, r, s] = padded x[n, c, 2r + a, 2s + b] (zeros
    outside x), each phase hph x wph. Each padded row is copied whole into a small buffer,
    then split into its even and odd columns 16 at a time."""
    _, c_, h_, w_ = x.shape
    xf = x.ravel()
    plane = hph * wph
    z = xf.dtype.type(0)
    row = np.zeros(2 * wph, x.dtype)  # a padded row: its zeros stay where x never writes
    j0 = min(2 * wph, max(0, pl))
    j1 = max(j0, min(2 * wph, pl + w_))
    kv = wph - wph % 16
    for t in range((n1 - n0) * c_):
        s0 = (n0 * c_ + t) * h_ * w_
        for a in range(2):
            for r in range(hph):
                d = (t * 4 + 2 * a) * plane + r * wph  # phase (a, 0); (a, 1) a plane on
                sr = 2 * r + a - pt
                if sr < 0 or sr >= h_:
                    for k in range(wph):
                        out[_U(d + k)] = z
                        out[_U(d + plane + k)] = z
                    continue
                src = s0 + sr * w_ - pl
                for j in range(j0, j1):
                    row[_U(j)] = xf[_U(src + j)]
                for k0 in range(0, kv, 16):
                    _deinterleave(row, 2 * k0, out, d + k0, d + plane + k0)
                for k in range(kv, wph):
                    out[_U(d + k)] = row[_U(2 * k)]
                    out[_U(d + plane + k)] = row[_U(2 * k + 1)]


def phase_offsets(kh: int, kw: int, hph: int, wph: int) -> np.ndarray:
    """Tap offsets of a stride-2 kernel over the 4-phase layout of ``pad_phases``."""
    return np.array([((i % 2) * 2 + j % 2) * hph * wph + (i // 2) * wph + j // 2
                     for i in range(kh) for j in range(kw)], np.int64)


@_jit_sums
def weight_grad(xpf, c_, cs, wp, dy, n0, n1, offs, dyw, dw64, db64):
    """dw64 (F, C*taps) and db64 (F,) += the sums over samples n0..n1-1 (float32 within
    the block, then float64), their padded planes flat in xpf from its start (channel
    planes cs apart, rows wp apart, the outputs' flat rows wp long too); dyw:
    (n1-n0)*F*L work (dy as flat rows of Wp, zeros between rows and past the end)."""
    _, f_, oh, ow = dy.shape
    ntaps = offs.shape[0]
    ll = (oh - 1) * wp + ow
    lp = -(-ll // 16) * 16
    plane = cs
    s = np.empty(16, np.float32)
    df = dy.ravel()
    for n in range(n0, n1):
        for f in range(f_):
            dyr = ((n - n0) * f_ + f) * lp
            for k in range(lp):
                dyw[_U(dyr + k)] = 0
            for p in range(oh):
                src = ((n * f_ + f) * oh + p) * ow
                row = np.float32(0)
                for q in range(ow):
                    v = df[_U(src + q)]
                    dyw[_U(dyr + p * wp + q)] = v
                    row += v
                db64[f] += row
    base = 0
    # taps innermost: the 4 dy rows and 4 input rows of a tile stay in L1 for all taps
    # (each tap reads the same input rows shifted)
    for f0 in range(0, f_, 4):
        for c0 in range(0, c_, 4):
            for t in range(ntaps):
                _tile_nt(dyw, f0 * lp, lp, f_ * lp, xpf, base + offs[t] + c0 * plane,
                                 plane, c_ * plane, n1 - n0, lp // 16, s)
                for i in range(4):
                    for j in range(4):
                        dw64[f0 + i, (c0 + j) * ntaps + t] += s[i * 4 + j]


DW1, DW2 = 4, 2  # input rows of a dw tile, 16 and 32 filters


def _make_tile_dw(npr: int, ncol: int, nj: int):
    """The intrinsic c[co + ((p*ncol + q)*nj + j)*16 + l] = sum over k < nk of
    a[ao + k*aks + 16*j + l] * b[bo + roffs[ro + p] + cols[q] + k], p < npr, q < ncol,
    j < nj, l < 16 (the column offsets are read at run time: LLVM, seeing constants, would
    keep inputs across positions in registers and broadcast them there, on the FMAs' port)."""
    @intrinsic
    def tile(typingctx, a, ao, aks, b, bo, roffs, ro, cols, nk, c, co):
        sig = types.void(a, ao, aks, b, bo, roffs, ro, cols, nk, c, co)

        def codegen(context, builder, sig, args):
            _, ao_, aks_, _, bo_, _, ro_, _, nk_, _, co_ = args
            ap, bp, rp, qp, cp = (_data(context, builder, sig, args, i)
                                  for i in (0, 3, 5, 7, 9))
            qs = [builder.load(builder.gep(qp, [ir.Constant(_I64, q)])) for q in range(ncol)]
            ptrs = [builder.gep(bp, [builder.add(builder.add(bo_, builder.load(builder.gep(
                rp, [builder.add(ro_, ir.Constant(_I64, r))]))), q)])
                for r in range(npr) for q in qs]
            acc = _accumulators(builder, npr * ncol, nj)
            with cgutils.for_range(builder, nk_) as loop:
                k = loop.index
                ak = builder.add(ao_, builder.mul(k, aks_))
                av = [builder.load(_vptr(builder, ap, builder.add(ak, ir.Constant(_I64, 16 * j))),
                                   align=4) for j in range(nj)]
                bv = [_splat(builder, builder.load(builder.gep(ptr, [k]))) for ptr in ptrs]
                _outer_fma(builder, acc, bv, av)
            for r in range(npr * ncol):
                for j in range(nj):
                    builder.store(builder.load(acc[r][j]), _vptr(builder, cp, builder.add(
                        co_, ir.Constant(_I64, (r * nj + j) * 16))), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def _swap_masks(h: int):
    """Masks of one round of a 16x16 transpose in registers: rows i and i + h (i & h == 0)
    trade their h-wide blocks (x & h set in row i, clear in row i + h)."""
    lo = [x if not x & h else 16 + x - h for x in range(16)]
    hi = [x + h if not x & h else 16 + x for x in range(16)]
    return [ir.Constant(ir.VectorType(_I32, 16), m) for m in (lo, hi)]


@intrinsic
def _transpose16(typingctx, a, ao, ars, c, co, crs):
    """c[co + j*crs + i] = a[ao + i*ars + j], i, j < 16: 16 vector loads, 4 rounds of
    block swaps (h = 8, 4, 2, 1), 16 vector stores."""
    sig = types.void(a, ao, ars, c, co, crs)

    def codegen(context, builder, sig, args):
        _, ao_, ars_, _, co_, crs_ = args
        ap, cp = (_data(context, builder, sig, args, i) for i in (0, 3))
        rows = [builder.load(_vptr(builder, ap, builder.add(ao_, builder.mul(
            ir.Constant(_I64, i), ars_))), align=4) for i in range(16)]
        for h in (8, 4, 2, 1):
            lo, hi = _swap_masks(h)
            new = list(rows)
            for i in range(16):
                if not i & h:
                    new[i] = builder.shuffle_vector(rows[i], rows[i + h], lo)
                    new[i + h] = builder.shuffle_vector(rows[i], rows[i + h], hi)
            rows = new
        for j in range(16):
            builder.store(rows[j], _vptr(builder, cp, builder.add(co_, builder.mul(
                ir.Constant(_I64, j), crs_))), align=4)
        return context.get_dummy_value()
    return sig, codegen


_tile_dw1 = _make_tile_dw(DW1, 3, 1)  # input rows x 3 taps x 16 filters
_tile_dw2 = _make_tile_dw(DW2, 3, 2)  # input rows x 3 taps x 32 filters
DW_ROWS = 24  # input rows are padded to a multiple of this


def lanes_apply(f: int, kw: int) -> bool:
    """Whether ``weight_grad_t`` takes dw: F a multiple of 16, kernel rows of 3 taps."""
    return f % 16 == 0 and kw == 3


def row_offsets(c_: int, cs: int, rows: np.ndarray) -> np.ndarray:
    """The offset of every (channel, kernel row) input row of dw in a sample's planes
    (``rows``: each kernel row's), padded to a multiple of DW_ROWS with the last one (read,
    never kept)."""
    r = (np.arange(c_)[:, None] * cs + rows[None, :]).ravel().astype(np.int64)
    return np.concatenate([r, np.full(-len(r) % DW_ROWS, r[-1], np.int64)])


@_jit_sums
def _db_rows(df, src, f_, plane, db64):
    """db64[f] += the sum of filter f's dy plane of one sample (float32 rows)."""
    for f in range(f_):
        row = np.float32(0)
        for k in range(plane):
            row += df[_U(src + f * plane + k)]
        db64[f] += row


@_jit_sums
def _dy_by_position(df, src, f_, plane, oh, ow, wp, d0, dyt):
    """One sample's dy (F, OH*OW from src) into dyt from d0 as (position, F), positions in
    rows of wp (zeros between rows): 16 x 16 blocks in registers, the rest one by one."""
    for p in range(oh):
        q0 = 0
        while q0 + 16 <= ow:  # 16 positions x 16 filters at a time, in registers
            for f0 in range(0, f_, 16):
                _transpose16(df, src + f0 * plane + p * ow + q0, plane, dyt,
                             d0 + (p * wp + q0) * f_ + f0, f_)
            q0 += 16
        for f in range(f_):  # the rest of the row
            sp = src + f * plane + p * ow
            for q in range(q0, ow):
                dyt[_U(d0 + (p * wp + q) * f_ + f)] = df[_U(sp + q)]
        if p < oh - 1:
            for k in range(d0 + (p * wp + ow) * f_, d0 + (p + 1) * wp * f_):
                dyt[_U(k)] = 0


@_jit_sums
def _dw_tiles(dyt, f_, xpf, base, roffs, cols, ll, s, dwf, nrow, d0, shifted):
    """One sample's dw (C*taps, F) += its tiles: 32 filters a tile, or 16 by shifting dy
    (``shifted``), or 16 by broadcasting every tap; s is the tiles' float32 work."""
    if f_ % 32 == 0:
        for f0 in range(0, f_, 32):
            for r0 in range(0, roffs.shape[0], DW2):
                _tile_dw2(dyt, f0, f_, xpf, base, roffs, r0, cols, ll, s, 0)
                for r in range(min(3 * DW2, nrow - 3 * r0)):
                    d = (3 * r0 + r) * f_ + f0
                    _widen_add(s, r * 32, dwf, d)
                    _widen_add(s, r * 32 + 16, dwf, d + 16)
    elif shifted:
        for f0 in range(0, f_, 16):
            for r0 in range(0, roffs.shape[0], SHIFT_ROWS):
                _tile_dw_shift(dyt, d0 + f0, f_, xpf, base, roffs, r0, cols,
                                   ll + cols[2], s, 0)
                for r in range(min(3 * SHIFT_ROWS, nrow - 3 * r0)):
                    _widen_add(s, r * 16, dwf, (3 * r0 + r) * f_ + f0)
    else:
        for f0 in range(0, f_, 16):
            for r0 in range(0, roffs.shape[0], DW1):
                _tile_dw1(dyt, f0, f_, xpf, base, roffs, r0, cols, ll, s, 0)
                for r in range(min(3 * DW1, nrow - 3 * r0)):
                    _widen_add(s, r * 16, dwf, (3 * r0 + r) * f_ + f0)


@_jit_sums
def weight_grad_t(xpf, c_, cs, wp, dy, n0, n1, roffs, cols, dyt, s, dwt64, db64, shift):
    """``weight_grad`` where ``lanes_apply``, filters in the vector lanes, dw transposed:
    dwt64 (C*taps, F) += the sums; dyt (F*(L + 2*cols[2])) and s (3*DW_ROWS*16) work;
    roffs from ``row_offsets``, cols: the 3 taps' offsets in a kernel row. ``shift``
    (``plan.dw_shift``): 16 filters by the shift tiles (below) (dy then has cols[2]
    positions of zeros before and after it in dyt)."""
    _, f_, oh, ow = dy.shape
    ll = (oh - 1) * wp + ow
    nrow = dwt64.shape[0]
    dwf = dwt64.ravel()
    plane = oh * ow
    df = dy.ravel()
    # taps within one row of the input (stride 1), the shifts inside dyt's margins
    shifted = shift and f_ % 32 != 0 and cols[0] == 0 and 0 <= cols[1] <= cols[2]
    d0 = cols[2] * f_ if shifted else 0  # dy's first position in dyt
    if shifted:
        for k in range(d0):
            dyt[_U(k)] = 0
        for k in range(d0 + ll * f_, 2 * d0 + ll * f_):
            dyt[_U(k)] = 0
    for n in range(n0, n1):
        src = n * f_ * plane
        _db_rows(df, src, f_, plane, db64)
        _dy_by_position(df, src, f_, plane, oh, ow, wp, d0, dyt)
        _dw_tiles(dyt, f_, xpf, (n - n0) * c_ * cs, roffs, cols, ll, s, dwf, nrow, d0,
                  shifted)

# -- dw of 16 filters with its taps by shifting dy (``Limits.dw_shift``) ------------------
# The weight gradient of the register-tiled direct convolution (``_vdirect.weight_grad_t``)
# for 16 filters (one vector) with its taps by shifting dy rather than the input.
#
# ``_vdirect``'s tile for 16 filters sums dw[(row r, tap q), f] over positions k of
# x[r, k + cols[q]] * dy[k, f]: per position one vector of dy and a broadcast for each of
# its rows x taps (12 of them for 12 multiply-adds), so that loads, not multiply-adds, bound
# it. Here the same sum runs over k' = k + cols[q]: dw[(r, q), f] += x[r, k'] * dy[k' -
# cols[q], f], so that per position each row's input is broadcast once for its 3 taps and dy
# is read at 3 shifts (L1 hits): 6 rows x 3 taps = 18 multiply-adds for 6 broadcasts and 3
# vector loads. Each accumulator gets the same products in the same order as before; the
# positions where a tap's dy falls outside the sample read zeros from margins of cols[2]
# positions around dyt, adding x * 0 (exact for finite x): the same bits.
SHIFT_ROWS = 6  # input rows a tile (of ``DW_ROWS``, a multiple of it)
SHIFT_TAPS = 3


@intrinsic
def _tile_dw_shift(typingctx, a, ao, aks, b, bo, roffs, ro, cols, nk, c, co):
    """c[co + (p*3 + q)*16 + l] = sum over k < nk of a[ao + (k - cols[q])*aks + l] *
    b[bo + roffs[ro + p] + k], p < 6, q < 3, l < 16 (a readable cols[2]*aks before ao)."""
    sig = types.void(a, ao, aks, b, bo, roffs, ro, cols, nk, c, co)

    def codegen(context, builder, sig, args):
        _, ao_, aks_, _, bo_, _, ro_, _, nk_, _, co_ = args
        ap, bp, rp, qp, cp = (_data(context, builder, sig, args, i) for i in (0, 3, 5, 7, 9))
        shifts = [builder.mul(builder.load(builder.gep(qp, [ir.Constant(_I64, q)])), aks_)
                  for q in range(SHIFT_TAPS)]
        ptrs = [builder.gep(bp, [builder.add(bo_, builder.load(builder.gep(
            rp, [builder.add(ro_, ir.Constant(_I64, r))])))]) for r in range(SHIFT_ROWS)]
        acc = _accumulators(builder, SHIFT_ROWS, SHIFT_TAPS)
        with cgutils.for_range(builder, nk_) as loop:
            k = loop.index
            ak = builder.add(ao_, builder.mul(k, aks_))
            dv = [builder.load(_vptr(builder, ap, builder.sub(ak, s)), align=4) for s in shifts]
            xv = [_splat(builder, builder.load(builder.gep(ptr, [k]))) for ptr in ptrs]
            # acc[p][q] += x[p] * dy shifted by tap q: one row's taps side by side
            _outer_fma(builder, acc, xv, dv)
        for r in range(SHIFT_ROWS):
            for q in range(SHIFT_TAPS):
                builder.store(builder.load(acc[r][q]), _vptr(builder, cp, builder.add(
                    co_, ir.Constant(_I64, (r * SHIFT_TAPS + q) * 16))), align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _widen_add(typingctx, s, so, c, co):
    """c[co + l] += float64(s[so + l]), l < 16: a tile's float32 sums added into the
    float64 dw in two vectors (numba's loop stays scalar there: it cannot tell the
    arrays apart). Each element the same conversion and addition: the same bits."""
    sig = types.void(s, so, c, co)

    def codegen(context, builder, sig, args):
        _, so_, _, co_ = args
        sp, cp = (_data(context, builder, sig, args, i) for i in (0, 2))
        wide = ir.VectorType(ir.DoubleType(), 16)
        v = builder.fpext(builder.load(_vptr(builder, sp, so_), align=4), wide)
        dst = builder.bitcast(builder.gep(cp, [co_]), wide.as_pointer())
        builder.store(builder.fadd(builder.load(dst, align=8), v), dst, align=8)
        return context.get_dummy_value()
    return sig, codegen
