// fuzz_tiff_seed: a small TIFF slide cut from a real one, as a seed for the tiff fuzz target (scripts/fuzz-seeds.sh).
//
//   fuzz_tiff_seed <slide.tif|.svs> <out.tif> <tiles>
//
// Copies the first tiled directory's tags and its top-left <tiles> x <tiles> tiles, byte for byte (no decoding or
// re-encoding: the scanner's JPEG tables and tiles stay as they are), into a one-level tiled TIFF. Real slides are
// megabytes; the fuzzer wants their header layout and a few real tiles in a few tens of kilobytes.
#include <tiffio.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_tiff_seed: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
void copy_field(TIFF* in, TIFF* out, ttag_t tag) {
  T value{};
  if (TIFFGetField(in, tag, &value) == 1) TIFFSetField(out, tag, value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) fail("usage: fuzz_tiff_seed <slide> <out.tif> <tiles>");
  const std::uint32_t tiles = static_cast<std::uint32_t>(std::max(1, std::atoi(argv[3])));
  TIFF* in = TIFFOpen(argv[1], "r");
  if (in == nullptr) fail(std::string("cannot open ") + argv[1]);
  while (TIFFIsTiled(in) == 0) {
    if (TIFFReadDirectory(in) != 1) fail(std::string("no tiled directory in ") + argv[1]);
  }
  std::uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0;
  TIFFGetField(in, TIFFTAG_IMAGEWIDTH, &width);
  TIFFGetField(in, TIFFTAG_IMAGELENGTH, &height);
  TIFFGetField(in, TIFFTAG_TILEWIDTH, &tile_width);
  TIFFGetField(in, TIFFTAG_TILELENGTH, &tile_height);
  if (tile_width == 0 || tile_height == 0) fail("no tile size");
  const std::uint32_t across = (width + tile_width - 1) / tile_width;
  const std::uint32_t columns = std::min(tiles, across);
  const std::uint32_t rows = std::min(tiles, (height + tile_height - 1) / tile_height);

  TIFF* out = TIFFOpen(argv[2], "w");
  if (out == nullptr) fail(std::string("cannot create ") + argv[2]);
  TIFFSetField(out, TIFFTAG_IMAGEWIDTH, std::min(width, columns * tile_width));
  TIFFSetField(out, TIFFTAG_IMAGELENGTH, std::min(height, rows * tile_height));
  TIFFSetField(out, TIFFTAG_TILEWIDTH, tile_width);
  TIFFSetField(out, TIFFTAG_TILELENGTH, tile_height);
  copy_field<std::uint16_t>(in, out, TIFFTAG_BITSPERSAMPLE);
  copy_field<std::uint16_t>(in, out, TIFFTAG_SAMPLESPERPIXEL);
  copy_field<std::uint16_t>(in, out, TIFFTAG_PLANARCONFIG);
  copy_field<std::uint16_t>(in, out, TIFFTAG_PHOTOMETRIC);
  copy_field<std::uint16_t>(in, out, TIFFTAG_COMPRESSION);
  copy_field<std::uint16_t>(in, out, TIFFTAG_PREDICTOR);
  copy_field<const char*>(in, out, TIFFTAG_IMAGEDESCRIPTION);
  std::uint16_t sub_h = 0, sub_v = 0;
  if (TIFFGetField(in, TIFFTAG_YCBCRSUBSAMPLING, &sub_h, &sub_v) == 1) {
    TIFFSetField(out, TIFFTAG_YCBCRSUBSAMPLING, sub_h, sub_v);
  }
  std::uint32_t tables_size = 0;
  void* tables = nullptr;
  if (TIFFGetField(in, TIFFTAG_JPEGTABLES, &tables_size, &tables) == 1) {
    TIFFSetField(out, TIFFTAG_JPEGTABLES, tables_size, tables);
  }

  std::vector<std::uint8_t> buffer;
  for (std::uint32_t row = 0; row < rows; ++row) {
    for (std::uint32_t column = 0; column < columns; ++column) {
      const std::uint32_t from = row * across + column;
      const std::uint32_t to = row * columns + column;
      const auto size = static_cast<tmsize_t>(TIFFGetStrileByteCount(in, from));
      buffer.resize(static_cast<std::size_t>(std::max<tmsize_t>(size, 0)));
      const tmsize_t got = size > 0 ? TIFFReadRawTile(in, from, buffer.data(), size) : 0;
      if (got < 0) fail("cannot read tile " + std::to_string(from));
      if (TIFFWriteRawTile(out, to, buffer.data(), got) != got) fail("cannot write tile " + std::to_string(to));
    }
  }
  if (TIFFWriteDirectory(out) != 1) fail(std::string("cannot write ") + argv[2]);
  TIFFClose(out);
  TIFFClose(in);
  return 0;
}
