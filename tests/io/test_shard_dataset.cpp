// The training reader: partition across ranks, determinism, slide mixing, filtering, unshuffled order, errors
// from the prefetch thread, and restarts while it runs. Ranks are simulated by one dataset per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "tests/testing/testing.h"

namespace {

namespace io = tessera::io;
namespace core = tessera::core;
namespace fs = std::filesystem;
using tessera::testing::TempDir;

constexpr int tile = 8;

// Every tile's pixels start with its global index (4 bytes, little-endian); the rest is a pattern of it.
std::vector<std::uint8_t> tile_pixels(std::int64_t index, int t) {
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(t) * t * 3);
  for (std::size_t k = 0; k < pixels.size(); ++k) {
    pixels[k] = static_cast<std::uint8_t>((static_cast<std::uint64_t>(index) * 29 + k * 11) & 0xff);
  }
  for (int b = 0; b < 4; ++b) pixels[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(index >> (8 * b));
  return pixels;
}

io::ShardTileRecord record_of(std::int64_t index, std::uint32_t slide) {
  return {static_cast<std::uint8_t>(index % 3 == 0), static_cast<float>(index) * 0.5f, 1000 + index * 8, 7 * index,
          slide};
}

// A shard is a list of runs (slide id, tiles); tiles get consecutive global indices across the whole folder.
using ShardSpec = std::vector<std::pair<std::string, int>>;

struct Folder {
  std::string path;
  std::vector<std::string> slide_of;  // by global index
  std::int64_t total() const { return static_cast<std::int64_t>(slide_of.size()); }
};

// Quality control's bits of tile `index` in folders written with them: every fifth tile under excluded artefacts
// (ink), the next one flagged (blur) only.
std::uint16_t artefact_bits(std::int64_t index) {
  if (index % 5 == 0) return static_cast<std::uint16_t>((1u << 1) | io::kShardArtefactExcluded);
  return index % 5 == 1 ? std::uint16_t{1u << 0} : std::uint16_t{0};
}

Folder write_folder(const std::string& path, const std::vector<ShardSpec>& shards, int t = tile,
                    const std::vector<double>& mpps = {}, bool artefacts = false) {
  fs::create_directories(path);
  Folder folder{path, {}};
  io::Manifest manifest;
  manifest.attributes.tile_size = t;
  manifest.attributes.mpp = 0.5;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::vector<std::string> slides;
    std::int64_t n = 0;
    for (const auto& [id, count] : shards[s]) {
      if (std::find(slides.begin(), slides.end(), id) == slides.end()) slides.push_back(id);
      n += count;
    }
    io::ShardAttributes attributes = manifest.attributes;
    if (s < mpps.size()) attributes.mpp = mpps[s];
    attributes.artefacts = artefacts;
    const std::string file = "shard-" + std::to_string(s) + ".h5";
    io::ShardWriter writer(path + "/" + file, attributes, n, slides);
    std::int64_t local = 0;
    for (const auto& [id, count] : shards[s]) {
      const auto slide = static_cast<std::uint32_t>(std::find(slides.begin(), slides.end(), id) - slides.begin());
      for (int k = 0; k < count; ++k, ++local) {
        const std::int64_t global = folder.total();
        const auto pixels = tile_pixels(global, t);
        io::ShardTileRecord record = record_of(global, slide);
        if (artefacts) record.artefacts = artefact_bits(global);
        writer.write(local, {record}, pixels.data());
        folder.slide_of.push_back(id);
      }
    }
    writer.finish();
    manifest.shards.push_back({file, n, 0, 0, slides});
  }
  io::write_manifest(path + "/manifest.json", manifest);
  return folder;
}

// Three shards, five slides (A appears in two shards, B spans two), 437 tiles.
const std::vector<ShardSpec> standard = {
    {{"A", 60}, {"B", 90}}, {{"B", 50}, {"C", 80}}, {{"D", 60}, {"A", 60}, {"E", 37}}};

