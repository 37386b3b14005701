// `tessera tile` end to end on synthetic slides: shards, manifest, ranks, resume and bad input.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "io/annotations.h"
#include "io/dataset.h"
#include "io/shard.h"
#include "preprocessing/tiling.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run;
using testing::run_alone;
using testing::run_mpi;

// Four small synthetic slides (two tumour, two normal), made once for the whole suite.
class Tile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const auto r = run("synth --out " + dir_->file("synth") +
                       " --slides 4 --size 2048 --seed 7 --set preview.enabled=false --set tumour.max_regions=3");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A job over the synthetic set with small tiles so that every slide has a few hundred candidates.
  std::string job(const std::string& name, const std::string& extra = "") {
    const std::string path = dir_->file(name + ".yaml");
    std::ofstream(path) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                        << "output: " << dir_->file(name) << "\n"
                        << "tile:\n  size: 32\n  mpp: 1.0\n"
                        << "tissue:\n  min_fraction: 0.3\n"
                        << "shards:\n  tiles_per_shard: 100\n"
                        << extra;
    return path;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Tile::dir_ = nullptr;

TEST_F(Tile, WritesShardsAndAManifestThatAgree) {
  const auto r = run("tile " + job("basic"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string out = dir_->file("basic");
  const auto manifest = io::read_manifest(out + "/manifest.json");
  ASSERT_GT(manifest.total_tiles(), 200);
  EXPECT_EQ(manifest.slides.size(), 4u);
  EXPECT_TRUE(manifest.failures.empty());
  EXPECT_EQ(manifest.attributes.tile_size, 32);
  EXPECT_DOUBLE_EQ(manifest.attributes.mpp, 1.0);
  std::int64_t tumour = 0;
  for (const auto& s : manifest.shards) {
    EXPECT_LE(s.tiles, 100);
    tumour += s.tumour;
  }
  EXPECT_GT(tumour, 0);
  for (const auto& s : manifest.slides) {
    if (s.label == "normal") {
      EXPECT_EQ(s.tumour, 0) << s.id;  // normal slides have no tumour tiles
    }
  }
  EXPECT_TRUE(fs::exists(out + "/tile.config.yaml"));
  // Only finished files are left: no temporaries.
  for (const auto& e : fs::directory_iterator(out)) {
    EXPECT_FALSE(contains(e.path().string(), ".tmp-")) << e.path();
    EXPECT_FALSE(contains(e.path().string(), ".unchecked")) << e.path();
  }
}

// Quality control in tile: tiles mostly under marker ink are dropped, counted per slide and class in the manifest;
// with tile.artefact_tiles: keep they stay, counted as kept, each with its artefact bits in the shard, which agree
// with the masks `tessera qc` writes for the slide; with qc.enabled: false every tile stays, without the field.
TEST_F(Tile, QualityControlDropsOrKeepsArtefactTilesAndCountsThem) {
  const std::string inked = dir_->file("inked");
  auto r = run("synth --out " + inked +
               " --slides 1 --size 2048 --seed 78 --set slides.mpp=1.0 --set slides.tumour_fraction=0 --set "
               "preview.enabled=false"
               " --set artefacts.pen_marks=true --set artefacts.red_ink=true --set artefacts.blur=false");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto tile_job = [&](const std::string& name, const std::string& tile_extra, const std::string& extra) {
    const std::string path = dir_->file(name + ".yaml");
    std::ofstream(path) << "input:\n  csv: " << inked << "/dataset.csv\n"
                        << "output: " << dir_->file(name) << "\n"
                        << "tile:\n  size: 32\n  mpp: 1.0\n"
                        << tile_extra << "tissue:\n  min_fraction: 0.3\n  reject_pen_marks: false\n"
                        << extra;
    return path;
  };
  r = run("tile " + tile_job("qc_on", "", ""));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("tile " + tile_job("qc_keep", "  artefact_tiles: keep\n", ""));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("tile " + tile_job("qc_off", "", "qc:\n  enabled: false\n"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto on = io::read_manifest(dir_->file("qc_on/manifest.json"));
  const auto keep = io::read_manifest(dir_->file("qc_keep/manifest.json"));
  const auto off = io::read_manifest(dir_->file("qc_off/manifest.json"));
  ASSERT_EQ(on.slides.size(), 1u);
  ASSERT_EQ(keep.slides.size(), 1u);
  ASSERT_EQ(off.slides.size(), 1u);
  EXPECT_TRUE(off.slides[0].qc_dropped_tiles.empty());
  EXPECT_TRUE(off.slides[0].qc_kept_tiles.empty());
  EXPECT_TRUE(on.slides[0].qc_kept_tiles.empty());
  std::int64_t dropped = 0, ink_tiles = 0;
  for (const auto& [name, count] : on.slides[0].qc_dropped_tiles) {
    dropped += count;
    if (contains(name, "pen_")) ink_tiles += count;
  }
  EXPECT_GT(ink_tiles, 10);
  EXPECT_GT(ink_tiles, dropped / 2) << "the ink is most of what was dropped";
  EXPECT_EQ(on.slides[0].tiles + dropped, off.slides[0].tiles);
  // Kept: the same tiles by the same classes, none dropped, every tile of the slide in the shards.
  EXPECT_TRUE(keep.slides[0].qc_dropped_tiles.empty());
  EXPECT_EQ(keep.slides[0].qc_kept_tiles, on.slides[0].qc_dropped_tiles);
  EXPECT_EQ(keep.slides[0].tiles, off.slides[0].tiles);

  // The shards' artefact bits against QC's masks of the slide (<slide>.qc.png: bit k = class k, at the QC level).
  r = run("qc --csv " + inked + "/dataset.csv --out " + dir_->file("qc_masks"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string id = keep.slides[0].id;
  const cv::Mat masks = cv::imread(dir_->file("qc_masks/" + id + ".qc.png"), cv::IMREAD_UNCHANGED);
  ASSERT_EQ(masks.type(), CV_16UC1);
  const double downsample = 2048.0 / masks.cols;  // level-0 pixels per mask pixel (the slide is 2048 px wide)
  const double max_fraction = 0.1;                // qc.max_fraction's default
  // The share of the 32 px tile at (x, y) that class k's mask covers, by area.
  const auto share = [&](std::int64_t x, std::int64_t y, int k) {
    double covered = 0.0;
    for (int row = 0; row < masks.rows; ++row) {
      const double oy = std::min<double>(y + 32, (row + 1) * downsample) - std::max<double>(y, row * downsample);
      if (oy <= 0) continue;
      for (int col = 0; col < masks.cols; ++col) {
        const double ox = std::min<double>(x + 32, (col + 1) * downsample) - std::max<double>(x, col * downsample);
        if (ox > 0 && (masks.at<std::uint16_t>(row, col) >> k & 1u) != 0) covered += ox * oy;
      }
    }
    return covered / (32.0 * 32.0);
  };
  std::int64_t excluded = 0, clear_set = 0, clear_unset = 0;
  std::map<int, std::int64_t> set_by_class;
  for (const auto& entry : keep.shards) {
    const auto shard = io::ShardFile::open(dir_->file("qc_keep/" + entry.file));
    ASSERT_TRUE(shard.attributes().artefacts);
    for (std::size_t i = 0; i < shard.artefacts().size(); ++i) {
      const std::uint16_t bits = shard.artefacts()[i];
      if ((bits & io::kShardArtefactExcluded) != 0) ++excluded;
      for (int k = 0; k < io::kShardArtefactClasses; ++k) {
        const double f = share(shard.coords()[2 * i], shard.coords()[2 * i + 1], k);
        const bool bit = (bits >> k & 1u) != 0;
        if (bit) ++set_by_class[k];
        // Clear cases only: the tile rule weighs the mask pixels the same way, but a share at the threshold
        // may round either way.
        if (f > max_fraction + 0.05) {
          EXPECT_TRUE(bit) << "class " << k << " covers " << f << " of tile " << i << " of " << entry.file;
          ++clear_set;
        } else if (f < max_fraction - 0.05) {
          EXPECT_FALSE(bit) << "class " << k << " covers " << f << " of tile " << i << " of " << entry.file;
          ++clear_unset;
        }
      }
    }
  }
  std::int64_t kept = 0;
  for (const auto& [name, count] : keep.slides[0].qc_kept_tiles) kept += count;
  EXPECT_EQ(excluded, kept) << "the manifest counts the tiles the shards mark as excluded";
  EXPECT_GT(clear_set, 10);
  EXPECT_GT(clear_unset, 100);
  EXPECT_FALSE(set_by_class.empty());
  // Dropping leaves no tile marked excluded; QC off writes no field.
  for (const auto& entry : on.shards) {
    const auto shard = io::ShardFile::open(dir_->file("qc_on/" + entry.file));
    ASSERT_TRUE(shard.attributes().artefacts);
    for (const auto bits : shard.artefacts()) EXPECT_EQ(bits & io::kShardArtefactExcluded, 0);
  }
  for (const auto& entry : off.shards) {
    EXPECT_FALSE(io::ShardFile::open(dir_->file("qc_off/" + entry.file)).attributes().artefacts);
  }
}

// tile's preview draws quality control's areas: excluded grey, flagged amber (the overlay's colours), and a
// preview with QC off has none.
TEST_F(Tile, PreviewDrawsQualityControlAreas) {
  const std::string inked = dir_->file("inked-preview");
  auto r = run("synth --out " + inked +
               " --slides 1 --size 2048 --seed 78 --set slides.mpp=1.0 --set slides.tumour_fraction=0 --set "
               "preview.enabled=false --set artefacts.pen_marks=true --set artefacts.blur=false");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto preview = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir_->file(name + ".yaml");
    std::ofstream(path) << "input:\n  csv: " << inked << "/dataset.csv\n"
                        << "output: " << dir_->file(name) << "\n"
                        << "tile:\n  size: 32\n  mpp: 1.0\n"
                        << "preview:\n  size: 512\n"
                        << extra;
    const auto rr = run("tile --preview " + path);
    EXPECT_EQ(rr.code, 0) << rr.err;
    const auto folder = fs::path(dir_->file(name)) / "previews";
    EXPECT_TRUE(fs::is_directory(folder));
    const auto file = fs::directory_iterator(folder)->path();
    cv::Mat bgr = cv::imread(file.string(), cv::IMREAD_COLOR);
    EXPECT_FALSE(bgr.empty()) << file;
    return bgr;
  };
  // Pixels of exactly the colour (RGB) in the picture, outside its legend (the top band).
  const auto count = [](const cv::Mat& bgr, const cv::Scalar& rgb) {
    const cv::Mat below = bgr(cv::Rect(0, 60, bgr.cols, bgr.rows - 60));
    cv::Mat1b hit;
    cv::inRange(below, cv::Scalar(rgb[2], rgb[1], rgb[0]), cv::Scalar(rgb[2], rgb[1], rgb[0]), hit);
    return cv::countNonZero(hit);
  };
  const cv::Scalar grey(110, 110, 110);
  const cv::Mat on = preview("preview_qc_on", "");
  const cv::Mat off = preview("preview_qc_off", "qc:\n  enabled: false\n");
  // (The slide itself may hold a few pixels of that grey: the same in both.)
  EXPECT_GT(count(on, grey), count(off, grey) + 50) << "the ink's outline";
}

TEST_F(Tile, LabelsAndFractionsMatchTheAnnotationPolygons) {
  const auto r = run("tile " + job("labels"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string out = dir_->file("labels");
  const auto manifest = io::read_manifest(out + "/manifest.json");
  io::AnnotationClasses classes;
  std::map<std::string, std::pair<std::vector<io::Annotation>, std::vector<io::Annotation>>> truth;
  for (const auto& s : manifest.slides) {
    const auto annotations = io::read_asap_xml(dir_->file("synth/slides/" + s.id + ".xml"));
    io::split_annotations(annotations, classes, truth[s.id].first, truth[s.id].second);
  }
  int checked = 0;
  for (const auto& entry : manifest.shards) {
    const auto shard = io::ShardFile::open(out + "/" + entry.file);
    for (std::int64_t i = 0; i < shard.size(); i += 3) {
      const auto k = static_cast<std::size_t>(i);
      const auto& [tumour, exclusion] = truth[shard.slides()[shard.slide_indices()[k]]];
      // 1.0 µm/px from 0.25 µm/px slides: a tile covers 128 level-0 pixels.
      const double expected = prep::tumour_fraction(tumour, exclusion, static_cast<double>(shard.coords()[2 * k]),
                                                    static_cast<double>(shard.coords()[2 * k + 1]), 128.0, 32);
      EXPECT_NEAR(shard.tumor_fractions()[k], expected, 1e-6);
      EXPECT_EQ(shard.labels()[k], expected >= 0.5 ? 1 : 0);
      EXPECT_TRUE(expected == 0.0 || expected >= 0.5) << "ambiguous tiles are dropped by default";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

// Also: a slide that cannot be opened for extraction fails once, at its first tile, and is not tried again for its
// other tiles. The first two openings for extraction fail (fault point tile.open, do=eio, twice): they are those of
// the first two slides with tiles, which fail; tried again for each tile of a batch, the second failure would hit the
// first slide again and the second slide would be tiled. (Here rather than in a test of its own, which would pay for
// the suite's slides again.)
TEST_F(Tile, OneAndTwoRanksGiveTheSameTiles) {
  const std::string without_mpi = "started without a launcher: one rank, without MPI";
  const auto alone = run_alone("tile " + job("one") + " --log-level debug");  // no MPI (core/comm.h)
  ASSERT_EQ(alone.code, 0) << alone.err;
  EXPECT_TRUE(contains(alone.err, without_mpi)) << alone.err;
  const auto r = run_mpi(2, "tile " + job("two") + " --log-level debug");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, without_mpi)) << r.err;  // under a launcher, tile starts MPI
  const auto one = testing::shard_tiles(dir_->file("one"));
  const auto two = testing::shard_tiles(dir_->file("two"));
  EXPECT_EQ(one.size(), two.size());
  EXPECT_TRUE(one == two) << "the same tiles with the same pixels, whatever the rank count";

  std::vector<std::string> first;  // the slides with tiles, in input (and extraction) order
  for (const auto& s : io::read_manifest(dir_->file("one/manifest.json")).slides) {
    if (s.tiles > 0) first.push_back(s.id);
  }
  ASSERT_GE(first.size(), 3u) << "the job must have a third slide with tiles for the test to show anything";
  const auto unopened =
      testing::run_script("TESSERA_FAULT='tile.open after=1 times=2 do=eio' $TESSERA tile " + job("unopened"));
  EXPECT_EQ(unopened.code, 3) << unopened.err;
  std::set<std::string> failed;
  for (const auto& f : io::read_manifest(dir_->file("unopened/manifest.json")).failures) {
    failed.insert(f.slide);
    EXPECT_TRUE(contains(f.error, "cannot open: Input/output error (fault injected at tile.open)")) << f.error;
  }
  EXPECT_EQ(failed, (std::set<std::string>{first[0], first[1]}));
  std::map<testing::ShardTileKey, std::uint64_t> expected;  // the other slides' tiles, as on one rank
  for (const auto& [key, sum] : one) {
    if (!failed.contains(std::get<0>(key))) expected[key] = sum;
  }
  EXPECT_EQ(testing::shard_tiles(dir_->file("unopened")), expected);
}

TEST_F(Tile, ThreadsGiveTheSameShards) {
  // Batches of 7 tiles: batches that span two slides, a last short one; 3 threads read a batch, another writes.
  ASSERT_EQ(run("tile " + job("threads1") + " --set tile.threads=1 --set shards.write_batch=7").code, 0);
  const auto r = run("tile " + job("threads3") + " --set tile.threads=3 --set shards.write_batch=7");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto one = testing::shard_tiles(dir_->file("threads1"));
  EXPECT_GT(one.size(), 100u);
  EXPECT_TRUE(one == testing::shard_tiles(dir_->file("threads3"))) << "the same tiles with the same pixels";
  // The shards' resume records hold the same pixel checksums.
  for (const auto& entry : fs::directory_iterator(dir_->file("threads1") + "/.tessera-tile-shards")) {
    const auto name = entry.path().filename().string();
    const auto record = [&](const std::string& out) {
      std::ifstream in(dir_->file(out) + "/.tessera-tile-shards/" + name);
      return nlohmann::json::parse(in).at("checksum").get<std::string>();
    };
    EXPECT_EQ(record("threads1"), record("threads3")) << name;
  }
  // The thread count is not part of the job: a rerun with another keeps the finished shards.
  const auto again = run("tile " + job("threads1") + " --set tile.threads=2 --set shards.write_batch=7");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(contains(again.err, "up to date")) << again.err;
}

TEST_F(Tile, RerunSkipsFinishedWorkAndResumesAfterACrash) {
  const std::string path = job("resume");
  ASSERT_EQ(run("tile " + path).code, 0);
  const std::string out = dir_->file("resume");
  const auto before = testing::shard_tiles(out);

  auto again = run("tile " + path);
  EXPECT_EQ(again.code, 0);
  EXPECT_TRUE(contains(again.err, "up to date")) << again.err;

  // Simulate a run killed after its shards were put in place, before its manifest: no manifest, one shard missing,
  // a half-written temporary. Shards already put in place may have been rewritten for that run's failures, so they
  // are extracted again (the shards a run finished during extraction are kept: Outputs.TileKilledAfterAShard...).
  fs::remove(out + "/manifest.json");
  fs::remove(out + "/shard-00001.h5");
  std::ofstream(out + "/shard-00002.h5.tmp-12345") << "half";
  const auto resumed = run("tile " + path);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_FALSE(fs::exists(out + "/shard-00002.h5.tmp-12345"));
  EXPECT_TRUE(testing::shard_tiles(out) == before);

  // --force rebuilds everything, also a folder that is up to date.
  const auto finished_time = fs::last_write_time(out + "/shard-00000.h5");
  const auto forced = run("tile --force " + path);
  ASSERT_EQ(forced.code, 0) << forced.err;
  EXPECT_NE(fs::last_write_time(out + "/shard-00000.h5"), finished_time);
}

TEST_F(Tile, BadSlidesFailAloneAndAreListed) {
  // A copy of the set with a truncated slide, a broken annotation, a slide without resolution and a blank one.
  const fs::path src = dir_->file("synth/slides");
  const fs::path bad = dir_->file("bad");
  fs::create_directories(bad);
  std::ofstream csv(bad / "list.csv");
  csv << "slide,label,annotation\n";
  // Good: the first two slides as they are.
  int good = 0;
  for (const auto& e : fs::directory_iterator(src)) {
    const auto ext = e.path().extension();
    if ((ext == ".svs" || ext == ".tif") && good < 2) {
      const auto xml = fs::path(e.path()).replace_extension(".xml");
      csv << e.path().string() << ",," << xml.string() << "\n";
      ++good;
    }
  }
  // Truncated slide.
  fs::path any_slide;
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().extension() == ".svs") any_slide = e.path();
  }
  fs::copy_file(any_slide, bad / "truncated.svs");
  fs::resize_file(bad / "truncated.svs", fs::file_size(bad / "truncated.svs") / 3);
  csv << (bad / "truncated.svs").string() << ",normal,\n";
  // Broken annotation XML next to a good slide copy.
  fs::copy_file(any_slide, bad / "brokenxml.svs");
  std::ofstream(bad / "brokenxml.xml") << "<ASAP_Annotations><Annotations><Annotation";
  csv << (bad / "brokenxml.svs").string() << ",tumor," << (bad / "brokenxml.xml").string() << "\n";
  // Broken GeoJSON.
  fs::copy_file(any_slide, bad / "brokenjson.svs");
  std::ofstream(bad / "brokenjson.geojson") << "{\"type\": \"FeatureCollection\", \"features\": [{\"type\": ";
  csv << (bad / "brokenjson.svs").string() << ",tumor," << (bad / "brokenjson.geojson").string() << "\n";
  // No resolution anywhere (a pattern TIFF without resolution tags is generic-tiff with mpp from tags: use a
  // slide with tags removed is not possible here; instead a tumour-labelled slide with no annotation).
  fs::copy_file(any_slide, bad / "noannotation.svs");
  csv << (bad / "noannotation.svs").string() << ",tumor,\n";
  // Blank slide: only glass.
  {
    io::TiffWriterOptions options;
    options.mpp = 0.25;
    io::TiffWriter writer((bad / "blank.tif").string(), 1024, 1024, options);
    for (int y = 0; y < 1024; y += options.tile_size) {
      writer.write_strip(cv::Mat(options.tile_size, 1024, CV_8UC3, cv::Scalar(245, 245, 245)));
    }
    writer.finish();
  }
  csv << (bad / "blank.tif").string() << ",normal,\n";
  csv.close();

  const std::string path = dir_->file("bad.yaml");
  std::ofstream(path) << "input:\n  csv: " << (bad / "list.csv").string() << "\noutput: " << dir_->file("bad-out")
                      << "\ntile:\n  size: 32\n  mpp: 1.0\n";
  const auto r = run("tile " + path);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "4 of 7 slides failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "truncated.svs")) << r.err;
  EXPECT_TRUE(contains(r.err, "brokenxml.xml")) << r.err;
  EXPECT_TRUE(contains(r.err, "brokenjson.geojson")) << r.err;
  EXPECT_TRUE(contains(r.err, "labelled tumour but has no annotation file")) << r.err;
  EXPECT_TRUE(contains(r.err, "blank")) << "the empty slide is reported: " << r.err;
  const auto manifest = io::read_manifest(dir_->file("bad-out") + "/manifest.json");
  EXPECT_EQ(manifest.failures.size(), 4u);
  ASSERT_EQ(manifest.slides.size(), 3u) << "the two good slides and the blank one";
  for (const auto& s : manifest.slides) {
    if (s.id == "blank") {
      EXPECT_EQ(s.tiles, 0) << "the blank slide is listed with no tiles";
    } else {
      EXPECT_GT(s.tiles, 0) << s.id;
    }
  }
  EXPECT_GT(manifest.total_tiles(), 0);
}

TEST_F(Tile, TumourSlideWhoseAnnotationLabelsNothingFailsAlone) {
  // A tumour slide whose annotation names its group "metastasis" (as CAMELYON16's tumor_009 does), which is no
  // tumour class, and a normal slide. Tiled as it was, the tumour slide would give only normal tiles.
  const auto rows = io::read_dataset_csv(dir_->file("synth/dataset.csv")).rows;
  const io::DatasetRow* tumour = nullptr;
  const io::DatasetRow* normal = nullptr;
  for (const auto& row : rows) {
    if (!tumour && row.label == io::SlideLabel::tumour) tumour = &row;
    if (!normal && row.label == io::SlideLabel::normal) normal = &row;
  }
  ASSERT_TRUE(tumour && normal);
  const fs::path folder = dir_->file("nothing");
  fs::create_directories(folder);
  std::ifstream in(tumour->annotation);
  std::string xml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(contains(xml, "\"_0\""));
  for (std::size_t at; (at = xml.find("\"_0\"")) != std::string::npos;) xml.replace(at, 4, "\"metastasis\"");
  const std::string annotation = (folder / (tumour->id + ".xml")).string();
  std::ofstream(annotation) << xml;
  std::ofstream(folder / "list.csv") << "slide,label,annotation\n"
                                     << tumour->slide << ",tumor," << annotation << "\n"
                                     << normal->slide << ",normal,\n";
  const std::string path = dir_->file("nothing.yaml");
  std::ofstream(path) << "input:\n  csv: " << (folder / "list.csv").string()
                      << "\noutput: " << dir_->file("nothing-out") << "\ntile:\n  size: 32\n  mpp: 1.0\n";

  const auto r = run("tile " + path);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "1 of 2 slides failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'metastases' for 'metastasis'?")) << r.err;
  const auto manifest = io::read_manifest(dir_->file("nothing-out") + "/manifest.json");
  ASSERT_EQ(manifest.failures.size(), 1u);
  EXPECT_EQ(manifest.failures[0].slide, tumour->id);
  EXPECT_TRUE(contains(manifest.failures[0].error, annotation)) << manifest.failures[0].error;
  EXPECT_TRUE(contains(manifest.failures[0].error, "no annotation is of a tumour class")) << manifest.failures[0].error;
  EXPECT_TRUE(contains(manifest.failures[0].error, "tumour classes (labels.tumour_classes)"))
      << manifest.failures[0].error;
  ASSERT_EQ(manifest.slides.size(), 1u);
  EXPECT_EQ(manifest.slides[0].id, normal->id);
  EXPECT_GT(manifest.slides[0].tiles, 0);

  // With the group configured as tumour the same slides tile, the tumour slide with tumour tiles; a polygon
  // added over the slide's top-left corner is clipped to the slide, with a warning naming the file.
  auto annotations = io::read_asap_xml(annotation);
  io::Annotation corner;
  corner.group = "metastasis";
  corner.outer = {{-1000, -1000}, {300, -1000}, {300, 300}, {-1000, 300}};
  annotations.push_back(corner);
  io::write_asap_xml(annotation, annotations);
  const auto fixed =
      run("tile " + path + " --set 'labels.tumour_classes=[metastasis]' --set output=" + dir_->file("nothing-fixed"));
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  EXPECT_TRUE(contains(fixed.err, annotation + ": not all annotations lie inside the slide")) << fixed.err;
  EXPECT_TRUE(contains(fixed.err, "1 annotation polygon(s) reach past it and are clipped")) << fixed.err;
  const auto tiled = io::read_manifest(dir_->file("nothing-fixed") + "/manifest.json");
  EXPECT_TRUE(tiled.failures.empty());
  ASSERT_EQ(tiled.slides.size(), 2u);
  for (const auto& s : tiled.slides) {
    if (s.id == tumour->id) {
      EXPECT_GT(s.tumour, 0);
      EXPECT_EQ(s.label, "tumor");
    }
  }
}

TEST_F(Tile, BrokenSlideListNamesTheLineAndColumn) {
  testing::TempDir dir;
  const std::string list = dir.file("list.csv");
  std::ofstream(list) << "slide,label,mpp\na.svs,normal,0.25\nb.svs,tumr,0.25\n";
  const std::string path = dir.file("job.yaml");
  std::ofstream(path) << "input:\n  csv: " << list << "\noutput: " << dir.file("out") << "\n";
  auto r = run("tile " + path);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, list + "': line 3, column 'label': 'tumr' is not tumor or normal; did you mean 'tumor'?"))
      << r.err;
  std::ofstream(list) << "slide,label,mpp\na.svs,normal,0.25 um\n";
  r = run("tile " + path);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "line 2, column 'mpp': '0.25 um' is not a positive number")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("out") + "/manifest.json")) << "nothing is tiled from a broken list";
}

