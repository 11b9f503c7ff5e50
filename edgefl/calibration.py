"""Per-runtime constants of the cost model, and where each default comes from.

`baseline_bytes` is what importing the runtime and opening a session costs before any model exists.
`workspace_fixed_bytes` is memory the first training step allocates once (kernel libraries, thread
pools, allocator arenas); `workspace_factor` scales the largest per-layer transient (input + output
state, which backward holds as gradients) times the batch. Defaults come from measurements on an x86_64
2-core machine; `edgefl calibrate` fits them from device reports and writes a JSON file that
`load_calibration` reads instead.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from edgefl.errors import ConfigError

MiB = 2**20


@dataclass(frozen=True)
class RuntimeConstants:
    baseline_bytes: int
    workspace_fixed_bytes: int
    workspace_factor: float
    source: str


DEFAULTS: dict[str, RuntimeConstants] = {
    # baseline: RSS right after `import torch` + edgefl in a fresh process; workspace: least-squares fit of
    # measured peak-RSS growth on 158 ResNet/CNN peaks (bench/memory_model.py --fit, 2026-11-22, torch 2.13.0
    # CPU, x86_64, one thread, glibc mmap threshold fixed at 1 MiB); the other models are out of sample
    "torch": RuntimeConstants(228_450_304, 103_854_149, 1.25,
                              "measured import RSS; workspace fitted on measured peaks (bench/memory_model.py)"),
    # onnxruntime-training-cpu 1.19.2 imported through the torch-free shim, session opened
    "ort": RuntimeConstants(52 * MiB, 8 * MiB, 2.0, "measured import RSS; workspace estimate, unmeasured"),
    # executorch 1.5.1 pybindings (they import torch)
    "executorch": RuntimeConstants(356 * MiB, 8 * MiB, 2.0, "measured import RSS; workspace estimate, unmeasured"),
}


def load_calibration(path: str | Path | None = None) -> dict[str, RuntimeConstants]:
    """Defaults, overridden per runtime by a calibration file if one is given."""
    constants = dict(DEFAULTS)
    if path is None:
        return constants
    try:
        data = json.loads(Path(path).read_text())
        for runtime, values in data["runtimes"].items():
            if runtime not in DEFAULTS:
                raise ConfigError(f"{path}: runtimes.{runtime}: unknown runtime; use one of {', '.join(DEFAULTS)}")
            constants[runtime] = RuntimeConstants(**{**asdict(DEFAULTS[runtime]), **values})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a calibration file ({exc}); regenerate it with 'edgefl calibrate'") from None
    return constants
