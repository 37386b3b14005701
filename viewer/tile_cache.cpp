#include "viewer/tile_cache.h"

#include <fmt/format.h>

#include "core/hash.h"

namespace tessera::viewer {

TileCache::TileCache(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}

std::size_t TileCache::cost(const Entry& entry) {
  // The key is held twice (list and index); the rest is a fixed bookkeeping allowance.
  constexpr std::size_t kOverhead = 128;
  return entry.second->bytes.size() + entry.second->etag.size() + 2 * entry.first.size() + kOverhead;
}

std::shared_ptr<const EncodedTile> TileCache::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

void TileCache::put(const std::string& key, std::shared_ptr<const EncodedTile> tile) {
  Entry entry{key, std::move(tile)};
  const std::size_t size = cost(entry);
  if (size > capacity_) return;
  std::lock_guard lock(mutex_);
  if (const auto it = index_.find(key); it != index_.end()) {
    // Another thread made the same tile meanwhile: keep one.
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  while (bytes_ + size > capacity_ && !order_.empty()) {
    bytes_ -= cost(order_.back());
    index_.erase(order_.back().first);
    order_.pop_back();
    ++evictions_;
  }
  order_.push_front(std::move(entry));
  index_.emplace(order_.front().first, order_.begin());
  bytes_ += size;
}

TileCache::Stats TileCache::stats() const {
  std::lock_guard lock(mutex_);
  return {hits_, misses_, evictions_, bytes_, order_.size(), capacity_};
}

std::string entity_tag(const std::string& bytes) { return fmt::format("\"{:016x}\"", core::fnv1a(bytes)); }

}  // namespace tessera::viewer
