#include "io/shard_dataset.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/random.h"

// Epoch layout, for one (seed, epoch):
//   1. blocks (≤ block_size consecutive tiles of one selected slide in one shard) in shard order;
//   2. shuffle=true: permuted by a Fisher–Yates shuffle seeded from (seed, epoch) only, so every rank sees
//      the same permutation;
//   3. the concatenated tile sequence is cut into world_size parts. Shuffled: floor(total / W) tiles each,
//      the last total % W tiles of the sequence are left out this epoch (a different set every epoch).
//      Not shuffled: part r is [r·total/W, (r+1)·total/W), so every tile is used and parts differ by at most
//      one tile;
//   4. rank r reads its part block by block (a block may be split at a part boundary) through a shuffle
//      buffer seeded from (seed, epoch, rank) and cuts it into batches.
// Batches per epoch: drop_last → floor(floor(total / W) / batch_size) on every rank (a rank whose unshuffled
// part has one tile more drops it with the last incomplete batch); otherwise ceil(part / batch_size), which is
// equal on every rank when shuffled, and may differ by one between ranks when not shuffled (validation and
// prediction, where every tile counts).
//
// Random numbers come from std::mt19937_64, whose output the standard fixes, through our own bounded draw and
// Fisher–Yates: std::uniform_int_distribution and std::shuffle differ between standard libraries, which would
// break "same seed, same batches" across builds.

namespace tessera::io {
namespace {

// Independent streams per (seed, epoch, stream); stream 0 is the block order shared by all ranks.
std::uint64_t stream_seed(std::uint64_t seed, std::int64_t epoch, std::uint64_t stream) {
  using core::splitmix64;
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<std::uint64_t>(epoch)) ^ stream);
}

// Uniform in [0, n), n ≥ 1, without bias: draws below 2^64 mod n are rejected.
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = rng();
    if (r >= limit) return r % n;
  }
}

template <typename T>
void fisher_yates(std::vector<T>& values, std::mt19937_64& rng) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(uniform_below(rng, i));
    std::swap(values[i - 1], values[j]);
  }
}

// A run of tiles read with one read_images call.
struct Block {
  std::uint32_t shard = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
};

bool same_mpp(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); }

struct ClassCounts {
  std::int64_t tiles = 0;
  std::int64_t normal = 0;
  std::int64_t tumour = 0;
};

std::string describe(const ClassCounts& c) {
  return std::to_string(c.normal) + " normal and " + std::to_string(c.tumour) + " tumour";
}

// The manifest's class counts are what `train` weighs the classes by and what users read; a shard whose labels
// say otherwise was changed or replaced after tiling. Counts a manifest does not give (0 normal and 0 tumour:
// not written by `tessera tile`) are not checked.
void check_class_counts(const ManifestShard& entry, const ShardFile& shard, const std::string& path,
                        const std::string& manifest_path) {
  if (entry.normal == 0 && entry.tumour == 0) return;
  ClassCounts held;
  for (const std::uint8_t label : shard.labels()) ++(label == 1 ? held.tumour : held.normal);
  if (held.normal == entry.normal && held.tumour == entry.tumour) return;
  throw core::InputError("its labels hold " + describe(held) + " tiles, but '" + manifest_path + "' lists " +
                             describe({entry.tiles, entry.normal, entry.tumour}) + " for this shard",
                         path);
}

// The same for each slide of the manifest, over all the shards that hold its tiles.
void check_slide_counts(const Manifest& manifest, const std::vector<ShardFile>& shards,
                        const std::string& manifest_path) {
  std::map<std::string, ClassCounts> held;
  std::map<std::string, std::set<std::string>> files;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const ShardFile& shard = shards[s];
    const auto& slide_of = shard.slide_indices();
    for (std::size_t i = 0; i < shard.labels().size(); ++i) {
      const std::string& id = shard.slides()[slide_of[i]];
      ClassCounts& c = held[id];
      ++c.tiles;
      ++(shard.labels()[i] == 1 ? c.tumour : c.normal);
      files[id].insert(manifest.shards[s].file);
    }
  }
  for (const ManifestSlide& slide : manifest.slides) {
    const bool gives_tiles = slide.tiles > 0;
    const bool gives_classes = slide.normal > 0 || slide.tumour > 0;
    if (!gives_tiles && !gives_classes) continue;
    const ClassCounts c = held.contains(slide.id) ? held.at(slide.id) : ClassCounts{};
    if ((!gives_tiles || c.tiles == slide.tiles) &&
        (!gives_classes || (c.normal == slide.normal && c.tumour == slide.tumour))) {
      continue;
    }
    std::string held_by = "no shard holds any";
    if (files.contains(slide.id)) {
      std::string names;
      for (const auto& file : files.at(slide.id)) names += (names.empty() ? "'" : ", '") + file + "'";
      held_by = "its shards (" + names + ") hold " + std::to_string(c.tiles) + " (" + describe(c) + ")";
    }
    throw core::InputError("slide '" + slide.id + "': the manifest lists " + std::to_string(slide.tiles) + " tiles (" +
                               describe({slide.tiles, slide.normal, slide.tumour}) + "), " + held_by,
                           manifest_path);
  }
}

}  // namespace

