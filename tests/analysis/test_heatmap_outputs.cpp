// Every per-slide output of a map with known blobs: written atomically, parsed back (GeoJSON with nlohmann and
// io::read_geojson, ASAP XML with io::read_asap_xml, the CSV by hand, the report), coordinates in level-0 pixels
// inside the slide; the overlay's size and what it paints where.
#include "analysis/heatmap_outputs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/annotations.h"
#include "io/image.h"
#include "io/provenance.h"
#include "tests/testing/testing.h"

namespace tessera::analysis {
namespace {

using nlohmann::json;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A 4000×3000 slide at 1 µm/px scored on a 30×40 grid of 100 px tiles (100 µm cells), with a margin of unscored cells,
// a macrometastasis with a hole, a micrometastasis and an isolated-tumour-cell focus.
io::Heatmap blob_map() {
  io::Heatmap h;
  h.slide_id = "tumor_007";
  h.slide_path = "/slides/tumor_007.svs";
  h.slide_width = 4000;
  h.slide_height = 3000;
  h.slide_mpp = 1.0;
  h.tile_mpp = 1.0;
  h.tile = 100;
  h.step = 100;
  h.rows = 30;
  h.cols = 40;
  h.checkpoint = "/runs/demo/checkpoint.h5";
  h.prob.assign(static_cast<std::size_t>(h.rows) * h.cols, kNaN);
  auto set = [&](int i, int j, float p) { h.prob[static_cast<std::size_t>(i) * h.cols + j] = p; };
  for (int i = 2; i < 28; ++i) {
    for (int j = 2; j < 38; ++j) set(i, j, 0.02f + 0.001f * static_cast<float>((i * 7 + j * 3) % 20));
  }
  for (int i = 4; i < 16; ++i) {
    for (int j = 4; j < 36; ++j) set(i, j, 0.93f);  // 12 × 32 cells: 1.2 × 3.2 mm → macrometastasis
  }
  set(9, 9, 0.2f);
  set(9, 10, 0.3f);  // the hole (2 cells)
  for (int i = 20; i < 25; ++i) {
    for (int j = 6; j < 11; ++j) set(i, j, 0.75f);  // 5 × 5 cells: 0.5 mm square → micrometastasis
  }
  set(22, 30, 0.66f);  // one cell: 0.1 mm square → isolated tumour cells
  return h;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void expect_inside_slide(const io::Heatmap& h, double x, double y) {
  EXPECT_GE(x, 0.0);
  EXPECT_LE(x, static_cast<double>(h.slide_width));
  EXPECT_GE(y, 0.0);
  EXPECT_LE(y, static_cast<double>(h.slide_height));
}

// The outputs are written once for the suite; each test reads what it checks.
class SlideOutputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir = new testing::TempDir();
    result = new SlideResult(analyse_heatmap(blob_map(), options));
    result->thumbnail = cv::Mat(300, 400, CV_8UC3, cv::Scalar(236, 190, 215));  // pale pink, 10 px per pixel
    result->tissue_area_mm2 = 2.5;
    paths = write_slide_outputs(dir->path().string(), *result, options);
  }
  static void TearDownTestSuite() {
    delete result;
    delete dir;
  }
  static std::string path(const std::string& suffix) { return dir->file("tumor_007." + suffix); }

