#include "core/progress.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/comm.h"

namespace tessera::core {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

constexpr int bar_width = 30;
// Each rank pushes its count to rank 0 at most this often (one MPI_Accumulate under a shared lock).
constexpr Seconds publish_interval{0.5};
// A terminal line is redrawn at most ~10 times per second.
constexpr Seconds redraw_interval{0.1};
constexpr int seconds_per_minute = 60;
constexpr int seconds_per_hour = 3600;

// "MM:SS", or "H:MM:SS" from one hour on; "--:--" when unknown.
std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto whole = static_cast<std::int64_t>(std::llround(seconds));
  const std::int64_t hours = whole / seconds_per_hour;
  const std::int64_t minutes = whole % seconds_per_hour / seconds_per_minute;
  const std::int64_t secs = whole % seconds_per_minute;
  if (hours > 0) return fmt::format("{}:{:02}:{:02}", hours, minutes, secs);
  return fmt::format("{:02}:{:02}", minutes, secs);
}

std::string make_bar(std::int64_t done, std::int64_t total) {
  const double fraction = std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const int filled = static_cast<int>(fraction * bar_width);
  std::string bar = "[";
  if (filled >= bar_width) {
    bar.append(bar_width, '=');
  } else {
    bar.append(static_cast<std::size_t>(filled), '=');
    bar += '>';
    bar.append(static_cast<std::size_t>(bar_width - filled - 1), ' ');
  }
  return bar + "]";
}

}  // namespace

std::string render_progress_line(const std::string& label, const std::string& unit, std::int64_t total,
                                 std::int64_t done, double elapsed_seconds, bool bar, bool final_line) {
  const double elapsed = std::isfinite(elapsed_seconds) && elapsed_seconds > 0 ? elapsed_seconds : 0.0;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;

  std::string line = label;
  if (!line.empty()) line += ' ';
  if (total > 0) {
    if (bar) {
      // The count is right-aligned to the width of the total so the line does not jitter while redrawn.
      const auto width = std::to_string(total).size();
      line += fmt::format("{}  {:>{}}/{} {}", make_bar(done, total), done, width, total, unit);
    } else {
      const double percent = 100.0 * static_cast<double>(done) / static_cast<double>(total);
      line += fmt::format("{}/{} {} ({:.1f}%)", done, total, unit, percent);
    }
  } else {
    line += fmt::format("{} {}", done, unit);
  }
  line += fmt::format("  {:.1f} {}/s", rate, unit);
  if (final_line) {
    line += "  elapsed " + format_duration(elapsed);
  } else if (total > 0) {
    const auto remaining = static_cast<double>(std::max<std::int64_t>(0, total - done));
    line += "  ETA " + format_duration(remaining == 0 ? 0.0 : rate > 0 ? remaining / rate : -1.0);
  }
  return line;
}

Progress::Progress(const Comm& comm, std::int64_t total, ProgressOptions options)
    : comm_(comm), total_(std::max<std::int64_t>(0, total)), options_(std::move(options)) {
  terminal_ = options_.force_terminal == 1 || (options_.force_terminal < 0 && isatty(STDERR_FILENO) == 1);

  // One int64 per rank keeps the window symmetric; only rank 0's counter is used.
  window_ = std::make_unique<Window>(comm_, sizeof(std::int64_t), static_cast<int>(sizeof(std::int64_t)));
  window_->lock(comm_.rank(), true);
  *static_cast<std::int64_t*>(window_->local()) = 0;  // local store inside an exclusive epoch on our own window
  window_->unlock(comm_.rank());
  comm_.barrier();  // no rank accumulates into rank 0 before its counter is zeroed

  start_ = last_publish_ = last_draw_ = Clock::now();
  if (comm_.is_root() && terminal_) {
    const std::string line = render_line(0, 0.0, true);
    std::fprintf(stderr, "\r%s", line.c_str());
    std::fflush(stderr);
    last_line_length_ = line.size();
  }
}

Progress::~Progress() {
  // An unfinished terminal line must not be continued by whatever is printed next.
  if (comm_.is_root() && terminal_ && !finished_ && last_line_length_ > 0) {
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  // window_ is freed by ~Window (collective).
}

void Progress::advance(std::int64_t n) {
  if (finished_) return;
  local_done_ += n;
  publish(false);
  if (comm_.is_root()) draw(false);
}

std::int64_t Progress::finish() {
  if (finished_) return final_total_;
  publish(true);
  // Every rank's unlock above completed its accumulate at rank 0, so after the barrier the count is whole.
  comm_.barrier();
  if (comm_.is_root()) draw(true);  // sets final_total_
  comm_.broadcast(&final_total_, sizeof final_total_, 0);
  finished_ = true;
  return final_total_;
}

std::string Progress::render_line(std::int64_t done, double elapsed_seconds, bool bar) const {
  return render_progress_line(options_.label, options_.unit, total_, done, elapsed_seconds, bar);
}

void Progress::publish(bool force) {
  std::int64_t delta = local_done_ - local_published_;
  if (delta == 0) return;
  const auto now = Clock::now();
  if (!force && now - last_publish_ < publish_interval) return;
  window_->lock(0, false);
  window_->accumulate_sum(&delta, 1, 0, 0);
  window_->unlock(0);
  local_published_ = local_done_;
  last_publish_ = now;
}

void Progress::draw(bool final_line) {
  const auto now = Clock::now();
  if (!final_line) {
    const Seconds interval = terminal_ ? redraw_interval : Seconds(options_.interval_seconds);
    if (now - last_draw_ < interval) return;
  }
  last_draw_ = now;

  // Rank 0 adds its own unpublished count and reads the job-wide total in one atomic operation.
  std::int64_t delta = local_done_ - local_published_;
  window_->lock(0, false);
  const std::int64_t done = window_->fetch_add(delta, 0, 0) + delta;
  window_->unlock(0);
  local_published_ = local_done_;
  last_publish_ = now;
  if (final_line) final_total_ = done;

  const double elapsed = Seconds(now - start_).count();
  const std::string line =
      render_progress_line(options_.label, options_.unit, total_, done, elapsed, terminal_, final_line);
  if (terminal_) {
    // '\r' returns to the start of the line; spaces wipe what is left of a longer previous line.
    const std::size_t pad = last_line_length_ > line.size() ? last_line_length_ - line.size() : 0;
    std::fprintf(stderr, "\r%s%s%s", line.c_str(), std::string(pad, ' ').c_str(), final_line ? "\n" : "");
    std::fflush(stderr);
    last_line_length_ = final_line ? 0 : line.size();
  } else {
    spdlog::info("{}", line);
  }
}

}  // namespace tessera::core
