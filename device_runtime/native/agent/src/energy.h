// What a round cost in energy (hardware/energy.py), behind one interface: an INA219 power monitor on I2C, RAPL
// package counters, a battery gauge's energy counter (sysfs power_supply), or the profile's active power x wall
// time (estimated). `auto` takes the INA219 when a bus is given, else the first that reads on this machine, the
// profile last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace edgefl::agent {

struct EnergyReading {
  double joules = 0, seconds = 0;
  std::string source;
  bool estimated = true;
  std::string to_json() const;
};

class EnergyMeter {
 public:
  virtual ~EnergyMeter() = default;
  virtual void start() = 0;
  virtual EnergyReading stop() = 0;
};

// An I2C bus as the INA219 meter uses it: 16-bit registers, big-endian on the wire. The real one is
// linux_i2c_bus (/dev/i2c-N through i2c-dev); tests give the meter a simulated chip behind this interface.
class I2cBus {
 public:
  virtual ~I2cBus() = default;
  virtual uint16_t read_word(int address, int reg) = 0;
  virtual void write_word(int address, int reg, uint16_t value) = 0;
};

// /dev/i2c-`bus`, or UserError naming it and how to enable I2C.
std::unique_ptr<I2cBus> linux_i2c_bus(int bus);

// TI INA219 (datasheet SBOS448G, section 8.5), as hardware/energy.py's Ina219Meter: calibration =
// trunc(0.04096 / (current_lsb x R_shunt)) with current_lsb = max current / 2^15, the power register in 20 x
// current_lsb watts, sampled every `interval_s` on a thread of its own and integrated with the trapezoid rule.
// A read that fails mid-round makes stop() throw, naming it: the round's energy is not silently wrong.
std::unique_ptr<EnergyMeter> ina219_meter(std::unique_ptr<I2cBus> bus, int address = 0x40, double shunt_ohms = 0.1,
                                          double max_current_a = 3.2, double interval_s = 0.01);

// `kind`: auto | rapl | battery | ina219 | profile; `i2c_bus` the INA219's bus (-1: none). UserError when the
// chosen one cannot read here, or when only the estimate is left and `power_w` is 0.
std::unique_ptr<EnergyMeter> select_meter(const std::string& kind, double power_w, int i2c_bus = -1);

}  // namespace edgefl::agent
