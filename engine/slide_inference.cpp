#include "engine/slide_inference.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <opencv2/core.hpp>

#include "core/error.h"
#include "core/fault.h"
#include "core/measure.h"
#include "core/partition.h"
#include "core/progress.h"
#include "core/signals.h"
#include "io/slide.h"
#include "preprocessing/tiling.h"

namespace tessera::engine {

namespace {

using Clock = std::chrono::steady_clock;

struct TtaName {
  Tta tta;
  const char* name;
  int views;
};
constexpr TtaName kTtaNames[] = {{Tta::none, "none", 1}, {Tta::flips, "flips", 4}, {Tta::d8, "d8", 8}};

// The slide's grid as rank 0 plans it and every rank receives it.
struct PlanHeader {
  std::int64_t width = 0;
  std::int64_t height = 0;
  double slide_mpp = 0.0;
  std::int64_t step = 0;   // level-0 pixels between cell origins
  double footprint = 0.0;  // level-0 pixels covered by one tile side
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t cells = 0;  // tissue cells
  double plan_seconds = 0.0;
  double tissue_area_mm2 = 0.0;
  std::int64_t synthetic = 0;    // 1: made by tessera synth (io::Slide::synthetic)
  std::int64_t qc_excluded = 0;  // tissue cells not scored because of excluded artefacts
};

struct Plan {
  PlanHeader header;
  std::vector<std::int64_t> cells;  // row-major cell indices (i · cols + j) of the tissue cells, increasing
};

// Wire format of the plan broadcast: one status byte ('k' ok, 'e' error), then the header and the cells, or the
// error text.
std::string pack_plan(const Plan& plan) {
  std::string bytes(1, 'k');
  bytes.append(reinterpret_cast<const char*>(&plan.header), sizeof plan.header);
  bytes.append(reinterpret_cast<const char*>(plan.cells.data()), plan.cells.size() * sizeof(std::int64_t));
  return bytes;
}

Plan unpack_plan(const std::string& bytes) {
  Plan plan;
  std::memcpy(&plan.header, bytes.data() + 1, sizeof plan.header);
  plan.cells.resize(static_cast<std::size_t>(plan.header.cells));
  if (!plan.cells.empty()) {
    std::memcpy(plan.cells.data(), bytes.data() + 1 + sizeof plan.header, plan.cells.size() * sizeof(std::int64_t));
  }
  return plan;
}

// Level-0 origins 0, step, 2·step, ... of the tiles that lie wholly inside `extent`.
std::vector<std::int64_t> origins(std::int64_t extent, std::int64_t step, double footprint) {
  constexpr double kEpsilon = 1e-9;  // as tiling: a tile that ends exactly at the edge is inside
  std::vector<std::int64_t> out;
  for (std::int64_t o = 0; static_cast<double>(o) + footprint <= static_cast<double>(extent) + kEpsilon; o += step) {
    out.push_back(o);
  }
  return out;
}

// Reads tiles as `tessera tile` does (app/tile.cpp's Extractor): one level read covers the next kWindowTiles
// tiles of a row, and each tile is cut from it with exactly the pixels Slide::read_at_mpp gives.
class TileReader {
 public:
  TileReader(const io::Slide& slide, int size, double mpp, const prep::StainNormalizer* normalizer)
      : slide_(slide), size_(size), mpp_(mpp), normalizer_(normalizer) {}

