"""Inference programs: a built model's leading convolutions, batch norms, ReLUs, residual
sums, max poolings and a last global average pool run as oneDNN inference primitives over
blocked layouts (``kernels._onednn_graph``), the rest of the model by its own layers.

The model pass is decided here, in one place (``plan``): each ``Conv2D`` takes the
``BatchNormalization`` right after it folded into its weights and bias (w * s, (b - mean)
* s + beta with s = gamma / sqrt(var + eps)) and the ``ReLU`` after that as a post-op; an
``Add`` of a convolution branch and a shortcut (empty or convolutions) computes the
shortcut into the output array and runs the branch's last convolution with a sum post-op
(and the ReLU after the ``Add``). The pass reads the layers' parameters and never writes
any layer's fields; the training path is untouched (programs run only from ``predict``).
The folded weights are taken again at each ``predict`` call (the parameters may have
changed since). Where oneDNN is unavailable, the dtype is not float32, the model has layer
hooks, or no leading layer fits, ``runner`` answers None and ``predict`` runs the layers.

``DISTNN_INFERENCE=layers`` turns the programs off (the layers run as in training mode
``False``).
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from . import fusion
from .activations import ReLU
from .containers import Add, Sequential
from .model import PREDICT_RUNNER
from .conv import Conv2D
from .normalization import BatchNormalization
from .pooling import GlobalAvgPool2D, MaxPool2D

_PROGRAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# -- the model pass ----------------------------------------------------------------------
class ConvStep:
    """A convolution with the batch norm after it folded in, and a ReLU post-op."""

    def __init__(self, conv: Conv2D, bn: BatchNormalization | None, relu: bool):
        self.conv, self.bn, self.relu = conv, bn, relu

    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        """(weights, bias) with the batch norm folded in (float32)."""
        w = self.conv.params["w"].astype(np.float64)
        b = self.conv.params.get("b")
        b = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        if self.bn is not None:
            bn = self.bn
            s = bn.params["gamma"] / np.sqrt(bn.buffers["running_var"].astype(np.float64)
                                             + bn.epsilon)
            w = w * s[:, None, None, None]
            b = (b - bn.buffers["running_mean"]) * s + bn.params["beta"]
        return w.astype(np.float32), b.astype(np.float32)


class PoolStep:
    def __init__(self, pool: MaxPool2D):
        self.pool = pool


class ResidualStep:
    """relu?(branch(x) + shortcut(x)): ``branch`` ends in a ConvStep (run with a sum)."""

    def __init__(self, branch: list, shortcut: list, relu: bool):
        self.branch, self.shortcut, self.relu = branch, shortcut, relu


def _conv_ok(layer) -> bool:
    return type(layer) is Conv2D and layer.groups == 1


def _steps(layers: list, whole: bool) -> tuple[list, int]:
    """(the steps of the leading layers that fit, how many layers they take); with
    ``whole``, all layers or ([], -1)."""
    steps, i, n = [], 0, len(layers)
    while i < n:
        layer = layers[i]
        if _conv_ok(layer):
            j, bn = i + 1, None
            if j < n and type(layers[j]) is BatchNormalization:
                bn, j = layers[j], j + 1
            relu = j < n and type(layers[j]) is ReLU
            steps.append(ConvStep(layer, bn, relu))
            i = j + relu
            continue
        if type(layer) is MaxPool2D:
            steps.append(PoolStep(layer))
            i += 1
            continue
        if type(layer) is GlobalAvgPool2D and not whole:  # the program's last step
            steps.append(PoolStep(layer))
            i += 1
            break
        if type(layer) is Add and len(layer.branches) == 2:
            main, short = (getattr(b, "layers", None) for b in layer.branches)
            if isinstance(main, list) and isinstance(short, list) and main:
                a, _ = _steps(main, True)
                s, _ = _steps(short, True)
                if a and all(isinstance(t, ConvStep) for t in a + s) and not a[-1].relu \
                        and (s or not short):
                    relu = i + 1 < n and type(layers[i + 1]) is ReLU
                    steps.append(ResidualStep(a, s, relu))
                    i += 1 + relu
                    continue
        break
    if whole and i < n:
        return [], -1
    return steps, i


def plan(model) -> tuple[list, int]:
    """(the program's steps, how many of the model's top-level layers they take)."""
    if not isinstance(model, Sequential):
        return [], 0
    return _steps(list(model.layers), False)


def _unavailable(model) -> str | None:
    if os.environ.get("DISTNN_INFERENCE", "").strip().lower() == "layers":
        return "DISTNN_INFERENCE=layers"
    if np.dtype(model.dtype) != np.float32:
        return "not float32"
    if getattr(model, "layer_hooks", None):
        return "layer hooks"
    from ..kernels import _onednn_graph as G
    return G.available()


# -- the program -------------------------------------------------------------------------
class _Program:
    """The steps built for one batch size and thread count."""

    def __init__(self, steps: list, n: int, input_shape: tuple, threads: int):
        from ..kernels import _onednn_graph as G
        from ..kernels.geometry import ConvGeometry
        self.G, self.threads, self.pool = G, threads, G.Pool()
        self.convs: list[tuple[ConvStep, object]] = []
        self.ops: list = []
        self._later: list = []
        self.flat = False  # a global average pool's (n, c, 1, 1) output taken as (n, c)

        def conv(step: ConvStep, dims: tuple, sum_: bool):
            layer = step.conv
            (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.strides, layer.dilation
            pt, pb, pl, pr = layer._pads
            _, c, h, w = dims
            oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
            ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
            g = ConvGeometry(n, c, h, w, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, oh, ow)
            prim = G.Conv(g, layer.filters, step.relu, sum_)
            self.convs.append((step, prim))
            return prim

        with G.threads(threads):
            dims = (n,) + tuple(input_shape)
            first = self._first_md(steps, dims, conv)
            self.input = G.Input(dims, first)
            md = first
            for step in steps:
                md, dims = self._emit(step, md, dims, conv)
            self.output = G.Output(md, dims)

    def _first_md(self, steps, dims, conv):
        """The layout the first step wants (built once more below; cheap)."""
        step = steps[0]
        while isinstance(step, ResidualStep):
            step = step.branch[0]
        if isinstance(step, ConvStep):
            prim = conv(step, dims, False)
            self.convs.pop()
            return prim.src_md
        return self.G.plain_md(dims)

    def _convert(self, md, want, dims):
        """An op bringing a value into layout ``want`` (None where it is already)."""
        G = self.G
        if G.equal(md, want):
            return None
        cv = G.Convert(md, want)
        return ("convert", cv, dims)

    def _emit(self, step, md, dims, conv):
        G = self.G
        if isinstance(step, ConvStep):
            prim = conv(step, dims, False)
            op = self._convert(md, prim.src_md, dims)
            if op:
                self.ops.append(op)
            self.ops.append(("conv", prim))
            return prim.dst_md, prim.dims
        if isinstance(step, PoolStep):
            p = step.pool
            _, c, h, w = dims
            if type(p) is GlobalAvgPool2D:
                prim = G.MaxPool(md, dims, (1, 1), (h, w), (1, 1), (0, 0, 0, 0), average=True)
                self.ops.append(("pool", prim))
                self.flat = True
                return prim.dst_md, prim.dims
            (kh, kw), (sh, sw), (ph, pw) = p.pool_size, p.strides, p.padding
            out = ((h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
            prim = G.MaxPool(md, dims, out, (kh, kw), (sh, sw), (ph, ph, pw, pw))
            op = self._convert(md, prim.src_md, dims)
            if op:
                self.ops.append(op)
            self.ops.append(("pool", prim))
            return prim.dst_md, prim.dims
        # residual: the shortcut runs first, its result (in the last convolution's output
        # layout) becomes that convolution's output array, which its sum post-op adds to
        self.ops.append(("push",))
        smd, sdims = md, dims
        for s in step.shortcut:
            smd, sdims = self._emit(s, smd, sdims, conv)
        bmd, bdims = md, dims
        for s in step.branch[:-1]:
            bmd, bdims = self._emit_later(s, bmd, bdims, conv)
        last = step.branch[-1]
        prim = conv(ConvStep(last.conv, last.bn, step.relu), bdims, True)
        into = None if G.equal(smd, prim.dst_md) else G.Convert(smd, prim.dst_md)
        # an identity shortcut's array is the input itself, which the branch's first
        # convolution has read before its last one adds into it (where there are two)
        inplace = not step.shortcut and into is None and len(step.branch) >= 2
        self.ops.append(("swap", into, prim.size, inplace))
        self.ops.extend(self._later)
        self._later = []
        op = self._convert(bmd, prim.src_md, bdims)
        if op:
            self.ops.append(op)
        self.ops.append(("sumconv", prim))
        return prim.dst_md, prim.dims

    def _emit_later(self, step, md, dims, conv):
        """``_emit`` into the list of ops run after the residual's swap."""
        ops, self.ops = self.ops, []
        try:
            out = self._emit(step, md, dims, conv)
            self._later.extend(self.ops)
        finally:
            self.ops = ops
        return out

    def set_weights(self) -> None:
        with self.G.threads(self.threads):
            for step, prim in self.convs:
                prim.set_weights(*step.folded())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The program's output for one batch x (NCHW, float32)."""
        G, pool = self.G, self.pool
        x = np.ascontiguousarray(x, np.float32)

        def release(item):
            if item[1]:
                pool.give(item[0].data)

        with G.threads(self.threads):
            cur = self.input(x, pool)  # (value, whether its array is the pool's)
            stack = []
            for op in self.ops:
                kind = op[0]
                if kind == "push":  # the residual's input, owned by the stack
                    stack.append(cur)
                    cur = (cur[0], False)
                elif kind == "swap":  # cur: the shortcut's result; back to the input
                    into, size, inplace = op[1], op[2], op[3]
                    short, cur = cur, stack.pop()
                    if inplace and cur[1]:  # the branch reads x, the sum writes into it
                        short, cur = cur, (cur[0], False)
                    elif into is not None or not short[1]:
                        out = pool.take(size)
                        if into is not None:
                            into.reorder(short[0].data, out)
                        else:
                            out[:short[0].data.size] = short[0].data
                        release(short)
                        short = (G.Value(None, None, out), True)
                    stack.append(short)
                elif kind == "convert":
                    cv, dims = op[1], op[2]
                    out = pool.take(cv.size)
                    cv.reorder(cur[0].data, out)
                    release(cur)
                    cur = (G.Value(cv.md, dims, out), True)
                elif kind in ("conv", "pool"):
                    out = pool.take(op[1].size)
                    nv = op[1](cur[0], out)
                    release(cur)
                    cur = (nv, True)
                else:  # sumconv: into the shortcut's array
                    short = stack.pop()
                    nv = op[1](cur[0], short[0].data)
                    release(cur)
                    cur = (nv, True)
            y = self.output(cur[0])
            release(cur)
        return y.reshape(len(y), -1) if self.flat else y


