// The DICOM whole-slide reader (io/dicom_slide.h): a series' header (DCMTK's parse, levels, tile grid, offset table
// or fragment walk, functional groups) and its frames (libjpeg, OpenJPEG, DCMTK's JPEG-LS, uncompressed).
//
// The input is one DICOM file, written as the only file of a private folder (the reader looks for the series'
// siblings in the file's folder, so it cannot be the memfd of fuzz_input.h, whose folder is /proc/self/fd). Then a
// region at the top left of every level, one across its bottom-right corner, and every associated image.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/fuzz_input.h"
#include "io/dicom_slide.h"

namespace {

const std::string& input_folder() {
  static const std::string folder = [] {
    const auto path = std::filesystem::temp_directory_path() / ("tessera-fuzz-dicom-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path.string();
  }();
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string path = input_folder() + "/input.dcm";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  if (!io::looks_like_dicom(path)) return 0;
  // A small cache, so that eviction runs too.
  fuzz::expect_input_errors([&] {
    const auto slide = io::DicomSlide::open(path, std::size_t{1} << 20);
    for (std::size_t level = 0; level < slide->levels().size(); ++level) {
      const auto& l = slide->levels()[level];
      (void)slide->read(static_cast<int>(level), -8, -8, 64, 64);
      (void)slide->read(static_cast<int>(level), l.width - 3, l.height - 3, 6, 6);
    }
    for (const auto& a : slide->associated()) {
      if (a.width * a.height <= (std::int64_t{1} << 22)) (void)slide->read_associated(a.name);
    }
  });
  return 0;
}