  static inline testing::TempDir* dir = nullptr;
  static inline const OutputOptions options{};
  static inline SlideResult* result = nullptr;
  static inline std::vector<std::string> paths;
};

TEST_F(SlideOutputs, FindsTheThreeBlobsInSizeOrder) {
  ASSERT_EQ(result->regions.size(), 3u);
  EXPECT_EQ(result->regions[0].size_class, SizeClass::macrometastasis);
  EXPECT_EQ(result->regions[0].holes.size(), 1u);
  EXPECT_NEAR(result->regions[0].area_mm2, (12 * 32 - 2) * 100.0 * 100.0 / 1e6, 1e-12);
  EXPECT_EQ(result->regions[1].size_class, SizeClass::micrometastasis);
  EXPECT_EQ(result->regions[2].size_class, SizeClass::isolated_tumour_cells);
}

TEST_F(SlideOutputs, WritesEveryOutputAndNothingElse) {
  // Every output but those written only when asked (dicom-seg).
  std::vector<std::string> expected;
  for (const auto& w : output_writers()) {
    if (!w.only_when_asked) expected.push_back(path(w.suffix));
  }
  EXPECT_EQ(paths, expected);
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir->path())) {
    ++files;
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(files, expected.size());
  EXPECT_EQ(io::read_heatmap(path("heatmap.h5")).prob.size(), result->heatmap.prob.size());
}

TEST_F(SlideOutputs, GeoJsonIsAQuPathFeatureCollection) {
  const json doc = json::parse(read_text(path("geojson")));
  EXPECT_EQ(doc["type"], "FeatureCollection");
  const json& features = doc["features"];
  ASSERT_EQ(features.size(), result->regions.size() + static_cast<std::size_t>(result->heatmap.scored_cells()));
  for (std::size_t k = 0; k < result->regions.size(); ++k) {
    const json& f = features[k];
    const Region& r = result->regions[k];
    EXPECT_EQ(f["type"], "Feature");
    EXPECT_EQ(f["geometry"]["type"], "Polygon");
    EXPECT_EQ(f["geometry"]["coordinates"].size(), 1 + r.holes.size());
    const json& p = f["properties"];
    EXPECT_EQ(p["objectType"], "annotation");
    EXPECT_EQ(p["classification"]["name"], "Tumor");
    EXPECT_EQ(p["classification"]["color"].size(), 3u);
    EXPECT_DOUBLE_EQ(p["measurements"]["Area mm^2"].get<double>(), r.area_mm2);
    EXPECT_DOUBLE_EQ(p["measurements"]["Longest diameter µm"].get<double>(), r.longest_diameter_um);
    EXPECT_NEAR(p["measurements"]["Max probability"].get<double>(), r.max_prob, 1e-6);
    EXPECT_NEAR(p["measurements"]["Mean probability"].get<double>(), r.mean_prob, 1e-6);
    for (const auto& ring : f["geometry"]["coordinates"]) {
      EXPECT_EQ(ring.front(), ring.back());  // GeoJSON closes rings
      for (const auto& point : ring) expect_inside_slide(result->heatmap, point[0], point[1]);
    }
  }
  // Tiles: detections with tumor_prob, in row-major order of the scored cells.
  std::size_t k = result->regions.size();
  for (int i = 0; i < result->heatmap.rows; ++i) {
    for (int j = 0; j < result->heatmap.cols; ++j) {
      const float p = result->heatmap.at(i, j);
      if (std::isnan(p)) continue;
      const json& f = features[k++];
      EXPECT_EQ(f["properties"]["objectType"], "detection");
      EXPECT_NEAR(f["properties"]["measurements"]["tumor_prob"].get<double>(), p, 1e-6);
      EXPECT_EQ(f["geometry"]["coordinates"][0][0], json::array({j * 100, i * 100}));
    }
  }

  // Tessera's own reader gets the regions back.
  const std::vector<io::Annotation> back = io::read_geojson(path("geojson"));
  ASSERT_EQ(back.size(), features.size());
  for (std::size_t r = 0; r < result->regions.size(); ++r) {
    EXPECT_EQ(back[r].group, "Tumor");
    EXPECT_EQ(back[r].outer, result->regions[r].outer);
    EXPECT_EQ(back[r].holes, result->regions[r].holes);
  }
}

