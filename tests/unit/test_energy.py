"""Energy meters: RAPL and battery drivers read a sysfs tree laid out as the kernel's; the INA219 driver
talks to a simulated chip behind the same bus interface as /dev/i2c-N (no such chip on a CI machine)."""
import time

import pytest

from edgefl.errors import ConfigError
from edgefl.hardware.energy import BatteryMeter, Ina219Meter, ProfileMeter, RaplMeter, select_meter


def _rapl_tree(root, energy_uj=1_000_000, max_uj=262_143_328_850):
    pkg = root / "intel-rapl:0"
    pkg.mkdir(parents=True)
    (pkg / "energy_uj").write_text(f"{energy_uj}\n")
    (pkg / "max_energy_range_uj").write_text(f"{max_uj}\n")
    core = root / "intel-rapl:0:0"          # a sub-domain: already inside the package's count
    core.mkdir()
    (core / "energy_uj").write_text("5\n")
    return pkg


def test_rapl_sums_package_domains_only(tmp_path):
    pkg = _rapl_tree(tmp_path)
    meter = RaplMeter(tmp_path)
    assert [d.name for d in meter.domains] == ["intel-rapl:0"]
    meter.start()
    (pkg / "energy_uj").write_text("3500000\n")
    reading = meter.stop()
    assert reading.joules == pytest.approx(2.5)
    assert reading.source == "rapl" and not reading.estimated


def test_rapl_counter_wrap(tmp_path):
    pkg = _rapl_tree(tmp_path, energy_uj=999_000, max_uj=999_999)
    meter = RaplMeter(tmp_path)
    meter.start()
    (pkg / "energy_uj").write_text("500\n")  # wrapped: 999_000 -> 999_999 -> 0 -> 500
    assert meter.stop().joules == pytest.approx((999_999 + 1 - 999_000 + 500) / 1e6)


def test_rapl_missing_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="RAPL"):
        RaplMeter(tmp_path)


class SimulatedIna219:
    """The chip's register file: records configuration writes, answers the power register for a load
    of `watts` at the calibration the driver wrote (datasheet: power = register x 20 x current_lsb)."""

    def __init__(self, watts: float, max_current_a: float = 3.2):
        self.watts, self.current_lsb = watts, max_current_a / 32768
        self.registers = {}
        self.reads = 0

    def write_word(self, address, register, value):
        assert address == 0x40
        self.registers[register] = value

    def read_word(self, address, register):
        assert register == Ina219Meter.POWER and Ina219Meter.CALIBRATION in self.registers
        self.reads += 1
        return round(self.watts / (20 * self.current_lsb))


def test_ina219_configures_and_integrates_power():
    chip = SimulatedIna219(watts=2.5)
    meter = Ina219Meter(chip, shunt_ohms=0.1, max_current_a=3.2, interval_s=0.005)
    meter.start()
    time.sleep(0.2)
    reading = meter.stop()
    assert chip.registers[Ina219Meter.CALIBRATION] == int(0.04096 / (3.2 / 32768 * 0.1)) == 4194
    assert chip.registers[Ina219Meter.CONFIG] == Ina219Meter.CONFIG_VALUE
    assert chip.reads >= 10
    assert reading.source == "ina219" and not reading.estimated
    assert reading.joules == pytest.approx(2.5 * reading.seconds, rel=0.05)


def test_ina219_sensor_failure_is_reported():
    class Broken(SimulatedIna219):
        def read_word(self, address, register):
            raise OSError("remote I/O error")

    meter = Ina219Meter(Broken(1.0), interval_s=0.005)
    meter.start()
    with pytest.raises(RuntimeError, match="remote I/O error"):
        meter.stop()


def test_battery_gauge_integrates_current_times_voltage(tmp_path):
    (tmp_path / "current_now").write_text("-500000\n")   # 0.5 A discharging (negative on some drivers)
    (tmp_path / "voltage_now").write_text("4000000\n")   # 4.0 V
    meter = BatteryMeter(tmp_path, interval_s=0.005)
    meter.start()
    time.sleep(0.15)
    reading = meter.stop()
    assert reading.joules == pytest.approx(2.0 * reading.seconds, rel=0.05)
    assert reading.source == "battery" and not reading.estimated


def test_profile_estimate_is_power_times_time_and_flagged():
    meter = ProfileMeter(3.0)
    meter.start()
    time.sleep(0.05)
    reading = meter.stop()
    assert reading.estimated and reading.source == "profile"
    assert reading.joules == pytest.approx(3.0 * reading.seconds)


def test_select_meter_prefers_measurements(tmp_path):
    powercap, battery = tmp_path / "powercap", tmp_path / "battery"
    assert select_meter(power_active_w=3.0, powercap_root=powercap, battery=battery).source == "profile"
    battery.mkdir()
    (battery / "current_now").write_text("100000\n")
    (battery / "voltage_now").write_text("3800000\n")
    assert select_meter(power_active_w=3.0, powercap_root=powercap, battery=battery).source == "battery"
    _rapl_tree(powercap)
    assert select_meter(power_active_w=3.0, powercap_root=powercap, battery=battery).source == "rapl"
    assert select_meter("profile", power_active_w=3.0, powercap_root=powercap).source == "profile"


@pytest.mark.parametrize("kind, kwargs, match", [
    ("solar", {}, "unknown energy meter"),
    ("ina219", {}, "I2C bus number"),
    ("ina219", {"i2c_bus": 97}, "/dev/i2c-97"),
])
def test_select_meter_errors_name_the_fix(kind, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        select_meter(kind, power_active_w=3.0, **kwargs)
