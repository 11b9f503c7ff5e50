// Fuzz target: an artifact set's manifest.json, as open_artifact_set reads it (parse, every field the
// trainer uses, the suffix's own fields), and the report writer over the parsed document. Bad bytes must
// end in a UserError, nothing else.
#include <cstddef>
#include <cstdint>

#include "artifact_set.h"
#include "errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    edgefl::ArtifactSet set;
    set.suffix = edgefl::parse_manifest(reinterpret_cast<const char*>(data), size, "set");
    for (const auto& entry : set.suffix.trainable) (void)entry.numel();
    (void)set.suffix.json.dump(-1, ' ', false, edgefl::Json::error_handler_t::replace);
    edgefl::read_suffix_fields(set);
    (void)set.suffix.file("program");
  } catch (const edgefl::UserError&) {
  }
  return 0;
}
