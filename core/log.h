// Logging for every verb: spdlog to stderr, "[time] [level] message", with a "[rank R/N]" prefix when the
// job has more than one rank. Levels: trace, debug, info, warn, error, off.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tessera::core {

// Sets up the default logger. `level` is one of the names above (InputError-free: an unknown name is a
// UsageError listing the valid ones). Call once after MPI is initialized.
void init_logging(const std::string& level, int rank, int size);

}  // namespace tessera::core
