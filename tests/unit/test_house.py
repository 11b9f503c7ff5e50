"""The house's rules, checked: the import contracts (lint-imports) and ruff pass, a forbidden import breaks the
lint, no import cycle anywhere, the public API is what it says, and the rooms keep their size."""
import ast
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
# the repository's top-level folders that install as edgefl.<name> (pyproject.toml's package-dir)
MAPPED = ("export", "device_runtime", "broker", "hardware")
ROOTS = ("edgefl", *(f"edgefl.{name}" for name in MAPPED))
VOCABULARY = {"__init__", "__main__", "units", "errors", "fleet", "trainconfig", "messages", "manifest", "topics",
              "credentials", "outdir"}


def _lint(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint_imports), "--no-cache", "--config", str(cwd / "pyproject.toml")], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)


def test_the_import_contracts_and_ruff_pass():
    lint = _lint(ROOT)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Contracts: 5 kept, 0 broken." in lint.stdout
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr


def _tree_copy(into: Path) -> Path:
    """The product's source as a wheel lays it out (edgefl/ with the mapped folders inside) and the contracts."""
    shutil.copytree(ROOT / "edgefl", into / "edgefl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in MAPPED:
        shutil.copytree(ROOT / name, into / "edgefl" / name, ignore=shutil.ignore_patterns("__pycache__", "native"))
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


@pytest.mark.parametrize("module, line, contract", [
    ("edgefl/server/coordinator.py", "from edgefl.transport.endpoint import WireTransport",
     "The round loop talks to the Transport interface only"),
    ("edgefl/device_runtime/agent.py", "import torch", "The device runs without torch"),
    ("edgefl/cost/model.py", "from edgefl.planning.plan import Plan", "The house"),
])
def test_a_forbidden_import_breaks_the_lint(tmp_path, module, line, contract):
    tree = _tree_copy(tmp_path)
    path = tree / module
    text = path.read_text()
    head, _, rest = text.partition("from __future__ import annotations\n")
    path.write_text(f"{head}from __future__ import annotations\n{line}  # noqa\n{rest}")
    lint = _lint(tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    assert lint.returncode == 1, lint.stdout + lint.stderr
    broken = [block for block in lint.stdout.split("\n\n") if "BROKEN" in block]
    assert any(contract in block for block in broken), lint.stdout
    assert module.removesuffix(".py").replace("/", ".") in lint.stdout


def test_no_import_cycle_anywhere_in_the_product():
    """Strongly connected components of the import graph (grimp, import-linter's own): every one a single module."""
    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10_000)

    def visit(m):
        index[m] = low[m] = counter[0]
        counter[0] += 1
        stack.append(m)
        on.add(m)
        for n in graph.find_modules_directly_imported_by(m):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    assert len(graph.modules) > 150 and not cycles, cycles


API = {
    "edgefl": ["ArtifactError", "ArtifactSet", "ConfigError", "Coordinator", "Cost", "Dataset", "DeviceReport",
               "EdgeflError", "Emulation", "Fleet", "Group", "InfeasiblePlanError", "LoopSettings", "Manifest",
               "MissingDependencyError", "ModelProfile", "ModelRef", "Plan", "ProfileStore", "ReportRejected",
               "ReportStatus", "RoundInstruction", "RoundRecord", "TrainConfig", "TransportError", "build",
               "format_bytes", "get_strategy", "lazy_exports", "load_calibration", "load_dataset", "load_fleet",
               "method_names", "model_names", "parse_bytes", "parse_fleet", "plan_fleet", "strategy_for", "verify",
               "version"],
    "edgefl.cost": ["AuxProfile", "Breakdown", "Cost", "DEFAULTS", "FamilyTerms", "LayerProfile", "ModelProfile",
                    "PeakSample", "PeakTerms", "ProfileStore", "RuntimeConstants", "breakdown", "calibration_json",
                    "config_cost", "cost", "family", "fit_overheads", "load_calibration", "step_peak_bytes"],
    "edgefl.planning": ["GroupPlan", "Plan", "PlanContext", "STRATEGIES", "Step", "Strategy", "get_strategy",
                        "method_names", "plan_changes", "plan_fleet", "samples_from_run", "strategy_for", "verify",
                        "violations"],
    "edgefl.server": ["Coordinator", "Delivery", "IndexSets", "LoopSettings", "RoundRecord", "RunState",
                      "RunningAggregate", "ServerModel", "TorchServerModel", "embed", "extract", "index_sets",
                      "record_from_json", "record_to_json", "write_history"],
    "edgefl.engines": ["Agents", "ArtifactShipper", "DeployedServerModel", "EmulatedRun", "Emulation", "Serving",
                       "check_deployable", "emulate", "fleet_of", "ray_engine", "serve", "torch_trainer"],
    "edgefl.protocol": ["BrokerAddress", "ChunkManifest", "MemoryHub", "MemoryWire", "MqttWire", "Wire", "pack",
                        "parse_broker_url", "unpack"],
    "edgefl.transport": ["InMemoryTransport", "MqttTransport", "RayTransport", "Transport", "WireTransport"],
    "edgefl.report": ["Run", "load_run", "write_report"],
}


@pytest.mark.parametrize("package", sorted(API))
def test_the_public_api_is_what_each_room_names(package):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == API[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here


def test_the_public_api_imports_no_torch_until_a_name_needs_it():
    code = ("import sys, edgefl, edgefl.planning, edgefl.server, edgefl.engines\n"
            "edgefl.plan_fleet, edgefl.load_fleet, edgefl.Coordinator, edgefl.Emulation, edgefl.DeviceReport\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "edgefl.server.TorchServerModel\n"
            "assert 'torch' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _product_files():
    return [p for top in ("edgefl", *MAPPED) for p in (ROOT / top).rglob("*.py")]


def test_the_rooms_keep_their_size():
    top = sorted(p.stem for p in (ROOT / "edgefl").glob("*.py"))
    assert set(top) == VOCABULARY, f"edgefl/ holds {top}: a module with a job of its own belongs in a room"
    long = {str(p.relative_to(ROOT)): n for p in _product_files() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"
    for path in (ROOT / "edgefl" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, f"{path.name}: {node.name} is {length} lines: the work belongs in a room"
