// Where slides, shards and models come from: what tells a slide `tessera synth` made from any other, and what a
// checkpoint records of the slides its model was trained on, so that a model trained only on synthetic slides is
// never taken for a diagnostic one.
//
// The marker. `tessera synth` writes the TIFF Software tag "Tessera synth" (io::TiffWriterOptions::software) into
// every slide it makes; OpenSlide reports it as the property `tiff.Software` for generic TIFF and Aperio slides alike.
// Slides of an older synth (Software "Tessera") are told by their image description, which synth has always begun
// with "Tessera synthetic H&E slide" (`tiff.ImageDescription` for a generic TIFF, `aperio.Description` for an
// Aperio-style one). Any other slide — a scanner's, or a Tessera heatmap TIFF (Software "Tessera") — is "real":
// not made by tessera synth. A synthetic slide re-saved by another program loses the marker and counts as real, so
// the mistake this can make is a warning too many, never one too few.
//
// The chain. `tessera tile` records each slide's origin in manifest.json ("origin": "synthetic" | "real"); `tessera
// train` counts its training slides by origin into the checkpoint's /meta (TrainingProvenance, beside the mpp and
// stain normalization /meta already holds); `tessera infer` states the model's training data in its log and in every
// report.json, and when a model trained only on synthetic slides scores a real slide it warns once for that slide
// and writes kSyntheticModelCaution into the slide's report.json and overlay. A checkpoint or manifest written
// before any of this records no origin: the training data is then "unknown" and nothing is claimed either way.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tessera::io {

// The TIFF Software tag of a slide `tessera synth` made.
inline constexpr const char* kSyntheticSlideSoftware = "Tessera synth";
// How synth's image description of a slide begins (the marker of slides made before the Software tag said so).
inline constexpr const char* kSyntheticSlideDescription = "Tessera synthetic H&E slide";

// Whether a slide with these (OpenSlide) properties was made by `tessera synth` (see above).
bool is_synthetic_slide(const std::map<std::string, std::string>& properties);

// A slide's origin as manifest.json records it: "synthetic" (made by tessera synth) or "real" (anything else).
const char* slide_origin(bool synthetic);

// What a model's training slides were, as a whole.
enum class TrainingData {
  unknown,    // not recorded (an older checkpoint or manifest, a converted model), or some slides' origin unknown
  synthetic,  // every training slide was made by tessera synth
  real,       // no training slide was made by tessera synth
  mixed,      // both
};
const char* to_string(TrainingData data);

// What `tessera train` records of its training slides (the train splits) in the checkpoint's /meta.
struct TrainingProvenance {
  std::int64_t synthetic_slides = 0;  // made by tessera synth
  std::int64_t real_slides = 0;       // not made by tessera synth
  std::int64_t unknown_slides = 0;    // their manifest records no origin (tiled before it did)
  std::string shards;                 // the shard folder trained on (absolute)

  // unknown while any slide's origin is unknown (or there are no slides); else synthetic, real or mixed.
  TrainingData data() const;
  bool operator==(const TrainingProvenance&) const = default;
};

// The training data of a model whose checkpoint records `provenance` (nullopt: recorded none → unknown).
TrainingData training_data(const std::optional<TrainingProvenance>& provenance);

// One line for logs: "synthetic slides only (12 made by tessera synth; shards /data/shards)", "real slides (...)",
// "unknown (the checkpoint records no provenance)".
std::string describe(const std::optional<TrainingProvenance>& provenance);

// What infer writes and says when a model trained only on synthetic slides scores a slide tessera synth did not make.
inline constexpr const char* kSyntheticModelCaution = "model trained on synthetic slides — demonstration only";

// kSyntheticModelCaution when a model with `provenance` scoring a slide (synthetic or not) calls for it, else "".
std::string model_caution(const std::optional<TrainingProvenance>& provenance, bool slide_is_synthetic);

// The Slurm job a process runs in, so that a result can be traced to its job: what Slurm puts in the environment of
// every task it starts (sbatch's batch shell, srun's tasks). `infer` writes it into infer.json ("slurm"), `train` into
// metrics.jsonl (a line of kind "slurm" at the start of each run, resumed runs too) and the checkpoint's /meta
// (slurm_job_id, ...: all or none).
struct SlurmJob {
  std::string job_id;         // SLURM_JOB_ID (an array task's own job id)
  std::string array_job_id;   // SLURM_ARRAY_JOB_ID; "" outside an array
  std::string array_task_id;  // SLURM_ARRAY_TASK_ID; "" outside an array
  std::string nodelist;       // SLURM_JOB_NODELIST, e.g. "t[1-2]"
  std::int64_t ntasks = 0;    // SLURM_NTASKS; 0 when Slurm set none
  std::int64_t restarts = 0;  // SLURM_RESTART_COUNT: how often the job was requeued before this run

  bool operator==(const SlurmJob&) const = default;
};

// The job of this process's environment; nullopt outside Slurm (no SLURM_JOB_ID).
std::optional<SlurmJob> slurm_job();

// "job 123 (array 120 task 3), 4 task(s) on t[1-2]" for logs.
std::string describe(const SlurmJob& job);

}  // namespace tessera::io
