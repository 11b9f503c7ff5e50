"""Data sets by name: `load_dataset("fashion-mnist", split="test")`."""
from __future__ import annotations

import inspect
from functools import partial
from typing import Optional

from edgefl.data.base import Dataset, subset
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


def load_split(name: str, split: str, root=None, limit: Optional[int] = None, seed: int = 0, **options) -> Dataset:
    """A run's `split` of data set `name`, cut to a seeded subset of `limit` examples (`--train-limit`,
    `--test-limit`): the training split's subset drawn with `seed`, the test split's with `seed + 1`, so that
    an emulated run, its served twin and a fleet of agents hold the same examples."""
    return subset(load_dataset(name, root=root, split=split, **options), limit, seed + 1 if split == "test" else seed)
