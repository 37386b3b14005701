// The decoded-tile cache shared by the direct tile readers (io/tiff_reader.h, io/dicom_slide.h): decoded tiles,
// least recently used first out once their bytes pass the capacity. cv::Mat shares its pixels by reference count,
// so a tile handed out stays valid after eviction. Thread-safe, and no lock is held across a decode: a thread that
// needs a tile another thread is decoding waits for that decode instead of decoding the tile again (threads reading
// neighbouring regions need the same tiles at the same time); when that decode fails, the waiting thread decodes
// the tile itself, so that every thread sees only its own decode's errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include <opencv2/core.hpp>

namespace tessera::io {

class TileCache {
 public:
  explicit TileCache(std::size_t capacity) : capacity_(capacity) {}

  // A key from two 32-bit parts (level or image, tile or frame index).
  static std::uint64_t key(std::uint32_t high, std::uint32_t low) {
    return (static_cast<std::uint64_t>(high) << 32) | static_cast<std::uint64_t>(low);
  }

  std::size_t bytes() {
    const std::lock_guard lock(mutex_);
    return bytes_;
  }

  // Threads waiting now for another thread's decode of `key` (for tests).
  std::size_t waiting(std::uint64_t key) {
    const std::lock_guard lock(mutex_);
    const auto it = decoding_.find(key);
    return it == decoding_.end() ? 0 : it->second.waiters;
  }

  // The tile of `key`: the cached one, else the one `decode()` returns (kept in the cache), else, while another
  // thread decodes it, that thread's result. What `decode` throws is thrown (and nothing is kept).
  template <typename Decode>
  cv::Mat get(std::uint64_t key, Decode&& decode) {
    std::shared_future<cv::Mat> pending;
    std::optional<std::promise<cv::Mat>> promise;  // this thread's decode's, made only on a miss
    {
      const std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        entries_.splice(entries_.begin(), entries_, it->second);
        return it->second->second;
      }
      if (auto it = decoding_.find(key); it != decoding_.end()) {
        pending = it->second.result;
        ++it->second.waiters;
      } else {
        promise.emplace();
        decoding_.emplace(key, Decoding{promise->get_future().share(), 0});
      }
    }
    if (pending.valid()) {
      cv::Mat tile = pending.get();
      return tile.empty() ? decode() : tile;  // that decode failed: this thread's own decode says why
    }
    // However this ends (decode or insert throwing included), the entry goes and the waiters are answered: with
    // the tile, else with an empty one, and then they decode it themselves.
    Finishing finishing{*this, key, *promise};
    cv::Mat tile = decode();
    insert(key, tile);
    finishing.finish(tile);
    return tile;
  }

 private:
  using Entries = std::list<std::pair<std::uint64_t, cv::Mat>>;
  struct Decoding {
    std::shared_future<cv::Mat> result;  // empty when the decode failed
    std::size_t waiters = 0;
  };

  void insert(std::uint64_t key, const cv::Mat& tile) {
    const std::size_t bytes = tile.total() * tile.elemSize();
    if (bytes > capacity_) return;
    const std::lock_guard lock(mutex_);
    if (index_.count(key) != 0) return;
    entries_.emplace_front(key, tile);
    index_[key] = entries_.begin();
    bytes_ += bytes;
    while (bytes_ > capacity_) {
      const auto& [old_key, old_tile] = entries_.back();
      bytes_ -= old_tile.total() * old_tile.elemSize();
      index_.erase(old_key);
      entries_.pop_back();
    }
  }

  // This thread's decode of `key`: finish() ends it with the tile; else, when it goes out of scope, it ends with
  // an empty one (the decode failed). The threads waiting for it get that.
  struct Finishing {
    TileCache& cache;
    std::uint64_t key;
    std::promise<cv::Mat>& promise;
    bool finished = false;
    void finish(const cv::Mat& tile) {
      {
        const std::lock_guard lock(cache.mutex_);
        cache.decoding_.erase(key);
      }
      finished = true;
      promise.set_value(tile);
    }
    ~Finishing() {
      if (!finished) finish(cv::Mat());
    }
  };

  std::mutex mutex_;
  std::size_t capacity_;
  std::size_t bytes_ = 0;
  Entries entries_;
  std::unordered_map<std::uint64_t, Entries::iterator> index_;
  std::unordered_map<std::uint64_t, Decoding> decoding_;  // tiles a thread is decoding now
};

}  // namespace tessera::io
