"""Tiny causal transformer language model (CAFF): layers + 2 layers.

Layers: [embedding (token + learned position), block_1 .. block_l (pre-LN, causal), head (final LayerNorm
+ linear to the vocabulary)]. Inputs are token ids (N, T), T <= context; logits are flattened to
(N*T, vocab) and targets are the flattened next tokens. Block widths scale the per-head dimension and
the MLP hidden size (edgefl.zoo.blocks); the widths of the embedding and the head are ignored (they
have no hidden size) but still count in the width vector.

Every boundary from the embedding to the head is a cut point; stages split the blocks into 4 groups
as evenly as possible (fewer if there are fewer blocks). Auxiliary heads: 'linear' is LN + linear per
token; 'conv' (the ProFL output module) has no convolution to borrow: it is one attention-free residual
MLP block per stage still ahead, with that stage's MLP hidden size, then LN + linear.
"""
from __future__ import annotations

import torch
from torch import nn

from edgefl.zoo.base import LayeredModel, full_widths
from edgefl.zoo.blocks import Block, TokenHead, group_ends, transformer_aux


class TokenEmbedding(nn.Module):
    def __init__(self, vocab: int, embed: int, context: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, embed)
        self.pos = nn.Parameter(torch.zeros(1, context, embed))
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        return self.tok(idx) + self.pos[:, : idx.shape[1]]


def transformer_lm(widths=None, input_shape=None, num_classes=None, layers: int = 6, embed: int = 96,
                   heads: int = 3, context: int = 256, vocab: int = 80) -> LayeredModel:
    """input_shape defaults to (context,); num_classes is the vocabulary (give either it or vocab)."""
    if num_classes is not None and vocab not in (80, num_classes):
        raise ValueError(f"num_classes ({num_classes}) and vocab ({vocab}) disagree")
    vocab = num_classes if num_classes is not None else vocab
    input_shape = tuple(input_shape) if input_shape is not None else (context,)
    if len(input_shape) != 1 or not 0 < input_shape[0] <= context:
        raise ValueError(f"input_shape must be (T,) with T <= context={context}, got {input_shape}")
    if layers < 1:
        raise ValueError("a transformer needs at least one block")
    w = full_widths(widths, layers + 2)
    mods: list[nn.Module] = [TokenEmbedding(vocab, embed, context)]
    mods += [Block(embed, heads, w[i], causal=True, context=context, layer=i) for i in range(1, layers + 1)]
    mods.append(TokenHead(embed, vocab, "tokens"))
    stages = group_ends(layers)
    hidden = [getattr(m, "hidden", 0) for m in mods]
    aux = transformer_aux(embed, vocab, "tokens", [1] + stages, hidden, [getattr(m, "mlp_dim", None) for m in mods])
    return LayeredModel(mods, input_shape=input_shape, num_classes=vocab, cut_points=range(1, layers + 2),
                        stages=stages, aux_factory=aux, input_dtype=torch.long)
