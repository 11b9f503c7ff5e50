"""Small inputs that keep per-model sweeps fast (VGG needs 32x32: five 2x2 poolings)."""
from edgefl.zoo import ModelRef

SMALL_INPUTS = {"resnet20": dict(input_shape=(3, 8, 8)), "resnet32": dict(input_shape=(3, 8, 8)),
                "resnet44": dict(input_shape=(3, 8, 8)), "resnet56": dict(input_shape=(3, 8, 8)),
                "densenet40": dict(input_shape=(3, 8, 8)), "vgg11bn": {}, "cnn": dict(input_shape=(1, 8, 8)),
                "transformer": dict(context=16), "vit": dict(input_shape=(3, 8, 8))}


def small(name: str) -> ModelRef:
    return ModelRef.of(name, **SMALL_INPUTS[name])
