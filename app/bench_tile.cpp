// tessera bench tile — the tiling stage's speed, every figure against a reference measured in the same run:
//   1. `tessera tile` end to end with 1 rank and with 2 ranks (tiles/s, separate processes, page cache warm);
//   2. the raw JPEG decode rate of the same slide regions (libtiff decoding every TIFF tile the job's tiles
//      touch, once) — the ceiling for a reader that must decode the scanner's JPEG;
//   3. the per-tile loop Python tools run (openslide-python read_region + resize + h5py write per tile);
//   4. the training reader (ShardDataset, shuffled blocks) against a plain sequential read of the same shards;
//   5. peak memory of tiling a slide and one four times larger.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <tiffio.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/bench.h"
#include "io/error.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "io/slide.h"

extern char** environ;

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct ChildResult {
  int code = -1;
  double seconds = 0.0;
  long max_rss_kb = 0;
};

// This process is an MPI singleton: Open MPI and PMIx left variables in its environment that would make a
// child `mpirun` (or a child singleton) try to join this process's job. Children get the environment without
// them (the run-as-root permissions stay).
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const bool mpi_runtime = var.rfind("OMPI_", 0) == 0 || var.rfind("PMIX_", 0) == 0 || var.rfind("OPAL_", 0) == 0 ||
                             var.rfind("ORTE_", 0) == 0;
    if (mpi_runtime && var.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) != 0) continue;
    env.push_back(var);
  }
  return env;
}

// Runs a program (argv[0] is looked up in PATH), waits, and reports wall time and peak memory.
ChildResult run_child(const std::vector<std::string>& args, const std::string& log_file) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  auto env_strings = child_environment();
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const auto t0 = clock_type::now();
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw io::InternalError("cannot start " + args[0] + ": " + std::strerror(rc));
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  ChildResult result;
  result.seconds = seconds_since(t0);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.max_rss_kb = usage.ru_maxrss;
  return result;
}

std::string self_path() { return fs::read_symlink("/proc/self/exe").string(); }

void require_ok(const ChildResult& r, const std::string& what, const std::string& log) {
  if (r.code != 0) throw io::InternalError(fmt::format("{} failed with exit code {}; see {}", what, r.code, log));
}

// Decodes, once each, every TIFF tile of `level_width`'s directory that the given level-0 regions touch.
// Returns the number of TIFF tiles decoded.
std::int64_t decode_touched_tiles(const std::string& path, const io::SlideLevel& level,
                                  const std::vector<std::array<double, 4>>& regions) {
  TIFFSetWarningHandler(nullptr);
  TIFF* tif = TIFFOpen(path.c_str(), "r");
  if (tif == nullptr) throw io::InputError("libtiff cannot open the slide", path);
  std::unique_ptr<TIFF, decltype(&TIFFClose)> guard(tif, TIFFClose);
  bool found = false;
  do {
    std::uint32_t w = 0;
    if (TIFFIsTiled(tif) && TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w) && w == level.width) {
      found = true;
      break;
    }
  } while (TIFFReadDirectory(tif));
  if (!found) throw io::InputError("no TIFF directory matches the pyramid level", path);
  std::uint32_t tw = 0, th = 0;
  TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw);
  TIFFGetField(tif, TIFFTAG_TILELENGTH, &th);
  std::set<std::uint32_t> tiles;
  for (const auto& r : regions) {
    const auto x0 = static_cast<std::int64_t>(r[0] / level.downsample);
    const auto y0 = static_cast<std::int64_t>(r[1] / level.downsample);
    const auto x1 = std::min<std::int64_t>(level.width - 1, static_cast<std::int64_t>((r[0] + r[2]) / level.downsample));
    const auto y1 = std::min<std::int64_t>(level.height - 1, static_cast<std::int64_t>((r[1] + r[3]) / level.downsample));
    for (std::int64_t y = y0 - y0 % th; y <= y1; y += th) {
      for (std::int64_t x = x0 - x0 % tw; x <= x1; x += tw) {
        tiles.insert(TIFFComputeTile(tif, static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(y), 0, 0));
      }
    }
  }
  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(TIFFTileSize(tif)));
  for (auto t : tiles) {
    if (TIFFReadEncodedTile(tif, t, buffer.data(), static_cast<tmsize_t>(buffer.size())) < 0) {
      throw io::InputError(fmt::format("cannot decode TIFF tile {}", t), path);
    }
  }
  return static_cast<std::int64_t>(tiles.size());
}

void write_job(const std::string& path, const std::string& csv, const std::string& out, const TileBenchOptions& o) {
  std::ofstream(path) << "input:\n  csv: " << csv << "\noutput: " << out << "\ntile:\n  size: " << o.tile_size
                      << "\n  mpp: " << o.mpp << "\nshards:\n  tiles_per_shard: 4096\n";
}

}  // namespace

