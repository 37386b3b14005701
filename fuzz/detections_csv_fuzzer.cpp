// The detections CSV that `tessera evaluate` reads (<slide>.detections.csv: CAMELYON16 prob,X,Y, with or without
// a header naming the columns). evaluate calls analysis::read_detections, the library-level parser, for it.
#include <cstddef>
#include <cstdint>

#include "analysis/detections.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  fuzz::expect_input_errors([&] { (void)analysis::read_detections(path); });
  return 0;
}
