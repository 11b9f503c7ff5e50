"""The native ExecuTorch trainer (`edgefl-et-train`, C++ under device_runtime/native/): where it is, and how
it is built from the C++ SDK that the executorch wheel ships.

The trainer needs only the wheel's `executorch/lib` and `executorch/include`, never its Python side (which
imports torch). The SDK comes from the installed executorch package when it is the host's, else from the
wheel itself, downloaded once (`pip download --no-deps`) and unpacked into the cache: that is also how a
Raspberry Pi build gets the aarch64 SDK on an x86 machine (cross-compiled with Debian's
g++-aarch64-linux-gnu). Builds are keyed by a hash of the sources, so a changed edgefl never runs a stale
trainer.

Where a built trainer is looked for, first match wins: $EDGEFL_ET_TRAIN (a path to the binary), the
build cache ($EDGEFL_DEVICE_HOME, default ~/.cache/edgefl-device), `edgefl-et-train` on PATH (a bundle
installs it there).

The trainer is compiled for a CPU level (AVX2 + FMA make its products 3-4x faster): x86-64-v3 by default, else
$EDGEFL_CPU_LEVEL (e.g. x86-64 for a pre-2015 CPU), which keys the build; arm64 builds target armv8-a.

The native device agent (`edgefl-device`, C++ under native/agent/, no ExecuTorch: paho.mqtt.c, OpenSSL and
nlohmann-json from Debian) is built by the same `build` into the same bin/, beside the trainer it runs. Its
build is keyed by the agent's own sources (`.agent-sources`): a change to it rebuilds it in seconds, never the
trainer (minutes).
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from edgefl.errors import ConfigError, MissingDependencyError

EXECUTORCH_VERSION = "1.5.1"      # the exporter's version: programs and runtime must pair exactly
BINARY = "edgefl-et-train"
AGENT = "edgefl-device"
KERNELS = "libedgefl_et_kernels.so"
SOURCES = Path(__file__).parent / "native"
AGENT_SOURCES = SOURCES / "agent"


@dataclass(frozen=True)
class Target:
    name: str          # linux-x86_64 | linux-aarch64
    machine: str       # what `uname -m` prints there
    platform_tag: str  # the wheel's platform
    toolchain: Optional[str] = None   # CMake toolchain file under native/toolchains when cross-building


TARGETS = {t.name: t for t in (Target("linux-x86_64", "x86_64", "manylinux_2_28_x86_64"),
                               Target("linux-aarch64", "aarch64", "manylinux_2_28_aarch64",
                                      "aarch64-linux-gnu.cmake"))}


def host_target() -> Target:
    machine = platform.machine()
    for target in TARGETS.values():
        if target.machine == machine:
            return target
    raise ConfigError(f"this machine is {machine}; the native trainer builds for {', '.join(TARGETS)}")


def target(name: Optional[str]) -> Target:
    if name is None:
        return host_target()
    if name not in TARGETS:
        raise ConfigError(f"--target {name}: unknown; choose one of: {', '.join(TARGETS)}")
    return TARGETS[name]


def home() -> Path:
    return Path(os.environ.get("EDGEFL_DEVICE_HOME") or Path.home() / ".cache" / "edgefl-device")


def source_hash(agent: bool = False) -> str:
    """The trainer's sources (native/ without agent/), or with `agent` the agent's (agent/ and the headers of
    native/src it includes)."""
    from edgefl.manifest import _sha256

    h = _sha256()
    for path in sorted(p for p in SOURCES.rglob("*") if p.is_file()):
        relative = path.relative_to(SOURCES)
        if relative.parts[0] in ("build", "fuzz"):      # the fuzz targets are part of neither program
            continue
        if (AGENT_SOURCES in path.parents) == agent or (agent and path.name in ("sha256.h", "errors.h")):
            h.update(str(relative).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


CPU_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")


def cpu_level(t: Target) -> Optional[str]:
    """The -march of an x86 build ($EDGEFL_CPU_LEVEL, default x86-64-v3); None for arm64 (armv8-a, fixed)."""
    if t.machine != "x86_64":
        return None
    level = os.environ.get("EDGEFL_CPU_LEVEL") or "x86-64-v3"
    if level not in CPU_LEVELS:
        raise ConfigError(f"EDGEFL_CPU_LEVEL={level}: unknown; choose one of: {', '.join(CPU_LEVELS)}")
    return level


def build_stamp(t: Target) -> str:
    """A build folder's .sources: a build of other sources, or for another CPU level, is rebuilt."""
    return f"{source_hash()} {cpu_level(t) or 'armv8-a'}"


