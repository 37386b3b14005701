// Small helpers every measurement and report shares: elapsed seconds on any clock, the median of repeated timings,
// and counts with thousands separators.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::core {

// Seconds from `start` to now on start's own clock (std::chrono::steady_clock, or core::MpiClock, whose time is
// simulated under SMPI).
template <typename TimePoint>
double seconds_since(TimePoint start) {
  return std::chrono::duration<double>(TimePoint::clock::now() - start).count();
}

// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// 11689512 → "11,689,512" (independent of the locale).
inline std::string grouped(std::int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace tessera::core
