// The tile job (`tessera tile`): slides + tumour annotations → contiguous HDF5 shards of labelled tiles.
//
// 1. Inputs: a glob list or a dataset.csv (slide, label, annotation, split, optional mpp), resolved identically on
//    every rank (resolve_tile_inputs).
// 2. Plan, parallel over slides: tissue mask at low resolution, tile grid at the target µm/px, labels from the
//    annotation polygons, caps. Every rank then holds every slide's plan (allgather).
// 3. Extract, parallel over tiles: the job's tiles in slide order are cut into equal contiguous parts, one per rank
//    (core::part_begin), each cut into shards of at most shards.tiles_per_shard (assign_shards). Each rank reads its
//    part (best level + area resampling, stain normalization) into its own shards, written as
//    `shard-NNNNN.h5.unchecked`; a shard touched by a slide that failed anywhere is rewritten without that slide's
//    tiles; rank 0 writes manifest.json last. A damaged tile (its decode fails or warns) fails its slide like any
//    unreadable region; with tile.on_corrupt_tile: skip it is left out of its shard instead, and the manifest counts
//    per slide the planned tiles no shard holds (corrupt_tiles).
// Resume (preprocessing/tile_resume.h): the job's hash (config + stain reference's bytes + slide files) is kept in
// `.tessera-tile-state.json` and a record per extracted shard in `.tessera-tile-shards/`; a rerun of the same job
// keeps every shard whose record and file agree and extracts only the rest; a finished job is reported up to date;
// `force` starts over.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/config.h"
#include "core/signals.h"
#include "preprocessing/stain_norm.h"

namespace tessera::prep {

// The job's settings: every key, its default, its range and its help text (tessera tile --help-config).
const core::Schema& tile_schema();

// One slide of the job, as the inputs give it.
struct SlideInput {
  std::string id;
  std::string path;
  std::string label;  // "tumor", "normal", ""
  std::string split;
  std::string annotation;  // "" = none
  double mpp = 0.0;        // per-slide override (0 = from the slide)
};

// The job's slides: input.slides (files and globs; a slide's annotation is <stem>.xml, .geojson or .json beside
// it) or input.csv (io/dataset.h), never both. ConfigError naming the key for no slides, a glob matching nothing or
// two slides with one id.
std::vector<SlideInput> resolve_tile_inputs(const core::Config& config);

// One shard of the job: its number and its span of the job's tiles (in slide order).
struct ShardSpan {
  std::int64_t index = 0;  // global shard number
  std::int64_t first = 0;  // first job tile
  std::int64_t count = 0;
};

// "shard-00042.h5".
std::string shard_name(std::int64_t index);

// A job's stain.reference as read once: the same bytes give the job's hash (stain_reference_digest) and its target
// (stain_target), so a reference replaced while the job runs can never put shards of the old target under the new
// bytes' hash. Empty path and bytes without a reference or with stain.method: none.
struct StainReference {
  std::string path;
  std::vector<unsigned char> bytes;
};

// Reads the job's stain.reference (core::FileNotFoundError or InputError naming the file when it cannot be read).
StainReference read_stain_reference(const core::Config& config);

// The stain target of a job's stain.method and its reference: the built-in one, or fitted on the reference's bytes
// decoded (InputError naming the file when they cannot be decoded or hold too little tissue); nullptr for
// stain.method: none.
std::unique_ptr<StainNormalizer> stain_target(const core::Config& config, const StainReference& reference);

// What a job's hash covers of its stain reference beyond the config's path: the FNV-1a of its bytes, so that a
// reference replaced at the same path makes another job (its shards are not kept); "" without a reference (those
// hashes stay as they were).
std::string stain_reference_digest(const StainReference& reference);

// The tile job's hash, kept in `.tessera-tile-state.json`: FNV-1a over the effective config (but tile.threads), the
// stain reference's digest and each slide's path, size and modification time.
std::string tile_job_hash(const core::Config& config, const StainReference& reference,
                          const std::vector<SlideInput>& inputs);

// Every rank's shards: rank r's part of `total` tiles (core::part_begin) is cut into shards of at most `per_shard`
// tiles, numbered rank by rank. Depends only on the counts.
std::vector<std::vector<ShardSpan>> assign_shards(std::int64_t total, int ranks, std::int64_t per_shard);

struct TileJobOptions {
  bool force = false;         // start over even when the output is up to date
  bool preview_only = false;  // only plan and write previews/<slide>.png
};

// What the job did, the same on every rank.
struct TileJobResult {
  bool up_to_date = false;     // the output was already this job's; nothing was done
  bool slides_failed = false;  // some slides failed and were left out (listed in the manifest and on stderr)
  // Not none: the job stopped on this request (core/signals.h) with the shards finished so far recorded and no
  // manifest; a rerun of the job extracts only the rest. SIGUSR1 lets each rank finish the shard in hand; under
  // SIGTERM a rank stops at its next tile (InterruptedError, which ends the job) and the shard is redone.
  core::StopRequest stopped = core::StopRequest::none;
};

// Runs the job of `config` (validated against tile_schema()) on every rank of `world`. Locks the output folder
// for the whole job (core/output_dir.h).
TileJobResult run_tile_job(const core::Config& config, const TileJobOptions& options, const core::Comm& world);

}  // namespace tessera::prep
