"""Split a data set over clients: seeded, deterministic, pure numpy.

Every partitioner returns one sorted int64 index array per client; the arrays are disjoint and cover
all examples (natural: all examples that belong to a client).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from edgefl.errors import ConfigError

PARTITIONS = "iid | dirichlet:ALPHA (e.g. dirichlet:0.1) | shards:LABELS_PER_CLIENT (e.g. shards:2) | natural"


def _check_clients(n: int, clients: int, least: int = 1) -> None:
    if clients < 1 or clients * least > n:
        raise ConfigError(f"cannot give {clients} clients >= {least} examples each out of {n}; use fewer clients")


def iid(n_examples: int, clients: int, seed: int, sizes: Optional[Sequence[Optional[int]]] = None) -> list[np.ndarray]:
    """A uniform random split into near-equal parts (sizes differ by at most one). With `sizes` (one per client,
    None where unset), client i gets sizes[i] examples where set and the clients without one split the rest
    near-equally (examples left over when every client has a size are in no part)."""
    _check_clients(n_examples, clients)
    order = np.random.default_rng(seed).permutation(n_examples)
    if sizes is None:
        return [np.sort(part) for part in np.array_split(order, clients)]
    given = sum(n for n in sizes if n)
    if given > n_examples:
        raise ConfigError(f"the clients' sizes add up to {given:,} examples, more than the {n_examples:,} there are")
    free = [i for i, n in enumerate(sizes) if not n]
    if free:
        _check_clients(n_examples - given, len(free))
    ends = np.cumsum([n or 0 for n in sizes])
    parts = [order[end - (n or 0):end] for n, end in zip(sizes, ends, strict=True)]
    for i, rest in zip(free, np.array_split(order[given:], max(len(free), 1))[:len(free)], strict=True):
        parts[i] = rest
    return [np.sort(part) for part in parts]


def dirichlet(labels, clients: int, alpha: float, seed: int, min_size: int = 10,
              max_tries: int = 100) -> list[np.ndarray]:
    """Label skew: each class is spread over clients with proportions ~ Dir(alpha) (small alpha: few
    classes per client). As NIID-bench/FedLab: clients already holding n/clients examples get no more of
    the next class, and the whole draw is repeated until every client has >= min_size examples; after
    max_tries draws (tiny alpha, many clients) the last draw is fixed up by moving random examples from
    the largest clients to the short ones."""
    labels = np.asarray(labels)
    if not alpha > 0:
        raise ConfigError(f"dirichlet alpha must be > 0, got {alpha}; e.g. dirichlet:0.5")
    _check_clients(len(labels), clients, min_size)
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == k) for k in np.unique(labels)]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        sizes = np.zeros(clients, np.int64)
        for members in by_class:
            members = rng.permutation(members)
            share = rng.dirichlet(np.full(clients, float(alpha))) * (sizes < len(labels) / clients)
            share = share / share.sum() if share.sum() > 0 else np.full(clients, 1 / clients)
            cuts = (np.cumsum(share) * len(members)).astype(np.int64)[:-1]
            for client, piece in enumerate(np.split(members, cuts)):
                parts[client].append(piece)
                sizes[client] += len(piece)
        if sizes.min() >= min_size:
            break
    out = [np.concatenate(p).astype(np.int64) for p in parts]
    for short in np.flatnonzero(sizes < min_size):
        while len(out[short]) < min_size:          # the largest client always has > min_size to spare
            donor = int(np.argmax([len(p) for p in out]))
            take = rng.choice(len(out[donor]), min(min_size - len(out[short]), len(out[donor]) - min_size),
                              replace=False)
            out[short] = np.concatenate([out[short], out[donor][take]])
            out[donor] = np.delete(out[donor], take)
    return [np.sort(p) for p in out]


def shards(labels, clients: int, labels_per_client: int, seed: int) -> list[np.ndarray]:
    """Pathological non-IID (McMahan et al. 2017): sort by label, cut clients*labels_per_client shards,
    deal each client labels_per_client of them. Shards never straddle two labels when there are at least
    as many shards as labels (shard counts per label proportional to its size), so a client then sees
    <= labels_per_client labels; with fewer shards than labels, shards are contiguous runs of labels."""
    labels = np.asarray(labels)
    n_shards = clients * labels_per_client
    if labels_per_client < 1:
        raise ConfigError(f"shards needs >= 1 label per client, got {labels_per_client}; e.g. shards:2")
    _check_clients(len(labels), n_shards)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    values, counts = np.unique(labels, return_counts=True)
    if n_shards < len(values):
        pieces = np.array_split(order, n_shards)
    else:
        quota = n_shards * counts / len(labels)
        alloc = np.minimum(np.maximum(np.floor(quota), 1), counts).astype(np.int64)
        while alloc.sum() < n_shards:
            alloc[np.argmax(np.where(alloc < counts, quota - alloc, -np.inf))] += 1
        while alloc.sum() > n_shards:
            alloc[np.argmax(np.where(alloc > 1, alloc - quota, -np.inf))] -= 1
        runs = np.split(order, np.cumsum(counts)[:-1])
        pieces = [p for run, k in zip(runs, alloc, strict=True) for p in np.array_split(run, k)]
    dealt = rng.permutation(n_shards).reshape(clients, labels_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])).astype(np.int64) for row in dealt]


def natural(groups) -> list[np.ndarray]:
    """One index array per natural client id (>= 0) in `groups`, in id order; rows with id < 0 are left out."""
    groups = np.asarray(groups)
    order = np.argsort(groups, kind="stable")
    order = order[groups[order] >= 0]
    ids, starts = np.unique(groups[order], return_index=True)
    return [part.astype(np.int64) for part in np.split(order, starts[1:])] if len(ids) else []


@dataclass(frozen=True)
class Partition:
    """A parsed partition spec; `split` applies it."""

    kind: str
    value: Optional[float] = None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"

    def split(self, labels, clients: int, seed: int, groups=None,
              sizes: Optional[Sequence[Optional[int]]] = None) -> list[np.ndarray]:
        """Index arrays per client. `natural` uses `groups` (e.g. Dataset.groups) and ignores `clients`:
        it returns every natural client. `sizes`: iid's examples per client (see `iid`); the other partitions
        size their clients themselves."""
        if self.kind == "natural":
            if groups is None:
                raise ConfigError("partition 'natural' needs a data set with natural clients (shakespeare); "
                                  f"use one of: {PARTITIONS}")
            return natural(groups)
        if self.kind == "iid":
            return iid(len(labels), clients, seed, sizes)
        if self.kind == "dirichlet":
            return dirichlet(labels, clients, self.value, seed)
        return shards(labels, clients, int(self.value), seed)


def parse_partition(spec: str) -> Partition:
    """'iid' | 'dirichlet:0.1' | 'shards:2' | 'natural' -> Partition; anything else is a ConfigError."""
    kind, _, arg = str(spec).strip().lower().partition(":")
    try:
        if kind in ("iid", "natural") and not arg:
            return Partition(kind)
        if kind == "dirichlet" and float(arg) > 0 and np.isfinite(float(arg)):
            return Partition(kind, float(arg))
        if kind == "shards" and arg.isdigit() and int(arg) >= 1:
            return Partition(kind, int(arg))
    except ValueError:
        pass
    raise ConfigError(f"bad partition {spec!r}; use {PARTITIONS}")