// One epoch as global indices per batch; every tile's pixels and metadata are checked against its index.
std::vector<std::vector<std::int64_t>> run_epoch(io::ShardDataset& dataset, const Folder& folder, std::int64_t epoch) {
  dataset.start_epoch(epoch);
  std::vector<std::vector<std::int64_t>> batches;
  io::Batch batch;
  while (dataset.next(batch)) {
    std::vector<std::int64_t> ids;
    EXPECT_EQ(batch.tile_size, tile);
    const std::size_t bytes = static_cast<std::size_t>(tile) * tile * 3;
    EXPECT_EQ(batch.images.size(), static_cast<std::size_t>(batch.size) * bytes);
    EXPECT_EQ(batch.labels.size(), static_cast<std::size_t>(batch.size));
    EXPECT_EQ(batch.coords.size(), 2 * static_cast<std::size_t>(batch.size));
    EXPECT_EQ(batch.slide_ids.size(), static_cast<std::size_t>(batch.size));
    for (int k = 0; k < batch.size; ++k) {
      const auto n = static_cast<std::size_t>(k);
      const std::uint8_t* pixels = batch.images.data() + n * bytes;
      const std::int64_t id = pixels[0] | pixels[1] << 8 | pixels[2] << 16 | static_cast<std::int64_t>(pixels[3]) << 24;
      EXPECT_LT(id, folder.total());
      if (id >= folder.total()) continue;
      const auto expected_pixels = tile_pixels(id, tile);
      EXPECT_TRUE(std::equal(expected_pixels.begin(), expected_pixels.end(), pixels)) << "tile " << id;
      const auto expected = record_of(id, 0);
      EXPECT_EQ(batch.labels[n], expected.label) << id;
      EXPECT_EQ(batch.tumor_fractions[n], expected.tumor_fraction) << id;
      EXPECT_EQ(batch.coords[2 * n], expected.x) << id;
      EXPECT_EQ(batch.coords[2 * n + 1], expected.y) << id;
      EXPECT_EQ(batch.slide_ids[n], folder.slide_of[static_cast<std::size_t>(id)]) << id;
      ids.push_back(id);
    }
    batches.push_back(std::move(ids));
  }
  return batches;
}

std::vector<std::int64_t> flatten(const std::vector<std::vector<std::int64_t>>& batches) {
  std::vector<std::int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

io::ShardDatasetOptions small_options() {
  io::ShardDatasetOptions o;
  o.batch_size = 16;
  o.block_size = 8;
  o.shuffle_buffer = 50;
  o.prefetch_batches = 3;
  o.seed = 42;
  return o;
}

class ShardDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override { folder_ = write_folder(dir_.file("shards"), standard); }
  TempDir dir_;
  Folder folder_;
};

TEST_F(ShardDatasetTest, RanksPartitionTheEpoch) {
  ASSERT_EQ(folder_.total(), 437);
  for (const bool drop_last : {false, true}) {
    for (int world = 1; world <= 3; ++world) {
      SCOPED_TRACE("world " + std::to_string(world) + (drop_last ? ", drop_last" : ""));
      std::set<std::int64_t> seen;
      std::int64_t tiles = 0;
      std::vector<std::int64_t> batch_counts;
      for (int rank = 0; rank < world; ++rank) {
        auto options = small_options();
        options.rank = rank;
        options.world_size = world;
        options.drop_last = drop_last;
        io::ShardDataset dataset(folder_.path, options);
        EXPECT_EQ(dataset.total_tiles(), 437);
        EXPECT_EQ(dataset.tiles_per_rank(), 437 / world);
        EXPECT_EQ(dataset.tile_size(), tile);
        EXPECT_EQ(dataset.manifest().shards.size(), 3u);
        const auto batches = run_epoch(dataset, folder_, 5);
        EXPECT_EQ(static_cast<std::int64_t>(batches.size()), dataset.batches_per_epoch());
        batch_counts.push_back(dataset.batches_per_epoch());
        for (std::size_t b = 0; b < batches.size(); ++b) {
          if (drop_last || b + 1 < batches.size()) {
            EXPECT_EQ(batches[b].size(), 16u) << "batch " << b;
          }
        }
        for (const auto id : flatten(batches)) {
          EXPECT_TRUE(seen.insert(id).second) << "tile " << id << " twice";
          ++tiles;
        }
      }
      EXPECT_EQ(std::set<std::int64_t>(batch_counts.begin(), batch_counts.end()).size(), 1u) << "equal batch counts";
      if (drop_last) {
        EXPECT_EQ(batch_counts[0], (437 / world) / 16);
        EXPECT_EQ(tiles, world * batch_counts[0] * 16);
      } else {
        EXPECT_EQ(tiles, 437 - 437 % world) << "all but fewer than world_size tiles";
        EXPECT_EQ(batch_counts[0], (437 / world + 15) / 16);
      }
    }
  }
}

