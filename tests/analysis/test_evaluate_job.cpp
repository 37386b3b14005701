// The evaluation job (analysis/evaluate_job.h) on small inputs written to a temporary folder: a dataset.csv whose
// tumour slides have no slide file (the mpp column gives the resolution), ASAP annotations, detections CSVs and
// report.json files. Checks what the end-to-end tests of `tessera evaluate` do not reach: the places a slide's
// files are looked for, each broken input failing its slide alone, missing reports and the slide AUC, the patch
// AUC and every predictions error, the splits and dataset errors, the checks made before any work, the FROC
// settings and class rules reaching the mask, a slide file giving the resolution and clipping the mask, the summary
// text, and what the charts draw.
//
// Geometry as in test_evaluation.cpp: 0.25 µm/px, so a mask pixel is 32 level-0 pixels (8 µm) and lesion borders
// grow by 4 mask pixels.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analysis/evaluate_job.h"
#include "core/error.h"
#include "io/annotations.h"
#include "io/qc_masks.h"
#include "tests/testing/testing.h"

namespace tessera::analysis {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kPx = 32.0;  // level-0 pixels per mask pixel at 0.25 µm/px

// A rectangle annotation covering mask pixels [c0, c1) × [r0, r1) (unnamed: the writers take an empty name).
io::Annotation cells(int c0, int r0, int c1, int r1, std::string group) {
  io::Annotation a;
  a.group = std::move(group);  // moved, not copied: GCC 12 reports a false -Wrestrict on the inlined copy at -O2
  a.outer = {{c0 * kPx, r0 * kPx}, {c1 * kPx, r0 * kPx}, {c1 * kPx, r1 * kPx}, {c0 * kPx, r1 * kPx}};
  return a;
}

double centre(int c) { return (c + 0.5) * kPx; }

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

void write_detections(const fs::path& path, const std::vector<std::array<double, 3>>& rows) {
  std::ostringstream text;
  for (const auto& [p, x, y] : rows) text << p << "," << x << "," << y << "\n";
  write_text(path, text.str());
}

void write_report(const fs::path& path, double score) {
  write_text(path, json{{"format", "tessera-report"}, {"slide_score", score}}.dump() + "\n");
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The pixels of `image` (RGB) that are exactly `rgb`.
int count_colour(const cv::Mat& image, const cv::Scalar& rgb) {
  const cv::Vec3b want(static_cast<std::uint8_t>(rgb[0]), static_cast<std::uint8_t>(rgb[1]),
                       static_cast<std::uint8_t>(rgb[2]));
  int n = 0;
  for (int y = 0; y < image.rows; ++y) {
    for (int x = 0; x < image.cols; ++x) n += image.at<cv::Vec3b>(y, x) == want ? 1 : 0;
  }
  return n;
}

// The colours evaluate_job.cpp draws with: the slide (and FROC) curve, the patch curve, the FROC's score markers.
const cv::Scalar kRed(200, 30, 45);
const cv::Scalar kBlue(30, 90, 190);
const cv::Scalar kMarker(250, 190, 40);

class EvaluateJobTest : public ::testing::Test {
 protected:
  fs::path root() const { return dir_.path(); }
  fs::path det() const { return root() / "det"; }

  // dataset.csv with the header slide_id,slide,label,annotation,mpp,split and the given rows.
  void write_dataset(const std::string& rows) const {
    write_text(root() / "dataset.csv", "slide_id,slide,label,annotation,mpp,split\n" + rows);
  }

  EvaluateJob job() const {
    EvaluateJob j;
    j.dataset = (root() / "dataset.csv").string();
    j.detections = det().string();
    j.output = (root() / "out").string();
    j.source = "job.yaml";
    return j;
  }

 private:
  testing::TempDir dir_;
};

TEST_F(EvaluateJobTest, ScoresTheSlidesOfTheSplitsWithoutSlideFiles) {
  // t1: lesions A and B; detections on A (0.9) and far from both (0.4). n1: one false positive (0.6), its files in
  // its own folder. n2 is in another split. Reports t1 0.8, n1 0.3.
  io::write_asap_xml((root() / "t1.xml").string(), {cells(10, 10, 42, 42, "_0"), cells(60, 10, 92, 42, "_0")});
  write_dataset("t1,,tumor,t1.xml,0.25,test\nn1,,normal,,,test\nn2,,normal,,,train\n");
  write_detections(det() / "t1.detections.csv", {{{0.9, centre(20), centre(20)}, {0.4, centre(150), centre(150)}}});
  write_detections(det() / "n1/n1.detections.csv", {{{0.6, centre(20), centre(20)}}});
  write_report(det() / "t1.report.json", 0.8);
  write_report(det() / "n1/n1.report.json", 0.3);
  EvaluateJob j = job();
  j.splits = {"test"};

  const EvaluateResult r = run_evaluation(j);
  EXPECT_EQ(r.slides, 2u);
  ASSERT_EQ(r.evaluated.size(), 2u);
  EXPECT_TRUE(r.failed.empty());
  EXPECT_TRUE(r.missing_detections.empty());
  EXPECT_TRUE(r.missing_reports.empty());
  const SlideEvaluation& t1 = r.evaluated[0];
  EXPECT_EQ(t1.slide.id, "t1");
  EXPECT_TRUE(t1.tumour);
  EXPECT_DOUBLE_EQ(t1.mpp, 0.25);
  EXPECT_DOUBLE_EQ(t1.downsample, 32.0);
  EXPECT_EQ(t1.lesions.size(), 2u);
  EXPECT_EQ(t1.froc.true_positives(), 1);
  EXPECT_EQ(t1.froc.false_positives(), 1);
  ASSERT_TRUE(t1.score.has_value());
  EXPECT_DOUBLE_EQ(*t1.score, 0.8);
  EXPECT_EQ(r.evaluated[1].detections_file, (det() / "n1/n1.detections.csv").string());
  EXPECT_EQ(r.evaluated[1].report_file, (det() / "n1/n1.report.json").string());

  // Lesions 0.9 and 0 (B missed), false positives 0.4 and 0.6 over 2 slides: sensitivity 1/2 at every rate.
  ASSERT_TRUE(r.froc.has_value());
  EXPECT_DOUBLE_EQ(r.froc->score, 0.5);
  EXPECT_EQ(r.froc->lesions, 2);
  EXPECT_EQ(r.froc->detected_lesions, 1);
  EXPECT_EQ(r.froc->false_positives, 2);
  // Tumour 0.8 against normal 0.3.
  EXPECT_DOUBLE_EQ(r.slide_auc, 1.0);
  EXPECT_EQ(r.scored_slides, 2u);
  EXPECT_EQ(r.slide_roc.size(), 3u);
  EXPECT_FALSE(r.patch.has_value());

  const fs::path out = root() / "out";
  const std::vector<std::string> written = {(out / "evaluation.json").string(), (out / "froc.png").string(),
                                            (out / "roc.png").string()};
  EXPECT_EQ(r.written, written);
  for (const auto& file : written) EXPECT_TRUE(fs::is_regular_file(file)) << file;
  const json e = read_json(out / "evaluation.json");
  EXPECT_EQ(e["splits"], (json{"test"}));
  EXPECT_EQ(e["slides"], 2);
  EXPECT_EQ(e["evaluated_slides"], 2);
  EXPECT_EQ(e["froc"]["score"], 0.5);
  EXPECT_TRUE(e["patch"].is_null());
  EXPECT_TRUE(e["predictions"].is_null());
  ASSERT_EQ(e["per_slide"].size(), 2u);
  const json& lesions = e["per_slide"][0]["lesion_list"];
  ASSERT_EQ(lesions.size(), 2u);
  EXPECT_EQ(lesions[0]["p"], 0.9);
  EXPECT_EQ(lesions[1]["p"], 0.0);
  EXPECT_FALSE(e["per_slide"][1].contains("lesion_list")) << "normal slides have no lesions";

  const std::string summary = evaluation_summary(j, r);
  const std::string ds = j.dataset;
  EXPECT_EQ(summary.substr(0, summary.find('\n') + 1),
            "evaluated 2 of 2 slides (1 tumour, 1 normal) from " + ds + " [split test]\n");
  EXPECT_TRUE(contains(summary, "\nFROC 0.5000 (interpolated 0.5000); sensitivity at FP/slide 0.25:0.5000 "))
      << summary;
  EXPECT_TRUE(contains(summary, "; 2 lesions (0 ITC ignored), 1 detected, 2 false positives\n")) << summary;
  EXPECT_TRUE(contains(summary, "\nslide AUC 1.0000 (2 slides)\n")) << summary;
  EXPECT_TRUE(contains(summary, "\nwrote " + written[0] + ", " + written[1] + ", " + written[2] + "\n")) << summary;
  EXPECT_FALSE(contains(summary, "patch AUC")) << summary;
  EXPECT_FALSE(contains(summary, "FAILED")) << summary;
}

TEST_F(EvaluateJobTest, DetectionsAndReportsAreFoundUnderEachNameInOrder) {
  write_dataset("a,,normal,,,\nb,,normal,,,\nc,,normal,,,\nd,,normal,,,\n");
  // a: <id>.detections.csv wins over <id>.csv and <id>/<id>.detections.csv; <id>.report.json over <id>/.
  write_detections(det() / "a.detections.csv", {{{0.5, 10, 10}}});
  write_detections(det() / "a.csv", {{{0.5, 10, 10}, {0.5, 20, 20}}});
  write_detections(det() / "a/a.detections.csv", {{{0.5, 10, 10}, {0.5, 20, 20}, {0.5, 30, 30}}});
  write_report(det() / "a.report.json", 0.1);
  write_report(det() / "a/a.report.json", 0.2);
  // b: <id>/<id>.detections.csv wins over <id>.csv.
  write_detections(det() / "b/b.detections.csv", {{{0.5, 10, 10}, {0.5, 20, 20}}});
  write_detections(det() / "b.csv", {{{0.5, 10, 10}}});
  // c: <id>.csv alone; no report.
  write_detections(det() / "c.csv", {{{0.5, 10, 10}, {0.5, 20, 20}, {0.5, 30, 30}}});
  // d: a folder named like a file is not one.
  fs::create_directories(det() / "d.detections.csv");
  write_report(det() / "d/d.report.json", 0.4);

  const EvaluateResult r = run_evaluation(job());
  ASSERT_EQ(r.evaluated.size(), 4u);
  EXPECT_EQ(r.evaluated[0].detections_file, (det() / "a.detections.csv").string());
  EXPECT_EQ(r.evaluated[0].froc.detections, 1);
  EXPECT_EQ(r.evaluated[0].report_file, (det() / "a.report.json").string());
  EXPECT_DOUBLE_EQ(r.evaluated[0].score.value_or(-1), 0.1);
  EXPECT_EQ(r.evaluated[1].detections_file, (det() / "b/b.detections.csv").string());
  EXPECT_EQ(r.evaluated[1].froc.detections, 2);
  EXPECT_EQ(r.evaluated[2].detections_file, (det() / "c.csv").string());
  EXPECT_EQ(r.evaluated[2].froc.detections, 3);
  EXPECT_TRUE(r.evaluated[3].detections_file.empty());
  EXPECT_EQ(r.evaluated[3].froc.detections, 0);
  EXPECT_DOUBLE_EQ(r.evaluated[3].score.value_or(-1), 0.4);
  EXPECT_EQ(r.missing_detections, (std::vector<std::string>{"d"}));
  EXPECT_EQ(r.missing_reports, (std::vector<std::string>{"b", "c"}));
  EXPECT_FALSE(r.evaluated[2].score.has_value());
  // Normal slides only: a FROC with no lesion (NaN), a slide AUC with one class (NaN, no curve).
  ASSERT_TRUE(r.froc.has_value());
  EXPECT_TRUE(std::isnan(r.froc->score));
  EXPECT_EQ(r.froc->false_positives, 6);
  EXPECT_TRUE(std::isnan(r.slide_auc));
  EXPECT_TRUE(r.slide_roc.empty());
  EXPECT_EQ(r.written.size(), 2u) << "evaluation.json and froc.png; no ROC to draw";
  const std::string summary = evaluation_summary(job(), r);
  EXPECT_TRUE(contains(summary, "\nFROC n/a (interpolated n/a); sensitivity at FP/slide 0.25:n/a ")) << summary;
  EXPECT_TRUE(contains(summary, "\nslide AUC n/a (4 slides)\n")) << summary;
  EXPECT_TRUE(contains(summary, "\nno detections file (counted as none): d\n")) << summary;
  EXPECT_TRUE(contains(summary, "\nno report (slide score 0): b, c\n")) << summary;
}

TEST_F(EvaluateJobTest, EachBrokenInputFailsItsSlideAlone) {
  io::write_asap_xml((root() / "t.xml").string(), {cells(10, 10, 42, 42, "_0")});
  io::write_asap_xml((root() / "misnamed.xml").string(), {cells(10, 10, 42, 42, "metastasis")});
  write_text(root() / "truncated.xml", "<ASAP_Annotations><Annotations><Annotation Name=\"a\"");
  write_dataset(
      "ok,,tumor,t.xml,0.25,\n"
      "null_score,,normal,,,\n"
      "bad_json,,normal,,,\n"
      "no_score,,normal,,,\n"
      "bad_detection,,normal,,,\n"
      "no_annotation,,tumor,,0.25,\n"
      "no_mpp,,tumor,t.xml,,\n"
      "missing_slide,gone.tif,tumor,t.xml,,\n"
      "labels_nothing,,tumor,misnamed.xml,0.25,\n"
      "truncated,,tumor,truncated.xml,0.25,\n");
  write_detections(det() / "ok.detections.csv", {{{0.9, centre(20), centre(20)}}});
  write_text(det() / "null_score.report.json", "{\"slide_score\": null}\n");
  write_text(det() / "bad_json.report.json", "not json");
  write_text(det() / "no_score.report.json", "{\"format\": \"tessera-report\"}\n");
  write_detections(det() / "bad_detection.detections.csv", {{{1.5, 10, 10}}});

  const EvaluateResult r = run_evaluation(job());
  ASSERT_EQ(r.evaluated.size(), 1u);
  EXPECT_EQ(r.evaluated[0].slide.id, "ok");
  ASSERT_EQ(r.failed.size(), 9u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"null_score", "null_score.report.json': the report's \"slide_score\" is not a number"},
      {"bad_json", "bad_json.report.json': not valid JSON"},
      {"no_score", "no_score.report.json': the report has no \"slide_score\""},
      {"bad_detection", "bad_detection.detections.csv': line 1: probability 1.5 is outside [0, 1]"},
      {"no_annotation", "dataset.csv': line 7: slide 'no_annotation' is labelled tumour but has no annotation file"},
      {"no_mpp", "dataset.csv': slide 'no_mpp' not found: its µm/px is needed for the evaluation mask"},
      {"missing_slide", "gone.tif': slide 'missing_slide' not found"},
      {"labels_nothing", "did you mean 'metastases' for 'metastasis'?"},
      {"truncated", "truncated.xml"},
  };
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(r.failed[k].what, expected[k].first) << k;
    EXPECT_TRUE(contains(r.failed[k].error, expected[k].second)) << r.failed[k].error;
  }
  EXPECT_TRUE(contains(r.failed[7].error, "tumour classes (classes.tumour)")) << r.failed[7].error;
  // The slide that was scored is scored as if alone; the failures are in evaluation.json and the summary.
  ASSERT_TRUE(r.froc.has_value());
  EXPECT_DOUBLE_EQ(r.froc->score, 1.0);
  EXPECT_EQ(r.froc->slides, 1);
  const json e = read_json(root() / "out/evaluation.json");
  ASSERT_EQ(e["failed"].size(), 9u);
  EXPECT_EQ(e["failed"][3]["slide"], "bad_detection");
  EXPECT_EQ(e["failed"][3]["error"], r.failed[3].error);
  const std::string summary = evaluation_summary(job(), r);
  EXPECT_TRUE(contains(summary, "evaluated 1 of 10 slides (1 tumour, 0 normal)")) << summary;
  EXPECT_TRUE(contains(summary, "\nFAILED no_mpp: " + r.failed[5].error + "\n")) << summary;
  EXPECT_TRUE(contains(summary, "\nslide AUC n/a (no <slide>.report.json found)\n")) << summary;
}