TEST_F(SlideOutputs, AsapXmlReadsBackAsTumourPolygons) {
  const std::vector<io::Annotation> back = io::read_asap_xml(path("xml"));
  // One polygon per region, then its holes as "_2" (non-tumour inside tumour).
  std::size_t k = 0;
  for (const auto& r : result->regions) {
    ASSERT_LT(k, back.size());
    EXPECT_EQ(back[k].group, "Tumor");
    EXPECT_EQ(back[k].type, "Polygon");
    EXPECT_EQ(back[k].outer, r.outer);
    ++k;
    for (const auto& hole : r.holes) {
      ASSERT_LT(k, back.size());
      EXPECT_EQ(back[k].group, "_2");
      EXPECT_EQ(back[k].outer, hole);
      ++k;
    }
  }
  EXPECT_EQ(k, back.size());
  for (const auto& a : back) {
    for (const auto& p : a.outer) expect_inside_slide(result->heatmap, p.x, p.y);
  }
}

TEST_F(SlideOutputs, DetectionsCsvIsCamelyonFormat) {
  std::ifstream in(path("detections.csv"));
  std::string line;
  std::size_t n = 0;
  double previous = 2.0;
  while (std::getline(in, line)) {
    // prob,X,Y: a number and two integers, no header.
    double prob = 0;
    long long x = 0, y = 0;
    char c1 = 0, c2 = 0;
    std::istringstream fields(line);
    ASSERT_TRUE(fields >> prob >> c1 >> x >> c2 >> y) << line;
    EXPECT_EQ(c1, ',');
    EXPECT_EQ(c2, ',');
    EXPECT_TRUE(fields.eof() || fields.peek() == EOF) << line;
    ASSERT_LT(n, result->detections.size());
    EXPECT_NEAR(prob, result->detections[n].p, 1e-6);
    EXPECT_EQ(x, result->detections[n].x);
    EXPECT_EQ(y, result->detections[n].y);
    EXPECT_LE(prob, previous);
    previous = prob;
    EXPECT_GE(x, 0);
    EXPECT_LT(x, result->heatmap.slide_width);
    EXPECT_GE(y, 0);
    EXPECT_LT(y, result->heatmap.slide_height);
    ++n;
  }
  EXPECT_EQ(n, result->detections.size());
  EXPECT_GE(n, 3u);  // at least one per blob
}

TEST_F(SlideOutputs, ReportStatesAreasScoreAndRegions) {
  const json report = json::parse(read_text(path("report.json")));
  EXPECT_EQ(report["format"], "tessera-report");
  EXPECT_EQ(report["slide"]["id"], "tumor_007");
  EXPECT_EQ(report["slide"]["width"], 4000);
  EXPECT_EQ(report["model"]["checkpoint"], "/runs/demo/checkpoint.h5");
  EXPECT_EQ(report["model"]["tile_level0_px"], 100);
  EXPECT_EQ(report["model"]["step_level0_px"], 100);
  EXPECT_DOUBLE_EQ(report["model"]["tile_um"].get<double>(), 100.0);  // 100 px at 1 µm/px
  // No training provenance given (a checkpoint that records none): unknown, and no claim either way.
  EXPECT_EQ(report["model"]["training_data"], "unknown");
  EXPECT_TRUE(report["model"]["training_slides"].is_null());
  EXPECT_TRUE(report["model"]["training_shards"].is_null());
  EXPECT_TRUE(report.contains("caution") && report["caution"].is_null()) << report.dump(2);
  EXPECT_DOUBLE_EQ(report["threshold"].get<double>(), 0.5);
  EXPECT_NEAR(report["slide_score"].get<double>(), 0.93, 1e-4);
  EXPECT_EQ(report["tissue_area_source"], "tissue mask");
  EXPECT_DOUBLE_EQ(report["tissue_area_mm2"].get<double>(), 2.5);
  double total = 0.0;
  for (const auto& r : result->regions) total += r.area_mm2;
  EXPECT_NEAR(report["tumour_area_mm2"].get<double>(), total, 1e-6);
  EXPECT_EQ(report["largest_size_class"], "macrometastasis");
  EXPECT_EQ(report["regions_per_size_class"],
            json({{"isolated_tumour_cells", 1}, {"micrometastasis", 1}, {"macrometastasis", 1}}));
  EXPECT_EQ(report["detections"], result->detections.size());
  ASSERT_EQ(report["regions"].size(), 3u);
  const json& first = report["regions"][0];
  EXPECT_EQ(first["id"], 1);
  EXPECT_EQ(first["size_class"], "macrometastasis");
  EXPECT_NEAR(first["longest_diameter_um"].get<double>(), result->regions[0].longest_diameter_um, 0.05);
  EXPECT_EQ(first["tiles"], 12 * 32 - 2);
  for (const auto& r : report["regions"]) {
    expect_inside_slide(result->heatmap, r["centroid"][0], r["centroid"][1]);
    expect_inside_slide(result->heatmap, r["peak"][0], r["peak"][1]);
  }
}

