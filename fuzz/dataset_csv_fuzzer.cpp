// dataset.csv, the slide list of tile, infer and evaluate.
//
// The reader under test is read_dataset_under_test() below, one line: today the CSV layer that tile and evaluate
// read dataset.csv through (io/csv.h, line by line as they do); when the one dataset.csv reader lands in io/, that
// line becomes a call to it (with its #include), and the corpus and regressions stay as they are.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz/fuzz_input.h"
#include "io/csv.h"

namespace {

// The loop of tile's and evaluate's dataset readers, without their column checks.
void split_csv_file(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (tessera::io::split_csv_line(line).empty()) std::abort();  // a line has at least one (empty) field
  }
}

void read_dataset_under_test(const std::string& path) { split_csv_file(path); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  fuzz::expect_input_errors([&] { read_dataset_under_test(path); });
  return 0;
}
