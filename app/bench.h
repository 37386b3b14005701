// Benchmarks behind `tessera bench` that need more than a few lines.
#pragma once

#include <string>

namespace tessera::app {

struct TileBenchOptions {
  int slides = 4;
  int size = 8192;  // level-0 side of each synthetic slide
  int tile_size = 96;
  double mpp = 1.0;
  std::string workdir = "data/bench-tile";
};

int run_bench_tile(const TileBenchOptions& options);

}  // namespace tessera::app
