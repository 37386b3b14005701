// A shard folder's manifest.json (io/shard.h: read_manifest), including the tissue settings it reads from the
// embedded config_yaml.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_input.h"
#include "io/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  fuzz::expect_input_errors([&] { (void)io::read_manifest(path); });
  return 0;
}
