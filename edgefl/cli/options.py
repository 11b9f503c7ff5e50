"""Turning command-line strings into typed values, with one-line errors naming the option."""
from __future__ import annotations

from typing import Optional

from edgefl.errors import ConfigError
from edgefl.zoo import ModelRef, model_names


def parse_int_list(text: Optional[str], option: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option}: expected integers separated by commas, e.g. 3,6,9,12 (got {text!r})") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{option}: expected positive integers, e.g. 3,6,9,12 (got {text!r})")
    return values


def parse_shape(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    shape = parse_int_list(text.replace("x", ","), "--input-shape")
    if len(shape) != 3:
        raise ConfigError(f"--input-shape: expected channels,height,width, e.g. 1,28,28 (got {text!r})")
    return tuple(shape)


def model_ref(name: str, layers: Optional[list[int]] = None, classes: Optional[int] = None,
              vocab: Optional[int] = None, context: Optional[int] = None,
              input_shape: Optional[str] = None) -> ModelRef:
    """The model a command asked for. For the transformer, `layers` is its depth (the first of a list)."""
    if name not in model_names():
        raise ConfigError(f"--model: unknown model {name!r}; choose one of: {', '.join(model_names())}")
    kwargs = {}
    if name == "transformer":
        kwargs = {"layers": layers[0] if layers else None, "vocab": vocab, "context": context}
        if classes is not None:
            raise ConfigError("--classes: the transformer predicts its vocabulary; use --vocab instead")
        if input_shape is not None:
            raise ConfigError("--input-shape: the transformer reads token sequences; use --context instead")
    else:
        for flag, value in (("--layers", layers), ("--vocab", vocab), ("--context", context)):
            if value is not None:
                raise ConfigError(f"{flag}: only the transformer takes it; drop it for --model {name}")
        kwargs["num_classes"] = classes
        kwargs["input_shape"] = parse_shape(input_shape)
    return ModelRef.of(name, **kwargs)
