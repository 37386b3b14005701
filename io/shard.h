// HDF5 shards of labelled tiles (`tessera tile` → `tessera train`), layout fixed in docs/ARCHITECTURE.md:
//
//   images          uint8   [N, T, T, 3]  RGB tiles, CONTIGUOUS layout (one read per block of tiles)
//   labels          uint8   [N]           0 normal, 1 tumour
//   tumor_fraction  float32 [N]
//   coords          int64   [N, 2]        level-0 (x, y) of each tile's top-left
//   slide_index     uint32  [N]           row in `slides`
//   slides          string  [S]           slide ids (variable-length UTF-8)
//   artefacts       uint16  [N]           optional: quality control's artefact bits per tile (kShardArtefact*)
//   attributes: format = "tessera-shard", version, tile_size, mpp, stain_normalization
//
// A shard is written under a temporary name and renamed when complete, so no reader ever sees a
// half-written shard. Readers validate the layout and the file size and refuse a truncated or foreign file
// with a core::InputError naming the file and the first problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "io/tissue_settings.h"

namespace tessera::io {

inline constexpr int shard_format_version = 1;

// The classes of a shard's labels, by value (0 normal, 1 tumour): the names a model trained on shards records in
// its checkpoint's class_names.
inline const std::vector<std::string> kLabelNames = {"normal", "tumor"};

// The optional `artefacts` dataset (written by `tessera tile` when quality control ran): per tile, bit k (k = 0..8,
// the class order of preprocessing/qc.h and of `<slide>.qc.png`) set when class k covers more than qc.max_fraction
// of the tile, and kShardArtefactExcluded when the excluded artefacts together do (the tiles tile.artefact_tiles:
// drop leaves out). A shard without the dataset (QC off, tessera import, or written before it) reads as all zeros:
// no artefact.
inline constexpr int kShardArtefactClasses = 9;
inline constexpr std::uint16_t kShardArtefactExcluded = 1u << 9;
inline constexpr std::uint16_t kShardArtefactBits = ((1u << kShardArtefactClasses) - 1u) | kShardArtefactExcluded;

struct ShardAttributes {
  int tile_size = 0;
  double mpp = 0.0;
  std::string stain_normalization = "none";
  bool artefacts = false;  // the shard holds the `artefacts` dataset (not part of the manifest's attributes)
};

struct ShardTileRecord {
  std::uint8_t label = 0;
  float tumor_fraction = 0.0f;
  std::int64_t x = 0;
  std::int64_t y = 0;
  std::uint32_t slide_index = 0;
  std::uint16_t artefacts = 0;  // written only when ShardAttributes::artefacts
};

// Memory for blocks of tiles to write (ShardWriter::write), aligned for direct writes to the disk.
class ImageBuffer {
 public:
  static constexpr std::size_t kAlignment = 4096;
  // `bytes` of memory; what it held is kept only when it is not larger than before.
  void resize(std::size_t bytes);
  std::uint8_t* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::uint8_t* p) const;
  };
  std::unique_ptr<std::uint8_t, Free> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

// The memory alignment ShardWriter's direct writes need for the existing file `path` (1 or more), or 0 where it
// writes through the page cache only (not Linux 6.1 or later, or a file system without direct I/O or that
// does not state its alignment: tmpfs, NFS, parallel file systems).
std::uint64_t direct_write_alignment(const std::string& path);

class ShardWriter {
 public:
  // Creates `<path>.tmp-<pid>` with datasets sized for exactly `tile_count` tiles of `slides`.
  ShardWriter(const std::string& path, const ShardAttributes& attributes, std::int64_t tile_count,
              const std::vector<std::string>& slides);
  ~ShardWriter();  // without finish(): closes and deletes the temporary file
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Writes tiles [first, first + records.size()): `images` holds records.size() RGB tiles back to back
  // (T·T·3 bytes each, C-order [n][y][x][c]). Where the file system does direct I/O (Linux: O_DIRECT, its alignment
  // from statx) and `images` is aligned for it (an ImageBuffer is), the whole file pages of the block go to the disk
  // straight from `images`, without a copy into the page cache; the rest goes through it. The file is the same.
  void write(std::int64_t first, const std::vector<ShardTileRecord>& records, const std::uint8_t* images);
  // Convenience for one tile from a CV_8UC3 T×T RGB image.
  void write(std::int64_t index, const ShardTileRecord& record, const cv::Mat& rgb);
  // Checks that every tile was written, flushes, closes and renames into place.
  void finish();
  // Image bytes written directly so far (the rest went through the page cache).
  std::uint64_t direct_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Read access to one shard. Metadata (labels, fractions, coords, slide ids) is loaded at open; image blocks
// are read on demand with one contiguous read each, straight from the file offset of the contiguous
// dataset (so reading needs no HDF5 call and is safe from several threads).
class ShardFile {
 public:
  static ShardFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const ShardAttributes& attributes() const { return attributes_; }
  std::int64_t size() const { return static_cast<std::int64_t>(labels_.size()); }
  int tile_size() const { return attributes_.tile_size; }
  std::size_t tile_bytes() const;

