// A bounded in-memory cache of encoded tiles (the viewer's JPEG and PNG tiles), least recently used first out.
// The bound is on the bytes of the tiles held (plus their keys); a tile larger than the whole bound is not kept.
// Thread-safe: the server's worker threads share one cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace tessera::viewer {

// One encoded tile and its entity tag (a hash of the bytes, quoted as HTTP wants it).
struct EncodedTile {
  std::string bytes;
  std::string etag;
};

class TileCache {
 public:
  explicit TileCache(std::size_t capacity_bytes);

  // The tile under `key`, marked as the most recently used; null when absent.
  std::shared_ptr<const EncodedTile> get(const std::string& key);
  void put(const std::string& key, std::shared_ptr<const EncodedTile> tile);

  struct Stats {
    std::uint64_t hits = 0, misses = 0, evictions = 0;
    std::size_t bytes = 0, tiles = 0, capacity = 0;
  };
  Stats stats() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const EncodedTile>>;
  static std::size_t cost(const Entry& entry);
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // front = most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::size_t bytes_ = 0;
  std::uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

// `"<16 hex digits>"`: FNV-1a of the bytes.
std::string entity_tag(const std::string& bytes);

}  // namespace tessera::viewer
