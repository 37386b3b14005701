#include "io/provenance.h"

#include <cstdlib>

#include <fmt/format.h>

namespace tessera::io {

namespace {

bool has_prefix(const std::map<std::string, std::string>& properties, const char* name, const std::string& prefix) {
  const auto it = properties.find(name);
  return it != properties.end() && it->second.starts_with(prefix);
}

}  // namespace

bool is_synthetic_slide(const std::map<std::string, std::string>& properties) {
  if (const auto it = properties.find("tiff.Software"); it != properties.end()) {
    // "Tessera synth", possibly followed by more words; not "Tessera" alone (heatmap TIFFs) nor "Tessera synthesis".
    const std::string& software = it->second;
    const std::string marker = kSyntheticSlideSoftware;
    if (software == marker || software.starts_with(marker + " ")) return true;
  }
  return has_prefix(properties, "tiff.ImageDescription", kSyntheticSlideDescription) ||
         has_prefix(properties, "aperio.Description", kSyntheticSlideDescription);
}

const char* slide_origin(bool synthetic) { return synthetic ? "synthetic" : "real"; }

const char* to_string(TrainingData data) {
  switch (data) {
    case TrainingData::unknown:
      return "unknown";
    case TrainingData::synthetic:
      return "synthetic";
    case TrainingData::real:
      return "real";
    case TrainingData::mixed:
      return "mixed";
  }
  return "unknown";
}

TrainingData TrainingProvenance::data() const {
  if (unknown_slides > 0 || synthetic_slides + real_slides == 0) return TrainingData::unknown;
  if (real_slides == 0) return TrainingData::synthetic;
  if (synthetic_slides == 0) return TrainingData::real;
  return TrainingData::mixed;
}

TrainingData training_data(const std::optional<TrainingProvenance>& provenance) {
  return provenance ? provenance->data() : TrainingData::unknown;
}

std::string describe(const std::optional<TrainingProvenance>& provenance) {
  if (!provenance) return "unknown (the checkpoint records no provenance)";
  const TrainingProvenance& p = *provenance;
  std::string counts = fmt::format("{} made by tessera synth, {} not", p.synthetic_slides, p.real_slides);
  if (p.unknown_slides > 0) counts += fmt::format(", {} of unknown origin", p.unknown_slides);
  const char* what = "";
  switch (p.data()) {
    case TrainingData::synthetic:
      what = "synthetic slides only";
      break;
    case TrainingData::real:
      what = "real slides only";
      break;
    case TrainingData::mixed:
      what = "synthetic and real slides";
      break;
    case TrainingData::unknown:
      what = "slides of unknown origin";
      break;
  }
  return fmt::format("{} ({} training slide(s): {}; shards {})", what,
                     p.synthetic_slides + p.real_slides + p.unknown_slides, counts,
                     p.shards.empty() ? std::string("not recorded") : p.shards);
}

std::string model_caution(const std::optional<TrainingProvenance>& provenance, bool slide_is_synthetic) {
  if (training_data(provenance) == TrainingData::synthetic && !slide_is_synthetic) return kSyntheticModelCaution;
  return "";
}

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// A count Slurm set; 0 when unset or not a number.
std::int64_t environment_count(const char* name) {
  const std::string text = environment(name);
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  return !text.empty() && end != nullptr && *end == '\0' && value > 0 ? value : 0;
}

}  // namespace

std::optional<SlurmJob> slurm_job() {
  SlurmJob job;
  job.job_id = environment("SLURM_JOB_ID");
  if (job.job_id.empty()) return std::nullopt;
  job.array_job_id = environment("SLURM_ARRAY_JOB_ID");
  job.array_task_id = environment("SLURM_ARRAY_TASK_ID");
  job.nodelist = environment("SLURM_JOB_NODELIST");
  job.ntasks = environment_count("SLURM_NTASKS");
  job.restarts = environment_count("SLURM_RESTART_COUNT");
  return job;
}

std::string describe(const SlurmJob& job) {
  std::string text = "job " + job.job_id;
  if (!job.array_job_id.empty()) text += fmt::format(" (array {} task {})", job.array_job_id, job.array_task_id);
  if (job.ntasks > 0) text += fmt::format(", {} task(s)", job.ntasks);
  if (!job.nodelist.empty()) text += " on " + job.nodelist;
  if (job.restarts > 0) text += fmt::format(", requeued {} time(s)", job.restarts);
  return text;
}

}  // namespace tessera::io
