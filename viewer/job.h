// What `tessera view` serves: the slides of one job, opened once at start. Two kinds of input:
//   - a folder of `tessera infer` outputs: its infer.json names the slides (id, slide file) and the failures; each
//     slide gets its `<id>.heatmap.h5`, `<id>.report.json`, `<id>.geojson` and, when quality control ran,
//     `<id>.qc.png` (io/qc_masks.h: the QC layer) from the folder, and its ground truth
//     from the dataset.csv that infer.config.yaml names (input.csv), when it has an annotation column;
//   - slides alone: files, globs or one dataset.csv (io/slide_list.h), shown without a heatmap (with the
//     dataset's annotations as ground truth).
// A slide that cannot be shown (a slide file that does not open or whose pixels do not decode, a missing or
// unreadable heatmap, a heatmap of another size than its slide) keeps its place in the index with the error.
// Relative paths recorded by infer (slide files, the dataset) are resolved against the working directory, then
// against each folder above the outputs (infer records them relative to where it ran).
// Only the files named here are ever read by the server; an output file that is a symlink leading out of the
// job's folder is refused (listed as that slide's error).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "io/heatmap.h"
#include "io/qc_masks.h"
#include "io/slide.h"

namespace tessera::viewer {

struct JobOptions {
  double assume_mpp = 0.0;          // for slides that record no resolution (0 = shown without µm)
  std::vector<std::string> splits;  // with a dataset.csv: only these splits
};

struct ViewerSlide {
  std::string id;
  std::string slide_path;                      // "" when not known
  std::string error;                           // why it cannot be shown; "" = it can
  std::shared_ptr<const io::Slide> slide;      // null when it cannot be shown
  std::shared_ptr<const io::Heatmap> heatmap;  // null = no heatmap layer
  std::shared_ptr<const cv::Mat1w> qc;         // <id>.qc.png's bits; null = no QC layer
  nlohmann::json report;                       // <id>.report.json (null when absent)
  nlohmann::json regions;       // [{id, size_class, area_mm2, longest_diameter_um, max_prob, bounds, outline}]
  nlohmann::json ground_truth;  // [{group, tumour, outer, holes}] (null when the job names none)
  std::string ground_truth_error;
};

struct ViewerJob {
  std::string title;   // the folder, or "<n> slides"
  bool infer = false;  // a folder of infer outputs
  std::vector<ViewerSlide> slides;
  analysis::OverlayOptions overlay;  // the job's colour map (infer.config.yaml's overlay.colormap)
  double threshold = 0.5;            // the job's region threshold (infer.threshold)

  const ViewerSlide* find(const std::string& id) const;
};

// core::InputError naming the input for a folder that holds no infer outputs, a dataset.csv that cannot be read;
// core::ConfigError for globs that match nothing (io::list_slides). Per-slide problems are not thrown: they are
// the slide's `error`.
ViewerJob open_job(const std::vector<std::string>& inputs, const JobOptions& options);

}  // namespace tessera::viewer
