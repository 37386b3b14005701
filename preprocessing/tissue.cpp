#include "preprocessing/tissue.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"

namespace tessera::prep {

core::Schema& declare_tissue_keys(core::Schema& schema, const std::string& unset) {
  const auto doc = [&](const std::string& text) { return unset.empty() ? text : text + "; " + unset; };
  return schema
      .number("tissue.min_fraction", 0.5,
              doc("Minimum tissue fraction of a tile to keep it (tile) or score it (infer)"), 0, 1)
      .number("tissue.mask_mpp", 8.0, doc("Resolution of the tissue mask in um/px"), 1, 64)
      .boolean("tissue.reject_pen_marks", true, doc("Remove green/blue/black marker ink from the tissue mask"));
}

io::TissueSettings tissue_settings(const core::Config& config) {
  return {.min_fraction = config.get_number("tissue.min_fraction"),
          .mask_mpp = config.get_number("tissue.mask_mpp"),
          .reject_pen_marks = config.get_bool("tissue.reject_pen_marks")};
}
namespace {

// Reads are split into horizontal bands of at most this many level pixels, so that even a slide without a
// pyramid never needs a level-0-sized buffer.
constexpr std::int64_t kMaxBandPixels = std::int64_t{1} << 24;
// The mask's pixels are read from a pyramid level at least this many times finer than the mask (in x and y) and
// area-averaged here, so each mask pixel is Tessera's own average of ≥ 4×4 level pixels whatever filter made the
// pyramid. Levels made by other software are not area averages (the CMU-1 DICOM series' converter made its 16x level
// about 10 grey levels away from the area average of level 0): read directly, the same scan's masks differed at the
// tissue border between files (90.6% of tile coordinates shared at 8 µm/px between the DICOM series and the SVS;
// 94.2% at 2x finer, 97.9% at 4x). The cost: the level read has 16x the mask's pixels or more (up to 256x on a
// pyramid of 4x steps), so the finer level is taken only while it has at most kMaskSourceMaxPixels pixels; past that
// the level is the coarsest one at least as fine as the mask, as before (a 100k x 220k scan at 0.25 µm/px reads its
// 16x level, 86 Mpx, not its 4x level, 1.4 Gpx).
constexpr double kMaskSourceOversampling = 4.0;
constexpr std::int64_t kMaskSourceMaxPixels = std::int64_t{128} << 20;

// Otsu on a slide with no tissue splits the glass's own faint tint in two. When the two classes' mean
// saturations are closer than this, the image is one population: glass when its mean saturation is below
// kUnimodalTissueSaturation, otherwise all tissue (a view entirely inside a section).
constexpr double kMinOtsuSeparation = 0.10;
constexpr double kUnimodalTissueSaturation = 0.20;

// Morphology on the mask: opening removes isolated noisy pixels, closing joins tissue across small gaps.
constexpr int kOpenKernel = 3;
constexpr int kCloseKernel = 5;
constexpr int kPenDilateKernel = 5;

// Marker ink versus H&E. Haematoxylin and eosin absorb green at least as much as red, so stained tissue has
// red ≥ green: its hue lies in the red–magenta–violet range (about 240°..360° and 0°..40°). Green and blue
// marker ink absorbs red most (red < green), so its hue lies between yellow-green and blue; black ink is
// dark and nearly neutral, while dark tissue (dense nuclei, folds) stays saturated purple.
constexpr double kInkHueMin = 60.0;   // degrees
constexpr double kInkHueMax = 236.0;  // degrees; haematoxylin sits at ≥ 240°
constexpr double kInkMinSaturation = 0.20;
constexpr double kBlackMaxValue = 0.30;  // max channel / 255
constexpr double kBlackMaxSaturation = 0.45;

cv::Mat elliptic(int size) { return cv::getStructuringElement(cv::MORPH_ELLIPSE, cv::Size(size, size)); }

// The Euclidean RGB distance of a pixel from white.
float distance_from_white(const cv::Vec3b& rgb) {
  const int dr = 255 - rgb[0];
  const int dg = 255 - rgb[1];
  const int db = 255 - rgb[2];
  return std::sqrt(static_cast<float>(dr * dr + dg * dg + db * db));
}

// Per pixel: HSV saturation (max − min) / max in 0..1, and the Euclidean RGB distance from white.
void saturation_and_distance(const cv::Mat& rgb, cv::Mat1f& saturation, cv::Mat1f& white_distance) {
  saturation.create(rgb.size());
  white_distance.create(rgb.size());
  for (int r = 0; r < rgb.rows; ++r) {
    const auto* in = rgb.ptr<cv::Vec3b>(r);
    auto* s = saturation.ptr<float>(r);
    auto* d = white_distance.ptr<float>(r);
    for (int c = 0; c < rgb.cols; ++c) {
      const int red = in[c][0];
      const int green = in[c][1];
      const int blue = in[c][2];
      const int mx = std::max({red, green, blue});
      const int mn = std::min({red, green, blue});
      s[c] = mx == 0 ? 0.0f : static_cast<float>(mx - mn) / static_cast<float>(mx);
      d[c] = distance_from_white(in[c]);
    }
  }
}

// The saturation threshold: Otsu on the 8-bit saturation histogram (`s8`: saturation_and_distance's saturation
// converted to CV_8U at 255 per unit), floored at `min_saturation`; +∞ (no tissue) for an image that is one population
// of glass.
double saturation_threshold(const cv::Mat1b& s8, double min_saturation) {
  cv::Mat ignored;
  const double otsu = cv::threshold(s8, ignored, 0, 255, cv::THRESH_BINARY | cv::THRESH_OTSU);
  // Class means on either side of the Otsu threshold (cv::threshold puts values > otsu in the upper class).
  std::array<double, 256> histogram{};
  for (int r = 0; r < s8.rows; ++r) {
    const auto* p = s8.ptr<std::uint8_t>(r);
    for (int c = 0; c < s8.cols; ++c) histogram[p[c]] += 1.0;
  }
  double n_low = 0, sum_low = 0, n_high = 0, sum_high = 0;
  for (int v = 0; v < 256; ++v) {
    if (v > otsu) {
      n_high += histogram[static_cast<std::size_t>(v)];
      sum_high += v * histogram[static_cast<std::size_t>(v)];
    } else {
      n_low += histogram[static_cast<std::size_t>(v)];
      sum_low += v * histogram[static_cast<std::size_t>(v)];
    }
  }
  const double mean_all = (sum_low + sum_high) / (n_low + n_high) / 255.0;
  const bool split = n_low > 0 && n_high > 0 && (sum_high / n_high - sum_low / n_low) / 255.0 >= kMinOtsuSeparation;
  if (!split) {
    return mean_all < kUnimodalTissueSaturation ? std::numeric_limits<double>::infinity() : min_saturation;
  }
  // Saturations were rounded to 8 bits: the upper class (> otsu) starts half a level above the threshold.
  return std::max(min_saturation, (otsu + 0.5) / 255.0);
}

bool looks_like_ink(const cv::Vec3b& rgb) {
  const double red = rgb[0];
  const double green = rgb[1];
  const double blue = rgb[2];
  const double mx = std::max({red, green, blue});
  const double mn = std::min({red, green, blue});
  if (mx <= 0.0) return true;  // pure black
  const double saturation = (mx - mn) / mx;
  const double value = mx / 255.0;
  if (value < kBlackMaxValue && saturation < kBlackMaxSaturation) return true;
  if (saturation < kInkMinSaturation || mx == mn) return false;
  double hue = 0.0;  // degrees
  if (mx == red) {
    hue = 60.0 * (green - blue) / (mx - mn);
  } else if (mx == green) {
    hue = 60.0 * (blue - red) / (mx - mn) + 120.0;
  } else {
    hue = 60.0 * (red - green) / (mx - mn) + 240.0;
  }
  if (hue < 0.0) hue += 360.0;
  return hue >= kInkHueMin && hue < kInkHueMax;
}

// Fills holes (4-connected background components that do not touch the border) smaller than `max_area`.
void fill_small_holes(cv::Mat1b& mask, double max_area) {
  if (max_area <= 0.0) return;
  cv::Mat1b background = 255 - mask;
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(background, labels, stats, centroids, 4, CV_32S);
  std::vector<std::uint8_t> fill(static_cast<std::size_t>(n), 0);
  for (int i = 1; i < n; ++i) {
    const int x = stats.at<int>(i, cv::CC_STAT_LEFT);
    const int y = stats.at<int>(i, cv::CC_STAT_TOP);
    const int w = stats.at<int>(i, cv::CC_STAT_WIDTH);
    const int h = stats.at<int>(i, cv::CC_STAT_HEIGHT);
    const bool touches_border = x == 0 || y == 0 || x + w == mask.cols || y + h == mask.rows;
    fill[static_cast<std::size_t>(i)] = !touches_border && stats.at<int>(i, cv::CC_STAT_AREA) < max_area;
  }
  for (int r = 0; r < mask.rows; ++r) {
    const auto* l = labels.ptr<int>(r);
    auto* m = mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if (fill[static_cast<std::size_t>(l[c])] != 0) m[c] = 255;
    }
  }
}

// `region` area-averaged to `size` (cv::INTER_AREA) into `out` (which may be a view): area_average() when the sizes
// differ by one integer factor of 3 or more, as they do between levels of a pyramid of power-of-two steps (the mask
// reads a level 4x finer than itself).
void resize_area(const cv::Mat& region, cv::Mat& out, const cv::Size& size) {
  const int factor = size.width > 0 ? region.cols / size.width : 0;
  if (factor >= 3 && region.type() == CV_8UC3 && region.cols == size.width * factor &&
      region.rows == size.height * factor) {
    area_average(region, out, factor);
  } else {
    cv::resize(region, out, size, 0, 0, cv::INTER_AREA);
  }
}

// The whole slide as a cols×rows RGB image, area-averaged from `level`, read in bands of bounded size.
cv::Mat read_whole_slide(const io::Slide& slide, int level, int cols, int rows) {
  const io::SlideLevel& l = slide.level(level);
  const std::int64_t lw = l.width;
  const std::int64_t lh = l.height;
  const cv::Size size(cols, rows);
  if (lw * lh <= kMaxBandPixels) {
    cv::Mat region = slide.read_region(0, 0, level, lw, lh);
    if (region.size() == size) return region;
    cv::Mat resized;
    resize_area(region, resized, size);
    return resized;
  }
  // Bands of whole mask rows; each band reads the level rows under it (rounded outward).
  const double level_rows_per_row = static_cast<double>(lh) / rows;
  const int band_rows = std::max(
      1, static_cast<int>(static_cast<double>(kMaxBandPixels) / (static_cast<double>(lw) * level_rows_per_row)));
  cv::Mat out(size, CV_8UC3);
  for (int r0 = 0; r0 < rows; r0 += band_rows) {
    const int r1 = std::min(rows, r0 + band_rows);
    const auto ly0 = static_cast<std::int64_t>(std::floor(r0 * level_rows_per_row));
    const auto ly1 = std::min<std::int64_t>(lh, static_cast<std::int64_t>(std::ceil(r1 * level_rows_per_row)));
    cv::Mat region = slide.read_region(0, std::llround(static_cast<double>(ly0) * l.downsample), level, lw,
                                       std::max<std::int64_t>(1, ly1 - ly0));
    cv::Mat band = out.rowRange(r0, r1);
    resize_area(region, band, cv::Size(cols, r1 - r0));
  }
  return out;
}

}  // namespace

