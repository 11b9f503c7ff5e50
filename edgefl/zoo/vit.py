"""Tiny vision transformer: depth + 2 layers (patch 4, embedding 192, 6 heads, MLP ratio 4 by default).

Layers: [patch embedding (a patch x patch conv, then a cls token and a learned position embedding),
block_1 .. block_depth (pre-LN, bidirectional), head (LayerNorm + linear on the cls token)]. The blocks
are those of the causal LM (edgefl.zoo.blocks) with the same width semantics: per-head dimension and
MLP hidden size scale, the embedding width never does; the widths of the patch embedding and the head
are ignored.

Every boundary from the patch embedding to the head is a cut point; stages split the blocks into 4
groups as evenly as possible. Auxiliary heads mean-pool the tokens instead of reading the cls token
(right after the patch embedding the cls token is the same for every input): 'linear' is LN + mean +
linear; 'conv' (the ProFL output module) is one attention-free residual MLP block per stage still ahead,
then LN + mean + linear.
"""
from __future__ import annotations

import torch
from torch import nn

from edgefl.zoo.base import LayeredModel, full_widths
from edgefl.zoo.blocks import Block, TokenHead, group_ends, transformer_aux


class PatchEmbedding(nn.Module):
    def __init__(self, cin: int, embed: int, patch: int, patches: int):
        super().__init__()
        self.proj = nn.Conv2d(cin, embed, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, embed))
        self.pos = nn.Parameter(torch.zeros(1, patches + 1, embed))
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)                  # (N, patches, embed)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos


def vit(widths=None, input_shape=(3, 32, 32), num_classes: int = 10, depth: int = 6, patch: int = 4,
        embed: int = 192, heads: int = 6, mlp_ratio: int = 4) -> LayeredModel:
    cin, height, width = input_shape
    if height % patch or width % patch:
        raise ValueError(f"input {tuple(input_shape)} is not divisible into {patch}x{patch} patches")
    if depth < 1:
        raise ValueError("a ViT needs at least one block")
    w = full_widths(widths, depth + 2)
    mods: list[nn.Module] = [PatchEmbedding(cin, embed, patch, (height // patch) * (width // patch))]
    mods += [Block(embed, heads, w[i], mlp_ratio, layer=i) for i in range(1, depth + 1)]
    mods.append(TokenHead(embed, num_classes, "cls"))
    stages = group_ends(depth)
    hidden = [getattr(m, "hidden", 0) for m in mods]
    aux = transformer_aux(embed, num_classes, "mean", [1] + stages, hidden, [getattr(m, "mlp_dim", None) for m in mods])
    return LayeredModel(mods, input_shape=input_shape, num_classes=num_classes, cut_points=range(1, depth + 2),
                        stages=stages, aux_factory=aux)