TEST_F(ShardDatasetTest, SameSeedSameBatchesEachEpochDifferent) {
  auto options = small_options();
  options.world_size = 2;
  options.rank = 1;
  io::ShardDataset first(folder_.path, options);
  io::ShardDataset second(folder_.path, options);
  const auto epoch3 = run_epoch(first, folder_, 3);
  EXPECT_EQ(run_epoch(second, folder_, 3), epoch3);
  EXPECT_EQ(run_epoch(first, folder_, 3), epoch3) << "an epoch can be replayed";
  const auto epoch4 = run_epoch(first, folder_, 4);
  EXPECT_NE(epoch4, epoch3);
  options.seed = 43;
  io::ShardDataset reseeded(folder_.path, options);
  EXPECT_NE(run_epoch(reseeded, folder_, 3), epoch3);

  // One rank: every epoch is a permutation of all tiles, each a different one.
  options.world_size = 1;
  options.rank = 0;
  options.drop_last = false;
  io::ShardDataset single(folder_.path, options);
  std::vector<std::int64_t> all(437);
  std::iota(all.begin(), all.end(), 0);
  std::set<std::vector<std::int64_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto order = flatten(run_epoch(single, folder_, epoch));
    orders.insert(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, all);
  }
  EXPECT_EQ(orders.size(), 3u);
}

TEST_F(ShardDatasetTest, BatchesMixSlides) {
  io::ShardDataset dataset(folder_.path, small_options());
  const auto batches = run_epoch(dataset, folder_, 0);
  ASSERT_FALSE(batches.empty());
  std::set<std::string> slides;
  for (const auto id : batches[0]) slides.insert(folder_.slide_of[static_cast<std::size_t>(id)]);
  EXPECT_GT(slides.size(), 1u);

  // Without a shuffle buffer the reads are whole blocks: the order is shuffled, but only between blocks.
  auto options = small_options();
  options.shuffle_buffer = 0;
  io::ShardDataset blocks(folder_.path, options);
  const auto order = flatten(run_epoch(blocks, folder_, 0));
  int breaks = 0;
  for (std::size_t i = 1; i < order.size(); ++i) breaks += order[i] != order[i - 1] + 1 ? 1 : 0;
  EXPECT_GT(breaks, 10);
  EXPECT_LE(breaks, 437 / 8 + 5);
}

TEST_F(ShardDatasetTest, SlideFilterSelectsOnlyThoseSlides) {
  std::set<std::int64_t> expected;
  for (std::int64_t i = 0; i < folder_.total(); ++i) {
    const auto& s = folder_.slide_of[static_cast<std::size_t>(i)];
    if (s == "B" || s == "E") expected.insert(i);
  }
  ASSERT_EQ(expected.size(), 177u);
  std::set<std::int64_t> seen;
  for (int rank = 0; rank < 2; ++rank) {
    auto options = small_options();
    options.slides = {"B", "E", "not-a-slide"};
    options.drop_last = false;
    options.shuffle = rank == 0;  // both modes honour the filter
    options.world_size = 1;
    io::ShardDataset dataset(folder_.path, options);
    EXPECT_EQ(dataset.total_tiles(), 177);
    const auto ids = flatten(run_epoch(dataset, folder_, 1));
    EXPECT_EQ(std::set<std::int64_t>(ids.begin(), ids.end()), expected);
    EXPECT_EQ(ids.size(), expected.size());
    seen.insert(ids.begin(), ids.end());
  }
  auto options = small_options();
  options.slides = {"nothing"};
  io::ShardDataset none(folder_.path, options);
  EXPECT_EQ(none.total_tiles(), 0);
  EXPECT_EQ(none.batches_per_epoch(), 0);
  EXPECT_TRUE(run_epoch(none, folder_, 0).empty());
}

