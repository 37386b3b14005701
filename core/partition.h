// Contiguous, balanced shares of a list over the ranks of a job: part r of `total` items is
// [part_begin(total, parts, r), part_begin(total, parts, r + 1)); the shares differ by at most one item and the
// remainder goes to the first parts. The tile job's extraction and slide inference's batches are split this way,
// so what each rank does depends only on the counts, never on timing.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera::core {

inline std::int64_t part_begin(std::int64_t total, int parts, int index) {
  const std::int64_t base = total / parts;
  const std::int64_t extra = total % parts;
  return index * base + std::min<std::int64_t>(index, extra);
}

}  // namespace tessera::core
