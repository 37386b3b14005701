// `tessera bench tile` on a tiny job: it runs every stage it measures (tile with 1 and 2 ranks, the capped job,
// the decode, the shard readers, the memory runs), and its report agrees with the files it made. No timing is
// checked, only that each figure was measured and is consistent with the job.
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
  // Every figure measured, except that the CPU time of a small job's extraction may be lost in start-up jitter
  // ("-": the 1-rank run's CPU time minus the capped job's).
  const std::string extract_label = "tessera tile, 1 rank: extract phase";
  for (const std::string label : {"tessera tile, 1 rank: end to end", "tessera tile, 2 ranks: end to end (vs 1 rank)",
                                  "tessera tile, 2 ranks: extract phase (vs 1 rank)", extract_label.c_str()}) {
    const auto values = numbers_after(line_starting(r.out, label), label);
    ASSERT_EQ(values.size(), label.find("2 ranks") != std::string::npos ? 5u : 4u) << label << "\n" << r.out;
    EXPECT_GT(values[0], 0) << label;  // wall seconds
    EXPECT_GT(values[1], 0) << label;  // tiles/s
    const bool cpu_optional = label.find("extract phase") != std::string::npos;
    for (std::size_t k = 2; k < 4; ++k) {
      if (!(cpu_optional && values[k] == -1)) {
        EXPECT_GT(values[k], 0) << label << " field " << k;
      }
    }
  }
  std::string decode_label = "decode of the ";
  decode_label += std::to_string(stored);
  decode_label += " stored tiles (decode / extract)";
  const auto decode = numbers_after(line_starting(r.out, decode_label), decode_label);
  ASSERT_EQ(decode.size(), 6u) << r.out;  // wall, rate, CPU, rate per CPU, ratio by wall time, ratio by CPU time
  for (std::size_t k = 0; k < 5; ++k) EXPECT_GT(decode[k], 0) << "decode field " << k;
  EXPECT_TRUE(decode[5] > 0 || decode[5] == -1);

  // The Python loop's list holds exactly the job's tiles (one level region per tile).
  std::ifstream rows(work + "/python-tiles.csv");
  std::int64_t row_count = 0;
  for (std::string line; std::getline(rows, line);) ++row_count;
  EXPECT_EQ(row_count, tiles);

  // Shard reading: the three rows, the reading set removed afterwards.
  for (const std::string label : {"ShardDataset, shuffled (vs sequential)", "ShardDataset, in order (vs sequential)"}) {
    const auto values = numbers_after(line_starting(r.out, label), label);
    ASSERT_EQ(values.size(), 6u) << label << "\n" << r.out;
    for (const double v : values) EXPECT_GT(v, 0) << label;
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
  EXPECT_GT(small_mb, 0);
  EXPECT_GT(large_mb, 0);
}

TEST(BenchTile, RejectsBadOptions) {
  EXPECT_EQ(run("bench tile --rounds 0").code, 2);
  EXPECT_EQ(run("bench tile --read-mb 0").code, 2);
}

}  // namespace
}  // namespace tessera
