// `tessera infer [job.yaml]`: a trained checkpoint over whole slides → tumour-probability heatmaps.
//
// The slides are input.slides (files, globs) or input.csv (a dataset.csv: columns slide, and optionally split,
// slide_id, mpp; input.splits picks rows by split), as in every verb (io/slide_list.h). The model, its tile size, µm/px
// and stain normalization come from the checkpoint (engine/slide_inference.h), so the slides are read as the model's
// training tiles were.
//
// Ranks (infer.distribute). slides: each slide goes whole to one rank, the largest files first; a rank that is
// done with a slide takes the next from a counter on rank 0 (one MPI_Fetch_and_op: rank 0 serves no requests and
// scores slides too, with a progress thread for transports whose target serves them), plans, scores it with
// its own threads and writes its outputs, on a second thread while it scores its next slide. No rank waits for
// another until the end, when rank 0 gathers what each did for infer.json. tiles: slides go one after another and
// every rank scores a contiguous share of each slide's tiles, so one large slide uses every rank; rank 0 plans each
// slide, gathers its map and writes its outputs on a second thread while the next slide is scored. auto (the
// default) takes tiles when there are fewer slides to do than ranks; else slides, except that a slide larger than one
// rank's share of the slides left (their bytes over the ranks, io::slide_bytes), largest first, goes first as with
// tiles, and so on while at least as many slides are left as ranks, and once fewer are left they all go as with tiles
// ("tiles+slides" in infer.json, whose split_slides names the split ones): one slide that dwarfs the rest then uses
// every rank instead of keeping one busy while the others idle, and no rank is left without a slide. Either way
// a slide's outputs are those of a one-rank run (its map bit for bit). A SIGUSR1 on any rank stops the job after the
// slide each rank holds (whole slides: the rank pushes the counter past the end; split slides: the ranks agree
// between slides).
//
// Outputs in the output folder (by the rank that scored the slide, rank 0 for a split slide; each written atomically):
// per slide the outputs of analysis/heatmap_outputs.h (`outputs` picks some; default all):
//   <slide>.heatmap.h5, .overlay.png, .heatmap.tif, .geojson, .xml, .detections.csv, .report.json
// and for the job (rank 0) infer.json (per slide: outputs, cells, tiles, seconds, max probability, regions; the
// failures; how the slides went to the ranks; per rank: slides scored, seconds, and the time it waited for work or
// for other ranks) and infer.config.yaml (the effective job).
// A slide that fails (missing, corrupt, unreadable region) is reported naming its file, the others go on, and the
// failures are listed at the end with exit code 3. The resume records are analysis/infer_outputs.h's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "analysis/infer_outputs.h"
#include "app/cli.h"
#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/measure.h"
#include "core/output_dir.h"
#include "core/signals.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/precision.h"
#include "engine/slide_inference.h"
#include "io/heatmap.h"
#include "io/provenance.h"
#include "io/slide_list.h"
#include "preprocessing/qc.h"
#include "preprocessing/tissue.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const core::Schema& infer_schema() {
  // One schema for the life of the process: a Config keeps a pointer to its schema.
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("checkpoint", "", "Trained model (tessera train's checkpoint.h5); required");
    io::declare_input_keys(schema)
        .renamed("slides", "input.slides")
        .renamed("splits", "input.splits")
        .string("output", "infer", "Folder for the per-slide outputs (<slide>.heatmap.h5, ...)")
        .integer("infer.stride", 0,
                 "Pixels at the model's resolution between heatmap cells; 0 = half a tile (cells overlap)", 0, 65536)
        .integer("infer.batch_size", 32, "Tiles per forward pass on each rank", 1, 65536)
        .string("infer.tta", "none",
                "Test-time augmentation, probabilities averaged over the views: none, flips (4 mirror images), d8 "
                "(8 rotations and mirror images)",
                {"none", "flips", "d8"})
        .number("infer.threshold", 0.5, "P(tumour) at and above which a cell counts as tumour in the summaries", 0, 1)
        .integer("infer.threads", 0, "OpenMP threads per rank (0 = the cores this rank may use)", 0, 1024)
        .string("infer.precision", "fp32",
                "Number format of the convolutions and linear layers: fp32, bf16 where the CPU has AVX-512 BF16, "
                "or int8 where it has VNNI and the checkpoint is calibrated (tessera quantize) (else fp32, said once "
                "in the log)",
                {"fp32", "bf16", "int8"})
        .string("infer.distribute", "auto",
                "How slides go to the ranks under MPI: slides (each slide whole to one rank, largest first, handed "
                "out as ranks ask), tiles (every slide's tiles split over all ranks), auto (tiles with fewer slides to "
                "do than ranks, else slides, but a slide larger than a rank's share of the slides left (bytes) goes "
                "first with its tiles split, again while at least as many slides are left as ranks, and all of them "
                "once fewer are left)",
                {"auto", "slides", "tiles"});
    prep::declare_tissue_keys(schema, "unset: the checkpoint's (its tiling's), else this default");
    prep::declare_qc_keys(schema);
    analysis::declare_output_keys(schema);
    return schema;
  }();
  return instance;
}

