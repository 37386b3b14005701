// The direct TIFF reader (io/tiff_reader.h): a slide's header (directories, tags, tile layout) and its tiles.
//
// The input is a whole TIFF file. TiffTileReader::open takes the level sizes that OpenSlide reports; here they are
// what OpenSlide's generic-tiff driver would report: every tiled directory, widest first. Then a tile-sized region
// at the top left of every level, and one across the bottom-right corner (partial edge tiles, white outside).
#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "io/tiff_reader.h"

namespace {

int quiet(TIFF*, void*, const char*, const char*, va_list) { return 1; }

std::vector<tessera::io::TiffLevelSize> tiled_levels(const std::string& path) {
  std::vector<tessera::io::TiffLevelSize> levels;
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetErrorHandlerExtR(options, quiet, nullptr);
  TIFFOpenOptionsSetWarningHandlerExtR(options, quiet, nullptr);
  TIFF* tif = TIFFOpenExt(path.c_str(), "r", options);
  TIFFOpenOptionsFree(options);
  if (tif == nullptr) return levels;
  int directories = 0;
  do {
    std::uint32_t width = 0;
    std::uint32_t height = 0;
    if (TIFFIsTiled(tif) != 0 && TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width) == 1 &&
        TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &height) == 1) {
      levels.push_back({width, height});
    }
  } while (++directories < 64 && TIFFReadDirectory(tif) == 1);
  TIFFClose(tif);
  std::stable_sort(levels.begin(), levels.end(), [](const auto& a, const auto& b) { return a.width > b.width; });
  return levels;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string& path = fuzz::InputFile::instance().write(data, size);
  const auto levels = tiled_levels(path);
  if (levels.empty()) return 0;
  std::string why_not;
  // Aperio's blank missing tiles on odd-sized inputs; a small cache so that eviction runs too.
  const auto reader = io::TiffTileReader::open(path, levels, size % 2 == 1, why_not, std::size_t{1} << 20);
  if (reader == nullptr) {
    if (why_not.empty()) std::abort();  // a declined file always says why
    return 0;
  }
  fuzz::expect_input_errors([&] {
    for (int level = 0; level < static_cast<int>(levels.size()); ++level) {
      const std::int64_t width = levels[static_cast<std::size_t>(level)].width;
      const std::int64_t height = levels[static_cast<std::size_t>(level)].height;
      (void)reader->read(level, -8, -8, 256, 256);
      (void)reader->read(level, width - 3, height - 3, 6, 6);
    }
  });
  return 0;
}