  // Fills `batch` with the tiles of `count` cells (read, normalized), in order.
  void read(const Plan& plan, const std::int64_t* cells, int count, const std::string& slide_id, io::Batch& batch) {
    const std::size_t tile_bytes = static_cast<std::size_t>(size_) * static_cast<std::size_t>(size_) * 3;
    batch.size = count;
    batch.tile_size = size_;
    batch.images.resize(static_cast<std::size_t>(count) * tile_bytes);
    batch.labels.assign(static_cast<std::size_t>(count), 0);
    batch.tumor_fractions.assign(static_cast<std::size_t>(count), 0.0f);
    batch.coords.resize(2 * static_cast<std::size_t>(count));
    batch.slide_ids.assign(static_cast<std::size_t>(count), slide_id);
    for (int k = 0; k < count; ++k) {
      const std::int64_t cell = cells[k];
      const std::int64_t x = (cell % plan.header.cols) * plan.header.step;
      const std::int64_t y = (cell / plan.header.cols) * plan.header.step;
      cv::Mat rgb = read_tile(x, y);
      if (normalizer_ != nullptr) normalizer_->apply(rgb);
      cv::Mat out(size_, size_, CV_8UC3, batch.images.data() + static_cast<std::size_t>(k) * tile_bytes);
      rgb.copyTo(out);
      batch.coords[2 * static_cast<std::size_t>(k)] = x;
      batch.coords[2 * static_cast<std::size_t>(k) + 1] = y;
    }
  }

 private:
  cv::Mat read_tile(std::int64_t x, std::int64_t y) {
    constexpr int kWindowTiles = 32;
    if (!window_ || !window_->contains(x, y, size_, size_, mpp_)) {
      window_.reset();
      const auto side0 = static_cast<std::int64_t>(std::ceil(size_ * mpp_ / slide_.mpp()));
      const auto width0 =
          std::min<std::int64_t>(side0 * kWindowTiles, std::max<std::int64_t>(side0, slide_.width() - x));
      window_.emplace(slide_, x, y, width0, side0, mpp_);
      if (!window_->contains(x, y, size_, size_, mpp_)) {  // rounding at odd resolutions: read this tile alone
        window_.reset();
        return slide_.read_at_mpp(x, y, size_, size_, mpp_);
      }
    }
    return window_->read_at_mpp(x, y, size_, size_, mpp_);
  }

  const io::Slide& slide_;
  int size_;
  double mpp_;
  const prep::StainNormalizer* normalizer_;
  std::optional<io::SlideWindow> window_;
};

// The texts of the ranks' failures, first failing rank first; empty when every rank succeeded. Collective.
std::string agree_on_failure(const core::Comm& comm, const std::string& mine) {
  for (const auto& text : comm.allgather_bytes(mine)) {
    if (!text.empty()) return text;
  }
  return {};
}

[[noreturn]] void throw_slide_failure(const std::string& text) { throw core::Error(core::ErrorKind::input, text); }

}  // namespace

Tta parse_tta(const std::string& name) {
  for (const auto& t : kTtaNames) {
    if (name == t.name) return t.tta;
  }
  throw core::ConfigError(fmt::format("unknown test-time augmentation '{}' (known: none, flips, d8)", name), "", 0,
                          "tta");
}

const char* to_string(Tta tta) {
  for (const auto& t : kTtaNames) {
    if (tta == t.tta) return t.name;
  }
  return "unknown";
}

int tta_views(Tta tta) {
  for (const auto& t : kTtaNames) {
    if (tta == t.tta) return t.views;
  }
  return 1;
}

void tta_view(const std::uint8_t* src, std::uint8_t* dst, int count, int size, Tta tta, int view) {
  if (view < 0 || view >= tta_views(tta)) {
    throw core::InternalError(
        fmt::format("tta_view: view {} of '{}' (which has {})", view, to_string(tta), tta_views(tta)));
  }
  // The eight symmetries of the square: the tile, transposed for views 4-7, then mirrored left-right (view bit 0)
  // and top-bottom (bit 1). flips uses the four without the transpose (both mirrors = the 180° rotation); d8
  // adds the four with it (the 90° and 270° rotations and the two diagonal mirrors).
  const bool transpose = view >= 4;
  const bool mirror_x = (view & 1) != 0;
  const bool mirror_y = (view & 2) != 0;
  const std::size_t plane = static_cast<std::size_t>(size) * static_cast<std::size_t>(size) * 3;
  const int last = size - 1;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < count; ++n) {
    const std::uint8_t* in = src + static_cast<std::size_t>(n) * plane;
    std::uint8_t* out = dst + static_cast<std::size_t>(n) * plane;
    for (int y = 0; y < size; ++y) {
      for (int x = 0; x < size; ++x) {
        const int row = mirror_y ? last - y : y;  // in the transposed (or not) tile
        const int col = mirror_x ? last - x : x;
        const int a = transpose ? col : row;
        const int b = transpose ? row : col;
        const std::uint8_t* p = in + (static_cast<std::size_t>(a) * static_cast<std::size_t>(size) + b) * 3;
        std::uint8_t* q = out + (static_cast<std::size_t>(y) * static_cast<std::size_t>(size) + x) * 3;
        q[0] = p[0];
        q[1] = p[1];
        q[2] = p[2];
      }
    }
  }
}