// The Slurm job of this run for infer.json (io/provenance.h); null outside Slurm.
json slurm_record() {
  const auto job = io::slurm_job();
  if (!job) return nullptr;
  return {{"job_id", job->job_id},
          {"array_job_id", job->array_job_id},
          {"array_task_id", job->array_task_id},
          {"nodelist", job->nodelist},
          {"ntasks", job->ntasks},
          {"restarts", job->restarts}};
}

// What the QC stage found on a slide, for its report and overlay.
analysis::QcOutcome qc_outcome(const engine::SlideInferenceStats& stats) {
  analysis::QcOutcome out;
  if (!stats.qc) return out;
  const prep::QcResult& qc = *stats.qc;
  out.ran = true;
  out.flags = qc.flags;
  out.excluded_cells = stats.qc_excluded_cells;
  out.downsample = qc.tissue.downsample;
  out.excluded = qc.excluded();
  out.flagged = qc.flagged();
  out.bits = prep::encode_qc_masks(qc);
  const double mm2_per_pixel = qc.tissue.mpp * qc.tissue.mpp * 1e-6;
  out.excluded_mm2 = cv::countNonZero(out.excluded) * mm2_per_pixel;
  out.flagged_mm2 = cv::countNonZero(out.flagged) * mm2_per_pixel;
  for (const prep::Artefact a : prep::all_artefacts()) {
    const auto i = static_cast<std::size_t>(prep::index(a));
    if (!qc.options.enabled[i]) continue;
    const std::string action = prep::to_string(qc.options.action[i]);
    out.classes.push_back({prep::to_string(a), action, qc.area_mm2[i], qc.fraction[i]});
    if (cv::countNonZero(qc.masks[i]) > 0) {
      out.masks.emplace_back(std::string(prep::to_string(a)) + " (" + action + ")", qc.masks[i]);
    }
  }
  if (!qc.severe_blur.empty() && cv::countNonZero(qc.severe_blur) > 0) {
    out.masks.emplace_back("blur, severe (exclude)", qc.severe_blur);
  }
  return out;
}

// How the slides of a job go to the ranks (infer.distribute; the header comment above says when which).
//   tiles         every slide's tiles over every rank, one slide after another
//   slides        each slide whole to one rank
//   tiles_slides  (auto) the slides that dwarf the rest as with tiles, one after another, then the rest as with slides
enum class Distribution { tiles, slides, tiles_slides };

const char* to_string(Distribution mode) {
  switch (mode) {
    case Distribution::tiles:
      return "tiles";
    case Distribution::slides:
      return "slides";
    case Distribution::tiles_slides:
      return "tiles+slides";
  }
  return "unknown";
}

// The slides to do in the order they are handed out: the first `split` of them with their tiles over every rank,
// the rest whole.
struct Assignment {
  Distribution mode = Distribution::tiles;
  std::vector<std::int64_t> order;  // indices into the job's input list
  std::size_t split = 0;
  std::uintmax_t total_bytes = 0;  // the files' sizes added up (tiles_slides, on rank 0)
};

