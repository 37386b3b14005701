// Progress display for long work.
//
// On a terminal: one redrawn line "label [=====>    ] 1234/5000 tiles  312.4/s  ETA 00:12".
// Not on a terminal (logs, CI, Slurm): a log line every `interval` seconds and one at the end.
// Under MPI every rank calls advance() for its own work; the counts are summed into a one-sided window
// on rank 0 (MPI_Accumulate under a shared lock, at most a few times per second per rank), and only rank
// 0 draws, showing the job-wide total. finish() is collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::io {

class Comm;
class Window;

struct ProgressOptions {
  std::string label;
  std::string unit = "items";
  double interval_seconds = 5.0;   // log-line interval when not on a terminal
  int force_terminal = -1;         // -1 detect (isatty(stderr)), 0 never draw a bar, 1 always
};

class Progress {
 public:
  // `total` is the job-wide total (all ranks); 0 when unknown.
  Progress(const Comm& comm, std::int64_t total, ProgressOptions options);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // This rank finished `n` more items.
  void advance(std::int64_t n = 1);
  // Collective: flushes every rank's count, draws the final state on rank 0, returns the job-wide count.
  std::int64_t finish();

  // The line that would be shown now (rank 0's view); exposed for tests.
  std::string render_line(std::int64_t done, double elapsed_seconds, bool bar) const;

 private:
  void publish(bool force);
  void draw(bool final_line);

  const Comm& comm_;
  std::int64_t total_;
  ProgressOptions options_;
  bool terminal_ = false;
  std::int64_t local_done_ = 0;
  std::int64_t local_published_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_publish_;
  std::chrono::steady_clock::time_point last_draw_;
  std::unique_ptr<Window> window_;
  bool finished_ = false;
};

}  // namespace tessera::io