TEST_F(SlideOutputs, OverlayHasTheLayoutSizeAndPaintsOnlyScoredCells) {
  const cv::Mat overlay = io::read_rgb_image(path("overlay.png"));
  const OverlayLayout layout = overlay_layout(result->thumbnail.size());
  ASSERT_EQ(overlay.size(), layout.canvas);
  EXPECT_TRUE(layout.caution.empty());
  EXPECT_TRUE(io::read_png_text(path("overlay.png")).empty()) << "no caution, no Warning text";
  EXPECT_GE(layout.canvas.width, result->thumbnail.cols);
  EXPECT_GT(layout.canvas.height, result->thumbnail.rows);
  const cv::Mat image = overlay(layout.image);
  // The thumbnail is 10 level-0 px per pixel: cells are 10 px squares. Row 0 is unscored: untouched.
  EXPECT_EQ(image.at<cv::Vec3b>(5, 200), result->thumbnail.at<cv::Vec3b>(5, 200));
  // Cell (10, 20) has P = 0.93: the colour map's colour at 0.93 over the pink, at opacity 0.12 + 0.68·0.93.
  const cv::Vec3b pink = result->thumbnail.at<cv::Vec3b>(0, 0);
  const cv::Vec3b colour = io::colormap_rgb(0.93, options.overlay.colormap);
  const double alpha = options.overlay.min_alpha + (options.overlay.max_alpha - options.overlay.min_alpha) * 0.93;
  const cv::Vec3b painted = image.at<cv::Vec3b>(105, 205);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(painted[c], (1 - alpha) * pink[c] + alpha * colour[c], 1.0) << c;
  // A low-probability cell is barely tinted.
  const cv::Vec3b low = image.at<cv::Vec3b>(255, 305);  // cell (25, 30)
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(low[c], pink[c], 0.2 * 255) << c;
}

// Whether `rgb` is the overlay's caution red (kCaution, antialiased edges aside).
bool caution_red(const cv::Vec3b& rgb) { return rgb[0] > 150 && rgb[1] < 90 && rgb[2] < 90; }

