// `tessera bench view`: the viewer's tile latency and throughput on loopback, and the server's peak memory.
//
// A synthetic slide (tessera synth, default 16384² px) gets a heatmap (P high inside its tumour annotations, low
// elsewhere) written by infer's own writers; `tessera view` serves that folder as a child process (so its memory
// is its own), and client threads of this process request every tile of every DeepZoom level of the slide, then of
// the heatmap, each list shuffled (a pan-and-zoom mix of distinct tiles, seeded), first on a cold cache, then all
// again on the warm cache. Each phase is bounded by its tile count and by --seconds. Reported: tiles/s, p50 and
// p99 latency per phase, and the server's peak RSS (VmHWM) after it has served every tile, beside its cache size.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "analysis/heatmap_outputs.h"
#include "bench/bench.h"
#include "bench/child.h"
#include "core/error.h"
#include "core/measure.h"
#include "core/random.h"
#include "synth/synth.h"
#include "viewer/deepzoom.h"

extern char** environ;

namespace tessera::bench {
namespace fs = std::filesystem;

namespace {

// The slide and its infer-like outputs; reused when the slide of that size is already there.
std::string prepare(const ViewBenchOptions& o) {
  const fs::path dir = fs::absolute(o.workdir);
  const fs::path slides = dir / "slides";
  const fs::path outputs = dir / "view";
  fs::create_directories(slides);
  fs::create_directories(outputs);
  const fs::path slide = slides / fmt::format("bench_{}.tif", o.size);
  synth::SynthSlideOptions so;
  so.width = so.height = o.size;
  so.seed = 7;
  const synth::SynthGroundTruth truth =
      fs::exists(slide) ? synth::synthetic_ground_truth(so) : synth::write_synthetic_slide(slide.string(), so);

  // A map of 384-px tiles every 192 px (the demo's geometry at 0.25 µm/px): 0.9 on the tumour, 0.05 elsewhere.
  io::Heatmap h;
  h.slide_id = slide.stem().string();
  h.slide_path = slide.string();
  h.slide_width = h.slide_height = o.size;
  h.slide_mpp = so.mpp;
  h.tile_mpp = 1.0;
  h.tile = 384;
  h.step = 192;
  h.rows = h.cols = static_cast<int>((o.size - h.tile) / h.step + 1);
  h.prob.assign(static_cast<std::size_t>(h.rows) * h.cols, 0.05f);
  for (const auto& a : truth.tumour) {
    std::vector<cv::Point2f> ring(a.outer.begin(), a.outer.end());
    for (int i = 0; i < h.rows; ++i) {
      for (int j = 0; j < h.cols; ++j) {
        const cv::Point2d c = io::cell_centre(h, i, j);
        if (cv::pointPolygonTest(ring, cv::Point2f(static_cast<float>(c.x), static_cast<float>(c.y)), false) >= 0) {
          h.prob[static_cast<std::size_t>(i) * h.cols + j] = 0.9f;
        }
      }
    }
  }
  analysis::OutputOptions out;
  out.outputs = {"heatmap.h5", "geojson", "report.json"};
  out.geojson.tiles = false;
  analysis::write_slide_outputs(outputs.string(), analysis::analyse_heatmap(std::move(h), out), out);
  return outputs.string();
}

// `tessera view` as a child: its pid and port (read from the address it prints).
struct ViewChild {
  pid_t pid = -1;
  int port = 0;
};

ViewChild start_view(const std::string& folder, const ViewBenchOptions& o, const std::string& log) {
  int out[2];
  core::check_errno(pipe(out) == 0, "pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  const std::vector<std::string> args = {
      self_path(), "view", folder, "--port", "0", "--cache-mb", std::to_string(o.cache_mb)};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ViewChild child;
  const int rc = posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    throw core::InternalError(fmt::format("cannot start {}: error {}", argv[0], rc));
  }
  // The address line comes once the server listens; reading it is the readiness wait (EOF = it ended).
  std::string text;
  char buffer[256];
  // Parsed by hand: GCC 12's <regex> trips -Wmaybe-uninitialized under the sanitizers with -Werror.
  const auto port_of = [](const std::string& t) -> int {
    for (std::size_t at = t.find("http://"); at != std::string::npos; at = t.find("http://", at + 1)) {
      const std::size_t colon = t.find(':', at + 7);
      if (colon == std::string::npos) return -1;
      std::size_t end = colon + 1;
      while (end < t.size() && std::isdigit(static_cast<unsigned char>(t[end]))) ++end;
      const std::size_t digits = end - colon - 1;
      if (digits >= 1 && digits <= 5 && end < t.size() && t[end] == '/') {
        const int port = std::stoi(t.substr(colon + 1, digits));
        if (port >= 1 && port <= 65535) return port;
      }
    }
    return -1;
  };
  int port = -1;
  while ((port = port_of(text)) < 0) {
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(out[0]);
  if (port < 0) {
    waitpid(child.pid, nullptr, 0);
    throw core::InternalError("tessera view did not start; see " + log + "\n" + text);
  }
  child.port = port;
  return child;
}

// A memory figure of the process from /proc/<pid>/status ("VmHWM", the peak RSS; "VmRSS", now), in kB.
long status_kb(pid_t pid, const std::string& field) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return 0;
}

struct Phase {
  std::string name;
  std::size_t requested = 0, done = 0, failed = 0;
  double seconds = 0.0, p50_ms = 0.0, p99_ms = 0.0, mb = 0.0;
  double server_peak_mb = 0.0;  // the server's VmHWM after the phase
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  const auto k = static_cast<std::size_t>(std::min<double>(v.size() - 1, std::ceil(q * v.size()) - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::vector<std::string> tile_urls(const std::string& base, const viewer::DeepZoom& dz, const std::string& ext,
                                   std::uint64_t seed) {
  std::vector<std::string> urls;
  for (int level = 0; level <= dz.max_level(); ++level) {
    for (std::int64_t r = 0; r < dz.rows(level); ++r) {
      for (std::int64_t c = 0; c < dz.columns(level); ++c)
        urls.push_back(fmt::format("{}/{}/{}_{}.{}", base, level, c, r, ext));
    }
  }
  core::SplitMix64 random(seed);
  for (std::size_t i = urls.size(); i > 1; --i) std::swap(urls[i - 1], urls[random.next() % i]);
  return urls;
}

Phase run_phase(const std::string& name, const std::vector<std::string>& urls, int port, const ViewBenchOptions& o) {
  Phase phase{name, urls.size()};
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> failed{0}, bytes{0};
  std::mutex mutex;
  std::vector<double> latencies;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int t = 0; t < o.clients; ++t) {
    clients.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);  // as a browser does
      std::vector<double> mine;
      for (std::size_t i = next++; i < urls.size() && core::seconds_since(start) < o.seconds; i = next++) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto res = client.Get(urls[i]);
        mine.push_back(1000.0 * core::seconds_since(t0));
        if (!res || res->status != 200) {
          ++failed;
        } else {
          bytes += res->body.size();
        }
      }
      std::lock_guard lock(mutex);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    });
  }
  for (auto& c : clients) c.join();
  phase.seconds = core::seconds_since(start);
  phase.done = latencies.size();
  phase.failed = failed;
  phase.p50_ms = percentile(latencies, 0.50);
  phase.p99_ms = percentile(latencies, 0.99);
  phase.mb = static_cast<double>(bytes) / (1 << 20);
  return phase;
}

}  // namespace

