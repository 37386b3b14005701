#include "synth/synth.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "core/random.h"
#include "io/provenance.h"
#include "preprocessing/stain.h"

namespace tessera::synth {

namespace {

// =============================================================================================================
// Deterministic randomness: integer hashing only (splitmix64's mix and generator, core/random.h), never std::
// distributions, whose output is allowed to differ between standard libraries.

using core::golden_gamma;
using core::splitmix64_mix;

// What a hash is for; each purpose gets an independent stream for the same slide seed.
enum Salt : std::uint64_t {
  kSaltSections = 1,
  kSaltTissueCoarse,
  kSaltTissueFine,
  kSaltHoles,
  kSaltArchitecture,
  kSaltOrientation,
  kSaltUnevenness,
  kSaltTumours,
  kSaltLymphoid,
  kSaltStroma,
  kSaltTumourNuclei,
  kSaltTextures,
  kSaltBlur,
  kSaltPen,
  kSaltFold,
  kSaltStain,
  kSaltGrain,
  kSaltLook,
  kSaltRedInk,
  kSaltBubble,
  kSaltExposure,
  kSaltBluing,
};

std::uint64_t salted(std::uint64_t seed, Salt salt) {
  return splitmix64_mix(splitmix64_mix(seed + golden_gamma) ^ (salt * golden_gamma));
}

inline std::uint64_t hash3(std::uint64_t key, std::int64_t a, std::int64_t b) {
  std::uint64_t h = splitmix64_mix(key ^ (static_cast<std::uint64_t>(a) * 0xD6E8FEB86659FD93ull));
  return splitmix64_mix(h ^ (static_cast<std::uint64_t>(b) * 0x9FB21C651E98DF25ull + golden_gamma));
}

inline double unit53(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }
inline float unit24(std::uint64_t h) { return static_cast<float>(h >> 40) * 0x1.0p-24f; }

// A short sequence of draws from one key (splitmix64 as a generator).
class Draws {
 public:
  explicit Draws(std::uint64_t key) : generator_(key) {}
  std::uint64_t next() { return generator_.next(); }
  double uniform() { return unit53(next()); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  float uniformf() { return unit24(next()); }
  int below(int n) { return std::min(n - 1, static_cast<int>(uniform() * n)); }
  double log_uniform(double lo, double hi) { return std::exp(uniform(std::log(lo), std::log(hi))); }

 private:
  core::SplitMix64 generator_;
};

// Per-pixel grain: a cheap 32-bit integer hash of (x, y).
inline std::uint32_t pixel_hash(std::uint32_t x, std::uint32_t y, std::uint32_t key) {
  std::uint32_t h = x * 0x9E3779B1u + (y ^ key) * 0x85EBCA77u + key;
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  h ^= h >> 16;
  return h;
}

inline float smoothstep(float e0, float e1, float x) {
  const float t = std::clamp((x - e0) / (e1 - e0), 0.0f, 1.0f);
  return t * t * (3.0f - 2.0f * t);
}

inline float lerp(float a, float b, float t) { return a + t * (b - a); }

// =============================================================================================================
// Low-resolution fields (1/16 scale): value noise and fractal sums of it.

constexpr int kLowResFactor = 16;

inline float fade(float t) { return t * t * t * (t * (t * 6.0f - 15.0f) + 10.0f); }

// Value noise with lattice spacing `period` (in low-res cells) over a rows×cols grid, values in [0, 1].
cv::Mat1f value_noise(int rows, int cols, double period, std::uint64_t key) {
  const int lattice_cols = static_cast<int>(cols / period) + 3;
  const int lattice_rows = static_cast<int>(rows / period) + 3;
  cv::Mat1f lattice(lattice_rows, lattice_cols);
  for (int j = 0; j < lattice_rows; ++j) {
    for (int i = 0; i < lattice_cols; ++i) lattice(j, i) = unit24(hash3(key, i, j));
  }
  std::vector<int> ix(static_cast<std::size_t>(cols));
  std::vector<float> tx(static_cast<std::size_t>(cols));
  for (int c = 0; c < cols; ++c) {
    const double f = (c + 0.5) / period;
    ix[static_cast<std::size_t>(c)] = static_cast<int>(f);
    tx[static_cast<std::size_t>(c)] = fade(static_cast<float>(f - std::floor(f)));
  }
  cv::Mat1f out(rows, cols);
  for (int r = 0; r < rows; ++r) {
    const double f = (r + 0.5) / period;
    const int iy = static_cast<int>(f);
    const float ty = fade(static_cast<float>(f - std::floor(f)));
    const float* l0 = lattice.ptr<float>(iy);
    const float* l1 = lattice.ptr<float>(iy + 1);
    float* o = out.ptr<float>(r);
    for (int c = 0; c < cols; ++c) {
      const int i = ix[static_cast<std::size_t>(c)];
      const float t = tx[static_cast<std::size_t>(c)];
      const float a = lerp(l0[i], l0[i + 1], t);
      const float b = lerp(l1[i], l1[i + 1], t);
      o[c] = lerp(a, b, ty);
    }
  }
  return out;
}

void standardize(cv::Mat1f& field) {
  cv::Scalar mean, stddev;
  cv::meanStdDev(field, mean, stddev);
  field = (field - mean[0]) / std::max(stddev[0], 1e-6);
}

// Fractal sum of value noise (octaves halve the period and the amplitude), standardized to mean 0, std 1.
cv::Mat1f fractal_noise(int rows, int cols, double period, int octaves, std::uint64_t key) {
  cv::Mat1f sum = cv::Mat1f::zeros(rows, cols);
  double amplitude = 1.0;
  for (int o = 0; o < octaves; ++o) {
    const double p = period / std::ldexp(1.0, o);
    if (p < 1.0) break;
    sum += amplitude * value_noise(rows, cols, p, splitmix64_mix(key + static_cast<std::uint64_t>(o) * golden_gamma));
    amplitude *= 0.5;
  }
  standardize(sum);
  return sum;
}

// Bilinear sample of a low-res field at a level-0 position; cell (i, j) is centred on level-0 (16j+8, 16i+8).
inline float sample(const cv::Mat1f& field, double x, double y) {
  const double fx = std::clamp(x / kLowResFactor - 0.5, 0.0, static_cast<double>(field.cols - 1));
  const double fy = std::clamp(y / kLowResFactor - 0.5, 0.0, static_cast<double>(field.rows - 1));
  const int j = std::min(static_cast<int>(fx), field.cols - 1);
  const int i = std::min(static_cast<int>(fy), field.rows - 1);
  const int j1 = std::min(j + 1, field.cols - 1);
  const int i1 = std::min(i + 1, field.rows - 1);
  const float wx = static_cast<float>(fx - j), wy = static_cast<float>(fy - i);
  const float a = lerp(field(i, j), field(i, j1), wx);
  const float b = lerp(field(i1, j), field(i1, j1), wx);
  return lerp(a, b, wy);
}

// =============================================================================================================
// Tissue appearance. Concentrations are OD units along the (per-slide) stain vectors.
//
// Why these numbers: a tile's mean colour must not give the tumour away (tests/synth/test_synth.cpp
// measures it). Lymphoid-dense tissue is the darkest (many small nuclei on a purple background), stroma the
// lightest; the tumour's mean colour falls inside that range, within a slide as well as across slides (whose
// stains, section thickness and scanner balance vary). What does tell tumour apart is morphology: nuclei twice
// the lymphocytes' size, crowded, hyperchromatic, with pale cytoplasm between them.
// That morphology leaves one trace in the mean colour: a tile of dark nuclei beside pale cytoplasm averages to more
// light in red and green (which haematoxylin absorbs strongly) than a tile of even purple of the same stain, so
// within a slide tumour tiles' OD has a larger blue share than normal tiles' (per-slide AUC of B / (R + G + B)
// 0.6-0.96 on the report's seeds, 2026-11-28). Between slides, colour varied mostly in darkness (thickness, stain
// intensity), little along that blue-against-red axis, so a slide set whose tumour slides happened to sit bluer
// (seed 11) let a linear model find tumour by colour. Haematoxylin's hue varies between laboratories (how long and in
// what a section is blued); SynthSlideOptions::hue_variation tilts each slide's H vector along the direction chosen
// for it, (1, 0, −1) (from blue towards red), which makes the blue share more a property of the slide than of the
// tissue. It is off (0) by default: QC judges colour by fixed hue rules, and with it at 0.12 three QC tests fail
// (Qc.BubbleCrossedByInkIsFound, Qc.ExposureFieldsAreFound, Qc.BlackStrokeNarrowerOverTissueIsFoundAcrossIt); it
// would also change every synthetic slide. QC following each slide's stain comes first.

// Background (non-nuclear) stain of one tissue type, and how strongly eosin fibres modulate it.
struct TissueLook {
  float h;
  float e;
  float fibre;
};
constexpr TissueLook kStromaLook{0.07f, 0.52f, 1.0f};
constexpr TissueLook kLymphoidLook{0.60f, 0.40f, 0.12f};
constexpr TissueLook kTumourLook{0.12f, 0.32f, 0.15f};
constexpr float kFibreContrast = 0.85f;
constexpr float kNucleusEosin = 0.10f;       // eosin left inside a nucleus
constexpr float kTissueResidualOd = 0.025f;  // unstained section thickness, grey
constexpr float kFoldGain = 0.9f;            // a fold doubles the section: OD × (1 + gain)
constexpr float kGrainOd = 0.012f / 128.0f;  // per-pixel sensor noise, per hash unit
// Haematoxylin's hue between laboratories (SynthSlideOptions::hue_variation, ± radians). The two reference vectors
// most used for it, Ruifrok & Johnston's (0.65, 0.70, 0.29) and Macenko et al.'s (0.56, 0.72, 0.41), are about
// 0.147 rad apart, Macenko's on the purple side of Ruifrok's; the ±0.12 the cross-slide colour report used therefore
// has a reference on one side only (none beyond Ruifrok's on the other). perturb_stain's own random tilt of up to
// 0.10 rad comes on top. (0.08 lowered the report's colour measure less: 0.847 against 0.786 on seed 11.) The
// largest value accepted is kMaxHueVariation (synth.h).

// One family of nuclei on a jittered grid.
struct NucleusStyle {
  double cell_um;   // grid spacing
  double jitter;    // centre offset, fraction of a cell (±)
  double r_min_um;  // semi-major axis range
  double r_max_um;
  double aspect_min;  // semi-minor / semi-major
  double aspect_max;
  float h_min;  // haematoxylin concentration range (darkness)
  float h_max;
  float texture;   // chromatin texture contrast
  float rim;       // darker nuclear membrane
  double edge_um;  // soft edge width
  Salt salt;
};
constexpr NucleusStyle kLymphocyte{7.5, 0.26, 2.9, 3.5, 0.82, 1.0, 1.00f, 1.15f, 0.10, 0.10, 0.30, kSaltLymphoid};
constexpr NucleusStyle kSpindle{18.0, 0.40, 4.0, 7.0, 0.20, 0.38, 0.75f, 1.00f, 0.30, 0.05, 0.30, kSaltStroma};
constexpr NucleusStyle kTumourCell{14.0, 0.36, 5.0, 8.0, 0.55, 1.0, 1.30f, 1.70f, 0.45f, 0.30, 0.35, kSaltTumourNuclei};

// How likely a grid cell holds a nucleus, from the local architecture L (0 stroma-rich, 1 lymphoid-dense).
inline float lymphocyte_presence(float l) { return 0.12f + 0.83f * l; }
inline float spindle_presence(float l) { return 0.18f + 0.55f * (1.0f - l); }
constexpr float kTumourPresence = 0.93f;

// Ink of pen marks as OD (green, blue, black markers).
const std::array<cv::Vec3f, 3> kPenOd = {cv::Vec3f(1.7f, 0.45f, 1.2f), cv::Vec3f(1.9f, 1.25f, 0.35f),
                                         cv::Vec3f(2.0f, 2.0f, 1.85f)};

// Red marker ink as OD: it absorbs green and blue, far more saturated than eosin, and redder (hue near 0°, eosin's
// is near 320°).
const cv::Vec3f kRedInkOd(0.10f, 2.2f, 1.9f);
// The rim of an air bubble: a dark, neutral refraction line.
const cv::Vec3f kBubbleRimOd(1.5f, 1.5f, 1.45f);
constexpr float kBubblePaling = 0.3f;  // the tissue inside a bubble loses this share of its stain (seen hazy)
// A camera field exposed too long or too short: an OD offset on every channel (intensity × 1.6 and × 0.55).
constexpr float kOverexposureOd = -0.47f;
constexpr float kUnderexposureOd = 0.6f;
// Where truth masks say "ink": the ink's strongest channel has at least this OD.
constexpr float kInkTruthOd = 0.3f;

// =============================================================================================================
// The plan: everything decided before the first pixel, all at 1/16 scale.

struct Section {
  double cx, cy, a, b, angle;  // low-res cells
};

struct Plan {
  SynthSlideOptions options;
  std::uint64_t seed = 0;
  int lw = 0, lh = 0;
  double um_per_cell = 4.0;
  cv::Mat1b mask;             // tissue (255) / glass (0)
  cv::Mat1f tissue;           // soft mask, 0.5 at the edge
  cv::Mat1f lymphoid;         // architecture L in [0, 1]
  cv::Mat1f tumour;           // blurred tumour map in [0, 1]
  cv::Mat1f orientation;      // fibre orientation blend in [0, 1]
  cv::Mat1f uneven_h;         // haematoxylin intensity multiplier around 1 (uneven staining)
  cv::Mat1f uneven_e;         // eosin intensity multiplier around 1, independent of haematoxylin
  cv::Mat1f blur, fold, pen;  // empty when the slide has none
  cv::Vec3f pen_od;
  int pen_class = 0;                     // prep::Artefact index of the pen's colour
  cv::Mat1f red, bubble_rim, bubble_in;  // empty when the slide has none
  cv::Mat1f exposure;                    // OD offset per cell; empty when the slide has none
  std::array<double, 2> fibre_angle{};
  prep::SlideStain stain;
  cv::Vec3f glass_od;
  float thickness = 1.0f;  // section thickness relative to nominal: scales all tissue OD
  std::vector<Section> sections;
  SynthGroundTruth truth;

