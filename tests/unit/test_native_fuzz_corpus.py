"""device_runtime/native/fuzz: every committed fuzz input replays cleanly, without clang or libFuzzer.

Each fuzz target (a folder under native/fuzz with a harness.cpp, found by edgefl.device_runtime.native_fuzz.fuzz_targets)
is built with g++ and -fsanitize=address,undefined around a small replay main (native/fuzz/replay_main.cpp) that
calls the harness's LLVMFuzzerTestOneInput on each file of the target's corpus/: the seed inputs and what
bench/fuzz_native.py --merge added, crashes it found included. Guarantees that:
- every target has a corpus and builds without a warning;
- every input ends in a result or a UserError: no crash, no AddressSanitizer or UBSan report.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgefl.device_runtime import native_fuzz

TARGETS = native_fuzz.fuzz_targets()
# -O0: the build is most of the time (nlohmann-json); UBSan findings abort, so a report cannot pass as a warning
FLAGS = ["-g1", "-O0", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         str(native_fuzz.FUZZ / "replay_main.cpp")]


@pytest.fixture(scope="module")
def replayers(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not installed: the fuzz corpus cannot be replayed; apt-get install -y g++")
    out = tmp_path_factory.mktemp("fuzz")

    def build(name):
        binary = out / f"replay_{name}"
        proc = subprocess.run(native_fuzz.fuzz_compile_argv(gxx, TARGETS[name], binary, FLAGS), capture_output=True,
                              text=True)
        return name, binary, proc

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return {name: (binary, proc) for name, binary, proc in pool.map(build, TARGETS)}


def test_targets_found():
    assert {"manifest_json", "npy", "npz"} <= set(TARGETS)


@pytest.mark.parametrize("name", list(TARGETS))
def test_corpus_replays_clean(replayers, name):
    binary, build = replayers[name]
    assert build.returncode == 0 and not build.stderr, build.stderr
    inputs = sorted(p for p in (TARGETS[name] / "corpus").iterdir() if p.is_file())
    assert inputs, f"{name} has no corpus"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    proc = subprocess.run([str(binary), *map(str, inputs)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-4000:]
    assert proc.stdout.strip() == f"replayed {len(inputs)} inputs"
