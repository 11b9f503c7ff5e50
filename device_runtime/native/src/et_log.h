// ExecuTorch's log, captured: the runtime names a missing operator only in its log, and a device's
// one-line error must name it. EDGEFL_ET_LOG=1 also echoes the log to stderr.
#pragma once

#include <string>

namespace edgefl {

void et_log_clear();
std::string et_log_missing_operators();  // "aten::x.out, aten::y.out" from the log since the last clear

}  // namespace edgefl