  double cells(double um) const { return um / um_per_cell; }
};

void make_tissue(Plan& plan) {
  const int lw = plan.lw, lh = plan.lh;
  Draws draws(salted(plan.seed, kSaltSections));
  const double u = draws.uniform();
  const int sections = u < 0.55 ? 1 : (u < 0.9 ? 2 : 3);
  const bool horizontal = lw >= lh;
  const double major = horizontal ? lw : lh;
  const double minor = horizontal ? lh : lw;
  for (int k = 0; k < sections; ++k) {
    const double along = (k + 0.5) / sections * major + draws.uniform(-0.03, 0.03) * major;
    const double across = minor * (0.5 + draws.uniform(-0.04, 0.04));
    Section s;
    s.a = 0.5 * major / sections * draws.uniform(0.8, 0.95);
    s.b = 0.5 * minor * draws.uniform(0.68, 0.88);
    s.angle = draws.uniform(-0.45, 0.45) + (horizontal ? 0.0 : M_PI / 2);
    s.cx = horizontal ? along : across;
    s.cy = horizontal ? across : along;
    plan.sections.push_back(s);
  }

  // Envelope: 1 at a section's centre, 0 on its ellipse, negative outside; the max over sections.
  cv::Mat1f envelope(lh, lw);
  for (int r = 0; r < lh; ++r) {
    for (int c = 0; c < lw; ++c) {
      float best = -10.0f;
      for (const auto& s : plan.sections) {
        const double dx = c + 0.5 - s.cx, dy = r + 0.5 - s.cy;
        const double ua = (dx * std::cos(s.angle) + dy * std::sin(s.angle)) / s.a;
        const double vb = (-dx * std::sin(s.angle) + dy * std::cos(s.angle)) / s.b;
        best = std::max(best, static_cast<float>(1.0 - std::sqrt(ua * ua + vb * vb)));
      }
      envelope(r, c) = best;
    }
  }
  double smallest_axis = 1e30;
  for (const auto& s : plan.sections) smallest_axis = std::min({smallest_axis, s.a, s.b});
  const cv::Mat1f coarse =
      fractal_noise(lh, lw, std::max(4.0, 0.6 * smallest_axis), 3, salted(plan.seed, kSaltTissueCoarse));
  const cv::Mat1f fine = fractal_noise(lh, lw, std::max(2.0, plan.cells(45.0)), 2, salted(plan.seed, kSaltTissueFine));
  const cv::Mat1f holes = fractal_noise(lh, lw, std::max(3.0, plan.cells(160.0)), 3, salted(plan.seed, kSaltHoles));
  // Glass margin at the slide border; the field is pulled down over a band inside it, so that sections end in
  // their own ragged outline rather than in a straight cut along the margin.
  const int margin = std::max(4, static_cast<int>(std::lround(0.025 * std::min(lw, lh))));
  const float taper = static_cast<float>(margin + 0.08 * std::min(lw, lh));
  cv::Mat1b mask(lh, lw);
  for (int r = 0; r < lh; ++r) {
    for (int c = 0; c < lw; ++c) {
      const float e = envelope(r, c);
      const float border = static_cast<float>(std::min({r, c, lh - 1 - r, lw - 1 - c}));
      const float f = e + 0.16f * coarse(r, c) + 0.05f * fine(r, c) -
                      0.5f * (1.0f - smoothstep(static_cast<float>(margin), taper, border));
      const bool hole = holes(r, c) > 2.0f && e > 0.15f;
      mask(r, c) = f > 0.1f && !hole ? 255 : 0;
    }
  }

  // Morphological cleaning: no specks, no pinholes, no tissue within the glass margin at the slide border.
  cv::morphologyEx(mask, mask, cv::MORPH_OPEN, cv::getStructuringElement(cv::MORPH_ELLIPSE, {3, 3}));
  cv::morphologyEx(mask, mask, cv::MORPH_CLOSE, cv::getStructuringElement(cv::MORPH_ELLIPSE, {5, 5}));
  mask.rowRange(0, std::min(margin, lh)).setTo(0);
  mask.rowRange(std::max(0, lh - margin), lh).setTo(0);
  mask.colRange(0, std::min(margin, lw)).setTo(0);
  mask.colRange(std::max(0, lw - margin), lw).setTo(0);
  {
    cv::Mat labels, stats, centroids;
    cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);
    const double min_area = std::max(16.0, std::pow(plan.cells(120.0), 2));
    for (int r = 0; r < lh; ++r) {
      for (int c = 0; c < lw; ++c) {
        const int label = labels.at<int>(r, c);
        if (label > 0 && stats.at<int>(label, cv::CC_STAT_AREA) < min_area) mask(r, c) = 0;
      }
    }
    cv::Mat1b glass = 255 - mask;
    const int m = cv::connectedComponentsWithStats(glass, labels, stats, centroids, 4, CV_32S);
    const double max_pinhole = std::max(4.0, std::pow(plan.cells(30.0), 2));
    std::vector<bool> fill(static_cast<std::size_t>(m), false);
    for (int label = 1; label < m; ++label) {
      const int x = stats.at<int>(label, cv::CC_STAT_LEFT), y = stats.at<int>(label, cv::CC_STAT_TOP);
      const int w = stats.at<int>(label, cv::CC_STAT_WIDTH), h = stats.at<int>(label, cv::CC_STAT_HEIGHT);
      const bool touches_border = x == 0 || y == 0 || x + w == lw || y + h == lh;
      fill[static_cast<std::size_t>(label)] = !touches_border && stats.at<int>(label, cv::CC_STAT_AREA) < max_pinhole;
    }
    for (int r = 0; r < lh; ++r) {
      for (int c = 0; c < lw; ++c) {
        if (fill[static_cast<std::size_t>(labels.at<int>(r, c))]) mask(r, c) = 255;
      }
    }
  }
  if (cv::countNonZero(mask) < 0.02 * lw * lh) {
    // Pathological noise draw: fall back to the plain envelopes so that every slide has tissue.
    mask = envelope > 0.2f;
    mask.rowRange(0, std::min(margin, lh)).setTo(0);
    mask.rowRange(std::max(0, lh - margin), lh).setTo(0);
    mask.colRange(0, std::min(margin, lw)).setTo(0);
    mask.colRange(std::max(0, lw - margin), lw).setTo(0);
  }
  plan.mask = mask;
  mask.convertTo(plan.tissue, CV_32F, 1.0 / 255.0);
  cv::GaussianBlur(plan.tissue, plan.tissue, cv::Size(0, 0), 1.2, 1.2, cv::BORDER_REPLICATE);
  plan.truth.tissue_area_mm2 = cv::countNonZero(mask) * plan.um_per_cell * plan.um_per_cell * 1e-6;
}

}  // namespace

prep::SlideStain synthetic_stain(const SynthSlideOptions& options) {
  prep::SlideStain stain = prep::perturb_stain(prep::ruifrok_he(), salted(options.seed, kSaltStain));
  if (options.hue_variation > 0.0) {
    // Haematoxylin's hue (hue_variation): a bluer haematoxylin absorbs more red and less blue light, so its OD
    // vector tilts from blue towards red; the tilt is drawn uniformly up to hue_variation either way, on top of
    // perturb_stain's random tilt, from its own stream (every other draw of the slide is as it was). At 0 nothing
    // is drawn or tilted: the slide is the same as without the option.
    const double limit = options.hue_variation;
    Draws hue(salted(options.seed, kSaltBluing));
    cv::Vec3d h = prep::tilt(stain.vectors.h, cv::Vec3d(1.0, 0.0, -1.0), hue.uniform(-limit, limit));
    for (int c = 0; c < 3; ++c) h[c] = std::max(h[c], 0.0);
    stain.vectors.h = prep::normalized(h);
  }
  return stain;
}

namespace {

void make_architecture(Plan& plan, const cv::Mat1f& distance) {
  const int lw = plan.lw, lh = plan.lh;
  Draws draws(salted(plan.seed, kSaltLook));
  // Per-slide balance of the architecture: mostly lymphoid (as lymph nodes are), some slides stroma-richer.
  const float bias = static_cast<float>(draws.uniform(0.9, 2.1));
  const cv::Mat1f architecture =
      fractal_noise(lh, lw, std::max(4.0, plan.cells(350.0)), 3, salted(plan.seed, kSaltArchitecture));
  const cv::Mat1f orientation =
      fractal_noise(lh, lw, std::max(4.0, plan.cells(150.0)), 2, salted(plan.seed, kSaltOrientation));
  const cv::Mat1f uneven_h =
      fractal_noise(lh, lw, std::max(4.0, plan.cells(500.0)), 2, salted(plan.seed, kSaltUnevenness));
  const cv::Mat1f uneven_e =
      fractal_noise(lh, lw, std::max(4.0, plan.cells(500.0)), 2, splitmix64_mix(salted(plan.seed, kSaltUnevenness)));
  plan.lymphoid.create(lh, lw);
  plan.orientation.create(lh, lw);
  plan.uneven_h.create(lh, lw);
  plan.uneven_e.create(lh, lw);
  const float capsule = static_cast<float>(plan.cells(120.0));
  for (int r = 0; r < lh; ++r) {
    for (int c = 0; c < lw; ++c) {
      // A fibrous capsule along the tissue edge, lymphoid-dense and stroma-rich areas inside.
      const float edge = smoothstep(0.0f, capsule, distance(r, c));
      plan.lymphoid(r, c) = smoothstep(-1.2f, 1.2f, architecture(r, c) + bias) * (0.7f + 0.3f * edge);
      plan.orientation(r, c) = smoothstep(-0.35f, 0.35f, orientation(r, c));
      // Eosin varies across a section more than haematoxylin does (it is the more variable, more washable stain).
      plan.uneven_h(r, c) = 1.0f + 0.05f * std::clamp(uneven_h(r, c), -2.5f, 2.5f);
      plan.uneven_e(r, c) = 1.0f + 0.15f * std::clamp(uneven_e(r, c), -2.5f, 2.5f);
    }
  }
  plan.fibre_angle[0] = draws.uniform(0.0, M_PI);
  plan.fibre_angle[1] = plan.fibre_angle[0] + draws.uniform(0.9, 1.6);
  plan.stain = synthetic_stain(plan.options);
  plan.thickness = static_cast<float>(draws.uniform(0.9, 1.1));
  // Glass, and the scanner's white balance, which shifts every pixel of the slide (glass included) per channel.
  const double glass = draws.uniform(0.025, 0.05);
  for (int c = 0; c < 3; ++c) {
    plan.glass_od[c] = static_cast<float>(glass + draws.uniform(-0.045, 0.045));
  }
}

// An irregular star-shaped ring around (cx, cy) (level-0 px): radius `radius` modulated by smooth angular
// noise; each ray stops where `allowed` (low-res) ends, so the ring stays inside it.
io::Ring irregular_ring(Draws& draws, double cx, double cy, double radius, int vertices, double roughness,
                        const cv::Mat1b* allowed) {
  constexpr int kHarmonics = 9;
  std::array<double, kHarmonics> amplitude{}, phase{};
  for (int m = 2; m < kHarmonics; ++m) {
    amplitude[static_cast<std::size_t>(m)] = roughness * draws.uniform() / std::pow(m, 0.9);
    phase[static_cast<std::size_t>(m)] = draws.uniform(0.0, 2.0 * M_PI);
  }
  const double rotation = draws.uniform(0.0, 2.0 * M_PI);
  io::Ring ring;
  ring.reserve(static_cast<std::size_t>(vertices));
  for (int v = 0; v < vertices; ++v) {
    const double theta = rotation + 2.0 * M_PI * v / vertices;
    double rho = 1.0;
    for (int m = 2; m < kHarmonics; ++m) {
      rho += amplitude[static_cast<std::size_t>(m)] * std::cos(m * theta + phase[static_cast<std::size_t>(m)]);
    }
    double r = radius * std::clamp(rho, 0.5, 1.5);
    if (allowed != nullptr) {
      // March out along the ray in half-cell steps; stop before the first cell outside.
      const double step = 0.5 * kLowResFactor;
      double reach = 0.0;
      while (reach + step <= r) {
        const double x = cx + (reach + step) * std::cos(theta), y = cy + (reach + step) * std::sin(theta);
        const int j = static_cast<int>(std::floor(x / kLowResFactor));
        const int i = static_cast<int>(std::floor(y / kLowResFactor));
        if (i < 0 || j < 0 || i >= allowed->rows || j >= allowed->cols || (*allowed)(i, j) == 0) break;
        reach += step;
      }
      r = std::max(std::min(r, reach), 0.5 * kLowResFactor);
    }
    ring.emplace_back(cx + r * std::cos(theta), cy + r * std::sin(theta));
  }
  return ring;
}

std::vector<cv::Point> fixed_point_polygon(const io::Ring& ring) {
  // cv::fillPoly with 4 fractional bits: low-res coordinate x/16 − 0.5 is (x − 8) in sixteenths.
  std::vector<cv::Point> points;
  points.reserve(ring.size());
  for (const auto& p : ring) {
    points.emplace_back(static_cast<int>(std::lround(p.x - 8.0)), static_cast<int>(std::lround(p.y - 8.0)));
  }
  return points;
}

void make_tumours(Plan& plan, const cv::Mat1f& distance) {
  const int lw = plan.lw, lh = plan.lh;
  plan.tumour = cv::Mat1f::zeros(lh, lw);
  if (!plan.options.tumour) return;
  Draws draws(salted(plan.seed, kSaltTumours));
  const int regions = 1 + draws.below(std::max(1, plan.options.max_tumour_regions));
  const double mpp = plan.options.mpp;
  const double r_lo_um = 40.0;  // isolated tumour cell clusters
  const double r_hi_um =
      std::max(1.5 * r_lo_um,
               std::min(2500.0, 0.2 * static_cast<double>(std::min(plan.options.width, plan.options.height)) * mpp));
  double max_distance = 0.0;
  cv::minMaxLoc(distance, nullptr, &max_distance);
  cv::Mat1b allowed;
  cv::erode(plan.mask, allowed, cv::getStructuringElement(cv::MORPH_ELLIPSE, {5, 5}));

  struct Placed {
    double x, y, r;
  };
  std::vector<Placed> placed;
  cv::Mat1b filled = cv::Mat1b::zeros(lh, lw);
  for (int k = 0; k < regions; ++k) {
    Draws region(draws.next());
    double radius_px = region.log_uniform(r_lo_um, r_hi_um) / mpp;
    bool found = false;
    double cx = 0.0, cy = 0.0;
    for (int round = 0; round < 6 && !found; ++round, radius_px *= 0.75) {
      const double radius_cells = radius_px / kLowResFactor;
      // Away from the tissue edge: the centre needs clearance of about half the radius (the outline is clipped
      // to the tissue anyway), but never more than most of the deepest point of the tissue.
      const double need = std::min(0.5 * radius_cells, 0.8 * max_distance) + 2.0;
      for (int attempt = 0; attempt < 300 && !found; ++attempt) {
        const int j = region.below(lw), i = region.below(lh);
        if (distance(i, j) < need) continue;
        const double x = (j + 0.5) * kLowResFactor, y = (i + 0.5) * kLowResFactor;
        bool clear = true;
        for (const auto& p : placed) {
          clear = clear && std::hypot(x - p.x, y - p.y) > 1.05 * (p.r + radius_px) + 20.0 / mpp;
        }
        if (!clear) continue;
        cx = x;
        cy = y;
        found = true;
      }
      if (found) break;
    }
    if (!found) continue;
    placed.push_back({cx, cy, radius_px});
    const int vertices = 48 + region.below(81);
    io::Annotation tumour;
    tumour.name = "Tumor " + std::to_string(plan.truth.tumour.size() + 1);
    tumour.group = "_0";
    tumour.type = "Polygon";
    tumour.outer = irregular_ring(region, cx, cy, radius_px, vertices, 0.45, &allowed);
    const std::vector<std::vector<cv::Point>> polygon = {fixed_point_polygon(tumour.outer)};
    cv::fillPoly(filled, polygon, cv::Scalar(255), cv::LINE_8, 4);
    plan.truth.tumour_area_mm2 += io::ring_area(tumour.outer) * mpp * mpp * 1e-6;

    // CAMELYON16-style "_2" exclusion: a small non-tumour island inside a large tumour.
    const bool exclude = region.uniform() < 0.5;
    if (plan.options.exclusion_regions && exclude && radius_px * mpp >= 250.0) {
      const double hole_radius = radius_px * region.uniform(0.12, 0.22);
      const double offset = radius_px * region.uniform(0.0, 0.3), angle = region.uniform(0.0, 2.0 * M_PI);
      io::Annotation hole;
      hole.name = "Exclusion " + std::to_string(plan.truth.exclusion.size() + 1);
      hole.group = "_2";
      hole.type = "Polygon";
      hole.outer = irregular_ring(region, cx + offset * std::cos(angle), cy + offset * std::sin(angle), hole_radius, 48,
                                  0.3, nullptr);
      std::vector<cv::Point2f> contour;
      for (const auto& p : tumour.outer) contour.emplace_back(static_cast<float>(p.x), static_cast<float>(p.y));
      bool inside = true;
      for (const auto& p : hole.outer) {
        inside = inside && cv::pointPolygonTest(contour, cv::Point2f(static_cast<float>(p.x), static_cast<float>(p.y)),
                                                true) > 30.0 / mpp;
      }
      if (inside) {
        plan.truth.tumour_area_mm2 -= io::ring_area(hole.outer) * mpp * mpp * 1e-6;
        plan.truth.exclusion.push_back(std::move(hole));
      }
    }
    plan.truth.tumour.push_back(std::move(tumour));
  }
  for (const auto& hole : plan.truth.exclusion) {
    const std::vector<std::vector<cv::Point>> polygon = {fixed_point_polygon(hole.outer)};
    cv::fillPoly(filled, polygon, cv::Scalar(0), cv::LINE_8, 4);
  }
  // Borders blend over a few cells: each nucleus samples this map at its centre to pick its type.
  filled.convertTo(plan.tumour, CV_32F, 1.0 / 255.0);
  const double sigma = std::max(0.8, plan.cells(9.0));
  cv::GaussianBlur(plan.tumour, plan.tumour, cv::Size(0, 0), sigma, sigma, cv::BORDER_REPLICATE);
}

// A random tissue cell (low-res), or the first section centre when the draw keeps missing.
cv::Point2d random_tissue_cell(const Plan& plan, Draws& draws) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int j = draws.below(plan.lw), i = draws.below(plan.lh);
    if (plan.mask(i, j)) return {j + 0.5, i + 0.5};
  }
  return {plan.sections.front().cx, plan.sections.front().cy};
}