struct ShardDataset::Impl {
  ShardDatasetOptions options;
  Manifest manifest;
  std::vector<ShardFile> shards;
  int tile_size = 0;
  std::size_t tile_bytes = 0;
  std::vector<Block> blocks;  // shard order
  std::int64_t total = 0;     // selected tiles
  std::int64_t part_begin = 0;
  std::int64_t part_size = 0;
  std::int64_t batches = 0;

  // Prefetch: the worker fills `queue` up to prefetch_batches; next() drains it and hands the caller's previous
  // batch back through `spare`, so that batches are recycled instead of allocated (and page-faulted) each time.
  std::mutex mutex;
  std::condition_variable not_empty;
  std::condition_variable not_full;
  std::deque<Batch> queue;
  std::vector<Batch> spare;
  bool producer_done = false;
  bool cancel = false;
  std::exception_ptr error;
  bool started = false;
  std::thread worker;

  // The shuffle buffer's pixels and its bookkeeping, kept across epochs; only the worker touches them (start_epoch
  // joins the previous worker first). Slots are read into straight from the file and never zeroed.
  std::unique_ptr<std::uint8_t[]> slots;
  std::size_t slot_count = 0;
  std::vector<std::pair<std::uint32_t, std::int64_t>> slot_tiles;  // (shard, tile) in each slot
  std::vector<std::uint32_t> slot_run;                             // run that last drew each slot

