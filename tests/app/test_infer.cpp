// `tessera infer` end to end on small synthetic slides with a tiny model trained for the suite: the heatmap's
// geometry follows the slide, the model's resolution and the stride, and it scores exactly the tissue cells; a
// cell on the tiling grid scores as `predict` scores that tile from the shards; one and two ranks splitting each
// slide's tiles give the same map bit for bit, and two and three ranks taking whole slides, or splitting the tiles of
// a slide that dwarfs the rest first, give every output file of one rank; test-time augmentation changes the scores and
// keeps them probabilities; the map finds the annotated tumour of a slide the model did not train on, and so does the
// DICOM Segmentation of that slide as a DICOM series; a slide that cannot be opened or read fails alone (on two ranks,
// only one of which reads the broken part), and job mistakes are refused naming the key.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include <dcmtk/config/osconfig.h>  // first of DCMTK's headers
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>

#include "core/metrics.h"
#include "io/annotations.h"
#include "io/checkpoint.h"
#include "io/dicom_writer.h"
#include "io/heatmap.h"
#include "io/image.h"
#include "io/qc_masks.h"
#include "io/slide.h"
#include "preprocessing/qc.h"
#include "preprocessing/tiling.h"
#include "preprocessing/tissue.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::damage_tiles;
using testing::run;
using testing::run_mpi;
using testing::TileDamage;