void make_artefacts(Plan& plan) {
  const int lw = plan.lw, lh = plan.lh;
  const double size = std::min(lw, lh);
  if (plan.options.blur_patches) {
    Draws draws(salted(plan.seed, kSaltBlur));
    const int patches = 1 + draws.below(3);
    plan.blur = cv::Mat1f::zeros(lh, lw);
    const cv::Mat1f outline = fractal_noise(lh, lw, std::max(3.0, 0.08 * size), 2, draws.next());
    for (int k = 0; k < patches; ++k) {
      const cv::Point2d centre = random_tissue_cell(plan, draws);
      const double radius = draws.uniform(0.05, 0.14) * size;
      const float strength = static_cast<float>(draws.uniform(0.6, 1.0));
      const int r0 = std::max(0, static_cast<int>(centre.y - 1.6 * radius));
      const int r1 = std::min(lh, static_cast<int>(centre.y + 1.6 * radius) + 1);
      const int c0 = std::max(0, static_cast<int>(centre.x - 1.6 * radius));
      const int c1 = std::min(lw, static_cast<int>(centre.x + 1.6 * radius) + 1);
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) {
          const double d = std::hypot(c + 0.5 - centre.x, r + 0.5 - centre.y) / radius;
          const float w = strength * smoothstep(1.25f, 0.6f, static_cast<float>(d) * (1.0f + 0.15f * outline(r, c)));
          plan.blur(r, c) = std::max(plan.blur(r, c), w);
        }
      }
    }
  }
  if (plan.options.folds) {
    Draws draws(salted(plan.seed, kSaltFold));
    const Section& s = plan.sections[static_cast<std::size_t>(draws.below(static_cast<int>(plan.sections.size())))];
    const double angle = draws.uniform(0.0, M_PI);
    const double half = 1.1 * std::max(s.a, s.b);
    const double ox = s.cx + draws.uniform(-0.3, 0.3) * s.a, oy = s.cy + draws.uniform(-0.3, 0.3) * s.b;
    const double wobble = draws.uniform(0.02, 0.06) * half, phase = draws.uniform(0.0, 2.0 * M_PI);
    const double width = std::max(1.5, std::min(plan.cells(draws.uniform(40.0, 140.0)), 0.05 * size));
    std::vector<cv::Point> line;
    for (int i = 0; i <= 64; ++i) {
      const double t = -half + 2.0 * half * i / 64.0;
      const double n = wobble * std::sin(3.0 * t / half + phase);
      line.emplace_back(static_cast<int>(std::lround((ox + t * std::cos(angle) - n * std::sin(angle)) * 16.0)),
                        static_cast<int>(std::lround((oy + t * std::sin(angle) + n * std::cos(angle)) * 16.0)));
    }
    plan.fold = cv::Mat1f::zeros(lh, lw);
    cv::polylines(plan.fold, std::vector<std::vector<cv::Point>>{line}, false, cv::Scalar(1.0),
                  static_cast<int>(std::lround(width)), cv::LINE_AA, 4);
    cv::GaussianBlur(plan.fold, plan.fold, cv::Size(0, 0), 1.0, 1.0, cv::BORDER_REPLICATE);
  }
  if (plan.options.pen_marks) {
    Draws draws(salted(plan.seed, kSaltPen));
    const int colour = draws.below(3);
    plan.pen_od = kPenOd[static_cast<std::size_t>(colour)];
    plan.pen_class = prep::index(colour == 0   ? prep::Artefact::pen_green
                                 : colour == 1 ? prep::Artefact::pen_blue
                                               : prep::Artefact::pen_black);
    plan.pen = cv::Mat1f::zeros(lh, lw);
    const int strokes = 1 + draws.below(2);
    const double width = std::max(2.0, std::min(plan.cells(draws.uniform(120.0, 300.0)), 0.035 * size));
    for (int k = 0; k < strokes; ++k) {
      std::vector<cv::Point> line;
      if (k == 0) {
        // A pathologist circling a section: an arc around it, a little wobbly.
        const Section& s = plan.sections[static_cast<std::size_t>(draws.below(static_cast<int>(plan.sections.size())))];
        const double scale = draws.uniform(1.08, 1.25), start = draws.uniform(0.0, 2.0 * M_PI);
        const double span = draws.uniform(1.2, 3.8), wobble = draws.uniform(0.01, 0.04);
        for (int i = 0; i <= 96; ++i) {
          const double t = start + span * i / 96.0;
          const double rr = scale * (1.0 + wobble * std::sin(5.0 * t));
          const double ex = rr * s.a * std::cos(t), ey = rr * s.b * std::sin(t);
          const double x = s.cx + ex * std::cos(s.angle) - ey * std::sin(s.angle);
          const double y = s.cy + ex * std::sin(s.angle) + ey * std::cos(s.angle);
          line.emplace_back(static_cast<int>(std::lround(x * 16.0)), static_cast<int>(std::lround(y * 16.0)));
        }
      } else {
        // A short tick mark near a corner.
        const double x = draws.uniform(0.05, 0.25) * lw, y = draws.uniform(0.05, 0.25) * lh;
        const double length = draws.uniform(0.08, 0.2) * size, angle = draws.uniform(0.0, M_PI);
        for (int i = 0; i <= 16; ++i) {
          const double t = length * i / 16.0;
          const double bend = 0.1 * length * std::sin(M_PI * i / 16.0);
          line.emplace_back(static_cast<int>(std::lround((x + t * std::cos(angle) - bend * std::sin(angle)) * 16.0)),
                            static_cast<int>(std::lround((y + t * std::sin(angle) + bend * std::cos(angle)) * 16.0)));
        }
      }
      cv::polylines(plan.pen, std::vector<std::vector<cv::Point>>{line}, false, cv::Scalar(1.0),
                    static_cast<int>(std::lround(width)), cv::LINE_AA, 4);
    }
    cv::GaussianBlur(plan.pen, plan.pen, cv::Size(0, 0), 0.8, 0.8, cv::BORDER_REPLICATE);
    plan.pen *= draws.uniform(0.65, 0.95);
  }
  if (plan.options.red_ink) {
    // A red stroke across part of a section, as a pathologist marks an area of interest.
    Draws draws(salted(plan.seed, kSaltRedInk));
    plan.red = cv::Mat1f::zeros(lh, lw);
    const cv::Point2d start = random_tissue_cell(plan, draws);
    const double length = draws.uniform(0.15, 0.3) * size, angle = draws.uniform(0.0, 2.0 * M_PI);
    const double width = std::max(2.0, std::min(plan.cells(draws.uniform(120.0, 250.0)), 0.035 * size));
    std::vector<cv::Point> line;
    for (int i = 0; i <= 24; ++i) {
      const double t = length * i / 24.0;
      const double bend = 0.12 * length * std::sin(M_PI * i / 24.0);
      line.emplace_back(static_cast<int>(std::lround((start.x + t * std::cos(angle) - bend * std::sin(angle)) * 16.0)),
                        static_cast<int>(std::lround((start.y + t * std::sin(angle) + bend * std::cos(angle)) * 16.0)));
    }
    cv::polylines(plan.red, std::vector<std::vector<cv::Point>>{line}, false, cv::Scalar(1.0),
                  static_cast<int>(std::lround(width)), cv::LINE_AA, 4);
    cv::GaussianBlur(plan.red, plan.red, cv::Size(0, 0), 0.8, 0.8, cv::BORDER_REPLICATE);
    plan.red *= draws.uniform(0.65, 0.95);
  }
  if (plan.options.bubbles) {
    // Air trapped under the coverslip: round, on the tissue, wholly inside the slide.
    Draws draws(salted(plan.seed, kSaltBubble));
    plan.bubble_rim = cv::Mat1f::zeros(lh, lw);
    plan.bubble_in = cv::Mat1f::zeros(lh, lw);
    const int bubbles = 1 + draws.below(2);
    const double rim = std::max(2.0, plan.cells(16.0));  // at least two cells: a rim the QC level can see
    for (int k = 0; k < bubbles; ++k) {
      const cv::Point2d centre = random_tissue_cell(plan, draws);
      const double limit = std::min({centre.x, centre.y, lw - centre.x, lh - centre.y}) - rim - 1.0;
      const double radius = std::min(draws.uniform(0.06, 0.12) * size, limit);
      if (radius < 3.0 * rim) continue;
      const cv::Point c(static_cast<int>(std::lround(centre.x * 16.0)), static_cast<int>(std::lround(centre.y * 16.0)));
      cv::circle(plan.bubble_in, c, static_cast<int>(std::lround(radius * 16.0)), cv::Scalar(1.0), cv::FILLED,
                 cv::LINE_AA, 4);
      cv::circle(plan.bubble_rim, c, static_cast<int>(std::lround(radius * 16.0)), cv::Scalar(1.0),
                 static_cast<int>(std::lround(rim)), cv::LINE_AA, 4);
    }
    cv::GaussianBlur(plan.bubble_rim, plan.bubble_rim, cv::Size(0, 0), 0.6, 0.6, cv::BORDER_REPLICATE);
  }
  if (plan.options.exposure) {
    // Two camera fields (squares) exposed wrongly: an over-exposed one on the tissue, an under-exposed one across
    // a section's edge.
    Draws draws(salted(plan.seed, kSaltExposure));
    plan.exposure = cv::Mat1f::zeros(lh, lw);
    for (int k = 0; k < 2; ++k) {
      cv::Point2d centre = random_tissue_cell(plan, draws);
      if (k == 1) {
        for (int attempt = 0; attempt < 400; ++attempt) {
          const int j = draws.below(lw), i = draws.below(lh);
          if (plan.tissue(i, j) > 0.3f && plan.tissue(i, j) < 0.7f) {
            centre = {j + 0.5, i + 0.5};
            break;
          }
        }
      }
      const double half = draws.uniform(0.06, 0.1) * size;
      const cv::Rect field(static_cast<int>(std::lround(centre.x - half)),
                           static_cast<int>(std::lround(centre.y - half)), static_cast<int>(std::lround(2.0 * half)),
                           static_cast<int>(std::lround(2.0 * half)));
      plan.exposure(field & cv::Rect(0, 0, lw, lh)) = k == 0 ? kOverexposureOd : kUnderexposureOd;
    }
  }
}