TEST_F(Tile, MissingResolutionNamesTheSetting) {
  // A slide whose TIFF has no resolution tags: written by hand with libtiff through the pattern writer is not
  // possible (it always writes them), so use a CSV mpp override of 0 on a generic slide with 72 dpi tags.
  testing::TempDir dir;
  const std::string slide = dir.file("nores.tif");
  {
    io::TiffWriterOptions options;
    options.mpp = 352.77;  // what 72 dpi means: not a scan resolution, so Tessera treats it as missing
    testing::write_pattern_slide(slide, 600, 600, options);
  }
  const std::string path = dir.file("job.yaml");
  std::ofstream(path) << "input:\n  slides: [" << slide << "]\noutput: " << dir.file("out") << "\n";
  const auto r = run("tile " + path);
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(contains(r.err, "assume_mpp")) << r.err;
  EXPECT_TRUE(contains(r.err, "nores.tif")) << r.err;
}

TEST_F(Tile, ShardsOpenWithThePlainHdf5ApiAndAreContiguous) {
  ASSERT_EQ(run("tile " + job("plain")).code, 0);
  const auto manifest = io::read_manifest(dir_->file("plain") + "/manifest.json");
  const std::string file = dir_->file("plain") + "/" + manifest.shards.front().file;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t images = H5Dopen2(f, "images", H5P_DEFAULT);
  ASSERT_GE(images, 0);
  const hid_t plist = H5Dget_create_plist(images);
  EXPECT_EQ(H5Pget_layout(plist), H5D_CONTIGUOUS);
  const hid_t space = H5Dget_space(images);
  hsize_t dims[4] = {};
  ASSERT_EQ(H5Sget_simple_extent_ndims(space), 4);
  H5Sget_simple_extent_dims(space, dims, nullptr);
  EXPECT_EQ(dims[0], static_cast<hsize_t>(manifest.shards.front().tiles));
  EXPECT_EQ(dims[1], 32u);
  EXPECT_EQ(dims[2], 32u);
  EXPECT_EQ(dims[3], 3u);
  for (const char* name : {"labels", "tumor_fraction", "coords", "slide_index", "slides"}) {
    EXPECT_GT(H5Lexists(f, name, H5P_DEFAULT), 0) << name;
  }
  H5Sclose(space);
  H5Pclose(plist);
  H5Dclose(images);
  H5Fclose(f);
}

TEST_F(Tile, PreviewWritesPicturesAndNoShards) {
  const auto r = run("tile --preview " + job("preview"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string out = dir_->file("preview");
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));
  int pngs = 0;
  for (const auto& e : fs::directory_iterator(out + "/previews")) pngs += e.path().extension() == ".png";
  EXPECT_EQ(pngs, 4);
}

TEST_F(Tile, ConfigMistakesStopBeforeAnyWork) {
  const std::string path = dir_->file("typo.yaml");
  std::ofstream(path) << "input:\n  csv: x.csv\ntile:\n  szie: 64\n";
  const auto r = run("tile " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "line 4, key 'tile.szie'")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'tile.size'?")) << r.err;
  const auto none = run("tile --set output=" + dir_->file("none"));
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(contains(none.err, "input.slides")) << none.err;
}

}  // namespace
}  // namespace tessera
