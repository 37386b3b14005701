// DICOM whole-slide series through the verbs, as a user runs them: `synth --format dicom`, `info`, `infer` and
// `evaluate` on synthetic series, and `tile` and `infer` on the real CMU-1 series against the same scan as an SVS
// (../shared/data/real-slides; those tests skip, saying so, when it is absent).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include "io/heatmap.h"
#include "io/shard.h"
#include "io/slide.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;

fs::path real_file(const std::string& name) { return testing::shared_data_dir() / "real-slides" / name; }
std::string skip_message(const fs::path& path) {
  return "no real data at " + path.string() + " (../shared/data is absent)";
}
// A tiny_cnn checkpoint at 0.5 µm/px (8-px tiles) with randomised weights: a model whose outputs depend on the
// pixels, to compare heatmaps of two files of one scan.
std::string checkpoint() { return (testing::test_data_dir() / "checkpoints/tiny_torch.h5").string(); }

TEST(DicomVerbs, SynthWritesSeriesThatInfoInferAndEvaluateRead) {
  const testing::TempDir dir;
  auto r = run("synth --out " + dir.file("synth") + " --slides 2 --size 1024 --seed 4 --format dicom" +
               " --set preview.enabled=false --set slides.flavour=aperio");
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path tumour = dir.path() / "synth/slides/tumor_001";
  ASSERT_TRUE(fs::is_directory(tumour));
  EXPECT_TRUE(fs::exists(tumour / "level-0.dcm") && fs::exists(tumour / "level-1.dcm"));
  EXPECT_FALSE(fs::exists(dir.path() / "synth/slides/tumor_001.source.tif"));

  r = run("info " + tumour.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "vendor       dicom")) << r.out;
  EXPECT_TRUE(contains(r.out, "reader       DICOM (JPEG Baseline frames)")) << r.out;
  EXPECT_TRUE(contains(r.out, "synthetic (made by tessera synth)")) << r.out;
  EXPECT_TRUE(contains(r.out, "0.2500 x 0.2500 um/px, from the DICOM Pixel Spacing")) << r.out;
  EXPECT_TRUE(contains(r.out, "associated   label (")) << r.out;
  EXPECT_TRUE(contains(r.out, "optical      paths 1 (the first is read)")) << r.out;
  r = run("info --json " + (tumour / "level-1.dcm").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json info = json::parse(r.out);
  EXPECT_EQ(info[0]["mpp_source"], "dicom");
  EXPECT_EQ(info[0]["levels"].size(), 2U);

  // infer over the dataset.csv (rows name the series' folders; one row names a file of its series instead).
  std::ifstream in(dir.file("synth/dataset.csv"));
  std::string csv((std::istreambuf_iterator<char>(in)), {});
  const auto at = csv.find("slides/normal_001,");
  ASSERT_NE(at, std::string::npos);
  csv.replace(at, std::string("slides/normal_001,").size(), "slides/normal_001/level-0.dcm,");
  std::ofstream(dir.file("synth/dataset.csv")) << csv;
  r = run("infer --checkpoint " + checkpoint() + " --slides " + dir.file("synth/dataset.csv") + " --out " +
          dir.file("infer") + " --threads 1 --set infer.stride=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.path() / "infer/tumor_001.heatmap.h5"));
  EXPECT_TRUE(fs::exists(dir.path() / "infer/normal_001.heatmap.h5"));
  r = run("evaluate --dataset " + dir.file("synth/dataset.csv") + " --detections " + dir.file("infer") + " --out " +
          dir.file("evaluation"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream evaluation(dir.file("evaluation/evaluation.json"));
  EXPECT_EQ(json::parse(evaluation)["evaluated_slides"], 2);
}

// `tile` at the native 0.5 µm/px (so both read level 0) of the CMU-1 scan as DICOM and as SVS, with the default
// tissue settings: the same tile coordinates but at the tissue border, ≥ 95% shared (the tissue masks come from
// different pyramids, and each is area-averaged from a level ≥ 4x finer than the mask: read from the DICOM series'
// own 16x level instead, 90.6% were shared), and the shared tiles' pixels within JPEG re-encoding: mean difference per
// channel within ±5 (no colour shift; a YCbCr frame read as RGB is off by tens). Their mean absolute difference is
// 8.0 / 4.8 / 9.0: tissue carries more re-encoding loss than the background that dominates level 0's 3.7 / 2.3 / 4.3,
// and DicomReal.CmuSeriesLevel0IsTheSvsReencodedByItsConverter (tests/io) shows all of it is in the file; bounded at
// 10 here.
TEST(DicomVerbs, TileOfTheDicomSeriesIsTheSvs) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(series) || !fs::exists(svs)) GTEST_SKIP() << skip_message(series);
  const testing::TempDir dir;
  std::ofstream(dir.file("dataset.csv")) << "slide,label\n"
                                         << series.string() << "/,normal\n"
                                         << svs.string() << ",normal\n";
  const auto r = run("tile --csv " + dir.file("dataset.csv") + " -o " + dir.file("shards") +
                     " --set tile.size=64 --set tile.mpp=0.5"
                     // QC off: its masks differ a little between the two encodings (blur), and this test compares
                     // the tiling alone.
                     " --set qc.enabled=false");
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::pair<std::int64_t, std::int64_t>, cv::Mat> tiles[2];
  const auto manifest = io::read_manifest(dir.file("shards/manifest.json"));
  for (const auto& s : manifest.shards) {
    const auto shard = io::ShardFile::open(dir.file("shards/" + s.file));
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      const std::string& id = shard.slides()[shard.slide_indices()[k]];
      const int which = id == "cmu-1-small-region-dicom" ? 0 : 1;
      EXPECT_TRUE(id == "cmu-1-small-region-dicom" || id == "cmu-1-small-region") << id;
      tiles[which][{shard.coords()[2 * k], shard.coords()[2 * k + 1]}] = shard.read_image(i);
    }
  }
  ASSERT_GT(tiles[0].size(), 100U);
  std::size_t shared = 0;
  cv::Scalar total(0, 0, 0);
  cv::Scalar signed_total(0, 0, 0);
  for (const auto& [xy, tile] : tiles[0]) {
    const auto other = tiles[1].find(xy);
    if (other == tiles[1].end()) continue;
    ++shared;
    cv::Mat diff;
    cv::absdiff(tile, other->second, diff);
    total += cv::mean(diff);
    cv::Mat a;
    cv::Mat b;
    tile.convertTo(a, CV_32FC3);
    other->second.convertTo(b, CV_32FC3);
    signed_total += cv::mean(a - b);
  }
  const double fraction = static_cast<double>(shared) / static_cast<double>(std::max(tiles[0].size(), tiles[1].size()));
  const cv::Scalar mad = total / static_cast<double>(std::max<std::size_t>(shared, 1));
  const cv::Scalar mean = signed_total / static_cast<double>(std::max<std::size_t>(shared, 1));
  std::printf(
      "tile: %zu DICOM tiles, %zu SVS tiles, %zu shared (%.1f%%); shared tiles' mean difference R %.2f G %.2f "
      "B %.2f, mean absolute difference R %.2f G %.2f B %.2f\n",
      tiles[0].size(), tiles[1].size(), shared, 100.0 * fraction, mean[0], mean[1], mean[2], mad[0], mad[1], mad[2]);
  EXPECT_GE(fraction, 0.95);
  for (int c = 0; c < 3; ++c) {
    EXPECT_LE(std::abs(mean[c]), 5.0) << "channel " << c;
    EXPECT_LE(mad[c], 10.0) << "channel " << c;
  }
}