// The truth masks of the drawn artefacts at 1/16 scale (SynthGroundTruth::artefacts).
void make_artefact_truth(Plan& plan) {
  auto& masks = plan.truth.artefacts;
  plan.truth.artefact_downsample = kLowResFactor;
  const cv::Mat1b tissue = plan.tissue >= 0.5f;
  if (!plan.blur.empty()) masks[prep::index(prep::Artefact::blur)] = (plan.blur >= 0.5f) & tissue;
  if (!plan.fold.empty()) masks[prep::index(prep::Artefact::fold)] = (plan.fold >= 0.5f) & tissue;
  if (!plan.pen.empty()) {
    const float strongest = std::max({plan.pen_od[0], plan.pen_od[1], plan.pen_od[2]});
    masks[static_cast<std::size_t>(plan.pen_class)] = plan.pen * strongest >= kInkTruthOd;
  }
  if (!plan.red.empty()) {
    const float strongest = std::max({kRedInkOd[0], kRedInkOd[1], kRedInkOd[2]});
    cv::Mat1b red = plan.red * strongest >= kInkTruthOd;
    auto& m = masks[prep::index(prep::Artefact::pen_red)];
    m = m.empty() ? red : (m | red);
  }
  if (!plan.bubble_in.empty()) {
    masks[prep::index(prep::Artefact::bubble)] = (plan.bubble_in >= 0.5f) | (plan.bubble_rim >= 0.5f);
  }
  if (!plan.exposure.empty()) {
    // Bright glass is harmless: over-exposure is an artefact of the tissue it washes out.
    masks[prep::index(prep::Artefact::overexposed)] = (plan.exposure < 0.0f) & tissue;
    masks[prep::index(prep::Artefact::underexposed)] = plan.exposure > 0.0f;
  }
}