// A model trained only on synthetic slides, on a slide tessera synth did not make: report.json states the model's
// training data and the caution; the overlay gets a red band with it between the title and the picture (the
// picture itself unchanged) and carries it as the PNG's Warning text.
TEST(SlideOutputsCaution, ReportAndOverlayStateTheCaution) {
  testing::TempDir dir;
  OutputOptions options;
  options.outputs = {"overlay.png", "report.json"};
  SlideResult result = analyse_heatmap(blob_map(), options);
  result.thumbnail = cv::Mat(300, 400, CV_8UC3, cv::Scalar(236, 190, 215));
  result.training = io::TrainingProvenance{6, 0, 0, "/data/demo/shards"};
  result.caution = io::kSyntheticModelCaution;
  write_slide_outputs(dir.path().string(), result, options);

  const json report = json::parse(read_text(dir.file("tumor_007.report.json")));
  EXPECT_EQ(report["caution"], "model trained on synthetic slides \u2014 demonstration only");
  EXPECT_EQ(report["model"]["training_data"], "synthetic");
  EXPECT_EQ(report["model"]["training_slides"], json({{"synthetic", 6}, {"real", 0}, {"unknown", 0}}));
  EXPECT_EQ(report["model"]["training_shards"], "/data/demo/shards");

  const std::string png = dir.file("tumor_007.overlay.png");
  const auto text = io::read_png_text(png);
  ASSERT_EQ(text.count("Warning"), 1u);
  EXPECT_EQ(text.at("Warning"), io::kSyntheticModelCaution);
  const cv::Mat overlay = io::read_rgb_image(png);
  const OverlayLayout layout = overlay_layout(result.thumbnail.size(), /*caution=*/true);
  const OverlayLayout plain = overlay_layout(result.thumbnail.size());
  ASSERT_EQ(overlay.size(), layout.canvas);
  ASSERT_FALSE(layout.caution.empty());
  EXPECT_EQ(layout.canvas.height, plain.canvas.height + layout.caution.height);
  EXPECT_EQ(layout.image.y, plain.image.y + layout.caution.height);
  EXPECT_EQ(layout.caution.y + layout.caution.height, layout.image.y);

  // The caution is drawn in red in its band; the title above it stays as it was (no red). (The legend's colour bar
  // below holds inferno's reds, so the rest of the canvas is not the place to look.)
  int red_in_band = 0, red_in_title = 0;
  for (int y = 0; y < layout.image.y; ++y) {
    for (int x = 0; x < overlay.cols; ++x) {
      if (!caution_red(overlay.at<cv::Vec3b>(y, x))) continue;
      (layout.caution.contains(cv::Point(x, y)) ? red_in_band : red_in_title) += 1;
    }
  }
  EXPECT_GT(red_in_band, 500) << "the caution's text";
  EXPECT_EQ(red_in_title, 0);
  // The text spans most of the band's width at this size, em dash included (drawn, as Hershey fonts have no "—").
  int rightmost = 0;
  for (int y = layout.caution.y; y < layout.caution.y + layout.caution.height; ++y) {
    for (int x = 0; x < overlay.cols; ++x) {
      if (caution_red(overlay.at<cv::Vec3b>(y, x))) rightmost = std::max(rightmost, x);
    }
  }
  EXPECT_GT(rightmost, overlay.cols / 3);

  // Beneath the band, the same picture as without the caution.
  const cv::Mat without = render_overlay(result.heatmap, result.regions, result.thumbnail, options);
  const cv::Mat difference = overlay(layout.image) != without(plain.image);
  EXPECT_EQ(cv::countNonZero(difference.reshape(1)), 0);
}

// region_artefacts() fills and dilates each outline within its own box: it names exactly the masks the outline,
// filled on a plane the masks' size and dilated by one pixel, overlaps, for outlines inside, across the edges of and
// outside the masks, and masks touched only through the dilation.
TEST(SlideOutputsQc, RegionArtefactsMatchTheWholePlaneFill) {
  cv::RNG rng(19);
  QcOutcome qc;
  qc.ran = true;
  qc.downsample = 4.0;
  const cv::Size size(60, 40);
  for (int m = 0; m < 6; ++m) {
    cv::Mat1b mask = cv::Mat1b::zeros(size);
    for (int dot = 0; dot < 3; ++dot) mask(rng.uniform(0, size.height), rng.uniform(0, size.width)) = 255;
    qc.masks.emplace_back("mask " + std::to_string(m), mask);
  }
  int named = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Region region;
    const int corners = rng.uniform(3, 7);
    for (int k = 0; k < corners; ++k) {
      region.outer.emplace_back(rng.uniform(-40.0, 4.0 * size.width + 40.0),
                                rng.uniform(-40.0, 4.0 * size.height + 40.0));
    }
    const double scale = rng.uniform(0.05, 1.0);  // small outlines as well as ones across the whole plane
    for (auto& p : region.outer) p = region.outer.front() + (p - region.outer.front()) * scale;
    cv::Mat1b shape = cv::Mat1b::zeros(size);
    std::vector<cv::Point> ring;
    for (const auto& p : region.outer) {
      ring.emplace_back(static_cast<int>(std::lround(p.x / qc.downsample)),
                        static_cast<int>(std::lround(p.y / qc.downsample)));
    }
    cv::fillPoly(shape, std::vector<std::vector<cv::Point>>{ring}, cv::Scalar(255));
    cv::dilate(shape, shape, cv::getStructuringElement(cv::MORPH_RECT, cv::Size(3, 3)));
    std::vector<std::string> expected;
    for (const auto& [name, mask] : qc.masks) {
      if (cv::countNonZero(mask & shape) > 0) expected.push_back(name);
    }
    EXPECT_EQ(region_artefacts(region, qc), expected) << "trial " << trial;
    named += static_cast<int>(expected.size());
  }
  EXPECT_GT(named, 100);  // the outlines do touch masks
}

