"""The native agent's INA219 meter (device_runtime/native/agent/src/energy.cpp) against a simulated chip behind
its I2cBus interface, as tests/unit/test_energy.py checks the Python one: it writes the datasheet's calibration
(trunc(0.04096 / (3.2 A / 2^15 x 0.1 ohm)) = 4194) and configuration, integrates a steady 2.5 W to 2.5 J per second,
flagged measured; a chip that fails mid-round makes the reading fail, naming the read; --energy ina219 without a bus,
or with a bus this machine lacks, is one line naming the fix or the device file."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "device_runtime" / "native" / "agent"


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not installed: the native agent's meters cannot be compiled; apt-get install -y g++")
    exe = tmp_path_factory.mktemp("energy") / "energy_check"
    subprocess.run([gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                    "-I", str(AGENT / "include"), "-I", str(AGENT / "src"), "-I", str(AGENT.parent / "src"),
                    str(AGENT / "tests" / "energy_check.cpp"), str(AGENT / "src" / "energy.cpp"),
                    str(AGENT / "src" / "util.cpp"), "-o", str(exe)], check=True)

    def run(*args) -> dict:
        p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    return run


def test_ina219_configures_the_chip_and_integrates_its_power(check):
    r = check("steady", 2.5, 0.4)
    assert r["calibration"] == int(0.04096 / (3.2 / 32768 * 0.1)) == 4194
    assert r["config"] == 0x399F
    assert r["source"] == "ina219" and r["estimated"] is False and "error" not in r
    assert r["seconds"] >= 0.4 and r["power_reads"] >= 10                 # sampled every 5 ms on its own thread
    # the register's resolution (20 x 3.2 A / 2^15 ~ 2 mW) and the trapezoid over the whole span: within 1%
    assert r["joules"] == pytest.approx(2.5 * r["seconds"], rel=0.01)


def test_a_chip_failing_mid_round_makes_the_reading_fail_naming_the_read(check):
    r = check("broken", 1.0, 5)
    assert r["error"] == "INA219: /dev/i2c-1: read register 3: Remote I/O error"


@pytest.mark.parametrize("bus, said", [
    (-1, "--energy ina219 needs the I2C bus number (--i2c-bus N, usually 1 on a Pi)"),
    (97, "cannot open /dev/i2c-97 for the INA219 (No such file or directory); enable I2C (raspi-config, "
         "dtparam=i2c_arm=on) and add the user to the i2c group"),
])
def test_ina219_without_a_usable_bus_is_one_line(check, bus, said):
    assert check("select", "ina219", bus)["error"] == said