void validate(const SynthSlideOptions& o) {
  auto fail = [](const std::string& key, const std::string& message) { throw core::ConfigError(message, "", 0, key); };
  if (o.width < 256 || o.height < 256)
    fail(o.width < 256 ? "width" : "height", "synthetic slides need at least 256×256 pixels");
  if (o.width > (1 << 22) || o.height > (1 << 22))
    fail("width", "synthetic slides are limited to 4194304 pixels a side");
  if (!(o.mpp > 0.05 && o.mpp < 10.0)) fail("mpp", "mpp must be between 0.05 and 10 µm per pixel");
  if (o.tumour && o.max_tumour_regions < 1) fail("max_tumour_regions", "a tumour slide needs max_tumour_regions >= 1");
  if (!(o.hue_variation >= 0.0 && o.hue_variation <= kMaxHueVariation))
    fail("hue_variation", "hue_variation must be between 0 and 0.3 radians");
  if (o.tiff.tile_size < 16 || o.tiff.tile_size % 16 != 0)
    fail("tiff.tile_size", "tile_size must be a positive multiple of 16");
}

Plan make_plan(const SynthSlideOptions& options) {
  Plan plan;
  plan.options = options;
  plan.seed = options.seed;
  plan.lw = static_cast<int>((options.width + kLowResFactor - 1) / kLowResFactor);
  plan.lh = static_cast<int>((options.height + kLowResFactor - 1) / kLowResFactor);
  plan.um_per_cell = kLowResFactor * options.mpp;
  make_tissue(plan);
  cv::Mat1f distance;
  cv::distanceTransform(plan.mask, distance, cv::DIST_L2, cv::DIST_MASK_5, CV_32F);
  make_architecture(plan, distance);
  make_tumours(plan, distance);
  make_artefacts(plan);
  make_artefact_truth(plan);
  return plan;
}

// =============================================================================================================
// Pixel-scale textures: small tileable fields built once per slide from the seed, sampled with wrap-around.

constexpr int kTextureBits = 9;
constexpr int kTextureSize = 1 << kTextureBits;  // 512
constexpr int kTextureMask = kTextureSize - 1;

// Tileable noise: hashed white noise blurred by an (anisotropic) Gaussian with wrap-around, as z-scores mapped
// to [0, 1] by 0.5 + z·spread.
std::vector<float> tileable_texture(double sigma_along, double sigma_across, double angle, float spread,
                                    std::uint64_t key) {
  const int n = kTextureSize;
  cv::Mat1f white(n, n);
  for (int y = 0; y < n; ++y) {
    for (int x = 0; x < n; ++x) white(y, x) = unit24(hash3(key, x, y)) - 0.5f;
  }
  const int half = std::max(1, static_cast<int>(std::ceil(3.0 * std::max(sigma_along, sigma_across))));
  cv::Mat1f kernel(2 * half + 1, 2 * half + 1);
  const double c = std::cos(angle), s = std::sin(angle);
  for (int y = -half; y <= half; ++y) {
    for (int x = -half; x <= half; ++x) {
      const double u = x * c + y * s, v = -x * s + y * c;
      kernel(y + half, x + half) = static_cast<float>(
          std::exp(-0.5 * (u * u / (sigma_along * sigma_along) + v * v / (sigma_across * sigma_across))));
    }
  }
  kernel /= cv::sum(kernel)[0];
  cv::Mat1f padded, filtered;
  cv::copyMakeBorder(white, padded, half, half, half, half, cv::BORDER_WRAP);
  cv::filter2D(padded, filtered, CV_32F, kernel, cv::Point(-1, -1), 0.0, cv::BORDER_CONSTANT);
  cv::Mat1f texture = filtered(cv::Rect(half, half, n, n)).clone();
  standardize(texture);
  std::vector<float> out(static_cast<std::size_t>(n) * n);
  for (int y = 0; y < n; ++y) {
    for (int x = 0; x < n; ++x)
      out[static_cast<std::size_t>(y) * n + x] = std::clamp(0.5f + spread * texture(y, x), 0.0f, 1.0f);
  }
  return out;
}

inline std::size_t texel(std::int64_t x, std::int64_t y) {
  return (static_cast<std::size_t>(y & kTextureMask) << kTextureBits) | static_cast<std::size_t>(x & kTextureMask);
}

// =============================================================================================================
// The renderer: level-0 rows from the plan, in column blocks so that per-block buffers stay in cache.

struct Nucleus {
  float cx, cy;      // level-0 centre
  float qa, qb, qc;  // ellipse as a quadratic form: q = qa·dx² + qb·dx·dy + qc·dy² (1 on the outline)
  float edge;        // alpha = 0.5 + (1 − q)·edge
  float qmax;        // q beyond which alpha is 0
  float h;           // haematoxylin concentration
  float texture;     // chromatin contrast
  float rim;         // membrane darkening
  float ext_x, ext_y;
  std::int32_t tex_dx, tex_dy;
};

class Renderer {
 public:
  explicit Renderer(const Plan& plan);
  // Renders the strip of level-0 rows [y0, y0 + rows) into `out` (CV_8UC3, full width).
  void render_strip(std::int64_t y0, int rows, cv::Mat& out);

 private:
  static constexpr int kBlockWidth = 1024;

  void render_rows(std::int64_t y0, std::int64_t y1, cv::Mat& out);
  void render_block(std::int64_t y0, std::int64_t y1, std::int64_t x0, std::int64_t x1, cv::Mat& out);
  void gather_nuclei(const NucleusStyle& style, int kind, std::int64_t y0, std::int64_t y1, std::int64_t x0,
                     std::int64_t x1);
  void draw_nucleus(const Nucleus& n, std::int64_t y0, std::int64_t y1, std::int64_t x0, std::int64_t x1);
  // Low-res row at level-0 row y, interpolated in y, for columns [j0, j1] (plus one repeated at the end).
  void lowres_row(const cv::Mat1f& field, std::int64_t y, int j0, int j1, std::vector<float>& out) const;
  bool rows_touch(const cv::Mat1f& field, std::int64_t y0, std::int64_t y1) const;
  // Cells j0..j1+1 of the exposure field's row that holds level-0 row y (nearest, not interpolated).
  void exposure_row(std::int64_t y, int j0, int j1, std::vector<float>& out) const;

  const Plan& plan_;
  std::int64_t width_, height_;
  std::uint32_t grain_key_;
  std::vector<float> fibre_[2], mottle_, ragged_, chromatin_;
  std::vector<std::int32_t> col_j_;
  std::vector<float> col_w_;
  std::vector<float> vignette_x_;
  double field_px_;
  prep::OdToIntensityTable table_;
  float vh_[3], ve_[3];

