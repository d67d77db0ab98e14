"""Training-time augmentation of NCHW batches, vectorized over the batch.

An augmentation is a callable ``f(x, rng) -> x`` on a float batch (N, C, H, W) already
scaled to [0, 1] (mean/std come after, so zero padding is black). ``Dataset.batches`` passes
a per-rank generator ``default_rng([seed, rank])``, so ranks draw different transforms.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _check_batch(name: str, x: np.ndarray) -> None:
    if x.ndim != 4:
        raise ValueError(f"{name} needs image batches of shape (N, C, H, W), got shape "
                         f"{x.shape}; leave it out of augment for non-image data")


def _check_prob(prob: float) -> float:
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"prob must be in [0, 1], got {prob}")
    return float(prob)


class RandomFlip:
    """Flip each image horizontally (last axis) with probability ``prob``.

    Args:
        prob: probability that a sample is flipped.

    Example:
        ds.batches(128, seed=epoch, augment=[RandomFlip(0.5), RandomCrop(4)])
    """

    def __init__(self, prob: float = 0.5):
        self.prob = _check_prob(prob)

    def __repr__(self) -> str:
        return f"RandomFlip(prob={self.prob})"

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        _check_batch("RandomFlip", x)
        flip = rng.random(len(x)) < self.prob
        x[flip] = x[flip, :, :, ::-1]
        return x


PADDING_MODES = ("constant", "symmetric", "reflect", "edge")


class RandomCrop:
    """Pad each image with ``padding`` pixels on every side and crop it back at a random offset.

    Args:
        padding: pixels added on each side; offsets are drawn in [0, 2 * padding].
        prob: probability that a sample is shifted; the others keep their position.
        padding_mode: what the added pixels hold, as ``np.pad``'s modes: "constant" (zeros,
            the default), "symmetric" (the border mirrored including its edge pixel:
            SINGA's CNN examples pad this way), "reflect" (mirrored without it), "edge"
            (the edge pixel repeated).

    Example:
        RandomCrop(4)  # the usual CIFAR-10 shift augmentation
        RandomCrop(4, padding_mode="symmetric")  # SINGA's
    """

    def __init__(self, padding: int = 4, prob: float = 1.0, padding_mode: str = "constant"):
        if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
            raise ValueError(f"padding must be an int >= 0, got {padding!r}")
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}, got "
                             f"{padding_mode!r}")
        self.padding = int(padding)
        self.prob = _check_prob(prob)
        self.padding_mode = padding_mode

    def __repr__(self) -> str:
        mode = "" if self.padding_mode == "constant" else f", padding_mode={self.padding_mode!r}"
        return f"RandomCrop(padding={self.padding}, prob={self.prob}{mode})"

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        _check_batch("RandomCrop", x)
        p = self.padding
        n, _, h, w = x.shape
        if p == 0 or n == 0:
            return x
        top = rng.integers(0, 2 * p + 1, n)
        left = rng.integers(0, 2 * p + 1, n)
        keep = rng.random(n) >= self.prob
        top[keep] = p
        left[keep] = p
        padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), mode=self.padding_mode)
        # (N, C, 2p+1, 2p+1, H, W) view of every crop; pick one offset per sample
        windows = sliding_window_view(padded, (h, w), axis=(2, 3))
        return np.ascontiguousarray(windows[np.arange(n), :, top, left])