constexpr int kTile = 32;           // model input, pixels at kMpp
constexpr double kMpp = 1.0;        // the model's µm/px
constexpr double kSlideMpp = 0.25;  // tessera synth's default

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Four synthetic slides (two tumour, two normal: train, train, val, val) tiled at 32 px and 1 µm/px, and the tiny
// CNN trained on the train split for a few epochs; made once for the suite.
class Infer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = run("synth --out " + dir_->file("synth") +
                 " --slides 4 --size 2048 --seed 5 --set preview.enabled=false --set tumour.max_regions=3"
                 " --set split.train=0.5 --set split.val=0.5");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("tile.yaml")) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                                           << "output: " << dir_->file("shards") << "\n"
                                           << "tile:\n  size: " << kTile << "\n  mpp: " << kMpp << "\n"
                                           << "tissue:\n  min_fraction: 0.3\n";
    r = run("tile " + dir_->file("tile.yaml"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml"))
        << "data:\n  shards: " << dir_->file("shards") << "\n  block_size: 16\n  shuffle_buffer: 256\n"
        << "model:\n  architecture: tiny_cnn\n"
        << "train:\n  batch_size: 16\n  seed: 5\n"
        << "optimizer:\n  name: sgd\n  lr: 0.1\n  momentum: 0.9\n"
        << "schedule:\n  name: cosine\n  reference_batch: 0\n";
    r = run("train " + dir_->file("train.yaml") + " --out " + dir_->file("run") + " --epochs 4");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string checkpoint() { return dir_->file("run/checkpoint.h5"); }
  static std::string slide(const std::string& id) {
    const std::string svs = dir_->file("synth/slides/" + id + ".svs");
    return fs::exists(svs) ? svs : dir_->file("synth/slides/" + id + ".tif");
  }
  // `tessera infer` with the suite's checkpoint; only heatmap.h5 unless `args` says otherwise.
  static testing::Run infer(const std::string& slides, const std::string& out, const std::string& args = "",
                            int ranks = 1) {
    const std::string line = "infer --checkpoint " + checkpoint() + " --slides " + slides + " --out " +
                             dir_->file(out) + (contains(args, "outputs=") ? "" : " --set outputs=[heatmap.h5]") + " " +
                             args;
    return ranks == 1 ? run(line) : run_mpi(ranks, line);
  }
  static io::Heatmap heatmap(const std::string& out, const std::string& id) {
    return io::read_heatmap(dir_->file(out + "/" + id + ".heatmap.h5"));
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Infer::dir_ = nullptr;

// 0.7 → "0.7", 0.5 → "0.5": a number as the saved job writes it.
std::string fmt_number(double v) {
  std::ostringstream text;
  text << v;
  return text.str();
}

// Exactly equal, NaN where NaN: the bytes.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_F(Infer, TheMapCoversTheSlideAtTheStrideAndScoresTheTissueCells) {
  const std::string id = "tumor_002";
  for (const int stride : {0, 32}) {
    const std::string out = "geometry" + std::to_string(stride);
    // The tissue rule: the checkpoint's (its tiling kept tiles with 0.3 tissue), or the job's when it sets one.
    const double min_fraction = stride == 0 ? 0.3 : 0.5;
    const auto r =
        infer(slide(id), out,
              "--stride " + std::to_string(stride) + (stride == 0 ? std::string() : " --set tissue.min_fraction=0.5"));
    ASSERT_EQ(r.code, 0) << r.err;
    const io::Heatmap map = heatmap(out, id);

    // Geometry: level-0 lengths from the model's resolution; the default stride is half a tile.
    const auto slide_file = io::Slide::open(slide(id));
    EXPECT_EQ(map.slide_id, id);
    EXPECT_EQ(map.slide_width, slide_file.width());
    EXPECT_EQ(map.slide_height, slide_file.height());
    EXPECT_DOUBLE_EQ(map.slide_mpp, kSlideMpp);
    EXPECT_DOUBLE_EQ(map.tile_mpp, kMpp);
    EXPECT_EQ(map.checkpoint, fs::absolute(checkpoint()).lexically_normal().string());
    const std::int64_t step = std::llround((stride == 0 ? kTile / 2 : stride) * kMpp / kSlideMpp);
    const std::int64_t tile = std::llround(kTile * kMpp / kSlideMpp);
    EXPECT_EQ(map.step, step);
    EXPECT_EQ(map.tile, tile);
    EXPECT_EQ(map.origin_x, 0);
    EXPECT_EQ(map.origin_y, 0);
    EXPECT_EQ(map.cols, (map.slide_width - tile) / step + 1);
    EXPECT_EQ(map.rows, (map.slide_height - tile) / step + 1);
    // Every cell lies inside the slide, and one more column or row would not.
    EXPECT_LE(map.origin_x + (map.cols - 1) * step + tile, map.slide_width);
    EXPECT_GT(map.origin_x + map.cols * step + tile, map.slide_width);
    EXPECT_LE(map.origin_y + (map.rows - 1) * step + tile, map.slide_height);

    // The scored cells are exactly those with at least min_fraction of their tile on tissue (tile's rule and
    // mask).
    const auto tissue = prep::detect_tissue(slide_file, prep::TissueOptions{});
    std::vector<std::int64_t> xs, ys;
    for (int j = 0; j < map.cols; ++j) xs.push_back(map.origin_x + j * step);
    for (int i = 0; i < map.rows; ++i) ys.push_back(map.origin_y + i * step);
    const auto fractions = prep::tissue_fractions(tissue, xs, ys, kTile * kMpp / kSlideMpp);
    ASSERT_EQ(map.prob.size(), fractions.size());
    std::int64_t scored = 0;
    for (std::size_t c = 0; c < map.prob.size(); ++c) {
      const float p = map.prob[c];
      ASSERT_EQ(!std::isnan(p), fractions[c] >= min_fraction) << "cell " << c << ": tissue fraction " << fractions[c];
      if (!std::isnan(p)) {
        ASSERT_GE(p, 0.0f);
        ASSERT_LE(p, 1.0f);
        ++scored;
      }
    }
    EXPECT_GT(scored, 20);
    EXPECT_LT(scored, static_cast<std::int64_t>(map.prob.size()));

    const json summary = read_json(dir_->file(out + "/infer.json"));
    ASSERT_EQ(summary["slides"].size(), 1u);
    EXPECT_EQ(summary["slides"][0]["tiles"].get<std::int64_t>(), scored);
    EXPECT_EQ(summary["stride"].get<int>(), stride == 0 ? kTile / 2 : stride);
    EXPECT_TRUE(contains(r.err + r.out, dir_->file(out))) << "the end of the run says where the outputs are";
  }
}

TEST_F(Infer, ACellScoresItsTileAsPredictScoresTheSameTileFromTheShards) {
  // With the stride of the tiling grid (32 px at 1 µm/px: 128 level-0 px), cell (i, j) is the shard tile at
  // (128 j, 128 i): read, resampled and scored as tile + predict did, so the same probability up to the float
  // rounding of another batch composition.
  const auto predicted = run("predict --checkpoint " + checkpoint() + " --shards " + dir_->file("shards") +
                             " --splits val --out " + dir_->file("aligned/predictions.csv"));
  ASSERT_EQ(predicted.code, 0) << predicted.err;
  // No tissue setting: the checkpoint brings its tiling's (0.3), so the map scores exactly the tiles the shards hold.
  const auto r = infer(slide("tumor_002") + "," + slide("normal_002"), "aligned", "--stride 32");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream csv(dir_->file("aligned/predictions.csv"));
  std::string line;
  std::getline(csv, line);
  ASSERT_EQ(line, "slide_id,x,y,label,p_tumor");
  std::map<std::string, io::Heatmap> maps;
  int compared = 0;
  while (std::getline(csv, line)) {
    std::stringstream fields(line);
    std::string id, x, y, label, p;
    std::getline(fields, id, ',');
    std::getline(fields, x, ',');
    std::getline(fields, y, ',');
    std::getline(fields, label, ',');
    std::getline(fields, p, ',');
    if (!maps.contains(id)) maps.emplace(id, heatmap("aligned", id));
    const io::Heatmap& map = maps.at(id);
    ASSERT_EQ(map.step, 128);
    ASSERT_EQ(std::stoll(x) % map.step, 0) << line;
    ASSERT_EQ(std::stoll(y) % map.step, 0) << line;
    const float cell = map.at(static_cast<int>(std::stoll(y) / map.step), static_cast<int>(std::stoll(x) / map.step));
    ASSERT_FALSE(std::isnan(cell)) << "the tile " << line << " was not scored";
    ASSERT_NEAR(cell, std::stof(p), 1e-5f) << line;
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

TEST_F(Infer, TissueIsFoundAsTheCheckpointsTilingFoundItUnlessTheJobSaysOtherwise) {
  // Training recorded its shards' tiling settings (tile.yaml: min_fraction 0.3, the default mask).
  const auto meta = io::read_checkpoint_meta(checkpoint());
  ASSERT_TRUE(meta.tissue.has_value());
  EXPECT_EQ(*meta.tissue, (io::TissueSettings{0.3, 8.0, true}));

  // The same model recording other settings, and as a checkpoint from before they were recorded.
  io::Checkpoint other = io::read_checkpoint(checkpoint());
  other.meta.tissue = io::TissueSettings{0.7, 16.0, false};
  io::write_checkpoint(dir_->file("tissue_other.h5"), other);
  io::Checkpoint old = other;
  old.meta.tissue.reset();
  io::write_checkpoint(dir_->file("tissue_none.h5"), old);

  const std::string id = "tumor_002";
  const auto slide_file = io::Slide::open(slide(id));
  struct Case {
    std::string checkpoint, args;
    io::TissueSettings expected;
  };
  const std::vector<Case> cases = {
      {"tissue_other.h5", "", {0.7, 16.0, false}},                               // all three from /meta
      {"tissue_other.h5", "--set tissue.min_fraction=0.4", {0.4, 16.0, false}},  // the job's key wins
      {"tissue_none.h5", "", {0.5, 8.0, true}},                                  // none recorded: the defaults
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(c.checkpoint + " " + c.args);
    const std::string out = "tissue" + std::to_string(k);
    const auto r = run("infer --checkpoint " + dir_->file(c.checkpoint) + " --slides " + slide(id) + " --out " +
                       dir_->file(out) + " --set outputs=[heatmap.h5] --stride 32 --set qc.enabled=false " + c.args);
    ASSERT_EQ(r.code, 0) << r.err;
    // The scored cells are those the expected mask and rule give, so every setting reached the tissue mask.
    const io::Heatmap map = heatmap(out, id);
    prep::TissueOptions tissue_options;
    tissue_options.mask_mpp = c.expected.mask_mpp;
    tissue_options.reject_pen_marks = c.expected.reject_pen_marks;
    const auto tissue = prep::detect_tissue(slide_file, tissue_options);
    std::vector<std::int64_t> xs, ys;
    for (int j = 0; j < map.cols; ++j) xs.push_back(map.origin_x + j * map.step);
    for (int i = 0; i < map.rows; ++i) ys.push_back(map.origin_y + i * map.step);
    const auto fractions = prep::tissue_fractions(tissue, xs, ys, kTile * kMpp / kSlideMpp);
    ASSERT_EQ(map.prob.size(), fractions.size());
    std::int64_t scored = 0;
    for (std::size_t cell = 0; cell < fractions.size(); ++cell) {
      ASSERT_EQ(!std::isnan(map.prob[cell]), fractions[cell] >= c.expected.min_fraction)
          << "cell " << cell << ": tissue fraction " << fractions[cell];
      scored += std::isnan(map.prob[cell]) ? 0 : 1;
    }
    EXPECT_GT(scored, 10);
    // The effective job records the values used.
    std::ifstream saved(dir_->file(out + "/infer.config.yaml"));
    const std::string yaml((std::istreambuf_iterator<char>(saved)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(yaml, "min_fraction: " + fmt_number(c.expected.min_fraction))) << yaml;
    EXPECT_TRUE(contains(yaml, std::string("reject_pen_marks: ") + (c.expected.reject_pen_marks ? "true" : "false")))
        << yaml;
  }
  // Scoring fewer cells with the stricter rule is what the first case's check above relies on; the rules differ.
  EXPECT_NE(heatmap("tissue0", id).scored_cells(), heatmap("tissue2", id).scored_cells());
}

TEST_F(Infer, OneAndTwoRanksGiveTheSameMapBitForBit) {
  // One rank takes the slides from the dataset.csv's val split, two ranks from a list of files. Small batches: the
  // two ranks each take several, and a last partial one.
  const auto one = infer(dir_->file("synth/dataset.csv"), "ranks1", "--splits val --batch 7");
  ASSERT_EQ(one.code, 0) << one.err;
  const auto two =
      infer(slide("tumor_002") + "," + slide("normal_002"), "ranks2", "--batch 7 --set infer.distribute=tiles", 2);
  ASSERT_EQ(two.code, 0) << two.err;
  std::vector<std::string> ids;
  const json summary = read_json(dir_->file("ranks1/infer.json"));
  for (const auto& s : summary["slides"]) ids.push_back(s["id"]);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"normal_002", "tumor_002"})) << "the val split's slides";
  for (const auto& id : ids) {
    const io::Heatmap a = heatmap("ranks1", id);
    const io::Heatmap b = heatmap("ranks2", id);
    EXPECT_EQ(a.rows, b.rows);
    EXPECT_EQ(a.cols, b.cols);
    EXPECT_EQ(a.step, b.step);
    EXPECT_TRUE(same_bits(a.prob, b.prob)) << id;
    EXPECT_GT(a.scored_cells(), 0) << id;
  }
  EXPECT_EQ(read_json(dir_->file("ranks2/infer.json"))["ranks"].get<int>(), 2);
  EXPECT_EQ(read_json(dir_->file("ranks2/infer.json"))["distribute"], "tiles");
  // Fewer slides than ranks: by default (infer.distribute auto) the ranks split the slide's tiles.
  const auto lone = infer(slide("tumor_002"), "ranks2-lone", "--batch 7", 2);
  ASSERT_EQ(lone.code, 0) << lone.err;
  EXPECT_EQ(read_json(dir_->file("ranks2-lone/infer.json"))["distribute"], "tiles");
  EXPECT_TRUE(same_bits(heatmap("ranks1", "tumor_002").prob, heatmap("ranks2-lone", "tumor_002").prob));

  // Test-time augmentation: the mean over four views differs from the one view, and is still a probability.
  const auto flips = infer(slide("tumor_002"), "tta_flips", "--tta flips");
  ASSERT_EQ(flips.code, 0) << flips.err;
  const io::Heatmap none = heatmap("ranks1", "tumor_002");
  const io::Heatmap mean = heatmap("tta_flips", "tumor_002");
  ASSERT_EQ(none.prob.size(), mean.prob.size());
  double largest_change = 0.0;
  for (std::size_t c = 0; c < none.prob.size(); ++c) {
    ASSERT_EQ(std::isnan(none.prob[c]), std::isnan(mean.prob[c])) << "cell " << c;
    if (std::isnan(none.prob[c])) continue;
    ASSERT_GE(mean.prob[c], 0.0f);
    ASSERT_LE(mean.prob[c], 1.0f);
    largest_change = std::max(largest_change, std::fabs(static_cast<double>(none.prob[c]) - mean.prob[c]));
  }
  EXPECT_GT(largest_change, 1e-3) << "four views of each tile score as one does";
  EXPECT_EQ(read_json(dir_->file("tta_flips/infer.json"))["tta"], "flips");
}

TEST_F(Infer, TheMapFindsTheTumourOfASlideTheModelDidNotTrainOn) {
  // tumor_002 is in the val split: the model never trained on it.
  const std::string id = "tumor_002";
  const auto r = infer(slide(id), "truth", "--set outputs=[]");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* suffix : {".heatmap.h5", ".overlay.png", ".heatmap.tif", ".geojson", ".xml", ".detections.csv",
                             ".report.json", ".qc.png"}) {
    EXPECT_TRUE(fs::exists(dir_->file("truth/" + id + suffix))) << suffix;
  }
  EXPECT_EQ(read_json(dir_->file("truth/infer.json"))["slides"][0]["outputs"].size(), 8u) << "7 and QC's masks";
  EXPECT_TRUE(fs::exists(dir_->file("truth/infer.config.yaml")));
  const io::Heatmap map = heatmap("truth", id);
  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(io::read_annotations(dir_->file("synth/slides/" + id + ".xml")), io::AnnotationClasses{},
                        tumour, exclusion);
  ASSERT_FALSE(tumour.empty());

  // Cells whose tile is mostly annotated tumour against cells without any: the map ranks them apart.
  std::vector<float> scores;
  std::vector<std::uint8_t> labels;
  float best = -1.0f;
  double best_fraction = 0.0;
  for (int i = 0; i < map.rows; ++i) {
    for (int j = 0; j < map.cols; ++j) {
      const float p = map.at(i, j);
      if (std::isnan(p)) continue;
      const double fraction =
          prep::tumour_fraction(tumour, exclusion, static_cast<double>(j * map.step), static_cast<double>(i * map.step),
                                static_cast<double>(map.tile), 32);
      if (p > best) {
        best = p;
        best_fraction = fraction;
      }
      if (fraction >= 0.5 || fraction == 0.0) {
        scores.push_back(p);
        labels.push_back(fraction >= 0.5 ? 1 : 0);
      }
    }
  }
  const auto positives = std::count(labels.begin(), labels.end(), 1);
  ASSERT_GE(positives, 5);
  const double auc = core::roc_auc(scores, labels);
  EXPECT_GT(auc, 0.85) << positives << " tumour cells of " << labels.size();
  EXPECT_GT(best_fraction, 0.0) << "the highest-scoring cell (P " << best << ") has no annotated tumour";

  // The report's regions are where the tumour is: the largest region's peak lies on annotated tumour.
  const json report = read_json(dir_->file("truth/" + id + ".report.json"));
  ASSERT_FALSE(report["regions"].empty()) << report.dump(2);
  const auto peak = report["regions"][0]["peak"];
  const double half = static_cast<double>(map.step) / 2.0;
  EXPECT_GT(prep::tumour_fraction(tumour, exclusion, peak[0].get<double>() - half, peak[1].get<double>() - half,
                                  2.0 * half, 16),
            0.0)
      << report["regions"][0].dump();

  // tessera evaluate reads these outputs as they are: the slide is scored with its report's slide score and its
  // detections hit its lesions. (The other val slides have no outputs here: listed, scored as without detections.)
  const auto e = run("evaluate --dataset " + dir_->file("synth/dataset.csv") + " --detections " + dir_->file("truth") +
                     " --splits val --out " + dir_->file("evaluation"));
  ASSERT_EQ(e.code, 0) << e.out << e.err;
  const json evaluation = read_json(dir_->file("evaluation/evaluation.json"));
  bool found = false;
  for (const auto& s : evaluation["per_slide"]) {
    if (s["slide_id"] != id) continue;
    found = true;
    EXPECT_DOUBLE_EQ(s["score"].get<double>(), report["slide_score"].get<double>()) << s.dump();
    EXPECT_GT(s["true_positives"].get<int>(), 0) << s.dump();
  }
  EXPECT_TRUE(found) << evaluation.dump(2);
}

TEST_F(Infer, ASlideThatCannotBeOpenedOrReadFailsAloneOnTwoRanks) {
  const fs::path bad = dir_->file("bad");
  fs::create_directories(bad);
  // Cut short: OpenSlide refuses it when rank 0 opens it to plan.
  fs::copy_file(slide("tumor_001"), bad / "truncated.svs");
  fs::resize_file(bad / "truncated.svs", fs::file_size(bad / "truncated.svs") / 3);
  // Opens and plans (the tissue mask comes from its smallest level), but the level its tiles are read from has
  // its lowest row of TIFF tiles zeroed: only the second rank, whose share holds the lower part of the tissue,
  // fails, while reading.
  const auto r = run("synth --out " + (bad / "big").string() +
                     " --slides 1 --size 4096 --seed 9 --set preview.enabled=false --set slides.flavour=generic"
                     " --set slides.tumour_fraction=1");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string broken = (bad / "unreadable.tif").string();
  fs::copy_file(bad / "big/slides/tumor_001.tif", broken);
  // 4096 px at 0.25 µm/px: levels 4096, 2048, 1024, 512. Tiles at 1 µm/px come from level 2 (1024 px, 4 rows of
  // 256-px TIFF tiles, the last from level-0 y = 3072 on); the tissue mask at 8 µm/px from level 3.
  ASSERT_EQ(damage_tiles(
                broken, 2, [](std::uint32_t, std::uint32_t row) { return row >= 3; }, TileDamage::zeros),
            4);
  const auto slide_file = io::Slide::open(broken);
  ASSERT_EQ(slide_file.level_count(), 4);
  ASSERT_EQ(slide_file.best_level_for_mpp(kMpp), 2);

  const std::string slides =
      slide("tumor_001") + "," + (bad / "truncated.svs").string() + "," + broken + "," + slide("normal_002");
  const auto two = infer(slides, "failures", "--distribute tiles", 2);
  EXPECT_EQ(two.code, 3) << two.err;
  EXPECT_TRUE(contains(two.err, "truncated.svs")) << two.err;
  EXPECT_TRUE(contains(two.err, "unreadable.tif") && contains(two.err, "cannot decode")) << two.err;
  EXPECT_TRUE(contains(two.err, "2 of 4 slides failed")) << two.err;
  EXPECT_TRUE(fs::exists(dir_->file("failures/tumor_001.heatmap.h5")));
  EXPECT_TRUE(fs::exists(dir_->file("failures/normal_002.heatmap.h5")));
  EXPECT_FALSE(fs::exists(dir_->file("failures/truncated.heatmap.h5")));
  EXPECT_FALSE(fs::exists(dir_->file("failures/unreadable.heatmap.h5")));
  const json summary = read_json(dir_->file("failures/infer.json"));
  EXPECT_EQ(summary["slides"].size(), 2u);
  EXPECT_EQ(summary["failures"].size(), 2u);
  // The good slides' maps are the ones a run without the bad slides gives.
  const auto clean = infer(slide("tumor_001") + "," + slide("normal_002"), "clean");
  ASSERT_EQ(clean.code, 0) << clean.err;
  for (const std::string id : {"tumor_001", "normal_002"}) {
    EXPECT_TRUE(same_bits(heatmap("failures", id).prob, heatmap("clean", id).prob)) << id;
  }
}

// A summary or record less what says how long things took (keys "seconds", "…_seconds", "…_seconds_by_output",
// "tiles_per_second"): what must not depend on the ranks.
json without_timings(const json& value) {
  if (value.is_array()) {
    json out = json::array();
    for (const auto& v : value) out.push_back(without_timings(v));
    return out;
  }
  if (!value.is_object()) return value;
  json out = json::object();
  for (const auto& [key, v] : value.items()) {
    if (key == "seconds" || key == "tiles_per_second" || contains(key, "_seconds")) continue;
    out[key] = without_timings(v);
  }
  return out;
}

// The files of an output folder (its record folder included) by path relative to it, less the folder's lock (which
// names the process that held it).
std::vector<std::string> files_under(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    if (!entry.is_regular_file() || entry.path().filename() == ".tessera.lock") continue;
    names.push_back(fs::relative(entry.path(), folder).string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects the file `name` of output folder `folder` to be `reference`'s: a heatmap field by field and its
// probabilities bit for bit (the bytes of two heatmap.h5 differ even between two one-rank runs: HDF5 stamps objects
// with their creation time), a JSON file less its timings, every other file (overlay, TIFF, GeoJSON, XML, CSV) byte for
// byte.
void expect_same_output(const fs::path& reference, const fs::path& folder, const std::string& name) {
  const fs::path a = reference / name;
  const fs::path b = folder / name;
  ASSERT_TRUE(fs::exists(a)) << "a one-rank run writes no " << name;
  if (contains(name, ".heatmap.h5")) {
    const io::Heatmap x = io::read_heatmap(a.string());
    const io::Heatmap y = io::read_heatmap(b.string());
    EXPECT_EQ(x.slide_id, y.slide_id);
    EXPECT_EQ(x.slide_path, y.slide_path);
    EXPECT_EQ(x.slide_width, y.slide_width);
    EXPECT_EQ(x.slide_height, y.slide_height);
    EXPECT_EQ(x.slide_mpp, y.slide_mpp);
    EXPECT_EQ(x.tile_mpp, y.tile_mpp);
    EXPECT_EQ(x.origin_x, y.origin_x);
    EXPECT_EQ(x.origin_y, y.origin_y);
    EXPECT_EQ(x.step, y.step);
    EXPECT_EQ(x.tile, y.tile);
    EXPECT_EQ(x.rows, y.rows);
    EXPECT_EQ(x.cols, y.cols);
    EXPECT_EQ(x.checkpoint, y.checkpoint);
    EXPECT_TRUE(same_bits(x.prob, y.prob));
    EXPECT_GT(x.scored_cells(), 0);
  } else if (fs::path(name).extension() == ".json") {
    EXPECT_EQ(without_timings(read_json(a)), without_timings(read_json(b)));
  } else {
    EXPECT_TRUE(file_text(a) == file_text(b)) << "the bytes differ";
  }
}

// Whole slides handed out to the ranks (more slides than ranks): each rank plans, scores and writes its own slides,
// and whichever rank took which, every output is one rank's (expect_same_output; the job file less its output
// folder). A slide that cannot be opened fails alone. On three ranks one slide dwarfs the rest (its file is more than
// a third of the job's): by default its tiles are split over the ranks first and the others go whole, with the outputs
// of one rank again; SIGUSR1 after that slide stops the job there, with its outputs and record those of one rank.
TEST_F(Infer, WholeAndSplitSlidesOnTwoAndThreeRanksGiveTheOutputsOfOneRank) {
  const fs::path extra = dir_->file("whole-extra");
  fs::create_directories(extra);
  // A fifth slide, larger than the suite's (it is handed out first), and one cut short.
  const auto r = run("synth --out " + (extra / "synth").string() +
                     " --slides 1 --size 3584 --seed 11 --set preview.enabled=false --set slides.tumour_fraction=1");
  ASSERT_EQ(r.code, 0) << r.err;
  fs::path made = extra / "synth/slides/tumor_001.svs";
  if (!fs::exists(made)) made = extra / "synth/slides/tumor_001.tif";
  const fs::path large = extra / ("large" + made.extension().string());
  fs::copy_file(made, large);
  const fs::path truncated = extra / "truncated.svs";
  fs::copy_file(slide("tumor_001"), truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 3);
  const std::vector<std::string> files = {slide("tumor_001"), slide("normal_001"), truncated.string(),
                                          large.string(),     slide("tumor_002"),  slide("normal_002")};
  std::string slides;
  std::uintmax_t total = 0;
  std::size_t next = 0;  // the largest file but the large slide's (the first of equal ones): the first whole slide
  for (std::size_t k = 0; k < files.size(); ++k) {
    slides += (slides.empty() ? "" : ",") + files[k];
    total += fs::file_size(files[k]);
    if (files[k] != large.string() &&
        (files[next] == large.string() || fs::file_size(files[k]) > fs::file_size(files[next]))) {
      next = k;
    }
  }
  // The large slide's file is more than a third of the job's, but less than half, and no other is a third of the rest.
  ASSERT_GT(3 * fs::file_size(large), total);
  ASSERT_LT(2 * fs::file_size(large), total);
  ASSERT_LT(3 * fs::file_size(files[next]), total - fs::file_size(large));
  const std::string all_outputs = "--set outputs=[] --batch 7";

  const auto one = infer(slides, "whole1", all_outputs);
  EXPECT_EQ(one.code, 3) << one.err;
  EXPECT_TRUE(contains(one.err, "1 of 6 slides failed")) << one.err;
  const fs::path reference = dir_->file("whole1");
  const auto names = files_under(reference);
  ASSERT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) { return contains(n, "heatmap.h5"); }),
            5);
  for (const int ranks : {2, 3}) {
    const std::string out = "whole" + std::to_string(ranks);
    const auto many = infer(slides, out, all_outputs, ranks);
    EXPECT_EQ(many.code, 3) << many.err;
    EXPECT_TRUE(contains(many.err, "1 of 6 slides failed") && contains(many.err, "truncated.svs")) << many.err;
    if (ranks == 3) {
      EXPECT_TRUE(contains(many.err, "1 with their tiles split over the ranks first") &&
                  contains(many.err, "then the other 5 whole"))
          << many.err;
    }
    const fs::path folder = dir_->file(out);
    ASSERT_EQ(files_under(folder), names) << ranks << " ranks";
    for (const auto& name : names) {
      SCOPED_TRACE(name + " on " + std::to_string(ranks) + " ranks");
      if (name == "infer.json") {
        json x = without_timings(read_json(reference / name));
        json y = without_timings(read_json(folder / name));
        EXPECT_EQ(x["distribute"], "tiles");
        EXPECT_EQ(x["split_slides"], json::array()) << "one rank: every slide split, none named";
        EXPECT_EQ(y["distribute"], ranks == 2 ? "slides" : "tiles+slides");
        EXPECT_EQ(y["split_slides"], ranks == 2 ? json::array() : json::array({"large"}));
        EXPECT_EQ(y["ranks"], ranks);
        ASSERT_EQ(y["per_rank"].size(), static_cast<std::size_t>(ranks));
        int scored = 0;
        const json per_rank = read_json(folder / name)["per_rank"];
        for (const auto& rank : per_rank) {
          scored += rank["slides"].get<int>();
          EXPECT_GE(rank["idle_fraction"].get<double>(), 0.0);
          EXPECT_LE(rank["idle_fraction"].get<double>(), 1.0);
        }
        EXPECT_EQ(scored, ranks == 2 ? 5 : 3 + 4) << "each slide that opens scored by one rank, the large one by all";
        for (const char* key : {"ranks", "threads_per_rank", "distribute", "split_slides", "per_rank"}) {
          x.erase(key);
          y.erase(key);
        }
        EXPECT_EQ(x, y);
        EXPECT_EQ(x["slides"].size(), 5u);
        EXPECT_EQ(x["failures"].size(), 1u);
      } else if (name == "infer.config.yaml") {
        std::string text = file_text(folder / name);
        const std::string folder_text = folder.string();
        const auto at = text.find(folder_text);
        ASSERT_NE(at, std::string::npos) << "the job file names its output folder";
        text.replace(at, folder_text.size(), reference.string());
        EXPECT_EQ(file_text(reference / name), text);
      } else {
        expect_same_output(reference, folder, name);
      }
    }
  }

  // SIGUSR1 on rank 1 of three once it has scored its share of the large slide: every rank stops before the whole
  // slides (the largest of them first), and the large slide's outputs and record are one rank's; a rerun of it finds it
  // up to date and lists the record's entry.
  const fs::path stopped_out = dir_->file("whole3-usr1");
  const auto stopped = testing::run_script(
      "TESSERA_FAULT='infer.slide-scored after=1 rank=1 do=usr1' $MPIEXEC -n 3 $TESSERA infer --checkpoint " +
      checkpoint() + " --slides " + slides + " --out " + stopped_out.string() + " " + all_outputs +
      " 2>&1\necho \"exit $?\"\n");
  EXPECT_TRUE(contains(stopped.out, "exit 75\n")) << stopped.out;
  const std::string before = std::to_string(next + 1) + "/6 " + fs::path(files[next]).stem().string();
  EXPECT_TRUE(contains(stopped.out, "SIGUSR1: stopped before slide " + before + " (5 of 6 slide(s) not started)"))
      << stopped.out;
  EXPECT_FALSE(fs::exists(stopped_out / "infer.json")) << "the job's summary is the rerun's";
  std::vector<std::string> written;
  for (const auto& name : files_under(stopped_out)) {
    if (name == "infer.config.yaml") continue;
    SCOPED_TRACE(name + " after SIGUSR1");
    written.push_back(name);
    expect_same_output(reference, stopped_out, name);
  }
  EXPECT_TRUE(std::all_of(written.begin(), written.end(),
                          [](const std::string& n) { return n.starts_with("large.") || contains(n, "/large."); }));
  EXPECT_TRUE(std::find(written.begin(), written.end(), "large.heatmap.h5") != written.end());
  EXPECT_TRUE(std::find(written.begin(), written.end(), ".tessera-infer/large.json") != written.end());
  const auto rerun = infer(large.string(), "whole3-usr1", all_outputs, 3);
  EXPECT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_TRUE(contains(rerun.err, "slide 1/1 large: up to date")) << rerun.err;
  const json summary = without_timings(read_json(stopped_out / "infer.json"));
  const json listed = without_timings(read_json(reference / "infer.json"));
  json large_entry;
  for (const auto& entry : listed["slides"]) {
    if (entry["id"] == "large") large_entry = entry;
  }
  EXPECT_EQ(summary["slides"], json::array({large_entry})) << "the record's entry: the one a one-rank run lists";
  EXPECT_EQ(summary["tiles"], 0) << "nothing scored again";
}

