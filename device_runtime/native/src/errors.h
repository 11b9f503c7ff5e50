// Errors the trainer reports to the person running it.
#pragma once

#include <stdexcept>

namespace edgefl {

// A problem the user can fix (a bad file, a wrong setting). main() prints what() as one line and exits
// non-zero without a stack trace, so the message must name the file, the problem and, where there is
// one, the fix. Bugs in the trainer itself use the standard exceptions instead.
struct UserError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace edgefl
