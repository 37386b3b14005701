// `tessera evaluate` end to end on synthetic slides: a hand-made ground truth with hand-computed FROC and AUCs, the
// synth data set with detections placed on its own tumours, and failures (a broken annotation fails alone, missing
// detection files are counted as none and listed, bad usage is refused).
//
// Mask geometry as in tests/analysis/test_evaluation.cpp: synth slides are 0.25 µm/px, so a mask pixel is 32 level-0
// pixels (8 µm) and lesion borders grow by 4 mask pixels (32 µm; the 5th pixel, 40 µm out, stays outside).
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "io/annotations.h"
#include "io/image.h"
#include "io/slide.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;

constexpr double kPx = 32.0;  // level-0 pixels per mask pixel at 0.25 µm/px
constexpr double kMpp = 0.25;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<std::vector<std::string>> read_csv(const fs::path& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> row;
    std::stringstream fields(line);
    for (std::string field; std::getline(fields, field, ',');) row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

// A rectangle annotation covering mask pixels [c0, c1) × [r0, r1).
io::Annotation cells(int c0, int r0, int c1, int r1, std::string group) {
  io::Annotation a;
  a.name = "r";
  a.group = std::move(group);  // moved, not copied: GCC 12 reports a false -Wrestrict on the inlined copy at -O2
  a.outer = {{c0 * kPx, r0 * kPx}, {c1 * kPx, r0 * kPx}, {c1 * kPx, r1 * kPx}, {c0 * kPx, r1 * kPx}};
  return a;
}

double centre(int c) { return (c + 0.5) * kPx; }

void write_detections(const fs::path& path, const std::vector<std::array<double, 3>>& rows) {
  std::ofstream out(path);
  for (const auto& [p, x, y] : rows) out << p << "," << x << "," << y << "\n";
}

// The part of tessera infer's report.json that evaluate reads.
void write_report(const fs::path& path, double score) {
  std::ofstream(path) << json{{"format", "tessera-report"}, {"slide_score", score}}.dump() << "\n";
}

// Four synthetic slides (two tumour, two normal), 4096 px square at 0.25 µm/px, made once.
class Evaluate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const auto r = run("synth --out " + dir_->file("synth") +
                       " --slides 4 --size 4096 --seed 21 --set preview.enabled=false --set tumour.max_regions=3"
                       " --set split.train=0.5 --set split.val=0");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path synth() { return dir_->file("synth"); }
  // synth's dataset rows: id → fields.
  static std::map<std::string, std::vector<std::string>> dataset() {
    std::map<std::string, std::vector<std::string>> rows;
    const auto csv = read_csv(synth() / "dataset.csv");
    for (std::size_t i = 1; i < csv.size(); ++i) rows[csv[i][0]] = csv[i];
    return rows;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Evaluate::dir_ = nullptr;

TEST_F(Evaluate, HandMadeGroundTruthGivesHandComputedScores) {
  testing::TempDir work;
  const fs::path root = work.path();
  const auto rows = dataset();
  const fs::path tumour_slide = synth() / rows.at("tumor_001")[1];
  const fs::path normal_slide = synth() / rows.at("normal_001")[1];

  // s1: lesion A (32×32 mask px), lesion B whose right part is excluded (ASAP _2), and a 12×12 ITC.
  io::write_asap_xml((root / "s1.xml").string(), {cells(10, 10, 42, 42, "_0"), cells(60, 10, 92, 42, "_0"),
                                                  cells(80, 10, 92, 42, "_2"), cells(100, 60, 112, 72, "_1")});
  // s2: one lesion, as QuPath GeoJSON.
  io::write_geojson((root / "s2.geojson").string(), {cells(10, 10, 42, 42, "Tumor")});
  std::ofstream(root / "gt.csv") << "slide_id,slide,label,annotation_xml,annotation_geojson,split\n"
                                 << "s1," << tumour_slide.string() << ",tumor,s1.xml,,test\n"
                                 << "s2," << tumour_slide.string() << ",tumor,,s2.geojson,test\n"
                                 << "s3," << normal_slide.string() << ",normal,,,test\n"
                                 << "s4," << normal_slide.string() << ",normal,,,test\n"
                                 << "s5," << normal_slide.string() << ",normal,,,train\n";

  fs::create_directories(root / "det");
  write_detections(root / "det/s1.detections.csv",
                   {{{0.9, centre(20), centre(20)},       // A
                     {0.7, centre(30), centre(30)},       // A again: ignored
                     {0.95, centre(105), centre(65)},     // ITC: neither true nor false positive
                     {0.8, centre(90), centre(25)},       // excluded part of B, 7 px beyond its remaining part: FP
                     {0.3, centre(110), centre(110)}}});  // FP; B is missed
  write_detections(root / "det/s2.detections.csv",
                   {{{0.6, 42 * kPx + 30 / kMpp, centre(25)},  // 30 µm right of the lesion: a hit
                     {0.6, centre(100), centre(100)}}});       // FP
  write_detections(root / "det/s3.detections.csv", {{{0.5, centre(20), centre(20)}, {0.4, centre(100), centre(50)}}});
  // s4: no detections file (counted as none). Reports: s1 0.9, s2 0.4, s3 0.5, s4 0.2.
  write_report(root / "det/s1.report.json", 0.9);
  write_report(root / "det/s2.report.json", 0.4);
  write_report(root / "det/s3.report.json", 0.5);
  write_report(root / "det/s4.report.json", 0.2);
  // Patch predictions: positives 0.8, 0.4; negatives 0.3, 0.5, 0.35 → 5 of 6 pairs ordered: AUC 5/6. The row of
  // slide s5 (split train) and of an unknown slide are not evaluated.
  std::ofstream(root / "preds.csv") << "slide_id,x,y,label,p_tumor\n"
                                    << "s1,0,0,1,0.8\ns1,256,0,0,0.3\ns2,0,0,1,0.4\ns3,0,0,0,0.5\ns4,0,0,0,0.35\n"
                                    << "s5,0,0,1,0.01\nzz,0,0,1,0.1\n";

  const auto r =
      run("evaluate --dataset " + (root / "gt.csv").string() + " --detections " + (root / "det").string() +
          " --predictions " + (root / "preds.csv").string() + " --splits test --out " + (root / "out").string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;

  // Hand computation (4 slides, 3 countable lesions): lesion probabilities 0.9, 0, 0.6; false positives 0.8, 0.3,
  // 0.6, 0.5, 0.4. Thresholds 0.3 0.4 0.5 0.6 0.8 0.9 give FPs/slide 5/4 1 3/4 1/2 1/4 0 and sensitivity
  // 2/3 2/3 2/3 2/3 1/3 1/3. At 1/4 FP/slide the first point is (1/4, 1/3); from 1/2 on, 2/3: score
  // (1/3 + 5 · 2/3) / 6 = 11/18, interpolated the same.
  const json j = read_json(root / "out/evaluation.json");
  EXPECT_EQ(j["slides"], 4);
  EXPECT_EQ(j["evaluated_slides"], 4);
  const json& froc = j["froc"];
  EXPECT_NEAR(froc["score"].get<double>(), 11.0 / 18.0, 1e-12);
  EXPECT_NEAR(froc["score_interpolated"].get<double>(), 11.0 / 18.0, 1e-12);
  EXPECT_EQ(froc["lesions"], 3);
  EXPECT_EQ(froc["itc_lesions"], 1);
  EXPECT_EQ(froc["detected_lesions"], 2);
  EXPECT_EQ(froc["false_positives"], 5);
  ASSERT_EQ(froc["curve"].size(), 7u);
  EXPECT_NEAR(froc["curve"][0]["fps_per_slide"].get<double>(), 1.25, 1e-12);
  EXPECT_NEAR(froc["curve"][0]["sensitivity"].get<double>(), 2.0 / 3.0, 1e-12);
  EXPECT_TRUE(froc["curve"][6]["threshold"].is_null());
  const std::vector<double> expected = {1.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3};
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_NEAR(froc["operating_points"][k]["sensitivity"].get<double>(), expected[k], 1e-12) << k;
  }
  EXPECT_EQ(froc["rules"]["border_growth_um"], 37.5);
  EXPECT_EQ(froc["rules"]["itc_major_axis_um"], 275.0);

  std::map<std::string, json> slide;
  for (const auto& s : j["per_slide"]) slide[s["slide_id"]] = s;
  EXPECT_EQ(slide["s1"]["lesions"], 2);
  EXPECT_EQ(slide["s1"]["itc_lesions"], 1);
  EXPECT_EQ(slide["s1"]["true_positives"], 1);
  EXPECT_EQ(slide["s1"]["false_positives"], 2);
  EXPECT_EQ(slide["s1"]["itc_hits"], 1);
  EXPECT_EQ(slide["s1"]["repeat_hits"], 1);
  EXPECT_NEAR(slide["s1"]["mpp"].get<double>(), 0.25, 1e-9);
  ASSERT_EQ(slide["s1"]["lesion_list"].size(), 3u);
  EXPECT_EQ(slide["s1"]["lesion_list"][0]["p"], 0.9);
  EXPECT_EQ(slide["s1"]["lesion_list"][1]["p"], 0.0);
  EXPECT_TRUE(slide["s1"]["lesion_list"][2]["itc"].get<bool>());
  // Lesion A: mask pixels 6..45 (grown by 4) → level-0 box from 192, 40 pixels of 32 wide.
  EXPECT_EQ(slide["s1"]["lesion_list"][0]["box"], (json{192.0, 192.0, 1280.0, 1280.0}));
  EXPECT_EQ(slide["s2"]["true_positives"], 1);
  EXPECT_EQ(slide["s2"]["false_positives"], 1);
  EXPECT_EQ(slide["s3"]["false_positives"], 2);
  EXPECT_EQ(slide["s4"]["detections"], 0);
  EXPECT_TRUE(slide["s4"]["detections_file"].is_null());
  EXPECT_EQ(j["missing_detections"], (json{"s4"}));
  EXPECT_TRUE(j["failed"].empty());

  // Slide AUC: tumour 0.9, 0.4 against normal 0.5, 0.2 → 3 of 4 pairs. Patch AUC 5/6 over 5 tiles.
  EXPECT_NEAR(j["slide_auc"].get<double>(), 0.75, 1e-12);
  EXPECT_EQ(j["slide_roc"].size(), 5u);
  EXPECT_NEAR(j["patch"]["auc"].get<double>(), 5.0 / 6.0, 1e-6);
  EXPECT_EQ(j["patch"]["tiles"], 5);
  EXPECT_EQ(j["patch"]["rows_of_other_slides"], 2);

  for (const char* png : {"froc.png", "roc.png"}) {
    const cv::Mat image = io::read_rgb_image((root / "out" / png).string());
    EXPECT_EQ(image.cols, 960) << png;
    EXPECT_EQ(image.rows, 720) << png;
  }
  EXPECT_TRUE(contains(r.out, "FROC 0.6111")) << r.out;
  EXPECT_TRUE(contains(r.out, "slide AUC 0.7500")) << r.out;
  EXPECT_TRUE(contains(r.out, "patch AUC 0.8333")) << r.out;
  EXPECT_TRUE(contains(r.out, "no detections file (counted as none): s4")) << r.out;
}

// A point inside `a` (≥ 12 µm from its border, so that its 8 µm mask pixel is tumour) and well outside every exclusion
// polygon, or none.
std::optional<cv::Point2d> inside_point(const io::Annotation& a, const std::vector<io::Annotation>& exclusions) {
  const auto contour = [](const io::Ring& ring) {
    std::vector<cv::Point2f> c;
    for (const auto& p : ring) c.emplace_back(static_cast<float>(p.x), static_cast<float>(p.y));
    return c;
  };
  const auto outer = contour(a.outer);
  const cv::Rect2d box = io::bounding_box(a.outer);
  constexpr double kMargin = 12 / kMpp;
  for (double y = box.y; y < box.y + box.height; y += 16) {
    for (double x = box.x; x < box.x + box.width; x += 16) {
      const cv::Point2f p(static_cast<float>(x), static_cast<float>(y));
      if (cv::pointPolygonTest(outer, p, true) < kMargin) continue;
      bool clear = true;
      for (const auto& e : exclusions) clear = clear && cv::pointPolygonTest(contour(e.outer), p, true) < -kMargin;
      if (clear) return cv::Point2d(x, y);
    }
  }
  return std::nullopt;
}

// synth's own dataset.csv, a detection inside every tumour region at 0.9 and one false positive far from any tumour
// at 0.2 per slide: every countable lesion is found before any false positive, so the FROC score is 1.
TEST_F(Evaluate, SynthDatasetWithDetectionsOnItsTumours) {
  testing::TempDir work;
  const fs::path det = work.path() / "det";
  fs::create_directories(det);
  int placed_false_positives = 0;
  int tumour_regions = 0;
  for (const auto& [id, row] : dataset()) {
    const auto annotations = io::read_annotations((synth() / row[3]).string());
    std::vector<io::Annotation> tumour, exclusion;
    for (const auto& a : annotations) (a.group == "_2" ? exclusion : tumour).push_back(a);
    std::vector<std::array<double, 3>> rows;
    for (const auto& a : tumour) {
      const auto p = inside_point(a, exclusion);
      if (p) rows.push_back({0.9, p->x, p->y});
      ++tumour_regions;
    }
    // A corner of the slide farther than 300 µm from every tumour region.
    for (const cv::Point2d corner :
         {cv::Point2d(100, 100), cv::Point2d(3990, 100), cv::Point2d(100, 3990), cv::Point2d(3990, 3990)}) {
      bool far = true;
      for (const auto& a : tumour) {
        std::vector<cv::Point2f> c;
        for (const auto& q : a.outer) c.emplace_back(static_cast<float>(q.x), static_cast<float>(q.y));
        far = far && cv::pointPolygonTest(c, cv::Point2f(static_cast<float>(corner.x), static_cast<float>(corner.y)),
                                          true) < -300 / kMpp;
      }
      if (far) {
        rows.push_back({0.2, corner.x, corner.y});
        ++placed_false_positives;
        break;
      }
    }
    write_detections(det / (id + ".detections.csv"), rows);
    write_report(det / (id + ".report.json"), row[2] == "tumor" ? 0.8 : 0.3);
  }
  ASSERT_GT(tumour_regions, 0);

  const auto r = run("evaluate --dataset " + (synth() / "dataset.csv").string() + " --detections " + det.string() +
                     " --out " + (work.path() / "out").string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const json j = read_json(work.path() / "out/evaluation.json");
  EXPECT_EQ(j["evaluated_slides"], 4);
  const json& froc = j["froc"];
  EXPECT_EQ(froc["detected_lesions"], froc["lesions"]);
  EXPECT_GE(froc["lesions"].get<int>() + froc["itc_lesions"].get<int>(), 1);
  EXPECT_EQ(froc["false_positives"], placed_false_positives);
  if (froc["lesions"].get<int>() > 0) {
    EXPECT_EQ(froc["score"], 1.0);
  }
  EXPECT_EQ(j["slide_auc"], 1.0);
  for (const auto& s : j["per_slide"]) {
    EXPECT_EQ(s["true_positives"], s["lesions"]) << s["slide_id"];
    if (s["label"] == "normal") {
      EXPECT_EQ(s["lesions"], 0);
      EXPECT_EQ(s["false_positives"], s["detections"]);
    }
  }
  EXPECT_TRUE(j["missing_detections"].empty());

  // Only the train split: the two train slides.
  const auto train = run("evaluate --dataset " + (synth() / "dataset.csv").string() + " --detections " + det.string() +
                         " --splits train --out " + (work.path() / "train").string());
  ASSERT_EQ(train.code, 0) << train.err;
  EXPECT_EQ(read_json(work.path() / "train/evaluation.json")["evaluated_slides"], 2);
}

TEST_F(Evaluate, BrokenAnnotationFailsAloneMissingFilesAreListedAndBadUsageIsRefused) {
  testing::TempDir work;
  const fs::path root = work.path();
  // synth's dataset with absolute paths, one tumour slide's annotation truncated.
  const auto csv = read_csv(synth() / "dataset.csv");
  std::ofstream out(root / "gt.csv");
  out << "slide_id,slide,label,annotation_xml,split\n";
  std::string broken_id;
  for (std::size_t i = 1; i < csv.size(); ++i) {
    std::string annotation = (synth() / csv[i][3]).string();
    if (csv[i][2] == "tumor" && broken_id.empty()) {
      broken_id = csv[i][0];
      annotation = (root / "broken.xml").string();
      std::ofstream(annotation) << "<ASAP_Annotations><Annotations><Annotation Name=\"a\" Type=\"Polygon\"";
    }
    out << csv[i][0] << "," << (synth() / csv[i][1]).string() << "," << csv[i][2] << "," << annotation << ","
        << csv[i][5] << "\n";
  }
  out.close();
  fs::create_directories(root / "det");  // empty: every slide lacks detections

  const auto r = run("evaluate --dataset " + (root / "gt.csv").string() + " --detections " + (root / "det").string() +
                     " --out " + (root / "out").string());
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, (root / "broken.xml").string())) << r.err;
  EXPECT_TRUE(contains(r.out, "FAILED " + broken_id)) << r.out;
  const json j = read_json(root / "out/evaluation.json");
  EXPECT_EQ(j["evaluated_slides"], 3);
  ASSERT_EQ(j["failed"].size(), 1u);
  EXPECT_EQ(j["failed"][0]["slide"], broken_id);
  EXPECT_TRUE(contains(j["failed"][0]["error"].get<std::string>(), "broken.xml"));
  EXPECT_EQ(j["missing_detections"].size(), 3u);
  EXPECT_EQ(j["froc"]["false_positives"], 0);
  EXPECT_TRUE(j["slide_auc"].is_null()) << "no report anywhere";

  // Usage: no dataset, nothing to evaluate, a detections folder that does not exist.
  EXPECT_EQ(run("evaluate --detections " + (root / "det").string()).code, 2);
  EXPECT_EQ(run("evaluate --dataset " + (root / "gt.csv").string()).code, 2);
  const auto missing = run("evaluate --dataset " + (root / "gt.csv").string() + " --detections " +
                           (root / "nowhere").string() + " --out " + (root / "out2").string());
  EXPECT_EQ(missing.code, 3);
  EXPECT_TRUE(contains(missing.err, "nowhere")) << missing.err;
}

TEST_F(Evaluate, TumourGroundTruthThatLabelsNothingFailsTheSlide) {
  testing::TempDir work;
  const fs::path root = work.path();
  const auto rows = dataset();
  const fs::path tumour_slide = synth() / rows.at("tumor_001")[1];
  const fs::path normal_slide = synth() / rows.at("normal_001")[1];
  // s1's lesion is drawn in a group that is no tumour class: as it is, every detection on it would be a false
  // positive of a slide with no lesion.
  io::write_asap_xml((root / "s1.xml").string(), {cells(10, 10, 42, 42, "metastasis")});
  std::ofstream(root / "gt.csv") << "slide_id,slide,label,annotation\n"
                                 << "s1," << tumour_slide.string() << ",Tumour,s1.xml\n"
                                 << "s2," << normal_slide.string() << ",normal,\n";
  fs::create_directories(root / "det");
  write_detections(root / "det/s1.detections.csv", {{{0.9, centre(20), centre(20)}}});
  write_detections(root / "det/s2.detections.csv", {{{0.5, centre(20), centre(20)}}});

  const std::string args =
      "evaluate --dataset " + (root / "gt.csv").string() + " --detections " + (root / "det").string() + " --out ";
  const auto r = run(args + (root / "out").string());
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, (root / "s1.xml").string())) << r.err;
  EXPECT_TRUE(contains(r.err, "tumour classes (classes.tumour)")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'metastases' for 'metastasis'?")) << r.err;
  const json j = read_json(root / "out/evaluation.json");
  ASSERT_EQ(j["failed"].size(), 1u);
  EXPECT_EQ(j["failed"][0]["slide"], "s1");
  EXPECT_EQ(j["evaluated_slides"], 1);

  // With the group configured as tumour, s1's detection hits its lesion.
  const auto fixed = run(args + (root / "out2").string() + " --set 'classes.tumour=[metastasis]'");
  EXPECT_EQ(fixed.code, 0) << fixed.out << fixed.err;
  const json k = read_json(root / "out2/evaluation.json");
  EXPECT_EQ(k["evaluated_slides"], 2);
  EXPECT_EQ(k["froc"]["false_positives"], 1) << "only s2's detection";

  // A label that is neither tumor nor normal stops the job before any slide, naming the line and column.
  std::ofstream(root / "gt.csv") << "slide_id,slide,label,annotation\n"
                                 << "s1," << tumour_slide.string() << ",tumor,s1.xml\n"
                                 << "s2," << normal_slide.string() << ",nromal,\n";
  const auto bad = run(args + (root / "out3").string());
  EXPECT_EQ(bad.code, 3) << bad.err;
  EXPECT_TRUE(contains(bad.err, "gt.csv")) << bad.err;
  EXPECT_TRUE(contains(bad.err, "line 3, column 'label': 'nromal' is not tumor or normal; did you mean 'normal'?"))
      << bad.err;
}

}  // namespace
}  // namespace tessera