// Slide quality control inside infer: a slide with marker ink (green/blue/black and red) loses the cells mostly under
// excluded artefacts — exactly those, by QC's own masks — and says so in report.json and the overlay; a region
// touching an artefact names it; qc.enabled: false scores every tissue cell, and actions set to flag score every
// cell too but keep the areas in the report.
TEST_F(Infer, QualityControlExcludesArtefactCellsAndReportsThem) {
  const std::string artefacts = dir_->file("artefacts");
  auto r = run("synth --out " + artefacts +
               " --slides 1 --size 2048 --seed 77 --set slides.mpp=1.0 --set slides.tumour_fraction=0 --set "
               "preview.enabled=false"
               " --set artefacts.pen_marks=true --set artefacts.red_ink=true --set artefacts.blur=false");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string path = artefacts + "/slides/normal_001.svs";
  const std::string outputs = " --set outputs=[heatmap.h5,report.json,overlay.png] --stride 32";
  r = infer(path, "qc_on", outputs);
  ASSERT_EQ(r.code, 0) << r.err;
  r = infer(path, "qc_off", outputs + " --set qc.enabled=false");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string flag_all = outputs;
  for (const prep::Artefact a : prep::all_artefacts()) {
    flag_all += std::string(" --set qc.") + prep::to_string(a) + ".action=flag";
  }
  flag_all += " --set qc.severe_blur_ratio=0";
  r = infer(path, "qc_flag", flag_all);
  ASSERT_EQ(r.code, 0) << r.err;

  const io::Heatmap on = heatmap("qc_on", "normal_001"), off = heatmap("qc_off", "normal_001"),
                    flagged = heatmap("qc_flag", "normal_001");
  // Which cells QC excludes, from its own masks: the rule the engine applies.
  const prep::QcResult qc = prep::run_qc(io::Slide::open(path), prep::QcOptions{});
  prep::TissueMask excluded = qc.tissue;
  excluded.mask = qc.excluded();
  std::vector<std::int64_t> xs, ys;
  for (int j = 0; j < on.cols; ++j) xs.push_back(on.origin_x + j * on.step);
  for (int i = 0; i < on.rows; ++i) ys.push_back(on.origin_y + i * on.step);
  const auto fractions = prep::tissue_fractions(excluded, xs, ys, static_cast<double>(on.tile));
  std::int64_t dropped = 0;
  for (std::size_t cell = 0; cell < on.prob.size(); ++cell) {
    if (std::isnan(off.prob[cell])) {
      EXPECT_TRUE(std::isnan(on.prob[cell])) << "cell " << cell;
      continue;
    }
    const bool expect_scored = fractions[cell] <= prep::QcOptions{}.max_fraction;
    ASSERT_EQ(!std::isnan(on.prob[cell]), expect_scored) << "cell " << cell << ": excluded " << fractions[cell];
    if (expect_scored) {
      EXPECT_NEAR(on.prob[cell], off.prob[cell], 1e-5) << "a scored cell scores as without QC";
    } else {
      ++dropped;
    }
  }
  EXPECT_GT(dropped, 5) << "the ink excludes cells";
  EXPECT_EQ(flagged.scored_cells(), off.scored_cells()) << "flag scores every tissue cell";

  const json report_on = read_json(dir_->file("qc_on/normal_001.report.json"));
  ASSERT_TRUE(report_on["qc"].is_object()) << report_on.dump(2);
  EXPECT_GT(report_on["qc"]["excluded_area_mm2"].get<double>(), 0.01);
  EXPECT_EQ(report_on["qc"]["excluded_cells"].get<std::int64_t>(), dropped);
  EXPECT_EQ(report_on["qc"]["classes"].size(), 9u);
  EXPECT_TRUE(read_json(dir_->file("qc_off/normal_001.report.json"))["qc"].is_null());
  const json report_flag = read_json(dir_->file("qc_flag/normal_001.report.json"));
  EXPECT_GT(report_flag["qc"]["flagged_area_mm2"].get<double>(), 0.01);
  EXPECT_EQ(report_flag["qc"]["excluded_cells"].get<std::int64_t>(), 0);
  // Every region carries the artefacts it touches (an array, empty when none).
  for (const auto& region : report_on["regions"]) EXPECT_TRUE(region["artefacts"].is_array());
  const auto text = io::read_png_text(dir_->file("qc_on/normal_001.overlay.png"));
  ASSERT_TRUE(text.contains("QC"));
  EXPECT_TRUE(contains(text.at("QC"), "excluded")) << text.at("QC");
  // QC's masks beside the outputs: the excluded bit is exactly what infer excluded by, the flagged bit empty here.
  const cv::Mat1w bits = io::read_qc_masks_png(dir_->file("qc_on/normal_001.qc.png"));
  ASSERT_EQ(bits.size(), qc.excluded().size());
  EXPECT_EQ(cv::countNonZero(io::qc_mask_of(bits, io::kQcExcludedBit) != qc.excluded()), 0);
  EXPECT_EQ(cv::countNonZero(io::qc_mask_of(bits, io::kQcFlaggedBit) != qc.flagged()), 0);
  EXPECT_GT(cv::countNonZero(io::qc_mask_of(bits, io::kQcExcludedBit)), 0);
  EXPECT_FALSE(fs::exists(dir_->file("qc_off/normal_001.qc.png"))) << "no QC, no masks";
  const cv::Mat1w flag_bits = io::read_qc_masks_png(dir_->file("qc_flag/normal_001.qc.png"));
  EXPECT_EQ(cv::countNonZero(io::qc_mask_of(flag_bits, io::kQcExcludedBit)), 0) << "every action flag";
  EXPECT_GT(cv::countNonZero(io::qc_mask_of(flag_bits, io::kQcFlaggedBit)), 0);
}

