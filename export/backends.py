"""Export backends by name. Each lives in its own module, imported only when asked for, so a missing
runtime fails with its install hint and the other backends keep working."""
from __future__ import annotations

import importlib

from edgefl.errors import ConfigError, require

# name -> (module, class, the pip extra that installs what it needs, modules it needs)
_BACKENDS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "ort": ("edgefl.export.ort_backend", "OrtBackend", "ort", ("onnx", "onnxruntime", "torch")),
    "executorch": ("edgefl.export.executorch_backend", "ExecuTorchBackend", "executorch", ("executorch", "torch")),
    "torch": ("edgefl.export.torch_backend", "TorchBackend", "torch", ("torch",)),
}


def backend_names() -> list[str]:
    return list(_BACKENDS)


def backend_modules(name: str) -> tuple[str, ...]:
    """The backend's module and the modules it needs: all importable is the backend installed."""
    module, _, _, needs = _BACKENDS[name]
    return (module, *needs)


def register_backend(name: str, module: str, cls: str, extra: str, needs: tuple[str, ...] = ()) -> None:
    _BACKENDS[name] = (module, cls, extra, needs)


def get_backend(name: str):
    """An instance of the backend `name`; ConfigError for an unknown name, the install hint when its
    runtime is missing."""
    if name not in _BACKENDS:
        raise ConfigError(f"--backend: unknown backend {name!r}; choose one of: {', '.join(_BACKENDS)}")
    module, cls, extra, needs = _BACKENDS[name]
    for dependency in needs:
        require(dependency, extra)
    try:
        return getattr(importlib.import_module(module), cls)()
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ConfigError(f"--backend {name}: this installation of edgefl has no {name} backend ({module})") from None
