#include "viewer/tiles.h"

#include <cmath>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/qc_masks.h"

namespace tessera::viewer {

cv::Mat slide_tile(const io::Slide& slide, const DeepZoom& dz, int level, const TileRect& rect) {
  const double scale = dz.scale(level);
  // The coarsest slide level that is still at least as fine as the tile (a 1% tolerance for downsamples such as
  // 3.9998): nothing is upsampled that a finer level could give.
  int best = 0;
  for (int i = 0; i < slide.level_count(); ++i) {
    if (slide.level(i).downsample <= scale * 1.01) best = i;
  }
  const double downsample = slide.level(best).downsample;
  const auto x0 = static_cast<std::int64_t>(std::floor(static_cast<double>(rect.x) * scale));
  const auto y0 = static_cast<std::int64_t>(std::floor(static_cast<double>(rect.y) * scale));
  const auto w = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(static_cast<double>(rect.width) * scale / downsample)));
  const auto h = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(static_cast<double>(rect.height) * scale / downsample)));
  cv::Mat pixels = slide.read_region(x0, y0, best, w, h);
  if (pixels.cols != rect.width || pixels.rows != rect.height) {
    cv::Mat resized;
    cv::resize(pixels, resized, cv::Size(static_cast<int>(rect.width), static_cast<int>(rect.height)), 0, 0,
               cv::INTER_AREA);
    pixels = resized;
  }
  return pixels;
}

cv::Mat heatmap_tile(const io::Heatmap& heatmap, const DeepZoom& dz, int level, const TileRect& rect,
                     const analysis::OverlayOptions& overlay, double min_prob) {
  const double scale = dz.scale(level);
  return analysis::render_map_rgba(heatmap, static_cast<double>(rect.x) * scale, static_cast<double>(rect.y) * scale,
                                   scale, cv::Size(static_cast<int>(rect.width), static_cast<int>(rect.height)),
                                   overlay, min_prob);
}

cv::Mat qc_tile(const cv::Mat1w& qc_bits, std::int64_t slide_width, const DeepZoom& dz, int level,
                const TileRect& rect) {
  const cv::Vec4b excluded(110, 110, 110, kQcLayerAlpha), flagged(255, 170, 0, kQcLayerAlpha);
  const double scale = dz.scale(level);
  const double downsample = io::qc_mask_downsample(slide_width, qc_bits.cols);
  cv::Mat image(static_cast<int>(rect.height), static_cast<int>(rect.width), CV_8UC4, cv::Scalar(0, 0, 0, 0));
  std::vector<int> cols(static_cast<std::size_t>(image.cols));
  for (int x = 0; x < image.cols; ++x) {
    cols[static_cast<std::size_t>(x)] =
        static_cast<int>(std::floor((static_cast<double>(rect.x + x) + 0.5) * scale / downsample));
  }
  for (int y = 0; y < image.rows; ++y) {
    const auto r = static_cast<int>(std::floor((static_cast<double>(rect.y + y) + 0.5) * scale / downsample));
    if (r < 0 || r >= qc_bits.rows) continue;
    const auto* bits = qc_bits.ptr<std::uint16_t>(r);
    auto* pixel = image.ptr<cv::Vec4b>(y);
    for (int x = 0; x < image.cols; ++x) {
      const int c = cols[static_cast<std::size_t>(x)];
      if (c < 0 || c >= qc_bits.cols) continue;
      if ((bits[c] & io::kQcExcludedBit) != 0) {
        pixel[x] = excluded;
      } else if ((bits[c] & io::kQcFlaggedBit) != 0) {
        pixel[x] = flagged;
      }
    }
  }
  return image;
}

std::string encode_jpeg(const cv::Mat& rgb, int quality) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<unsigned char> bytes;
  if (!cv::imencode(".jpg", bgr, bytes, {cv::IMWRITE_JPEG_QUALITY, quality})) {
    throw core::InternalError("JPEG encoding of a viewer tile failed");
  }
  return {bytes.begin(), bytes.end()};
}

std::string encode_png(const cv::Mat& rgba) {
  cv::Mat bgra;
  cv::cvtColor(rgba, bgra, cv::COLOR_RGBA2BGRA);
  std::vector<unsigned char> bytes;
  // Level 1: these tiles are flat colour and compress well at once; the time goes to the viewer's latency.
  if (!cv::imencode(".png", bgra, bytes, {cv::IMWRITE_PNG_COMPRESSION, 1})) {
    throw core::InternalError("PNG encoding of a viewer tile failed");
  }
  return {bytes.begin(), bytes.end()};
}

}  // namespace tessera::viewer