TEST_F(Infer, RefusesJobMistakesNamingTheKey) {
  auto r = run("infer --slides " + slide("tumor_001") + " --out " + dir_->file("mistakes"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "checkpoint")) << r.err;

  r = infer(dir_->file("synth/slides/*.nothing"), "mistakes");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "no slide matches")) << r.err;

  r = infer(slide("tumor_001"), "mistakes", "--set outputs=[heatmap.h5,picture.gif]");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "picture.gif") && contains(r.err, "overlay.png")) << r.err;

  r = run("infer --checkpoint " + dir_->file("synth/dataset.csv") + " --slides " + slide("tumor_001") + " --out " +
          dir_->file("mistakes"));
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, "dataset.csv")) << r.err;

  r = run("infer --print-config --checkpoint c.h5 --stride 24");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "stride: 24")) << r.out;
  EXPECT_TRUE(contains(r.out, "tta: none")) << r.out;
}

// A DICOM Segmentation as DCMTK reads it: its total pixel matrix (frames placed by their Plane Position (Slide)) and
// what places it on the slide.
struct Segmentation {
  cv::Mat1b pixels;
  double row_spacing_mm = 0.0;     // Pixel Spacing, first value
  double column_spacing_mm = 0.0;  // second value
  cv::Vec3d row_direction;         // Image Orientation (Slide): along a row (column index increasing)
  cv::Vec3d column_direction;      // down a column
  cv::Vec3d origin;                // Total Pixel Matrix Origin (Z 0)
};

