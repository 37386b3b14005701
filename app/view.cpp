// tessera view INPUT... — the slides of a job in a web browser (viewer/server.h): a folder of `tessera infer` outputs
// (slides with their heatmaps and regions), or slides alone (files, globs, a dataset.csv). Opens the job, lists the
// slides that cannot be shown with their errors, prints the address and serves until Ctrl-C (SIGINT) or SIGTERM.
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "viewer/job.h"
#include "viewer/server.h"

namespace tessera::app {
namespace {

struct ViewOptions {
  std::vector<std::string> inputs;
  std::string host = "127.0.0.1";
  int port = 8000;
  int cache_mb = 256;
  double assume_mpp = 0.0;
  std::string splits;
  bool list = false;
};

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

// The index as text: one line per slide, the ones that cannot be shown with their error.
int print_index(const viewer::ViewerJob& job) {
  int failed = 0;
  std::cout << (job.infer ? fmt::format("{}: {} slides\n", job.title, job.slides.size())
                          : fmt::format("{} slides\n", job.slides.size()));
  for (const auto& s : job.slides) {
    if (!s.error.empty()) {
      ++failed;
      std::cout << fmt::format("  {:<24} cannot be shown: {}\n", s.id, s.error);
      continue;
    }
    std::string what = s.heatmap ? fmt::format("heatmap, {} regions", s.regions.size()) : "slide only";
    if (s.ground_truth.is_array()) what += ", ground truth";
    if (!s.ground_truth_error.empty()) what += ", ground truth unreadable: " + s.ground_truth_error;
    std::cout << fmt::format("  {:<24} {}x{} px, {}\n", s.id, s.slide->width(), s.slide->height(), what);
  }
  return failed;
}

int run_view(const ViewOptions& options) {
  if (!core::Comm::world().is_root()) return core::exit_ok;
  viewer::JobOptions job_options;
  job_options.assume_mpp = options.assume_mpp;
  job_options.splits = comma_list(options.splits);
  viewer::ViewerJob job = viewer::open_job(options.inputs, job_options);
  const int failed = print_index(job);
  if (options.list) return failed > 0 ? core::exit_input : core::exit_ok;

  viewer::ServerOptions server_options;
  server_options.host = options.host;
  server_options.port = options.port;
  server_options.cache_bytes = static_cast<std::size_t>(options.cache_mb) << 20;
  if (!loopback(options.host)) {
    spdlog::warn("serving on {}: anyone who can reach this address can see these slides (the default is 127.0.0.1)",
                 options.host);
  }
  // SIGINT and SIGTERM are taken by one thread (sigwait), which stops the server; every other thread, the
  // server's workers included (they inherit the mask), blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  viewer::Server server(std::move(job), server_options);
  const int port = server.bind();
  const std::string host = options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  std::cout << fmt::format("Tessera viewer: http://{}:{}/   (Ctrl-C stops it)", host, port) << std::endl;
  std::atomic<bool> stopping{false};
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    if (!stopping.exchange(true)) spdlog::info("signal {}: stopping the viewer", signal);
    server.stop();
  });
  server.serve();
  if (!stopping.exchange(true)) kill(getpid(), SIGTERM);  // serve() ended by itself: release the waiter
  waiter.join();
  return core::exit_ok;
}

}  // namespace

Action setup_view(CLI::App& command) {
  auto options = std::make_shared<ViewOptions>();
  command
      .add_option("inputs", options->inputs,
                  "A folder of tessera infer outputs, or slides: files, globs or one dataset.csv")
      ->required();
  command.add_option("--host", options->host, "Address to listen on (default 127.0.0.1: this machine only)");
  command.add_option("--port", options->port, "Port to listen on (0 = any free port, printed)")
      ->check(CLI::Range(0, 65535));
  command.add_option("--cache-mb", options->cache_mb, "Memory for encoded tiles, in MB (default 256)")
      ->check(CLI::Range(16, 65536));
  command.add_option("--assume-mpp", options->assume_mpp, "um/px for slides that record none (else shown without um)")
      ->check(CLI::Range(0.0, 100.0));
  command.add_option("--splits", options->splits, "With a dataset.csv: only the rows of these splits (a,b)");
  command.add_flag("--list", options->list,
                   "Print the index (slides, what each shows, the errors of those that cannot be shown) and exit; "
                   "exit code 3 when some cannot be shown");
  return [options] { return run_view(*options); };
}

}  // namespace tessera::app
