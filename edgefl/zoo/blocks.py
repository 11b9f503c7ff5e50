"""Transformer pieces shared by the causal LM and the ViT, written to export cleanly (RUNTIME_NOTES):
three q/k/v linears (no chunk/split), softmax attention written out (no SDPA), causal mask as a buffer.

Width s of a block scales its per-head dimension, floor(s * embed/heads), and its MLP hidden size,
floor(s * ratio * embed), never the residual width `embed`, so any width vector composes. The q/k/v
outputs are laid out dimension-major (index d * heads + h), so a narrower head dimension keeps a prefix
of every weight's rows or columns, like the channels of the CNNs. Channel spaces (edgefl.zoo.spaces):
block i's per-head dimension 'L<i>.head' (q/k/v rows and proj columns, inner = heads) and its MLP hidden
'L<i>.mlp'; the residual width is never sliced.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from edgefl.zoo.base import scaled, stages_ahead
from edgefl.zoo.spaces import Dim, seg, tag


class Attention(nn.Module):
    def __init__(self, embed: int, heads: int, head_dim: int, causal: bool = False, context: int = 0):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.q = nn.Linear(embed, heads * head_dim)
        self.k = nn.Linear(embed, heads * head_dim)
        self.v = nn.Linear(embed, heads * head_dim)
        self.proj = nn.Linear(heads * head_dim, embed)
        self.causal = causal
        if causal:  # -inf above the diagonal: position t attends to positions <= t
            self.register_buffer("mask", torch.full((context, context), float("-inf")).triu(1), persistent=False)

    def _split(self, x, n: int, t: int):
        return x.reshape(n, t, self.head_dim, self.heads).permute(0, 3, 1, 2)   # (n, heads, t, head_dim)

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self._split(self.q(x), n, t), self._split(self.k(x), n, t), self._split(self.v(x), n, t)
        att = torch.matmul(q, k.transpose(2, 3)) * self.scale
        if self.causal:
            att = att + self.mask[:t, :t]
        y = torch.matmul(torch.softmax(att, dim=-1), v)                            # (n, heads, t, head_dim)
        return self.proj(y.permute(0, 2, 3, 1).reshape(n, t, self.heads * self.head_dim))


class MLP(nn.Sequential):
    def __init__(self, embed: int, hidden: int, dim: Dim | None = None):
        super().__init__(tag(nn.Linear(embed, hidden), dim), nn.GELU(approximate="tanh"),
                         tag(nn.Linear(hidden, embed), None, dim))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x)). `layer`: its index in the model,
    naming its channel spaces (untagged when None)."""
    def __init__(self, embed: int, heads: int, width: float = 1.0, mlp_ratio: int = 4, causal: bool = False,
                 context: int = 0, layer: int | None = None):
        super().__init__()
        if embed % heads:
            raise ValueError(f"embedding {embed} is not divisible by {heads} heads")
        self.ln1 = nn.LayerNorm(embed)
        self.attn = Attention(embed, heads, scaled(embed // heads, width), causal, context)
        self.ln2 = nn.LayerNorm(embed)
        self.mlp_dim = None if layer is None else seg(f"L{layer}.mlp", mlp_ratio * embed, layer)
        self.mlp = MLP(embed, scaled(mlp_ratio * embed, width), self.mlp_dim)
        if layer is not None:
            head = seg(f"L{layer}.head", embed // heads, layer, inner=heads)     # index d * heads + h
            for proj in (self.attn.q, self.attn.k, self.attn.v):
                tag(proj, head)
            tag(self.attn.proj, None, head)

    @property
    def hidden(self) -> int:
        return self.mlp[0].out_features

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MLPBlock(nn.Module):
    """The attention-free half of a block, x + mlp(LN(x)): one per stage in a transformer's output module."""
    def __init__(self, embed: int, hidden: int, dim: Dim | None = None):
        super().__init__()
        self.ln = nn.LayerNorm(embed)
        self.mlp = MLP(embed, hidden, dim)

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class TokenHead(nn.Module):
    """LayerNorm + linear. pool: 'tokens' -> logits per token flattened to (N*T, classes) (LM);
    'cls' -> token 0; 'mean' -> mean over tokens."""
    def __init__(self, embed: int, classes: int, pool: str):
        super().__init__()
        if pool not in ("tokens", "cls", "mean"):
            raise ValueError(f"unknown pooling {pool!r}")
        self.pool = pool
        self.ln = nn.LayerNorm(embed)
        self.fc = nn.Linear(embed, classes)

    def forward(self, x):
        x = self.ln(x)
        if self.pool == "cls":
            x = x[:, 0]
        elif self.pool == "mean":
            x = x.mean(dim=1)
        logits = self.fc(x)
        return logits.reshape(-1, logits.shape[-1]) if self.pool == "tokens" else logits


def group_ends(blocks: int, groups: int = 4, first: int = 1) -> list[int]:
    """Boundaries ending `groups` (fewer if there are fewer blocks) groups of consecutive blocks as even
    as possible, larger groups first; the blocks occupy layers first .. first + blocks - 1."""
    groups = min(groups, blocks)
    ends, end = [], first
    for g in range(groups):
        end += blocks // groups + (g < blocks % groups)
        ends.append(end)
    return ends


def transformer_aux(embed: int, classes: int, pool: str, stages: Sequence[int], hidden: Sequence[int],
                    dims: Sequence[Dim | None] | None = None):
    """aux_factory for a [embedding, blocks..., head] model. 'linear': the head alone (LN + linear);
    'conv': one MLPBlock per stage still ahead (hidden size of that stage's last block), then the head.
    `stages` starts with the embedding's boundary 1; hidden[i] is the MLP hidden size of layer i and
    dims[i] its channel space."""
    dims = [None] * len(hidden) if dims is None else dims

    def aux(boundary: int, kind: str) -> nn.Module:
        if kind == "linear":
            return TokenHead(embed, classes, pool)
        if kind == "conv":
            mods = [MLPBlock(embed, hidden[end - 1], dims[end - 1]) for _, end in stages_ahead(stages, boundary)]
            return nn.Sequential(*mods, TokenHead(embed, classes, pool))
        raise ValueError(f"unknown auxiliary head kind {kind!r}")
    return aux
