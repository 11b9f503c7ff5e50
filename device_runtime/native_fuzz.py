"""The fuzz targets of the native trainer's and agent's parsers (device_runtime/native/fuzz/): where they are
and how one is compiled, for bench/fuzz_native.py (libFuzzer) and the default suite's replay of their corpora."""
from __future__ import annotations

from pathlib import Path

from edgefl.device_runtime.native import SOURCES

FUZZ = SOURCES / "fuzz"


def fuzz_targets() -> dict[str, Path]:
    """The fuzz targets of the native parsers, by name: every folder under native/fuzz holding a harness.cpp
    (LLVMFuzzerTestOneInput), its seed inputs in corpus/ and, optionally, `sources`: the .cpp files it links,
    one per line, relative to native/."""
    return {harness.parent.name: harness.parent for harness in sorted(FUZZ.glob("*/harness.cpp"))}


def fuzz_compile_argv(compiler: str, folder: Path, out: Path, flags: list[str]) -> list[str]:
    """The command line that builds the fuzz target in `folder` into `out`: the harness and its sources, with
    native/src and native/ on the include path; `flags` choose libFuzzer (clang) or a replay main (g++)."""
    listed = folder / "sources"
    sources = [str(SOURCES / line.strip()) for line in listed.read_text().splitlines() if line.strip()] \
        if listed.is_file() else []
    return [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", *flags, "-I", str(SOURCES / "src"), "-I",
            str(SOURCES), str(folder / "harness.cpp"), *sources, "-o", str(out)]