  std::size_t spare_limit() const { return static_cast<std::size_t>(std::max(1, options.prefetch_batches)) + 2; }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      cancel = true;
    }
    not_full.notify_all();
    not_empty.notify_all();
    if (worker.joinable()) worker.join();
    std::lock_guard<std::mutex> lock(mutex);
    while (!queue.empty()) {
      if (spare.size() < spare_limit()) spare.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    error = nullptr;
    producer_done = false;
    cancel = false;
  }

  // This rank's reads for `epoch`, in order.
  std::vector<Block> plan(std::int64_t epoch) const {
    std::vector<std::uint32_t> order(blocks.size());
    std::iota(order.begin(), order.end(), 0U);
    if (options.shuffle) {
      std::mt19937_64 rng(stream_seed(options.seed, epoch, 0));
      fisher_yates(order, rng);
    }
    std::vector<Block> reads;
    const std::int64_t part_end = part_begin + part_size;
    std::int64_t position = 0;
    for (const auto index : order) {
      if (position >= part_end) break;
      const Block& b = blocks[index];
      const std::int64_t lo = std::max(position, part_begin);
      const std::int64_t hi = std::min(position + b.count, part_end);
      if (lo < hi) reads.push_back({b.shard, b.first + (lo - position), hi - lo});
      position += b.count;
    }
    return reads;
  }

  // False when cancelled.
  bool push(Batch&& batch) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto capacity = static_cast<std::size_t>(std::max(1, options.prefetch_batches));
    not_full.wait(lock, [&] { return cancel || queue.size() < capacity; });
    if (cancel) return false;
    queue.push_back(std::move(batch));
    lock.unlock();
    not_empty.notify_one();
    return true;
  }

  bool cancelled() {
    std::lock_guard<std::mutex> lock(mutex);
    return cancel;
  }

  // An empty batch with room for batch_size tiles: a recycled one when there is one (no allocation, no zeroing).
  Batch take_batch() {
    Batch batch;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!spare.empty()) {
        batch = std::move(spare.back());
        spare.pop_back();
      }
    }
    const auto n = static_cast<std::size_t>(options.batch_size);
    batch.size = 0;
    batch.tile_size = tile_size;
    batch.images.resize(n * tile_bytes);
    batch.labels.resize(n);
    batch.tumor_fractions.resize(n);
    batch.coords.resize(2 * n);
    batch.slide_ids.resize(n);
    return batch;
  }

  // Copies (or moves) tiles into batches and pushes each full batch. Copy traffic per tile: one read from the
  // file into its final place (the batch, or a shuffle buffer slot) and, with a shuffle buffer, one copy from the
  // slot into the batch.
  void produce(const std::vector<Block>& reads, std::uint64_t buffer_seed) {
    const std::size_t batch_size = static_cast<std::size_t>(options.batch_size);
    const bool buffered = options.shuffle && options.shuffle_buffer > 1;
    const std::size_t capacity = buffered ? static_cast<std::size_t>(options.shuffle_buffer) : 0;
    std::mt19937_64 rng(buffer_seed);

    std::int64_t emitted = 0;
    Batch batch = take_batch();
    // Adds one tile's metadata (and its pixels unless they were read into place already); false once the epoch's
    // batches are all out or the epoch was cancelled.
    auto emit = [&](const std::uint8_t* pixels, std::uint32_t shard_index, std::int64_t tile) {
      if (emitted >= batches) return false;
      const ShardFile& shard = shards[shard_index];
      const auto i = static_cast<std::size_t>(tile);
      const auto n = static_cast<std::size_t>(batch.size);
      if (pixels != nullptr) std::memcpy(batch.images.data() + n * tile_bytes, pixels, tile_bytes);
      batch.labels[n] = shard.labels()[i];
      batch.tumor_fractions[n] = shard.tumor_fractions()[i];
      batch.coords[2 * n] = shard.coords()[2 * i];
      batch.coords[2 * n + 1] = shard.coords()[2 * i + 1];
      batch.slide_ids[n] = shard.slides()[shard.slide_indices()[i]];
      ++batch.size;
      if (static_cast<std::size_t>(batch.size) == batch_size) {
        if (!push(std::move(batch))) return false;
        ++emitted;
        batch = emitted < batches ? take_batch() : Batch{};
      }
      return true;
    };
    auto push_partial = [&] {
      if (batch.size == 0 || emitted >= batches) return;
      const auto n = static_cast<std::size_t>(batch.size);
      batch.images.resize(n * tile_bytes);
      batch.labels.resize(n);
      batch.tumor_fractions.resize(n);
      batch.coords.resize(2 * n);
      batch.slide_ids.resize(n);
      push(std::move(batch));
    };

    if (!buffered) {
      // Each block straight into the batches it falls in.
      for (const Block& read : reads) {
        for (std::int64_t k = 0; k < read.count;) {
          if (cancelled() || emitted >= batches) return;
          const auto room = static_cast<std::int64_t>(batch_size) - batch.size;
          const std::int64_t n = std::min(read.count - k, room);
          shards[read.shard].read_images(read.first + k, n,
                                         batch.images.data() + static_cast<std::size_t>(batch.size) * tile_bytes);
          for (std::int64_t t = 0; t < n; ++t) {
            if (!emit(nullptr, read.shard, read.first + k + t)) return;
          }
          k += n;
        }
      }
      push_partial();
      return;
    }

    // The shuffle buffer: up to `capacity` slots (only as many as this rank's part needs are allocated).
    const auto needed =
        static_cast<std::size_t>(std::min<std::int64_t>(static_cast<std::int64_t>(capacity), part_size));
    if (slot_count < needed) {
      slots.reset();
      slots = std::make_unique_for_overwrite<std::uint8_t[]>(needed * tile_bytes);
      slot_count = needed;
      slot_tiles.assign(needed, {0, 0});
      slot_run.assign(needed, 0);
    }
    auto slot = [&](std::size_t j) { return slots.get() + j * tile_bytes; };
    std::size_t used = 0;
    std::uint32_t run = 0;
    std::fill(slot_run.begin(), slot_run.end(), 0U);
    std::vector<std::uint8_t*> destinations;
    for (const Block& read : reads) {
      if (cancelled()) return;
      const ShardFile& shard = shards[read.shard];
      std::int64_t k = 0;
      if (used < capacity) {
        // Filling: the block's tiles go to the next free slots, in one read.
        const std::int64_t n = std::min(read.count, static_cast<std::int64_t>(capacity - used));
        shard.read_images(read.first, n, slot(used));
        for (std::int64_t t = 0; t < n; ++t) {
          slot_tiles[used + static_cast<std::size_t>(t)] = {read.shard, read.first + t};
        }
        used += static_cast<std::size_t>(n);
        k = n;
      }
      // Full: each incoming tile draws a slot whose tile leaves for the batch, and takes its place. A run of incoming
      // tiles that drew distinct slots is read in one preadv straight into those slots, after their tiles left; a
      // slot drawn twice ends the run (its second draw is kept for the next run), so the batches are exactly those
      // of the tile-by-tile algorithm.
      std::optional<std::size_t> held;
      while (k < read.count) {
        if (++run == 0) {  // wrapped: forget every earlier run
          std::fill(slot_run.begin(), slot_run.end(), 0U);
          run = 1;
        }
        destinations.clear();
        while (k + static_cast<std::int64_t>(destinations.size()) < read.count) {
          const std::size_t j = held ? *held : static_cast<std::size_t>(uniform_below(rng, capacity));
          held.reset();
          if (slot_run[j] == run) {
            held = j;
            break;
          }
          slot_run[j] = run;
          if (!emit(slot(j), slot_tiles[j].first, slot_tiles[j].second)) return;
          slot_tiles[j] = {read.shard, read.first + k + static_cast<std::int64_t>(destinations.size())};
          destinations.push_back(slot(j));
        }
        shard.read_images(read.first + k, destinations);
        k += static_cast<std::int64_t>(destinations.size());
      }
    }
    // Drain: a random remaining tile leaves, the last one takes its place (by slot index, the pixels stay put).
    std::vector<std::uint32_t> where(used);
    std::iota(where.begin(), where.end(), 0U);
    while (used > 0) {
      const auto j = static_cast<std::size_t>(uniform_below(rng, used));
      const std::size_t s = where[j];
      if (!emit(slot(s), slot_tiles[s].first, slot_tiles[s].second)) return;
      --used;
      where[j] = where[used];
    }
    push_partial();
  }

  void run(std::vector<Block> reads, std::uint64_t buffer_seed) {
    try {
      produce(reads, buffer_seed);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      producer_done = true;
    }
    not_empty.notify_all();
  }
};