TEST_F(EvaluateJobTest, SlidesWithoutAReportScoreZeroInTheSlideAuc) {
  io::write_asap_xml((root() / "t.xml").string(), {cells(10, 10, 42, 42, "_0")});
  write_dataset("t1,,tumor,t.xml,0.25,\nn1,,normal,,,\nn2,,normal,,,\n");
  fs::create_directories(det());
  // t1 0.2 against n1 (no report: 0) and n2 0.5: one of two pairs ordered.
  write_report(det() / "t1.report.json", 0.2);
  write_report(det() / "n2.report.json", 0.5);
  const EvaluateResult r = run_evaluation(job());
  EXPECT_EQ(r.missing_reports, (std::vector<std::string>{"n1"}));
  EXPECT_EQ(r.missing_detections, (std::vector<std::string>{"t1", "n1", "n2"}));
  EXPECT_DOUBLE_EQ(r.slide_auc, 0.5);
  EXPECT_EQ(r.scored_slides, 3u);
  EXPECT_EQ(r.written.size(), 3u);
  EXPECT_TRUE(read_json(root() / "out/evaluation.json")["per_slide"][1]["score"].is_null()) << "n1 has no report";

  // No report anywhere: no slide AUC, no roc.png.
  fs::remove(det() / "t1.report.json");
  fs::remove(det() / "n2.report.json");
  EvaluateJob j = job();
  j.output = (root() / "out2").string();
  const EvaluateResult none = run_evaluation(j);
  EXPECT_TRUE(std::isnan(none.slide_auc));
  EXPECT_EQ(none.scored_slides, 0u);
  EXPECT_TRUE(none.slide_roc.empty());
  EXPECT_EQ(none.written, (std::vector<std::string>{(root() / "out2/evaluation.json").string(),
                                                    (root() / "out2/froc.png").string()}));
  EXPECT_FALSE(fs::exists(root() / "out2/roc.png"));
  EXPECT_TRUE(read_json(root() / "out2/evaluation.json")["slide_auc"].is_null());
  const std::string summary = evaluation_summary(j, none);
  EXPECT_TRUE(contains(summary, "\nslide AUC n/a (no <slide>.report.json found)\n")) << summary;
  EXPECT_FALSE(contains(summary, "no report (slide score 0)")) << "every slide lacks one: not listed";
}

