// The cohort side of slide quality control (`tessera qc`): a slide's QC numbers as one JSON record (what a rank sends
// to rank 0), the cohort checks over every slide, qc.csv and the cohort picture.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include "preprocessing/qc.h"

namespace tessera::prep {

// {id, path, tissue_area_mm2, fractions {class: share of tissue}, sharpness, brightness, background_brightness,
// stain_h, stain_e, stain_angle, excluded_fraction, flagged_fraction, flags [..]}. A slide that failed is
// {id, path, error}.
nlohmann::json qc_summary_json(const std::string& id, const std::string& path, const QcResult& result);

struct QcCohort {
  std::vector<nlohmann::json> rows;  // the records with the cohort flags added, "usable" and "reasons"
  std::string csv;                   // qc.csv
  cv::Mat picture;                   // qc-cohort.png (RGB)
  int flagged_slides = 0;            // slides with a slide-level flag
};

// Adds the cohort flags (add_cohort_flags), decides each slide's verdict — not usable when it failed, has a
// slide-level flag, or has more than half its tissue in excluded artefacts — and makes the table and picture.
QcCohort qc_cohort(const std::vector<nlohmann::json>& records);

}  // namespace tessera::prep