Segmentation read_segmentation(const std::string& path) {
  DcmFileFormat file;
  Segmentation seg;
  EXPECT_TRUE(file.loadFile(path.c_str()).good()) << path;
  DcmDataset* ds = file.getDataset();
  Uint16 rows = 0;
  Uint16 columns = 0;
  Uint32 total_columns = 0;
  Uint32 total_rows = 0;
  ds->findAndGetUint16(DCM_Rows, rows);
  ds->findAndGetUint16(DCM_Columns, columns);
  ds->findAndGetUint32(DCM_TotalPixelMatrixColumns, total_columns);
  ds->findAndGetUint32(DCM_TotalPixelMatrixRows, total_rows);
  for (int k = 0; k < 3; ++k) {
    ds->findAndGetFloat64(DCM_ImageOrientationSlide, seg.row_direction[k], k);
    ds->findAndGetFloat64(DCM_ImageOrientationSlide, seg.column_direction[k], k + 3);
  }
  DcmItem* origin = nullptr;
  ds->findAndGetSequenceItem(DCM_TotalPixelMatrixOriginSequence, origin);
  EXPECT_NE(origin, nullptr);
  if (origin == nullptr) return seg;
  origin->findAndGetFloat64(DCM_XOffsetInSlideCoordinateSystem, seg.origin[0]);
  origin->findAndGetFloat64(DCM_YOffsetInSlideCoordinateSystem, seg.origin[1]);
  DcmItem* shared = nullptr;
  DcmItem* measures = nullptr;
  ds->findAndGetSequenceItem(DCM_SharedFunctionalGroupsSequence, shared);
  if (shared != nullptr) shared->findAndGetSequenceItem(DCM_PixelMeasuresSequence, measures);
  EXPECT_NE(measures, nullptr);
  if (measures == nullptr) return seg;
  measures->findAndGetFloat64(DCM_PixelSpacing, seg.row_spacing_mm, 0);
  measures->findAndGetFloat64(DCM_PixelSpacing, seg.column_spacing_mm, 1);
  const Uint8* data = nullptr;
  unsigned long bytes = 0;
  EXPECT_TRUE(ds->findAndGetUint8Array(DCM_PixelData, data, &bytes).good());
  seg.pixels = cv::Mat1b::zeros(static_cast<int>(total_rows), static_cast<int>(total_columns));
  const unsigned long frame_bytes = static_cast<unsigned long>(rows) * columns;
  for (unsigned long f = 0; data != nullptr && (f + 1) * frame_bytes <= bytes; ++f) {
    DcmItem* group = nullptr;
    DcmItem* position = nullptr;
    ds->findAndGetSequenceItem(DCM_PerFrameFunctionalGroupsSequence, group, static_cast<int>(f));
    if (group != nullptr) group->findAndGetSequenceItem(DCM_PlanePositionSlideSequence, position);
    EXPECT_NE(position, nullptr) << "frame " << f + 1;
    if (position == nullptr) break;
    Sint32 column = 0;
    Sint32 row = 0;
    position->findAndGetSint32(DCM_ColumnPositionInTotalImagePixelMatrix, column);
    position->findAndGetSint32(DCM_RowPositionInTotalImagePixelMatrix, row);
    const cv::Mat1b frame(rows, columns, const_cast<Uint8*>(data + f * frame_bytes));
    const cv::Rect inside =
        cv::Rect(column - 1, row - 1, columns, rows) & cv::Rect(0, 0, seg.pixels.cols, seg.pixels.rows);
    frame(cv::Rect(0, 0, inside.width, inside.height)).copyTo(seg.pixels(inside));
  }
  return seg;
}