void area_average(const cv::Mat& src, cv::Mat& dst, int factor) {
  if (src.type() != CV_8UC3 || factor < 3 || src.cols % factor != 0 || src.rows % factor != 0) {
    throw core::InternalError(
        "area_average needs a factor of 3 or more and an RGB CV_8UC3 image whose sides are multiples of it");
  }
  constexpr int kChannels = 3;
  const int cols = src.cols / factor;
  const int rows = src.rows / factor;
  const cv::Mat source = src;  // its pixels stay held if `dst` is `src` and create() replaces them
  dst.create(rows, cols, CV_8UC3);
  const float scale = 1.f / static_cast<float>(factor * factor);  // as OpenCV computes it
  const auto width = static_cast<std::size_t>(source.cols) * kChannels;
  std::vector<int> sums(width);  // per source column and channel: the sum over the block's rows
  for (int r = 0; r < rows; ++r) {
    std::fill(sums.begin(), sums.end(), 0);
    for (int i = 0; i < factor; ++i) {
      const auto* in = source.ptr<std::uint8_t>(r * factor + i);
      for (std::size_t x = 0; x < width; ++x) sums[x] += in[x];
    }
    auto* out = dst.ptr<std::uint8_t>(r);
    for (int c = 0; c < cols; ++c) {
      for (int channel = 0; channel < kChannels; ++channel) {
        int sum = 0;
        for (int j = 0; j < factor; ++j) sum += sums[static_cast<std::size_t>((c * factor + j) * kChannels + channel)];
        out[c * kChannels + channel] = cv::saturate_cast<std::uint8_t>(static_cast<float>(sum) * scale);
      }
    }
  }
}