// Rank 0: how `pending` (the slides to do, in input order; `bytes[s]` slide s's io::slide_bytes, 0 when missing: it
// sorts last and fails on the rank that opens it) go to `ranks` ranks under infer.distribute `key`.
//   tiles   input order, every slide split.
//   slides  largest first (a large slide started last would keep one rank busy alone), none split.
//   auto    tiles on one rank or with fewer slides than ranks; else largest first, the first
//           analysis::slides_to_split of them split (the same rule again on the slides left) and the rest whole
//           (slides when none is split, tiles when all are).
Assignment assign_slides(const std::string& key, int ranks, std::vector<std::int64_t> pending,
                         const std::vector<std::uintmax_t>& bytes) {
  Assignment a;
  a.order = std::move(pending);
  const std::size_t n = a.order.size();
  if (key == "tiles" || (key == "auto" && (ranks == 1 || n < static_cast<std::size_t>(ranks)))) {
    a.split = n;
    return a;
  }
  const auto size = [&](std::int64_t s) { return bytes[static_cast<std::size_t>(s)]; };
  std::stable_sort(a.order.begin(), a.order.end(), [&](std::int64_t x, std::int64_t y) { return size(x) > size(y); });
  a.mode = Distribution::slides;
  if (key == "slides") return a;
  std::vector<std::uintmax_t> largest_first;
  for (const std::int64_t s : a.order) largest_first.push_back(size(s));
  for (const std::uintmax_t b : largest_first) a.total_bytes += b;
  a.split = analysis::slides_to_split(largest_first, ranks);
  if (a.split == n) {
    a.mode = Distribution::tiles;
  } else if (a.split > 0) {
    a.mode = Distribution::tiles_slides;
  }
  return a;
}

// Hands out the slides to do (indices into the job's input list, in the assignment's order) and says when the ranks
// stop.
//   split  (the first `split`) every rank takes every slide, in order; before each, and once after the last when
//          whole slides follow, the ranks agree whether to stop (core::agree_stop), a collective every rank reaches.
//   whole  (the rest) each slide goes to the one rank that takes it: the rank adds 1 to a counter on rank 0 with one
//          MPI_Fetch_and_op (one-sided: rank 0 runs no server loop and scores slides itself) and takes the t-th whole
//          slide, t the value it got. A rank asked to stop (SIGUSR1, or SIGTERM between slides) takes no more and
//          pushes the counter past the end, so every other rank stops after the slide it holds.
// wait_seconds() is this rank's time in these calls: waiting for work, or for the other ranks to agree.
class SlideQueue {
 public:
  struct Next {
    std::optional<std::size_t> slide;  // none: no more for this rank
    bool whole = false;                // the slide is this rank's alone (else every rank's)
    core::StopRequest stop = core::StopRequest::none;
  };

  // Collective (a window is created unless every slide is split).
  SlideQueue(const core::Comm& world, const Assignment& assignment)
      : world_(world),
        order_(assignment.order),
        split_(assignment.split),
        whole_phase_(assignment.mode == Distribution::slides) {
    if (assignment.mode == Distribution::tiles) return;
    counter_.emplace(world_, world_.is_root() ? sizeof(std::int64_t) : 0, sizeof(std::int64_t));
    if (world_.is_root()) {
      counter_->lock(0, true);
      *static_cast<std::int64_t*>(counter_->local()) = 0;
      counter_->unlock(0);
    }
    world_.barrier();  // nobody takes a ticket before the counter is 0
    // One shared passive-target epoch for the whole queue: a ticket is then one fetch-and-add and its flush. Where
    // rank 0's MPI serves one-sided operations (Open MPI's osc/pt2pt over TCP), a lock and an unlock per ticket would
    // each wait for rank 0 to enter MPI (between its batches) as well.
    counter_->lock_all();
    locked_ = true;
  }
  SlideQueue(const SlideQueue&) = delete;
  SlideQueue& operator=(const SlideQueue&) = delete;
  // While unwinding from a failure on several ranks the epoch is left open, as the window is (core::Window):
  // unlocking can wait for a rank that will never serve it, and the abort that follows ends both. A rank alone
  // (which is not aborted, and finalizes MPI) closes it: nobody else is involved.
  ~SlideQueue() {
    if (!locked_ || world_.size() > 1) return;
    try {
      close();
    } catch (const core::Error&) {  // already failing; MPI's own error is secondary
    }
  }

  // Ends the queue's epoch once this rank takes no more tickets (before the job's closing collectives).
  void close() {
    if (!locked_) return;
    locked_ = false;
    counter_->unlock_all();
  }

  Next next() {
    const auto start = std::chrono::steady_clock::now();
    Next result;
    if (!whole_phase_) {
      result.stop = core::agree_stop(world_);
      if (result.stop == core::StopRequest::none && position_ < split_) {
        result.slide = static_cast<std::size_t>(order_[position_++]);
      } else if (result.stop == core::StopRequest::none && counter_) {
        whole_phase_ = true;  // the split slides are done, every rank agreed to go on: the others go whole
      }
    }
    if (whole_phase_) {
      result.stop = core::stop_requested();
      const auto past_end = static_cast<std::int64_t>(order_.size() - split_);
      const std::int64_t ticket = counter_->fetch_add(result.stop == core::StopRequest::none ? 1 : past_end, 0, 0);
      if (result.stop == core::StopRequest::none && ticket < past_end) {
        result.slide = static_cast<std::size_t>(order_[split_ + static_cast<std::size_t>(ticket)]);
        result.whole = true;
      }
    }
    wait_seconds_ += core::seconds_since(start);
    return result;
  }