  std::vector<float> nucleus_h_, nucleus_a_;  // per block: max over nuclei of alpha·h, and of alpha
  std::vector<Nucleus> nuclei_;
  std::vector<float> row_s_, row_l_, row_t_, row_o_, row_u_, row_v_, row_f_, row_p_, row_r_, row_br_, row_bi_, row_x_;
  cv::Mat rendered_, blurred_;
};

Renderer::Renderer(const Plan& plan) : plan_(plan), width_(plan.options.width), height_(plan.options.height) {
  const double px_per_um = 1.0 / plan.options.mpp;
  const std::uint64_t key = salted(plan.seed, kSaltTextures);
  grain_key_ = static_cast<std::uint32_t>(salted(plan.seed, kSaltGrain));
  // Collagen fibres: long thin streaks in two orientations, blended by the orientation field.
  for (int k = 0; k < 2; ++k) {
    fibre_[k] = tileable_texture(5.0 * px_per_um, 0.45 * px_per_um, plan.fibre_angle[static_cast<std::size_t>(k)],
                                 0.22f, splitmix64_mix(key + 1 + static_cast<std::uint64_t>(k)));
  }
  mottle_ = tileable_texture(1.2 * px_per_um, 1.2 * px_per_um, 0.0, 0.2f, splitmix64_mix(key + 3));
  ragged_ = tileable_texture(2.0 * px_per_um, 2.0 * px_per_um, 0.0, 0.25f, splitmix64_mix(key + 4));
  chromatin_ = tileable_texture(0.3 * px_per_um, 0.3 * px_per_um, 0.0, 0.25f, splitmix64_mix(key + 5));

  col_j_.resize(static_cast<std::size_t>(width_));
  col_w_.resize(static_cast<std::size_t>(width_));
  for (std::int64_t x = 0; x < width_; ++x) {
    const double fx = (static_cast<double>(x) + 0.5) / kLowResFactor - 0.5;
    int j = static_cast<int>(std::floor(fx));
    double w = fx - j;
    if (j < 0) {
      j = 0;
      w = 0.0;
    }
    if (j >= plan.lw - 1) {
      j = plan.lw - 1;
      w = 0.0;
    }
    col_j_[static_cast<std::size_t>(x)] = j;
    col_w_[static_cast<std::size_t>(x)] = static_cast<float>(w);
  }
  // Vignetting: each camera field (a scan stripe) is a little darker towards its sides, and the whole slide a
  // little towards its corners.
  field_px_ = 250.0 / plan.options.mpp;  // 250 µm stripes
  vignette_x_.resize(static_cast<std::size_t>(width_));
  for (std::int64_t x = 0; x < width_; ++x) {
    const double f = std::fmod(static_cast<double>(x), field_px_) / field_px_ - 0.5;
    const double g = static_cast<double>(x) / static_cast<double>(width_) - 0.5;
    vignette_x_[static_cast<std::size_t>(x)] = static_cast<float>(0.012 * 4.0 * f * f + 0.02 * 4.0 * g * g);
  }
  for (int c = 0; c < 3; ++c) {
    vh_[c] = static_cast<float>(plan.stain.vectors.h[c] * plan.stain.h_scale);
    ve_[c] = static_cast<float>(plan.stain.vectors.e[c] * plan.stain.e_scale);
  }
}

void Renderer::lowres_row(const cv::Mat1f& field, std::int64_t y, int j0, int j1, std::vector<float>& out) const {
  const double fy = (static_cast<double>(y) + 0.5) / kLowResFactor - 0.5;
  int i = static_cast<int>(std::floor(fy));
  float w = static_cast<float>(fy - i);
  if (i < 0) {
    i = 0;
    w = 0.0f;
  }
  if (i >= field.rows - 1) {
    i = field.rows - 1;
    w = 0.0f;
  }
  const float* r0 = field.ptr<float>(i);
  const float* r1 = field.ptr<float>(std::min(i + 1, field.rows - 1));
  out.resize(static_cast<std::size_t>(j1 - j0 + 2));
  for (int j = j0; j <= j1; ++j) out[static_cast<std::size_t>(j - j0)] = lerp(r0[j], r1[j], w);
  out[static_cast<std::size_t>(j1 - j0 + 1)] = out[static_cast<std::size_t>(j1 - j0)];
}

void Renderer::exposure_row(std::int64_t y, int j0, int j1, std::vector<float>& out) const {
  const int i = std::min(plan_.exposure.rows - 1, static_cast<int>(y / kLowResFactor));
  const float* row = plan_.exposure.ptr<float>(i);
  out.resize(static_cast<std::size_t>(j1 - j0 + 2));
  for (int j = j0; j <= j1 + 1; ++j) out[static_cast<std::size_t>(j - j0)] = row[std::min(j, plan_.exposure.cols - 1)];
}

bool Renderer::rows_touch(const cv::Mat1f& field, std::int64_t y0, std::int64_t y1) const {
  if (field.empty()) return false;
  const int i0 = std::max(0, static_cast<int>(y0 / kLowResFactor) - 1);
  const int i1 = std::min(field.rows - 1, static_cast<int>((y1 - 1) / kLowResFactor) + 1);
  double max_value = 0.0;
  cv::minMaxLoc(field.rowRange(i0, i1 + 1), nullptr, &max_value);
  return max_value > 1e-3;
}

void Renderer::render_strip(std::int64_t y0, int rows, cv::Mat& out) {
  const std::int64_t y1 = y0 + rows;
  out.create(rows, static_cast<int>(width_), CV_8UC3);
  if (!rows_touch(plan_.blur, y0, y1)) {
    render_rows(y0, y1, out);
    return;
  }
  // Focus blur: render a margin of rows above and below so that the blur only uses rows this strip renders
  // itself (strips stay independent), blur the columns the patch covers, blend by the patch weight.
  const double sigma = 1.5 / plan_.options.mpp;
  const int margin = static_cast<int>(std::ceil(3.0 * sigma)) + 1;
  const std::int64_t ry0 = std::max<std::int64_t>(0, y0 - margin);
  const std::int64_t ry1 = std::min<std::int64_t>(height_, y1 + margin);
  rendered_.create(static_cast<int>(ry1 - ry0), static_cast<int>(width_), CV_8UC3);
  render_rows(ry0, ry1, rendered_);

  const int i0 = std::max(0, static_cast<int>(y0 / kLowResFactor) - 1);
  const int i1 = std::min(plan_.lh - 1, static_cast<int>((y1 - 1) / kLowResFactor) + 1);
  int j_lo = plan_.lw, j_hi = -1;
  for (int i = i0; i <= i1; ++i) {
    for (int j = 0; j < plan_.lw; ++j) {
      if (plan_.blur(i, j) > 1e-3f) {
        j_lo = std::min(j_lo, j);
        j_hi = std::max(j_hi, j);
      }
    }
  }
  const std::int64_t bx0 = std::max<std::int64_t>(0, static_cast<std::int64_t>(j_lo - 1) * kLowResFactor);
  const std::int64_t bx1 = std::min<std::int64_t>(width_, static_cast<std::int64_t>(j_hi + 2) * kLowResFactor);
  const std::int64_t cx0 = std::max<std::int64_t>(0, bx0 - margin);
  const std::int64_t cx1 = std::min<std::int64_t>(width_, bx1 + margin);
  const cv::Mat source = rendered_.colRange(static_cast<int>(cx0), static_cast<int>(cx1));
  cv::GaussianBlur(source, blurred_, cv::Size(0, 0), sigma, sigma, cv::BORDER_REFLECT_101 | cv::BORDER_ISOLATED);

  rendered_.rowRange(static_cast<int>(y0 - ry0), static_cast<int>(y1 - ry0)).copyTo(out);
  std::vector<float> weights;
  const int j0 = col_j_[static_cast<std::size_t>(bx0)];
  const int j1 = std::min(plan_.lw - 1, col_j_[static_cast<std::size_t>(bx1 - 1)] + 1);
  for (std::int64_t y = y0; y < y1; ++y) {
    lowres_row(plan_.blur, y, j0, j1, weights);
    auto* o = out.ptr<std::uint8_t>(static_cast<int>(y - y0));
    const auto* b = blurred_.ptr<std::uint8_t>(static_cast<int>(y - ry0));
    for (std::int64_t x = bx0; x < bx1; ++x) {
      const int j = col_j_[static_cast<std::size_t>(x)] - j0;
      const float w = lerp(weights[static_cast<std::size_t>(j)], weights[static_cast<std::size_t>(j + 1)],
                           col_w_[static_cast<std::size_t>(x)]);
      if (w <= 1e-3f) continue;
      for (int c = 0; c < 3; ++c) {
        const float v = o[3 * x + c];
        o[3 * x + c] = static_cast<std::uint8_t>(std::lround(v + w * (b[3 * (x - cx0) + c] - v)));
      }
    }
  }
}

void Renderer::render_rows(std::int64_t y0, std::int64_t y1, cv::Mat& out) {
  for (std::int64_t x0 = 0; x0 < width_; x0 += kBlockWidth) {
    render_block(y0, y1, x0, std::min<std::int64_t>(width_, x0 + kBlockWidth), out);
  }
}

