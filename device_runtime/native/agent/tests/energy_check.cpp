// The native agent's INA219 meter against a simulated chip behind the I2cBus interface (this machine has no
// INA219; tests/unit/test_native_energy.py drives it). Modes:
//   energy_check steady WATTS SECONDS  -> JSON: the registers the meter wrote, its reading
//   energy_check broken READS          -> the chip fails after READS power reads: JSON with stop()'s error
//   energy_check select KIND BUS       -> JSON with select_meter's error (or the source it picked)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "energy.h"
#include "util.h"

using edgefl::agent::I2cBus;
using nlohmann::json;

namespace {

// An INA219 as its datasheet describes the registers the meter uses: the power register holds
// watts / (20 x current_lsb), with current_lsb from the calibration register (0.04096 / (cal x R_shunt)).
struct SimulatedIna219 : I2cBus {
  double watts, shunt_ohms = 0.1;
  long fail_after = -1;
  std::map<int, uint16_t>* registers;
  long power_reads = 0;
  SimulatedIna219(double w, std::map<int, uint16_t>* regs) : watts(w), registers(regs) {}
  uint16_t read_word(int address, int reg) override {
    if (address != 0x40) throw std::runtime_error("no device at that address");
    if (reg != 0x03 || !registers->count(0x05)) throw std::runtime_error("unexpected read");
    if (fail_after >= 0 && power_reads >= fail_after) throw std::runtime_error("/dev/i2c-1: read register 3: Remote I/O error");
    power_reads++;
    const double current_lsb = 0.04096 / ((*registers)[0x05] * shunt_ohms);
    return static_cast<uint16_t>(std::lround(watts / (20 * current_lsb)));
  }
  void write_word(int address, int reg, uint16_t value) override {
    if (address != 0x40) throw std::runtime_error("no device at that address");
    (*registers)[reg] = value;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  std::map<int, uint16_t> registers;
  json out;
  try {
    if (mode == "select") {
      auto meter = edgefl::agent::select_meter(argv[2], 0, std::atoi(argv[3]));
      out["picked"] = true;
    } else {
      auto chip = std::make_unique<SimulatedIna219>(std::atof(argv[2]), &registers);
      SimulatedIna219* seen = chip.get();
      if (mode == "broken") chip->fail_after = std::atol(argv[3]);
      auto meter = edgefl::agent::ina219_meter(std::move(chip), 0x40, 0.1, 3.2, 0.005);
      meter->start();
      std::this_thread::sleep_for(std::chrono::duration<double>(mode == "steady" ? std::atof(argv[3]) : 0.2));
      const auto r = meter->stop();
      out = json::parse(r.to_json());
      out["power_reads"] = seen->power_reads;
    }
  } catch (const std::exception& e) {
    out["error"] = e.what();
  }
  out["calibration"] = registers.count(0x05) ? registers[0x05] : -1;
  out["config"] = registers.count(0x00) ? registers[0x00] : -1;
  std::puts(out.dump().c_str());
  return 0;
}
