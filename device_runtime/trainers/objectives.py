"""Per-batch objectives: what a method changes in local training, as small overrides of cross-entropy.

The trainer's loop (TorchTrainer.train) is the same for every method; it asks its objective to
`attach` modules to the device model before the weights load (DepthFL's exits), for `heads` (device
prefix -> global prefix of every head it trains), to `prepare` extra trainable parameters once the
weights are in (m-FeDepth's peer copy), for each batch's `loss`, and at the end for `metrics`.
The instruction's options choose the objective (`objective_for`):

* `output_layer_only`: ProFL. Only the auxiliary head's last module (the output module's linear layer)
  trains and is uploaded; the head's convolutions run frozen.
* `exits` (+ `distill`): DepthFL. A classifier at each exit boundary the device holds plus the one at its
  depth; loss = sum of their cross-entropies + distill / (n - 1) * sum over ordered pairs i != j of
  KL(p_j || p_i), p_j held fixed (self-distillation between exits, temperature 1).
* `fjord_widths`: FjORD ordered dropout. Each batch samples p uniformly from the widths and trains the
  prefix submodel of width p: the narrow model runs on slices of the device's own tensors
  (torch.func.functional_call), so gradients land in the first floor(p*M) channels; the upload is the
  full s_e model.
* `mutual` (M, + `mutual_noise`): m-FeDepth mutual knowledge distillation (FeDepth eq. for M models,
  Zhang et al. 2018). M - 1 peers of the trained part start from the downloaded weights plus seeded
  Gaussian noise (mutual_noise x each tensor's std), the only source of diversity when every copy
  starts from the same global model; copy m minimises CE_m + 1/(M-1) sum_{m' != m} KL(h^{m'} || h^m),
  peers' predictions held fixed. The frozen prefix runs once and is held once for all copies; only copy 1
  is uploaded.
"""
from __future__ import annotations

import copy
from collections import Counter
from typing import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.trainconfig import TrainConfig, aux_key, output_layer


def _flat(out: torch.Tensor) -> torch.Tensor:
    return out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out


def _kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per sample, the teacher's prediction held fixed."""
    return F.kl_div(F.log_softmax(student, -1), F.softmax(teacher.detach(), -1), reduction="batchmean")


class Objective:
    """Cross-entropy of the config's output (its auxiliary head, or the model's own)."""

    def __init__(self, options: Mapping, trainer, seed: int):
        self.options, self.trainer, self.seed = options, trainer, seed

    def attach(self, model: nn.Module, config: TrainConfig) -> None:
        """Add modules the objective trains, before the weights load."""

    def heads(self, config: TrainConfig) -> dict[str, str]:
        return {"aux.": config.aux_prefix} if config.aux_head is not None else {}

    def trains(self, names: list[str]) -> list[str]:
        """Of the tensors the config trains, those the device trains and uploads: with `output_layer_only`,
        its auxiliary head's last module alone (ProFL's output layer, ProFL sec. 4.1)."""
        return output_layer(names) if self.options.get("output_layer_only") else names

    def prepare(self, model: nn.Module, config: TrainConfig) -> list:
        """Trainable parameters outside the model (after the weights loaded and requires_grad is set)."""
        return []

    def modules(self, model: nn.Module) -> list[nn.Module]:
        """Everything holding weights, so that memory measurement can leave them out."""
        return [model]

    def loss(self, model, config: TrainConfig, x, y) -> torch.Tensor:
        return F.cross_entropy(self.trainer.logits(model, config, x), y)

    def metrics(self) -> dict:
        return {}


class SelfDistillation(Objective):
    """DepthFL: exits at the boundaries it holds, cross-entropy at each, KL between them."""

    def attach(self, model, config):
        self.exits = tuple(sorted(b for b in self.options["exits"] if config.frozen_prefix < b < config.end))
        self.weight = float(self.options.get("distill", 1.0))
        model.exits = nn.ModuleDict({str(b): model.aux_head(b, "linear") for b in self.exits})

    def heads(self, config):
        return {**super().heads(config), **{f"exits.{b}.": aux_key(b, "linear") for b in self.exits}}

    def outputs(self, model, config, x) -> list[torch.Tensor]:
        """Logits of every exit, shallow to deep; the layers run once."""
        a = config.frozen_prefix
        with torch.no_grad():
            state = model(x, 0, a)
        outs = []
        for b in (*self.exits, config.end):
            state, a = model(state, a, b), b
            head = model.exits[str(b)] if b < config.end else (model.aux if config.aux_head else None)
            outs.append(_flat(head(state) if head is not None else state))
        return outs

    def loss(self, model, config, x, y):
        outs = self.outputs(model, config, x)
        loss = sum(F.cross_entropy(o, y) for o in outs)
        if len(outs) > 1 and self.weight:
            kl = sum(_kl(outs[i], outs[j]) for i in range(len(outs)) for j in range(len(outs)) if i != j)
            loss = loss + self.weight * kl / (len(outs) - 1)
        return loss

    def metrics(self):
        return {"exits": [*self.exits]}