TEST_F(EvaluateJobTest, PredictionsGiveThePatchAucAndABrokenFileIsListed) {
  write_dataset("s1,,tumor,,,test\ns2,,normal,,,test\ns3,,normal,,,train\n");
  // Positives 0.8, 0.4; negatives 0.3, 0.5: three of four pairs ordered. s3 (train) and zz are other slides.
  write_text(root() / "preds.csv",
             "slide_id,x,y,label,p_tumor\ns1,0,0,1,0.8\ns1,1,0,0,0.3\ns2,0,0,1,0.4\ns2,1,0,0,0.5\n\n"
             "s3,0,0,0,0.9\nzz,0,0,1,0.1\n");
  EvaluateJob j = job();
  j.detections.clear();
  j.predictions = (root() / "preds.csv").string();
  j.splits = {"test"};
  const EvaluateResult r = run_evaluation(j);
  EXPECT_TRUE(r.evaluated.empty()) << "no detections: no slide is evaluated";
  EXPECT_FALSE(r.froc.has_value());
  ASSERT_TRUE(r.patch.has_value());
  EXPECT_NEAR(r.patch->auc, 0.75, 1e-12);
  EXPECT_EQ(r.patch->p.size(), 4u);
  EXPECT_EQ(r.patch->other_slides, 2);
  EXPECT_EQ(r.patch->roc.size(), 5u);
  EXPECT_EQ(r.written,
            (std::vector<std::string>{(root() / "out/evaluation.json").string(), (root() / "out/roc.png").string()}));
  const json e = read_json(root() / "out/evaluation.json");
  EXPECT_TRUE(e["froc"].is_null());
  EXPECT_TRUE(e["detections"].is_null());
  EXPECT_EQ(e["patch"]["tiles"], 4);
  EXPECT_EQ(e["patch"]["tumour_tiles"], 2);
  EXPECT_EQ(e["patch"]["rows_of_other_slides"], 2);
  const std::string summary = evaluation_summary(j, r);
  EXPECT_EQ(summary.substr(0, summary.find('\n') + 1), "2 slides from " + j.dataset + " [split test]\n");
  EXPECT_TRUE(contains(summary, "\npatch AUC 0.7500 (4 tiles)\n")) << summary;
  EXPECT_FALSE(contains(summary, "FROC")) << summary;

  // Each broken file: one failure named "predictions", no patch scores, the rest of the job done.
  const std::vector<std::pair<std::string, std::string>> broken = {
      {"slide_id,x,y,label,p_tumor\ns1,0,0,2,0.5\n", "line 2: label '2' is not 0 or 1"},
      {"slide_id,x,y,label,p_tumor\ns1,0,0,1,0.5\ns1,0,0,1,abc\n", "line 3: p_tumor 'abc' is not a number"},
      {"slide_id,x,y,label,p_tumor\ns1,0,0,1,0.5x\n", "line 2: p_tumor '0.5x' is not a number"},
      {"slide_id,x,y,label,p_tumor\ns2,0,0,0,1.5\n", "line 2: p_tumor 1.5 is outside [0, 1]"},
      {"slide,x,y,label,p_tumor\n", "no 'slide_id' column"},
      {"slide_id,x,y,label,p\n", "no 'p_tumor' column"},
      {"", "empty predictions file (no header line)"},
  };
  for (const auto& [text, message] : broken) {
    write_text(root() / "preds.csv", text);
    const EvaluateResult b = run_evaluation(j);
    EXPECT_FALSE(b.patch.has_value()) << message;
    ASSERT_EQ(b.failed.size(), 1u) << message;
    EXPECT_EQ(b.failed[0].what, "predictions");
    EXPECT_TRUE(contains(b.failed[0].error, "preds.csv")) << b.failed[0].error;
    EXPECT_TRUE(contains(b.failed[0].error, message)) << b.failed[0].error;
    EXPECT_EQ(b.written.size(), 1u) << "evaluation.json only";
    EXPECT_TRUE(read_json(root() / "out/evaluation.json")["patch"].is_null());
    EXPECT_TRUE(contains(evaluation_summary(j, b), "\npatch AUC n/a (0 tiles)\n"));
  }
  j.predictions = (root() / "nowhere.csv").string();
  const EvaluateResult missing = run_evaluation(j);
  ASSERT_EQ(missing.failed.size(), 1u);
  EXPECT_TRUE(contains(missing.failed[0].error, "nowhere.csv")) << missing.failed[0].error;
}