ShardDataset::ShardDataset(const std::string& folder, const ShardDatasetOptions& options)
    : impl_(std::make_unique<Impl>()) {
  auto& impl = *impl_;
  if (options.batch_size < 1) throw core::InternalError("ShardDataset: batch_size must be at least 1");
  if (options.block_size < 1) throw core::InternalError("ShardDataset: block_size must be at least 1");
  if (options.shuffle_buffer < 0) throw core::InternalError("ShardDataset: shuffle_buffer must not be negative");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw core::InternalError("ShardDataset: rank " + std::to_string(options.rank) + " outside world size " +
                              std::to_string(options.world_size));
  }
  impl.options = options;

  const std::filesystem::path root(folder);
  const std::string manifest_path = (root / "manifest.json").string();
  impl.manifest = read_manifest(manifest_path);
  impl.tile_size = impl.manifest.attributes.tile_size;
  double mpp = impl.manifest.attributes.mpp;
  std::string reference = manifest_path;
  for (const auto& entry : impl.manifest.shards) {
    const std::string path = (root / entry.file).string();
    ShardFile shard = ShardFile::open(path);
    if (shard.tile_size() != impl.tile_size) {
      throw core::InputError("tile size " + std::to_string(shard.tile_size()) + " differs from " +
                                 std::to_string(impl.tile_size) + " in '" + reference + "'",
                             path);
    }
    if (!same_mpp(shard.attributes().mpp, mpp)) {
      throw core::InputError("mpp " + std::to_string(shard.attributes().mpp) + " differs from " + std::to_string(mpp) +
                                 " in '" + reference + "'",
                             path);
    }
    if (shard.size() != entry.tiles) {
      throw core::InputError("the manifest lists " + std::to_string(entry.tiles) + " tiles for this shard, it holds " +
                                 std::to_string(shard.size()),
                             path);
    }
    check_class_counts(entry, shard, path, manifest_path);
    if (impl.shards.empty()) reference = path;
    impl.shards.push_back(std::move(shard));
  }
  check_slide_counts(impl.manifest, impl.shards, manifest_path);
  impl.tile_bytes = static_cast<std::size_t>(impl.tile_size) * static_cast<std::size_t>(impl.tile_size) * 3;

  const auto block_size = static_cast<std::int64_t>(options.block_size);
  for (std::uint32_t s = 0; s < impl.shards.size(); ++s) {
    const ShardFile& shard = impl.shards[s];
    std::vector<bool> selected(shard.slides().size(), true);
    if (!options.slides.empty()) {
      for (std::size_t k = 0; k < selected.size(); ++k) selected[k] = options.slides.contains(shard.slides()[k]);
    }
    const auto& slide_of = shard.slide_indices();
    const auto& artefacts = shard.artefacts();  // zeros without the dataset
    const auto left_out = [&](std::int64_t i) {
      return options.exclude_artefacts && (artefacts[static_cast<std::size_t>(i)] & kShardArtefactExcluded) != 0;
    };
    for (std::int64_t i = 0; i < shard.size();) {
      if (left_out(i)) {
        ++i;
        continue;
      }
      const std::uint32_t slide = slide_of[static_cast<std::size_t>(i)];
      std::int64_t end = i + 1;
      while (end < shard.size() && end - i < block_size && slide_of[static_cast<std::size_t>(end)] == slide &&
             !left_out(end)) {
        ++end;
      }
      if (selected[slide]) {
        impl.blocks.push_back({s, i, end - i});
        impl.total += end - i;
      }
      i = end;
    }
  }

  const auto world = static_cast<std::int64_t>(options.world_size);
  const auto rank = static_cast<std::int64_t>(options.rank);
  const std::int64_t smallest_part = impl.total / world;
  if (options.shuffle) {
    impl.part_begin = rank * smallest_part;
    impl.part_size = smallest_part;
  } else {
    impl.part_begin = rank * impl.total / world;
    impl.part_size = (rank + 1) * impl.total / world - impl.part_begin;
  }
  const auto batch = static_cast<std::int64_t>(options.batch_size);
  impl.batches = options.drop_last ? smallest_part / batch : (impl.part_size + batch - 1) / batch;
}

