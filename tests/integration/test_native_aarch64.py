"""The Raspberry Pi path, checked on an x86 machine: the native trainer cross-built for aarch64 and run under
qemu-user (`qemu-aarch64-static -L /usr/aarch64-linux-gnu`: no arm64 root filesystem, no binfmt), and the
bundle `edgefl device bundle` writes for a Pi.

* the cross-built trainer reports machine aarch64 and trains a CNN frozen-1 ExecuTorch set (one epoch of 40
  examples) to the x86 trainer's losses (rel. 1e-5) and upload (rel. err <= 1e-5);
* the bundle unpacks to edgefl-device/ with bin/edgefl-device (the native agent, paho.mqtt.c and libstdc++
  linked in) and bin/edgefl-et-train (aarch64 ELFs; the trainer's only RUNPATH is $ORIGIN/../lib), lib/
  holding exactly the libraries it loads, no wheels (no Python on the device), an executable install.sh,
  the unit, device.env, README.md and a SHA256SUMS that verifies; the bundled trainer runs from the unpacked
  folder through that RUNPATH (no LD_LIBRARY_PATH, and the build machine's SDK folder is not on it) with the
  same result; a second bundle is the same bytes and needs no package index; --with-python adds wheels/
  holding edgefl and numpy for aarch64 and no torch, executorch or onnxruntime;
* bad output paths (a missing folder, an existing file without --force) are one line and exit 2;
* the bundle's aarch64 agent serves a round on loopback under qemu (real mosquitto, `edgefl serve`) as the x86
  agent does (the second serve ships the set the first exported: 111 s for both here, bundle cached): the same train loss (rel. 1e-5; measured equal) and global weights (rel. err <= 1e-5 per tensor;
  measured: every tensor differs in its low bits).

Needs apt's qemu-user-static and g++-aarch64-linux-gnu (the test fails, not skips, without them); the
first run downloads the aarch64 executorch wheel (~18 MB) and the dependency wheels (~21 MB) into
EDGEFL_DEVICE_HOME, shared across runs (tests/conftest.py).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
from export_cases import CNN, EXPORTS, available, cnn_config

from edgefl.device_runtime import native

pytestmark = [EXPORTS, pytest.mark.skipif(not available("executorch"), reason="executorch is not installed")]
EDGEFL = Path(sys.executable).parent / "edgefl"
SYSROOT = "/usr/aarch64-linux-gnu"
EXAMPLES, SEED = 40, 3
TOOLS = {"qemu-aarch64-static": "qemu-user-static", "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu"}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


@pytest.fixture(scope="module")
def qemu():
    missing = [name for name in TOOLS if shutil.which(name) is None]
    if missing or not Path(SYSROOT, "lib").is_dir():
        pytest.fail(f"{', '.join(missing) or SYSROOT} missing: the aarch64 checks need them; install with: "
                    f"apt-get install {' '.join(TOOLS.values())}", pytrace=False)
    return shutil.which("qemu-aarch64-static")


@pytest.fixture(scope="module")
def case(exported, tmp_path_factory):
    """The CNN frozen-1 set and a data folder for it: x float32 (40, 1, 8, 8), y int64."""
    artifacts = exported("executorch", CNN, cnn_config(1))
    classes = artifacts.suffix.outputs[1].shape[-1]
    rng = np.random.default_rng(0)
    data = tmp_path_factory.mktemp("aarch64-data")
    np.save(data / "x.npy", rng.standard_normal((EXAMPLES, 1, 8, 8)).astype(np.float32))
    np.save(data / "y.npy", rng.integers(0, classes, EXAMPLES).astype(np.int64))
    return artifacts.folder, data


def train(argv: list, case, out: Path, env=None) -> tuple[dict, np.ndarray]:
    artifacts, data = case
    proc = subprocess.run([*map(str, argv), "--artifacts", str(artifacts), "--data", str(data), "--out", str(out),
                           "--epochs", "1", "--seed", str(SEED), "--losses"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(out)


def assert_same_training(report, upload, reference):
    ref_report, ref_upload = reference
    assert report["machine"] == "aarch64" and ref_report["machine"] == "x86_64"
    assert report["trainer"] == ref_report["trainer"] and report["torch_loaded"] is False
    assert report["steps"] == ref_report["steps"] == len(report["losses"]) > 1
    np.testing.assert_allclose(report["losses"], ref_report["losses"], rtol=1e-5)
    assert upload.dtype == np.float32 and upload.shape == ref_upload.shape
    assert rel(upload, ref_upload) <= 1e-5


@pytest.fixture(scope="module")
def x86_run(native_trainer, case, tmp_path_factory):
    return train([native_trainer], case, tmp_path_factory.mktemp("x86") / "upload.npy")


def test_cross_built_trainer_trains_as_on_x86(qemu, case, x86_run, tmp_path):
    binary = native.build("linux-aarch64")
    env = {**os.environ, "LD_LIBRARY_PATH": str(native.runtime_libraries("linux-aarch64"))}
    report, upload = train([qemu, "-L", SYSROOT, binary], case, tmp_path / "upload.npy", env)
    assert_same_training(report, upload, x86_run)


def bundle_cli(output: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(EDGEFL), "device", "bundle", "--target", "linux-aarch64", "-o", str(output), *args],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def bundle(qemu, tmp_path_factory):
    """(tarball, unpacked edgefl-device/ folder, CLI output)"""
    tarball = tmp_path_factory.mktemp("bundle") / "edgefl-pi.tar.gz"
    proc = bundle_cli(tarball)
    assert proc.returncode == 0, proc.stderr
    into = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    assert [p.name for p in into.iterdir()] == ["edgefl-device"]
    return tarball, into / "edgefl-device", proc.stdout


def test_bundle_layout(bundle):
    tarball, root, stdout = bundle
    assert str(tarball) in stdout and "MiB" in stdout
    assert all(entry in stdout for entry in ("bin/", "lib/", "install.sh"))
    # no Python on the device: the native agent and trainer, no wheels unless --with-python
    assert sorted(p.name for p in root.iterdir()) == ["README.md", "SHA256SUMS", "bin", "device.env",
                                                      "edgefl-device.service", "install.sh", "lib"]
    binary = root / "bin" / native.BINARY
    assert sorted(p.name for p in (root / "bin").iterdir()) == [native.AGENT, native.BINARY]
    for program in (root / "bin").iterdir():
        assert os.access(program, os.X_OK)
        assert program.read_bytes()[18:20] == (183).to_bytes(2, "little"), program   # ELF e_machine EM_AARCH64
    agent = subprocess.run(["readelf", "-d", str(root / "bin" / native.AGENT)], capture_output=True, text=True,
                           check=True).stdout
    needed = sorted(line.split("[", 1)[1].rstrip("]") for line in agent.splitlines() if "(NEEDED)" in line)
    assert not [n for n in needed if "paho" in n or "stdc++" in n], needed    # linked in: a bare Pi has neither
    dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    paths = [line.split("[", 1)[1] for line in dynamic.splitlines() if "(RUNPATH)" in line or "(RPATH)" in line]
    assert paths == ["$ORIGIN/../lib]"], dynamic
    assert sorted(p.name for p in (root / "lib").iterdir()) == sorted(native.NEEDED_LIBRARIES)

    install = root / "install.sh"
    assert os.access(install, os.X_OK)
    assert subprocess.run(["sh", "-n", str(install)]).returncode == 0
    for name in ("install.sh", "README.md", "device.env", "edgefl-device.service"):
        text = (root / name).read_text()
        leftover = {t for t in ("@VERSION@", "@TARGET@", "@MACHINE@", "@PYTHON_VERSION@") if t in text}
        assert not leftover, (name, leftover)
    assert "--runtime executorch" in (root / "edgefl-device.service").read_text()

    listed = {}
    for line in (root / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        listed[name] = digest
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    assert set(listed) == files
    for name, digest in listed.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def test_bundled_trainer_runs_from_the_unpacked_folder(qemu, bundle, case, x86_run, tmp_path):
    root = bundle[1]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}   # the RUNPATH finds ../lib
    report, upload = train([qemu, "-L", SYSROOT, root / "bin" / native.BINARY], case, tmp_path / "upload.npy", env)
    assert_same_training(report, upload, x86_run)


def test_a_second_bundle_is_the_same_bytes_and_needs_no_package_index(bundle, tmp_path):
    tarball = bundle[0]
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1")
    again = tmp_path / "again.tar.gz"
    proc = bundle_cli(again, env=offline)
    assert proc.returncode == 0, proc.stderr
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(tarball.read_bytes()).hexdigest()


def test_with_python_the_bundle_carries_the_wheels_and_no_runtime(qemu, tmp_path):
    tarball = tmp_path / "with-python.tar.gz"
    proc = bundle_cli(tarball, "--with-python")
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tarball) as tar:
        wheels = [n.split("/")[-1] for n in tar.getnames() if n.startswith("edgefl-device/wheels/") and n.endswith(".whl")]
        own = tar.extractfile(next(m for m in tar.getmembers() if m.name.startswith("edgefl-device/wheels/edgefl-")))
        with zipfile.ZipFile(own) as z:
            names = z.namelist()
    assert len([w for w in wheels if w.startswith("edgefl-")]) == 1
    assert any(w.startswith("numpy-") and "aarch64" in w and "cp311" in w for w in wheels), wheels
    assert not [w for w in wheels if w.lower().startswith(("torch", "executorch", "onnxruntime"))], wheels
    assert "edgefl/device_runtime/cli.py" in names and not [n for n in names if n.startswith(("tests/", "bench/"))]


@pytest.mark.parametrize("problem", ["missing folder", "existing file"])
def test_bad_output_is_one_line(problem, tmp_path):
    output = tmp_path / "missing" / "edgefl-pi.tar.gz"
    if problem == "existing file":
        output = tmp_path / "edgefl-pi.tar.gz"
        output.write_bytes(b"keep me")
    proc = bundle_cli(output)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("edgefl: error: -o "), proc.stderr
    assert ("does not exist" if problem == "missing folder" else "--force") in proc.stderr
    if problem == "existing file":
        assert output.read_bytes() == b"keep me"


# --- a served round: the cross-built native agent under qemu against the x86 one --------------------------------
PI = "fleet:\n  name: pi\n  groups:\n    pi: {count: 1, runtime: executorch, memory_budget: 512MiB, examples: 64}\n"


@pytest.fixture(scope="module")
def pi_plan(tmp_path_factory):
    """One Pi's fleet, a 1-round FedAvg plan of the CNN, and its 64-example Fashion-MNIST share (2 steps of 32)."""
    from served_run import write_plan

    from edgefl.engines.agents import export_shares
    from edgefl.fleet import parse_fleet

    folder = tmp_path_factory.mktemp("pi-plan")
    fleet, plan = write_plan(folder, PI, "fedavg", 1)
    shares = export_shares(parse_fleet(PI), "fashion-mnist", "iid", 0, folder / "data", train_limit=64)
    return fleet, plan, shares["pi-0"]


