"""`edgefl device bundle`: one tarball that turns a 64-bit Raspberry Pi (Raspberry Pi OS bookworm: Debian 12
arm64) into an edgefl device, built on any x86 machine and installed offline; no Python needed on the device.
`--target linux-x86_64` gives the same for a desktop (the tests run it).

    edgefl-device/bin/edgefl-device     the native device agent (C++: MQTT through a static paho.mqtt.c, the
                                        system's OpenSSL), cross-built (native.build_agent)
    edgefl-device/bin/edgefl-et-train   the native ExecuTorch trainer the agent runs each round, installed with
                                        its RUNPATH set to $ORIGIN/../lib alone
    edgefl-device/lib/                  the runtime libraries it loads
    edgefl-device/wheels/               only with --with-python: edgefl (built from this source tree) + its base
                                        dependencies for the target, for the Python tools (Python 3.11)
    edgefl-device/install.sh, edgefl-device.service, device.env, README.md   (from deploy/)
    edgefl-device/SHA256SUMS            of every other file (sha256sum -c format)

No torch, executorch (Python) or onnxruntime wheel goes in: the device trains with the native trainer alone.
Two bundles of the same source tree are the same bytes (write_archive; the binaries come from the build
cache, keyed by their sources' hash).
Dependency wheels are resolved by `pip download` for the edgefl wheel itself and cached under
$EDGEFL_DEVICE_HOME/wheels/<platform>/<hash of the requirements>, so the next bundle downloads nothing
(delete that folder to pick up newer releases).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from edgefl.device_runtime import native
from edgefl.errors import ConfigError, MissingDependencyError

TOP = "edgefl-device"
ZIP_EPOCH = 315532800                        # 1980-01-01: the earliest time a zip (a wheel) entry can hold
PYTHON_VERSION = "3.11"                      # Raspberry Pi OS bookworm's python3
EXCLUDED = ("torch", "executorch", "onnxruntime")   # prefixes of wheel names that never go in
DEPLOY = Path(__file__).parent / "deploy"
TEMPLATES = ("install.sh", "edgefl-device.service", "device.env", "README.md")
# not part of a wheel build: copying the source tree without them keeps stale build/ output out of the wheel
_NOT_SOURCE = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
               "runs", "tests", "bench")


def platforms(t: native.Target) -> list[str]:
    return [f"manylinux_2_28_{t.machine}", f"manylinux_2_17_{t.machine}", f"manylinux2014_{t.machine}"]


def source_tree() -> Path:
    root = Path(native.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise ConfigError(f"edgefl device bundle builds edgefl's wheel from its source tree, and this edgefl is "
                          f"installed without one ({root}); run it from a checkout installed with 'pip install -e .'")
    return root


def build_wheel(source: Path, into: Path, epoch: int = ZIP_EPOCH) -> Path:
    """edgefl's own wheel (pip wheel --no-deps) from a copy of the source tree, its entries dated `epoch`."""
    with tempfile.TemporaryDirectory(prefix="edgefl-src-") as tmp:
        copy = Path(tmp) / "edgefl"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        # with the installed setuptools nothing is fetched from an index
        isolation = ["--no-build-isolation"] if _setuptools_builds_wheels() else []
        argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation, "-w", str(into), str(copy)]
        proc = subprocess.run(argv, capture_output=True, text=True,
                              env={**os.environ, "SOURCE_DATE_EPOCH": str(max(epoch, ZIP_EPOCH))})
    wheels = sorted(into.glob("edgefl-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise RuntimeError(f"building edgefl's wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wheels[0]


def _setuptools_builds_wheels() -> bool:
    try:
        major, minor = (int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1)     # bdist_wheel moved into setuptools in 70.1


def install_trainer(build: Path, prefix: Path) -> Path:
    """`cmake --install` of the trainer alone (not the kernels library for Python): under prefix/bin with its
    RUNPATH set to $ORIGIN/../lib alone (the build tree's binary also looks in this machine's SDK folder)."""
    cmake = native._tool("cmake", "install it with: apt-get install cmake (3.19 or newer)")
    with native._locked(build / ".lock"):
        proc = subprocess.run([cmake, "--install", str(build), "--prefix", str(prefix), "--component", "trainer"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {native.BINARY} from {build} failed:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return prefix / "bin" / native.BINARY


def base_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without the extras' ones."""
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    return sorted(line.split(":", 1)[1].strip() for line in lines
                  if line.startswith("Requires-Dist:") and not re.search(r"\bextra\s*==", line))


def dependency_wheels(wheel: Path, t: native.Target, log=lambda line: None) -> list[Path]:
    """The wheels of `wheel`'s base dependencies for target `t`, downloaded once per requirement set."""
    key = hashlib.sha256("\n".join([PYTHON_VERSION, *platforms(t), *base_requirements(wheel)]).encode()).hexdigest()
    cache = native.home() / "wheels" / t.platform_tag
    folder = cache / key[:16]
    cache.mkdir(parents=True, exist_ok=True)
    with native._locked(cache / ".lock"):
        if not folder.is_dir():
            log(f"downloading the dependency wheels for {t.platform_tag}, CPython {PYTHON_VERSION}")
            partial = cache / f"{key[:16]}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
            for tag in platforms(t):
                argv += ["--platform", tag]
            argv += ["--python-version", PYTHON_VERSION, "--implementation", "cp", "-d", str(partial), str(wheel)]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                shutil.rmtree(partial, ignore_errors=True)
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise MissingDependencyError(f"could not download edgefl's dependency wheels for {t.platform_tag} "
                                             f"({last}); check the connection to the package index")
            for own in partial.glob("edgefl-*.whl"):   # pip saves the wheel it resolved for as well
                own.unlink()
            partial.rename(folder)
        else:
            log(f"dependency wheels for {t.platform_tag}: cached in {folder}")
    return sorted(folder.glob("*.whl"))


def check_excluded(wheels: list[Path]) -> None:
    """No torch, executorch or onnxruntime wheel: a Pi trains with the native trainer alone."""
    found = [w.name for w in wheels if w.name.lower().replace("-", "_").startswith(EXCLUDED)]
    if found:
        raise RuntimeError(f"the bundle would carry {', '.join(found)}: edgefl's base requirements must not pull "
                           f"in {', '.join(EXCLUDED)}")


def _render(template: str, t: native.Target) -> str:
    values = {"VERSION": native.edgefl_version(), "TARGET": t.name, "MACHINE": t.machine,
              "PYTHON_VERSION": PYTHON_VERSION, "EXECUTORCH_VERSION": native.EXECUTORCH_VERSION}
    text = (DEPLOY / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def sha256sums(folder: Path) -> str:
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(folder).as_posix()}")
    return "\n".join(lines) + "\n"


def source_date_epoch(source: Path) -> int:
    """The time every file of a bundle carries: $SOURCE_DATE_EPOCH, else the source tree's last commit, else
    1980-01-01 (the earliest a zip entry can hold). Never the clock or a checkout's file times: two bundles
    of the same tree must be the same bytes."""
    if os.environ.get("SOURCE_DATE_EPOCH", "").strip().isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    git = shutil.which("git")
    if git is not None:
        proc = subprocess.run([git, "-C", str(source), "log", "-1", "--format=%ct"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            return int(proc.stdout.strip())
    return ZIP_EPOCH


def write_archive(stage: Path, output: Path, epoch: int) -> None:
    """`stage` as `output` (.tar.gz) under its own name, reproducibly: entries sorted, owned by root, dated
    `epoch`, modes 0755 (folders and executables) or 0644, the gzip header dated too. Written to a partial
    file and renamed, so a failed write leaves no half archive."""
    partial = output.with_name(output.name + ".partial")
    try:
        with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for path in [stage, *sorted(stage.rglob("*"), key=lambda p: p.relative_to(stage).parts)]:
                info = tar.gettarinfo(str(path), arcname=(Path(stage.name) / path.relative_to(stage)).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = epoch
                info.mode = 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644
                if path.is_file():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)


def build_bundle(target_name: str, output: Path, log=lambda line: None, force: bool = False,
                 with_python: bool = False) -> Path:
    """Write the bundle for `target_name` (linux-aarch64: a Raspberry Pi) to `output` (.tar.gz); its path.
    `with_python`: the wheels of edgefl and its base dependencies go in too."""
    t = native.target(target_name)
    output = Path(output)
    if not output.parent.is_dir():
        raise ConfigError(f"-o {output}: the folder {output.parent} does not exist; create it or write elsewhere")
    if output.exists() and not force:
        raise ConfigError(f"-o {output}: already exists; pass --force to overwrite it")
    source = source_tree()
    epoch = source_date_epoch(source)
    with tempfile.TemporaryDirectory(prefix="edgefl-bundle-") as tmp:
        stage = Path(tmp) / TOP
        for sub in ("bin", "lib"):
            (stage / sub).mkdir(parents=True)
        native.build(t.name, log=log)
        install_trainer(native.build_dir(t), stage)
        shutil.copy2(native.staged_agent(native.build_dir(t)), stage / "bin" / native.AGENT)
        libraries = native.runtime_libraries(t.name)
        for name in native.NEEDED_LIBRARIES:
            shutil.copy2(libraries / name, stage / "lib" / name)
        if with_python:
            (stage / "wheels").mkdir()
            log("building the edgefl wheel")
            own = build_wheel(source, stage / "wheels", epoch)
            deps = dependency_wheels(own, t, log)
            check_excluded([own, *deps])
            for wheel in deps:
                shutil.copy2(wheel, stage / "wheels" / wheel.name)
        for template in TEMPLATES:
            (stage / template).write_text(_render(template, t))
        for path in (stage / "install.sh", *(stage / "bin").iterdir(), *(stage / "lib").iterdir()):
            path.chmod(0o755)
        (stage / "SHA256SUMS").write_text(sha256sums(stage))
        write_archive(stage, output, epoch)
    return output


def contents(bundle: Path) -> dict[str, tuple[int, int]]:
    """{entry under edgefl-device/: (files, bytes)} of a bundle, for the CLI's summary."""
    found: dict[str, tuple[int, int]] = {}
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) > 1:
                entry = parts[1] + ("/" if len(parts) > 2 else "")
                files, size = found.get(entry, (0, 0))
                found[entry] = (files + 1, size + member.size)
    return found
