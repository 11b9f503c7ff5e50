// Fuzz target: what the native agent reads from the network (edgefl/native/agent/src/parse.h): the first byte
// picks the parser, the rest is the payload. Every parser must answer false with a reason for bad bytes, never
// crash or throw.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "agent/src/parse.h"

using namespace edgefl::agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string why;
  switch (data[0] % 7) {
    case 0: {
      Instruction ins;
      std::optional<Unreadable> unreadable;
      parse_instruction(payload, ins, why, &unreadable);
      break;
    }
    case 1: {
      ChunkManifest m;
      if (parse_chunk_manifest(payload, std::string(64, 'a'), m, why)) (void)m.to_json();
      break;
    }
    case 2: {
      Refusal r;
      parse_refusal(payload, r);
      break;
    }
    case 3: {
      SetManifest m;
      if (parse_set_manifest(payload, m, why))
        for (const auto& t : m.trainable) (void)t.numel();
      break;
    }
    case 4: {
      int64_t round = 0;
      bool open = false;
      parse_round_notice(payload, round, open, why);
      break;
    }
    case 5: {
      Receipt r;
      parse_receipt(payload, r, why);
      break;
    }
    default: {
      Topic t;
      parse_topic(payload, t);
      break;
    }
  }
  return 0;
}
