// A heatmap as a DICOM Segmentation instance over its DICOM source series (`tessera infer` output `dicom-seg`).
//
// FRACTIONAL, PROBABILITY: pixel value = round(255 · P(tumour)) (0 where no tissue was scored), MaximumFractionalValue
// 255, one segment (label and SNOMED CT property codes from the job; defaults "tumour", category 49755003
// "Morphologically abnormal structure", type 14799000 "Neoplasm, metastatic"), at the heatmap's resolution: SEG
// pixel (i, j) is heatmap cell (row i, column j), and covers that cell's footprint (io/heatmap.h) — the same slide
// area the cell covers in `<slide>.heatmap.tif`. Pixel Spacing is the step in mm; the Total Pixel Matrix Origin is
// the slide position of cell (0, 0)'s footprint corner, computed from the source's origin and Image Orientation
// (Slide) (taken as the top-left corner of the source's first pixel); where the source lacks them, the defaults
// (origin 0, 0; orientation 0\-1\0\-1\0\0) are used and said in `notes`. The frames tile the matrix (at most
// 256×256 cells each, zero-padded at the edges), each with its Plane Position (Slide).
//
// References: the source's study (patient and study attributes copied), Frame of Reference (of level 0), series and
// every level's SOP instance. UIDs of the new series and instance: `2.25.…` derived from the source series, the
// checkpoint and the map (the same inputs give the same UIDs). Written atomically (core/atomic_file.h).
#pragma once

#include <string>
#include <vector>

#include "io/heatmap.h"
#include "io/slide.h"

namespace tessera::io {

struct DicomSegOptions {
  std::string segment_label = "tumour";
  std::string category_code = "49755003";
  std::string category_scheme = "SCT";
  std::string category_meaning = "Morphologically abnormal structure";
  std::string type_code = "14799000";
  std::string type_scheme = "SCT";
  std::string type_meaning = "Neoplasm, metastatic";
};

// Writes the segmentation of `heatmap` over `slide` to `path`. core::InputError when `slide` is not a DICOM series (a
// Segmentation must reference DICOM source images) or lacks the resolution; core::InternalError when writing fails.
// Returns notes on defaults used for what the source lacks.
std::vector<std::string> write_dicom_seg(const std::string& path, const Heatmap& heatmap, const Slide& slide,
                                         const DicomSegOptions& options = {});

}  // namespace tessera::io