class OrderedDropout(Objective):
    """FjORD: each batch trains the prefix submodel of a width p sampled uniformly from the widths."""

    def attach(self, model, config):
        if config.frozen_prefix or config.aux_head is not None:
            raise ValueError("ordered dropout trains a whole width-scaled model (no frozen prefix, no auxiliary head)")
        self.widths = tuple(sorted(float(p) for p in self.options["fjord_widths"]))
        self.rng = np.random.default_rng(self.seed)
        self.narrow: dict[float, tuple] = {}
        self.counts: Counter = Counter()

    def loss(self, model, config, x, y):
        p = self.widths[self.rng.integers(len(self.widths))]
        self.counts[p] += 1
        if p >= config.head_width:
            return super().loss(model, config, x, y)
        if p not in self.narrow:
            small, index = self.trainer.narrow(config, p)
            self.narrow[p] = (small.to(self.trainer.device).train(), index)
        small, index = self.narrow[p]
        own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        sliced = {k: own[k] if ix is None else own[k][ix] for k, ix in index.items()}
        out = torch.func.functional_call(small, sliced, (x, 0, config.end))
        with torch.no_grad():  # BN statistics updated on a copy (non-contiguous index) go back in place
            for k, _ in model.named_buffers():
                ix = index[k]
                if ix is not None and not all(isinstance(i, slice) for i in ix):
                    own[k][ix] = sliced[k]
        return F.cross_entropy(_flat(out), y)

    def metrics(self):
        return {"fjord_widths": {f"{p:g}": n for p, n in sorted(self.counts.items())}}


class MutualLearning(Objective):
    """m-FeDepth: M copies of the trained part learn from each other; copy 1 is uploaded."""

    def prepare(self, model, config):
        copies = int(self.options["mutual"])
        noise = float(self.options.get("mutual_noise", 0.01))
        gen = torch.Generator().manual_seed(self.seed)
        # peers share the frozen prefix (it runs once for all copies): only the trained part is copied
        self.peers = [copy.deepcopy(model, {id(layer): layer for layer in model.layers[:config.frozen_prefix]})
                      for _ in range(copies - 1)]
        params = []
        for peer in self.peers:
            for p in peer.parameters():
                if p.requires_grad:
                    with torch.no_grad():
                        std = float(p.std()) if p.numel() > 1 else float(p.abs())
                        p.add_(torch.randn(p.shape, generator=gen).to(p.device) * noise * std)
                    params.append(p)
        return params

    def modules(self, model):
        return [model, *self.peers]

    def loss(self, model, config, x, y):
        a = config.frozen_prefix
        with torch.no_grad():
            state = model(x, 0, a)
        outs = []
        for m in (model, *self.peers):
            out = m(state, a, config.end)
            outs.append(_flat(m.aux(out) if config.aux_head is not None else out))
        M = len(outs)
        total = 0.0
        for i, o in enumerate(outs):
            total = total + F.cross_entropy(o, y)
            if M > 1:
                total = total + sum(_kl(o, t) for j, t in enumerate(outs) if j != i) / (M - 1)
        # reads as the mean over copies; differentiates as the sum, so each copy gets exactly the gradient
        # of its own objective (as if trained alone with its peers' predictions fixed)
        return total + (total / M - total).detach()

    def metrics(self):
        return {"mutual_copies": 1 + len(self.peers)}


def objective_for(options: Mapping, trainer, seed: int) -> Objective:
    """The objective the instruction's options ask for; cross-entropy when none does."""
    if options.get("exits"):
        return SelfDistillation(options, trainer, seed)
    if options.get("fjord_widths"):
        return OrderedDropout(options, trainer, seed)
    if int(options.get("mutual", 1)) > 1:
        return MutualLearning(options, trainer, seed)
    return Objective(options, trainer, seed)
