#include "analysis/infer_outputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/hash.h"
#include "io/qc_masks.h"
#include "io/slide.h"

namespace tessera::analysis {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return path + "|missing";
  return fmt::format("{}|{}|{}.{:09d}", path, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

std::size_t slides_to_split(const std::vector<std::uintmax_t>& largest_first, int ranks) {
  const std::size_t n = largest_first.size();
  const auto share = static_cast<std::size_t>(std::max(ranks, 1));
  std::uintmax_t left = 0;  // the bytes of [split, n)
  for (const std::uintmax_t bytes : largest_first) left += bytes;
  std::size_t split = 0;
  for (; split < n; ++split) {
    if (n - split < share) return n;  // fewer slides left than ranks: whole, some ranks would have none
    if (largest_first[split] * share <= left) break;
    left -= largest_first[split];
  }
  return split;
}

// What every slide's outputs depend on: the checkpoint file and the effective job, less the keys that pick the
// slides, the folder, the threads or how slides are distributed over ranks (they change no slide's outputs).
std::string infer_job_key(const core::Config& config, const std::string& checkpoint_path) {
  core::Config keyed = config;
  keyed.assign("input.slides", std::vector<std::string>{}, "infer_job_key");
  keyed.assign("input.csv", std::string(), "infer_job_key");
  keyed.assign("input.splits", std::vector<std::string>{}, "infer_job_key");
  keyed.assign("output", std::string(), "infer_job_key");
  keyed.assign("infer.threads", std::int64_t{0}, "infer_job_key");
  keyed.assign("infer.distribute", std::string("auto"), "infer_job_key");
  return file_identity(checkpoint_path) + "\n" + keyed.to_yaml();
}

std::string slide_key(const std::string& job, const std::string& path, double mpp) {
  return fmt::format("{:016x}",
                     core::fnv1a(job + "\n" + file_identity(fs::absolute(path).string()) + fmt::format("|{}", mpp)));
}

fs::path slide_record_path(const fs::path& out, const std::string& id) {
  return out / kInferRecordFolder / (id + ".json");
}

// The summary entry of a slide whose outputs an earlier run made with `key` and that are all still there.
std::optional<json> finished_slide(const fs::path& out, const std::string& id, const std::string& key) {
  const fs::path path = slide_record_path(out, id);
  if (!fs::exists(path)) return std::nullopt;
  try {
    std::ifstream in(path);
    const json record = json::parse(in);
    if (record.at("key").get<std::string>() != key) return std::nullopt;
    const json& entry = record.at("entry");
    for (const auto& file : entry.at("outputs")) {
      if (!fs::exists(out / file.get<std::string>())) return std::nullopt;
    }
    return entry;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable ({}); the slide is done again", path.string(), e.what());
    return std::nullopt;
  }
}

// Files of a killed run that were never finished: `<output>.tmp-<pid>` and the pyramid levels of a TIFF,
// `<output>.tmp-<pid>.levelN`. Under the folder's lock no live job writes them.
void remove_unfinished(const fs::path& out) {
  int removed = 0;
  for (const fs::path& folder : {out, out / kInferRecordFolder}) {
    if (!fs::is_directory(folder)) continue;
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().filename().string().find(".tmp-") == std::string::npos) continue;
      fs::remove(entry.path());
      ++removed;
    }
  }
  if (removed > 0) spdlog::info("removed {} unfinished file(s) of an earlier run from {}", removed, out.string());
}