// What QC found: report.json states the areas, flags and classes; a region whose outline touches a class's mask names
// it (with its action) and is kept; a region away from every mask names none; without QC, qc is null.
TEST(SlideOutputsQc, ReportAndOverlayStateTheQcAreasAndRegionsNameTheArtefactsTheyTouch) {
  const OutputOptions options{};
  SlideResult result = analyse_heatmap(blob_map(), options);
  ASSERT_EQ(result.regions.size(), 3u);
  const json plain = json::parse(report_json(result, options));
  EXPECT_TRUE(plain.contains("qc") && plain["qc"].is_null());
  for (const auto& r : plain["regions"]) EXPECT_EQ(r["artefacts"], json::array());

  // Masks at 10 level-0 px per pixel (400×300): a fold just right of the micrometastasis (level-0 x 600..1100,
  // y 2000..2500) and a blur patch in the unscored margin, away from every region.
  QcOutcome& qc = result.qc;
  qc.ran = true;
  qc.downsample = 10.0;
  cv::Mat1b fold = cv::Mat1b::zeros(300, 400), blur = cv::Mat1b::zeros(300, 400);
  fold(cv::Rect(110, 215, 30, 20)).setTo(255);
  blur(cv::Rect(300, 275, 30, 15)).setTo(255);
  qc.masks = {{"fold (exclude)", fold}, {"blur (flag)", blur}};
  qc.excluded = fold;
  qc.flagged = blur;
  qc.excluded_mm2 = 0.06;
  qc.flagged_mm2 = 0.045;
  qc.excluded_cells = 4;
  qc.classes = {{"fold", "exclude", 0.06, 0.024}, {"blur", "flag", 0.045, 0.018}};
  qc.flags = {"too little tissue (0.5 mm2)"};
  const json report = json::parse(report_json(result, options));
  ASSERT_TRUE(report["qc"].is_object());
  EXPECT_DOUBLE_EQ(report["qc"]["excluded_area_mm2"].get<double>(), 0.06);
  EXPECT_DOUBLE_EQ(report["qc"]["flagged_area_mm2"].get<double>(), 0.045);
  EXPECT_EQ(report["qc"]["excluded_cells"], 4);
  EXPECT_EQ(report["qc"]["flags"], json::array({"too little tissue (0.5 mm2)"}));
  ASSERT_EQ(report["qc"]["classes"].size(), 2u);
  EXPECT_EQ(report["qc"]["classes"][0]["action"], "exclude");
  ASSERT_EQ(report["regions"].size(), 3u);
  for (const auto& r : report["regions"]) {
    if (r["size_class"] == "micrometastasis") {
      EXPECT_EQ(r["artefacts"], json::array({"fold (exclude)"})) << r.dump();
    } else {
      EXPECT_EQ(r["artefacts"], json::array()) << r.dump();
    }
  }

  // The overlay outlines the areas (it differs from the one without QC only there) and states them as PNG text.
  result.thumbnail = cv::Mat(300, 400, CV_8UC3, cv::Scalar(236, 190, 215));
  const cv::Mat with = render_overlay(result.heatmap, result.regions, result.thumbnail, options, "", &qc);
  const cv::Mat without = render_overlay(result.heatmap, result.regions, result.thumbnail, options);
  ASSERT_EQ(with.size(), without.size());
  cv::Mat difference;
  cv::absdiff(with, without, difference);
  cv::Mat grey;
  cv::cvtColor(difference, grey, cv::COLOR_RGB2GRAY);
  EXPECT_GT(cv::countNonZero(grey), 50);
  testing::TempDir dir;
  write_overlay_png(dir.file("o.png"), result.heatmap, result.regions, result.thumbnail, options, "", &qc);
  const auto text = io::read_png_text(dir.file("o.png"));
  ASSERT_TRUE(text.contains("QC"));
  EXPECT_NE(text.at("QC").find("fold exclude"), std::string::npos) << text.at("QC");
}

