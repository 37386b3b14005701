// Helpers for the engine's layer tests: tensors from plain values, and closeness checks with useful messages.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace tessera::engine::testing {

// A tensor with `dims` in layout `tag` holding the NCHW-ordered `values`.
inline Tensor make_tensor(const dims_t& dims, const std::vector<float>& values,
                          dnnl::memory::format_tag tag = dnnl::memory::format_tag::undef) {
  const dnnl::memory::desc desc = tag == dnnl::memory::format_tag::undef
                                      ? plain_desc(dims)
                                      : dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag);
  Tensor t(desc);
  t.from_plain(values);
  return t;
}

// Passes when |actual − expected| <= tol · (1 + |expected|) everywhere; names the worst element otherwise.
inline ::testing::AssertionResult all_near(const std::vector<float>& actual, const std::vector<float>& expected,
                                           double tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]) / (1.0 + std::abs(expected[i]));
    if (!(err <= worst) || std::isnan(err)) {
      worst = std::isnan(err) ? INFINITY : err;
      worst_i = i;
    }
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << ": " << actual[worst_i] << " vs expected "
                                       << expected[worst_i] << " (relative error " << worst << " > " << tol << ")";
}

}  // namespace tessera::engine::testing
