"""What this device offers edgefl (memory, cores, architecture, which training runtimes are installed), found
without importing any runtime, and the installed edgefl version: `edgefl-device info` prints it, the agent
announces it."""
from __future__ import annotations

import importlib.util
import platform

import psutil

RUNTIME_MODULES = {"ort": "onnxruntime", "executorch": "executorch", "torch": "torch"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def device_info() -> dict:
    from edgefl.device_runtime.native import find_trainer

    mem = psutil.virtual_memory()
    native = find_trainer()
    runtimes = {name: _installed(module) for name, module in RUNTIME_MODULES.items()}
    runtimes["executorch"] = runtimes["executorch"] or native is not None   # the native trainer needs no package
    return {"machine": platform.machine(), "system": platform.system(), "python": platform.python_version(),
            "cpu_count": psutil.cpu_count(logical=True), "ram_bytes": mem.total, "available_bytes": mem.available,
            "runtimes": runtimes, "native_trainer": str(native) if native else None}


def version() -> str:
    """The installed edgefl distribution's version, or why it is unknown."""
    import edgefl

    return edgefl.version() or "unknown (edgefl is not installed; pip install edgefl)"
