// The tile job's decisions that the end-to-end tests cannot reach one by one: how the job's tiles are cut into
// shards over the ranks, which slides a job names, and when a rerun keeps a shard an earlier run extracted.
#include "preprocessing/tile_job.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/hash.h"
#include "core/partition.h"
#include "io/shard.h"
#include "preprocessing/tile_resume.h"
#include "tests/testing/testing.h"

namespace tessera::prep {
namespace {

namespace fs = std::filesystem;

// ---- partitioning ---------------------------------------------------------------------------------------------

TEST(PartBegin, EqualContiguousSharesWithTheRemainderFirst) {
  EXPECT_EQ(core::part_begin(10, 3, 0), 0);
  EXPECT_EQ(core::part_begin(10, 3, 1), 4);
  EXPECT_EQ(core::part_begin(10, 3, 2), 7);
  EXPECT_EQ(core::part_begin(10, 3, 3), 10);
  EXPECT_EQ(core::part_begin(2, 4, 3), 2);  // more parts than items: the last parts are empty
  EXPECT_EQ(core::part_begin(2, 4, 4), 2);
}

TEST(AssignShards, EveryTileInExactlyOneShardBalancedOverRanksNumberedRankByRank) {
  for (const std::int64_t total : {0, 1, 7, 64, 1000, 4097}) {
    for (const int ranks : {1, 2, 3, 8, 13}) {
      for (const std::int64_t per_shard : {1, 5, 64, 4096}) {
        SCOPED_TRACE(::testing::Message() << total << " tiles, " << ranks << " ranks, " << per_shard << " per shard");
        const auto spans = assign_shards(total, ranks, per_shard);
        ASSERT_EQ(spans.size(), static_cast<std::size_t>(ranks));
        std::int64_t next_tile = 0;
        std::int64_t next_index = 0;
        std::int64_t smallest = total, largest = 0;
        for (int r = 0; r < ranks; ++r) {
          std::int64_t rank_tiles = 0;
          for (const auto& span : spans[static_cast<std::size_t>(r)]) {
            EXPECT_EQ(span.index, next_index++);
            EXPECT_EQ(span.first, next_tile);  // contiguous, in the job's tile order
            EXPECT_GE(span.count, 1);
            EXPECT_LE(span.count, per_shard);
            next_tile += span.count;
            rank_tiles += span.count;
          }
          EXPECT_EQ(rank_tiles, core::part_begin(total, ranks, r + 1) - core::part_begin(total, ranks, r));
          smallest = std::min(smallest, rank_tiles);
          largest = std::max(largest, rank_tiles);
        }
        EXPECT_EQ(next_tile, total);
        EXPECT_LE(largest - smallest, 1);
      }
    }
  }
}

TEST(ShardName, FiveDigits) {
  EXPECT_EQ(shard_name(0), "shard-00000.h5");
  EXPECT_EQ(shard_name(123456), "shard-123456.h5");
}

// ---- inputs ---------------------------------------------------------------------------------------------------

core::Config job(const std::string& yaml) { return core::Config::parse(tile_schema(), yaml, "job.yaml"); }

void touch(const fs::path& path) { std::ofstream(path) << "x"; }

TEST(ResolveTileInputs, GlobsInSortedOrderWithTheAnnotationBesideEachSlide) {
  testing::TempDir dir;
  touch(dir.path() / "b.svs");
  touch(dir.path() / "a.svs");
  touch(dir.path() / "a.xml");
  touch(dir.path() / "b.geojson");
  const auto inputs = resolve_tile_inputs(job("input:\n  slides: ['" + (dir.path() / "*.svs").string() + "']\n"));
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].id, "a");
  EXPECT_EQ(inputs[0].annotation, (dir.path() / "a.xml").string());
  EXPECT_EQ(inputs[1].id, "b");
  EXPECT_EQ(inputs[1].annotation, (dir.path() / "b.geojson").string());
}

std::string config_error(const std::string& yaml, std::string* key = nullptr) {
  try {
    resolve_tile_inputs(job(yaml));
  } catch (const core::ConfigError& e) {
    if (key) *key = e.key();
    return e.what();
  }
  return "no error";
}

