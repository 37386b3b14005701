// Synthetic H&E whole-slide images with exact ground truth (`tessera synth`).
//
// Every pixel is a deterministic function of (x, y) and the slide's seed: the slide is rendered strip by
// strip straight into the streaming TIFF writer, so memory stays bounded whatever the slide size; only
// low-resolution fields (tissue and tumour maps at 1/16 scale) are held whole.
//
// What a slide contains: near-white glass with faint noise and vignetting; one or more tissue sections of
// irregular outline with holes; eosin stroma with fibrous texture; normal lymphoid/glandular architecture
// with small, round, evenly spaced nuclei; on tumour slides, tumour regions from isolated clusters
// (< 0.2 mm) to macrometastases (several mm) with crowded, enlarged, pleomorphic, hyperchromatic nuclei
// and borders that blend over a few cells; per-slide stain vectors and intensity; optional focus-blur
// patches, pen marks (green, blue or black), red ink, folds, air bubbles and over/under-exposed fields. Ground
// truth: tumour polygons (ASAP group "_0", QuPath class "Tumor") and optional exclusion polygons (ASAP "_2") in
// level-0 pixels, and one mask per artefact class QC detects (preprocessing/qc.h) at 1/16 scale.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "io/annotations.h"
#include "io/tiff_writer.h"
#include "preprocessing/qc.h"
#include "preprocessing/stain.h"

namespace tessera::synth {

// The largest SynthSlideOptions::hue_variation accepted (radians); `tessera synth`'s slides.hue_variation has the same
// bound.
inline constexpr double kMaxHueVariation = 0.3;

struct SynthSlideOptions {
  std::int64_t width = 16384;
  std::int64_t height = 16384;
  std::uint64_t seed = 1;
  bool tumour = true;             // false: a normal slide, no tumour at all
  int max_tumour_regions = 6;     // tumour slides get 1..max regions of widely varied size
  bool exclusion_regions = true;  // ASAP "_2" regions inside some tumours (non-tumour holes), CAMELYON16 style
  bool blur_patches = true;
  bool pen_marks = false;
  bool folds = false;
  bool red_ink = false;   // a red marker stroke (its own, beside the pen marks)
  bool bubbles = false;   // air bubbles under the coverslip: a dark grey rim, the tissue inside paler
  bool exposure = false;  // one over-exposed and one under-exposed camera field
  double mpp = 0.25;
  // Haematoxylin's hue between slides (radians, 0 to 0.3): each slide's H vector is tilted along (1, 0, −1) by an
  // angle drawn uniformly in ±hue_variation from its own stream. 0 (the default) draws and tilts nothing, so the
  // slides are those of earlier versions; off by default because QC's colour rules are fixed (see synth.cpp).
  double hue_variation = 0.0;
  io::TiffWriterOptions tiff;  // flavour, compression, quality (mpp is taken from above)
};

struct SynthGroundTruth {
  std::vector<io::Annotation> tumour;     // group "_0", class "Tumor"
  std::vector<io::Annotation> exclusion;  // group "_2"
  double tissue_area_mm2 = 0.0;
  double tumour_area_mm2 = 0.0;
  // Where each artefact class QC detects was drawn (prep::all_artefacts() order): 255 = artefact, at
  // artefact_downsample level-0 pixels per mask pixel; an empty mask when the class was not drawn. Blur, folds and
  // over-exposure are marked on tissue only (they are artefacts of the tissue); ink, bubbles and under-exposure
  // wherever drawn.
  std::array<cv::Mat1b, prep::kArtefactCount> artefacts;
  double artefact_downsample = 16.0;
};

// Renders one slide to `path` (a pyramidal TIFF) and returns its ground truth. Does not write annotation files.
SynthGroundTruth write_synthetic_slide(const std::string& path, const SynthSlideOptions& options);

// The renderer behind write_synthetic_slide, for tests and tools that want the pixels without a TIFF: calls
// `sink(y0, strip)` for every level-0 strip from top to bottom (RGB CV_8UC3, full width, options.tiff.tile_size
// rows, the last one shorter when the height is not a multiple) and returns the ground truth. The strips are
// exactly what write_synthetic_slide hands to the TIFF writer. Bad options throw a ConfigError naming the option.
// The ground truth of the slide `options` describe, without rendering any pixel: only the 1/16-scale plan is
// made, so this is fast whatever the slide size. Identical to what the renderers return.
SynthGroundTruth synthetic_ground_truth(const SynthSlideOptions& options);

// The stain vectors (and their per-slide perturbation) the slide `options` describe is drawn with: perturb_stain of
// Ruifrok's H&E by the slide's seed, haematoxylin then tilted by up to ±options.hue_variation. Cheap (no plan).
prep::SlideStain synthetic_stain(const SynthSlideOptions& options);

using SynthStripSink = std::function<void(std::int64_t y0, const cv::Mat& strip)>;
SynthGroundTruth render_synthetic_slide(const SynthSlideOptions& options, const SynthStripSink& sink);

// The seed of slide `index` (0-based) of a `tessera synth` set with seed `set_seed`: the (index + 1)-th output of a
// splitmix64 generator seeded with `set_seed`, independent of the rank count and of the standard library.
std::uint64_t slide_seed(std::uint64_t set_seed, std::uint64_t index);

}  // namespace tessera::synth
