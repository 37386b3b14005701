// Detections: the points a CAMELYON16 detections file holds (probability and level-0 position), the one type that
// infer writes (analysis/regions.h: find_detections) and evaluate reads, with that file's writer and reader.
#pragma once

#include <string>
#include <vector>

namespace tessera::analysis {

// One detection of a CAMELYON16 detections file: probability and level-0 pixel position.
struct Detection {
  double p = 0.0;  // probability of tumour, in [0, 1]
  double x = 0.0;  // level-0 pixels (infer writes whole pixels; other tools may write fractions)
  double y = 0.0;
};

// Reads a CAMELYON16 detections CSV: one `prob,X,Y` row per detection (level-0 pixels; X and Y may be
// fractional). An optional header line names the columns (p/prob/probability/score/confidence, x/X, y/Y, in any
// order). InputError naming the file and line for a malformed row or a probability outside [0, 1].
std::vector<Detection> read_detections(const std::string& path);

// Writes `detections` as a headerless `prob,X,Y` CSV (probability with 6 decimals), atomically.
void write_detections_csv(const std::string& path, const std::vector<Detection>& detections);

}  // namespace tessera::analysis