// `infer` with one checkpoint at 0.5 µm/px on both files of the scan: heatmaps of one grid whose cells agree
// within 0.05 (the largest difference and the 99th percentile are printed).
TEST(DicomVerbs, InferHeatmapsOfTheDicomSeriesAndTheSvsAgree) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(series) || !fs::exists(svs)) GTEST_SKIP() << skip_message(series);
  const testing::TempDir dir;
  const auto r =
      run("infer --checkpoint " + checkpoint() + " --set 'input.slides=[" + series.string() + "," + svs.string() +
          "]' --out " + dir.file("infer") + " --threads 2 --set infer.stride=16 --set outputs=[heatmap.h5]");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Heatmap a = io::read_heatmap(dir.file("infer/cmu-1-small-region-dicom.heatmap.h5"));
  const io::Heatmap b = io::read_heatmap(dir.file("infer/cmu-1-small-region.heatmap.h5"));
  ASSERT_EQ(a.rows, b.rows);
  ASSERT_EQ(a.cols, b.cols);
  ASSERT_EQ(a.step, b.step);
  std::vector<double> differences;
  for (std::size_t i = 0; i < a.prob.size(); ++i) {
    if (std::isnan(a.prob[i]) || std::isnan(b.prob[i])) continue;  // tissue masks of two pyramids differ at the border
    differences.push_back(std::abs(static_cast<double>(a.prob[i]) - static_cast<double>(b.prob[i])));
  }
  ASSERT_GT(differences.size(), 1000U);
  std::sort(differences.begin(), differences.end());
  const double largest = differences.back();
  const double p99 = differences[differences.size() * 99 / 100];
  std::printf("infer: %zu cells scored in both; |difference| largest %.4f, 99th percentile %.4f\n", differences.size(),
              largest, p99);
  EXPECT_LE(largest, 0.05);
}

// ---- dicom-seg ----

