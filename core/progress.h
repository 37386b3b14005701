// Progress display for long work.
//
// On a terminal: one redrawn line "label [=====>    ] 1234/5000 tiles  312.4/s  ETA 00:12".
// Not on a terminal (logs, CI, Slurm): a log line every `interval` seconds and one at the end.
// Under MPI every rank calls advance() for its own work; the counts are summed into a one-sided window
// on rank 0 (MPI_Accumulate under a shared lock, at most a few times per second per rank), and only rank
// 0 draws, showing the job-wide total. finish() is collective.
//
// Construction and destruction are collective too (the window): every rank must create and destroy its
// Progress objects in the same order, and the Comm must outlive them. Rank 0 draws only from its own
// advance() calls and finish(), so a rank 0 with no work of its own shows the final line only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::core {

class Comm;
class Window;

struct ProgressOptions {
  std::string label;
  std::string unit = "items";
  double interval_seconds = 5.0;  // log-line interval when not on a terminal
  int force_terminal = -1;        // -1 detect (isatty(stderr)), 0 never draw a bar, 1 always
};

// Pure formatting of one progress line (no MPI; what Progress::render_line returns). `total` 0 = unknown:
// no bar, no ETA. `bar` draws "[=====>    ]" (terminal); without it the line shows a percentage instead.
// `final_line` replaces the ETA by the elapsed time.
//   bar:     "label [=====>      ]  1234/5000 tiles  312.4 tiles/s  ETA 00:12"
//   no bar:  "label 1234/5000 tiles (24.7%)  312.4 tiles/s  ETA 00:12"
//   unknown: "label 1234 tiles  312.4 tiles/s"
std::string render_progress_line(const std::string& label, const std::string& unit, std::int64_t total,
                                 std::int64_t done, double elapsed_seconds, bool bar, bool final_line = false);

class Progress {
 public:
  // `total` is the job-wide total (all ranks); 0 when unknown.
  Progress(const Comm& comm, std::int64_t total, ProgressOptions options);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // This rank finished `n` more items. Ignored after finish().
  void advance(std::int64_t n = 1);
  // Collective: flushes every rank's count, draws the final state on rank 0, returns the job-wide count
  // (on every rank). Calling it again returns the same count.
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
  std::int64_t final_total_ = 0;
  std::size_t last_line_length_ = 0;  // terminal: what the next '\r' redraw must overwrite
};

}  // namespace tessera::core