  double wait_seconds() const { return wait_seconds_; }

 private:
  const core::Comm& world_;
  std::vector<std::int64_t> order_;
  std::size_t split_;                    // order_[0, split_) split, the rest whole
  bool whole_phase_;                     // handing out whole slides
  std::optional<core::Window> counter_;  // whole slides: the next ticket, one int64 on rank 0
  bool locked_ = false;                  // whole slides: inside the queue's epoch (lock_all)
  std::size_t position_ = 0;             // split slides
  double wait_seconds_ = 0.0;
};

// What one rank did, sent to rank 0 at the end of the job (JSON: a few entries per slide, once per job).
struct RankReport {
  std::map<std::size_t, json> written;  // slide index → summary entry (the slides this rank wrote)
  std::map<std::size_t, std::pair<std::string, std::string>> failed;  // slide index → id, error
  std::int64_t slides = 0;  // slides this rank scored (split slides: its share of each)
  std::int64_t tiles = 0;   // tiles of the slides this rank planned (split slides: rank 0 counts them)
  double seconds = 0.0;     // wall time from the first slide to the end of the last rank's
  double idle_seconds = 0.0;

  json to_json(int rank) const {
    json w = json::array();
    for (const auto& [s, entry] : written) w.push_back({{"index", s}, {"entry", entry}});
    json f = json::array();
    for (const auto& [s, failure] : failed)
      f.push_back({{"index", s}, {"id", failure.first}, {"error", failure.second}});
    return {{"rank", rank},
            {"written", w},
            {"failed", f},
            {"slides", slides},
            {"tiles", tiles},
            {"seconds", seconds},
            {"idle_seconds", idle_seconds}};
  }
};

struct InferOptions {
  JobOptions job;
  bool force = false;
};