TEST_F(EvaluateJobTest, TheJobIsCheckedBeforeAnyWork) {
  const auto config_key = [](const EvaluateJob& j) {
    try {
      check_evaluate_job(j);
    } catch (const core::ConfigError& e) {
      EXPECT_EQ(e.file(), "job.yaml");
      return e.key();
    }
    return std::string("(none)");
  };
  EvaluateJob j = job();
  j.dataset.clear();
  EXPECT_EQ(config_key(j), "input.csv");
  j = job();
  j.detections.clear();
  EXPECT_EQ(config_key(j), "detections");
  j.predictions = "preds.csv";
  EXPECT_EQ(config_key(j), "(none)") << "predictions alone are something to evaluate";

  // The detections folder must exist; run_evaluation checks it too, before it writes anything.
  j = job();
  try {
    run_evaluation(j);
    ADD_FAILURE() << "no error for a missing detections folder";
  } catch (const core::InputError& e) {
    EXPECT_TRUE(contains(e.what(), det().string())) << e.what();
    EXPECT_TRUE(contains(e.what(), "the detections folder does not exist")) << e.what();
  }
  EXPECT_FALSE(fs::exists(root() / "out"));
}

TEST_F(EvaluateJobTest, TheDatasetAndTheSplitsMustGiveSlides) {
  fs::create_directories(det());
  write_dataset("a,,normal,,,train\nb,,normal,,,\n");
  EvaluateJob j = job();
  j.splits = {"val", "test"};
  try {
    run_evaluation(j);
    ADD_FAILURE() << "no error for splits that hold no slide";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "input.splits");
    EXPECT_EQ(e.file(), "job.yaml");
    EXPECT_TRUE(contains(e.message(), "is in the split(s) val, test (the dataset has: (none), train)")) << e.message();
  }
  write_dataset("a,,normal,,,\nb,,tumor,,0.25,\na,,normal,,,\n");
  try {
    run_evaluation(job());
    ADD_FAILURE() << "no error for a slide listed twice";
  } catch (const core::InputError& e) {
    EXPECT_TRUE(contains(e.what(), "line 4: slide 'a' is listed twice")) << e.what();
  }
  write_dataset("");
  EXPECT_THROW(run_evaluation(job()), core::InputError);
  EXPECT_FALSE(fs::exists(root() / "out")) << "nothing written before the slides are known";
}