void Renderer::gather_nuclei(const NucleusStyle& style, int kind, std::int64_t y0, std::int64_t y1, std::int64_t x0,
                             std::int64_t x1) {
  const double mpp = plan_.options.mpp;
  const double cell = style.cell_um / mpp;
  const double edge_px = style.edge_um / mpp;
  const double reach = style.jitter * cell + style.r_max_um / mpp + edge_px + 2.0;
  const std::int64_t cx0 = static_cast<std::int64_t>(std::floor((static_cast<double>(x0) - reach) / cell));
  const std::int64_t cx1 = static_cast<std::int64_t>(std::floor((static_cast<double>(x1) + reach) / cell));
  const std::int64_t cy0 = static_cast<std::int64_t>(std::floor((static_cast<double>(y0) - reach) / cell));
  const std::int64_t cy1 = static_cast<std::int64_t>(std::floor((static_cast<double>(y1) + reach) / cell));
  const std::uint64_t key = salted(plan_.seed, style.salt);
  for (std::int64_t gy = cy0; gy <= cy1; ++gy) {
    for (std::int64_t gx = cx0; gx <= cx1; ++gx) {
      Draws draws(hash3(key, gx, gy));
      const float presence = draws.uniformf();
      const float type = draws.uniformf();
      const double px = (static_cast<double>(gx) + 0.5 + style.jitter * (2.0 * draws.uniform() - 1.0)) * cell;
      const double py = (static_cast<double>(gy) + 0.5 + style.jitter * (2.0 * draws.uniform() - 1.0)) * cell;
      if (px < 0.0 || py < 0.0 || px >= static_cast<double>(width_) || py >= static_cast<double>(height_)) continue;
      const double a = (style.r_min_um + (style.r_max_um - style.r_min_um) * draws.uniform()) / mpp;
      const double b = a * (style.aspect_min + (style.aspect_max - style.aspect_min) * draws.uniform());
      const double outer = a + edge_px;
      if (px + outer < static_cast<double>(x0) || px - outer >= static_cast<double>(x1) ||
          py + outer < static_cast<double>(y0) || py - outer >= static_cast<double>(y1)) {
        continue;
      }
      if (sample(plan_.tissue, px, py) < 0.55f) continue;
      const float tumour = sample(plan_.tumour, px, py);
      if (kind == 2) {
        if (!(type < tumour && presence < kTumourPresence)) continue;
      } else {
        if (type < tumour) continue;
        const float l = sample(plan_.lymphoid, px, py);
        if (presence >= (kind == 0 ? lymphocyte_presence(l) : spindle_presence(l))) continue;
      }
      double theta = draws.uniform(0.0, M_PI);
      if (kind == 1) {
        // Spindle nuclei lie along the local fibres.
        const float o = sample(plan_.orientation, px, py);
        theta = plan_.fibre_angle[o > 0.5f ? 0 : 1] + 0.3 * (draws.uniform() - 0.5);
      }
      Nucleus n;
      n.cx = static_cast<float>(px);
      n.cy = static_cast<float>(py);
      const double c = std::cos(theta), s = std::sin(theta);
      const double ia = 1.0 / (a * a), ib = 1.0 / (b * b);
      n.qa = static_cast<float>(c * c * ia + s * s * ib);
      n.qb = static_cast<float>(2.0 * c * s * (ia - ib));
      n.qc = static_cast<float>(s * s * ia + c * c * ib);
      n.edge = static_cast<float>(std::sqrt(a * b) / (2.0 * edge_px));
      n.qmax = 1.0f + 0.5f / n.edge;
      n.h = style.h_min + (style.h_max - style.h_min) * draws.uniformf();
      n.texture = style.texture;
      n.rim = style.rim;
      const double grow = std::sqrt(static_cast<double>(n.qmax));
      n.ext_x = static_cast<float>(grow * std::sqrt(a * a * c * c + b * b * s * s)) + 1.0f;
      n.ext_y = static_cast<float>(grow * std::sqrt(a * a * s * s + b * b * c * c)) + 1.0f;
      const std::uint64_t t = draws.next();
      n.tex_dx = static_cast<std::int32_t>(t & kTextureMask);
      n.tex_dy = static_cast<std::int32_t>((t >> 16) & kTextureMask);
      nuclei_.push_back(n);
    }
  }
}

void Renderer::draw_nucleus(const Nucleus& n, std::int64_t y0, std::int64_t y1, std::int64_t x0, std::int64_t x1) {
  const std::int64_t width = x1 - x0;
  const std::int64_t ry0 = std::max<std::int64_t>(y0, static_cast<std::int64_t>(std::floor(n.cy - n.ext_y)));
  const std::int64_t ry1 = std::min<std::int64_t>(y1, static_cast<std::int64_t>(std::ceil(n.cy + n.ext_y)) + 1);
  for (std::int64_t y = ry0; y < ry1; ++y) {
    const float dy = static_cast<float>(y) + 0.5f - n.cy;
    // The row's span: qa·dx² + (qb·dy)·dx + qc·dy² < qmax.
    const float bq = n.qb * dy;
    const float cq = n.qc * dy * dy - n.qmax;
    const float disc = bq * bq - 4.0f * n.qa * cq;
    if (disc <= 0.0f) continue;
    const float root = std::sqrt(disc);
    const float dx_lo = (-bq - root) / (2.0f * n.qa), dx_hi = (-bq + root) / (2.0f * n.qa);
    const std::int64_t sx0 = std::max<std::int64_t>(x0, static_cast<std::int64_t>(std::floor(n.cx + dx_lo - 0.5f)));
    const std::int64_t sx1 = std::min<std::int64_t>(x1, static_cast<std::int64_t>(std::ceil(n.cx + dx_hi - 0.5f)) + 1);
    if (sx0 >= sx1) continue;
    float* hrow = nucleus_h_.data() + (y - y0) * width - x0;
    float* arow = nucleus_a_.data() + (y - y0) * width - x0;
    const float* tex = chromatin_.data() + (static_cast<std::size_t>((y + n.tex_dy) & kTextureMask) << kTextureBits);
    float dx = static_cast<float>(sx0) + 0.5f - n.cx;
    for (std::int64_t x = sx0; x < sx1; ++x, dx += 1.0f) {
      const float q = n.qa * dx * dx + bq * dx + n.qc * dy * dy;
      const float alpha = std::min(1.0f, 0.5f + (1.0f - q) * n.edge);
      if (alpha <= 0.0f) continue;
      const float grain = tex[static_cast<std::size_t>((x + n.tex_dx) & kTextureMask)];
      const float h = n.h * (1.0f + n.texture * (2.0f * grain - 1.0f)) * (1.0f + n.rim * std::min(q, 1.0f));
      hrow[x] = std::max(hrow[x], alpha * h);
      arow[x] = std::max(arow[x], alpha);
    }
  }
}

void Renderer::render_block(std::int64_t y0, std::int64_t y1, std::int64_t x0, std::int64_t x1, cv::Mat& out) {
  const std::int64_t width = x1 - x0;
  const std::size_t cells = static_cast<std::size_t>((y1 - y0) * width);
  nucleus_h_.assign(cells, 0.0f);
  nucleus_a_.assign(cells, 0.0f);
  nuclei_.clear();
  gather_nuclei(kSpindle, 1, y0, y1, x0, x1);
  gather_nuclei(kLymphocyte, 0, y0, y1, x0, x1);
  gather_nuclei(kTumourCell, 2, y0, y1, x0, x1);
  for (const auto& n : nuclei_) draw_nucleus(n, y0, y1, x0, x1);

  const bool fold = rows_touch(plan_.fold, y0, y1);
  const bool pen = rows_touch(plan_.pen, y0, y1);
  const bool red = rows_touch(plan_.red, y0, y1);
  const bool bubble = rows_touch(plan_.bubble_in, y0, y1) || rows_touch(plan_.bubble_rim, y0, y1);
  const bool exposure = !plan_.exposure.empty();
  const int j0 = col_j_[static_cast<std::size_t>(x0)];
  const int j1 = std::min(plan_.lw - 1, col_j_[static_cast<std::size_t>(x1 - 1)] + 1);
  const auto tissue_look = [](float l, float t, float TissueLook::*member) {
    return lerp(lerp(kStromaLook.*member, kLymphoidLook.*member, l), kTumourLook.*member, t);
  };
  const float glass[3] = {plan_.glass_od[0], plan_.glass_od[1], plan_.glass_od[2]};
  const float pen_od[3] = {plan_.pen_od[0], plan_.pen_od[1], plan_.pen_od[2]};

  for (std::int64_t y = y0; y < y1; ++y) {
    lowres_row(plan_.tissue, y, j0, j1, row_s_);
    lowres_row(plan_.lymphoid, y, j0, j1, row_l_);
    lowres_row(plan_.tumour, y, j0, j1, row_t_);
    lowres_row(plan_.orientation, y, j0, j1, row_o_);
    lowres_row(plan_.uneven_h, y, j0, j1, row_u_);
    lowres_row(plan_.uneven_e, y, j0, j1, row_v_);
    if (fold) lowres_row(plan_.fold, y, j0, j1, row_f_);
    if (pen) lowres_row(plan_.pen, y, j0, j1, row_p_);
    if (red) lowres_row(plan_.red, y, j0, j1, row_r_);
    if (bubble) {
      lowres_row(plan_.bubble_rim, y, j0, j1, row_br_);
      lowres_row(plan_.bubble_in, y, j0, j1, row_bi_);
    }
    if (exposure) exposure_row(y, j0, j1, row_x_);
    const double gy = static_cast<double>(y) / static_cast<double>(height_) - 0.5;
    const double fy = std::fmod(static_cast<double>(y), field_px_) / field_px_ - 0.5;
    const float vignette_y = static_cast<float>(0.02 * 4.0 * gy * gy + 0.004 * 4.0 * fy * fy);
    const std::size_t trow = static_cast<std::size_t>(y & kTextureMask) << kTextureBits;
    const std::size_t trow2 = static_cast<std::size_t>((y + 211) & kTextureMask) << kTextureBits;
    const float* fibre0 = fibre_[0].data() + trow;
    const float* fibre1 = fibre_[1].data() + trow;
    const float* mottle = mottle_.data() + trow;
    const float* ragged = ragged_.data() + trow2;
    const float* nh = nucleus_h_.data() + (y - y0) * width - x0;
    const float* na = nucleus_a_.data() + (y - y0) * width - x0;
    auto* o = out.ptr<std::uint8_t>(static_cast<int>(y - y0));
    for (std::int64_t x = x0; x < x1; ++x) {
      const std::size_t jx = static_cast<std::size_t>(col_j_[static_cast<std::size_t>(x)] - j0);
      const float wx = col_w_[static_cast<std::size_t>(x)];
      const std::uint32_t h = pixel_hash(static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(y), grain_key_);
      const float vignette = vignette_x_[static_cast<std::size_t>(x)] + vignette_y;
      float od[3] = {glass[0] + vignette + kGrainOd * (static_cast<float>(h & 0xFF) - 127.5f),
                     glass[1] + vignette + kGrainOd * (static_cast<float>((h >> 8) & 0xFF) - 127.5f),
                     glass[2] + vignette + kGrainOd * (static_cast<float>((h >> 16) & 0xFF) - 127.5f)};
      const float s = lerp(row_s_[jx], row_s_[jx + 1], wx);
      if (s > 0.2f) {
        const std::size_t tx = static_cast<std::size_t>(x & kTextureMask);
        const float ta = std::clamp((s + 0.5f * (ragged[tx] - 0.5f) - 0.5f) * 20.0f + 0.5f, 0.0f, 1.0f);
        if (ta > 0.0f) {
          const float l = lerp(row_l_[jx], row_l_[jx + 1], wx);
          const float t = lerp(row_t_[jx], row_t_[jx + 1], wx);
          const float orient = lerp(row_o_[jx], row_o_[jx + 1], wx);
          const float uneven_h = lerp(row_u_[jx], row_u_[jx + 1], wx);
          const float uneven_e = lerp(row_v_[jx], row_v_[jx + 1], wx);
          const float m = mottle[tx];
          const float fibre = lerp(fibre1[tx], fibre0[tx], orient);
          const float fw = tissue_look(l, t, &TissueLook::fibre);
          float ce = tissue_look(l, t, &TissueLook::e) * (1.0f + fw * kFibreContrast * (2.0f * fibre - 1.0f)) *
                     (0.9f + 0.2f * m);
          float ch = tissue_look(l, t, &TissueLook::h) * (0.85f + 0.3f * m);
          const float a = na[x];
          ch = (ch * (1.0f - a) + nh[x]) * uneven_h;
          ce = (ce * (1.0f - a) + kNucleusEosin * a) * uneven_e;
          float k = ta * plan_.thickness;
          if (fold) k *= 1.0f + kFoldGain * lerp(row_f_[jx], row_f_[jx + 1], wx);
          if (bubble) k *= 1.0f - kBubblePaling * lerp(row_bi_[jx], row_bi_[jx + 1], wx);
          for (int c = 0; c < 3; ++c) od[c] += k * (ch * vh_[c] + ce * ve_[c] + kTissueResidualOd);
        }
      }
      if (pen) {
        const float p = lerp(row_p_[jx], row_p_[jx + 1], wx);
        if (p > 1e-3f) {
          const float ink = p * (0.85f + 0.3f * mottle[static_cast<std::size_t>(x & kTextureMask)]);
          for (int c = 0; c < 3; ++c) od[c] += ink * pen_od[c];
        }
      }
      if (red) {
        const float p = lerp(row_r_[jx], row_r_[jx + 1], wx);
        if (p > 1e-3f) {
          const float ink = p * (0.85f + 0.3f * mottle[static_cast<std::size_t>(x & kTextureMask)]);
          for (int c = 0; c < 3; ++c) od[c] += ink * kRedInkOd[c];
        }
      }
      if (bubble) {
        const float b = lerp(row_br_[jx], row_br_[jx + 1], wx);
        if (b > 1e-3f) {
          for (int c = 0; c < 3; ++c) od[c] += b * kBubbleRimOd[c];
        }
      }
      if (exposure) {
        // Exposure fields have sharp edges (a camera field): nearest cell, no interpolation.
        const float offset = row_x_[jx + (wx >= 0.5f ? 1 : 0)];
        for (int c = 0; c < 3; ++c) od[c] += offset;
      }
      o[3 * x] = table_(od[0]);
      o[3 * x + 1] = table_(od[1]);
      o[3 * x + 2] = table_(od[2]);
    }
  }
}