// data.exclude_artefacts: the tiles kept with the excluded-artefact bit are left out, shuffled or not, with the slide
// filter; flagged tiles stay. Without the option, or in shards without the bits, every tile is read.
TEST(ShardDatasetArtefacts, ExcludedArtefactTilesAreLeftOutWhenAsked) {
  TempDir dir;
  const Folder folder = write_folder(dir.file("shards"), standard, tile, {}, /*artefacts=*/true);
  std::set<std::int64_t> expected, expected_b;
  for (std::int64_t i = 0; i < folder.total(); ++i) {
    if ((artefact_bits(i) & io::kShardArtefactExcluded) != 0) continue;
    expected.insert(i);
    if (folder.slide_of[static_cast<std::size_t>(i)] == "B") expected_b.insert(i);
  }
  ASSERT_EQ(expected.size(), 437u - 88u);
  for (const bool shuffle : {true, false}) {
    SCOPED_TRACE(shuffle ? "shuffled" : "in order");
    auto options = small_options();
    options.shuffle = shuffle;
    options.drop_last = false;
    options.exclude_artefacts = true;
    io::ShardDataset dataset(folder.path, options);
    EXPECT_EQ(dataset.total_tiles(), static_cast<std::int64_t>(expected.size()));
    const auto ids = flatten(run_epoch(dataset, folder, 2));
    EXPECT_EQ(ids.size(), expected.size());
    EXPECT_EQ(std::set<std::int64_t>(ids.begin(), ids.end()), expected);
    options.slides = {"B"};
    io::ShardDataset only_b(folder.path, options);
    const auto b = flatten(run_epoch(only_b, folder, 2));
    EXPECT_EQ(std::set<std::int64_t>(b.begin(), b.end()), expected_b);
  }
  auto options = small_options();
  options.drop_last = false;
  EXPECT_EQ(io::ShardDataset(folder.path, options).total_tiles(), 437) << "kept without the option";
  const Folder plain = write_folder(dir.file("plain"), standard);
  options.exclude_artefacts = true;
  EXPECT_EQ(io::ShardDataset(plain.path, options).total_tiles(), 437) << "no bits, nothing left out";
}

TEST_F(ShardDatasetTest, UnshuffledIsInOrderAndComplete) {
  std::vector<std::int64_t> all(437);
  std::iota(all.begin(), all.end(), 0);
  for (int world = 1; world <= 3; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<std::int64_t> joined;
    for (int rank = 0; rank < world; ++rank) {
      auto options = small_options();
      options.shuffle = false;
      options.drop_last = false;
      options.rank = rank;
      options.world_size = world;
      io::ShardDataset dataset(folder_.path, options);
      const std::int64_t part = dataset.tiles_per_rank();
      EXPECT_TRUE(part == 437 / world || part == 437 / world + 1) << part;
      const auto batches = run_epoch(dataset, folder_, rank + 7);  // the epoch does not matter
      EXPECT_EQ(static_cast<std::int64_t>(batches.size()), dataset.batches_per_epoch());
      const auto ids = flatten(batches);
      EXPECT_EQ(static_cast<std::int64_t>(ids.size()), part);
      joined.insert(joined.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(joined, all);
  }
}

TEST_F(ShardDatasetTest, ShardErrorSurfacesFromNext) {
  auto options = small_options();
  options.shuffle = false;
  options.prefetch_batches = 2;
  io::ShardDataset dataset(folder_.path, options);
  // The second shard loses most of its tiles after the dataset opened it (a file system going bad).
  const std::string broken = folder_.path + "/shard-1.h5";
  const auto shard = io::ShardFile::open(broken);
  fs::resize_file(broken, shard.images_offset() + 20 * shard.tile_bytes());
  for (int round = 0; round < 2; ++round) {
    dataset.start_epoch(0);
    io::Batch batch;
    int delivered = 0;
    try {
      while (dataset.next(batch)) ++delivered;
      FAIL() << "the epoch ended without the error";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), broken);
      EXPECT_EQ(e.message().rfind("truncated: expected at least", 0), 0u) << e.what();
    }
    EXPECT_GE(delivered, 150 / 16) << "the batches read before the failure come first";
    EXPECT_THROW(dataset.next(batch), core::InputError) << "the error stays until the next start_epoch";
  }
}

