#include "preprocessing/augment.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

#include <opencv2/core.hpp>

#include "core/error.h"
#include "core/random.h"
#include "preprocessing/stain.h"

namespace tessera::prep {

namespace {

// --- Ranges, shared by the schema and validate() -----------------------------------------------------------

// Beyond a magnitude of 2 a factor range [0, 3] only produces black or saturated tiles.
constexpr double kMaxFactorJitter = 2.0;
// ColorJitter's limit: a shift of half a turn already reaches every hue.
constexpr double kMaxHueJitter = 0.5;
// Scales up to 1 ± 1 keep concentrations non-negative; shifts of a whole OD unit are already as strong as
// the strongest stain in a typical slide.
constexpr double kMaxHedScale = 1.0;
constexpr double kMaxHedShift = 1.0;

constexpr float kMaxLevel = 255.0f;
constexpr float kGrayR = 0.299f, kGrayG = 0.587f, kGrayB = 0.114f;  // ITU-R BT.601 luma, as ColorJitter

// --- Per-tile generator ------------------------------------------------------------------------------------

// splitmix64 (core/random.h): identical bits on every platform, unlike std:: distributions, and cheap to seed
// from a hash of (seed, epoch, index) so that no stream is shared between tiles.
constexpr std::uint64_t kAugmentSalt = 0xA06E17A7E5EEDull;

std::uint64_t tile_key(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  using core::golden_gamma;
  using core::splitmix64_mix;
  const std::uint64_t epoch_key =
      splitmix64_mix(splitmix64_mix(seed ^ kAugmentSalt) + golden_gamma * (static_cast<std::uint64_t>(epoch) + 1));
  return splitmix64_mix(epoch_key + golden_gamma * (static_cast<std::uint64_t>(index) + 1));
}

class TileRng {
 public:
  TileRng(std::uint64_t seed, std::int64_t epoch, std::int64_t index) : draws_(tile_key(seed, epoch, index)) {}

