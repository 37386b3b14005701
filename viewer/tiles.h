// The viewer's DeepZoom tiles, made from Tessera's own readers and writers: slide tiles read through io::Slide
// (any format it reads) from the pyramid level closest above the tile's resolution and area-averaged down,
// encoded as JPEG; heatmap tiles painted by analysis::render_map_rgba (the heatmap TIFF's cell-footprint rule and
// the overlay's colour and opacity), encoded as PNG with transparency.
#pragma once

#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

#include "analysis/heatmap_outputs.h"
#include "io/heatmap.h"
#include "io/slide.h"
#include "viewer/deepzoom.h"

namespace tessera::viewer {

// RGB pixels of one tile of `slide` (rect from tile_rect() of a DeepZoom of the slide's size at `level`).
// Errors as io::Slide::read_region (core::CorruptTileError for damaged pixels).
cv::Mat slide_tile(const io::Slide& slide, const DeepZoom& dz, int level, const TileRect& rect);

// RGBA pixels of one heatmap tile; cells below `min_prob` are transparent.
cv::Mat heatmap_tile(const io::Heatmap& heatmap, const DeepZoom& dz, int level, const TileRect& rect,
                     const analysis::OverlayOptions& overlay, double min_prob);

// RGBA pixels of one tile of quality control's layer from `qc_bits` (<slide>.qc.png, io/qc_masks.h; `slide_width`
// level-0 pixels wide): each pixel takes the mask pixel under its centre; excluded areas grey, flagged ones amber
// (infer's overlay's colours), at kQcLayerAlpha; elsewhere transparent.
inline constexpr int kQcLayerAlpha = 150;
cv::Mat qc_tile(const cv::Mat1w& qc_bits, std::int64_t slide_width, const DeepZoom& dz, int level,
                const TileRect& rect);

std::string encode_jpeg(const cv::Mat& rgb, int quality);  // RGB CV_8UC3
std::string encode_png(const cv::Mat& rgba);               // RGBA CV_8UC4

}  // namespace tessera::viewer
