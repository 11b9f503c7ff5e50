#include "energy.h"

#include <dirent.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "util.h"

namespace edgefl::agent {
namespace {

bool read_int(const std::string& path, long long& v) {
  std::ifstream f(path);
  return static_cast<bool>(f >> v);
}

std::vector<std::string> matching(const std::string& dir, const std::string& prefix, const std::string& file) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      long long v;
      // RAPL: packages only (intel-rapl:N), never their sub-domains (intel-rapl:N:M), which a package includes
      if (name.rfind(prefix, 0) == 0 && !(prefix == "intel-rapl:" && name.find(':', prefix.size()) != std::string::npos) &&
          read_int(dir + "/" + name + "/" + file, v))
        out.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  return out;
}

class Timed : public EnergyMeter {
 protected:
  double t0_ = 0;
  double elapsed() const { return now_s() - t0_; }
};

class ProfileMeter : public Timed {
 public:
  explicit ProfileMeter(double watts) : watts_(watts) {}
  void start() override { t0_ = now_s(); }
  EnergyReading stop() override {
    const double s = elapsed();
    return {watts_ * s, s, "profile", true};
  }

 private:
  double watts_;
};

// Cumulative microjoule (RAPL energy_uj) or microwatt-hour (battery energy_now, counting down) counters.
class CounterMeter : public Timed {
 public:
  CounterMeter(std::vector<std::string> domains, std::string file, std::string source, double joules_per_unit, int sign)
      : domains_(std::move(domains)), file_(std::move(file)), source_(std::move(source)), scale_(joules_per_unit),
        sign_(sign) {}
  void start() override {
    t0_ = now_s();
    begin_ = read();
  }
  EnergyReading stop() override {
    const double s = elapsed();
    long long end = read(), delta = sign_ * (end - begin_);
    if (delta < 0 && file_ == "energy_uj") {   // the counter wrapped once
      long long range = 0;
      read_int(domains_.front() + "/max_energy_range_uj", range);
      delta += range + 1;
    }
    return {static_cast<double>(delta < 0 ? 0 : delta) * scale_, s, source_, false};
  }

 private:
  long long read() const {
    long long total = 0, v = 0;
    for (const auto& d : domains_)
      if (read_int(d + "/" + file_, v)) total += v;
    return total;
  }
  std::vector<std::string> domains_;
  std::string file_, source_;
  double scale_;
  int sign_;
  long long begin_ = 0;
};

}  // namespace

std::string EnergyReading::to_json() const {
  return nlohmann::json{{"joules", joules}, {"source", source}, {"estimated", estimated}, {"seconds", seconds}}.dump();
}

std::unique_ptr<EnergyMeter> select_meter(const std::string& kind, double power_w) {
  if (kind == "ina219")
    throw UserError("--energy ina219: this native agent has no INA219 reader yet; use --energy auto|rapl|battery|profile");
  if (kind != "auto" && kind != "rapl" && kind != "battery" && kind != "profile")
    throw UserError("--energy " + kind + ": choose auto, rapl, battery, ina219 or profile");
  if (kind == "auto" || kind == "rapl") {
    auto rapl = matching("/sys/class/powercap", "intel-rapl:", "energy_uj");
    if (!rapl.empty()) return std::make_unique<CounterMeter>(rapl, "energy_uj", "rapl", 1e-6, 1);
    if (kind == "rapl")
      throw UserError("--energy rapl: no readable Intel RAPL package domain under /sys/class/powercap; RAPL needs an "
                      "x86 CPU and read access to energy_uj (root, or a udev rule)");
  }
  if (kind == "auto" || kind == "battery") {
    auto bat = matching("/sys/class/power_supply", "BAT", "energy_now");
    if (!bat.empty()) return std::make_unique<CounterMeter>(bat, "energy_now", "battery", 3.6e-3, -1);  // µWh -> J
    if (kind == "battery")
      throw UserError("--energy battery: no battery gauge with energy_now under /sys/class/power_supply");
  }
  if (power_w <= 0)
    throw UserError("no energy sensor read here and no power figure for the estimate: give --power, e.g. --power 3W");
  return std::make_unique<ProfileMeter>(power_w);
}

}  // namespace edgefl::agent