int run_bench_tile(const TileBenchOptions& o) {
  const fs::path work = fs::absolute(o.workdir);
  fs::create_directories(work);
  const std::string log = (work / "bench.log").string();
  const std::string tessera = self_path();
  std::cout << fmt::format("tessera bench tile: {} slides of {}x{} px at 0.25 um/px, tiles {} px at {:g} um/px; "
                           "work folder {} (log {})\n",
                           o.slides, o.size, o.size, o.tile_size, o.mpp, work.string(), log);

  // Slides (made once per parameter set).
  const fs::path synth = work / fmt::format("synth-{}x{}", o.slides, o.size);
  if (!fs::exists(synth / "dataset.csv")) {
    require_ok(run_child({tessera, "synth", "--out", synth.string(), "--slides", std::to_string(o.slides), "--size",
                          std::to_string(o.size), "--seed", "11", "--set", "preview.enabled=false"},
                         log),
               "tessera synth", log);
  }
  const std::string csv = (synth / "dataset.csv").string();
  const std::string job = (work / "tile.yaml").string();
  const fs::path shards = work / "shards";
  write_job(job, csv, shards.string(), o);

  // 1. End to end, 1 and 2 ranks (a warm-up run first so that both measured runs find the slides in cache).
  require_ok(run_child({tessera, "tile", job, "--force", "--log-level", "warn"}, log), "tessera tile (warm-up)", log);
  const auto one = run_child({tessera, "tile", job, "--force", "--log-level", "warn"}, log);
  require_ok(one, "tessera tile (1 rank)", log);
  const auto manifest = io::read_manifest((shards / "manifest.json").string());
  const auto tiles = manifest.total_tiles();
  const auto two = run_child({"mpirun", "-n", "2", "--oversubscribe", "--allow-run-as-root", tessera, "tile", job,
                              "--force", "--log-level", "warn"},
                             log);
  require_ok(two, "mpirun -n 2 tessera tile", log);
  const double rate1 = static_cast<double>(tiles) / one.seconds;
  const double rate2 = static_cast<double>(tiles) / two.seconds;

  // 2. Raw JPEG decode of the TIFF tiles those tiles touch, at the level the reader uses.
  std::map<std::string, std::vector<std::array<double, 4>>> regions;
  for (const auto& entry : manifest.shards) {
    const auto shard = io::ShardFile::open((shards / entry.file).string());
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      regions[shard.slides()[shard.slide_indices()[k]]].push_back(
          {static_cast<double>(shard.coords()[2 * k]), static_cast<double>(shard.coords()[2 * k + 1]), 0.0, 0.0});
    }
  }
  std::vector<std::string> python_rows;
  std::int64_t decoded = 0;
  const auto t_decode = clock_type::now();
  for (const auto& s : manifest.slides) {
    auto& list = regions[s.id];
    const auto slide = io::Slide::open(s.path);
    const double footprint = o.tile_size * o.mpp / slide.mpp();
    const int level = slide.best_level_for_mpp(o.mpp);
    for (auto& r : list) {
      r[2] = r[3] = footprint;
      python_rows.push_back(fmt::format("{},{},{},{},{}", s.path, static_cast<std::int64_t>(r[0]),
                                        static_cast<std::int64_t>(r[1]), level,
                                        static_cast<std::int64_t>(std::ceil(footprint / slide.level(level).downsample))));
    }
    decoded += decode_touched_tiles(s.path, slide.level(level), list);
  }
  const double decode_seconds = seconds_since(t_decode);
  const double decode_rate = static_cast<double>(tiles) / decode_seconds;

  // 3. The Python per-tile loop on the same tiles.
  double python_rate = 0.0;
  std::string python_note;
  const std::string script = (fs::path(TESSERA_SOURCE_DIR) / "scripts" / "bench_tile_python.py").string();
  const std::string rows_file = (work / "python-tiles.csv").string();
  {
    std::ofstream rows(rows_file);
    for (const auto& row : python_rows) rows << row << "\n";
  }
  const std::string python_out = (work / "python-result.txt").string();
  fs::remove(python_out);
  const auto py = run_child({"/usr/bin/python3", script, rows_file, std::to_string(o.tile_size),
                             (work / "python.h5").string(), python_out},
                            log);
  if (py.code == 0 && fs::exists(python_out)) {
    std::ifstream in(python_out);
    in >> python_rate;
  } else {
    python_note = " (not measured: needs python3-openslide, python3-h5py; `scripts/install-deps.sh --bench`)";
  }

  // 4. Training reader vs a plain sequential read of the same shard files (both from the page cache).
  std::int64_t shard_bytes = 0;
  std::vector<char> chunk(8 << 20);
  auto sequential = [&] {
    const auto t0 = clock_type::now();
    for (const auto& entry : manifest.shards) {
      FILE* f = std::fopen((shards / entry.file).c_str(), "rb");
      if (f == nullptr) throw io::InputError("cannot open shard", (shards / entry.file).string());
      for (std::size_t n; (n = std::fread(chunk.data(), 1, chunk.size(), f)) > 0;) shard_bytes += static_cast<std::int64_t>(n);
      std::fclose(f);
    }
    return seconds_since(t0);
  };
  sequential();  // warm the cache
  shard_bytes = 0;
  const double seq_seconds = sequential();
  io::ShardDatasetOptions reader_options;
  reader_options.batch_size = 64;
  io::ShardDataset dataset(shards.string(), reader_options);
  io::Batch batch;
  std::int64_t read_tiles = 0;
  const auto t_reader = clock_type::now();
  dataset.start_epoch(1);
  while (dataset.next(batch)) read_tiles += batch.size;
  const double reader_seconds = seconds_since(t_reader);
  const double tile_bytes = static_cast<double>(o.tile_size) * o.tile_size * 3;
  const double seq_mbs = static_cast<double>(shard_bytes) / seq_seconds / 1e6;
  const double reader_mbs = static_cast<double>(read_tiles) * tile_bytes / reader_seconds / 1e6;

  // 5. Memory: one slide of the bench size and one with four times the area, 1 rank each.
  const fs::path mem = work / "memory";
  const std::string small_out = (mem / "small").string();
  const std::string large_out = (mem / "large").string();
  if (!fs::exists(mem / "large-set" / "dataset.csv")) {
    require_ok(run_child({tessera, "synth", "--out", (mem / "small-set").string(), "--slides", "1", "--size",
                          std::to_string(o.size), "--seed", "5", "--set", "preview.enabled=false"},
                         log),
               "tessera synth", log);
    require_ok(run_child({tessera, "synth", "--out", (mem / "large-set").string(), "--slides", "1", "--size",
                          std::to_string(2 * o.size), "--seed", "5", "--set", "preview.enabled=false"},
                         log),
               "tessera synth", log);
  }
  write_job((mem / "small.yaml").string(), (mem / "small-set" / "dataset.csv").string(), small_out, o);
  write_job((mem / "large.yaml").string(), (mem / "large-set" / "dataset.csv").string(), large_out, o);
  const auto small = run_child({tessera, "tile", (mem / "small.yaml").string(), "--force", "--log-level", "warn"}, log);
  const auto large = run_child({tessera, "tile", (mem / "large.yaml").string(), "--force", "--log-level", "warn"}, log);
  require_ok(small, "tessera tile (memory, small)", log);
  require_ok(large, "tessera tile (memory, large)", log);

  std::cout << fmt::format("\n{} tiles from {} slides, {} JPEG tiles decoded for them\n", tiles,
                           manifest.slides.size(), decoded);
  std::cout << fmt::format("{:<58} {:>12}  {:>10}\n", "measurement", "tiles/s", "ratio");
  std::cout << fmt::format("{:<58} {:>12.0f}  {:>10}\n", "tessera tile, 1 rank (end to end, incl. start and plan)",
                           rate1, "");
  std::cout << fmt::format("{:<58} {:>12.0f}  {:>9.2f}x\n", "tessera tile, 2 ranks (vs 1 rank)", rate2, rate2 / rate1);
  std::cout << fmt::format("{:<58} {:>12.0f}  {:>9.0f}%\n", "raw JPEG decode of the same regions (1 core; tile 1 rank / it)",
                           decode_rate, 100.0 * rate1 / decode_rate);
  if (python_rate > 0) {
    std::cout << fmt::format("{:<58} {:>12.0f}  {:>9.2f}x\n",
                             "python per-tile read_region + h5py (tile 1 rank / it)", python_rate, rate1 / python_rate);
  } else {
    std::cout << "python per-tile read_region + h5py" << python_note << "\n";
  }
  std::cout << fmt::format("\n{:<58} {:>12}  {:>10}\n", "shard reading", "MB/s", "ratio");
  std::cout << fmt::format("{:<58} {:>12.0f}  {:>10}\n", "plain sequential read of the shard files", seq_mbs, "");
  std::cout << fmt::format("{:<58} {:>12.0f}  {:>9.0f}%\n", "ShardDataset (shuffled 64-tile blocks, batches of 64)",
                           reader_mbs, 100.0 * reader_mbs / seq_mbs);
  std::cout << fmt::format("\npeak memory, tessera tile 1 rank: {}x{} slide {:.0f} MB, {}x{} slide {:.0f} MB\n", o.size,
                           o.size, small.max_rss_kb / 1024.0, 2 * o.size, 2 * o.size, large.max_rss_kb / 1024.0);
  return io::exit_ok;
}

}  // namespace tessera::app