TEST_F(ShardDatasetTest, RestartWhilePrefetching) {
  auto options = small_options();
  options.batch_size = 4;
  options.prefetch_batches = 2;
  io::ShardDataset reference(folder_.path, options);
  const auto expected = run_epoch(reference, folder_, 1);

  io::ShardDataset dataset(folder_.path, options);
  io::Batch batch;
  for (int i = 0; i < 20; ++i) {
    dataset.start_epoch(i % 3);
    if (i % 2 == 0) {
      ASSERT_TRUE(dataset.next(batch));
    }
  }
  EXPECT_EQ(run_epoch(dataset, folder_, 1), expected);
  {
    io::ShardDataset abandoned(folder_.path, options);
    abandoned.start_epoch(0);
    ASSERT_TRUE(abandoned.next(batch));
  }  // destroyed with the prefetch thread waiting on a full queue
  EXPECT_THROW(
      {
        io::ShardDataset fresh(folder_.path, options);
        fresh.next(batch);
      },
      core::InternalError)
      << "next() before start_epoch()";
}

// ---------------------------------------------------------------------------------------------------------
// The naive twin: the epoch layout of shard_dataset.cpp's header comment, one tile at a time with plain vectors.
// "Same seed, same batches" holds across builds and versions, so the optimized reader must give exactly these.

std::uint64_t stream_seed(std::uint64_t seed, std::int64_t epoch, std::uint64_t stream) {
  using core::splitmix64;
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(epoch)) ^ stream);
}

std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = rng();
    if (r >= limit) return r % n;
  }
}

// `shards` as in write_folder; returns this rank's batches of global tile indices.
std::vector<std::vector<std::int64_t>> reference_epoch(const std::vector<ShardSpec>& shards,
                                                       const io::ShardDatasetOptions& o, std::int64_t epoch) {
  // 1. Blocks: runs of one selected slide inside one shard, at most block_size tiles.
  std::vector<std::vector<std::int64_t>> blocks;
  std::int64_t global = 0;
  for (const auto& shard : shards) {
    std::vector<std::string> slide_of;
    for (const auto& [id, count] : shard) slide_of.insert(slide_of.end(), static_cast<std::size_t>(count), id);
    for (std::size_t i = 0; i < slide_of.size();) {
      std::size_t end = i + 1;
      while (end < slide_of.size() && end - i < static_cast<std::size_t>(o.block_size) &&
             slide_of[end] == slide_of[i]) {
        ++end;
      }
      if (o.slides.empty() || o.slides.contains(slide_of[i])) {
        std::vector<std::int64_t> block;
        for (std::size_t k = i; k < end; ++k) block.push_back(global + static_cast<std::int64_t>(k));
        blocks.push_back(block);
      }
      i = end;
    }
    global += static_cast<std::int64_t>(slide_of.size());
  }
  // 2. Block order, shared by all ranks.
  std::vector<std::uint32_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0U);
  if (o.shuffle) {
    std::mt19937_64 rng(stream_seed(o.seed, epoch, 0));
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[uniform_below(rng, i)]);
  }
  std::vector<std::int64_t> sequence;
  for (const auto b : order) sequence.insert(sequence.end(), blocks[b].begin(), blocks[b].end());
  // 3. This rank's part.
  const auto total = static_cast<std::int64_t>(sequence.size());
  const std::int64_t world = o.world_size;
  const std::int64_t begin = o.shuffle ? o.rank * (total / world) : o.rank * total / world;
  const std::int64_t end = o.shuffle ? begin + total / world : (o.rank + 1) * total / world;
  std::vector<std::int64_t> part(sequence.begin() + begin, sequence.begin() + end);
  // 4. Shuffle buffer: fill, then each incoming tile replaces a random one that leaves; then drain.
  std::vector<std::int64_t> out;
  if (o.shuffle && o.shuffle_buffer > 1) {
    std::mt19937_64 rng(stream_seed(o.seed, epoch, 1 + static_cast<std::uint64_t>(o.rank)));
    const auto capacity = static_cast<std::size_t>(o.shuffle_buffer);
    std::vector<std::int64_t> buffer;
    for (const auto incoming : part) {
      if (buffer.size() < capacity) {
        buffer.push_back(incoming);
      } else {
        const auto j = uniform_below(rng, capacity);
        out.push_back(buffer[j]);
        buffer[j] = incoming;
      }
    }
    while (!buffer.empty()) {
      const auto j = uniform_below(rng, buffer.size());
      out.push_back(buffer[j]);
      buffer[j] = buffer.back();
      buffer.pop_back();
    }
  } else {
    out = part;
  }
  // 5. Batches.
  const std::int64_t batch = o.batch_size;
  const std::int64_t batches =
      o.drop_last ? total / world / batch : (static_cast<std::int64_t>(part.size()) + batch - 1) / batch;
  std::vector<std::vector<std::int64_t>> result;
  for (std::int64_t b = 0; b < batches; ++b) {
    const auto from = out.begin() + b * batch;
    result.emplace_back(from,
                        out.begin() + std::min<std::int64_t>((b + 1) * batch, static_cast<std::int64_t>(out.size())));
  }
  return result;
}

