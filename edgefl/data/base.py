"""The `Dataset` every loader returns, and where local copies of data sets live."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from edgefl.errors import ConfigError

SPLITS = ("train", "test")


@dataclass(frozen=True, eq=False)
class Dataset:
    """One split of a data set as numpy arrays.

    x: inputs (images float32 (N, C, H, W); text int64 (N, seq_len) token windows, a read-only view).
    y: int64 targets (class or next token; `edgefl.data.text.IGNORE_INDEX` marks rows to skip).
    classes: number of classes (the vocabulary size for text).
    vocab: token -> character, for text.
    groups: natural client id per row (-1: the row belongs to no client), where the data has one;
        `edgefl.data.natural(groups)` turns it into per-client index arrays; group_names names each id.
    """

    x: np.ndarray
    y: np.ndarray
    classes: int
    name: str
    vocab: Optional[list[str]] = None
    groups: Optional[np.ndarray] = None
    group_names: Optional[list[str]] = None

    def __len__(self) -> int:
        return len(self.y)


def subset(dataset: Dataset, limit: Optional[int], seed: int) -> Dataset:
    """The first `limit` examples of a seeded permutation, in their order in `dataset` (a reproducible
    subset: `--train-limit`, `--test-limit`); the whole of it when `limit` is None or not smaller."""
    if limit is None or limit >= len(dataset.y):
        return dataset
    keep = np.sort(np.random.default_rng(seed).permutation(len(dataset.y))[:limit])
    groups = dataset.groups[keep] if getattr(dataset, "groups", None) is not None else None
    return dataclasses.replace(dataset, x=dataset.x[keep], y=dataset.y[keep],
                               **({"groups": groups} if groups is not None else {}))


def data_root() -> Path:
    """Folder holding local copies of data sets: $EDGEFL_DATA, else $XDG_DATA_HOME/edgefl, else
    ~/.local/share/edgefl."""
    if os.environ.get("EDGEFL_DATA"):
        return Path(os.environ["EDGEFL_DATA"])
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "edgefl"


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    return split


def missing(what: str, path, fix: str) -> ConfigError:
    """The one-line error for data that is not on disk: what, where, and the command that fixes it."""
    return ConfigError(f"{what} not found at {path}; {fix}")


def normalize(x: np.ndarray, mean, std) -> np.ndarray:
    """Per-channel (x - mean) / std in place on a float32 (N, C, H, W) array."""
    x -= np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    x /= np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return x
