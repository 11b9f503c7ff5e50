"""A model's global weights, as a command is given them: a state dict saved by `edgefl emulate` (weights.pt),
an .npz of global tensors, or a seeded fresh model; checked against the model's tensors (imports torch)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from edgefl.errors import ConfigError
from edgefl.zoo import ModelRef, build


def load_weights(path: Optional[Path], ref: ModelRef, seed: int) -> dict:
    """Global tensors by name: from `path` (.pt state dict or .npz), or a seeded fresh model."""
    torch.manual_seed(seed)
    expected = build(ref).state_dict()
    if path is None:
        return expected
    try:
        if path.suffix == ".npz":
            with np.load(path) as data:
                state = {k: torch.from_numpy(np.array(data[k])) for k in data.files}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"--weights {path}: cannot read it ({str(exc).splitlines()[0]}); give a weights.pt "
                          "written by 'edgefl emulate' or an .npz of global tensors") from None
    if not isinstance(state, dict):
        raise ConfigError(f"--weights {path}: not a state dict")
    for key, t in expected.items():
        if key not in state:
            raise ConfigError(f"--weights {path}: no tensor {key!r}; these weights are not for {ref.label()}")
        if tuple(state[key].shape) != tuple(t.shape):
            raise ConfigError(f"--weights {path}: {key} has shape {tuple(state[key].shape)}, {ref.label()} needs "
                              f"{tuple(t.shape)}")
    return state
