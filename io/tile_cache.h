// The decoded-tile cache shared by the direct tile readers (io/tiff_reader.h, io/dicom_slide.h): decoded tiles,
// least recently used first out once their bytes pass the capacity. cv::Mat shares its pixels by reference count,
// so a tile handed out stays valid after eviction. Thread-safe; two threads that miss the same tile both decode it
// (same pixels), which is cheaper than holding a lock across a decode.
#pragma once

#include <cstddef>
#include <cstdint>
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

  std::optional<cv::Mat> find(std::uint64_t key) {
    const std::lock_guard lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, it->second);
    return it->second->second;
  }

  void insert(std::uint64_t key, const cv::Mat& tile) {
    const std::size_t bytes = tile.total() * tile.elemSize();
    if (bytes > capacity_) return;
    const std::lock_guard lock(mutex_);
    if (index_.count(key) != 0) return;  // another thread decoded it meanwhile
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

 private:
  using Entries = std::list<std::pair<std::uint64_t, cv::Mat>>;
  std::mutex mutex_;
  std::size_t capacity_;
  std::size_t bytes_ = 0;
  Entries entries_;
  std::unordered_map<std::uint64_t, Entries::iterator> index_;
};

}  // namespace tessera::io
