#include "energy.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/i2c-dev.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
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

class LinuxI2cBus : public I2cBus {
 public:
  explicit LinuxI2cBus(int bus) : path_("/dev/i2c-" + std::to_string(bus)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0)
      throw UserError("cannot open " + path_ + " for the INA219 (" + std::strerror(errno) + "); enable I2C "
                      "(raspi-config, dtparam=i2c_arm=on) and add the user to the i2c group");
  }
  ~LinuxI2cBus() override { ::close(fd_); }
  uint16_t read_word(int address, int reg) override {
    select(address);
    const unsigned char pointer = static_cast<unsigned char>(reg);
    unsigned char word[2];
    if (::write(fd_, &pointer, 1) != 1 || ::read(fd_, word, 2) != 2) fail("read register " + std::to_string(reg));
    return static_cast<uint16_t>(word[0] << 8 | word[1]);
  }
  void write_word(int address, int reg, uint16_t value) override {
    select(address);
    const unsigned char bytes[3] = {static_cast<unsigned char>(reg), static_cast<unsigned char>(value >> 8),
                                    static_cast<unsigned char>(value & 0xFF)};
    if (::write(fd_, bytes, 3) != 3) fail("write register " + std::to_string(reg));
  }

 private:
  void select(int address) {
    if (address == address_) return;
    if (::ioctl(fd_, I2C_SLAVE, address) < 0) fail("select address " + std::to_string(address));
    address_ = address;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": " + what + ": " + std::strerror(errno));
  }
  std::string path_;
  int fd_ = -1, address_ = -1;
};

class Ina219Meter : public Timed {
 public:
  static constexpr int CONFIG = 0x00, POWER = 0x03, CALIBRATION = 0x05;
  static constexpr uint16_t CONFIG_VALUE = 0x399F;   // 32 V, +-320 mV shunt, 12-bit ADCs, continuous (reset value)

  Ina219Meter(std::unique_ptr<I2cBus> bus, int address, double shunt_ohms, double max_current_a, double interval_s)
      : bus_(std::move(bus)), address_(address), interval_(interval_s) {
    if (shunt_ohms <= 0 || max_current_a <= 0) throw UserError("INA219: shunt_ohms and max_current_a must be positive");
    const double current_lsb = max_current_a / 32768;
    power_lsb_ = 20 * current_lsb;
    const long calibration = static_cast<long>(0.04096 / (current_lsb * shunt_ohms));
    if (calibration <= 0 || calibration >= 0x10000)
      throw UserError("INA219: calibration " + std::to_string(calibration) + " out of range for the shunt and "
                      "current given; choose a larger max current");
    calibration_ = static_cast<uint16_t>(calibration);
  }
  ~Ina219Meter() override { halt(); }

  void start() override {
    halt();
    joules_ = 0;
    error_.clear();
    t0_ = now_s();
    try {
      bus_->write_word(address_, CONFIG, CONFIG_VALUE);
      bus_->write_word(address_, CALIBRATION, calibration_);
      t0_ = now_s();
      // the first sample here, not on the thread: the integral covers the time from start() on, as seconds do
      const double first = watts();
      stopping_ = false;
      sampler_ = std::thread([this, first] { run(t0_, first); });
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  EnergyReading stop() override {
    halt();
    const double s = elapsed();
    if (!error_.empty()) throw UserError("INA219: " + error_);
    return {joules_, s, "ina219", false};
  }

 private:
  double watts() { return bus_->read_word(address_, POWER) * power_lsb_; }
  void run(double last_t, double last_w) {
    try {
      for (bool stopping = false; !stopping;) {
        {
          std::unique_lock<std::mutex> lock(mutex_);
          stopping = wake_.wait_for(lock, std::chrono::duration<double>(interval_), [this] { return stopping_; });
        }
        const double now = now_s(), w = watts();
        joules_ += 0.5 * (w + last_w) * (now - last_t);
        last_t = now;
        last_w = w;
      }
    } catch (const std::exception& e) {   // a sensor that fails mid-round is not silent: stop() says so
      error_ = e.what();
    }
  }
  void halt() {
    if (!sampler_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    sampler_.join();
  }
  std::unique_ptr<I2cBus> bus_;
  int address_;
  double interval_, power_lsb_ = 0, joules_ = 0;
  uint16_t calibration_ = 0;
  std::string error_;
  std::thread sampler_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace

std::unique_ptr<I2cBus> linux_i2c_bus(int bus) { return std::make_unique<LinuxI2cBus>(bus); }

std::unique_ptr<EnergyMeter> ina219_meter(std::unique_ptr<I2cBus> bus, int address, double shunt_ohms,
                                          double max_current_a, double interval_s) {
  return std::make_unique<Ina219Meter>(std::move(bus), address, shunt_ohms, max_current_a, interval_s);
}

std::string EnergyReading::to_json() const {
  return nlohmann::json{{"joules", joules}, {"source", source}, {"estimated", estimated}, {"seconds", seconds}}.dump();
}

std::unique_ptr<EnergyMeter> select_meter(const std::string& kind, double power_w, int i2c_bus) {
  if (kind != "auto" && kind != "rapl" && kind != "battery" && kind != "ina219" && kind != "profile")
    throw UserError("--energy " + kind + ": choose auto, rapl, battery, ina219 or profile");
  if (kind == "ina219" || (kind == "auto" && i2c_bus >= 0)) {
    if (i2c_bus < 0) throw UserError("--energy ina219 needs the I2C bus number (--i2c-bus N, usually 1 on a Pi)");
    return ina219_meter(linux_i2c_bus(i2c_bus));
  }
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
