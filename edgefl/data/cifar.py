"""CIFAR-10 / CIFAR-100 from a local copy of the official "python version" (pickled dicts).

CIFAR-10: data_batch_1..5 and test_batch, keys b'data' (uint8 (N, 3072), channel-major) and b'labels'.
CIFAR-100: train and test, keys b'data', b'fine_labels' (100 classes) and b'coarse_labels' (20).
No offline package exists: unpack cifar-10-python.tar.gz / cifar-100-python.tar.gz into the root (its
cifar-10-batches-py / cifar-100-python folder is found too). The files are unpickled: use your own copy.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from edgefl.data.base import Dataset, check_split, data_root, missing
from edgefl.data.base import normalize as _normalize
from edgefl.errors import ConfigError

_LAYOUT = {  # classes -> (folder inside the tarball, train files, test files, label key)
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels"),
    100: ("cifar-100-python", ["train"], ["test"], "fine_labels"),
}
_TARBALL = {10: "cifar-10-python.tar.gz", 100: "cifar-100-python.tar.gz"}
_STATS = {
    10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _field(batch: dict, key: str, path: Path):
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise ConfigError(f"{path} has no {key!r} entry; it is not a CIFAR python-format batch")


def cifar(root=None, split: str = "train", classes: int = 10, normalize: bool = False,
          coarse: bool = False) -> Dataset:
    """CIFAR-`classes` images as float32 (N, 3, 32, 32) in [0, 1] (normalized if asked), int64 labels.
    `coarse` picks CIFAR-100's 20 superclasses."""
    if classes not in _LAYOUT:
        raise ConfigError(f"CIFAR has 10 or 100 classes, not {classes}")
    if coarse and classes != 100:
        raise ConfigError("coarse labels exist only for CIFAR-100; drop coarse=True or use classes=100")
    folder, train, test, key = _LAYOUT[classes]
    root = Path(root) if root else data_root() / f"cifar{classes}"
    if (root / folder).is_dir():
        root = root / folder
    files = [root / f for f in (train if check_split(split) == "train" else test)]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise missing(f"CIFAR-{classes} {split} batch {absent[0].name}", root,
                      f"no offline package exists: unpack the official {_TARBALL[classes]} there (or pass root=DIR)")
    xs, ys = [], []
    for path in files:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        xs.append(np.asarray(_field(batch, "data", path), np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(_field(batch, "coarse_labels" if coarse else key, path), np.int64))
        if len(xs[-1]) != len(ys[-1]):
            raise ConfigError(f"{path}: {len(xs[-1])} images but {len(ys[-1])} labels; replace the file")
    x = np.concatenate(xs).astype(np.float32) / np.float32(255)
    if normalize:
        x = _normalize(x, *_STATS[classes])
    return Dataset(x=x, y=np.concatenate(ys), classes=20 if coarse else classes, name=f"cifar{classes}")