int run_infer(const InferOptions& options) {
  auto config = load_job(infer_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;

  const std::string checkpoint = required_checkpoint(config);
  const auto inputs = io::list_input_slides(config);
  const fs::path out = config.get_string("output");
  const double threshold = config.get_number("infer.threshold");
  const auto& world = core::Comm::world();
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "infer");
  core::install_stop_handlers();  // SIGUSR1: finish the slide in hand; SIGTERM: stop now (core/signals.h)
  engine::Context::get().set_threads(static_cast<int>(config.get_int("infer.threads")));

  engine::SlideInferenceOptions inference_options;
  inference_options.stride = static_cast<int>(config.get_int("infer.stride"));
  inference_options.batch_size = static_cast<int>(config.get_int("infer.batch_size"));
  inference_options.tta = engine::parse_tta(config.get_string("infer.tta"));
  inference_options.assume_mpp = config.get_number("input.assume_mpp");

  analysis::OutputOptions output_options = analysis::read_output_options(config, threshold, "infer.threshold");
  // heatmap.tif's tiles are compressed on this rank's threads: the last slide's outputs are written while they idle.
  output_options.tiff.threads = engine::threads();

  engine::LoadedModel model = engine::load_model(checkpoint);
  const engine::Precision precision = engine::use_precision(
      model, checkpoint, engine::parse_precision(config.get_string("infer.precision"), "infer.precision"));
  const std::string checkpoint_path = fs::absolute(checkpoint).lexically_normal().string();
  // Tissue is found as the tiling found it for training, unless the job says otherwise: each tissue.* key the
  // job leaves unset takes the checkpoint's value (a checkpoint from before they were recorded has none; the
  // defaults stand). infer.config.yaml then holds the values used.
  if (const auto& tissue = model.meta.tissue) {
    const std::vector<std::pair<const char*, core::Value>> from_checkpoint = {
        {"tissue.min_fraction", tissue->min_fraction},
        {"tissue.mask_mpp", tissue->mask_mpp},
        {"tissue.reject_pen_marks", tissue->reject_pen_marks}};
    for (const auto& [key, value] : from_checkpoint) {
      if (config.is_set(key)) continue;
      try {
        config.assign(key, value, checkpoint);
      } catch (const core::ConfigError& e) {
        throw core::InputError(
            fmt::format("/meta records the tiling's {}, which inference cannot use: {}", key, e.message()), checkpoint);
      }
    }
  }
  const io::TissueSettings tissue = prep::tissue_settings(config);
  inference_options.min_tissue = tissue.min_fraction;
  inference_options.tissue.mask_mpp = tissue.mask_mpp;
  inference_options.tissue.reject_pen_marks = tissue.reject_pen_marks;
  if (prep::qc_enabled(config)) inference_options.qc = prep::qc_options(config);

  // Slides finished by an earlier run of this job are skipped; the others are the slides to do, in the order they
  // are handed out and each split or whole (assign_slides: rank 0 decides, every rank follows).
  const std::string job = analysis::infer_job_key(config, checkpoint_path);
  const std::string distribute_key = config.get_string("infer.distribute");
  std::vector<std::string> keys;
  for (const auto& input : inputs) keys.push_back(analysis::slide_key(job, input.path, input.mpp));
  Assignment assignment;
  std::map<std::size_t, json> finished;  // slide index → summary entry (rank 0)
  if (world.is_root()) {
    analysis::remove_unfinished(out);
    fs::create_directories(out / analysis::kInferRecordFolder);
    std::vector<std::int64_t> to_do;
    for (std::size_t s = 0; s < inputs.size(); ++s) {
      if (!options.force) {
        if (auto entry = analysis::finished_slide(out, inputs[s].id, keys[s])) {
          spdlog::info(
              "slide {}/{} {}: up to date (its outputs are from an earlier run with this checkpoint and these "
              "settings; --force redoes it)",
              s + 1, inputs.size(), inputs[s].id);
          finished[s] = std::move(*entry);
          continue;
        }
      }
      to_do.push_back(static_cast<std::int64_t>(s));
    }
    std::vector<std::uintmax_t> bytes(inputs.size(), 0);
    for (const std::int64_t s : to_do) {
      const auto k = static_cast<std::size_t>(s);
      bytes[k] = io::slide_bytes(inputs[k].path);
    }
    assignment = assign_slides(distribute_key, world.size(), std::move(to_do), bytes);
  }
  world.broadcast(assignment.order, 0);
  std::int64_t shape[2] = {static_cast<std::int64_t>(assignment.mode), static_cast<std::int64_t>(assignment.split)};
  world.broadcast(shape, sizeof shape, 0);
  assignment.mode = static_cast<Distribution>(shape[0]);
  assignment.split = static_cast<std::size_t>(shape[1]);
  const std::vector<std::int64_t>& order = assignment.order;
  const std::size_t pending = order.size();
  const Distribution mode = assignment.mode;
  // Whole slides: each rank plans, scores and writes its slides alone, on a communicator of its own.
  std::optional<core::Comm> own;
  if (mode != Distribution::tiles) own.emplace(world.split(world.rank(), 0));
  // One progress line per slide (core::Progress is collective over the slide's ranks): every rank's share of a
  // split slide, and rank 0's own whole slides. Otherwise the two are alike (the log and infer.json take the
  // settings from the first).
  inference_options.progress = true;
  engine::SlideInference split_inference(model, checkpoint_path, inference_options);
  inference_options.progress = world.is_root();
  engine::SlideInference whole_inference(model, checkpoint_path, inference_options);

  if (world.is_root()) {
    fs::create_directories(out);
    config.save((out / "infer.config.yaml").string());
    spdlog::info(
        "inferring {} slide(s) with {} ({}, {} px at {:g} µm/px, stain {}, epoch {}, {}), stride {} px, tta {}, "
        "tissue >= {:g} of a tile on a {:g} µm/px mask{} ({}), on {} rank(s) x {} thread(s)",
        inputs.size(), checkpoint, model.meta.architecture, split_inference.input_size(), split_inference.mpp(),
        model.meta.stain_normalization, model.meta.epoch, engine::to_string(precision), split_inference.stride(),
        engine::to_string(inference_options.tta), inference_options.min_tissue, inference_options.tissue.mask_mpp,
        inference_options.tissue.reject_pen_marks ? ", pen marks rejected" : "",
        model.meta.tissue ? "the checkpoint's tiling unless set" : "the job's; the checkpoint records none",
        world.size(), engine::threads());
    spdlog::info("the model's training data: {}", io::describe(model.meta.provenance));
    if (world.size() > 1 && mode == Distribution::tiles_slides) {
      std::vector<std::string> split_ids;
      for (std::size_t k = 0; k < assignment.split; ++k) {
        const auto s = static_cast<std::size_t>(order[k]);
        split_ids.push_back(fmt::format("{}/{} {}", s + 1, inputs.size(), inputs[s].id));
      }
      spdlog::info(
          "{} slide(s) to do on {} ranks (infer.distribute {}): {} with their tiles split over the ranks first, each "
          "larger than a rank's share of the slides left then ({}; {:.1f} MB of files to do), then the other {} "
          "whole, largest first, to the rank that asks",
          pending, world.size(), distribute_key, assignment.split, fmt::join(split_ids, ", "),
          static_cast<double>(assignment.total_bytes) / 1e6, pending - assignment.split);
    } else if (world.size() > 1) {
      spdlog::info("{} slide(s) to do on {} ranks: {} (infer.distribute {})", pending, world.size(),
                   mode == Distribution::slides ? "whole slides, largest first, to the rank that asks"
                                                : "every slide's tiles split over the ranks",
                   distribute_key);
    }
  }

  const auto t_start = std::chrono::steady_clock::now();
  RankReport report;
  double scoring_wait = 0.0;  // split slides: this rank's time waiting for the others inside the slides

  // The scoring rank of a slide (rank 0 for a split slide, each rank for its whole slides) writes its outputs on a
  // second thread while it scores its next slide (one slide in flight: memory stays at one extra map and thumbnail).
  std::future<analysis::WrittenSlide> writing;
  std::size_t writing_slide = 0;
  auto collect = [&] {
    if (!writing.valid()) return;
    analysis::WrittenSlide done = writing.get();  // rethrows an internal error of the writer
    if (done.error.empty()) {
      report.written[writing_slide] = std::move(done.entry);
    } else {
      report.failed[writing_slide] = {done.id, done.error};
    }
  };
  SlideQueue queue(world, assignment);
  // Rank 0 holds the slide counter: while it plans, scores and writes its own whole slides, a thread lets MPI serve
  // the other ranks' requests for a slide (needed where the target's MPI serves one-sided operations, as Open MPI's
  // osc/pt2pt over TCP does; elsewhere they never wait for rank 0).
  std::optional<core::ProgressThread> serving;
  core::StopRequest stop = core::StopRequest::none;
  for (;;) {
    const SlideQueue::Next next = queue.next();
    if (!next.slide) {
      stop = next.stop;
      break;
    }
    if (next.whole && world.is_root() && world.size() > 1 && !serving) serving.emplace(world);
    const core::Comm& scoring = next.whole ? *own : world;
    engine::SlideInference& inference = next.whole ? whole_inference : split_inference;
    const std::size_t s = *next.slide;
    const auto& input = inputs[s];
    const std::string position = fmt::format("{}/{}", s + 1, inputs.size());
    engine::SlideInferenceStats stats;
    io::Heatmap map;
    try {
      map = inference.run(input.path, input.id, scoring, &stats, input.mpp);
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      report.failed[s] = {input.id, e.what()};
      if (scoring.is_root()) spdlog::error("slide {} failed: {}", position, e.what());
      continue;
    }
    ++report.slides;
    scoring_wait += stats.rank_wait_seconds;
    core::fault::at("infer.slide-scored");
    if (!scoring.is_root()) continue;
    report.tiles += stats.tiles;
    collect();
    // A model that saw only synthetic slides, on a slide tessera synth did not make: said once here, and in the
    // slide's report.json and overlay (io/provenance.h).
    const std::string caution = io::model_caution(model.meta.provenance, stats.synthetic_slide);
    if (!caution.empty()) {
      spdlog::warn(
          "slide {} {}: {} (the model saw only slides made by tessera synth and this slide is not one: its heatmap "
          "and report are no diagnosis)",
          position, input.id, caution);
    }
    const analysis::QcOutcome qc = qc_outcome(stats);
    // The writer gets the figures and the QC outcome, not stats; the rest of the QC result (its tissue planes, the
    // classes found nowhere) is freed here, before the writer starts.
    stats.qc.reset();
    for (const auto& flag : qc.flags) spdlog::warn("slide {} {}: quality control: {}", position, input.id, flag);
    writing_slide = s;
    const analysis::ScoringStats scored{stats.cells,        stats.tiles,           stats.seconds,
                                        stats.plan_seconds, stats.tissue_area_mm2, stats.read_wait_seconds};
    writing = std::async(
        std::launch::async, [&, input, scored, position, caution, qc, key = keys[s], map = std::move(map)]() mutable {
          return analysis::write_slide({input.id, input.path, input.mpp, model.meta.provenance, caution, qc},
                                       std::move(map), scored, position, out, output_options,
                                       inference_options.assume_mpp, threshold, key);
        });
  }
  collect();  // this rank's last outputs and record are complete before the job ends or stops

  // The end of the job: every rank waits for the last (its idle time: closing the queue's epoch can wait for the
  // other ranks too), they agree on a stop request that came in during the last slides, and rank 0 gathers what
  // each did.
  const auto end_start = std::chrono::steady_clock::now();
  serving.reset();
  queue.close();
  world.barrier();
  report.idle_seconds = queue.wait_seconds() + scoring_wait + core::seconds_since(end_start);
  report.seconds = core::seconds_since(t_start);
  const double seconds = report.seconds;
  stop = std::max(stop, core::agree_stop(world));
  // Rank 0, once every rank's report is in: the slides' entries in slide order (those of earlier runs included),
  // the failures, and infer.json; or, when a stop request left slides not started, the message and no summary (the
  // rerun's is the job's).
  auto summarize_job = [&](const std::vector<std::string>& parts) -> std::int64_t {
    std::map<std::size_t, json> entries = std::move(finished);
    std::map<std::size_t, std::pair<std::string, std::string>> failures;  // with tiles, every rank reports them
    std::set<std::size_t> attempted;
    std::int64_t total_tiles = 0;
    json per_rank = json::array();
    double largest_idle = 0.0;
    int idlest = 0;
    for (const auto& part : parts) {
      const json r = json::parse(part);
      for (const auto& w : r["written"]) {
        attempted.insert(w["index"].get<std::size_t>());
        entries[w["index"].get<std::size_t>()] = w["entry"];
      }
      for (const auto& f : r["failed"]) {
        attempted.insert(f["index"].get<std::size_t>());
        failures[f["index"].get<std::size_t>()] = {f["id"], f["error"]};
      }
      total_tiles += r["tiles"].get<std::int64_t>();
      const double wall = r["seconds"].get<double>();
      const double idle_fraction = r["idle_seconds"].get<double>() / std::max(wall, 1e-9);
      if (idle_fraction >= largest_idle) {
        largest_idle = idle_fraction;
        idlest = r["rank"].get<int>();
      }
      per_rank.push_back({{"rank", r["rank"]},
                          {"slides", r["slides"]},
                          {"seconds", wall},
                          {"idle_seconds", r["idle_seconds"]},
                          {"idle_fraction", idle_fraction}});
    }
    if (attempted.size() < pending) {
      // Only a stop request leaves slides not started: every rank takes slides until none is left.
      if (stop == core::StopRequest::none) {
        throw core::InternalError(fmt::format("infer: {} of {} slides were handed out", attempted.size(), pending));
      }
      const auto first = static_cast<std::size_t>(*std::find_if(order.begin(), order.end(), [&](std::int64_t s) {
        return attempted.count(static_cast<std::size_t>(s)) == 0;
      }));
      spdlog::warn(
          "{}: stopped before slide {}/{} {} ({} of {} slide(s) not started); the slides done are recorded, run the "
          "job again for the rest",
          core::signal_name(stop), first + 1, inputs.size(), inputs[first].id, pending - attempted.size(),
          inputs.size());
      return core::exit_interrupted;
    }

    json slides = json::array();
    for (auto& [s, entry] : entries) slides.push_back(std::move(entry));
    // tiles+slides: the slides done with their tiles split over every rank, in the order scored (a failed one is
    // among the failures alone); the other modes split all or none.
    json split_slides = json::array();
    for (std::size_t k = 0; mode == Distribution::tiles_slides && k < assignment.split; ++k) {
      const auto s = static_cast<std::size_t>(order[k]);
      if (failures.count(s) == 0) split_slides.push_back(inputs[s].id);
    }
    std::map<std::string, std::string> failed;  // id → error
    for (const auto& [s, failure] : failures) failed[failure.first] = failure.second;
    json failure_list = json::array();
    for (const auto& [id, error] : failed) failure_list.push_back({{"id", id}, {"error", error}});
    const json summary = {{"checkpoint", checkpoint_path},
                          {"training_data", io::to_string(io::training_data(model.meta.provenance))},
                          {"ranks", world.size()},
                          {"threads_per_rank", engine::threads()},
                          {"distribute", to_string(mode)},
                          {"split_slides", split_slides},
                          {"stride", split_inference.stride()},
                          {"tta", engine::to_string(inference_options.tta)},
                          {"precision", engine::to_string(precision)},
                          {"threshold", threshold},
                          {"tiles", total_tiles},
                          {"seconds", seconds},
                          {"tiles_per_second", static_cast<double>(total_tiles) / std::max(seconds, 1e-9)},
                          {"per_rank", per_rank},
                          {"slides", slides},
                          {"failures", failure_list},
                          {"slurm", slurm_record()}};
    core::write_file_atomic((out / "infer.json").string(), summary.dump(2) + "\n");

    const std::string where = fs::absolute(out).lexically_normal().string();
    spdlog::info(
        "{} of {} slide(s) done, {} tiles in {:.1f} s ({:.0f} tiles/s); outputs in {} "
        "(<slide>.<output> per slide; summary infer.json)",
        inputs.size() - failed.size(), inputs.size(), total_tiles, seconds,
        static_cast<double>(total_tiles) / std::max(seconds, 1e-9), where);
    if (world.size() > 1) {
      spdlog::info(
          "idle (waiting for work or for other ranks) at most {:.1f}% of a rank's time (rank {}); per rank "
          "in infer.json",
          100.0 * largest_idle, idlest);
    }
    if (!failed.empty()) {
      std::fprintf(stderr, "tessera infer: %zu of %zu slides failed (the others' outputs are in %s):\n", failed.size(),
                   inputs.size(), where.c_str());
      for (const auto& [id, error] : failed) std::fprintf(stderr, "  %s\n", error.c_str());
      return core::exit_input;
    }
    return core::exit_ok;
  };
  const auto reports = world.gather_bytes(report.to_json(world.rank()).dump(), 0);
  std::int64_t code = core::exit_ok;
  if (world.is_root()) code = summarize_job(reports);
  world.broadcast(&code, sizeof code, 0);
  return static_cast<int>(code);
}
}  // namespace