// Runs a shell command; its exit status and output (stdout and stderr).
int shell(const std::string& command, std::string& output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  output.clear();
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  return pclose(pipe);
}

// dciodvfy's error lines for a file.
std::vector<std::string> dciodvfy_errors(const std::string& path) {
  std::string output;
  shell("dciodvfy " + path, output);
  std::vector<std::string> errors;
  std::size_t start = 0;
  while (start < output.size()) {
    const std::size_t end = std::min(output.find('\n', start), output.size());
    const std::string line = output.substr(start, end - start);
    if (line.rfind("Error", 0) == 0) errors.push_back(line);
    start = end + 1;
  }
  return errors;
}

// Every dciodvfy error of `path` is one it also reports for the reference segmentation in ../shared/data.
void expect_no_new_dciodvfy_errors(const std::string& path) {
  const fs::path reference = real_file("dicom/highdicom/seg_image_sm_control.dcm");
  std::string version;
  ASSERT_NE(shell("dciodvfy -version", version), 127) << "dciodvfy (Debian dicom3tools) is missing";
  const auto allowed = dciodvfy_errors(reference.string());
  for (const auto& error : dciodvfy_errors(path)) {
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), error), allowed.end()) << path << ": " << error;
  }
}

// pydicom's view of a segmentation: attributes as JSON, then the total pixel matrix (frames placed by their Plane
// Position (Slide)) as hex bytes.
json pydicom_seg(const std::string& path) {
  const testing::TempDir dir;
  std::ofstream(dir.file("seg.py"))
      << "import json,sys,pydicom\n"
         "d=pydicom.dcmread(sys.argv[1]);a=d.pixel_array\n"
         "if a.ndim==2: a=a[None]\n"
         "W,H=d.TotalPixelMatrixColumns,d.TotalPixelMatrixRows;m=bytearray(W*H)\n"
         "for f,g in zip(a,d.PerFrameFunctionalGroupsSequence):\n"
         " p=g.PlanePositionSlideSequence[0];x0=p.ColumnPositionInTotalImagePixelMatrix-1;"
         "y0=p.RowPositionInTotalImagePixelMatrix-1\n"
         " for y in range(min(d.Rows,H-y0)):\n"
         "  for x in range(min(d.Columns,W-x0)): m[(y0+y)*W+x0+x]=int(f[y,x])\n"
         "s=d.SegmentSequence[0];o=d.TotalPixelMatrixOriginSequence[0]\n"
         "print(json.dumps({'modality':d.Modality,'type':d.SegmentationType,'fractional':d.SegmentationFractionalType,"
         "'max':int(d.MaximumFractionalValue),'label':s.SegmentLabel,"
         "'category':s.SegmentedPropertyCategoryCodeSequence[0].CodeValue,"
         "'property':s.SegmentedPropertyTypeCodeSequence[0].CodeValue,"
         "'series':d.ReferencedSeriesSequence[0].SeriesInstanceUID,"
         "'instances':[i.ReferencedSOPInstanceUID for i in d.ReferencedSeriesSequence[0].ReferencedInstanceSequence],"
         "'study':d.StudyInstanceUID,'frame_of_reference':d.FrameOfReferenceUID,'columns':W,'rows':H,"
         "'spacing':[float(v) for v in d.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing],"
         "'origin':[float(o.XOffsetInSlideCoordinateSystem),float(o.YOffsetInSlideCoordinateSystem)],"
         "'orientation':[float(v) for v in d.ImageOrientationSlide]}))\n"
         "print(m.hex())\n";
  std::string output;
  EXPECT_EQ(shell("/usr/bin/python3 " + dir.file("seg.py") + " " + path, output), 0)
      << "pydicom (Debian python3-pydicom): " << output;
  const auto newline = output.find('\n');
  json j = json::parse(output.substr(0, newline));
  std::string hex = output.substr(newline + 1);
  while (!hex.empty() && hex.back() == '\n') hex.pop_back();
  j["pixels"] = hex;
  return j;
}

// The segmentation's pixels are the heatmap's cells × 255 (0 where no tissue was scored), in the heatmap's grid.
void expect_seg_is_the_heatmap(const json& seg, const io::Heatmap& map) {
  ASSERT_EQ(seg["columns"], map.cols);
  ASSERT_EQ(seg["rows"], map.rows);
  std::string expected;
  static constexpr char kDigits[] = "0123456789abcdef";
  for (const float p : map.prob) {
    const int v = std::isnan(p) ? 0 : static_cast<int>(std::lround(std::clamp(static_cast<double>(p), 0.0, 1.0) * 255));
    expected += kDigits[v >> 4];
    expected += kDigits[v & 15];
  }
  EXPECT_EQ(seg["pixels"].get<std::string>(), expected);
}

