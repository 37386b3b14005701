#include "io/hdf5.h"
#include "io/hdf5_library.h"

#include <cstdlib>
#include <cstring>

namespace tessera::io::hdf5 {
namespace {

herr_t collect_error(unsigned depth, const H5E_error2_t* entry, void* data) {
  auto* failure = static_cast<Failure*>(data);
  const std::string desc = entry->desc != nullptr ? entry->desc : "";
  if (depth == 0) failure->api = desc;
  if (!desc.empty()) failure->detail = desc;
  // The _g variable, not the H5E_TRUNCATED macro: the macro calls H5open(), an API call inside the walk.
  if (entry->min_num == H5E_TRUNCATED_g) failure->truncated = desc;
  // A failing system call is recorded as "..., errno = 28, error message = 'No space left on device', ...".
  if (const auto at = desc.find("errno = "); at != std::string::npos && failure->system_error == 0) {
    failure->system_error = std::atoi(desc.c_str() + at + std::strlen("errno = "));
  }
  return 0;
}

}  // namespace

Failure last_failure() {
  Failure failure;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &failure);
  return failure;
}

}  // namespace tessera::io::hdf5

namespace tessera::io {

void skip_hdf5_exit_cleanup() { H5dont_atexit(); }

}  // namespace tessera::io
