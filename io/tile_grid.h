// The region assembly shared by the direct tile readers (io/tiff_reader.h, io/dicom_slide.h): a window of a tiled
// image built from the tiles it overlaps, white outside the image and where a tile is absent.
#pragma once

#include <algorithm>
#include <cstdint>

#include <opencv2/core.hpp>

namespace tessera::io {

// An image of width × height pixels cut into tiles of tile_width × tile_height, row by row from the top left (the
// last column and row may reach past the image: their padding is never shown).
struct TileGrid {
  std::int64_t width = 0;
  std::int64_t height = 0;
  std::int64_t tile_width = 0;
  std::int64_t tile_height = 0;
};

// Pixels [lx, lx+width) × [ly, ly+height) of the image as RGB CV_8UC3. `tile(column, row)` returns that tile's
// decoded pixels (CV_8UC3, at least as large as the part of the tile inside the image), or an empty Mat when the
// image has no tile there (background). Pixels outside the image and of absent tiles are white. With `into` (a
// CV_8UC3 height × width Mat, e.g. a header over the caller's memory), the pixels are written there and `into` is
// returned; every pixel is written once (white only where no tile's pixels go).
template <typename TileAt>
cv::Mat assemble_region(const TileGrid& grid, std::int64_t lx, std::int64_t ly, int width, int height, TileAt&& tile,
                        cv::Mat into = cv::Mat()) {
  const cv::Scalar white(255, 255, 255);
  cv::Mat out = into;
  out.create(height, width, CV_8UC3);  // a no-op for an `into` of this size and type
  // The part of the request inside the image.
  const std::int64_t x0 = std::max<std::int64_t>(lx, 0);
  const std::int64_t y0 = std::max<std::int64_t>(ly, 0);
  const std::int64_t x1 = std::min<std::int64_t>(lx + width, grid.width);
  const std::int64_t y1 = std::min<std::int64_t>(ly + height, grid.height);
  if (x0 >= x1 || y0 >= y1) {
    out.setTo(white);
    return out;
  }
  if (x0 != lx || y0 != ly || x1 != lx + width || y1 != ly + height) out.setTo(white);  // reaches past the image
  const std::int64_t tw = grid.tile_width;
  const std::int64_t th = grid.tile_height;
  for (std::int64_t row = y0 / th; row <= (y1 - 1) / th; ++row) {
    for (std::int64_t column = x0 / tw; column <= (x1 - 1) / tw; ++column) {
      const cv::Mat pixels = tile(column, row);
      // The tile's part of the request, clipped to the image: partial edge tiles carry padding past it.
      const std::int64_t cx0 = std::max(x0, column * tw);
      const std::int64_t cy0 = std::max(y0, row * th);
      const std::int64_t cx1 = std::min(x1, (column + 1) * tw);
      const std::int64_t cy1 = std::min(y1, (row + 1) * th);
      const cv::Rect from(static_cast<int>(cx0 - column * tw), static_cast<int>(cy0 - row * th),
                          static_cast<int>(cx1 - cx0), static_cast<int>(cy1 - cy0));
      const cv::Rect to(static_cast<int>(cx0 - lx), static_cast<int>(cy0 - ly), from.width, from.height);
      cv::Mat target = out(to);
      if (pixels.empty()) {
        target.setTo(white);
      } else {
        pixels(from).copyTo(target);
      }
    }
  }
  return out;
}

}  // namespace tessera::io