TEST(SlideOutputsEdgeCases, AMapWithoutTissueStillGivesEveryOutput) {
  testing::TempDir dir;
  io::Heatmap h = blob_map();
  std::fill(h.prob.begin(), h.prob.end(), kNaN);
  OutputOptions options;
  SlideResult result = analyse_heatmap(h, options);
  EXPECT_TRUE(result.regions.empty());
  EXPECT_TRUE(result.detections.empty());
  // No thumbnail: the map is drawn on white.
  const std::vector<std::string> paths = write_slide_outputs(dir.path().string(), result, options);
  EXPECT_EQ(paths.size(), static_cast<std::size_t>(std::count_if(output_writers().begin(), output_writers().end(),
                                                                 [](const auto& w) { return !w.only_when_asked; })));
  const json report = json::parse(read_text(dir.file("tumor_007.report.json")));
  EXPECT_TRUE(report["slide_score"].is_null());
  EXPECT_EQ(report["largest_size_class"], "none");
  EXPECT_EQ(report["tissue_area_source"], "scored tiles");
  EXPECT_EQ(report["tissue_area_mm2"], 0.0);
  EXPECT_TRUE(report["regions"].empty());
  EXPECT_EQ(read_text(dir.file("tumor_007.detections.csv")), "");
  EXPECT_TRUE(io::read_asap_xml(dir.file("tumor_007.xml")).empty());
  const cv::Mat overlay = io::read_rgb_image(dir.file("tumor_007.overlay.png"));
  EXPECT_EQ(overlay.size(), overlay_layout(cv::Size(2048, 1536)).canvas);
}

TEST(SlideOutputsEdgeCases, SelectedOutputsOnlyAndUnknownNamesListTheKnownOnes) {
  testing::TempDir dir;
  OutputOptions options;
  options.outputs = {"report.json", "xml"};
  const SlideResult result = analyse_heatmap(blob_map(), options);
  const std::vector<std::string> paths = write_slide_outputs(dir.path().string(), result, options);
  // Registry order, whatever the order asked.
  EXPECT_EQ(paths, (std::vector<std::string>{dir.file("tumor_007.xml"), dir.file("tumor_007.report.json")}));
  options.outputs = {"report.json", "pdf"};
  try {
    write_slide_outputs(dir.path().string(), result, options);
    FAIL();
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown output 'pdf'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(output_writer_names()), std::string::npos) << e.what();
  }
  EXPECT_NE(find_output_writer("heatmap.tif"), nullptr);
  EXPECT_EQ(find_output_writer("tif"), nullptr);
}

TEST(SlideOutputsEdgeCases, AFailingOutputNamesItselfAndTheSlide) {
  testing::TempDir dir;
  OutputOptions options;
  const SlideResult result = analyse_heatmap(blob_map(), options);
  try {
    write_slide_outputs(dir.file("no-such-folder"), result, options);
    FAIL();
  } catch (const core::Error& e) {
    EXPECT_EQ(e.context("output"), "heatmap.h5") << e.what();
    EXPECT_EQ(e.context("slide"), "tumor_007") << e.what();
  }
}

}  // namespace
}  // namespace tessera::analysis
