// DeepZoom (DZI) geometry, the tiling OpenSeadragon reads: an image of W×H level-0 pixels has levels 0..max_level,
// max_level = ceil(log2(max(W, H))); level L is ceil(W / 2^(max_level − L)) × ceil(H / 2^(max_level − L)) pixels,
// each of its pixels 2^(max_level − L) level-0 pixels wide. Tile (column, row) of level L covers level-L pixels
// [column·T − overlap, (column + 1)·T + overlap) clipped to the level (T = tile size), likewise in y. The
// descriptor is `<Image TileSize=".." Overlap=".." Format=".."><Size Width=".." Height=".."/></Image>`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::viewer {

struct DeepZoom {
  std::int64_t width = 0, height = 0;  // level 0
  int tile_size = 254;
  int overlap = 1;

  int max_level() const;
  std::int64_t level_width(int level) const;
  std::int64_t level_height(int level) const;
  double scale(int level) const;  // level-0 pixels per pixel of `level`
  std::int64_t columns(int level) const;
  std::int64_t rows(int level) const;
  // The descriptor XML for tiles of `format` ("jpeg", "png").
  std::string descriptor(const std::string& format) const;
};

// The level-L pixel rectangle of one tile.
struct TileRect {
  std::int64_t x = 0, y = 0, width = 0, height = 0;
};

// nullopt when `level`, `column` or `row` is outside the image (the server answers 400).
std::optional<TileRect> tile_rect(const DeepZoom& dz, int level, std::int64_t column, std::int64_t row);

}  // namespace tessera::viewer
