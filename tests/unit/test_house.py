"""The house's rules, checked: the import contracts (lint-imports) and ruff pass, a forbidden import breaks the
lint, no import cycle anywhere, the public API is what it says, and the rooms keep their size."""
import ast
import importlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the repository's top-level folders that install as edgefl.<name> (pyproject.toml's package-dir)
MAPPED = ("export", "device_runtime", "broker", "hardware")
VOCABULARY = {"__init__", "__main__", "units", "errors", "fleet", "trainconfig", "messages", "manifest", "topics",
              "credentials", "outdir"}


def _staged(into: Path) -> Path:
    """The product's source as a wheel lays it out (edgefl/ with the mapped folders inside) and the contracts:
    what import-linter reads (it finds a package's modules in its folder, and an editable install maps
    edgefl.export and the others from folders beside edgefl/)."""
    shutil.copytree(ROOT / "edgefl", into / "edgefl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in MAPPED:
        shutil.copytree(ROOT / name, into / "edgefl" / name, ignore=shutil.ignore_patterns("__pycache__", "native"))
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


def _run(tree: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`argv` in `tree` with its edgefl first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=300, env=env)


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return _run(tree, [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo"])


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    return _staged(tmp_path_factory.mktemp("staged"))


def test_the_import_contracts_and_ruff_pass(staged):
    lint = _lint(staged)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Contracts: 6 kept, 0 broken." in lint.stdout
    assert "Analyzed" in lint.stdout and int(lint.stdout.split("Analyzed ")[1].split()[0]) > 200   # every room read
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr


def test_mypy_passes_on_the_vocabulary_and_the_server(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    files = sum(len(list((ROOT / f).glob("*.py"))) if (ROOT / f).is_dir() else 1
                for f in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    assert r.returncode == 0 and r.stdout.startswith(f"Success: no issues found in {files} source files"), \
        r.stdout + r.stderr


@pytest.mark.parametrize("module, line, contract", [
    ("edgefl/server/coordinator.py", "from edgefl.transport.endpoint import WireTransport",
     "The round loop talks to the Transport interface only"),
    ("edgefl/device_runtime/agent.py", "import torch", "The device runs without torch"),
    ("edgefl/cost/model.py", "from edgefl.planning.plan import Plan", "The house"),
])
def test_a_forbidden_import_breaks_the_lint(tmp_path, module, line, contract):
    tree = _staged(tmp_path)
    path = tree / module
    head, _, rest = path.read_text().partition("from __future__ import annotations\n")
    path.write_text(f"{head}from __future__ import annotations\n{line}  # noqa\n{rest}")
    lint = _lint(tree)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "Contracts: 5 kept, 1 broken." in lint.stdout
    broken = lint.stdout.split("Broken contracts")[1]
    assert contract in broken and module.removesuffix(".py").replace("/", ".") in broken, lint.stdout


CYCLES = """
import sys
import grimp
graph = grimp.build_graph("edgefl", cache_dir=None)
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
print(len(graph.modules), cycles)
"""


def test_no_import_cycle_anywhere_in_the_product(staged):
    """Strongly connected components of the import graph (grimp's, import-linter's own; function-level imports
    count): every one a single module."""
    r = _run(staged, [sys.executable, "-c", CYCLES])
    assert r.returncode == 0, r.stderr
    modules, cycles = r.stdout.split(" ", 1)
    assert int(modules) > 150 and cycles.strip() == "[]", r.stdout


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
    used = ["import sys, edgefl, edgefl.planning, edgefl.server, edgefl.engines",
            "edgefl.plan_fleet, edgefl.load_fleet, edgefl.Coordinator, edgefl.Emulation, edgefl.DeviceReport",
            "assert 'torch' not in sys.modules, 'torch imported'",
            "edgefl.server.TorchServerModel", "assert 'torch' in sys.modules"]
    r = _run(ROOT, [sys.executable, "-c", "\n".join(used)])
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