TEST(ResolveTileInputs, MistakesAreConfigErrorsNamingTheSetting) {
  testing::TempDir dir;
  touch(dir.path() / "s.svs");
  touch(dir.path() / "s.tif");
  std::string key;
  EXPECT_NE(
      config_error("input:\n  slides: ['" + (dir.path() / "*.ndpi").string() + "']\n", &key).find("no slide matches"),
      std::string::npos);
  EXPECT_EQ(key, "input.slides");
  EXPECT_NE(config_error("input:\n  slides: ['" + (dir.path() / "s.*").string() + "']\n").find("share the id 's'"),
            std::string::npos);
  EXPECT_NE(config_error("input:\n  slides: []\n").find("give the slides as input.slides"), std::string::npos);
  EXPECT_NE(config_error("input:\n  slides: [a.svs]\n  csv: d.csv\n").find("not both"), std::string::npos);
  // A plain path that does not exist is no mistake in the job: it fails later, as that slide.
  const auto missing = resolve_tile_inputs(job("input:\n  slides: [" + (dir.path() / "gone.svs").string() + "]\n"));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].id, "gone");
}

TEST(ResolveTileInputs, InputSplitsPicksRowsOfTheCsvWhichASingleCsvInInputSlidesAlsoNames) {
  testing::TempDir dir;
  std::ofstream(dir.path() / "dataset.csv") << "slide,label,split\na.svs,normal,train\nb.svs,tumor,test\n"
                                               "c.svs,normal,train\n";
  const std::string csv = (dir.path() / "dataset.csv").string();
  for (const std::string& yaml : {"input:\n  csv: '" + csv + "'\n  splits: [train]\n",
                                  "input:\n  slides: ['" + csv + "']\n  splits: [train]\n"}) {
    SCOPED_TRACE(yaml);
    const auto inputs = resolve_tile_inputs(job(yaml));
    ASSERT_EQ(inputs.size(), 2u);
    EXPECT_EQ(inputs[0].id, "a");
    EXPECT_EQ(inputs[1].id, "c");
    EXPECT_EQ(inputs[1].path, (dir.path() / "c.svs").string());
  }
  EXPECT_EQ(resolve_tile_inputs(job("input:\n  csv: '" + csv + "'\n")).size(), 3u) << "no splits: every row";
  std::string key;
  EXPECT_NE(config_error("input:\n  csv: '" + csv + "'\n  splits: [val]\n", &key).find("is in the split(s) val"),
            std::string::npos);
  EXPECT_EQ(key, "input.splits");
  std::ofstream(dir.path() / "nosplit.csv") << "slide,label\na.svs,normal\n";
  EXPECT_NE(config_error("input:\n  csv: '" + (dir.path() / "nosplit.csv").string() + "'\n  splits: [train]\n", &key)
                .find("has no 'split' column"),
            std::string::npos);
  EXPECT_EQ(key, "input.splits");
  touch(dir.path() / "a.svs");
  EXPECT_NE(config_error("input:\n  slides: ['" + (dir.path() / "a.svs").string() + "']\n  splits: [train]\n", &key)
                .find("input.splits selects rows of input.csv"),
            std::string::npos);
  EXPECT_EQ(key, "input.splits");
}

// ---- resume ---------------------------------------------------------------------------------------------------

// The job hashes cover the stain reference's bytes: other bytes at the same path and size are another digest, the same
// bytes the same one; nothing without a reference or with stain.method: none; a missing reference is an error naming
// it.
TEST(StainReferenceDigest, CoversTheReferencesBytesNotOnlyItsPath) {
  testing::TempDir dir;
  const std::string reference = (dir.path() / "reference.png").string();
  const auto digest = [&](const std::string& method) {
    return stain_reference_digest(
        read_stain_reference(job("stain:\n  method: " + method + "\n  reference: '" + reference + "'\n")));
  };
  const std::string bytes(200000, 'a');
  std::ofstream(reference) << bytes;
  const std::string first = digest("reinhard");
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(digest("macenko"), first);
  EXPECT_EQ(digest("none"), "");
  EXPECT_EQ(stain_reference_digest(read_stain_reference(job("stain:\n  method: reinhard\n"))), "");
  std::ofstream(reference) << bytes.substr(1) << 'b';
  EXPECT_NE(digest("reinhard"), first);
  std::ofstream(reference) << bytes;
  EXPECT_EQ(digest("reinhard"), first);
  fs::remove(reference);
  try {
    digest("reinhard");
    ADD_FAILURE() << "a missing reference was hashed";
  } catch (const core::FileNotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(reference), std::string::npos) << e.what();
  }
}

