"""Image augmentation as in SLT (sec. 3.1): random crop with zero padding 4, random horizontal and
vertical flips. numpy only, on a whole (N, C, H, W) batch, driven by the caller's seeded Generator."""
from __future__ import annotations

import numpy as np


def augment(x: np.ndarray, rng: np.random.Generator, pad: int = 4, hflip: bool = True,
            vflip: bool = True) -> np.ndarray:
    """A new batch: each image shifted by a random crop of its zero-padded copy, then each flip
    applied with probability 1/2 per image. `x` is left untouched."""
    n, c, h, w = x.shape
    out = x.copy()
    if pad:
        padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        top, left = rng.integers(0, 2 * pad + 1, size=(2, n))
        rows = (top[:, None] + np.arange(h))[:, None, :, None]
        cols = (left[:, None] + np.arange(w))[:, None, None, :]
        out = padded[np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None], rows, cols]
    for enabled, axis in ((hflip, 3), (vflip, 2)):
        if enabled:
            flip = rng.random(n) < 0.5
            out[flip] = np.flip(out[flip], axis=axis)
    return out
