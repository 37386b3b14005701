// The machine's measured compute peak: a large single-precision matrix product through oneDNN's sgemm.
// Benchmarks report achieved GFLOP/s as a fraction of this figure, measured in the same run (this machine
// is shared and noisy, so absolute numbers from another run are not comparable).
#pragma once

namespace tessera::bench {

struct PeakResult {
  int threads = 0;
  int n = 0;             // C[n×n] = A[n×n] · B[n×n]
  int repeats = 0;       // timed products
  double seconds = 0.0;  // best single product
  double gflops = 0.0;   // 2n³ / best time
};

// Runs sgemm of size n with `threads` OpenMP threads (0 = all cores) at least once after a warm-up, and for
// at least `min_seconds` in total; reports the best repetition. Throws InternalError if oneDNN fails.
PeakResult measure_sgemm_peak(int n, int threads, double min_seconds);

// Threads oneDNN will use by default (OpenMP's maximum for this process).
int default_threads();

}  // namespace tessera::bench