  const std::vector<std::uint8_t>& labels() const { return labels_; }
  const std::vector<float>& tumor_fractions() const { return fractions_; }
  const std::vector<std::int64_t>& coords() const { return coords_; }  // x0, y0, x1, y1, ...
  const std::vector<std::uint32_t>& slide_indices() const { return slide_index_; }
  const std::vector<std::string>& slides() const { return slides_; }
  // Per tile, the artefact bits (kShardArtefact*); zeros when the shard has no `artefacts` dataset
  // (attributes().artefacts false).
  const std::vector<std::uint16_t>& artefacts() const { return artefacts_; }

  // Reads tiles [first, first + count) into `out` (count · tile_bytes() bytes): one pread.
  void read_images(std::int64_t first, std::int64_t count, std::uint8_t* out) const;
  // Reads tiles [first, first + destinations.size()), tile k into destinations[k] (tile_bytes() each): one
  // contiguous read of the file (preadv) into scattered buffers, e.g. the free slots of a shuffle buffer.
  void read_images(std::int64_t first, const std::vector<std::uint8_t*>& destinations) const;
  cv::Mat read_image(std::int64_t index) const;  // one tile as CV_8UC3 RGB

  // Byte offset of the images dataset in the file (for benchmarks and layout tests).
  std::uint64_t images_offset() const { return images_offset_; }

 private:
  std::string path_;
  ShardAttributes attributes_;
  std::vector<std::uint8_t> labels_;
  std::vector<float> fractions_;
  std::vector<std::int64_t> coords_;
  std::vector<std::uint32_t> slide_index_;
  std::vector<std::string> slides_;
  std::vector<std::uint16_t> artefacts_;
  std::uint64_t images_offset_ = 0;
  std::shared_ptr<int> fd_;  // shared file descriptor, closed with the last copy
};

// manifest.json of a shard folder.
struct ManifestShard {
  std::string file;  // relative to the manifest's folder
  std::int64_t tiles = 0;
  std::int64_t normal = 0;
  std::int64_t tumour = 0;
  std::vector<std::string> slides;
};

struct ManifestSlide {
  std::string id;
  std::string path;
  std::string label;  // "tumor", "normal" or "" when unknown
  std::string split;  // "train", "val", "test" or ""
  std::int64_t tiles = 0;
  std::int64_t normal = 0;
  std::int64_t tumour = 0;
  // Planned tiles left out because their pixels are damaged (`tile.on_corrupt_tile: skip`); 0 in manifests
  // written before the field existed.
  std::int64_t corrupt_tiles = 0;
  // "synthetic" (made by tessera synth) or "real" (io/provenance.h); "" in manifests written before the field.
  std::string origin{};
  // Planned tiles dropped by quality control (preprocessing/qc.h), by the artefact class covering most of each;
  // empty when QC was off or dropped nothing (and in manifests written before the field).
  std::map<std::string, std::int64_t> qc_dropped_tiles{};
  // Tiles over qc.max_fraction kept in the shards (tile.artefact_tiles: keep, their artefacts bit
  // kShardArtefactExcluded set), by the class covering most of each; empty otherwise.
  std::map<std::string, std::int64_t> qc_kept_tiles{};
};

struct ManifestFailure {
  std::string slide;
  std::string error;
};

struct Manifest {
  std::string config_hash;  // of the settings that decide the tiles (resume skips when equal)
  std::string config_yaml;  // the effective job
  ShardAttributes attributes;
  // The tissue.* settings the tiles were kept by: the manifest's "tissue" object ({min_fraction, mask_mpp,
  // reject_pen_marks}); in a manifest written before it, read from config_yaml. nullopt when neither has them (a
  // manifest not written by tessera tile).
  std::optional<TissueSettings> tissue;
  std::vector<ManifestShard> shards;
  std::vector<ManifestSlide> slides;
  std::vector<ManifestFailure> failures;
  std::int64_t total_tiles() const;
};

Manifest read_manifest(const std::string& path);  // core::InputError naming the file on any problem
void write_manifest(const std::string& path, const Manifest& manifest);  // atomic

}  // namespace tessera::io