def build_dir(t: Target) -> Path:
    level = cpu_level(t) or "x86-64-v3"
    return home() / "native" / f"{t.name}-{source_hash()}{'' if level == 'x86-64-v3' else '-' + level}"


def staged(folder: Path) -> Path:
    """The installed trainer of a build folder: stage/bin beside stage/lib, a link to the SDK's libraries
    (the binary's RUNPATH is $ORIGIN/../lib alone, as in a bundle)."""
    return folder / "stage" / "bin" / BINARY


def staged_agent(folder: Path) -> Path:
    return folder / "stage" / "bin" / AGENT


def staged_kernels(folder: Path) -> Path:     # edgefl's kernels for the Python ExecuTorch trainer
    return folder / "stage" / "kernels" / KERNELS


def _find_built(env: str, in_stage: Callable[[Path], Path], on_path: Optional[str] = None) -> Optional[Path]:
    """A built program for this machine: $`env` (a path), else the build cache's stage, else `on_path` on PATH."""
    if given := os.environ.get(env):
        return Path(given) if Path(given).is_file() else None
    try:
        built = in_stage(build_dir(host_target()))
    except ConfigError:
        return None
    if built.is_file():
        return built
    found = shutil.which(on_path) if on_path else None
    return Path(found) if found else None


def find_agent() -> Optional[Path]:
    """The built native agent for this machine ($EDGEFL_DEVICE_NATIVE, else the build cache), or None. Never
    PATH: there `edgefl-device` is the Python agent's entry point."""
    return _find_built("EDGEFL_DEVICE_NATIVE", staged_agent)


def find_kernels() -> Optional[Path]:     # $EDGEFL_ET_KERNELS, else the build cache
    return _find_built("EDGEFL_ET_KERNELS", staged_kernels)


def find_trainer() -> Optional[Path]:
    """The built trainer for this machine ($EDGEFL_ET_TRAIN, the build cache, PATH), or None."""
    return _find_built("EDGEFL_ET_TRAIN", staged, BINARY)


def require_trainer() -> Path:
    trainer = find_trainer()
    if trainer is None:
        raise MissingDependencyError(
            "the native ExecuTorch trainer is not built; build it with 'edgefl-device build-native' (needs cmake, "
            "g++, nlohmann-json3-dev, libeigen3-dev and the executorch==" + EXECUTORCH_VERSION + " wheel, which it downloads if "
            "missing), or pass "
            "--trainer python for the Python reference trainer (imports torch)")
    return trainer


TRAINERS = ("auto", "native", "python")


def choose(runtime: str, trainer: str = "auto") -> Optional[Path]:
    """The native binary a device trains `runtime` sets with, or None for the runtime's Python trainer.
    `auto` means native for executorch: the Python ExecuTorch trainer imports torch (~360 MiB), which no
    plan for a small device allows for, so it runs only when asked for (`python`, the reference)."""
    if trainer not in TRAINERS:
        raise ConfigError(f"--trainer {trainer}: choose one of: {', '.join(TRAINERS)}")
    if runtime != "executorch":
        if trainer == "native":
            raise ConfigError(f"--trainer native trains ExecuTorch sets; --runtime {runtime} has only its Python trainer")
        return None
    return None if trainer == "python" else require_trainer()


def trainer_argv(binary: Path, artifacts: Path, data: Path, out: Path, *, lr: float, seed: int, epochs: int,
                 threads: int, max_examples: Optional[int] = None) -> list[str]:
    """The native trainer's command line for one round of the agent (the worker's schedule)."""
    argv = [str(binary), "--artifacts", str(artifacts), "--data", str(data), "--out", str(out), "--lr", repr(lr),
            "--seed", str(seed), "--epochs", str(epochs), "--threads", str(threads)]
    return argv + (["--max-examples", str(max_examples)] if max_examples else [])


def _installed_sdk() -> Optional[Path]:
    spec = importlib.util.find_spec("executorch")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "lib" / "cmake" / "executorch").is_dir():
            return Path(location)
    return None


