"""The native trainer is compiled for an instruction-set level (x86-64-v3 by default: its GEMM runs 3-4x faster
with AVX2 + FMA, device_runtime/native/src/gemm.h). On a CPU without that level it says so in one line and how to
rebuild, exit 2, instead of dying of SIGILL at its first vector instruction: run here under qemu-x86_64 with a CPU
model that lacks AVX2 (qemu64) and one that has it (Haswell). A level outside the known ones is one line too."""
import platform
import shutil
import subprocess

import pytest

from edgefl.device_runtime import native
from edgefl.errors import ConfigError

QEMU = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or QEMU is None,
                                reason="needs an x86_64 machine and qemu-x86_64 (apt-get install qemu-user-static)")


def test_a_cpu_without_the_level_is_refused_in_one_line(native_trainer):
    old = subprocess.run([QEMU, "-cpu", "qemu64", str(native_trainer), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert old.returncode == 2 and old.stdout == ""
    assert old.stderr.splitlines() == [
        "edgefl-et-train: this trainer was built for x86-64-v3 CPUs and this CPU lacks that level (v2: SSE4.2, v3: "
        "AVX2 and FMA, v4: AVX-512); rebuild it for this CPU with 'EDGEFL_CPU_LEVEL=x86-64 edgefl-device "
        "build-native' and keep EDGEFL_CPU_LEVEL set where edgefl-device runs"], old.stderr
    new = subprocess.run([QEMU, "-cpu", "Haswell", str(native_trainer), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert new.returncode == 0 and "--kernels" in new.stdout, new.stderr[-2000:]


def test_the_level_keys_the_build(monkeypatch):
    t = native.target("linux-x86_64")
    monkeypatch.delenv("EDGEFL_CPU_LEVEL", raising=False)
    default = native.build_dir(t)
    monkeypatch.setenv("EDGEFL_CPU_LEVEL", "x86-64")
    assert native.build_dir(t) != default and native.build_dir(t).name.endswith("-x86-64")
    assert native.build_stamp(t).endswith(" x86-64")
    assert native.cpu_level(native.target("linux-aarch64")) is None       # armv8-a, whatever the variable says
    monkeypatch.setenv("EDGEFL_CPU_LEVEL", "avx2")
    with pytest.raises(ConfigError, match=r"^EDGEFL_CPU_LEVEL=avx2: unknown; choose one of: x86-64, x86-64-v2, "):
        native.build_dir(t)
