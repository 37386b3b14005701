// `<slide>.qc.png`: quality control's masks of one slide (preprocessing/qc.h), written by `tessera qc` and by
// `tessera infer` beside the slide's other outputs, read by `tessera view` (its QC layer) and `tessera evaluate` (the
// FROC over lesions outside excluded areas).
//
// A 16-bit one-channel PNG at the QC level: pixel (c, r) covers level-0 [c·d, (c+1)·d) × [r·d, (r+1)·d) with
// d = slide width / PNG width (qc_mask_downsample). Bits:
//   0..8  one per artefact class, in preprocessing/qc.h's order (blur, pen_green, pen_blue, pen_black, pen_red, fold,
//         bubble, overexposed, underexposed)
//   13    flagged: the union of the classes whose action was `flag`
//   14    excluded: the union of the classes whose action was `exclude`, and severe blur (what tile and infer leave out)
//   15    tissue
// A file written before bits 13 and 14 existed has neither: its readers find no flagged and no excluded area.
#pragma once

#include <cstdint>
#include <string>

#include <opencv2/core.hpp>

namespace tessera::io {

inline constexpr int kQcMaskClasses = 9;
inline constexpr std::uint16_t kQcFlaggedBit = 1u << 13;
inline constexpr std::uint16_t kQcExcludedBit = 1u << 14;
inline constexpr std::uint16_t kQcTissueBit = 1u << 15;

// Writes `bits` (CV_16UC1) as a PNG, atomically (core/atomic_file.h).
void write_qc_masks_png(const std::string& path, const cv::Mat1w& bits);

// Reads a qc.png: core::FileNotFoundError when it is missing, core::InputError naming the file when it is not a
// 16-bit one-channel PNG.
cv::Mat1w read_qc_masks_png(const std::string& path);

// Level-0 pixels per mask pixel of a mask `columns` wide over a slide `slide_width` wide.
double qc_mask_downsample(std::int64_t slide_width, int columns);

// The pixels of `bits` with any of `mask`'s bits set, as 255 (CV_8UC1).
cv::Mat1b qc_mask_of(const cv::Mat1w& bits, std::uint16_t mask);

}  // namespace tessera::io