TEST_F(EvaluateJobTest, FrocSettingsAndClassRulesReachTheMask) {
  // A lesion and an isolated-tumour-cell lesion (12×12 mask px grown to 20: 160 µm across) in a group that is
  // not a tumour class by default.
  io::write_asap_xml((root() / "t.xml").string(),
                     {cells(10, 10, 42, 42, "carcinoma"), cells(100, 100, 112, 112, "carcinoma")});
  write_dataset("t,,tumor,t.xml,0.25,\n");
  write_detections(det() / "t.detections.csv", {{{0.9, centre(20), centre(20)}, {0.7, centre(105), centre(105)}}});

  const EvaluateResult by_default = run_evaluation(job());
  ASSERT_EQ(by_default.failed.size(), 1u);
  EXPECT_TRUE(contains(by_default.failed[0].error, "add it to classes.tumour")) << by_default.failed[0].error;

  EvaluateJob j = job();
  j.classes.tumour = {"carcinoma"};
  const EvaluateResult itc_ignored = run_evaluation(j);
  ASSERT_TRUE(itc_ignored.failed.empty()) << itc_ignored.failed[0].error;
  ASSERT_EQ(itc_ignored.evaluated.size(), 1u);
  EXPECT_EQ(itc_ignored.evaluated[0].froc.itc_hits, 1);
  EXPECT_EQ(itc_ignored.froc->lesions, 1);
  EXPECT_EQ(itc_ignored.froc->itc_lesions, 1);
  EXPECT_EQ(itc_ignored.froc->false_positives, 0);

  j.froc.include_itc = true;
  const EvaluateResult itc_counted = run_evaluation(j);
  EXPECT_EQ(itc_counted.froc->lesions, 2);
  EXPECT_EQ(itc_counted.froc->itc_lesions, 0);
  EXPECT_EQ(itc_counted.froc->detected_lesions, 2);
  EXPECT_TRUE(read_json(root() / "out/evaluation.json")["froc"]["rules"]["include_itc"].get<bool>());

  // A coarser mask (level 6: 64 level-0 pixels) and a wider growth reach the lesions and the rules written.
  j.froc.include_itc = false;
  j.froc.mask_level = 6;
  j.froc.dilation_um = 120.0;
  const EvaluateResult coarse = run_evaluation(j);
  EXPECT_DOUBLE_EQ(coarse.evaluated[0].downsample, 64.0);
  const json rules = read_json(root() / "out/evaluation.json")["froc"]["rules"];
  EXPECT_EQ(rules["mask_level"], 6);
  EXPECT_EQ(rules["mask_downsample"], 64.0);
  EXPECT_EQ(rules["border_growth_um"], 60.0);
  EXPECT_EQ(rules["itc_major_axis_um"], 320.0);
}

