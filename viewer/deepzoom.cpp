#include "viewer/deepzoom.h"

#include <algorithm>

#include <fmt/format.h>

namespace tessera::viewer {

int DeepZoom::max_level() const {
  const std::int64_t side = std::max<std::int64_t>(1, std::max(width, height));
  int level = 0;
  while ((std::int64_t{1} << level) < side) ++level;
  return level;
}

std::int64_t DeepZoom::level_width(int level) const {
  const std::int64_t d = std::int64_t{1} << (max_level() - level);
  return std::max<std::int64_t>(1, (width + d - 1) / d);
}

std::int64_t DeepZoom::level_height(int level) const {
  const std::int64_t d = std::int64_t{1} << (max_level() - level);
  return std::max<std::int64_t>(1, (height + d - 1) / d);
}

double DeepZoom::scale(int level) const { return static_cast<double>(std::int64_t{1} << (max_level() - level)); }

std::int64_t DeepZoom::columns(int level) const { return (level_width(level) + tile_size - 1) / tile_size; }

std::int64_t DeepZoom::rows(int level) const { return (level_height(level) + tile_size - 1) / tile_size; }

std::string DeepZoom::descriptor(const std::string& format) const {
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<Image xmlns=\"http://schemas.microsoft.com/deepzoom/2008\" TileSize=\"{}\" Overlap=\"{}\" Format=\"{}\">"
      "<Size Width=\"{}\" Height=\"{}\"/></Image>\n",
      tile_size, overlap, format, width, height);
}

std::optional<TileRect> tile_rect(const DeepZoom& dz, int level, std::int64_t column, std::int64_t row) {
  if (level < 0 || level > dz.max_level()) return std::nullopt;
  if (column < 0 || row < 0 || column >= dz.columns(level) || row >= dz.rows(level)) return std::nullopt;
  const std::int64_t lw = dz.level_width(level);
  const std::int64_t lh = dz.level_height(level);
  const std::int64_t x0 = std::max<std::int64_t>(0, column * dz.tile_size - dz.overlap);
  const std::int64_t y0 = std::max<std::int64_t>(0, row * dz.tile_size - dz.overlap);
  const std::int64_t x1 = std::min<std::int64_t>(lw, (column + 1) * dz.tile_size + dz.overlap);
  const std::int64_t y1 = std::min<std::int64_t>(lh, (row + 1) * dz.tile_size + dz.overlap);
  return TileRect{x0, y0, x1 - x0, y1 - y0};
}

}  // namespace tessera::viewer
