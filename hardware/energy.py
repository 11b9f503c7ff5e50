"""Energy meters: what a device spent on one round of training, in joules, and where the number comes from.

Every meter has the same two calls, `start()` and `stop() -> EnergyReading`, so the device agent wraps a
training run in whichever one the machine offers (`select_meter`):

* `RaplMeter` - Intel RAPL counters under /sys/class/powercap (x86 laptops and desktops running an
  emulated fleet): package energy in microjoules, read before and after, wrap-around handled.
* `Ina219Meter` - a TI INA219 current/power monitor on I2C, the usual way to meter a Raspberry Pi's 5 V
  supply: the power register is sampled on a thread and integrated over time.
* `BatteryMeter` - Android / Linux battery fuel gauge (power_supply sysfs: current_now x voltage_now),
  sampled and integrated; phones report discharge only while unplugged.
* `ProfileMeter` - no sensor: the device profile's active power times wall time, flagged `estimated`.

Only the estimate is a guess; the other three are measurements, and the report says which it got.
Only the standard library is used, so the torch-free device agent can import this module.
"""
from __future__ import annotations

import glob
import os
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from edgefl.errors import ConfigError

SOURCES = ("rapl", "ina219", "battery", "profile")


@dataclass(frozen=True)
class EnergyReading:
    joules: float
    source: str          # one of SOURCES
    estimated: bool      # True only for the profile estimate
    seconds: float       # the interval measured

    def to_json(self) -> dict:
        return {"joules": self.joules, "source": self.source, "estimated": self.estimated, "seconds": self.seconds}


class EnergyMeter(ABC):
    source: str = ""

    @abstractmethod
    def start(self) -> None:
        """Begin an interval."""

    @abstractmethod
    def stop(self) -> EnergyReading:
        """End the interval and return what it cost."""


class _Integrator:
    """Samples a power reading (W) every `interval_s` on a daemon thread and integrates it with the
    trapezoid rule; a sensor sampled at 100 Hz resolves a training step of tens of milliseconds."""

    def __init__(self, read_watts: Callable[[], float], interval_s: float):
        self._read, self._interval = read_watts, interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.joules = 0.0
        self.error: Optional[BaseException] = None

    def start(self) -> None:
        self._stop.clear()
        self.joules = 0.0
        # the first sample here, not on the thread: a loaded machine may start the thread late, and the
        # integral must cover the time from start() on, as the meter's seconds do
        self.error, self._thread = None, None
        try:
            first = (time.perf_counter(), self._read())
        except BaseException as exc:     # surfaced by stop(), as a failure mid-run is
            self.error = exc
            return
        self._thread = threading.Thread(target=self._run, args=first, name="edgefl-energy", daemon=True)
        self._thread.start()

    def _run(self, last_t: float, last_w: float) -> None:
        try:
            while True:
                stopping = self._stop.wait(self._interval)
                now, watts = time.perf_counter(), self._read()
                self.joules += 0.5 * (watts + last_w) * (now - last_t)
                last_t, last_w = now, watts
                if stopping:
                    return
        except BaseException as exc:  # surfaced by stop(): a sensor that fails mid-run is not silent
            self.error = exc

    def stop(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"energy sensor failed while sampling: {self.error}") from self.error
        return self.joules


class _Timed(EnergyMeter):
    def start(self) -> None:
        self._t0 = time.perf_counter()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._t0


# ------------------------------------------------------------------------------------------------ RAPL

