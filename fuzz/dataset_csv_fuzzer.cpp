// dataset.csv, the slide list of tile, infer and evaluate.
//
// The reader under test: io::read_dataset_csv, the one dataset.csv reader of tile, infer and evaluate (slides and
// labels required, as evaluate reads it: every column check runs).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz/fuzz_input.h"
#include "io/dataset.h"

namespace {

void read_dataset_under_test(const std::string& path) {
  (void)tessera::io::read_dataset_csv(path, {.slide = true, .label = true});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  fuzz::expect_input_errors([&] { read_dataset_under_test(path); });
  return 0;
}
