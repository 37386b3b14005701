#include "engine/train_metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::engine {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;  // metrics.jsonl keeps its keys in the order written

namespace {

constexpr const char* kCsvHeader = "epoch,step,lr,train_loss,val_loss,val_accuracy,val_auc,seconds\n";

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }

// A figure as metrics.jsonl holds it: 6 significant digits, as metrics.csv, and null when not finite.
ordered_json metric(double v) { return ordered_json::parse(json_number(v)); }

void append_line(const fs::path& path, const std::string& line) {
  errno = 0;
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) {
    // iostreams need not set errno; when the system said nothing, say what is likely.
    const int reason = errno;
    throw core::InternalError("cannot append to '" + path.string() +
                              "': " + (reason != 0 ? std::strerror(reason) : "write failed (is the disk full?)"));
  }
}

// Keeps the lines whose step (`step_of`; nothing for a header line) is at most `step`. Rewritten atomically.
template <class StepOf>
void keep_lines_up_to(const fs::path& path, std::int64_t step, StepOf step_of) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const std::optional<std::int64_t> at = step_of(line);
    if (!at || *at <= step) kept += line + '\n';
  }
  in.close();
  core::write_file_atomic(path.string(), kept);
}

}  // namespace

StepTiming step_timing(const core::Comm& comm, std::chrono::steady_clock::duration elapsed, std::int64_t steps,
                       const CommStats& comm_stats) {
  // Every rank fills its own four slots; a sum gathers them (adding zeros is exact).
  constexpr std::size_t kFigures = 4;
  std::vector<double> all(kFigures * static_cast<std::size_t>(comm.size()), 0.0);
  double* mine = all.data() + kFigures * static_cast<std::size_t>(comm.rank());
  mine[0] = std::chrono::duration<double>(elapsed).count();
  mine[1] = comm_stats.seconds;
  mine[2] = comm_stats.wait_seconds;
  mine[3] = static_cast<double>(comm_stats.bytes);
  comm.allreduce(all.data(), all.size(), core::ReduceOp::sum);
  StepTiming t;
  t.steps = steps;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    const double* f = all.data() + kFigures * r;
    t.ranks.push_back({f[0], f[1], f[2], f[3]});
    t.mean.seconds += f[0];
    t.mean.comm_seconds += f[1];
    t.mean.wait_seconds += f[2];
    t.mean.comm_bytes += f[3];
  }
  const double ranks = comm.size();
  t.mean = {t.mean.seconds / ranks, t.mean.comm_seconds / ranks, t.mean.wait_seconds / ranks,
            t.mean.comm_bytes / ranks};
  return t;
}

MetricsLog::MetricsLog(fs::path folder, std::int64_t step)
    : jsonl_(folder / "metrics.jsonl"), csv_(folder / "metrics.csv") {
  if (step == 0) {
    core::write_file_atomic(csv_.string(), kCsvHeader);
    core::write_file_atomic(jsonl_.string(), "");
    return;
  }
  keep_lines_up_to(jsonl_, step, [](const std::string& line) -> std::optional<std::int64_t> {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return std::nullopt;
    return record["step"].get<std::int64_t>();
  });
  keep_lines_up_to(csv_, step, [](const std::string& line) -> std::optional<std::int64_t> {
    const auto comma = line.find(',');
    if (comma == std::string::npos || line.compare(0, 6, "epoch,") == 0) return std::nullopt;
    return std::strtoll(line.c_str() + comma + 1, nullptr, 10);
  });
}

void MetricsLog::slurm(std::int64_t step, const io::SlurmJob& job) const {
  append_line(jsonl_, ordered_json{{"kind", "slurm"},
                                   {"step", step},
                                   {"job_id", job.job_id},
                                   {"array_job_id", job.array_job_id},
                                   {"array_task_id", job.array_task_id},
                                   {"nodelist", job.nodelist},
                                   {"ntasks", job.ntasks},
                                   {"restarts", job.restarts}}
                          .dump());
}

void MetricsLog::train(std::int64_t epoch, std::int64_t step, double lr, double loss, double images_per_second) const {
  append_line(jsonl_, ordered_json{{"kind", "train"},
                                   {"epoch", epoch},
                                   {"step", step},
                                   {"lr", metric(lr)},
                                   {"loss", metric(loss)},
                                   {"images_per_s", metric(images_per_second)}}
                          .dump());
}

void MetricsLog::epoch(const StepTiming& t, const EpochMetrics& m) const {
  // Per step: seconds in total, in computation (everything but the strategy's collectives: data, forward,
  // backward, update), in communication and in waiting for other ranks; the fractions of the step time
  // communicating and waiting; the payload bytes a rank sent.
  const double n = static_cast<double>(std::max<std::int64_t>(t.steps, 1));
  const RankTiming& mean = t.mean;
  const double total = std::max(mean.seconds, 1e-12);
  ordered_json ranks = ordered_json::array();
  for (const RankTiming& r : t.ranks) {
    ranks.push_back({{"step_s", metric(r.seconds / n)},
                     {"compute_s", metric((r.seconds - r.comm_seconds - r.wait_seconds) / n)},
                     {"comm_s", metric(r.comm_seconds / n)},
                     {"wait_s", metric(r.wait_seconds / n)},
                     {"comm_bytes_per_step", metric(r.comm_bytes / n)}});
  }
  append_line(jsonl_, ordered_json{{"kind", "timing"},
                                   {"epoch", m.epoch},
                                   {"step", m.step},
                                   {"steps", t.steps},
                                   {"step_s", metric(mean.seconds / n)},
                                   {"compute_s", metric((mean.seconds - mean.comm_seconds - mean.wait_seconds) / n)},
                                   {"comm_s", metric(mean.comm_seconds / n)},
                                   {"wait_s", metric(mean.wait_seconds / n)},
                                   {"comm_fraction", metric(mean.comm_seconds / total)},
                                   {"wait_fraction", metric(mean.wait_seconds / total)},
                                   {"comm_bytes_per_step", metric(mean.comm_bytes / n)},
                                   {"images_per_s", metric(static_cast<double>(t.steps * m.global_batch) / total)},
                                   {"ranks", ranks}}
                          .dump());
  append_line(jsonl_, ordered_json{{"kind", "val"},
                                   {"epoch", m.epoch},
                                   {"step", m.step},
                                   {"loss", metric(m.val_loss)},
                                   {"accuracy", metric(m.val_accuracy)},
                                   {"auc", metric(m.val_auc)},
                                   {"tiles", m.val_tiles}}
                          .dump());
  append_line(csv_,
              fmt::format("{},{},{},{},{},{},{},{:.1f}", m.epoch, m.step, json_number(m.lr), json_number(m.train_loss),
                          json_number(m.val_loss), json_number(m.val_accuracy), json_number(m.val_auc), m.seconds));
}

}  // namespace tessera::engine
