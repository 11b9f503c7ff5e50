"""The layered model zoo. Importing this module does not import torch; building a model does.

A model is an ordered list of *layers*, the unit of freezing. Each layer maps a state (a tensor, or a
tuple of tensors where a residual connection spans layers) to the next state. Hidden widths scale per
layer: `widths[i]` scales the hidden size of layer i (for CNNs its output channels; for transformers
the attention and MLP inner sizes); the input channels of the first layer and the number of classes
never scale.
"""
from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from typing import Any

from edgefl.errors import ConfigError

# name -> (module, builder, fixed arguments, description)
_REGISTRY: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "resnet20": ("edgefl.zoo.resnet", "resnet", {"depth": 20}, "CIFAR ResNet-20, 20 conv+BN+ReLU layers"),
    "resnet32": ("edgefl.zoo.resnet", "resnet", {"depth": 32}, "CIFAR ResNet-32"),
    "resnet44": ("edgefl.zoo.resnet", "resnet", {"depth": 44}, "CIFAR ResNet-44"),
    "resnet56": ("edgefl.zoo.resnet", "resnet", {"depth": 56}, "CIFAR ResNet-56"),
    "densenet40": ("edgefl.zoo.densenet", "densenet", {"depth": 40, "growth": 12}, "DenseNet-40, growth 12"),
    "vgg11bn": ("edgefl.zoo.vgg", "vgg11_bn", {}, "VGG-11 with batch norm"),
    "cnn": ("edgefl.zoo.cnn", "cnn", {}, "2-conv CNN (EMNIST-style)"),
    "transformer": ("edgefl.zoo.transformer", "transformer_lm", {}, "tiny causal transformer LM (CAFF)"),
    "vit": ("edgefl.zoo.vit", "vit", {}, "tiny ViT, patch 4, embedding 192, 6 heads"),
}


def model_names() -> list[str]:
    return list(_REGISTRY)


@dataclass(frozen=True)
class ModelRef:
    """A zoo model by name plus its builder arguments (input shape, classes, layers, vocab...).
    Hashable and JSON-serialisable: plans and profile caches key on it."""
    name: str
    kwargs: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def of(cls, name: str, **kwargs) -> "ModelRef":
        if name not in _REGISTRY:
            raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(_REGISTRY)}")
        clean = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items() if v is not None}
        return cls(name, tuple(sorted(clean.items())))

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def to_json(self) -> dict:
        return {"name": self.name, "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.kwargs}}

    @classmethod
    def from_json(cls, data: dict) -> "ModelRef":
        return cls.of(data["name"], **data.get("kwargs", {}))

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.kwargs)
        return f"{self.name}({extra})" if extra else self.name

    def describe(self) -> str:
        """The model for a person to read: 'cnn (1x28x28 input, 10 classes)'; `label` is the exact spelling."""
        words = {"input_shape": lambda v: f"{'x'.join(map(str, v))} input", "num_classes": lambda v: f"{v} classes",
                 "layers": lambda v: f"{v} layers", "vocab": lambda v: f"vocabulary {v}",
                 "context": lambda v: f"context {v}"}
        extra = [words[k](v) if k in words else f"{k} {v}" for k, v in self.kwargs]
        return f"{self.name} ({', '.join(extra)})" if extra else self.name


def build(ref: ModelRef, widths=None):
    """Build the torch model (imports torch). `widths`: one scale per layer, None for full width."""
    module, fn, fixed, _ = _REGISTRY[ref.name]
    builder = getattr(importlib.import_module(module), fn)
    try:
        return builder(widths=widths, **fixed, **ref.args)
    except TypeError as exc:
        raise ConfigError(f"model {ref.name}: {exc}") from None
