// `tessera synth` end to end: the files a user gets, reproducibility across runs and ranks, and failures.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/annotations.h"
#include "io/slide.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run;
using testing::run_mpi;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::vector<std::string>> read_csv(const fs::path& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> row;
    std::stringstream fields(line);
    std::string field;
    while (std::getline(fields, field, ',')) row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

// Every file under root, relative path -> bytes (the effective config is excluded: it names the output folder).
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const auto rel = fs::relative(e.path(), root).string();
    if (rel == "synth.config.yaml") continue;
    files[rel] = read_text(e.path());
  }
  return files;
}

const std::string kSmall = " --slides 4 --size 1024 --set tumour.max_regions=2 --set preview.size=256";

TEST(Synth, WritesSlidesAnnotationsPreviewsAndDatasetCsv) {
  testing::TempDir dir;
  const auto r = run("synth --out " + dir.file("set") + " --seed 11" + kSmall);
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path root = dir.file("set");
  const auto rows = read_csv(root / "dataset.csv");
  ASSERT_EQ(rows.size(), 5u) << "header and four slides";
  EXPECT_EQ(rows[0][0], "slide_id");
  int tumour = 0, normal = 0;
  std::set<std::string> vendors;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_GE(row.size(), 6u);
    const auto slide = io::Slide::open((root / row[1]).string());
    vendors.insert(slide.vendor());
    EXPECT_NEAR(slide.mpp(), 0.25, 1e-6) << row[1];
    EXPECT_EQ(slide.width(), 1024);
    EXPECT_TRUE(fs::exists(root / "previews" / (row[0] + ".png"))) << row[0];
    const auto asap = io::read_annotations((root / row[3]).string());
    const auto qupath = io::read_annotations((root / row[4]).string());
    if (row[2] == "tumor") {
      ++tumour;
      ASSERT_FALSE(asap.empty()) << row[3];
      for (const auto& a : asap) EXPECT_TRUE(a.group == "_0" || a.group == "_2") << a.group;
      // QuPath sees the tumour class by its usual name, never an ASAP group id.
      int tumour_features = 0;
      for (const auto& a : qupath) {
        EXPECT_TRUE(a.group == "Tumor" || a.group == "Ignore*") << a.group;
        tumour_features += a.group == "Tumor";
      }
      EXPECT_GT(tumour_features, 0) << row[4];
    } else {
      ++normal;
      EXPECT_EQ(row[2], "normal");
      EXPECT_TRUE(asap.empty()) << "a normal slide has no tumour outline: " << row[3];
    }
    EXPECT_TRUE(row[5] == "train" || row[5] == "val" || row[5] == "test") << row[5];
  }
  EXPECT_EQ(tumour, 2);
  EXPECT_EQ(normal, 2);
  EXPECT_EQ(vendors, (std::set<std::string>{"aperio", "generic-tiff"})) << "mixed flavours by default";
  EXPECT_TRUE(fs::exists(root / "synth.config.yaml"));
}

TEST(Synth, SameSeedGivesIdenticalFilesOnOneRankOrTwo) {
  testing::TempDir dir;
  const auto a = run("synth --out " + dir.file("a") + " --seed 5" + kSmall);
  ASSERT_EQ(a.code, 0) << a.err;
  const auto b = run_mpi(2, "synth --out " + dir.file("b") + " --seed 5" + kSmall);
  ASSERT_EQ(b.code, 0) << b.err;
  const auto c = run("synth --out " + dir.file("c") + " --seed 6" + kSmall);
  ASSERT_EQ(c.code, 0) << c.err;
  const auto ta = tree(dir.file("a"));
  const auto tb = tree(dir.file("b"));
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, bytes] : ta) {
    ASSERT_TRUE(tb.count(name)) << name;
    EXPECT_TRUE(bytes == tb.at(name)) << name << " differs between one rank and two";
  }
  const auto tc = tree(dir.file("c"));
  EXPECT_NE(ta.at("dataset.csv"), tc.at("dataset.csv")) << "another seed gives another set";
}

TEST(Synth, HueVariationKeyIsOffByDefaultAndRangeChecked) {
  // slides.hue_variation: shown with its comment, 0 (off) when absent, and a value outside 0..0.3 is a config error
  // naming the key, before any slide is written.
  const auto shown = run("synth --print-config");
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_TRUE(contains(shown.out, "hue_variation: 0")) << shown.out;
  EXPECT_TRUE(contains(shown.out, "Haematoxylin's hue between slides")) << shown.out;
  for (const std::string bad : {"0.31", "-0.1"}) {
    testing::TempDir dir;
    const auto r = run("synth --out " + dir.file("set") + " --slides 1 --size 1024 --set slides.hue_variation=" + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_TRUE(contains(r.err, "slides.hue_variation")) << r.err;
    EXPECT_TRUE(contains(r.err, "must be between 0 and 0.3")) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("set") + "/dataset.csv")) << bad;
  }
}

TEST(Synth, HueVariationAtZeroWritesTheSameFilesAsWithoutTheKey) {
  testing::TempDir dir;
  const auto a = run("synth --out " + dir.file("a") + " --seed 5" + kSmall);
  ASSERT_EQ(a.code, 0) << a.err;
  const auto b = run("synth --out " + dir.file("b") + " --seed 5" + kSmall + " --set slides.hue_variation=0");
  ASSERT_EQ(b.code, 0) << b.err;
  const auto c = run("synth --out " + dir.file("c") + " --seed 5" + kSmall + " --set slides.hue_variation=0.12");
  ASSERT_EQ(c.code, 0) << c.err;
  const auto ta = tree(dir.file("a"));
  const auto tb = tree(dir.file("b"));
  const auto tc = tree(dir.file("c"));
  ASSERT_EQ(ta.size(), tb.size());
  int differing = 0;
  for (const auto& [name, bytes] : ta) {
    ASSERT_TRUE(tb.count(name)) << name;
    EXPECT_TRUE(bytes == tb.at(name)) << name << " differs with slides.hue_variation=0";
    if (name.ends_with(".tif") || name.ends_with(".svs")) differing += tc.count(name) && bytes != tc.at(name);
  }
  EXPECT_GT(differing, 0) << "slides.hue_variation=0.12 changes the slides";
}

TEST(Synth, UnwritableOutputIsOneClearError) {
  const auto r = run("synth --out /proc/tessera-cannot-write --slides 1 --size 1024");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.err, "/proc/tessera-cannot-write")) << r.err;
}

TEST(Synth, UnwritableOutputUnderMpiNamesTheFolder) {
  const auto r = run_mpi(2, "synth --out /proc/tessera-cannot-write --slides 2 --size 1024");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.err, "/proc/tessera-cannot-write")) << r.err;
}

}  // namespace
}  // namespace tessera