// =============================================================================================================
// Associated images for the Aperio flavour.

constexpr int kMacroSlideSide = 768;  // longer side of the slide's picture in the macro image

// An area-averaged overview of the slide built from the strips as they pass.
class Overview {
 public:
  Overview(std::int64_t width, std::int64_t height, int max_side)
      : factor_(max_side > 0 ? std::max<std::int64_t>(1, (std::max(width, height) + max_side - 1) / max_side) : 1),
        cols_(static_cast<int>((width + factor_ - 1) / factor_)),
        rows_(static_cast<int>((height + factor_ - 1) / factor_)),
        enabled_(max_side > 0) {
    if (enabled_) {
      sum_ = cv::Mat::zeros(rows_, cols_, CV_32FC3);
      count_ = cv::Mat::zeros(rows_, cols_, CV_32FC1);
    }
  }
  void add(std::int64_t y0, const cv::Mat& strip) {
    if (!enabled_) return;
    for (int r = 0; r < strip.rows; ++r) {
      const int row = static_cast<int>((y0 + r) / factor_);
      auto* sum = sum_.ptr<float>(row);
      auto* count = count_.ptr<float>(row);
      const auto* in = strip.ptr<std::uint8_t>(r);
      for (int x = 0; x < strip.cols; ++x) {
        const int c = static_cast<int>(x / factor_);
        sum[3 * c] += in[3 * x];
        sum[3 * c + 1] += in[3 * x + 1];
        sum[3 * c + 2] += in[3 * x + 2];
        count[c] += 1.0f;
      }
    }
  }
  cv::Mat image() const {
    cv::Mat out(rows_, cols_, CV_8UC3);
    for (int r = 0; r < rows_; ++r) {
      for (int c = 0; c < cols_; ++c) {
        const float n = std::max(1.0f, count_.at<float>(r, c));
        const auto& v = sum_.at<cv::Vec3f>(r, c);
        out.at<cv::Vec3b>(r, c) =
            cv::Vec3b(cv::saturate_cast<std::uint8_t>(v[0] / n), cv::saturate_cast<std::uint8_t>(v[1] / n),
                      cv::saturate_cast<std::uint8_t>(v[2] / n));
      }
    }
    return out;
  }

 private:
  std::int64_t factor_;
  int cols_, rows_;
  bool enabled_;
  cv::Mat sum_, count_;
};

// A slide label: printed text and a hash-derived 2D "barcode".
cv::Mat make_label(const SynthSlideOptions& options) {
  constexpr int kSide = 320;
  cv::Mat label(kSide, kSide, CV_8UC3, cv::Scalar(236, 236, 228));
  const cv::Scalar ink(30, 30, 40);
  cv::putText(label, "TESSERA", {20, 50}, cv::FONT_HERSHEY_SIMPLEX, 1.1, ink, 2, cv::LINE_AA);
  cv::putText(label, "synthetic H&E", {20, 90}, cv::FONT_HERSHEY_SIMPLEX, 0.8, ink, 2, cv::LINE_AA);
  cv::putText(label, "seed " + std::to_string(options.seed), {20, 130}, cv::FONT_HERSHEY_SIMPLEX, 0.8, ink, 2,
              cv::LINE_AA);
  cv::putText(label, options.tumour ? "tumour" : "normal", {20, 170}, cv::FONT_HERSHEY_SIMPLEX, 0.8, ink, 2,
              cv::LINE_AA);
  constexpr int kModules = 12, kModule = 10;
  const std::uint64_t key = salted(options.seed, kSaltLook);
  for (int i = 0; i < kModules; ++i) {
    for (int j = 0; j < kModules; ++j) {
      const bool finder = i == 0 || j == 0;  // solid L edge, as in a Data Matrix code
      if (finder || (hash3(key, i, j) & 1u)) {
        cv::rectangle(label, cv::Rect(20 + j * kModule, 185 + i * kModule, kModule, kModule), ink, cv::FILLED);
      }
    }
  }
  return label;
}

// The macro photo: the label on the left, then the glass with the slide's overview.
cv::Mat make_macro(const cv::Mat& overview, const cv::Mat& label) {
  // Scanners photograph the glass at a low resolution: the slide's picture is about half as tall as its overview.
  const int height = std::max(overview.rows, overview.cols) / 2 + 40;
  const int side = std::min(height, label.rows);
  cv::Mat slide = overview;
  if (overview.rows > height - 20) {
    const double f = static_cast<double>(height - 20) / overview.rows;
    cv::resize(overview, slide, cv::Size(std::max(1, static_cast<int>(std::lround(overview.cols * f))), height - 20), 0,
               0, cv::INTER_AREA);
  }
  cv::Mat macro(height, side + slide.cols + 40, CV_8UC3, cv::Scalar(215, 215, 210));
  cv::Mat small_label;
  cv::resize(label, small_label, cv::Size(side, side), 0, 0, cv::INTER_AREA);
  small_label.copyTo(macro(cv::Rect(0, (height - side) / 2, side, side)));
  slide.copyTo(macro(cv::Rect(side + 20, (height - slide.rows) / 2, slide.cols, slide.rows)));
  return macro;
}

}  // namespace

std::uint64_t slide_seed(std::uint64_t set_seed, std::uint64_t index) {
  return splitmix64_mix(set_seed + golden_gamma * (index + 1));
}

SynthGroundTruth synthetic_ground_truth(const SynthSlideOptions& options) {
  validate(options);
  return make_plan(options).truth;
}

SynthGroundTruth render_synthetic_slide(const SynthSlideOptions& options, const SynthStripSink& sink) {
  validate(options);
  const Plan plan = make_plan(options);
  Renderer renderer(plan);
  const int tile = options.tiff.tile_size;
  for (std::int64_t y0 = 0; y0 < options.height; y0 += tile) {
    const int rows = static_cast<int>(std::min<std::int64_t>(tile, options.height - y0));
    // A fresh buffer per strip: the consumer may keep a reference to the previous one.
    cv::Mat strip;
    renderer.render_strip(y0, rows, strip);
    sink(y0, strip);
  }
  return plan.truth;
}

SynthGroundTruth write_synthetic_slide(const std::string& path, const SynthSlideOptions& options) {
  validate(options);
  io::TiffWriterOptions tiff = options.tiff;
  tiff.mpp = options.mpp;
  // What tells this slide from a scan wherever it goes (io/provenance.h): tile records it, infer heeds it.
  tiff.software = io::kSyntheticSlideSoftware;
  if (tiff.description.empty()) {
    tiff.description = std::string(io::kSyntheticSlideDescription) + "; seed " + std::to_string(options.seed) +
                       (options.tumour ? "; tumour" : "; normal");
  }
  io::TiffWriter writer(path, options.width, options.height, tiff);
  const bool aperio = tiff.flavor == io::TiffFlavor::aperio;
  Overview overview(options.width, options.height, aperio ? kMacroSlideSide : 0);
  SynthGroundTruth truth = render_synthetic_slide(options, [&](std::int64_t y0, const cv::Mat& strip) {
    if (aperio) overview.add(y0, strip);
    writer.write_strip(strip);
  });
  if (aperio) {
    // As Aperio scanners do: a label photo and a macro photo of the whole glass slide.
    const cv::Mat label = make_label(options);
    writer.add_associated_image("label", label);
    writer.add_associated_image("macro", make_macro(overview.image(), label));
  }
  writer.finish();
  return truth;
}

}  // namespace tessera::synth
