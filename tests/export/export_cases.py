"""Shared by the export and trainer-contract tests: small models, configs, seeded global weights, and
which backends are built. Models at the small inputs of tests/zoo_inputs.py (ResNet-20 on 3x8x8, the
transformer LM on 16 tokens) and batch 8 keep every export to about a second."""
import importlib.util
from functools import lru_cache

import pytest
from zoo_inputs import small

BATCH = 8
# pytestmark of every module using the `exported` fixture (tests/conftest.py): one xdist worker exports
EXPORTS = pytest.mark.xdist_group("exports")
RESNET = small("resnet20")
LM = small("transformer")
CNN = small("cnn")          # its trained layers end in a max pool
DENSENET = small("densenet40")   # concatenations, average-pool transitions


def resnet_config(frozen: int, width: float = 1.0, optimizer: str = "sgd"):
    from edgefl.trainconfig import TrainConfig
    head = None if width == 1 else frozen + 1
    return TrainConfig(num_layers=20, frozen_prefix=frozen, head_start=head, head_width=width, batch_size=BATCH,
                       optimizer=optimizer)


def lm_config(frozen: int, optimizer: str = "sgd"):
    from edgefl.trainconfig import TrainConfig
    return TrainConfig(num_layers=8, frozen_prefix=frozen, batch_size=BATCH, optimizer=optimizer)


def densenet_config(frozen: int, width: float = 1.0):
    from edgefl.trainconfig import TrainConfig
    head = None if width == 1 else frozen + 1
    return TrainConfig(num_layers=40, frozen_prefix=frozen, head_start=head, head_width=width, batch_size=BATCH)


def cnn_config(frozen: int):
    from edgefl.trainconfig import TrainConfig
    return TrainConfig(num_layers=4, frozen_prefix=frozen, batch_size=BATCH)


def available(backend: str) -> bool:
    """A backend takes part once its export module, its trainer and their runtime exist (the ExecuTorch
    pair joins by adding its two modules)."""
    from edgefl.device_runtime.trainers.base import _TRAINERS
    from edgefl.export.backends import _BACKENDS
    return all(importlib.util.find_spec(m) is not None
               for m in (_BACKENDS[backend][0], _TRAINERS[backend][0], *_BACKENDS[backend][3]))


def backend_params(names):
    return [pytest.param(n, marks=pytest.mark.skipif(not available(n), reason=f"the {n} backend is not built yet"))
            for n in names]


@lru_cache(maxsize=None)
def global_state(ref):
    """Seeded global weights with non-trivial BN statistics and counters (a fresh model's are 0, 1, 0)."""
    import torch

    from edgefl.zoo import build
    torch.manual_seed(0)
    state = build(ref).state_dict()
    gen = torch.Generator().manual_seed(1)
    for k, v in state.items():
        if k.endswith("running_mean"):
            state[k] = 0.1 * torch.randn(v.shape, generator=gen)
        elif k.endswith("running_var"):
            state[k] = 0.5 + torch.rand(v.shape, generator=gen)
        elif k.endswith("num_batches_tracked"):
            state[k] = torch.tensor(7)
    return state


class ExportCache:
    """Each (backend, model, config) exported once per session under `root`."""

    def __init__(self, root):
        self.root, self.sets = root, {}

    def __call__(self, backend, ref, config):
        from edgefl.export.backends import get_backend
        from edgefl.export.pipeline import export_set
        key = (backend, ref, config)
        if backend == "executorch" and not self.sets.get("native"):
            # the Python ExecuTorch trainer runs convolutions on edgefl's kernels (libedgefl_et_kernels.so,
            # built with the native trainer), as devices do; without them on ExecuTorch's direct loops
            from edgefl.device_runtime import native
            self.sets["native"] = native.build()
        if key not in self.sets:
            self.sets[key] = export_set(ref, config, global_state(ref), get_backend(backend),
                                        self.root / f"{backend}-{ref.name}-{config.hash()}")
        return self.sets[key]