// Tile's job hash takes the reference's digest in: other bytes of the same size at the same path are another job.
// Without a reference (or with stain.method: none) it is the hash of the config and slides alone, as it was before
// the reference's bytes were hashed, so finished jobs without one stay up to date.
TEST(TileJobHash, CoversTheStainReferencesBytesAndIsUnchangedWithoutOne) {
  testing::TempDir dir;
  const std::string reference = (dir.path() / "reference.bmp").string();
  const std::vector<SlideInput> inputs{{"a", (dir.path() / "a.svs").string(), "tumor", "", "", 0.25}};
  // The hash without the digest term: the config (tile.threads set to 0) and each slide's path, size, time,
  // annotation and mpp (a missing slide: size -1, time 0).
  const auto without_digest = [&](const core::Config& config) {
    core::Config hashed = config;
    hashed.set_value("tile.threads", "0", "the job hash");
    return fmt::format("{:016x}", core::fnv1a(hashed.to_yaml() + fmt::format("\n{}|-1|0||0.25", inputs[0].path)));
  };
  const auto hash = [&](const core::Config& config) {
    return tile_job_hash(config, read_stain_reference(config), inputs);
  };
  const auto plain = job("tile:\n  threads: 2\n");
  EXPECT_EQ(hash(plain), without_digest(plain));
  const auto none = job("stain:\n  method: none\n  reference: '" + reference + "'\n");
  EXPECT_EQ(hash(none), without_digest(none));

  const auto with_reference = job("stain:\n  method: reinhard\n  reference: '" + reference + "'\n");
  std::ofstream(reference) << std::string(1000, 'a');
  const std::string first = hash(with_reference);
  EXPECT_NE(first, without_digest(with_reference));
  std::ofstream(reference) << std::string(999, 'a') << 'b';
  EXPECT_NE(hash(with_reference), first);
  std::ofstream(reference) << std::string(1000, 'a');
  EXPECT_EQ(hash(with_reference), first);
}

TEST(PixelChecksum, TheSameBytesGiveTheSameChecksumHoweverTheyAreSplit) {
  std::vector<std::uint8_t> bytes(203);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 37 + 11);
  PixelChecksum whole;
  whole.add(bytes.data(), bytes.size());
  for (const std::size_t cut : {1, 3, 8, 13, 64, 200}) {
    PixelChecksum parts;
    for (std::size_t i = 0; i < bytes.size(); i += cut) parts.add(bytes.data() + i, std::min(cut, bytes.size() - i));
    EXPECT_EQ(parts.hex(), whole.hex()) << cut;
  }
  PixelChecksum other;
  bytes[100] ^= 1;
  other.add(bytes.data(), bytes.size());
  EXPECT_NE(other.hex(), whole.hex());
  EXPECT_EQ(whole.hex().size(), 16u);
}

constexpr int kTile = 8;

// Writes an extracted (unchecked) shard of `count` tiles whose pixels start at `shade`; returns their checksum.
std::string write_unchecked(const fs::path& out, std::int64_t index, std::int64_t count, std::uint8_t shade) {
  io::ShardAttributes attributes;
  attributes.tile_size = kTile;
  attributes.mpp = 1.0;
  const std::string path = (out / shard_name(index)).string() + ".unchecked";
  io::ShardWriter writer(path, attributes, count, {"slide"});
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count) * kTile * kTile * 3);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(shade + i);
  std::vector<io::ShardTileRecord> records;
  for (std::int64_t i = 0; i < count; ++i) records.push_back({0, 0.0f, i * kTile, 0, 0});
  writer.write(0, records, pixels.data());
  writer.finish();
  PixelChecksum checksum;
  checksum.add(pixels.data(), pixels.size());
  return checksum.hex();
}

struct ResumeFixture : ::testing::Test {
  void SetUp() override {
    fs::create_directories(out / kTileRecordFolder);
    record.checksum = write_unchecked(out, span.index, span.count, 7);
    write_shard_record(out, record);
  }
  testing::TempDir dir;
  fs::path out = dir.path();
  ShardSpan span{3, 40, 4};
  ShardRecord record{"job-hash", 3, 40, 4, "tiles-digest", 4, "", {{"other", "a slide that failed"}}, std::nullopt};
};

