// `tessera bench import`: the whole `tessera import` process (one rank, all cores, and one thread) against the loop
// Python users run (PIL open + one h5py write per patch, scripts/bench_import_python.py) on the same patches, in
// alternated rounds, best of each. The patches are a CSV given with --csv (e.g. ../shared/data/idc/labels.csv) or
// generated: 50 px PNG patches of noise-textured colour, 100 patients.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "bench/bench.h"
#include "bench/child.h"
#include "core/error.h"
#include "core/random.h"

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;

// `count` PNG patches of side `side` under `folder`/patches/<patient>/, and their labels.csv.
std::string generate_patches(const fs::path& folder, int count, int side) {
  const fs::path csv = folder / fmt::format("patches-{}x{}.csv", count, side);
  if (fs::exists(csv)) return csv.string();
  core::SplitMix64 random(11);
  std::string rows = "path,label,patient\n";
  cv::Mat bgr(side, side, CV_8UC3);
  for (int i = 0; i < count; ++i) {
    const int patient = i % 100;
    const int label = (i / 100) % 3 == 0 ? 1 : 0;
    const fs::path name = fs::path("patches") / fmt::format("p{:03}", patient) / fmt::format("{:06}.png", i);
    fs::create_directories((folder / name).parent_path());
    const int base = label ? 150 : 200;
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        const auto r = random.next();
        bgr.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<unsigned char>(base + (r & 31)),
                                            static_cast<unsigned char>(base - 60 + ((r >> 8) & 63)),
                                            static_cast<unsigned char>(base + ((r >> 16) & 31)));
      }
    }
    cv::imwrite((folder / name).string(), bgr);
    rows += fmt::format("{},{},p{:03}\n", name.string(), label, patient);
  }
  std::ofstream(csv) << rows;
  return csv.string();
}

struct Best {
  double seconds = 0.0;
  double cpu_seconds = 0.0;
  void take(double wall, double cpu) {
    if (seconds == 0.0 || wall < seconds) seconds = wall, cpu_seconds = cpu;
  }
};

}  // namespace

int run_bench_import(const ImportBenchOptions& o) {
  const fs::path work = fs::absolute(o.workdir);
  fs::create_directories(work);
  const std::string log = (work / "bench-import.log").string();
  const std::string csv = o.csv.empty() ? generate_patches(work, o.patches, o.tile_size) : fs::absolute(o.csv).string();
  std::int64_t patches = 0;
  {
    std::ifstream in(csv);
    if (!in) throw core::FileNotFoundError(csv);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) patches += line.empty() ? 0 : 1;
  }
  const std::string tessera = self_path();
  const std::string script = (fs::path(TESSERA_SOURCE_DIR) / "scripts" / "bench_import_python.py").string();
  // Debian's Python, where `install-deps.sh --bench` puts PIL and h5py (a python3 earlier in PATH may lack them).
  const auto python =
      fs::exists("/usr/bin/python3") ? std::optional<std::string>("/usr/bin/python3") : find_in_path("python3");
  const std::string load_before = load_average();
  std::cout << fmt::format("tessera bench import: {} patches of {} ({}), {} px tiles, {} on {}\n", patches, csv,
                           o.csv.empty() ? "generated PNG" : "given", o.tile_size,
                           o.rounds == 1 ? "1 round" : fmt::format("best of {} alternated rounds", o.rounds),
                           cpu_name());
  std::cout.flush();

  auto import_args = [&](int threads) {
    return std::vector<std::string>{tessera,
                                    "import",
                                    "--csv",
                                    csv,
                                    "--mpp",
                                    "4",
                                    "--tile-size",
                                    std::to_string(o.tile_size),
                                    "--out",
                                    (work / "shards").string(),
                                    "--force",
                                    "--set",
                                    fmt::format("import.threads={}", threads),
                                    "--log-level",
                                    "warn"};
  };
  Best all_cores, one_thread, python_process;
  double python_loop = 0.0, python_loop_cpu = 0.0;
  bool python_ok = static_cast<bool>(python) && fs::exists(script);
  for (int round = 0; round < o.rounds; ++round) {
    for (const int threads : {0, 1}) {
      const auto r = run_child(import_args(threads), log);
      require_ok(r, "tessera import", log);
      (threads == 0 ? all_cores : one_thread).take(r.seconds, r.cpu_seconds);
    }
    if (!python_ok) continue;
    const std::string result = (work / "python-result.txt").string();
    fs::remove(result);
    const auto r =
        run_child({*python, script, csv, std::to_string(o.tile_size), (work / "python.h5").string(), result}, log);
    double rate = 0.0, cpu_rate = 0.0;
    if (r.code == 0 && fs::exists(result)) std::ifstream(result) >> rate >> cpu_rate;
    python_ok = rate > 0.0;
    if (!python_ok) continue;
    python_process.take(r.seconds, r.cpu_seconds);
    python_loop = std::max(python_loop, rate);
    python_loop_cpu = std::max(python_loop_cpu, cpu_rate);
  }

  const auto n = static_cast<double>(patches);
  auto row = [&](const std::string& name, const Best& b, double against) {
    return fmt::format("{:<52} {:>8.2f} {:>10.0f} {:>8.2f} {:>10.0f} {:>9}\n", name, b.seconds, n / b.seconds,
                       b.cpu_seconds, n / b.cpu_seconds,
                       against > 0 ? fmt::format("{:.2f}x", (n / b.seconds) / against) : "-");
  };
  const double python_rate = python_ok ? n / python_process.seconds : 0.0;
  std::cout << fmt::format("machine: {} cores; load average (1, 5, 15 min) {} at the start, {} at the end\n\n",
                           std::thread::hardware_concurrency(), load_before, load_average());
  std::cout << fmt::format("{:<52} {:>8} {:>10} {:>8} {:>10} {:>9}\n", "whole process", "wall s", "patches/s", "CPU s",
                           "/CPU s", "vs Python");
  std::cout << row(fmt::format("tessera import, 1 rank, {} threads", std::thread::hardware_concurrency()), all_cores,
                   python_rate);
  std::cout << row("tessera import, 1 rank, 1 thread", one_thread, python_rate);
  if (python_ok) {
    std::cout << row("python: PIL + one h5py write per patch", python_process, python_rate);
    std::cout << fmt::format("{:<52} {:>8} {:>10.0f} {:>8} {:>10.0f}\n",
                             "python: the loop alone (imports, opening excluded)", "", python_loop, "",
                             python_loop_cpu);
  } else {
    std::cout << "python: not measured (needs /usr/bin/python3 with PIL and h5py: scripts/install-deps.sh --bench); "
              << "see " << log << "\n";
  }
  return 0;
}

}  // namespace tessera::bench