ShardDataset::~ShardDataset() {
  if (impl_) impl_->stop();
}

const Manifest& ShardDataset::manifest() const { return impl_->manifest; }
int ShardDataset::tile_size() const { return impl_->tile_size; }
std::int64_t ShardDataset::total_tiles() const { return impl_->total; }
std::int64_t ShardDataset::tiles_per_rank() const { return impl_->part_size; }
std::int64_t ShardDataset::batches_per_epoch() const { return impl_->batches; }

void ShardDataset::start_epoch(std::int64_t epoch) {
  auto& impl = *impl_;
  impl.stop();
  std::vector<Block> reads = impl.plan(epoch);
  const std::uint64_t buffer_seed =
      stream_seed(impl.options.seed, epoch, 1 + static_cast<std::uint64_t>(impl.options.rank));
  impl.started = true;
  impl.worker = std::thread(
      [&impl, reads = std::move(reads), buffer_seed]() mutable { impl.run(std::move(reads), buffer_seed); });
}

bool ShardDataset::next(Batch& batch) {
  auto& impl = *impl_;
  if (!impl.started) throw core::InternalError("ShardDataset: next() before start_epoch()");
  std::unique_lock<std::mutex> lock(impl.mutex);
  impl.not_empty.wait(lock, [&] { return !impl.queue.empty() || impl.producer_done; });
  if (!impl.queue.empty()) {
    // The caller's previous batch goes back to the worker for reuse.
    std::swap(batch, impl.queue.front());
    if (impl.spare.size() < impl.spare_limit()) impl.spare.push_back(std::move(impl.queue.front()));
    impl.queue.pop_front();
    lock.unlock();
    impl.not_full.notify_one();
    return true;
  }
  // Batches read before a failure are delivered first; then the failure, on every call until start_epoch.
  if (impl.error) std::rethrow_exception(impl.error);
  return false;
}

}  // namespace tessera::io