TEST_F(EvaluateJobTest, ASlideFileGivesTheResolutionAndClipsTheMask) {
  // A 2000 × 2000 slide at 0.5 µm/px: a mask pixel is 32 level-0 pixels (16 µm). The lesion reaches past the
  // slide's right edge; unclipped, its grown box would end at level-0 2304.
  io::TiffWriterOptions options;
  options.mpp = 0.5;
  testing::write_pattern_slide((root() / "slide.tif").string(), 2000, 2000, options);
  io::write_asap_xml((root() / "t.xml").string(), {cells(50, 10, 70, 30, "_0")});
  write_dataset("t,slide.tif,tumor,t.xml,,\n");
  write_detections(det() / "t.detections.csv", {{{0.9, centre(55), centre(20)}}});
  const EvaluateResult r = run_evaluation(job());
  ASSERT_TRUE(r.failed.empty()) << r.failed[0].error;
  ASSERT_EQ(r.evaluated.size(), 1u);
  const SlideEvaluation& t = r.evaluated[0];
  EXPECT_DOUBLE_EQ(t.mpp, 0.5);
  ASSERT_EQ(t.lesions.size(), 1u);
  EXPECT_LE((t.lesions[0].box.x + t.lesions[0].box.width) * t.downsample, 2016.0);
  EXPECT_EQ(t.froc.true_positives(), 1);

  // The mpp column wins over the slide's own resolution.
  write_dataset("t,slide.tif,tumor,t.xml,0.25,\n");
  EXPECT_DOUBLE_EQ(run_evaluation(job()).evaluated.at(0).mpp, 0.25);
}

