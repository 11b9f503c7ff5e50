"""device_runtime/native.py's cmake step: a build folder configured from another checkout of the sources (a
copied tree, a cache shared between clones, as CI's snapshot of a machine has) is configured afresh instead of
failing with cmake's "does not match the source used to generate cache"."""
from __future__ import annotations

import shutil

import pytest

from edgefl.device_runtime import native

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                                reason="needs cmake and g++")

PROJECT = """cmake_minimum_required(VERSION 3.16)
project(hello CXX)
add_executable(hello hello.cpp)
install(TARGETS hello RUNTIME DESTINATION bin)
"""


def _checkout(folder, greeting):
    folder.mkdir()
    (folder / "CMakeLists.txt").write_text(PROJECT)
    (folder / "hello.cpp").write_text(f'#include <cstdio>\nint main() {{ std::puts("{greeting}"); }}\n')
    return folder


def test_a_build_folder_from_another_checkout_is_reconfigured(tmp_path):
    import subprocess

    build, stage = tmp_path / "build", tmp_path / "stage"
    first, second = _checkout(tmp_path / "first", "first"), _checkout(tmp_path / "second", "second")
    native._cmake("hello", [shutil.which("cmake"), "-S", str(first), "-B", str(build)], build, stage)
    assert subprocess.run([stage / "bin" / "hello"], capture_output=True, text=True).stdout == "first\n"

    shutil.rmtree(stage)    # cmake --install skips a file of the same size and mtime: both builds may share a second
    native._cmake("hello", [shutil.which("cmake"), "-S", str(second), "-B", str(build)], build, stage)
    assert subprocess.run([stage / "bin" / "hello"], capture_output=True, text=True).stdout == "second\n"
    assert str(second) in (build / "CMakeCache.txt").read_text()


def test_a_failing_build_names_the_program_and_keeps_cmakes_words(tmp_path):
    source = _checkout(tmp_path / "src", "x")
    (source / "hello.cpp").write_text("int main() { return undefined_name; }\n")
    with pytest.raises(RuntimeError, match=r"(?s)building hello failed .*undefined_name"):
        native._cmake("hello", [shutil.which("cmake"), "-S", str(source), "-B", str(tmp_path / "b")],
                      tmp_path / "b", tmp_path / "stage")


def test_a_cached_trainer_whose_libraries_moved_is_linked_to_this_environments(tmp_path):
    """A build cache made from another environment (its stage/lib names a removed venv's executorch) is not
    rebuilt but re-linked to the libraries of the executorch installed here."""
    import os

    from export_cases import available

    if not available("executorch"):
        pytest.skip("executorch is not installed")
    t = native.target(None)
    folder = tmp_path / "build"
    (folder / "stage" / "bin").mkdir(parents=True)
    native.staged(folder).write_text("")
    native.staged_agent(folder).write_text("")
    (folder / ".sources").write_text(native.build_stamp(t))
    (folder / ".agent-sources").write_text(native.source_hash(agent=True))
    (folder / "stage" / "lib").symlink_to(tmp_path / "gone-venv" / "executorch" / "lib")
    assert native.build(out=folder) == native.staged(folder)
    assert os.readlink(folder / "stage" / "lib") == str(native.sdk(t) / "lib")
    assert (folder / "stage" / "lib").resolve().is_dir()