// The Segmentation of a DICOM series, read back with DCMTK and placed on the slide by its own spacing, origin and
// orientation against the source series': every pixel above 0.5 (value ≥ 128 of 255) lies inside the slide's true
// tumour dilated by one cell.
TEST_F(Infer, TheSegmentationOfADicomSeriesMarksItsTumour) {
  const std::string id = "tumor_002";  // in the val split: the model never trained on it
  const std::string series = dir_->file("dicom/" + id);
  io::write_dicom_series(slide(id), series, {});  // the same JPEG tiles as a DICOM series
  const auto r = infer(series, "seg", "--set outputs=[heatmap.h5,dicom-seg]");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Heatmap map = heatmap("seg", id);
  const Segmentation seg = read_segmentation(dir_->file("seg/" + id + ".seg.dcm"));
  ASSERT_EQ(seg.pixels.cols, map.cols);
  ASSERT_EQ(seg.pixels.rows, map.rows);
  const io::Slide source = io::Slide::open(series);
  std::vector<double> orientation;
  std::stringstream text(source.property("dicom.image-orientation-slide").value_or(""));
  for (std::string v; std::getline(text, v, '\\');) orientation.push_back(std::stod(v));
  ASSERT_EQ(orientation.size(), 6u);
  const cv::Vec3d source_row(orientation[0], orientation[1], orientation[2]);
  const cv::Vec3d source_column(orientation[3], orientation[4], orientation[5]);
  const cv::Vec3d source_origin(std::stod(source.property("dicom.origin-x-mm").value_or("nan")),
                                std::stod(source.property("dicom.origin-y-mm").value_or("nan")), 0.0);
  // Level-0 pixel coordinates of the slide point at a SEG matrix position (column c, row r; corners at integers).
  const auto level0 = [&](double column, double row) {
    const cv::Vec3d at = seg.origin + column * seg.column_spacing_mm * seg.row_direction +
                         row * seg.row_spacing_mm * seg.column_direction - source_origin;
    return cv::Point2d(at.dot(source_row) * 1000.0 / source.mpp(), at.dot(source_column) * 1000.0 / source.mpp_y());
  };
  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(io::read_annotations(dir_->file("synth/slides/" + id + ".xml")), io::AnnotationClasses{},
                        tumour, exclusion);
  ASSERT_FALSE(tumour.empty());
  int above = 0;
  int outside = 0;
  for (int i = 0; i < seg.pixels.rows; ++i) {
    for (int j = 0; j < seg.pixels.cols; ++j) {
      if (seg.pixels(i, j) < 128) continue;
      ++above;
      const cv::Point2d a = level0(j, i);
      const cv::Point2d b = level0(j + 1, i + 1);
      const double side = std::max(std::abs(b.x - a.x), std::abs(b.y - a.y));
      const double step = static_cast<double>(map.step);
      if (prep::tumour_fraction(tumour, {}, std::min(a.x, b.x) - step, std::min(a.y, b.y) - step, side + 2 * step,
                                256) == 0.0) {
        ++outside;
        ADD_FAILURE() << "SEG pixel (" << i << ", " << j << ") = " << static_cast<int>(seg.pixels(i, j))
                      << " covers level-0 (" << a.x << ", " << a.y << ") - (" << b.x << ", " << b.y
                      << "), more than one cell from the tumour";
      }
    }
  }
  std::printf("dicom-seg of %s: %d of %d pixels above 0.5, %d of them beyond the tumour dilated by one cell\n",
              id.c_str(), above, seg.pixels.rows * seg.pixels.cols, outside);
  EXPECT_GE(above, 5) << "too few pixels above 0.5 for the check to mean anything";
}

}  // namespace
}  // namespace tessera
