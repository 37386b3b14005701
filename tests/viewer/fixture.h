// A small job for the viewer's tests (C++ and browser): a folder of infer outputs made by infer's own writers over
// a test-pattern slide, with a heatmap whose tumour block and normal tissue are known, a failed slide in infer.json,
// and a dataset.csv whose ASAP annotation outlines the tumour block (the ground truth).
//
//   <dir>/slides/case_001.tif     2048×2048 px, 0.5 µm/px, pattern pixels (testing::pattern_pixel)
//   <dir>/slides/case_001.xml     ground truth: the tumour block's square, group "_0"
//   <dir>/dataset.csv             case_001 with its annotation
//   <dir>/infer/                  case_001.{heatmap.h5,geojson,report.json,qc.png}, infer.json (case_001 and a failed
//                                 "broken_002"), infer.config.yaml (input.csv, infer.threshold 0.5)
//
// The map: 8×8 cells of 256 px (step = tile); cells in rows 2..3 and columns 4..5 have P = 0.95 (the tumour
// block, level-0 [1024, 1536) × [512, 1024)); row 0 has no tissue (NaN); every other cell has P = 0.02.
// Quality control's masks (256×256, 8 level-0 px per pixel; tissue everywhere): level-0 [0, 512) × [1536, 2048)
// excluded pen ink (kViewQcExcluded), [1536, 2048) × [1536, 2048) flagged blur (kViewQcFlagged).
#pragma once

#include <string>

#include "io/heatmap.h"

namespace tessera::testing {

struct ViewFixture {
  std::string dir, infer_dir, slide_path, dataset;
  io::Heatmap heatmap;
};

inline constexpr const char* kViewSlideId = "case_001";
inline constexpr const char* kViewFailedId = "broken_002";
inline constexpr float kViewTumourP = 0.95f;
inline constexpr float kViewNormalP = 0.02f;
inline constexpr int kViewQcExcluded[4] = {0, 1536, 512, 512};     // level-0 x, y, width, height
inline constexpr int kViewQcFlagged[4] = {1536, 1536, 512, 512};

ViewFixture make_view_fixture(const std::string& dir);

}  // namespace tessera::testing
