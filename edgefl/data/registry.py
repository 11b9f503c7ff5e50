"""Data sets by name: `load_dataset("fashion-mnist", split="test")`."""
from __future__ import annotations

import inspect
from functools import partial

from edgefl.data.base import Dataset
from edgefl.data.cifar import cifar
from edgefl.data.mnist import fashion_mnist, mnist
from edgefl.data.text import shakespeare
from edgefl.errors import ConfigError

_LOADERS = {
    "fashion-mnist": fashion_mnist,
    "mnist": mnist,
    "cifar10": partial(cifar, classes=10),
    "cifar100": partial(cifar, classes=100),
    "shakespeare": shakespeare,
}


def dataset_names() -> list[str]:
    return list(_LOADERS)


def load_dataset(name: str, root=None, split: str = "train", **options) -> Dataset:
    """The `split` of data set `name` read from `root` (each loader has its default); `options` go to the
    loader (normalize=True for images; seq_len, min_chars, test_fraction, holdout for shakespeare)."""
    if name not in _LOADERS:
        raise ConfigError(f"unknown dataset {name!r}; choose one of: {', '.join(_LOADERS)}")
    loader = _LOADERS[name]
    allowed = set(inspect.signature(loader).parameters) - {"root", "split", "classes"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"dataset {name!r} has no option {', '.join(unknown)}; "
                          f"its options: {', '.join(sorted(allowed))}")
    return loader(root=root, split=split, **options)