def served_round(folder: Path, pi_plan, argv: list, *extra, env=None, exported: Optional[Path] = None
                 ) -> tuple[dict, dict]:
    """One served round (real mosquitto, `edgefl serve`) with `argv` run as device pi-0 (`extra`: more of its run
    options): (the round's record, the global weights after it). `exported`: another run's state/artifacts, which
    this coordinator finds as a stopped one's and ships instead of exporting the same set again."""
    import torch
    from mosquitto import Mosquitto

    fleet, plan, share = pi_plan
    if exported is not None:
        shutil.copytree(exported, folder / "state" / "artifacts")
    with Mosquitto(folder / "broker") as broker:
        log = open(folder / "pi-0.log", "w")
        agent = subprocess.Popen([*map(str, argv), "run", "--id", "pi-0", "--broker", broker.url, "--data", str(share),
                                  "--runtime", "executorch", "--cache", str(folder / "cache"), "--memory",
                                  str(512 * 2**20), "--power", "3W", *map(str, extra)], stdout=log,
                                 stderr=subprocess.STDOUT, env=env)
        try:
            r = subprocess.run([sys.executable, "-m", "edgefl", "serve", "--plan", str(plan), "--devices", str(fleet),
                                "--broker", broker.url, "--state", str(folder / "state"), "--rounds", "1",
                                "--wait-online", "120", "--round-timeout", "300"], capture_output=True, text=True,
                               timeout=600)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], (folder / "pi-0.log").read_text()[-2000:])
    [record] = json.loads((folder / "state" / "history.json").read_text())["rounds"]
    return record, torch.load(folder / "state" / "weights.pt")