# -- what predict asks -------------------------------------------------------------------
class Runner:
    """A model's forward in inference mode, its leading layers as programs (one per batch
    size), the others as layers; the folded weights taken when made."""

    def __init__(self, model, steps: list, taken: int, threads: int):
        self.model, self.steps, self.threads = model, steps, threads
        self.tail = list(model.layers)[taken:]
        self.programs: dict[int, _Program] = _PROGRAMS.setdefault(model, {})
        for prog in self.programs.values():
            if prog.threads == threads:
                prog.set_weights()
        self.fresh = set()

    def _program(self, n: int) -> _Program:
        prog = self.programs.get(n)
        if prog is None or prog.threads != self.threads:
            prog = self.programs[n] = _Program(self.steps, n, self.model.input_shape,
                                               self.threads)
            prog.set_weights()
        return prog

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        y = self._program(len(x))(x)
        return fusion.forward_steps(self.tail, y, False) if self.tail else y


def runner(model) -> Runner | None:
    """The model's inference runner, or None where predict runs the layers (see the
    module's docstring); made at each predict call."""
    try:
        if _unavailable(model) is not None:
            return None
    except Exception:  # noqa: BLE001 - an unusable library: the layers run
        return None
    steps, taken = plan(model)
    if not steps or not any(isinstance(s, (ConvStep, ResidualStep)) for s in steps):
        return None
    from ..kernels.backend import get_num_threads
    return Runner(model, steps, taken, get_num_threads())


def why_not(model) -> str | None:
    """None where ``runner`` makes a program for the model, else the reason."""
    reason = _unavailable(model)
    if reason is None and not plan(model)[0]:
        reason = "no leading layer fits"
    return reason


PREDICT_RUNNER[:] = [runner]
