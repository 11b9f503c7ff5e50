"""Shakespeare next-character prediction with a LEAF-like natural split, and a pretraining corpus.

Federated data: one client per (play, role) that speaks at least `min_chars` characters (LEAF: 1000);
a sample is `seq_len` characters (LEAF: 80) -> the next one. Each client's text is split in order: the
targets in its last `test_fraction` go to the test split (their context may reach back into the train
part, as LEAF's sample split does). Rows are windows over one token array per split: x is a read-only
strided view (no copy); the few windows that straddle two clients get group -1 and y = IGNORE_INDEX
(torch's cross-entropy default ignore_index), and belong to no client.

Pretraining corpus: the poems (sonnets, Lucrece, ...) plus the plays in PRETRAIN_PLAYS (collaborations
kept out of the federated clients), ~0.65 M characters in the same vocabulary. Same package, no
extra install, and no federated text leaks into pretraining.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgefl.data.base import Dataset, check_split
from edgefl.data.shakespeare import read_works, roles
from edgefl.errors import ConfigError

UNK = "\ufffd"                  # vocab[0]: every character outside the vocabulary
IGNORE_INDEX = -100
PRETRAIN_PLAYS = ("henry_viii", "pericles", "timon_of_athens", "troilus_and_cressida")
_PRINTABLE = set(string.printable) - set("\t\n\r\x0b\x0c")


@dataclass(frozen=True, eq=False)
class Corpus:
    """A long token stream for language-model pretraining."""

    tokens: np.ndarray
    vocab: list[str]
    name: str
    works: list[str]
    plays: tuple[str, ...] = ()     # the works that are plays: what the federated clients must not hold


def build_vocab(texts: Sequence[str]) -> list[str]:
    """[UNK] + the sorted printable ASCII characters that occur in `texts`."""
    seen = set().union(*map(set, texts))
    return [UNK] + sorted(seen & _PRINTABLE)


def encode(text: str, vocab: Sequence[str]) -> np.ndarray:
    """int64 token ids; characters outside `vocab` map to 0 (UNK)."""
    table = np.zeros(128, np.int64)
    for i, char in enumerate(vocab[1:], start=1):
        table[ord(char)] = i
    codes = np.frombuffer(text.encode("utf-32-le"), "<u4")
    return np.where(codes < 128, table[np.minimum(codes, 127)], 0)


def decode(tokens, vocab: Sequence[str]) -> str:
    return "".join(vocab[int(t)] for t in tokens)


def windows(segments: Sequence[np.ndarray], seq_len: int):
    """x (N, seq_len) view, y (N,), groups (N,) over the concatenated segments; row i is
    tokens[i:i+seq_len] -> tokens[i+seq_len], in group g when both lie inside segment g."""
    tokens = np.concatenate([*segments, np.zeros(0, np.int64)])
    n = max(len(tokens) - seq_len, 0)
    x = sliding_window_view(tokens if n else np.zeros(seq_len + 1, np.int64), seq_len)[:n]
    y, groups = tokens[seq_len:].copy(), np.full(n, -1, np.int32)
    start = 0
    for g, segment in enumerate(segments):
        groups[start:start + max(len(segment) - seq_len, 0)] = g
        start += len(segment)
    y[groups < 0] = IGNORE_INDEX
    return x, y, groups


def _vocab(works) -> list[str]:
    return build_vocab([text for speeches in works.plays.values() for _, text in speeches]
                       + list(works.poems.values()))


def _holdout(works, holdout: Optional[Sequence[str]]) -> set[str]:
    if holdout is None:
        return set(PRETRAIN_PLAYS) & set(works.plays)
    unknown = sorted(set(holdout) - set(works.plays))
    if unknown:
        raise ConfigError(f"holdout names unknown plays {unknown}; choose from: {', '.join(sorted(works.plays))}")
    return set(holdout)


def shakespeare(root=None, split: str = "train", seq_len: int = 80, min_chars: int = 1000,
                test_fraction: float = 0.2, holdout: Optional[Sequence[str]] = None) -> Dataset:
    """Next-character windows; groups/group_names ("play/ROLE") give the natural partition.
    `holdout` plays (default PRETRAIN_PLAYS) are kept out for `pretrain_corpus`."""
    check_split(split)
    if seq_len < 1 or min_chars <= seq_len or not 0 < test_fraction < 1:
        raise ConfigError(f"need seq_len >= 1, min_chars > seq_len and 0 < test_fraction < 1; "
                          f"got {seq_len}, {min_chars}, {test_fraction}")
    works = read_works(root)
    vocab, kept = _vocab(works), _holdout(works, holdout)
    names, segments = [], []
    for play in sorted(set(works.plays) - kept):
        for role, text in sorted(roles(works.plays[play]).items()):
            if len(text) < min_chars:
                continue
            tokens = encode(text, vocab)
            cut = seq_len + int((len(tokens) - seq_len) * (1 - test_fraction))
            names.append(f"{play}/{role}")
            segments.append(tokens[:cut] if split == "train" else tokens[cut - seq_len:])
    x, y, groups = windows(segments, seq_len)
    return Dataset(x=x, y=y, classes=len(vocab), name="shakespeare", vocab=vocab,
                   groups=groups, group_names=names)


def pretrain_corpus(root=None, holdout: Optional[Sequence[str]] = None) -> Corpus:
    """The poems and the `holdout` plays' speeches (in order), joined by spaces, as one token array."""
    works = read_works(root)
    vocab, kept = _vocab(works), sorted(_holdout(works, holdout))
    texts = list(works.poems.values()) + [" ".join(t for _, t in works.plays[p]) for p in kept]
    return Corpus(tokens=encode(" ".join(texts), vocab), vocab=vocab, name="shakespeare-pretrain",
                  works=sorted(works.poems) + kept, plays=tuple(kept))