Action setup_infer(CLI::App& command) {
  auto options = std::make_shared<InferOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-c,--checkpoint", {"checkpoint"},
               "Trained model, e.g. runs/train/checkpoint.h5 (checkpoint)");
  add_key_flag(command, options->job, "--slides", {"input.slides"},
               "Slides: comma-separated files or globs, or one dataset.csv (input.slides)", FlagForm::list,
               {"input.csv"});
  add_key_flag(command, options->job, "--csv", {"input.csv"}, "dataset.csv of the slides (input.csv)", FlagForm::value,
               {"input.slides"});
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, options->job, "--splits", {"input.splits"},
               "With a dataset.csv: comma-separated splits, e.g. test (input.splits)", FlagForm::list);
  add_key_flag(command, options->job, "--stride", {"infer.stride"},
               "Pixels at the model's resolution between cells; 0 = half a tile (infer.stride)");
  add_key_flag(command, options->job, "--batch", {"infer.batch_size"}, "Tiles per forward pass (infer.batch_size)");
  add_key_flag(command, options->job, "--tta", {"infer.tta"}, "Test-time augmentation: none, flips, d8 (infer.tta)");
  add_key_flag(command, options->job, "--threshold", {"infer.threshold"},
               "P(tumour) that counts as tumour (infer.threshold)");
  add_key_flag(command, options->job, "--dicom-seg", {"dicom_seg.enabled"},
               "Also write <slide>.seg.dcm, a DICOM Segmentation (slides read from DICOM only; dicom_seg.enabled)",
               FlagForm::on);
  add_key_flag(command, options->job, "--precision", {"infer.precision"},
               "fp32, bf16 (where the CPU has AVX-512 BF16) or int8 (VNNI; calibrated by tessera quantize) "
               "(infer.precision)");
  add_key_flag(command, options->job, "--threads", {"infer.threads"},
               "OpenMP threads per rank, 0 = all cores (infer.threads)");
  add_key_flag(command, options->job, "--distribute", {"infer.distribute"},
               "Under MPI: slides (whole slides to the ranks), tiles (each slide's tiles over every rank) or auto "
               "(infer.distribute)");
  command.add_flag("--force", options->force,
                   "Redo every slide, also those whose outputs an earlier run made with the same checkpoint and "
                   "settings (skipped otherwise)");
  command.footer(
      "Writes per slide <slide>.heatmap.h5, .overlay.png, .heatmap.tif, .geojson (QuPath), .xml (ASAP), "
      ".detections.csv (CAMELYON16) and .report.json into the output folder, and infer.json. Runs the "
      "same under mpirun/srun: with at least as many slides as ranks each rank takes whole slides (largest first) "
      "and writes their outputs, else every rank scores a share of each slide's tiles and rank 0 writes; a slide "
      "larger than a rank's share of the slides left is split over every rank first (infer.distribute). A failing "
      "slide is reported and the rest go on (exit code 3 at the end).");
  return [options] { return run_infer(*options); };
}

}  // namespace tessera::app
