"""The model a command asked for, from its options: a zoo name and, as the model takes them, a depth, a class
count, a vocabulary, a context length or an input shape. Errors name the option to fix."""
from __future__ import annotations

from typing import Optional

from edgefl.errors import ConfigError
from edgefl.zoo import ModelRef, model_names

IMAGE_MODELS = [m for m in model_names() if m != "transformer"]


def model_ref(name: str, layers: Optional[list[int]] = None, classes: Optional[int] = None,
              vocab: Optional[int] = None, context: Optional[int] = None,
              input_shape: Optional[tuple[int, ...]] = None) -> ModelRef:
    """For the transformer, `layers` is its depth (the first of a list)."""
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
        kwargs["input_shape"] = input_shape
    return ModelRef.of(name, **kwargs)


def check_reads(name: str, data, option: str = "--dataset") -> None:
    """A ConfigError unless model `name` reads what `data` (edgefl.data.Dataset) holds: the transformer token
    windows, every other model images."""
    text = data.x.ndim == 2
    if name == "transformer" and not text:
        raise ConfigError(f"{option} {data.name}: it holds images and the transformer reads text; use --dataset "
                          f"shakespeare with the transformer, or an image model ({', '.join(IMAGE_MODELS)}) on it")
    if name != "transformer" and text:
        raise ConfigError(f"{option} {data.name}: it holds text and {name} reads images; use --model transformer "
                          f"with it, or an image data set with {name}")


def model_for_data(name: str, train, layers: Optional[list[int]] = None, classes: Optional[int] = None,
                   input_shape: Optional[tuple[int, ...]] = None) -> ModelRef:
    """The model `name` sized for a training set (edgefl.data.Dataset): a transformer reads its token windows
    with its vocabulary; another model takes its images' shape and its class count unless given."""
    if name in model_names():
        check_reads(name, train)
    if name == "transformer" and train.x.ndim == 2:
        return model_ref(name, layers, vocab=train.classes, context=train.x.shape[1])
    if name != "transformer":
        if input_shape is None and train.x.ndim == 4:
            input_shape = tuple(train.x.shape[1:])
        if classes is None:
            classes = train.classes
    return model_ref(name, layers, classes, input_shape=input_shape)
