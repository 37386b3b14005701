// A trained tile classifier over a whole slide: the tumour-probability heatmap of `tessera infer`.
//
//   LoadedModel model = load_model("run/checkpoint.h5");
//   SlideInference inference(model, "run/checkpoint.h5", options);   // checks /meta, rebuilds the stain target
//   io::Heatmap map = inference.run("slides/a.svs", "a", core::Comm::world());   // collective
//
// Grid. Everything comes from the checkpoint's /meta, so inference sees tiles as training did: a cell is one
// tile of input_size pixels at the model's µm/px, read exactly as `tessera tile` reads it (io::Slide::read_at_mpp
// through a SlideWindow: best level, area resampling) and stain-normalized with the target /meta names. Cell
// (i, j) is the tile whose level-0 top-left is (j·step, i·step), step = round(stride · mpp / slide_mpp) level-0
// pixels (a whole number, so the map's geometry is exact; stride defaults to half a tile, so cells overlap), and
// the grid holds the tiles that lie wholly inside the slide. A cell is scored when its tissue fraction (tissue
// mask at options.tissue, prep::tissue_fractions: the rule tiling keeps tiles by) is at least min_tissue; its
// value is then P(tumour) of its tile (the mean over the test-time views with tta), NaN otherwise.
//
// Work. Tissue cells in row-major order are cut into batches of batch_size; under MPI every rank takes a
// contiguous, balanced share of the batches (so the batches, and the map, are the same on any number of ranks),
// a reader thread reads + decodes + normalizes the next batch while the model (OpenMP threads) scores the current
// one, and rank 0 gathers the scores. Memory per rank: two batches, one view buffer for test-time augmentation
// and the grid's floats, whatever the slide's size (no level is ever read whole).
//
// Failure. A slide that cannot be opened, planned or read on any rank fails on every rank alike: the ranks agree
// (one exchange of error texts) before any gather, and run() then throws, on every rank, a core::Error of kind
// input whose text is the first failing rank's error (it names the file). Other error kinds (bugs, MPI) are not
// caught.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/comm.h"
#include "engine/inference.h"
#include "io/heatmap.h"
#include "preprocessing/qc.h"
#include "preprocessing/stain_norm.h"
#include "preprocessing/tissue.h"

namespace tessera::engine {

// Test-time augmentation: the views of each tile whose probabilities are averaged.
//   none   the tile as read (1 view)
//   flips  the tile, mirrored left-right, mirrored top-bottom, and both (= rotated 180°) (4 views)
//   d8     the eight symmetries of the square: 4 rotations by 90°, each also mirrored (8 views)
enum class Tta { none, flips, d8 };
Tta parse_tta(const std::string& name);  // ConfigError on key "tta" listing the names
const char* to_string(Tta tta);
int tta_views(Tta tta);

// Writes view `view` (0 .. tta_views(tta)-1; 0 is the identity) of each of `count` tiles of `size`×`size` RGB
// pixels in `src` into `dst` (same layout, N×T×T×3).
void tta_view(const std::uint8_t* src, std::uint8_t* dst, int count, int size, Tta tta, int view);

struct SlideInferenceOptions {
  int stride = 0;       // model-input pixels between cell origins; 0 = half the input size
  int batch_size = 32;  // tiles per forward pass
  Tta tta = Tta::none;
  // Tissue as the tiling found it: tessera infer fills these from /meta's tissue settings unless its job sets them.
  double min_tissue = 0.5;     // minimum tissue fraction of a scored cell (tiling's tissue.min_fraction)
  prep::TissueOptions tissue;  // the tissue mask (tiling's tissue.mask_mpp, tissue.reject_pen_marks)
  double assume_mpp = 0.0;     // µm/px for slides that record none (0 = such slides fail)
  // Slide quality control (preprocessing/qc.h) before scoring; none = off. Cells with more than qc->max_fraction
  // of their area in excluded artefacts are not scored (NaN, like background); with qc->refuse_flagged a
  // slide-level flag fails the slide.
  std::optional<prep::QcOptions> qc;
  bool progress = true;  // a core::Progress per slide
};

// What one run() did (the same on every rank, except read_wait_seconds and rank_wait_seconds).
struct SlideInferenceStats {
  std::int64_t cells = 0;              // rows × cols
  std::int64_t tiles = 0;              // tissue cells scored, all ranks
  double seconds = 0.0;                // wall time of run(): plan, score, gather
  double plan_seconds = 0.0;           // open + tissue mask + grid (rank 0)
  double tissue_area_mm2 = 0.0;        // the tissue mask's area (prep::TissueMask::tissue_area_mm2)
  double read_wait_seconds = 0.0;      // this rank: time the model waited for the reader
  double rank_wait_seconds = 0.0;      // this rank: time in the plan broadcast, failure agreement and gather
  bool synthetic_slide = false;        // the slide carries tessera synth's marker (io/provenance.h)
  std::int64_t qc_excluded_cells = 0;  // tissue cells not scored because of excluded artefacts
  // Rank 0 only (null elsewhere, and when QC is off): the QC stage's masks and findings.
  std::shared_ptr<const prep::QcResult> qc;
};

class SlideInference {
 public:
  // Checks that /meta says how the model's tiles were made (mpp > 0, a stain normalization this program knows),
  // else InputError naming `checkpoint`; ConfigError for impossible options (batch size, stride). `model` must
  // outlive this object.
  SlideInference(LoadedModel& model, std::string checkpoint, SlideInferenceOptions options);

  // The heatmap of one slide. Collective over `comm`: every rank calls it with the same arguments. The returned
  // map has its geometry on every rank and its probabilities (rows × cols, NaN off tissue) on rank 0 only
  // (elsewhere `prob` is empty). Throws core::Error (kind input) on every rank when the slide fails (see above).
  io::Heatmap run(const std::string& slide_path, const std::string& slide_id, const core::Comm& comm,
                  SlideInferenceStats* stats = nullptr, double slide_assume_mpp = 0.0);

  int input_size() const { return input_size_; }
  double mpp() const { return mpp_; }
  int stride() const { return stride_; }  // model pixels (the default resolved)

 private:
  LoadedModel& model_;
  std::string checkpoint_;
  SlideInferenceOptions options_;
  std::unique_ptr<prep::StainNormalizer> normalizer_;  // null: none
  int input_size_ = 0;
  double mpp_ = 0.0;
  int stride_ = 0;
};

// One slide with a fresh SlideInference (checks /meta each time; prefer the class for many slides).
io::Heatmap infer_slide(LoadedModel& model, const std::string& checkpoint, const std::string& slide_path,
                        const std::string& slide_id, const SlideInferenceOptions& options, const core::Comm& comm,
                        SlideInferenceStats* stats = nullptr);

}  // namespace tessera::engine