TEST_F(ShardDatasetTest, EpochsMatchTheNaiveLayout) {
  struct Case {
    int batch, block, buffer, rank, world;
    bool shuffle, drop_last;
    std::set<std::string> slides;
  };
  const std::vector<Case> cases = {
      {16, 8, 50, 0, 1, true, true, {}},         {16, 8, 50, 1, 2, true, false, {}},
      {7, 13, 1000, 2, 3, true, false, {}},      {5, 64, 2, 0, 1, true, true, {}},
      {16, 8, 0, 1, 3, true, true, {}},          {16, 8, 1, 0, 2, true, false, {}},
      {13, 300, 30, 0, 1, true, false, {}},      {16, 8, 50, 1, 2, false, false, {}},
      {9, 5, 17, 0, 2, true, false, {"B", "E"}}, {1, 1, 437, 0, 1, true, true, {}},
      {64, 64, 2048, 0, 1, true, false, {}},
  };
  for (const auto& c : cases) {
    auto options = small_options();
    options.batch_size = c.batch;
    options.block_size = c.block;
    options.shuffle_buffer = c.buffer;
    options.rank = c.rank;
    options.world_size = c.world;
    options.shuffle = c.shuffle;
    options.drop_last = c.drop_last;
    options.slides = c.slides;
    io::ShardDataset dataset(folder_.path, options);
    for (const std::int64_t epoch : {0, 9}) {
      std::ostringstream trace;
      trace << "batch " << c.batch << " block " << c.block << " buffer " << c.buffer << " rank " << c.rank << "/"
            << c.world << " shuffle " << c.shuffle << " drop_last " << c.drop_last << " slides " << c.slides.size()
            << " epoch " << epoch;
      SCOPED_TRACE(trace.str());
      EXPECT_EQ(run_epoch(dataset, folder_, epoch), reference_epoch(standard, options, epoch));
    }
  }
}

TEST_F(ShardDatasetTest, RejectsBadOptions) {
  auto options = small_options();
  options.rank = 2;
  options.world_size = 2;
  EXPECT_THROW(io::ShardDataset(folder_.path, options), core::InternalError);
  options = small_options();
  options.batch_size = 0;
  EXPECT_THROW(io::ShardDataset(folder_.path, options), core::InternalError);
}

