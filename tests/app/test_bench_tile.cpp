// `tessera bench tile` on a tiny job: it runs every stage it measures (tile with 1 and 2 ranks, the capped job,
// the decode, the shard readers, the memory runs), and its report agrees with the files it made. No timing is
// checked, only that each figure was measured and is consistent with the job.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run;

// The line of `text` that starts with `start` (after leading spaces), or "".
std::string line_starting(const std::string& text, const std::string& start) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, start.size(), start) == 0) return line;
  }
  return "";
}

// The whole number right before `suffix` in `text`, or -1.
long number_before(const std::string& text, const std::string& suffix) {
  const auto end = text.find(suffix);
  if (end == std::string::npos) return -1;
  const auto start = text.find_last_not_of("0123456789", end - 1) + 1;
  return start < end ? std::stol(text.substr(start, end - start)) : -1;
}

// The fields of a report row after its label: numbers (a trailing % or x is dropped) and "-" (not measured) as -1.
std::vector<double> numbers_after(const std::string& line, const std::string& label) {
  std::vector<double> values;
  std::istringstream in(line.substr(line.find(label) + label.size()));
  for (std::string word; in >> word;) {
    double v = 0;
    if (word == "-") {
      values.push_back(-1);
    } else if (std::sscanf(word.c_str(), "%lf", &v) == 1) {
      values.push_back(v);
    }
  }
  return values;
}

// A figure of the report: "-" (not measurable, read as -1) or a finite number >= 0.
void expect_figure(double value, const std::string& what) {
  EXPECT_TRUE(value == -1 || (std::isfinite(value) && value >= 0)) << what << ": " << value;
}

// A rate printed with no decimals and its time with three agree with `count` (when both were measurable).
void expect_rate_of(double seconds, double rate, double count, const std::string& what) {
  if (seconds <= 0 || rate < 0) return;
  EXPECT_NEAR(rate * seconds, count, 0.5 * seconds + 0.0005 * rate + 1e-9) << what;
}

TEST(BenchTile, MeasuresEveryStageOfATinyJob) {
  testing::TempDir dir;
  const std::string work = dir.file("bench");
  const auto r = run("bench tile --slides 1 --size 1024 --tile 32 --mpp 1 --rounds 1 --read-mb 2 --workdir " + work);
  ASSERT_EQ(r.code, 0) << r.out << r.err;

  // The tile count is the job's, and the stored tiles under them were found.
  const auto manifest = io::read_manifest(work + "/shards/manifest.json");
  const auto tiles = manifest.total_tiles();
  ASSERT_GT(tiles, 0);
  std::string tile_line = std::to_string(tiles);
  tile_line += " tiles from 1 slides (read through: direct TIFF (JPEG tiles))";
  EXPECT_TRUE(contains(r.out, tile_line)) << r.out;
  const long stored = number_before(r.out, " stored JPEG tiles");
  EXPECT_GT(stored, 0) << r.out;
  // Every row has its fields, each a number >= 0 or "-" (not measurable: a time below the clock's resolution). No
  // figure is required to be positive or large: that is the machine's business, not the report's. Where a rate and
  // its time are both given, they agree with the job's tile count up to the printed rounding.
  for (const std::string label :
       {"tessera tile, 1 rank: end to end", "tessera tile, 2 ranks: end to end (vs 1 rank)",
        "tessera tile, 2 ranks: extract phase (vs 1 rank)", "tessera tile, 1 rank: extract phase"}) {
    const auto values = numbers_after(line_starting(r.out, label), label);
    ASSERT_EQ(values.size(), label.find("2 ranks") != std::string::npos ? 5u : 4u) << label << "\n" << r.out;
    for (std::size_t k = 0; k < values.size(); ++k) expect_figure(values[k], label + " field " + std::to_string(k));
    expect_rate_of(values[0], values[1], static_cast<double>(tiles), label);
    if (values[2] > 0) expect_rate_of(values[2], values[3], static_cast<double>(tiles), label + " by CPU");
  }
  std::string decode_label = "decode of the ";
  decode_label += std::to_string(stored);
  decode_label += " stored tiles (decode / extract)";
  const auto decode = numbers_after(line_starting(r.out, decode_label), decode_label);
  ASSERT_EQ(decode.size(), 6u) << r.out;  // wall, rate, CPU, rate per CPU, ratio by wall time, ratio by CPU time
  for (std::size_t k = 0; k < decode.size(); ++k) expect_figure(decode[k], "decode field " + std::to_string(k));

  // The Python loop's list holds exactly the job's tiles (one level region per tile).
  std::ifstream rows(work + "/python-tiles.csv");
  std::int64_t row_count = 0;
  for (std::string line; std::getline(rows, line);) ++row_count;
  EXPECT_EQ(row_count, tiles);

  // Shard reading: the three rows, the reading set removed afterwards.
  for (const std::string label : {"ShardDataset, shuffled (vs sequential)", "ShardDataset, in order (vs sequential)"}) {
    const auto values = numbers_after(line_starting(r.out, label), label);
    ASSERT_EQ(values.size(), 6u) << label << "\n" << r.out;
    for (std::size_t k = 0; k < values.size(); ++k) expect_figure(values[k], label + " field " + std::to_string(k));
  }
  EXPECT_TRUE(contains(r.out, "plain sequential read() of the ")) << r.out;
  EXPECT_FALSE(fs::exists(work + "/read-set"));

  // Memory: both slides tiled, both peaks reported.
  const auto memory = r.out.find("1024x1024 slide (");
  ASSERT_NE(memory, std::string::npos) << r.out;
  int small_tiles = 0, small_mb = 0, large_tiles = 0, large_mb = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + memory, "1024x1024 slide (%d tiles) %d MB, 2048x2048 slide (%d tiles) %d MB",
                        &small_tiles, &small_mb, &large_tiles, &large_mb),
            4)
      << r.out;
  EXPECT_GT(large_tiles, small_tiles) << "the larger slide has more tiles";
  EXPECT_GE(small_mb, 0);
  EXPECT_GE(large_mb, 0);
}

TEST(BenchTile, RejectsBadOptions) {
  EXPECT_EQ(run("bench tile --rounds 0").code, 2);
  EXPECT_EQ(run("bench tile --read-mb 0").code, 2);
}

}  // namespace
}  // namespace tessera