// With quality control's masks beside the detections (<slide>.qc.png), evaluate also reports the FROC over lesions
// mostly outside excluded areas: a lesion under excluded ink leaves it, one only partly under it stays; the usual
// FROC is unchanged. A mask that is not a 16-bit PNG fails the slide naming it.
TEST_F(EvaluateJobTest, QcMasksGiveTheFrocOverLesionsOutsideExcludedAreas) {
  // A 2048 × 2048 slide at 1 µm/px: a mask pixel is 32 level-0 pixels (32 µm, so a lesion 10 mask pixels wide is no
  // ITC); the QC masks are 256 px (8 level-0 px).
  io::TiffWriterOptions options;
  options.mpp = 1.0;
  testing::write_pattern_slide((root() / "slide.tif").string(), 2048, 2048, options);
  // A (free), B (under excluded ink, grown border included), C (its first four annotated columns under excluded ink).
  io::write_asap_xml((root() / "t.xml").string(),
                     {cells(5, 5, 15, 15, "_0"), cells(40, 40, 50, 50, "_0"), cells(20, 40, 30, 50, "_0")});
  write_dataset("t,slide.tif,tumor,t.xml,,\n");
  write_detections(det() / "t.detections.csv", {{{0.9, centre(10), centre(10)},
                                                 {0.8, centre(25), centre(45)},
                                                 {0.7, centre(45), centre(45)},
                                                 {0.5, centre(5), centre(55)}}});  // B hit; one false positive
  const EvaluateResult plain = run_evaluation(job());
  ASSERT_TRUE(plain.failed.empty()) << plain.failed[0].error;
  ASSERT_TRUE(plain.froc.has_value());
  EXPECT_FALSE(plain.froc_outside_excluded.has_value()) << "no masks, no second FROC";
  EXPECT_TRUE(read_json(root() / "out" / "evaluation.json")["froc_outside_excluded"].is_null());

  cv::Mat1w qc(256, 256, io::kQcTissueBit);
  constexpr double kQcPx = 8.0;  // level-0 pixels per QC pixel
  const auto exclude = [&](double x0, double y0, double x1, double y1) {
    qc(cv::Rect(cv::Point(static_cast<int>(x0 / kQcPx), static_cast<int>(y0 / kQcPx)),
                cv::Point(static_cast<int>(x1 / kQcPx), static_cast<int>(y1 / kQcPx))))
        .setTo(io::kQcTissueBit | io::kQcExcludedBit | (1u << 1));
  };
  exclude(33 * kPx, 33 * kPx, 57 * kPx, 57 * kPx);  // B with its grown border
  exclude(20 * kPx, 40 * kPx, 24 * kPx, 50 * kPx);  // C's first four columns
  io::write_qc_masks_png((det() / "t.qc.png").string(), qc);
  const EvaluateResult r = run_evaluation(job());
  ASSERT_TRUE(r.failed.empty()) << r.failed[0].error;
  ASSERT_EQ(r.evaluated.size(), 1u);
  const SlideEvaluation& t = r.evaluated[0];
  EXPECT_EQ(t.qc_file, (det() / "t.qc.png").string());
  ASSERT_EQ(t.lesion_excluded.size(), 3u);
  // Lesion labels follow the raster order of their first mask pixel: A, then C (column 20), then B (column 40).
  ASSERT_EQ(t.lesions.size(), 3u);
  const auto share_at = [&](int column) {
    for (const auto& lesion : t.lesions) {
      if (lesion.box.contains(cv::Point(column, lesion.box.y + 1))) {
        return t.lesion_excluded[static_cast<std::size_t>(lesion.label - 1)];
      }
    }
    ADD_FAILURE() << "no lesion at column " << column;
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(share_at(10), 0.0);
  EXPECT_DOUBLE_EQ(share_at(45), 1.0);
  EXPECT_GT(share_at(25), 0.05);
  EXPECT_LT(share_at(25), kMostlyExcluded);

  // The usual FROC as without masks; the second leaves B out, its hit neither true nor false positive.
  ASSERT_TRUE(r.froc.has_value());
  EXPECT_EQ(r.froc->lesions, 3);
  EXPECT_EQ(r.froc->detected_lesions, 3);
  EXPECT_EQ(r.froc->score, plain.froc->score);
  ASSERT_TRUE(r.froc_outside_excluded.has_value());
  const auto& outside = *r.froc_outside_excluded;
  EXPECT_EQ(outside.froc.lesions, 2);
  EXPECT_EQ(outside.froc.detected_lesions, 2);
  EXPECT_EQ(outside.froc.false_positives, 1);
  EXPECT_EQ(outside.excluded_lesions, 1);
  EXPECT_EQ(outside.slides_with_masks, 1);
  const json written = read_json(root() / "out" / "evaluation.json");
  EXPECT_EQ(written["froc_outside_excluded"]["lesions"], 2);
  EXPECT_EQ(written["froc_outside_excluded"]["excluded_lesions"], 1);
  EXPECT_EQ(written["per_slide"][0]["qc_file"], t.qc_file);
  EXPECT_TRUE(contains(evaluation_summary(job(), r), "FROC outside excluded areas")) << evaluation_summary(job(), r);

  // A twin run's masks (also_excluded) count too: the union of both runs' excluded areas. Its mask over A leaves A
  // out as well; a folder without the slide's masks adds nothing; a mask of another size fails the slide naming it.
  cv::Mat1w twin(256, 256, io::kQcTissueBit);
  twin(cv::Rect(0, 0, static_cast<int>(20 * kPx / kQcPx), static_cast<int>(20 * kPx / kQcPx)))
      .setTo(io::kQcTissueBit | io::kQcExcludedBit);
  fs::create_directories(root() / "twin");
  fs::create_directories(root() / "empty");
  io::write_qc_masks_png((root() / "twin" / "t.qc.png").string(), twin);
  EvaluateJob both = job();
  both.also_excluded = {(root() / "twin").string(), (root() / "empty").string()};
  const EvaluateResult united = run_evaluation(both);
  ASSERT_TRUE(united.failed.empty()) << united.failed[0].error;
  EXPECT_EQ(united.evaluated[0].also_excluded_files, std::vector<std::string>{(root() / "twin" / "t.qc.png").string()});
  EXPECT_EQ(united.froc_outside_excluded->froc.lesions, 1);
  EXPECT_EQ(united.froc_outside_excluded->excluded_lesions, 2);
  EXPECT_EQ(united.froc->score, plain.froc->score);
  io::write_qc_masks_png((root() / "twin" / "t.qc.png").string(), cv::Mat1w(128, 128, io::kQcTissueBit));
  const EvaluateResult mismatched = run_evaluation(both);
  ASSERT_EQ(mismatched.failed.size(), 1u);
  EXPECT_TRUE(contains(mismatched.failed[0].error, (root() / "twin" / "t.qc.png").string()))
      << mismatched.failed[0].error;
  both.also_excluded = {(root() / "missing").string()};
  EXPECT_THROW(run_evaluation(both), core::InputError);

  // Ink over B's detection only, not B: the lesion stays (the rule is about the lesion's area).
  qc.setTo(io::kQcTissueBit);
  exclude(44 * kPx, 44 * kPx, 46 * kPx, 46 * kPx);
  io::write_qc_masks_png((det() / "t.qc.png").string(), qc);
  EXPECT_EQ(run_evaluation(job()).froc_outside_excluded->froc.lesions, 3);

  write_text(det() / "t.qc.png", "not a png");
  const EvaluateResult broken = run_evaluation(job());
  ASSERT_EQ(broken.failed.size(), 1u);
  EXPECT_TRUE(contains(broken.failed[0].error, "t.qc.png")) << broken.failed[0].error;
}

TEST(EvaluationCharts, DrawTheCurvesTheyAreGiven) {
  const std::vector<RocPoint> curve = {{INFINITY, 0, 0}, {0.8, 0, 0.5}, {0.3, 0.5, 1}, {0.1, 1, 1}};
  const cv::Mat slides = roc_chart(curve, 0.875, 4, {}, NAN, 0);
  const cv::Mat patches = roc_chart({}, NAN, 0, curve, 0.875, 4);
  const cv::Mat both = roc_chart(curve, 0.875, 4, curve, 0.875, 4);
  const cv::Mat neither = roc_chart({}, NAN, 0, {}, NAN, 0);
  for (const cv::Mat* image : {&slides, &patches, &both, &neither}) {
    EXPECT_EQ(image->cols, 960);
    EXPECT_EQ(image->rows, 720);
    EXPECT_EQ(image->type(), CV_8UC3);
  }
  EXPECT_GT(count_colour(slides, kRed), 100);
  EXPECT_EQ(count_colour(slides, kBlue), 0);
  EXPECT_GT(count_colour(patches, kBlue), 100);
  EXPECT_EQ(count_colour(patches, kRed), 0);
  EXPECT_GT(count_colour(both, kRed), 100);
  EXPECT_GT(count_colour(both, kBlue), 0) << "under the slide curve, the patch legend swatch stays";
  EXPECT_EQ(count_colour(neither, kRed) + count_colour(neither, kBlue), 0);

  // A FROC with lesions: its curve and the six score markers; without a lesion, neither.
  SlideFroc tumour;
  tumour.tumour = true;
  tumour.lesion_p = {0.9, 0.0};
  tumour.lesion_label = {1, 2};
  tumour.fp_p = {0.4};
  SlideFroc normal;
  normal.fp_p = {0.6};
  const std::vector<SlideFroc> with_lesions = {tumour, normal};
  const std::vector<SlideFroc> without = {normal};
  const cv::Mat froc = froc_chart(compute_froc(with_lesions));
  const cv::Mat empty = froc_chart(compute_froc(without));
  EXPECT_GT(count_colour(froc, kRed), 100);
  EXPECT_GT(count_colour(froc, kMarker), 50);
  EXPECT_EQ(count_colour(empty, kRed), 0);
  EXPECT_EQ(count_colour(empty, kMarker), 0);
  EXPECT_EQ(empty.cols, 960);
}

}  // namespace
}  // namespace tessera::analysis
