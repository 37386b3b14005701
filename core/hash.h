// FNV-1a, 64 bits: a hash that is the same on every platform and library version (unlike std::hash), for the
// job hashes and records that decide whether a rerun may keep earlier work, and for checksums in tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::core {

inline constexpr std::uint64_t kFnv1aOffset = 1469598103934665603ULL;
inline constexpr std::uint64_t kFnv1aPrime = 1099511628211ULL;

// The hash of `bytes` bytes at `data`, continuing from `hash` (the offset basis starts a new one).
inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * kFnv1aPrime;
  return hash;
}

inline std::uint64_t fnv1a(std::string_view text) { return fnv1a(text.data(), text.size()); }

}  // namespace tessera::core
