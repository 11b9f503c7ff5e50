// What a round cost in energy (hardware/energy.py), behind one interface: RAPL package counters, a battery
// gauge's energy counter (sysfs power_supply), or the profile's active power x wall time (estimated).
// `auto` picks the first that reads on this machine, the profile last. (No INA219 here yet: --energy ina219
// is refused with that reason.)
#pragma once

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

// `kind`: auto | rapl | battery | ina219 | profile. UserError when the chosen one cannot read here, or when only
// the estimate is left and `power_w` is 0.
std::unique_ptr<EnergyMeter> select_meter(const std::string& kind, double power_w);

}  // namespace edgefl::agent