TEST(DicomVerbs, DicomSegOfASyntheticSeries) {
  const testing::TempDir dir;
  auto r = run("synth --out " + dir.file("synth") + " --slides 1 --size 1024 --seed 5 --format dicom" +
               " --set preview.enabled=false --set slides.tumour_fraction=1");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string series = dir.file("synth/slides/tumor_001");
  r = run("infer --checkpoint " + checkpoint() + " --slides " + series + " --out " + dir.file("infer") +
          " --threads 1 --set infer.stride=16 --set outputs=[heatmap.h5] --dicom-seg" +
          " --set dicom_seg.segment_label=metastasis");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string seg_path = dir.file("infer/tumor_001.seg.dcm");
  ASSERT_TRUE(fs::exists(seg_path));
  const io::Heatmap map = io::read_heatmap(dir.file("infer/tumor_001.heatmap.h5"));
  const io::Slide slide = io::Slide::open(series);
  const json seg = pydicom_seg(seg_path);
  EXPECT_EQ(seg["modality"], "SEG");
  EXPECT_EQ(seg["type"], "FRACTIONAL");
  EXPECT_EQ(seg["fractional"], "PROBABILITY");
  EXPECT_EQ(seg["max"], 255);
  EXPECT_EQ(seg["label"], "metastasis");
  EXPECT_EQ(seg["category"], "49755003");
  EXPECT_EQ(seg["property"], "14799000");
  EXPECT_EQ(seg["series"], slide.property("dicom.series-uid").value());
  EXPECT_EQ(seg["study"], slide.property("dicom.study-uid").value());
  EXPECT_EQ(seg["frame_of_reference"], slide.property("dicom.frame-of-reference-uid").value());
  EXPECT_EQ(seg["instances"].size(), static_cast<std::size_t>(slide.level_count()));
  expect_seg_is_the_heatmap(seg, map);
  // SEG pixel (i, j) covers heatmap cell (i, j)'s footprint: spacing = the step, origin = cell (0, 0)'s footprint
  // corner in slide coordinates (the synthetic series: origin (0, 0), orientation 0\-1\0\-1\0\0).
  const double mm = slide.mpp() / 1000.0;
  EXPECT_NEAR(seg["spacing"][0].get<double>(), static_cast<double>(map.step) * mm, 1e-9);
  EXPECT_NEAR(seg["spacing"][1].get<double>(), static_cast<double>(map.step) * mm, 1e-9);
  const cv::Rect2d first = io::cell_footprint(map, 0, 0);
  EXPECT_NEAR(seg["origin"][0].get<double>(), -first.y * mm, 1e-6);
  EXPECT_NEAR(seg["origin"][1].get<double>(), -first.x * mm, 1e-6);
  if (!fs::exists(real_file("dicom/highdicom/seg_image_sm_control.dcm"))) {
    GTEST_SKIP() << "dciodvfy comparison: " << skip_message(real_file("dicom/highdicom"));
  }
  expect_no_new_dciodvfy_errors(seg_path);
}

TEST(DicomVerbs, DicomSegOfTheCmuSeries) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  if (!fs::exists(series)) GTEST_SKIP() << skip_message(series);
  const testing::TempDir dir;
  const auto r = run("infer --checkpoint " + checkpoint() + " --slides " + series.string() + " --out " +
                     dir.file("infer") + " --threads 2 --set infer.stride=32 --set outputs=[dicom-seg,heatmap.h5]");
  ASSERT_EQ(r.code, 0) << r.err;
  // The converter wrote no origin: the default is said.
  EXPECT_TRUE(contains(r.err + r.out, "no Total Pixel Matrix Origin: (0, 0) mm assumed")) << r.err;
  const std::string seg_path = dir.file("infer/cmu-1-small-region-dicom.seg.dcm");
  expect_seg_is_the_heatmap(pydicom_seg(seg_path),
                            io::read_heatmap(dir.file("infer/cmu-1-small-region-dicom.heatmap.h5")));
  expect_no_new_dciodvfy_errors(seg_path);
}

// A Segmentation must reference DICOM source images: asked of a TIFF slide, the slide fails saying why.
TEST(DicomVerbs, DicomSegIsRefusedForASlideThatIsNotDicom) {
  const testing::TempDir dir;
  auto r = run("synth --out " + dir.file("synth") + " --slides 1 --size 1024 --seed 5 --set preview.enabled=false");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("infer --checkpoint " + checkpoint() + " --slides " + dir.file("synth/slides/tumor_001.svs") + " --out " +
          dir.file("infer") + " --threads 1 --set infer.stride=32 --dicom-seg");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "a DICOM Segmentation must reference DICOM source images, and this slide is not DICOM"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir.path() / "infer/tumor_001.seg.dcm"));
}

}  // namespace
}  // namespace tessera