def test_the_cross_built_agent_serves_a_round_under_qemu_as_the_x86_agent_does(qemu, bundle, pi_plan, native_trainer,
                                                                            tmp_path):
    """The bundle's aarch64 agent (under qemu-aarch64-static; its trainer too, through a wrapper: qemu-user cannot
    exec an aarch64 program without binfmt) and the x86 agent, each device pi-0 of the same 1-round plan with the
    same share and seed: both reports are ok from the native agent and native trainer with the same examples and
    steps; the round's train loss agrees to rel. 1e-5 and the global weights (the one device's upload) to rel. err
    <= 1e-5 per tensor (float sums in another order on another machine: not bit for bit)."""
    import torch

    root = bundle[1]
    agent = native.find_agent()
    assert agent is not None
    x86, x86_weights = served_round(tmp_path / "x86", pi_plan, [agent])

    wrapper = tmp_path / "edgefl-et-train-qemu"
    wrapper.write_text(f'#!/bin/sh\nexec "{qemu}" -L {SYSROOT} "{root / "bin" / native.BINARY}" "$@"\n')
    wrapper.chmod(0o755)
    libraries = native.target_libraries(native.target("linux-aarch64")) / "usr" / "lib" / "aarch64-linux-gnu"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "EDGEFL_ET_TRAIN")}
    (tmp_path / "arm").mkdir()
    arm, arm_weights = served_round(tmp_path / "arm", pi_plan,
                                    [qemu, "-L", SYSROOT, "-E", f"LD_LIBRARY_PATH={libraries}",
                                     root / "bin" / native.AGENT], "--trainer", wrapper, env=env,
                                    exported=tmp_path / "x86" / "state" / "artifacts")
    said = (tmp_path / "arm" / "pi-0.log").read_text()
    assert "native agent, trainer" in said and str(wrapper) in said, said

    for record in (x86, arm):
        metrics = record["device_metrics"]["pi-0"]
        assert record["aggregated"] and record["examples"] == {"pi-0": 64}, record
        assert metrics["agent"] == "native" and metrics["trainer"] == "native" and metrics["torch_loaded"] is False
    assert arm["device_metrics"]["pi-0"]["steps"] == x86["device_metrics"]["pi-0"]["steps"] > 1
    np.testing.assert_allclose(arm["train_loss"], x86["train_loss"], rtol=1e-5)
    assert arm_weights.keys() == x86_weights.keys()
    changed = 0
    for key, value in x86_weights.items():
        assert rel(arm_weights[key].double().numpy(), value.double().numpy()) <= 1e-5, key
        changed += not torch.equal(value, arm_weights[key])
    print(f"aarch64 vs x86: train loss {arm['train_loss']} vs {x86['train_loss']}; {changed} of {len(x86_weights)} "
          "tensors differ in some bit")
