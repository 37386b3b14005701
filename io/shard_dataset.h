// The training reader over a shard folder.
//
// Tiles are grouped into blocks: runs of at most `block_size` consecutive tiles of one slide inside one
// shard, so each block is read front to back as contiguous file ranges (one read, or a few consecutive ones
// where the shuffle buffer hands out a slot twice within the block). Every epoch the blocks of the selected
// slides are shuffled with (seed, epoch); the shuffled tile sequence is cut into `world_size` equal, disjoint
// parts (the last few tiles that do not divide evenly are left out of that epoch), and each rank reads its
// part block by block through a shuffle buffer of `shuffle_buffer` tiles, so every batch mixes slides. Tiles
// are read straight into their buffer slots (or, without a buffer, into the batch). A background thread reads
// ahead `prefetch_batches` batches; batches handed back through next() are reused. The same seed, epoch, rank
// and world size give the same batches. Train/validation split is by slide (the `slides` filter), never by tile.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/shard.h"

namespace tessera::io {

struct ShardDatasetOptions {
  int batch_size = 64;
  int block_size = 64;        // tiles per contiguous read
  int shuffle_buffer = 2048;  // tiles; 0 or 1 = read order of the shuffled blocks
  int prefetch_batches = 4;
  std::uint64_t seed = 1;
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;           // false: blocks in shard order, no buffer (validation, prediction)
  bool drop_last = true;         // drop the last incomplete batch of a rank's part
  std::set<std::string> slides;  // only these slide ids (empty = all)
  // Leave out the tiles whose artefact bits (ShardFile::artefacts) say excluded artefacts cover them
  // (kShardArtefactExcluded: the tiles `tile.artefact_tiles: keep` kept).
  bool exclude_artefacts = false;
};

struct Batch {
  int size = 0;
  int tile_size = 0;
  std::vector<std::uint8_t> images;  // size · T · T · 3, RGB, [n][y][x][c]
  std::vector<std::uint8_t> labels;
  std::vector<float> tumor_fractions;
  std::vector<std::int64_t> coords;  // x, y per tile
  std::vector<std::string> slide_ids;
};

class ShardDataset {
 public:
  // `folder` holds manifest.json and the shards it lists. core::InputError naming the file on a missing or
  // broken manifest or shard, or shards whose tile size / mpp disagree.
  ShardDataset(const std::string& folder, const ShardDatasetOptions& options);
  ~ShardDataset();  // stops the prefetch thread
  ShardDataset(const ShardDataset&) = delete;
  ShardDataset& operator=(const ShardDataset&) = delete;

  const Manifest& manifest() const;
  int tile_size() const;
  std::int64_t total_tiles() const;        // selected tiles, all ranks
  std::int64_t tiles_per_rank() const;     // this rank's part of an epoch
  std::int64_t batches_per_epoch() const;  // this rank's batches per epoch (equal on every rank)

  // Starts epoch `epoch` (restartable at any time; a running prefetch is cancelled).
  void start_epoch(std::int64_t epoch);
  // The next batch of the current epoch; false at the end of the epoch.
  bool next(Batch& batch);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