SlideInference::SlideInference(LoadedModel& model, std::string checkpoint, SlideInferenceOptions options)
    : model_(model), checkpoint_(std::move(checkpoint)), options_(std::move(options)) {
  const auto& meta = model_.meta;
  if (!(meta.mpp > 0.0)) {
    throw core::InputError(
        "/meta does not say at what resolution the model's tiles were made (mpp is 0); "
        "inference needs it to read slides at that resolution",
        checkpoint_);
  }
  mpp_ = meta.mpp;
  input_size_ = static_cast<int>(meta.input_size);
  // The target travels as StainNormalizer::describe() text: in stain_normalization (what tessera train writes,
  // copied from the shards) or, when a converter filled it, in stain_target.
  const std::string& description =
      meta.stain_target.empty() || meta.stain_normalization != "none" ? meta.stain_normalization : meta.stain_target;
  normalizer_ = prep::stain_normalizer_from_description(description, checkpoint_);
  if (options_.batch_size < 1) {
    throw core::ConfigError(fmt::format("the batch size must be at least 1 (got {})", options_.batch_size), "", 0,
                            "batch_size");
  }
  if (options_.stride < 0) {
    throw core::ConfigError(fmt::format("the stride must be 0 (half a tile) or positive (got {})", options_.stride), "",
                            0, "stride");
  }
  stride_ = options_.stride > 0 ? options_.stride : std::max(1, input_size_ / 2);
}