// The outputs of one slide (rank 0). The map is complete here: a slide whose analysis or picture fails is
// reported as failed with what was written so far kept (each file is complete).
WrittenSlide write_slide(const SlideToWrite& input, io::Heatmap map, const ScoringStats& stats,
                         const std::string& position, const fs::path& out, const OutputOptions& output_options,
                         double assume_mpp, double threshold, const std::string& key) {
  const auto t_outputs = std::chrono::steady_clock::now();
  // The slide's record goes first: outputs being rewritten (other settings, a killed or failing run) are never
  // taken for the recorded ones.
  std::error_code ignored;  // no record to remove is fine; one that cannot be removed fails the write below
  fs::remove(slide_record_path(out, input.id), ignored);
  std::vector<std::string> written;
  std::vector<std::pair<std::string, double>> by_output;  // seconds of the regions, thumbnail and each output
  SlideResult result;
  try {
    result = analyse_heatmap(std::move(map), output_options);
    result.tissue_area_mm2 = stats.tissue_area_mm2;
    result.training = input.training;
    result.caution = input.caution;
    result.qc = input.qc;
    const bool overlay = output_options.outputs.empty() ||
                         std::find(output_options.outputs.begin(), output_options.outputs.end(), "overlay.png") !=
                             output_options.outputs.end();
    if (overlay) {
      io::SlideOpenOptions open_options;
      open_options.assume_mpp = input.mpp > 0.0 ? input.mpp : assume_mpp;
      result.thumbnail = io::Slide::open(input.path, open_options).thumbnail(output_options.overlay.max_side);
    }
    const double thumbnail_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_outputs).count();
    by_output.emplace_back("analysis and thumbnail", thumbnail_seconds);
    written = write_slide_outputs(out.string(), result, output_options, &by_output);
    if (!input.qc.bits.empty()) {  // QC ran: its masks beside the outputs (the viewer's QC layer, evaluate's FROC)
      const auto start = std::chrono::steady_clock::now();
      const std::string path = (out / (input.id + ".qc.png")).string();
      io::write_qc_masks_png(path, input.qc.bits);
      written.push_back(path);
      by_output.emplace_back("qc.png", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  } catch (const core::Error& e) {
    if (e.kind() != core::ErrorKind::input) throw;
    spdlog::error("slide {} failed while writing its outputs: {}", position, e.what());
    return {input.id, json(), e.what()};
  }
  const double output_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_outputs).count();
  const auto& heatmap = result.heatmap;
  const float max_prob = heatmap.max_prob();
  json by_output_json = json::object();
  for (const auto& [name, seconds] : by_output) by_output_json[name] = seconds;
  spdlog::debug("slide {} {}: outputs' seconds {}", position, input.id, by_output_json.dump());
  json outputs = json::array();
  for (const auto& path : written) outputs.push_back(fs::path(path).filename().string());
  spdlog::info(
      "slide {} {}: {} tiles of {} cells ({}x{}, step {} px) in {:.1f} s ({:.0f} tiles/s; plan {:.1f} s, "
      "waiting for the reader {:.1f} s); outputs written in {:.1f} s; max P {:.3f}, {} region(s) at P >= {:g}",
      position, input.id, stats.tiles, stats.cells, heatmap.rows, heatmap.cols, heatmap.step, stats.seconds,
      static_cast<double>(stats.tiles) / std::max(stats.seconds, 1e-9), stats.plan_seconds, stats.read_wait_seconds,
      output_seconds, std::isnan(max_prob) ? 0.0f : max_prob, result.regions.size(), threshold);
  json entry = {{"id", input.id},
                {"slide", input.path},
                {"outputs", outputs},
                {"rows", heatmap.rows},
                {"cols", heatmap.cols},
                {"step", heatmap.step},
                {"tiles", stats.tiles},
                {"regions", result.regions.size()},
                {"detections", result.detections.size()},
                {"max_prob", std::isnan(max_prob) ? json(nullptr) : json(max_prob)},
                {"seconds", stats.seconds},
                {"plan_seconds", stats.plan_seconds},
                {"read_wait_seconds", stats.read_wait_seconds},
                {"output_seconds", output_seconds},
                {"output_seconds_by_output", by_output_json},
                {"tiles_per_second", static_cast<double>(stats.tiles) / std::max(stats.seconds, 1e-9)},
                {"caution", input.caution.empty() ? json(nullptr) : json(input.caution)}};
  core::write_file_atomic(slide_record_path(out, input.id).string(),
                          json({{"key", key}, {"entry", entry}}).dump() + "\n");
  // Fault point "infer.slide-finished" (core/fault.h): after a slide's outputs and its record are complete, e.g.
  // "infer.slide-finished after=1 do=kill" kills the job once its first slide is done.
  core::fault::at("infer.slide-finished");
  return {input.id, std::move(entry), ""};
}

}  // namespace tessera::analysis
