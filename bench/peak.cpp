#include "bench/peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "core/error.h"

namespace tessera::bench {

int default_threads() { return omp_get_max_threads(); }

PeakResult measure_sgemm_peak(int n, int threads, double min_seconds) {
  if (n <= 0) throw core::InternalError("sgemm peak: matrix size must be positive, got " + std::to_string(n));
  const int previous = omp_get_max_threads();
  const int used = threads > 0 ? threads : previous;
  omp_set_num_threads(used);

  const auto elements = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  // Values in [0.5, 1.5) so nothing denormalizes; the content does not affect sgemm's speed otherwise.
  std::vector<float> a(elements), b(elements), c(elements, 0.0f);
  for (std::size_t i = 0; i < elements; ++i) {
    a[i] = 0.5f + static_cast<float>(i % 1013) / 1013.0f;
    b[i] = 0.5f + static_cast<float>(i % 977) / 977.0f;
  }
  auto run = [&] {
    const dnnl_status_t status = dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (status != dnnl_success) {
      throw core::InternalError("oneDNN sgemm failed with status " + std::to_string(static_cast<int>(status)));
    }
  };

  run();  // warm-up: page faults, thread pool start
  PeakResult result;
  result.threads = used;
  result.n = n;
  result.seconds = 1e30;
  const auto start = std::chrono::steady_clock::now();
  double total = 0.0;
  while (result.repeats < 2 || total < min_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.seconds = std::min(result.seconds, dt);
    ++result.repeats;
    total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  result.gflops = 2.0 * n * static_cast<double>(n) * n / result.seconds * 1e-9;
  omp_set_num_threads(previous);
  return result;
}

}  // namespace tessera::bench
