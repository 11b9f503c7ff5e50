"""Import ONNX Runtime's on-device training API without torch (or onnx).

`import onnxruntime.training` runs the package's __init__, which imports its torch-based parts (amp,
optim, ortmodule) and onnx: ~340 MB of RSS on a device that needs ~60 MB. Even `import onnxruntime`
does it: its build validation tries `onnxruntime.training.ortmodule`. The training API
(`onnxruntime.training.api`: CheckpointState, Module, Optimizer) needs only the native module and
numpy. So `training_api()`, before onnxruntime is imported, registers `onnxruntime.training` as a bare
package whose __path__ is the installed folder (its __init__ never runs) and blocks
`onnxruntime.training.ortmodule`; then it imports `onnxruntime.training.api` from there. A process that
imported the full package first keeps it.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

from edgefl.errors import MissingDependencyError, require

_PACKAGE = "onnxruntime.training"
_HINT = "install it with: pip install 'edgefl[ort]' (onnxruntime-training-cpu, never together with plain onnxruntime)"


def _register_bare_package() -> None:
    root = importlib.util.find_spec("onnxruntime")          # finds the top-level package without importing it
    if root is None or not root.submodule_search_locations:
        require("onnxruntime", "ort")                      # raises the install hint
    folder = os.path.join(list(root.submodule_search_locations)[0], "training")
    if not os.path.isfile(os.path.join(folder, "api", "__init__.py")):
        raise MissingDependencyError(f"the installed onnxruntime has no training API (plain onnxruntime); {_HINT}")
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [folder]
    package.__file__ = os.path.join(folder, "__init__.py")
    package.__package__ = _PACKAGE
    sys.modules[_PACKAGE] = package
    sys.modules.setdefault(_PACKAGE + ".ortmodule", None)   # None in sys.modules: importing it fails


def training_api():
    """The `onnxruntime.training.api` module, imported without torch."""
    if _PACKAGE not in sys.modules:
        _register_bare_package()
    ort = require("onnxruntime", "ort")
    if not hasattr(ort, "training"):
        ort.training = sys.modules[_PACKAGE]
    return importlib.import_module(_PACKAGE + ".api")
