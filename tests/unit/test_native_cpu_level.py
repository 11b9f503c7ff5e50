"""The native trainer is compiled for an instruction-set level (x86-64-v3 by default: its GEMM runs 3-4x faster
with AVX2 + FMA, device_runtime/native/src/gemm.h). On a CPU without that level it says so in one line and how to
rebuild, exit 2, instead of dying of SIGILL at its first vector instruction: run here under qemu-x86_64 with a CPU
model that lacks AVX2 (qemu64) and one that has it (Haswell). A level outside the known ones is one line too.

Its GEMM is compiled for AVX-512 as well and runs so where the CPU has it: `--version` names the level its
products run at, x86-64-v3 under qemu's Haswell, and here what this CPU's flags say. The AVX-512 copy shares no
code with the rest: two copies of one template compiled for two instruction sets would be one symbol to the
linker, and a CPU without AVX-512 could be handed the wide one."""
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


def _has_v4() -> bool:
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"))


def test_the_gemm_runs_at_the_cpus_level(native_trainer):
    here = subprocess.run([str(native_trainer), "--version"], capture_output=True, text=True, timeout=60)
    level = "x86-64-v4" if _has_v4() else "x86-64-v3"
    assert here.returncode == 0 and here.stdout.strip().endswith(f"(x86-64-v3, GEMM {level})"), here.stdout
    haswell = subprocess.run([QEMU, "-cpu", "Haswell", str(native_trainer), "--version"], capture_output=True,
                             text=True, timeout=60)
    assert haswell.returncode == 0 and haswell.stdout.strip().endswith("(x86-64-v3, GEMM x86-64-v3)"), haswell.stdout


def test_the_avx512_gemm_shares_no_code(native_trainer):
    obj = native.build_dir(native.host_target()) / "CMakeFiles" / "edgefl_gemm_avx512.dir" / "src" / "gemm_eigen.cpp.o"
    nm = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True, timeout=60)
    assert nm.returncode == 0, nm.stderr
    # weak and unique symbols are the ones the linker merges across objects: only the renamed Eigen's may be there
    merged = [line for line in nm.stdout.splitlines() if line.split()[1:2] and line.split()[1] in "WVu"]
    assert merged and all("edgefl_eigen_avx512::" in line or "DW.ref.__gxx_personality_v0" in line
                          for line in merged), [m for m in merged if "edgefl_eigen_avx512::" not in m][:5]
    defined = [line.split(maxsplit=2)[2] for line in nm.stdout.splitlines() if line.split()[1:2] == ["T"]]
    assert defined == ["edgefl::gemm_avx512::gemm(edgefl::Operand const&, edgefl::Operand const&, float*, bool)"]


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
