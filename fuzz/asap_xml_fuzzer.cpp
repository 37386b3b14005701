// ASAP XML annotations (io/annotations.h: read_asap_xml), then the geometry every caller computes from them.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_input.h"
#include "io/annotations.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  fuzz::expect_input_errors([&] {
    for (const io::Annotation& a : io::read_asap_xml(path)) {
      (void)io::annotation_area(a);
      (void)io::bounding_box(a.outer);
    }
  });
  return 0;
}
