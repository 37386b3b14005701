// What `tessera infer` writes for each slide besides the heatmap outputs themselves: the call that writes a scored
// slide's outputs (analysis/heatmap_outputs.h) and its summary entry, and the resume records.
//
// Resume: a record per finished slide. Once a slide's outputs are all written, the rank that wrote them records them
// in `<output>/.tessera-infer/<slide id>.json` with a key made of the checkpoint (path, size, modification time), the
// settings that shape the outputs and the slide file (path, size, modification time, mpp override). A rerun skips a
// slide whose record has this run's key and whose outputs are all there (--force redoes every slide), so a job
// killed after N slides redoes only the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "core/config.h"
#include "io/heatmap.h"

namespace tessera::analysis {

inline constexpr const char* kInferRecordFolder = ".tessera-infer";

// "path|size|mtime" of a file ("path|missing" when there is none): what a record keys a file by.
std::string file_identity(const std::string& path);

// What every slide's outputs depend on: the checkpoint file and the effective infer job, less the keys that pick
// the slides, the folder, the threads or how slides are distributed over ranks (they change no slide's outputs).
std::string infer_job_key(const core::Config& config, const std::string& checkpoint_path);

// The record key of one slide: the job's key (checkpoint and settings), the slide file and its mpp override.
std::string slide_key(const std::string& job, const std::string& path, double mpp);

std::filesystem::path slide_record_path(const std::filesystem::path& out, const std::string& id);

// The summary entry of a slide whose outputs an earlier run made with `key` and that are all still there; nullopt
// otherwise (an unreadable record is logged).
std::optional<nlohmann::json> finished_slide(const std::filesystem::path& out, const std::string& id,
                                             const std::string& key);

// infer.distribute auto on `ranks` ranks: of the slides to do, their bytes largest first (io::slide_bytes), how many
// go first with their tiles split over every rank. While at least `ranks` slides are left, the next is split when it
// is more than one rank's share of the slides left (their bytes, its own included, over the ranks); once fewer than
// `ranks` are left, all of them are (as for a whole job with fewer slides than ranks). 0: every slide goes whole.
std::size_t slides_to_split(const std::vector<std::uintmax_t>& largest_first, int ranks);

// Removes the files of a killed run that were never finished (`<output>.tmp-<pid>`, a TIFF's
// `<output>.tmp-<pid>.levelN`) from `out` and its record folder. Only under the folder's lock: no live job writes
// them.
void remove_unfinished(const std::filesystem::path& out);

// How one slide was scored (engine::SlideInferenceStats's figures, as the summary reports them).
struct ScoringStats {
  std::int64_t cells = 0;
  std::int64_t tiles = 0;
  double seconds = 0.0;
  double plan_seconds = 0.0;
  double tissue_area_mm2 = 0.0;
  double read_wait_seconds = 0.0;
};

// The slide whose map is written.
struct SlideToWrite {
  std::string id;
  std::string path;
  double mpp = 0.0;  // per-slide override (0 = from the slide or assume_mpp)
  // What the model was trained on and what its outputs must say about this slide (SlideResult::training, caution).
  std::optional<io::TrainingProvenance> training;
  std::string caution;
  QcOutcome qc;  // what the QC stage found (qc.ran false: it was off)
};

// One slide's outputs as the summary records them; `error` set when the slide failed while writing.
struct WrittenSlide {
  std::string id;
  nlohmann::json entry;
  std::string error;
};

// Writes the outputs of one scored slide into `out` (the rank that holds its map: rank 0 when the ranks split its
// tiles), then its record with `key`. The slide's old record goes first, so outputs being rewritten are never taken
// for the recorded ones. A slide whose analysis or picture fails with an input error is returned as failed, with what
// was written so far kept (each file is complete).
// Fault point "infer.slide-finished" (core/fault.h) fires after the outputs and the record are complete.
WrittenSlide write_slide(const SlideToWrite& input, io::Heatmap map, const ScoringStats& stats,
                         const std::string& position, const std::filesystem::path& out,
                         const OutputOptions& output_options, double assume_mpp, double threshold,
                         const std::string& key);

}  // namespace tessera::analysis