double TissueMask::tissue_fraction() const {
  if (mask.empty()) return 0.0;
  return static_cast<double>(cv::countNonZero(mask)) / static_cast<double>(mask.total());
}

double TissueMask::tissue_area_mm2() const {
  if (mask.empty()) return 0.0;
  const double mm_per_pixel = mpp / 1000.0;
  return static_cast<double>(cv::countNonZero(mask)) * mm_per_pixel * mm_per_pixel;
}

TissueMask detect_tissue(const cv::Mat& rgb, double downsample, double mpp, const TissueOptions& options) {
  if (!rgb.empty() && rgb.type() != CV_8UC3) throw core::InternalError("detect_tissue needs an RGB CV_8UC3 image");
  if (!(downsample > 0.0) || !(mpp > 0.0)) {
    throw core::InternalError("detect_tissue needs a positive downsample and µm/px");
  }
  TissueMask result;
  result.downsample = downsample;
  result.mpp = mpp;
  result.mask = cv::Mat1b::zeros(rgb.size());
  if (rgb.empty()) return result;

  // Saturation and distance from white as float planes a band of rows at a time (a mask of a large slide has tens of
  // megapixels): first its 8-bit histogram's threshold, then the mask.
  constexpr int kBandRows = 256;
  cv::Mat1f saturation, white_distance;
  double threshold = 0.0;
  {
    cv::Mat1b s8(rgb.size());
    for (int r0 = 0; r0 < rgb.rows; r0 += kBandRows) {
      const int r1 = std::min(rgb.rows, r0 + kBandRows);
      saturation_and_distance(rgb.rowRange(r0, r1), saturation, white_distance);
      cv::Mat band = s8.rowRange(r0, r1);
      saturation.convertTo(band, CV_8U, 255.0);
    }
    threshold = saturation_threshold(s8, options.min_saturation);
  }
  if (!std::isfinite(threshold)) return result;

  cv::Mat1b mask(rgb.size());
  for (int r0 = 0; r0 < rgb.rows; r0 += kBandRows) {
    const int r1 = std::min(rgb.rows, r0 + kBandRows);
    saturation_and_distance(rgb.rowRange(r0, r1), saturation, white_distance);
    cv::Mat band = mask.rowRange(r0, r1);
    cv::Mat1b((saturation >= threshold) & (white_distance >= options.min_white_distance)).copyTo(band);
  }
  saturation.release();
  white_distance.release();

  cv::Mat1b pen;
  if (options.reject_pen_marks) {
    pen = cv::Mat1b::zeros(rgb.size());
    for (int r = 0; r < rgb.rows; ++r) {
      const auto* in = rgb.ptr<cv::Vec3b>(r);
      auto* p = pen.ptr<std::uint8_t>(r);
      for (int c = 0; c < rgb.cols; ++c) {
        // Black ink may be too neutral to pass the saturation test, so every non-white pixel is judged.
        if (distance_from_white(in[c]) >= options.min_white_distance && looks_like_ink(in[c])) p[c] = 255;
      }
    }
    // The blurred rim of a stroke is paler than its core; dilation takes it too.
    cv::dilate(pen, pen, elliptic(kPenDilateKernel));
    mask.setTo(0, pen);
  }

  cv::morphologyEx(mask, mask, cv::MORPH_OPEN, elliptic(kOpenKernel));
  cv::morphologyEx(mask, mask, cv::MORPH_CLOSE, elliptic(kCloseKernel));
  const double um2_per_pixel = mpp * mpp;
  fill_small_holes(mask, options.max_hole_um2 / um2_per_pixel);
  // Closing and hole filling must not bring ink back.
  if (!pen.empty()) mask.setTo(0, pen);
  remove_small_objects(mask, options.min_object_um2 / um2_per_pixel);
  result.mask = mask;
  return result;
}

