"""What one configuration costs: `edgefl profile`'s answer. The model's profile at the configuration's widths,
the cost model's prediction on a runtime and, where asked, what the torch runtime really uses on this machine
(edgefl.cost.measure)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgefl.cost.constants import load_calibration
from edgefl.cost.model import Cost, cost
from edgefl.cost.profile import ModelProfile
from edgefl.cost.profile_store import ProfileStore
from edgefl.errors import ConfigError
from edgefl.trainconfig import TrainConfig
from edgefl.zoo import ModelRef


@dataclass
class Breakdown:
    model: ModelRef
    config: TrainConfig
    runtime: str
    profile: ModelProfile
    predicted: Cost
    measured: Optional[dict] = None     # peak and activation bytes measured here (torch)

    def to_json(self) -> dict:
        out = {"model": self.model.to_json(), "config": self.config.to_json(), "runtime": self.runtime,
               "predicted": self.predicted.to_json(), "layers": [layer.__dict__ for layer in self.profile.layers]}
        if self.measured is not None:
            out["measured"] = self.measured
        return out


def breakdown(model: ModelRef, *, frozen_prefix: int = 0, head_width: float = 1.0, head_start: Optional[int] = None,
              batch_size: int = 32, optimizer: str = "sgd", runtime: str = "torch",
              calibration: Optional[Path] = None, measure: bool = False) -> Breakdown:
    """The cost of training `model` with its first `frozen_prefix` layers frozen and the layers from
    `head_start` (default: right after the first trained layer) at `head_width`."""
    constants = load_calibration(calibration)
    if runtime not in constants:
        raise ConfigError(f"--runtime: unknown runtime {runtime!r}; choose one of {', '.join(constants)}")
    store = ProfileStore()
    layers = store.full(model).num_layers
    if frozen_prefix >= layers:
        raise ConfigError(f"--frozen-prefix: {model.label()} has {layers} layers; freeze at most {layers - 1}")
    if head_width < 1 and head_start is None:
        head_start = min(frozen_prefix + 1, layers - 1)
    try:
        config = TrainConfig(num_layers=layers, frozen_prefix=frozen_prefix, head_start=head_start,
                             head_width=head_width, batch_size=batch_size, optimizer=optimizer)
    except ValueError as exc:
        raise ConfigError(f"profile options: {exc}") from None
    profile = store.profile(model, None if head_width == 1 else config.widths)
    result = Breakdown(model, config, runtime, profile, cost(profile, config, runtime, constants=constants[runtime]))
    if measure:
        if runtime != "torch":
            raise ConfigError("--measure: only the torch runtime is measured in-process; use --runtime torch")
        from edgefl.cost.measure import measure_activation_bytes, measure_peak

        result.measured = dict(measure_peak(model, config, runtime))
        result.measured["activation_bytes"] = measure_activation_bytes(model, config)
    return result