TEST(ShardDatasetFolder, ShardsMustAgree) {
  TempDir dir;
  // Tile size: the second shard is written with 16-pixel tiles under an 8-pixel manifest.
  {
    const std::string path = dir.file("sizes");
    write_folder(path, {{{"A", 10}}});
    io::ShardAttributes big;
    big.tile_size = 16;
    big.mpp = 0.5;
    io::ShardWriter writer(path + "/shard-1.h5", big, 1, {"B"});
    const auto pixels = tile_pixels(0, 16);
    writer.write(0, {record_of(0, 0)}, pixels.data());
    writer.finish();
    auto manifest = io::read_manifest(path + "/manifest.json");
    manifest.shards.push_back({"shard-1.h5", 1, 0, 0, {"B"}});
    io::write_manifest(path + "/manifest.json", manifest);
    try {
      io::ShardDataset dataset(path, small_options());
      FAIL() << "mixed tile sizes";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path + "/shard-1.h5");
      EXPECT_EQ(e.message().rfind("tile size 16 differs from 8", 0), 0u) << e.what();
    }
  }
  // mpp
  {
    const std::string path = dir.file("mpp");
    write_folder(path, {{{"A", 10}}, {{"B", 10}}}, tile, {0.5, 0.25});
    try {
      io::ShardDataset dataset(path, small_options());
      FAIL() << "mixed mpp";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path + "/shard-1.h5");
      EXPECT_NE(e.message().find("mpp"), std::string::npos) << e.what();
    }
  }
  // A shard listed in the manifest but gone, and a manifest whose tile count is stale.
  {
    const std::string path = dir.file("gone");
    write_folder(path, {{{"A", 10}}, {{"B", 10}}});
    fs::remove(path + "/shard-1.h5");
    try {
      io::ShardDataset dataset(path, small_options());
      FAIL() << "missing shard";
    } catch (const core::FileNotFoundError& e) {
      EXPECT_EQ(e.file(), path + "/shard-1.h5");
    }
    auto manifest = io::read_manifest(path + "/manifest.json");
    manifest.shards.pop_back();
    manifest.shards[0].tiles = 11;
    io::write_manifest(path + "/manifest.json", manifest);
    EXPECT_THROW(io::ShardDataset(path, small_options()), core::InputError);
  }
  EXPECT_THROW(io::ShardDataset(dir.file("nowhere"), small_options()), core::FileNotFoundError);
}

// The manifest's class counts, per shard and per slide, are what the shards' labels say; counts it does not give
// (0 and 0, as above) are not checked.
TEST(ShardDatasetFolder, ManifestClassCountsMatchTheShards) {
  TempDir dir;
  const std::string path = dir.file("counts");
  write_folder(path, {{{"A", 10}, {"B", 5}}, {{"B", 6}}});  // labels: tumour at every third global index
  const std::string manifest_path = path + "/manifest.json";
  auto manifest = io::read_manifest(manifest_path);
  // Global indices 0..14 in shard 0 (A 0..9, B 10..14), 15..20 in shard 1 (B).
  manifest.shards[0].normal = 10;
  manifest.shards[0].tumour = 5;
  manifest.shards[1].normal = 4;
  manifest.shards[1].tumour = 2;
  manifest.slides = {{"A", "a.svs", "tumor", "train", 10, 6, 4}, {"B", "b.svs", "normal", "train", 11, 8, 3}};
  io::write_manifest(manifest_path, manifest);
  EXPECT_NO_THROW(io::ShardDataset(path, small_options()));

  auto stale_shard = manifest;
  stale_shard.shards[1].normal = 5;
  stale_shard.shards[1].tumour = 1;
  io::write_manifest(manifest_path, stale_shard);
  try {
    io::ShardDataset dataset(path, small_options());
    FAIL() << "stale per-shard counts";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path + "/shard-1.h5");
    EXPECT_EQ(e.message(), "its labels hold 4 normal and 2 tumour tiles, but '" + manifest_path +
                               "' lists 5 normal and 1 tumour for this shard");
  }

  auto stale_slide = manifest;
  stale_slide.slides[1].normal = 9;
  stale_slide.slides[1].tumour = 2;
  io::write_manifest(manifest_path, stale_slide);
  try {
    io::ShardDataset dataset(path, small_options());
    FAIL() << "stale per-slide counts";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), manifest_path);
    EXPECT_EQ(e.message(),
              "slide 'B': the manifest lists 11 tiles (9 normal and 2 tumour), its shards ('shard-0.h5', "
              "'shard-1.h5') hold 11 (8 normal and 3 tumour)");
  }
}

}  // namespace