int run_bench_view(const ViewBenchOptions& o) {
  fs::create_directories(o.workdir);
  const std::string log = (fs::absolute(o.workdir) / "bench-view.log").string();
  std::cout << fmt::format(
                   "tessera bench view: a {}² synthetic slide and its heatmap, {} client threads, cache {} MB; "
                   "{}, load {}\n",
                   o.size, o.clients, o.cache_mb, cpu_name(), load_average())
            << std::flush;
  const std::string folder = prepare(o);
  const ViewChild child = start_view(folder, o, log);
  std::vector<Phase> phases;
  try {
    viewer::DeepZoom dz;
    dz.width = dz.height = o.size;
    const std::string id = fmt::format("bench_{}", o.size);
    const auto slide_urls = tile_urls("/dzi/" + id + "/slide_files", dz, "jpeg", 1);
    const auto heat_urls = tile_urls("/dzi/" + id + "/heatmap-0_files", dz, "png", 2);
    auto reshuffled = [](std::vector<std::string> urls, std::uint64_t seed) {
      core::SplitMix64 random(seed);
      for (std::size_t i = urls.size(); i > 1; --i) std::swap(urls[i - 1], urls[random.next() % i]);
      return urls;
    };
    auto phase = [&](const std::string& name, const std::vector<std::string>& urls) {
      phases.push_back(run_phase(name, urls, child.port, o));
      phases.back().server_peak_mb = static_cast<double>(status_kb(child.pid, "VmHWM")) / 1024.0;
    };
    phase("slide, cold", slide_urls);
    phase("slide, warm", reshuffled(slide_urls, 3));
    phase("heatmap, cold", heat_urls);
    phase("heatmap, warm", reshuffled(heat_urls, 4));
  } catch (...) {
    kill(child.pid, SIGTERM);
    waitpid(child.pid, nullptr, 0);
    throw;
  }
  const long rss_kb = status_kb(child.pid, "VmHWM");
  const long idle_kb = status_kb(child.pid, "VmRSS");
  // Of the resident memory, the anonymous part is the server's own (tiles, caches, buffers); the file part is
  // mapped files: the program's libraries and the slide, which libtiff maps once per concurrent reader handle.
  const long anon_kb = status_kb(child.pid, "RssAnon");
  const long file_kb = status_kb(child.pid, "RssFile");
  kill(child.pid, SIGTERM);
  int status = 0;
  waitpid(child.pid, &status, 0);

  std::cout << fmt::format("{:<16} {:>8} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>12}\n", "phase", "tiles", "of",
                           "failed", "tiles/s", "p50 ms", "p99 ms", "MB", "server peak");
  nlohmann::json json_phases = nlohmann::json::array();
  for (const auto& p : phases) {
    const double rate = p.seconds > 0 ? static_cast<double>(p.done) / p.seconds : 0.0;
    std::cout << fmt::format("{:<16} {:>8} {:>8} {:>8} {:>10.0f} {:>9.2f} {:>9.2f} {:>9.1f} {:>9.0f} MB\n", p.name,
                             p.done, p.requested, p.failed, rate, p.p50_ms, p.p99_ms, p.mb, p.server_peak_mb);
    json_phases.push_back({{"phase", p.name},
                           {"tiles", p.done},
                           {"requested", p.requested},
                           {"failed", p.failed},
                           {"seconds", p.seconds},
                           {"tiles_per_second", rate},
                           {"p50_ms", p.p50_ms},
                           {"p99_ms", p.p99_ms},
                           {"mb", p.mb},
                           {"server_peak_mb", p.server_peak_mb}});
  }
  const double rss_mb = static_cast<double>(rss_kb) / 1024.0;
  std::cout << fmt::format(
      "server peak RSS {:.0f} MB after serving every tile (cache {} MB; cache + 200 MB = {} MB); at the end {:.0f} MB: "
      "{:.0f} MB anonymous, {:.0f} MB mapped files\n",
      rss_mb, o.cache_mb, o.cache_mb + 200, static_cast<double>(idle_kb) / 1024.0,
      static_cast<double>(anon_kb) / 1024.0, static_cast<double>(file_kb) / 1024.0);
  if (!o.json_file.empty()) {
    std::ofstream(o.json_file) << nlohmann::json({{"size", o.size},
                                                  {"clients", o.clients},
                                                  {"cache_mb", o.cache_mb},
                                                  {"cpu", cpu_name()},
                                                  {"phases", json_phases},
                                                  {"server_peak_rss_mb", rss_mb},
                                                  {"server_end_anonymous_mb", static_cast<double>(anon_kb) / 1024.0},
                                                  {"server_end_file_mb", static_cast<double>(file_kb) / 1024.0}})
                                      .dump(2)
                               << "\n";
  }
  bool failures = false;
  for (const auto& p : phases) failures = failures || p.failed > 0;
  return failures ? core::exit_input : core::exit_ok;
}

}  // namespace tessera::bench
