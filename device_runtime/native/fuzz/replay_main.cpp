// Runs a fuzz target's LLVMFuzzerTestOneInput once on each file named on the command line, for builds
// without libFuzzer (g++ with AddressSanitizer and UBSan replays the committed corpus in the test suite).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot open\n", argv[i]);
      return 2;
    }
    // An exact-size heap copy, so that reading one byte past the input is an AddressSanitizer error.
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto* data = new uint8_t[bytes.size()];
    std::copy(bytes.begin(), bytes.end(), data);
    LLVMFuzzerTestOneInput(data, bytes.size());
    delete[] data;
  }
  std::printf("replayed %d inputs\n", argc - 1);
  return 0;
}