class RaplMeter(_Timed):
    """Package-level RAPL domains (`intel-rapl:N`, not their `:M` sub-domains, which the package already
    includes). Counters are cumulative microjoules that wrap at max_energy_range_uj."""
    source = "rapl"

    def __init__(self, root: str | Path = "/sys/class/powercap"):
        self.domains = self.package_domains(root)
        if not self.domains:
            raise ConfigError(f"no readable Intel RAPL package domain under {root}; RAPL needs an Intel/AMD "
                              "x86 CPU and read access to energy_uj (root, or a udev rule)")

    @staticmethod
    def package_domains(root: str | Path = "/sys/class/powercap") -> list[Path]:
        found = []
        for d in sorted(glob.glob(os.path.join(str(root), "intel-rapl:*"))):
            if os.path.basename(d).count(":") != 1:
                continue
            try:
                int(Path(d, "energy_uj").read_text())
            except (OSError, ValueError):
                continue
            found.append(Path(d))
        return found

    @staticmethod
    def _read(domain: Path, name: str) -> int:
        return int((domain / name).read_text())

    def start(self) -> None:
        super().start()
        self._begin = [self._read(d, "energy_uj") for d in self.domains]

    def stop(self) -> EnergyReading:
        seconds = self._elapsed()
        total_uj = 0
        for domain, begin in zip(self.domains, self._begin, strict=True):
            end = self._read(domain, "energy_uj")
            if end < begin:  # the counter wrapped once (at ~262 kJ on most parts: minutes at full load)
                end += self._read(domain, "max_energy_range_uj") + 1
            total_uj += end - begin
        return EnergyReading(total_uj / 1e6, self.source, False, seconds)


# ---------------------------------------------------------------------------------------------- INA219

class I2CBus(Protocol):
    def read_word(self, address: int, register: int) -> int: ...
    def write_word(self, address: int, register: int, value: int) -> None: ...


class LinuxI2CBus:
    """/dev/i2c-N through the kernel's i2c-dev interface (no extra packages). INA219 registers are
    16-bit big-endian: write the register pointer, then read two bytes."""
    I2C_SLAVE = 0x0703

    def __init__(self, bus: int):
        import fcntl

        self.path = f"/dev/i2c-{bus}"
        try:
            self._fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise ConfigError(f"cannot open {self.path} for the INA219 ({exc.strerror}); enable I2C "
                              "(raspi-config, dtparam=i2c_arm=on) and add the user to the i2c group") from None
        self._fcntl = fcntl
        self._address: Optional[int] = None

    def _select(self, address: int) -> None:
        if address != self._address:
            self._fcntl.ioctl(self._fd, self.I2C_SLAVE, address)
            self._address = address

    def read_word(self, address: int, register: int) -> int:
        self._select(address)
        os.write(self._fd, bytes([register]))
        hi, lo = os.read(self._fd, 2)
        return (hi << 8) | lo

    def write_word(self, address: int, register: int, value: int) -> None:
        self._select(address)
        os.write(self._fd, bytes([register, (value >> 8) & 0xFF, value & 0xFF]))


class Ina219Meter(EnergyMeter):
    """TI INA219 (datasheet SBOS448G, section 8.5): calibration = trunc(0.04096 / (current_lsb * R_shunt))
    with current_lsb = max_expected_current / 2^15; the power register counts in 20 x current_lsb watts."""
    source = "ina219"
    CONFIG, POWER, CALIBRATION = 0x00, 0x03, 0x05
    # 32 V range, +-320 mV shunt range, 12-bit ADCs, continuous shunt and bus conversion (the reset value)
    CONFIG_VALUE = 0x399F

    def __init__(self, bus: I2CBus, address: int = 0x40, shunt_ohms: float = 0.1, max_current_a: float = 3.2,
                 interval_s: float = 0.01):
        if shunt_ohms <= 0 or max_current_a <= 0:
            raise ConfigError("INA219: shunt_ohms and max_current_a must be positive")
        self.bus, self.address = bus, address
        self.current_lsb = max_current_a / 32768
        self.power_lsb = 20 * self.current_lsb
        self.calibration = int(0.04096 / (self.current_lsb * shunt_ohms))
        if not 0 < self.calibration < 0x10000:
            raise ConfigError(f"INA219: calibration {self.calibration} out of range for a {shunt_ohms} ohm "
                              f"shunt and {max_current_a} A; choose a larger max_current_a")
        self._integrator = _Integrator(self.watts, interval_s)

    def configure(self) -> None:
        self.bus.write_word(self.address, self.CONFIG, self.CONFIG_VALUE)
        self.bus.write_word(self.address, self.CALIBRATION, self.calibration)

    def watts(self) -> float:
        return self.bus.read_word(self.address, self.POWER) * self.power_lsb

    def start(self) -> None:
        self.configure()
        self._t0 = time.perf_counter()
        self._integrator.start()

    def stop(self) -> EnergyReading:
        joules = self._integrator.stop()
        return EnergyReading(joules, self.source, False, time.perf_counter() - self._t0)


