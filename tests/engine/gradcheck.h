// Gradient checking by central differences, for the engine's tests.
//
// A layer's backward is checked through a scalar loss of its output, L = Σ dst ⊙ r with fixed random weights r,
// so dL/d(dst) = r. For each checked input element x_i:
//
//   numeric_i  = (L(x + h·e_i) − L(x − h·e_i)) / 2h
//   analytic_i = what backward returned
//   pass when |numeric_i − analytic_i| <= abs_tol + rel_tol · max(|numeric_i|, |analytic_i|)
//
// Points near a kink (ReLU at 0 in any output the point feeds, a max-pool tie) are skipped: there the one-sided
// slopes (L(x+h) − L(x)) / h and (L(x) − L(x−h)) / h disagree. A kink inside [x−h, x+h] moves the central
// difference by half that disagreement, so a point is skipped when the slopes differ by more than the
// tolerance; a kink that slips through then costs at most half the tolerance. The check needs no knowledge of
// the layer (`skip` can add points the caller knows to be kinks). Smooth points are almost never skipped: their
// one-sided slopes differ by about h·|L''|.
//
//   auto x = gradcheck::random_vector(n, 1);
//   auto r = gradcheck::random_vector(m, 2);
//   auto loss = [&] { return gradcheck::weighted_sum(forward(x), r); };
//   auto report = gradcheck::check(x, analytic_dx, loss);
//   EXPECT_TRUE(report.ok()) << report.summary();
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::engine::gradcheck {

// Uniform values in [lo, hi) from a fixed seed (std::mt19937, so every platform draws the same numbers).
inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    // Built from the raw 32-bit draw rather than std::uniform_real_distribution, whose output is
    // implementation-defined.
    const double u = static_cast<double>(gen()) / 4294967296.0;
    x = static_cast<float>(lo + (hi - lo) * u);
  }
  return v;
}

// Σ a_i · b_i in double: the scalar loss whose gradient with respect to `a` is `b`.
inline double weighted_sum(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

struct Options {
  double step = 1e-3;     // h: small enough to meet few kinks, large enough that float32 rounding of L stays small
  double rel_tol = 1e-2;  // relative tolerance
  double abs_tol = 1e-3;  // absolute tolerance (for gradients near zero)
  std::size_t max_points = 400;                     // at most this many elements, evenly strided over x, are checked
  std::function<bool(std::size_t)> skip = nullptr;  // optional: elements the caller knows not to check
};

struct Report {
  std::size_t checked = 0;
  std::size_t skipped = 0;  // kinks and caller-skipped points
  std::size_t failed = 0;
  double worst_error = 0.0;  // largest |numeric − analytic| / (abs_tol + rel_tol·max(|n|, |a|)); < 1 passes
  std::string first_failures;

  // Passes when nothing failed and most points could be checked (a test where every point is skipped would
  // check nothing).
  bool ok() const { return failed == 0 && checked > 0 && checked >= skipped; }
  std::string summary() const {
    std::ostringstream s;
    s << "checked " << checked << ", skipped " << skipped << ", failed " << failed << ", worst error/tolerance "
      << worst_error << "\n"
      << first_failures;
    return s.str();
  }
};

// Checks `analytic` (dL/dx) against central differences of `loss` over x. `loss` must compute L from the
// current contents of `x`; x is perturbed in place and restored.
inline Report check(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss,
                    const Options& options = {}) {
  Report report;
  if (analytic.size() != x.size()) {
    report.failed = 1;
    report.first_failures = "analytic gradient has " + std::to_string(analytic.size()) + " elements, x has " +
                            std::to_string(x.size()) + "\n";
    return report;
  }
  const std::size_t stride = std::max<std::size_t>(1, x.size() / std::max<std::size_t>(1, options.max_points));
  const double l0 = loss();
  constexpr int max_listed = 8;
  int listed = 0;
  for (std::size_t i = 0; i < x.size(); i += stride) {
    if (options.skip && options.skip(i)) {
      ++report.skipped;
      continue;
    }
    const float original = x[i];
    // The actual perturbation after rounding to float, so the difference quotient divides by what was applied.
    const float up = static_cast<float>(original + options.step);
    const float down = static_cast<float>(original - options.step);
    x[i] = up;
    const double lp = loss();
    x[i] = down;
    const double lm = loss();
    x[i] = original;
    const double hp = static_cast<double>(up) - original;
    const double hm = static_cast<double>(original) - down;
    const double right = (lp - l0) / hp;
    const double left = (l0 - lm) / hm;
    const double numeric = (lp - lm) / (hp + hm);
    const double a = analytic[i];
    const double tolerance = options.abs_tol + options.rel_tol * std::max(std::abs(numeric), std::abs(a));
    if (std::abs(right - left) > tolerance) {
      ++report.skipped;
      continue;
    }
    const double error = std::abs(numeric - a) / tolerance;
    report.worst_error = std::max(report.worst_error, error);
    ++report.checked;
    if (error > 1.0) {
      ++report.failed;
      if (listed++ < max_listed) {
        std::ostringstream s;
        s << "  x[" << i << "]: numeric " << numeric << ", analytic " << a << "\n";
        report.first_failures += s.str();
      }
    }
  }
  return report;
}

}  // namespace tessera::engine::gradcheck