TEST_F(ResumeFixture, AShardExtractedByTheSameJobIsKeptWithItsRecord) {
  const auto kept = finished_shard(out, "job-hash", span, "tiles-digest");
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->kept, 4);
  EXPECT_EQ(kept->checksum, record.checksum);
  EXPECT_EQ(kept->failed, record.failed);      // the failures seen while writing it reach the manifest again
  EXPECT_FALSE(kept->stain_kept.has_value());  // a tile record says nothing of groups
  // An import that fits groups needs to know which kept their stain: without stain_kept (an earlier version's
  // record) the shard is imported again.
  bool logged = false;
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest", &logged, true));
  EXPECT_TRUE(logged);
  // An import's record: the groups whose stain was kept come back with it.
  record.stain_kept = std::map<std::string, std::string>{{"white", "too little tissue"}};
  write_shard_record(out, record);
  EXPECT_EQ(finished_shard(out, "job-hash", span, "tiles-digest", &logged, true)->stain_kept, record.stain_kept);
}

TEST_F(ResumeFixture, AnotherJobSpanOrTileListExtractsItAgain) {
  EXPECT_FALSE(finished_shard(out, "another-job", span, "tiles-digest"));
  EXPECT_FALSE(finished_shard(out, "job-hash", {3, 40, 5}, "tiles-digest"));  // the rank count changed
  EXPECT_FALSE(finished_shard(out, "job-hash", {3, 41, 4}, "tiles-digest"));
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "other-tiles"));         // a slide failed planning in one run only
  EXPECT_FALSE(finished_shard(out, "job-hash", {4, 40, 4}, "tiles-digest"));  // no record
}

TEST_F(ResumeFixture, AShardAlreadyPutInPlaceOrGoneIsExtractedAgain) {
  touch(out / shard_name(span.index));
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
  fs::remove(out / shard_name(span.index));
  fs::remove(out / (shard_name(span.index) + ".unchecked"));
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
}

TEST_F(ResumeFixture, AShardWhoseFileNoLongerHoldsWhatItsRecordSaysIsExtractedAgain) {
  write_unchecked(out, span.index, span.count, 9);  // same size, other pixels
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
  write_unchecked(out, span.index, 3, 7);  // a tile fewer
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
  std::ofstream(out / (shard_name(span.index) + ".unchecked")) << "not a shard";
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
}

TEST_F(ResumeFixture, ARecordOfAnEarlierVersionExtractsItAgainSayingSoOncePerJob) {
  // The record as earlier versions wrote it (FNV-1a checksum, no checksum_algorithm), otherwise matching.
  const std::string earlier =
      "{\"job\": \"job-hash\", \"index\": 3, \"first\": 40, \"count\": 4, \"tiles\": "
      "\"tiles-digest\", \"kept\": 4, \"checksum\": \"" +
      record.checksum + "\", \"failed\": {}}";
  std::ofstream(shard_record_path(out, span.index)) << earlier;
  std::ostringstream log;
  const auto logger = spdlog::default_logger();
  logger->sinks().push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  bool logged = false;
  const bool kept_first = finished_shard(out, "job-hash", span, "tiles-digest", &logged).has_value();
  const bool kept_second = finished_shard(out, "job-hash", span, "tiles-digest", &logged).has_value();
  logger->sinks().pop_back();
  EXPECT_FALSE(kept_first);
  EXPECT_FALSE(kept_second);
  EXPECT_TRUE(logged);
  const std::string said = "resume record from an earlier version of tessera: extracting again";
  const auto at = log.str().find(said);
  EXPECT_NE(at, std::string::npos) << log.str();
  EXPECT_EQ(log.str().find(said, at + 1), std::string::npos) << log.str();  // once
  write_shard_record(out, record);  // this version's record of the same shard is kept
  EXPECT_TRUE(finished_shard(out, "job-hash", span, "tiles-digest", &logged));
}

TEST_F(ResumeFixture, AnUnreadableRecordExtractsItAgain) {
  std::ofstream(shard_record_path(out, span.index)) << "{\"job\": \"job-hash\", \"index\": ";
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
  std::ofstream(shard_record_path(out, span.index)) << "{\"job\": 3}";
  EXPECT_FALSE(finished_shard(out, "job-hash", span, "tiles-digest"));
}

}  // namespace
}  // namespace tessera::prep