def sdk(t: Target) -> Path:
    """The executorch package folder (lib/, include/) for target `t`: the installed one on its own machine,
    else the wheel for `t`, downloaded once and unpacked under the cache (lib/, include/ and share/cmake/, which the CMake package looks for)."""
    if t.machine == platform.machine() and (installed := _installed_sdk()) is not None:
        return installed
    root = home() / "sdk" / f"executorch-{EXECUTORCH_VERSION}-{t.platform_tag}"
    package = root / "executorch"
    if (package / "lib" / "cmake" / "executorch").is_dir():
        return package
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if not (package / "lib" / "cmake" / "executorch").is_dir():
            wheel = _download(f"executorch=={EXECUTORCH_VERSION}", t, root / "wheel")
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if m.startswith(("executorch/lib/", "executorch/include/", "executorch/share/cmake/"))]
                z.extractall(root, members)
            for lib in (package / "lib").glob("*.so*"):
                lib.chmod(0o755)
    return package


def _download(requirement: str, t: Target, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--platform", t.platform_tag, "--python-version", f"{sys.version_info[0]}{sys.version_info[1]}",
            "-d", str(into), requirement]
    proc = subprocess.run(argv, capture_output=True, text=True)
    wheels = sorted(into.glob("executorch-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise MissingDependencyError(f"could not download {requirement} for {t.platform_tag} "
                                     f"({(proc.stderr.strip().splitlines() or ['no wheel'])[-1]}); check the "
                                     "connection to the package index, or install executorch on this machine")
    return wheels[-1]


class _locked:
    """An exclusive file lock: two processes (test workers, two agents) build or download once."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingDependencyError(f"{name} is not installed; {hint}")
    return path


def build(target_name: Optional[str] = None, out: Optional[Path] = None, log=lambda line: None) -> Path:
    """Configure and build the trainer for a target (default: this machine); the binary's path. Nothing
    happens when the same sources were built before."""
    t = target(target_name)
    folder = Path(out) if out is not None else build_dir(t)
    binary = staged(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        stamp = build_stamp(t)
        if binary.is_file() and (folder / ".sources").is_file() and (folder / ".sources").read_text() == stamp:
            _link_sdk(folder, sdk(t))      # the cache may outlive the environment it was built from
            build_agent(t, folder, log)
            return binary
        cmake = _tool("cmake", "install it with: apt-get install cmake (3.19 or newer)")
        compiler = "aarch64-linux-gnu-g++" if t.toolchain else "g++"
        _tool(compiler, f"install it with: apt-get install {'g++-aarch64-linux-gnu' if t.toolchain else 'g++'}")
        package = sdk(t)
        argv = [cmake, "-S", str(SOURCES), "-B", str(folder), "-DCMAKE_BUILD_TYPE=Release",
                f"-Dexecutorch_DIR={package / 'lib' / 'cmake' / 'executorch'}", f"-DEDGEFL_VERSION={edgefl_version()}"]
        if t.toolchain:
            argv.append(f"-DCMAKE_TOOLCHAIN_FILE={SOURCES / 'toolchains' / t.toolchain}")
        if cpu_level(t):
            argv.append(f"-DEDGEFL_CPU_LEVEL={cpu_level(t)}")
        log(f"building {BINARY} for {t.name} in {folder}")
        _cmake(BINARY, argv, folder, folder / "stage")
        _link_sdk(folder, package)
        (folder / ".sources").write_text(stamp)
        build_agent(t, folder, log)
    return binary


def _link_sdk(folder: Path, package: Path) -> None:
    """stage/lib: a link to the SDK's libraries, re-pointed when it names another copy of them (a build cache made
    from another environment, since moved or removed, would leave the trainer without its libraries)."""
    lib = folder / "stage" / "lib"
    if lib.is_symlink() and os.readlink(lib) == str(package / "lib"):
        return
    if lib.is_symlink() or lib.exists():
        lib.unlink()
    lib.symlink_to(package / "lib", target_is_directory=True)


def _cmake(what: str, configure: list[str], folder: Path, prefix: Path) -> None:
    """Configure, build and install into `prefix` (a RuntimeError with cmake's tail when it fails). A build
    folder configured from another checkout of the sources (a copied or moved tree, a cache shared between
    clones) loses its cache and is configured afresh: cmake refuses to reuse it."""
    source = Path(configure[configure.index("-S") + 1]).resolve()
    cache = folder / "CMakeCache.txt"
    if cache.is_file():
        home_line = next((line for line in cache.read_text(errors="replace").splitlines()
                          if line.startswith("CMAKE_HOME_DIRECTORY:")), "")
        if Path(home_line.partition("=")[2] or "/").resolve() != source:
            cache.unlink()
            shutil.rmtree(folder / "CMakeFiles", ignore_errors=True)
    for step in (configure, [configure[0], "--build", str(folder), "--parallel", str(os.cpu_count() or 1)],
                 [configure[0], "--install", str(folder), "--prefix", str(prefix)]):
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {what} failed ({' '.join(step[:3])}):\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}")


TARGET_PACKAGES = ("libpaho-mqtt-dev", "libssl-dev", "libssl3")   # what the agent links, for a cross build


def target_libraries(t: Target, log=lambda line: None) -> Path:
    """paho.mqtt.c and OpenSSL for `t`'s machine, unpacked from Debian's packages (`apt-get download`, `dpkg-deb
    -x`) into the cache: a sysroot of their own. Installed through multiarch instead, they bring an arm64 libc
    into /lib/aarch64-linux-gnu that the loader under qemu-aarch64 -L then mixes with the cross toolchain's, and
    the trainer hangs there."""
    root = home() / "sysroot" / t.name
    if (root / ".complete").is_file():
        return root
    apt = _tool("apt-get", "cross-building the agent needs Debian's apt-get")
    dpkg = _tool("dpkg-deb", "cross-building the agent needs Debian's dpkg-deb")
    arch = {"aarch64": "arm64"}[t.machine]
    log(f"unpacking {', '.join(TARGET_PACKAGES)} for {arch} into {root}")
    with tempfile.TemporaryDirectory(prefix="edgefl-debs-") as tmp:
        proc = subprocess.run([apt, "download", *(f"{p}:{arch}" for p in TARGET_PACKAGES)], cwd=tmp,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise MissingDependencyError(f"could not download {arch} packages of the agent's libraries ({last}); let "
                                         f"apt see {arch} packages (nothing is installed): dpkg --add-architecture "
                                         f"{arch} && apt-get update")
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for deb in sorted(Path(tmp).glob("*.deb")):
            subprocess.run([dpkg, "-x", str(deb), str(partial)], check=True, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
        (root / ".complete").write_text("\n".join(TARGET_PACKAGES) + "\n")
    return root


def build_agent(t: Target, folder: Path, log=lambda line: None) -> Path:
    """The native agent built into `folder`'s stage/bin beside the trainer (called by `build`, under its lock)."""
    agent, stamp = staged_agent(folder), folder / ".agent-sources"
    if agent.is_file() and stamp.is_file() and stamp.read_text() == source_hash(agent=True):
        return agent
    cmake = _tool("cmake", "install it with: apt-get install cmake (3.19 or newer)")
    argv = [cmake, "-S", str(AGENT_SOURCES), "-B", str(folder / "agent-build"), "-DCMAKE_BUILD_TYPE=Release"]
    if t.toolchain:
        argv.append(f"-DCMAKE_TOOLCHAIN_FILE={SOURCES / 'toolchains' / t.toolchain}")
        root = target_libraries(t, log)
        lib = root / "usr" / "lib" / f"{t.machine}-linux-gnu"
        argv += [f"-DPAHO_INCLUDE_DIR={root / 'usr' / 'include'}", f"-DPAHO_STATIC={lib / 'libpaho-mqtt3as.a'}",
                 f"-DSSL_LIBRARY={lib / 'libssl.so'}", f"-DCRYPTO_LIBRARY={lib / 'libcrypto.so'}",
                 f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{lib}"]
        if Path("/usr/include/nlohmann/json.hpp").is_file():       # header-only: the build machine's serves
            argv.append("-DNLOHMANN_INCLUDE_DIR=/usr/include")
    log(f"building {AGENT} (native agent) for {t.name} in {folder}")
    try:
        _cmake(AGENT, argv, folder / "agent-build", folder / "stage")
    except RuntimeError as exc:
        if "MQTTAsync.h" in str(exc) or "PAHO" in str(exc) or "nlohmann" in str(exc) or "SSL_LIBRARY" in str(exc):
            arch = ":arm64" if t.toolchain else ""
            raise MissingDependencyError(f"the native agent needs paho.mqtt.c, OpenSSL and nlohmann-json: apt-get "
                                         f"install libpaho-mqtt-dev{arch} libssl-dev{arch} nlohmann-json3-dev") from exc
        raise
    stamp.write_text(source_hash(agent=True))
    return agent


def edgefl_version() -> str:
    """The version the native trainer is stamped with ("0": a source tree that is not installed)."""
    import edgefl

    return edgefl.version() or "0"


def runtime_libraries(target_name: Optional[str] = None) -> Path:
    """The folder of the runtime libraries the trainer for `target_name` loads (bundled beside it)."""
    return sdk(target(target_name)) / "lib"


NEEDED_LIBRARIES = ("libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_backend_xnnpack.so",
                    "libexecutorch_threadpool.so")