io::Heatmap SlideInference::run(const std::string& slide_path, const std::string& slide_id, const core::Comm& comm,
                                SlideInferenceStats* stats, double slide_assume_mpp) {
  const auto start = Clock::now();
  io::SlideOpenOptions open_options;
  open_options.assume_mpp = slide_assume_mpp > 0.0 ? slide_assume_mpp : options_.assume_mpp;
  std::optional<io::Slide> slide;
  std::shared_ptr<const prep::QcResult> qc;  // rank 0

  // 1. Plan (rank 0): open, tissue mask, grid, tissue cells; broadcast to every rank.
  std::string plan_bytes;
  if (comm.is_root()) {
    try {
      slide.emplace(io::Slide::open(slide_path, open_options));
      Plan plan;
      auto& h = plan.header;
      h.width = slide->width();
      h.height = slide->height();
      h.slide_mpp = slide->mpp();
      h.synthetic = slide->synthetic() ? 1 : 0;
      h.footprint = input_size_ * mpp_ / h.slide_mpp;
      h.step = std::max<std::int64_t>(1, std::llround(stride_ * mpp_ / h.slide_mpp));
      const auto xs = origins(h.width, h.step, h.footprint);
      const auto ys = origins(h.height, h.step, h.footprint);
      if (xs.empty() || ys.empty()) {
        throw core::InputError(fmt::format("the slide ({}×{} px at {:g} µm/px) is smaller than one tile of the model "
                                           "({} px at {:g} µm/px = {:.1f} level-0 px)",
                                           h.width, h.height, h.slide_mpp, input_size_, mpp_, h.footprint),
                               slide_path);
      }
      h.rows = static_cast<std::int64_t>(ys.size());
      h.cols = static_cast<std::int64_t>(xs.size());
      const auto tissue = prep::detect_tissue(*slide, options_.tissue);
      h.tissue_area_mm2 = tissue.tissue_area_mm2();
      const auto fractions = prep::tissue_fractions(tissue, xs, ys, h.footprint);
      std::vector<double> excluded(fractions.size(), 0.0);
      if (options_.qc) {
        auto result = std::make_shared<prep::QcResult>(prep::run_qc(*slide, *options_.qc));
        if (options_.qc->refuse_flagged && !result->flags.empty()) {
          throw core::InputError("quality control flags the slide (qc.refuse_flagged): " + result->flags.front(),
                                 slide_path);
        }
        // The excluded artefacts' share of each cell, by the rule tissue fractions use.
        prep::TissueMask artefacts = result->tissue;
        artefacts.mask = result->excluded();
        excluded = prep::tissue_fractions(artefacts, xs, ys, h.footprint);
        qc = std::move(result);
      }
      for (std::size_t c = 0; c < fractions.size(); ++c) {
        if (fractions[c] < options_.min_tissue) continue;
        if (options_.qc && excluded[c] > options_.qc->max_fraction) {
          ++h.qc_excluded;
          continue;
        }
        plan.cells.push_back(static_cast<std::int64_t>(c));
      }
      h.cells = static_cast<std::int64_t>(plan.cells.size());
      h.plan_seconds = core::seconds_since(start);
      plan_bytes = pack_plan(plan);
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      plan_bytes = std::string(1, 'e') + e.what();
    }
  }
  const auto plan_wait_start = Clock::now();
  comm.broadcast(plan_bytes, 0);
  double rank_wait = core::seconds_since(plan_wait_start);
  if (plan_bytes.empty() || plan_bytes[0] != 'k')
    throw_slide_failure(plan_bytes.substr(std::min<std::size_t>(1, plan_bytes.size())));
  const Plan plan = unpack_plan(plan_bytes);
  const auto& h = plan.header;

  // 2. Score this rank's batches: the reader prepares batch b + 1 while the model scores batch b.
  const auto total = static_cast<std::int64_t>(plan.cells.size());
  const std::int64_t batch_size = options_.batch_size;
  const std::int64_t batches = (total + batch_size - 1) / batch_size;
  const std::int64_t first_batch = core::part_begin(batches, comm.size(), comm.rank());
  const std::int64_t end_batch = core::part_begin(batches, comm.size(), comm.rank() + 1);
  const std::int64_t first_cell = first_batch * batch_size;
  const std::int64_t end_cell = std::min(total, end_batch * batch_size);
  std::vector<float> mine(static_cast<std::size_t>(std::max<std::int64_t>(0, end_cell - first_cell)));
  std::string failure;
  double read_wait = 0.0;
  {
    std::optional<core::Progress> progress;
    if (options_.progress) progress.emplace(comm, total, core::ProgressOptions{.label = slide_id, .unit = "tiles"});
    try {
      if (first_cell < end_cell) {
        if (!slide) slide.emplace(io::Slide::open(slide_path, open_options));
        TileReader reader(*slide, input_size_, mpp_, normalizer_.get());
        TileScorer scorer(*model_.model);
        const int views = tta_views(options_.tta);
        const auto classes = static_cast<std::size_t>(model_.meta.num_classes);
        const auto positive = static_cast<std::size_t>(model_.positive_class);
        io::Batch batches_buf[2];
        io::Batch view;
        std::vector<double> sum;
        auto fetch = [&](std::int64_t b, io::Batch& into) {
          const std::int64_t from = b * batch_size;
          const auto count = static_cast<int>(std::min(total, from + batch_size) - from);
          return std::async(std::launch::async, [&reader, &plan, &into, &slide_id, from, count] {
            reader.read(plan, plan.cells.data() + from, count, slide_id, into);
          });
        };
        std::future<void> next = fetch(first_batch, batches_buf[0]);
        for (std::int64_t b = first_batch; b < end_batch; ++b) {
          const auto wait_start = Clock::now();
          next.get();  // rethrows the reader's error
          read_wait += core::seconds_since(wait_start);
          io::Batch& batch = batches_buf[(b - first_batch) % 2];
          if (b + 1 < end_batch) next = fetch(b + 1, batches_buf[(b + 1 - first_batch) % 2]);

          const auto n = static_cast<std::size_t>(batch.size);
          sum.assign(n, 0.0);
          for (int v = 0; v < views; ++v) {
            const io::Batch* scored = &batch;
            if (v > 0) {
              view.size = batch.size;
              view.tile_size = batch.tile_size;
              view.images.resize(batch.images.size());
              view.coords = batch.coords;
              view.slide_ids = batch.slide_ids;
              tta_view(batch.images.data(), view.images.data(), batch.size, batch.tile_size, options_.tta, v);
              scored = &view;
            }
            const auto& p = scorer.probabilities(*scored);
            for (std::size_t i = 0; i < n; ++i) sum[i] += p[i * classes + positive];
          }
          const std::size_t offset = static_cast<std::size_t>(b * batch_size - first_cell);
          for (std::size_t i = 0; i < n; ++i) mine[offset + i] = static_cast<float>(sum[i] / views);
          if (progress) progress->advance(batch.size);
          core::fault::at("infer.batch");
          // SIGTERM: this slide is left to the rerun (core/signals.h); the reader's batch in flight is waited for.
          core::throw_if_terminated("slide '" + slide_id + "'");
        }
      }
    } catch (const core::Error& e) {
      // The future in flight (if any) is waited for by its destructor when this scope ends.
      if (e.kind() != core::ErrorKind::input) throw;
      failure = e.what();
    }
    if (progress) progress->finish();
  }

  // 3. Agree on failure, then gather the scores on rank 0.
  const auto gather_start = Clock::now();
  const std::string first_failure = agree_on_failure(comm, failure);
  if (!first_failure.empty()) throw_slide_failure(first_failure);
  std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(float));
  const auto parts = comm.gather_bytes(bytes, 0);
  rank_wait += core::seconds_since(gather_start);

  io::Heatmap map;
  map.slide_id = slide_id;
  map.slide_path = slide_path;
  map.slide_width = h.width;
  map.slide_height = h.height;
  map.slide_mpp = h.slide_mpp;
  map.tile_mpp = mpp_;
  map.origin_x = 0;
  map.origin_y = 0;
  map.step = h.step;
  map.tile = std::llround(h.footprint);
  map.rows = static_cast<int>(h.rows);
  map.cols = static_cast<int>(h.cols);
  map.checkpoint = checkpoint_;
  if (comm.is_root()) {
    map.prob.assign(static_cast<std::size_t>(h.rows * h.cols), std::numeric_limits<float>::quiet_NaN());
    std::size_t k = 0;
    for (const auto& part : parts) {
      const std::size_t n = part.size() / sizeof(float);
      if (k + n > plan.cells.size()) throw core::InternalError("infer: more scores gathered than tissue cells");
      for (std::size_t i = 0; i < n; ++i, ++k) {
        float p = 0.0f;
        std::memcpy(&p, part.data() + i * sizeof(float), sizeof p);
        map.prob[static_cast<std::size_t>(plan.cells[k])] = p;
      }
    }
    if (k != plan.cells.size()) {
      throw core::InternalError(fmt::format("infer: {} scores gathered for {} tissue cells", k, plan.cells.size()));
    }
  }
  if (stats != nullptr) {
    stats->cells = h.rows * h.cols;
    stats->tiles = total;
    stats->seconds = core::seconds_since(start);
    stats->plan_seconds = h.plan_seconds;
    stats->tissue_area_mm2 = h.tissue_area_mm2;
    stats->synthetic_slide = h.synthetic != 0;
    stats->read_wait_seconds = read_wait;
    stats->rank_wait_seconds = rank_wait;
    stats->qc_excluded_cells = h.qc_excluded;
    stats->qc = qc;
  }
  return map;
}

io::Heatmap infer_slide(LoadedModel& model, const std::string& checkpoint, const std::string& slide_path,
                        const std::string& slide_id, const SlideInferenceOptions& options, const core::Comm& comm,
                        SlideInferenceStats* stats) {
  SlideInference inference(model, checkpoint, options);
  return inference.run(slide_path, slide_id, comm, stats);
}

}  // namespace tessera::engine