# --------------------------------------------------------------------------------------------- battery

class BatteryMeter(EnergyMeter):
    """power_supply sysfs of a battery: current_now (uA) x voltage_now (uV). Drivers disagree on the sign
    of discharge current, so its magnitude is used; while charging the gauge does not see the load."""
    source = "battery"

    def __init__(self, supply: str | Path = "/sys/class/power_supply/battery", interval_s: float = 0.05):
        self.supply = Path(supply)
        if not self.available(self.supply):
            raise ConfigError(f"{self.supply} has no readable current_now and voltage_now; "
                              "pick another energy meter (--energy rapl|ina219|profile)")
        self._integrator = _Integrator(self.watts, interval_s)

    @staticmethod
    def available(supply: str | Path) -> bool:
        try:
            int(Path(supply, "current_now").read_text())
            int(Path(supply, "voltage_now").read_text())
            return True
        except (OSError, ValueError):
            return False

    def watts(self) -> float:
        current = abs(int((self.supply / "current_now").read_text())) / 1e6
        voltage = int((self.supply / "voltage_now").read_text()) / 1e6
        return current * voltage

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._integrator.start()

    def stop(self) -> EnergyReading:
        joules = self._integrator.stop()
        return EnergyReading(joules, self.source, False, time.perf_counter() - self._t0)


# --------------------------------------------------------------------------------------------- estimate

class ProfileMeter(_Timed):
    """No sensor: the profile's active power for the whole interval (an upper-end guess: training keeps
    the cores busy), reported as estimated."""
    source = "profile"

    def __init__(self, power_active_w: float):
        if power_active_w <= 0:
            raise ConfigError("no energy sensor to read and no power to estimate from: give the device's "
                              "--profile (its power_active) or --power W")
        self.power_w = power_active_w

    def stop(self) -> EnergyReading:
        seconds = self._elapsed()
        return EnergyReading(self.power_w * seconds, self.source, True, seconds)


def select_meter(kind: str = "auto", *, power_active_w: float, i2c_bus: Optional[int] = None,
                 ina219_address: int = 0x40, shunt_ohms: float = 0.1,
                 powercap_root: str | Path = "/sys/class/powercap",
                 battery: str | Path = "/sys/class/power_supply/battery") -> EnergyMeter:
    """The meter for `kind` (one of SOURCES, or 'auto': INA219 when a bus is configured, else RAPL where
    readable, else a battery gauge, else the profile estimate)."""
    if kind not in ("auto", *SOURCES):
        raise ConfigError(f"unknown energy meter {kind!r}; use one of auto, {', '.join(SOURCES)}")
    if kind == "ina219" or (kind == "auto" and i2c_bus is not None):
        if i2c_bus is None:
            raise ConfigError("--energy ina219 needs the I2C bus number (--i2c-bus N, usually 1 on a Pi)")
        return Ina219Meter(LinuxI2CBus(i2c_bus), ina219_address, shunt_ohms)
    if kind == "rapl" or (kind == "auto" and RaplMeter.package_domains(powercap_root)):
        return RaplMeter(powercap_root)
    if kind == "battery" or (kind == "auto" and BatteryMeter.available(battery)):
        return BatteryMeter(battery)
    return ProfileMeter(power_active_w)