  // Uniform in [0, 1) from 53 bits.
  double uniform() { return static_cast<double>(draws_.next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

 private:
  core::SplitMix64 draws_;
};

double factor(TileRng& rng, double magnitude) { return rng.uniform(std::max(0.0, 1.0 - magnitude), 1.0 + magnitude); }

// --- Stain model, in float for the inner loop ----------------------------------------------------------------

struct StainModel {
  std::array<float, 256> od{};  // OD of each 8-bit intensity (stain.h's convention)
  float h_row[3], e_row[3];     // rows of the unmixing matrix that give the H and E concentrations
  float h_vec[3], e_vec[3];     // the stain vectors
  OdToIntensityTable intensity;
};

const StainModel& stain_model() {
  static const StainModel model = [] {
    StainModel m;
    for (int i = 0; i < 256; ++i) m.od[static_cast<std::size_t>(i)] = static_cast<float>(od_from_intensity(i));
    const StainVectors stains = ruifrok_he();
    const cv::Matx33d unmix = unmixing_matrix(stains);
    for (int c = 0; c < 3; ++c) {
      m.h_row[c] = static_cast<float>(unmix(0, c));
      m.e_row[c] = static_cast<float>(unmix(1, c));
      m.h_vec[c] = static_cast<float>(stains.h[c]);
      m.e_vec[c] = static_cast<float>(stains.e[c]);
    }
    return m;
  }();
  return model;
}

// --- Row kernels -------------------------------------------------------------------------------------------------
// A row is three planes of W' floats (R, G, B) in [0, 255]: planar so that every step is a plain loop the
// compiler vectorises, and so that the CHW sink is a scaled copy.

struct Row {
  float* r;
  float* g;
  float* b;
};

float clamp_level(float v) { return std::min(std::max(v, 0.0f), kMaxLevel); }

void brightness_row(Row row, int n, float factor) {
  for (float* plane : {row.r, row.g, row.b}) {
    for (int i = 0; i < n; ++i) plane[i] = clamp_level(factor * plane[i]);
  }
}

void contrast_row(Row row, int n, float factor, float mean) {
  const float offset = (1.0f - factor) * mean;
  for (float* plane : {row.r, row.g, row.b}) {
    for (int i = 0; i < n; ++i) plane[i] = clamp_level(factor * plane[i] + offset);
  }
}

void saturation_row(Row row, int n, float factor) {
  const float keep = 1.0f - factor;
  float* __restrict r = row.r;
  float* __restrict g = row.g;
  float* __restrict b = row.b;
  for (int i = 0; i < n; ++i) {
    const float gray = keep * (kGrayR * r[i] + kGrayG * g[i] + kGrayB * b[i]);
    r[i] = clamp_level(factor * r[i] + gray);
    g[i] = clamp_level(factor * g[i] + gray);
    b[i] = clamp_level(factor * b[i] + gray);
  }
}

// HSV hue rotation by `shift` turns (|shift| ≤ ½). Hue in sixths of a turn is h6 = (G−B)/k, 2 + (B−R)/k or
// 4 + (R−G)/k as R, G or B is the largest, with chroma k = max − min; back to RGB, channel n (5 for R, 3 for G,
// 1 for B) is max − k·clamp(min(m, 4 − m), 0, 1) with m = (n + h6) mod 6. V = max and the minimum are kept; a
// grey pixel (k = 0) comes back unchanged whatever its computed hue. Written without branches to vectorise.
void hue_row(Row row, int n, float shift) {
  const float shift6 = 6.0f * shift;
  constexpr float kTinyChroma = 1e-20f;  // keeps 1/k finite for grey pixels, where the hue does not matter
  auto wrap6 = [](float m) { return m >= 6.0f ? m - 6.0f : m; };
  float* __restrict r = row.r;
  float* __restrict g = row.g;
  float* __restrict b = row.b;
  for (int i = 0; i < n; ++i) {
    const float red = r[i], green = g[i], blue = b[i];
    const float hi = std::max(red, std::max(green, blue));
    const float lo = std::min(red, std::min(green, blue));
    const float chroma = hi - lo;
    const float inv = 1.0f / std::max(chroma, kTinyChroma);
    const float h_red = (green - blue) * inv, h_green = 2.0f + (blue - red) * inv, h_blue = 4.0f + (red - green) * inv;
    float h6 = hi == red ? h_red : (hi == green ? h_green : h_blue);
    h6 += shift6;  // in [−4, 8)
    h6 = h6 < 0.0f ? h6 + 6.0f : wrap6(h6);
    auto channel = [&](float m) { return hi - chroma * std::min(std::max(std::min(m, 4.0f - m), 0.0f), 1.0f); };
    r[i] = channel(wrap6(5.0f + h6));
    g[i] = channel(wrap6(3.0f + h6));
    b[i] = channel(wrap6(1.0f + h6));
  }
}

double gray_sum(Row row, int n) {
  float sum = 0.0f;  // a row is at most a few thousand pixels; float keeps the loop vectorisable
  for (int i = 0; i < n; ++i) sum += kGrayR * row.r[i] + kGrayG * row.g[i] + kGrayB * row.b[i];
  return sum;
}

using Step = TileAugmentation::Step;

void apply_step(Step step, const TileAugmentation& a, Row row, int n, float mean) {
  switch (step) {
    case Step::brightness:
      brightness_row(row, n, static_cast<float>(a.brightness));
      break;
    case Step::contrast:
      contrast_row(row, n, static_cast<float>(a.contrast), mean);
      break;
    case Step::saturation:
      saturation_row(row, n, static_cast<float>(a.saturation));
      break;
    case Step::hue:
      // Whole turns do nothing; the remainder in [−½, ½] keeps hue_row's single wrap enough.
      hue_row(row, n, static_cast<float>(a.hue - std::round(a.hue)));
      break;
  }
}

bool is_identity_step(Step step, const TileAugmentation& a) {
  switch (step) {
    case Step::brightness:
      return a.brightness == 1.0;
    case Step::contrast:
      return a.contrast == 1.0;
    case Step::saturation:
      return a.saturation == 1.0;
    case Step::hue:
      return a.hue == 0.0;
  }
  return true;
}

// Reads output row `y` of the dihedral transform of `src` into `row`, through the stain jitter when it is on.
// Output (y, x) of an H'×W' result reads input (sy, sx) with y1 = flip_v ? H'−1−y : y, x1 = flip_h ? W'−1−x : x,
// and (sy, sx) = rotate90 ? (x1, W−1−y1) : (y1, x1); along a row the source moves by a fixed step, one pixel
// or one image row.
void gather_row(const cv::Mat& src, const TileAugmentation& a, int y, int out_rows, int out_cols, Row row) {
  const Dihedral d = a.dihedral;
  const int y1 = d.flip_vertical ? out_rows - 1 - y : y;
  const int x0 = d.flip_horizontal ? out_cols - 1 : 0;
  const std::uint8_t* start;
  std::ptrdiff_t step;
  if (d.rotate90) {
    start = src.ptr<std::uint8_t>(x0) + 3 * static_cast<std::ptrdiff_t>(src.cols - 1 - y1);
    step = static_cast<std::ptrdiff_t>(src.step[0]);
  } else {
    start = src.ptr<std::uint8_t>(y1) + 3 * static_cast<std::ptrdiff_t>(x0);
    step = 3;
  }
  if (d.flip_horizontal) step = -step;

  if (!a.hed) {
    for (int x = 0; x < out_cols; ++x) {
      const std::uint8_t* p = start + x * step;
      row.r[x] = p[0];
      row.g[x] = p[1];
      row.b[x] = p[2];
    }
    return;
  }
  // Three loops rather than one, so that the arithmetic in the middle vectorises: 8-bit → OD by table, the
  // concentration change along the stain vectors, OD → 8-bit by table.
  const StainModel& m = stain_model();
  for (int x = 0; x < out_cols; ++x) {
    const std::uint8_t* p = start + x * step;
    row.r[x] = m.od[p[0]];
    row.g[x] = m.od[p[1]];
    row.b[x] = m.od[p[2]];
  }
  const float h_gain = static_cast<float>(a.h_scale - 1.0), h_shift = static_cast<float>(a.h_shift);
  const float e_gain = static_cast<float>(a.e_scale - 1.0), e_shift = static_cast<float>(a.e_shift);
  float* __restrict r = row.r;
  float* __restrict g = row.g;
  float* __restrict b = row.b;
  for (int x = 0; x < out_cols; ++x) {
    const float h = m.h_row[0] * r[x] + m.h_row[1] * g[x] + m.h_row[2] * b[x];
    const float e = m.e_row[0] * r[x] + m.e_row[1] * g[x] + m.e_row[2] * b[x];
    const float dh = h_gain * h + h_shift;  // h' − h
    const float de = e_gain * e + e_shift;
    r[x] += dh * m.h_vec[0] + de * m.e_vec[0];
    g[x] += dh * m.h_vec[1] + de * m.e_vec[1];
    b[x] += dh * m.h_vec[2] + de * m.e_vec[2];
  }
  for (float* plane : {r, g, b}) {
    for (int x = 0; x < out_cols; ++x) plane[x] = m.intensity(plane[x]);
  }
}

void check_input(const cv::Mat& src) {
  if (src.empty() || src.type() != CV_8UC3) {
    throw core::InternalError("augment: the tile must be a non-empty RGB CV_8UC3 image, got " +
                              std::to_string(src.rows) + "x" + std::to_string(src.cols) + " of type " +
                              std::to_string(src.type()));
  }
}

void check_range(const char* name, double value, double lo, double hi) {
  if (!(value >= lo && value <= hi)) {
    throw core::InternalError("augment: " + std::string(name) + " = " + std::to_string(value) + " is outside [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

}  // namespace

// --- Options and config ----------------------------------------------------------------------------------------

void validate(const AugmentOptions& o) {
  check_range("flip_horizontal", o.flip_horizontal, 0.0, 1.0);
  check_range("flip_vertical", o.flip_vertical, 0.0, 1.0);
  check_range("rotate90", o.rotate90, 0.0, 1.0);
  check_range("colour_probability", o.colour_probability, 0.0, 1.0);
  check_range("brightness", o.brightness, 0.0, kMaxFactorJitter);
  check_range("contrast", o.contrast, 0.0, kMaxFactorJitter);
  check_range("saturation", o.saturation, 0.0, kMaxFactorJitter);
  check_range("hue", o.hue, 0.0, kMaxHueJitter);
  check_range("hed_probability", o.hed_probability, 0.0, 1.0);
  check_range("hed_scale", o.hed_scale, 0.0, kMaxHedScale);
  check_range("hed_shift", o.hed_shift, 0.0, kMaxHedShift);
}

core::Schema& declare_augment_schema(core::Schema& schema) {
  const AugmentOptions d;
  return schema
      .boolean("augment.enabled", d.enabled, "Augment training tiles (validation and inference tiles never are)")
      .number("augment.flip_horizontal", d.flip_horizontal, "Probability of a horizontal flip", 0, 1)
      .number("augment.flip_vertical", d.flip_vertical, "Probability of a vertical flip", 0, 1)
      .number("augment.rotate90", d.rotate90,
              "Probability of a 90-degree rotation (all three at 0.5: the 8 symmetries equally likely)", 0, 1)
      .number("augment.colour.probability", d.colour_probability, "Probability of colour jitter for a tile", 0, 1)
      .number("augment.colour.brightness", d.brightness, "Brightness factor drawn in [max(0, 1-x), 1+x]", 0,
              kMaxFactorJitter)
      .number("augment.colour.contrast", d.contrast, "Contrast factor drawn in [max(0, 1-x), 1+x]", 0, kMaxFactorJitter)
      .number("augment.colour.saturation", d.saturation, "Saturation factor drawn in [max(0, 1-x), 1+x]", 0,
              kMaxFactorJitter)
      .number("augment.colour.hue", d.hue, "Hue shift drawn in [-x, x] turns of the HSV hue circle", 0, kMaxHueJitter)
      .string("augment.colour.order", d.colour_order == ColourOrder::random ? "random" : "fixed",
              "Order of the colour steps: random per tile, or fixed (brightness, contrast, saturation, hue)",
              {"random", "fixed"})
      .number("augment.hed.probability", d.hed_probability, "Probability of H&E stain jitter for a tile", 0, 1)
      .number("augment.hed.scale", d.hed_scale, "H and E concentrations are scaled by a factor drawn in [1-x, 1+x]", 0,
              kMaxHedScale)
      .number("augment.hed.shift", d.hed_shift,
              "H and E concentrations are shifted by an optical density drawn in [-x, x]", 0, kMaxHedShift);
}

AugmentOptions augment_options_from_config(const core::Config& config) {
  AugmentOptions o;
  o.enabled = config.get_bool("augment.enabled");
  o.flip_horizontal = config.get_number("augment.flip_horizontal");
  o.flip_vertical = config.get_number("augment.flip_vertical");
  o.rotate90 = config.get_number("augment.rotate90");
  o.colour_probability = config.get_number("augment.colour.probability");
  o.brightness = config.get_number("augment.colour.brightness");
  o.contrast = config.get_number("augment.colour.contrast");
  o.saturation = config.get_number("augment.colour.saturation");
  o.hue = config.get_number("augment.colour.hue");
  o.colour_order = config.get_string("augment.colour.order") == "fixed" ? ColourOrder::fixed : ColourOrder::random;
  o.hed_probability = config.get_number("augment.hed.probability");
  o.hed_scale = config.get_number("augment.hed.scale");
  o.hed_shift = config.get_number("augment.hed.shift");
  return o;
}

// --- Dihedral ------------------------------------------------------------------------------------------------

Dihedral Dihedral::from_code(int code) {
  if (code < 0 || code > 7)
    throw core::InternalError("augment: dihedral code " + std::to_string(code) + " not in 0..7");
  return {(code & 1) != 0, (code & 2) != 0, (code & 4) != 0};
}

Dihedral Dihedral::inverse() const {
  // Without a rotation both flips are their own inverses and commute. R alone is undone by R³ = R·(H·V), and
  // R·H·V = R³ by R; R·H (anti-transpose) and R·V (transpose) are reflections, their own inverses.
  if (rotate90 && flip_horizontal == flip_vertical) return {true, !flip_horizontal, !flip_vertical};
  return *this;
}

void apply_dihedral(const cv::Mat& src, cv::Mat& dst, Dihedral dihedral) {
  cv::Mat out = src.clone();  // dst may be src: work on a copy
  if (dihedral.rotate90) cv::rotate(out.clone(), out, cv::ROTATE_90_COUNTERCLOCKWISE);
  if (dihedral.flip_horizontal && dihedral.flip_vertical) {
    cv::flip(out.clone(), out, -1);
  } else if (dihedral.flip_horizontal) {
    cv::flip(out.clone(), out, 1);
  } else if (dihedral.flip_vertical) {
    cv::flip(out.clone(), out, 0);
  }
  dst = out;
}

// --- Drawing -----------------------------------------------------------------------------------------------------

TileAugmentation draw_augmentation(const AugmentOptions& o, std::uint64_t seed, std::int64_t epoch,
                                   std::int64_t index) {
  TileRng rng(seed, epoch, index);
  // Every value is drawn, always in this order, whatever is enabled.
  const double u_rotate = rng.uniform(), u_flip_h = rng.uniform(), u_flip_v = rng.uniform();
  const double u_hed = rng.uniform();
  const double h_scale = rng.uniform(1.0 - o.hed_scale, 1.0 + o.hed_scale);
  const double h_shift = rng.uniform(-o.hed_shift, o.hed_shift);
  const double e_scale = rng.uniform(1.0 - o.hed_scale, 1.0 + o.hed_scale);
  const double e_shift = rng.uniform(-o.hed_shift, o.hed_shift);
  const double u_colour = rng.uniform();
  const double brightness = factor(rng, o.brightness);
  const double contrast = factor(rng, o.contrast);
  const double saturation = factor(rng, o.saturation);
  const double hue = rng.uniform(-o.hue, o.hue);
  std::array<Step, 4> order = {Step::brightness, Step::contrast, Step::saturation, Step::hue};
  for (std::size_t i = order.size() - 1; i > 0; --i) {  // Fisher–Yates
    const auto j = std::min(static_cast<std::size_t>(rng.uniform() * static_cast<double>(i + 1)), i);
    if (o.colour_order == ColourOrder::random) std::swap(order[i], order[j]);
  }

  TileAugmentation a;
  if (!o.enabled) return a;
  a.dihedral = {u_rotate < o.rotate90, u_flip_h < o.flip_horizontal, u_flip_v < o.flip_vertical};
  // Zero magnitudes mean no stain step at all rather than an OD round trip that could move a level.
  if (u_hed < o.hed_probability && (o.hed_scale > 0.0 || o.hed_shift > 0.0)) {
    a.hed = true;
    a.h_scale = h_scale, a.h_shift = h_shift, a.e_scale = e_scale, a.e_shift = e_shift;
  }
  if (u_colour < o.colour_probability) {
    a.brightness = brightness, a.contrast = contrast, a.saturation = saturation, a.hue = hue;
    a.order = order;
  }
  return a;
}

// --- Applying ------------------------------------------------------------------------------------------------------

struct Augmenter::Sink {
  cv::Mat* rgb = nullptr;  // 8-bit output, or
  float* chw = nullptr;    // normalised planes
  std::array<float, 3> scale{}, offset{};

  void put(int y, Row row, int cols, int rows) const {
    if (rgb != nullptr) {
      auto* out = rgb->ptr<std::uint8_t>(y);
      for (int x = 0; x < cols; ++x) {
        out[3 * x] = static_cast<std::uint8_t>(clamp_level(row.r[x]) + 0.5f);
        out[3 * x + 1] = static_cast<std::uint8_t>(clamp_level(row.g[x]) + 0.5f);
        out[3 * x + 2] = static_cast<std::uint8_t>(clamp_level(row.b[x]) + 0.5f);
      }
      return;
    }
    const std::size_t plane = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::array<const float*, 3> in = {row.r, row.g, row.b};
    for (std::size_t c = 0; c < 3; ++c) {
      float* __restrict out = chw + c * plane + static_cast<std::size_t>(y) * static_cast<std::size_t>(cols);
      const float* __restrict from = in[c];
      const float s = scale[c], o = offset[c];
      for (int x = 0; x < cols; ++x) out[x] = from[x] * s + o;
    }
  }
};

Augmenter::Augmenter(const AugmentOptions& options) : options_(options) { validate(options_); }

void Augmenter::run(const TileAugmentation& a, const cv::Mat& src, const Sink& sink) {
  const cv::Size out_size = a.dihedral.output_size(src.size());
  const int rows = out_size.height, cols = out_size.width;

  // The colour steps that do something, in order. Contrast needs the mean grey of the tile as it stands when
  // contrast runs, so the chain splits there: pass 1 gathers and runs the steps before contrast into a
  // buffer while summing grey, pass 2 runs contrast and the rest and hands rows to the sink.
  std::array<Step, 4> steps{};
  int count = 0, contrast_at = -1;
  for (Step step : a.order) {
    if (is_identity_step(step, a)) continue;
    if (step == Step::contrast) contrast_at = count;
    steps[static_cast<std::size_t>(count++)] = step;
  }
  const int first_pass_steps = contrast_at >= 0 ? contrast_at : count;
  const bool two_passes = contrast_at >= 0;
  const std::size_t row_values = 3 * static_cast<std::size_t>(cols);
  rows_.resize(two_passes ? row_values * static_cast<std::size_t>(rows) : row_values);

  auto row_at = [&](int y) {
    float* r = rows_.data() + (two_passes ? row_values * static_cast<std::size_t>(y) : 0);
    return Row{r, r + cols, r + 2 * cols};
  };
  double sum = 0.0;
  for (int y = 0; y < rows; ++y) {
    const Row row = row_at(y);
    gather_row(src, a, y, rows, cols, row);
    for (int i = 0; i < first_pass_steps; ++i) apply_step(steps[static_cast<std::size_t>(i)], a, row, cols, 0.0f);
    if (two_passes) {
      sum += gray_sum(row, cols);
    } else {
      sink.put(y, row, cols, rows);
    }
  }
  if (!two_passes) return;
  const auto mean = static_cast<float>(sum / (static_cast<double>(rows) * cols));
  for (int y = 0; y < rows; ++y) {
    const Row row = row_at(y);
    for (int i = contrast_at; i < count; ++i) apply_step(steps[static_cast<std::size_t>(i)], a, row, cols, mean);
    sink.put(y, row, cols, rows);
  }
}

void Augmenter::apply(const TileAugmentation& a, const cv::Mat& src, cv::Mat& dst) {
  check_input(src);
  const cv::Size out_size = a.dihedral.output_size(src.size());
  const bool overlaps = !dst.empty() && src.datastart < dst.dataend && dst.datastart < src.dataend;
  // Row by row in place is safe only when every output row is read from the same input row before it is
  // written; otherwise (pixels move, or dst is a different view of the same memory, or dst would be
  // reallocated under src) the chain reads from a copy.
  const bool same_rows = dst.data == src.data && dst.step[0] == src.step[0] && dst.size() == out_size &&
                         dst.type() == CV_8UC3 && a.dihedral.is_identity();
  const cv::Mat* source = &src;
  if (overlaps && !same_rows) {
    src.copyTo(source_copy_);
    source = &source_copy_;
  }
  if (a.is_identity()) {
    if (source->data != dst.data) source->copyTo(dst);
    return;
  }
  dst.create(out_size, CV_8UC3);
  Sink sink;
  sink.rgb = &dst;
  run(a, *source, sink);
}

void Augmenter::apply(const TileAugmentation& a, const cv::Mat& src, float* chw,
                      const ChannelNormalization& normalization) {
  check_input(src);
  Sink sink;
  sink.chw = chw;
  for (std::size_t c = 0; c < 3; ++c) {
    const float std_dev = normalization.std[c];
    if (!(std_dev > 0.0f)) {
      throw core::InternalError("augment: normalisation std of channel " + std::to_string(c) + " must be positive");
    }
    sink.scale[c] = 1.0f / (kMaxLevel * std_dev);
    sink.offset[c] = -normalization.mean[c] / std_dev;
  }
  run(a, src, sink);
}

}  // namespace tessera::prep
