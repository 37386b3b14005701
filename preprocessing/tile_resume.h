// Resuming the tile job: a record per finished shard.
//
// A shard is extracted to `shard-NNNNN.h5.unchecked` (complete: io::ShardWriter renames it into place when finished)
// and then a record of it is written to `.tessera-tile-shards/shard-NNNNN.h5.json`: the job's hash, the shard's span
// of the job's tiles, a digest of those tiles, its tile count, a checksum of its pixels and the slides whose tiles
// could not be read while writing it. Once every rank is done, the shards are checked (rewritten without the tiles of
// failed slides) and renamed to their final names. A rerun of the same job after a kill keeps every shard whose
// record matches (the job, the span, the tiles) and whose unchecked file still holds what the record says (the tile
// count and the checksum); only the rest is extracted again. The records stay until the job changes (or --force),
// so that the failures seen while writing a kept shard still reach the manifest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "preprocessing/tile_job.h"

namespace tessera::prep {

// The folder of the shard records, inside the output folder.
inline constexpr const char* kTileRecordFolder = ".tessera-tile-shards";

// XXH3 (64 bits, xxHash): a checksum of a shard's pixels as they are written, checked when a rerun keeps the shard.
// The same bytes give the same checksum however they are split into calls. A record names it (kChecksumAlgorithm);
// records of earlier versions (FNV-1a, unnamed) are not kept: a rerun extracts their shards again, saying so.
inline constexpr const char* kChecksumAlgorithm = "xxh3-64";

class PixelChecksum {
 public:
  PixelChecksum();
  ~PixelChecksum();
  PixelChecksum(const PixelChecksum&) = delete;
  PixelChecksum& operator=(const PixelChecksum&) = delete;
  void add(const std::uint8_t* data, std::size_t bytes);
  void add(const std::string& text);  // with its terminating zero
  std::string hex() const;            // 16 hex digits

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct ShardRecord {
  std::string job;  // the job's hash
  std::int64_t index = -1;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::string tiles;                          // digest of the span's tiles: slide, position and label of each
  std::int64_t kept = 0;                      // tiles the shard holds (fewer than count when damaged ones were skipped)
  std::string checksum;                       // PixelChecksum of the extracted (unchecked) shard
  std::map<std::string, std::string> failed;  // slide id → error, for every slide of the span not read whole
  // The import's: the groups of the span whose stain could not be fitted (group → why), whose patches the shard holds
  // as they were (imported-stain-kept). Absent in tile's records and in the import's of earlier versions.
  std::optional<std::map<std::string, std::string>> stain_kept;
};

std::filesystem::path shard_record_path(const std::filesystem::path& out, std::int64_t index);

// Writes `record` atomically to its place under `out`.
void write_shard_record(const std::filesystem::path& out, const ShardRecord& record);

// The record of shard `span` of job `job`, when there is one that matches; nullopt otherwise (no record, another
// job's, another span: the rank count changed, other tiles at the span's place: a slide failed planning in one run
// and not in the other, an unreadable record: logged, a record of an earlier version of Tessera: logged once per
// `earlier_logged` flag, which starts false for each job; every time without one). With `needs_stain_kept` (an import
// that fits groups), a record without stain_kept is one of an earlier version too.
std::optional<ShardRecord> read_shard_record(const std::filesystem::path& out, const std::string& job,
                                             const ShardSpan& span, const std::string& tiles,
                                             bool* earlier_logged = nullptr, bool needs_stain_kept = false);

// True when the shard at `path` opens as a shard and, with `check_pixels`, holds the record's tile count and pixel
// checksum. Says why not in the log.
bool shard_matches(const std::string& path, const ShardRecord& record, bool check_pixels);

// The resume decision for one shard of this run: its record when an earlier run of the same job finished extracting
// it and it can be kept as it is; nullopt when it must be extracted again. Only an extracted (unchecked) shard is
// kept: one already put in place (a run killed between that and its manifest) may have been rewritten without
// slides that failed elsewhere in that run, which this run's failures need not match.
// `earlier_logged`, `needs_stain_kept`: as for read_shard_record() (decided before the shard's pixels are read).
std::optional<ShardRecord> finished_shard(const std::filesystem::path& out, const std::string& job,
                                          const ShardSpan& span, const std::string& tiles,
                                          bool* earlier_logged = nullptr, bool needs_stain_kept = false);

}  // namespace tessera::prep