void remove_small_objects(cv::Mat1b& mask, double min_area) {
  if (min_area <= 1.0 || cv::countNonZero(mask) == 0) return;
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
  for (int i = 1; i < n; ++i) keep[static_cast<std::size_t>(i)] = stats.at<int>(i, cv::CC_STAT_AREA) >= min_area;
  keep_labelled(mask, labels, keep);
}

void keep_labelled(cv::Mat1b& mask, const cv::Mat& labels, const std::vector<std::uint8_t>& keep) {
  for (int r = 0; r < mask.rows; ++r) {
    const auto* l = labels.ptr<int>(r);
    auto* m = mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if (m[c] != 0 && keep[static_cast<std::size_t>(l[c])] == 0) m[c] = 0;
    }
  }
}

cv::Mat read_slide_image(const io::Slide& slide, double mpp, double* downsample, SourceLevel source) {
  // An image finer than the slide itself would only repeat level-0 pixels.
  const double image_mpp = std::max(mpp, slide.mpp());
  constexpr double kEpsilon = 1e-9;
  const double scale = slide.mpp() / image_mpp;  // image pixels per level-0 pixel
  const auto cols = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(slide.width() * scale - kEpsilon)));
  const auto rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(slide.height() * scale - kEpsilon)));
  if (cols > INT32_MAX / 4 || rows > INT32_MAX / 4) {
    throw core::InputError(
        "tissue mask of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is too large; raise mask_mpp",
        slide.path());
  }
  // The downsample follows from the size actually chosen, so image pixel i covers level-0
  // [i·downsample, (i+1)·downsample) exactly along x.
  *downsample = static_cast<double>(slide.width()) / static_cast<double>(cols);
  const int coarsest = slide.best_level_for_mpp(image_mpp);
  int level =
      source == SourceLevel::oversampled ? slide.best_level_for_mpp(image_mpp / kMaskSourceOversampling) : coarsest;
  const auto pixels = [&](int l) {
    const io::SlideLevel& info = slide.levels()[static_cast<std::size_t>(l)];
    return info.width * info.height;
  };
  while (level < coarsest && pixels(level) > kMaskSourceMaxPixels) ++level;
  return read_whole_slide(slide, level, static_cast<int>(cols), static_cast<int>(rows));
}

TissueMask detect_tissue(const io::Slide& slide, const TissueOptions& options) {
  if (!(options.mask_mpp > 0.0)) throw core::ConfigError("mask_mpp must be positive", "", 0, "mask_mpp");
  double downsample = 1.0;
  const cv::Mat rgb = read_slide_image(slide, options.mask_mpp, &downsample);
  return detect_tissue(rgb, downsample, slide.mpp() * downsample, options);
}

}  // namespace tessera::prep
