"""Split a device model at its frozen prefix: the modules every backend exports (imports torch).

`split(ref, config, global_state, indices)` builds the device model (edgefl.server.submodel.device_model: the
config's widths, layers [0, end), the auxiliary head as `aux`), loads the device's slice of the global
state (edgefl.server.submodel.extract) and returns

* `prefix`: layers [0, frozen_prefix) in eval mode with requires_grad off, `prefix(x)` -> boundary
  state; None when nothing is frozen;
* `suffix`: layers [frozen_prefix, end) and the head in train mode, `suffix(*features, labels)` ->
  (mean cross-entropy, logits flattened to (rows, classes)); parameters it holds but never trains (a
  low-rank config's base weights) have requires_grad off. Its state_dict keys are the device model's
  ('layers.<i>.*' under the model's own layer index, 'aux.*'), so `names` (device key -> global key,
  from edgefl.server.submodel.entries) maps them to global names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.server.submodel import IndexSets, device_model, entries, extract
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef


class Prefix(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Suffix(nn.Module):
    def __init__(self, layers: Mapping[int, nn.Module], aux: Optional[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): layer for i, layer in layers.items()})
        if aux is not None:
            self.aux = aux

    def forward(self, *inputs):
        *features, labels = inputs
        state = features[0] if len(features) == 1 else tuple(features)
        for layer in self.layers.values():
            state = layer(state)
        logits = self.aux(state) if hasattr(self, "aux") else state
        logits = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(logits, labels), logits


@dataclass
class Split:
    prefix: Optional[Prefix]
    suffix: Suffix
    names: dict[str, str]                  # suffix / prefix state_dict key -> global name
    input_example: torch.Tensor            # a model input batch at the config's batch size
    labels_example: torch.Tensor
    model: nn.Module                       # the whole device model (shares the modules above)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.prefix is None:
            return (x,)
        with torch.no_grad():
            out = self.prefix(x)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    @property
    def suffix_example(self) -> tuple[torch.Tensor, ...]:
        return (*self.features(self.input_example), self.labels_example)


def split(ref: ModelRef, config: TrainConfig, global_state: Mapping[str, torch.Tensor], indices: IndexSets,
          seed: int = 0) -> Split:
    model = device_model(ref, config, indices)
    model.load_state_dict(extract(global_state, ref, config, indices), strict=True)
    for name, p in model.named_parameters():      # LoRA's base weights: inside trained layers, never trained
        p.requires_grad_(name not in getattr(model, "frozen_tensors", ()))
    a = config.frozen_prefix
    layers = list(model.layers)
    prefix = Prefix(layers[:a]).eval().requires_grad_(False) if a else None
    suffix = Suffix({i: layers[i] for i in range(a, config.end)}, getattr(model, "aux", None)).train()
    names = {e.device_key: e.key for e in entries(ref, config)}
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, model.num_classes, (config.batch_size, *model.input_shape), generator=gen)
         if model.input_dtype == torch.long else torch.randn(config.batch_size, *model.input_shape, generator=gen))
    with torch.no_grad():
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        probe = model(x[:1])
        probe = model.aux(probe) if getattr(model, "aux", None) is not None else probe
        for m, training in modes:
            m.training = training
    rows = probe.reshape(-1, probe.shape[-1]).shape[0]
    labels = torch.randint(0, probe.shape[-1], (config.batch_size * rows,), generator=gen)
    return Split(prefix, suffix, names, x, labels, model)
