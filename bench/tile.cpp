// tessera bench tile — the tiling stage's speed, every figure against a reference measured in the same run. The
// machine may be shared: ratios are taken within one run, each measurement is the best of alternated rounds, the
// load average is printed, and every comparison is also given by CPU time, which other processes hardly change.
//   1. `tessera tile` with 1 rank and with 2 ranks (separate processes, page cache warm): tiles/s end to end, and
//      of the extract phase alone (reading, resampling and writing the shards): wall time from its `extract`
//      progress line; CPU time as the 1-rank run's minus that of the same job capped at one tile per slide (same
//      start-up, planning and slide opening);
//   2. raw JPEG decoding: every stored TIFF tile that the job's output tiles touch at the pyramid level the tiler
//      reads (Slide::plan_read_at_mpp), decoded once each to RGB with libtiff + libjpeg (TIFFReadEncodedTile, as
//      the direct TIFF reader does). Ratio = decode time / extract time of 1 rank: 100% means extracting costs no
//      more than decoding the JPEG it needs;
//   3. the per-tile loop Python tools run (openslide-python read_region + box resize + one h5py write per tile)
//      on the same level regions, against the extract phase of 1 rank;
//   4. the training reader (ShardDataset with the trainer's defaults, shuffled and in order) against a plain
//      sequential read() of the same shard files, copied into a set of at least --read-mb, page cache warm for
//      both, alternated rounds;
//   5. peak memory of tiling one slide and one with four times the area.
#include <fcntl.h>
#include <sys/resource.h>
#include <tiffio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench/bench.h"
#include "bench/child.h"
#include "core/error.h"
#include "core/measure.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "io/slide.h"

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

// Alternated rounds of the shard-reading comparison, and the least time each side gets in all.
constexpr int kMinReadRounds = 5;
constexpr double kMinReadSeconds = 1.0;
constexpr std::size_t kSequentialChunk = std::size_t{1} << 20;  // the fastest of 128 KB to 8 MB here
// The shards are copied into a reading set of at least --read-mb and four shuffle buffers, so that neither side
// reads from the CPU caches and the shuffle buffer spends most of an epoch in its steady state.
constexpr std::int64_t kReadSetBuffers = 4;

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One `tessera tile` run: wall time, and the extract phase's time from its final progress line
// ("extract 1234/1234 tiles (100.0%)  312.4 tiles/s  elapsed 00:04": tiles / rate).
struct TileRun {
  ChildResult child;
  std::int64_t tiles = 0;
  double extract_seconds = 0.0;
};

TileRun run_tile(const std::vector<std::string>& command, const std::string& log, const std::string& what) {
  fs::remove(log);
  TileRun run;
  run.child = run_child(command, log);
  require_ok(run.child, what, log);
  const std::string label = "] extract ";  // the end of the log prefix, and the progress label
  const std::string before_rate = ")  ";   // after the percentage
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(label);
    if (at == std::string::npos || line.find("elapsed") == std::string::npos) continue;
    long long done = 0;
    long long total = 0;
    double rate = 0.0;
    const auto rate_at = line.find(before_rate, at);
    if (std::sscanf(line.c_str() + at + label.size(), "%lld/%lld", &done, &total) == 2 &&
        rate_at != std::string::npos && std::sscanf(line.c_str() + rate_at + before_rate.size(), "%lf", &rate) == 1 &&
        rate > 0) {
      run.tiles = done;
      run.extract_seconds = static_cast<double>(done) / rate;
    }
  }
  if (run.extract_seconds <= 0) {
    throw core::InternalError(fmt::format("{}: no final `extract` progress line with a rate in {}", what, log));
  }
  return run;
}

// The stored TIFF tiles to decode: per slide, per pyramid level, the tile indices (sorted: the file's order).
struct TouchedTiles {
  std::map<int, std::set<std::uint32_t>> by_level;
};

// Each pyramid level's TIFF directory, by TiffTileReader's rule: the first tiled directory in file order, not
// taken by an earlier level, whose size is the level's.
std::vector<tdir_t> level_directories(TIFF* tif, const io::Slide& slide) {
  struct Tiled {
    tdir_t directory;
    std::uint32_t width, height;
    bool taken;
  };
  std::vector<Tiled> tiled;
  TIFFSetDirectory(tif, 0);
  do {
    std::uint32_t w = 0, h = 0;
    if (TIFFIsTiled(tif) && TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w) && TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h)) {
      tiled.push_back({TIFFCurrentDirectory(tif), w, h, false});
    }
  } while (TIFFReadDirectory(tif));
  std::vector<tdir_t> directories;
  for (const auto& level : slide.levels()) {
    auto it = std::find_if(tiled.begin(), tiled.end(), [&](const Tiled& t) {
      return !t.taken && t.width == level.width && t.height == level.height;
    });
    if (it == tiled.end()) {
      throw core::InputError(fmt::format("no tiled TIFF directory of {}x{} for pyramid level {}", level.width,
                                         level.height, directories.size()),
                             slide.path());
    }
    it->taken = true;
    directories.push_back(it->directory);
  }
  return directories;
}

struct DecodeResult {
  std::int64_t tiles = 0;
  double megapixels = 0.0;
  double seconds = 0.0;
  double cpu_seconds = 0.0;
  std::set<std::string> encodings;
};

// Decodes, once each, the stored tiles of `touched` to RGB, timing (wall and CPU) only the decoding calls.
void decode_touched(const io::Slide& slide, const TouchedTiles& touched, DecodeResult& result) {
  TIFFSetWarningHandler(nullptr);
  TIFF* tif = TIFFOpen(slide.path().c_str(), "r");
  if (tif == nullptr) throw core::InputError("libtiff cannot open the slide", slide.path());
  std::unique_ptr<TIFF, decltype(&TIFFClose)> guard(tif, TIFFClose);
  const auto directories = level_directories(tif, slide);
  std::vector<std::uint8_t> buffer;
  for (const auto& [level, tiles] : touched.by_level) {
    const tdir_t directory = directories[static_cast<std::size_t>(level)];
    if (TIFFSetDirectory(tif, directory) != 1) {
      throw core::InputError(fmt::format("cannot read TIFF directory {}", directory), slide.path());
    }
    std::uint16_t compression = COMPRESSION_NONE;
    std::uint16_t photometric = 0;
    TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &compression);
    TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric);
    if (compression == COMPRESSION_JPEG && photometric == PHOTOMETRIC_YCBCR) {
      TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);  // to RGB, as the tiler's reader decodes
    }
    result.encodings.insert(compression == COMPRESSION_JPEG ? "JPEG" : fmt::format("compression {}", compression));
    std::uint32_t tw = 0, th = 0;
    TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw);
    TIFFGetField(tif, TIFFTAG_TILELENGTH, &th);
    buffer.resize(static_cast<std::size_t>(TIFFTileSize(tif)));
    const auto t0 = clock_type::now();
    const double cpu0 = thread_cpu_seconds();
    for (const auto t : tiles) {
      if (TIFFReadEncodedTile(tif, t, buffer.data(), static_cast<tmsize_t>(buffer.size())) < 0) {
        throw core::InputError(fmt::format("cannot decode tile {} of TIFF directory {}", t, directory), slide.path());
      }
    }
    result.cpu_seconds += thread_cpu_seconds() - cpu0;
    result.seconds += core::seconds_since(t0);
    result.tiles += static_cast<std::int64_t>(tiles.size());
    result.megapixels += static_cast<double>(tiles.size()) * tw * th / 1e6;
  }
}

// `max_tiles_per_slide` 0 = all tiles.
void write_job(const std::string& path, const std::string& csv, const std::string& out, const TileBenchOptions& o,
               int max_tiles_per_slide = 0) {
  std::ofstream(path) << "input:\n  csv: " << csv << "\noutput: " << out << "\ntile:\n  size: " << o.tile_size
                      << "\n  mpp: " << o.mpp << "\nshards:\n  tiles_per_shard: 4096\nsampling:\n"
                      << "  max_tiles_per_slide: " << max_tiles_per_slide
                      << "\nqc:\n  enabled: " << (o.qc ? "true" : "false") << "\n";
}

// Reads every byte of the files with plain read() calls into one reused buffer; returns the bytes.
std::int64_t read_sequentially(const std::vector<std::string>& files, std::vector<char>& chunk) {
  std::int64_t bytes = 0;
  for (const auto& file : files) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) throw core::InputError(fmt::format("cannot open: {}", std::strerror(errno)), file);
    for (ssize_t n; (n = ::read(fd, chunk.data(), chunk.size())) > 0;) bytes += n;
    ::close(fd);
  }
  return bytes;
}

// One epoch of the reader; returns the bytes of the tiles it delivered.
std::int64_t read_epoch(io::ShardDataset& dataset, std::int64_t epoch, io::Batch& batch) {
  std::int64_t bytes = 0;
  dataset.start_epoch(epoch);
  while (dataset.next(batch)) bytes += static_cast<std::int64_t>(batch.images.size());
  return bytes;
}

// A measured figure, or "-" when it could not be measured: negative (not measured), or not finite (a time below the
// clock's resolution, such as a tiny job's CPU time, makes a rate or a ratio infinite).
bool measured(double value) { return value >= 0 && std::isfinite(value); }

// A table row: wall seconds and rate, CPU seconds and rate ("-": not measured), ratios by wall and CPU time.
std::string row(const std::string& what, double seconds, double rate, double cpu, double cpu_rate,
                const std::string& ratio_wall = "", const std::string& ratio_cpu = "") {
  const std::string rate_text = measured(rate) && seconds > 0 ? fmt::format("{:.0f}", rate) : "-";
  const std::string cpu_text = measured(cpu) ? fmt::format("{:.3f}", cpu) : "-";
  const std::string cpu_rate_text = measured(cpu_rate) && cpu > 0 ? fmt::format("{:.0f}", cpu_rate) : "-";
  return fmt::format("{:<58} {:>7.3f} {:>8} {:>7} {:>8}  {:>7} {:>7}\n", what, seconds, rate_text, cpu_text,
                     cpu_rate_text, ratio_wall, ratio_cpu);
}

// Two significant digits below 10% (an ASan build's extraction can cost 300x the decode: "0.31%", not "0%").
std::string percent(double ratio) {
  if (!measured(ratio)) return "-";
  const double p = 100.0 * ratio;
  return p < 10.0 ? fmt::format("{:.2g}%", p) : fmt::format("{:.0f}%", p);
}
std::string times(double ratio) { return measured(ratio) ? fmt::format("{:.2f}x", ratio) : "-"; }

}  // namespace

int run_bench_tile(const TileBenchOptions& o) {
  const fs::path work = fs::absolute(o.workdir);
  fs::create_directories(work);
  const std::string log = (work / "bench.log").string();
  const std::string tessera = self_path();
  const std::string load_before = load_average();
  std::cout << fmt::format(
                   "tessera bench tile: {} slides of {}x{} px at 0.25 um/px, tiles {} px at {:g} um/px; "
                   "work folder {} (logs there)\n",
                   o.slides, o.size, o.size, o.tile_size, o.mpp, work.string())
            << std::flush;

  // 5, first. Memory: one slide of the bench size and one with four times the area, 1 rank each. First, because a
  // child's ru_maxrss counts this process's peak RSS at the spawn (exec records the peak of the address space it
  // leaves, which vfork shares with this process): measured now, before this process holds slides, shards or
  // shuffle buffers, that floor is low, and it is reported.
  struct rusage self_usage {};
  getrusage(RUSAGE_SELF, &self_usage);
  const long own_peak_kb = self_usage.ru_maxrss;
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
  const auto small = run_tile({tessera, "tile", (mem / "small.yaml").string(), "--force", "--log-level", "info"},
                              (mem / "small.log").string(), "tessera tile (memory, small)");
  const auto large = run_tile({tessera, "tile", (mem / "large.yaml").string(), "--force", "--log-level", "info"},
                              (mem / "large.log").string(), "tessera tile (memory, large)");

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

  // A warm-up run: every measured run then finds the slides in the page cache, and the shards exist.
  const std::vector<std::string> tile_one = {tessera, "tile", job, "--force", "--log-level", "info"};
  std::vector<std::string> tile_two = {"mpirun", "-n", "2", "--oversubscribe", "--allow-run-as-root"};
  tile_two.insert(tile_two.end(), tile_one.begin(), tile_one.end());
  run_tile(tile_one, (work / "tile-warmup.log").string(), "tessera tile (warm-up)");
  const auto manifest = io::read_manifest((shards / "manifest.json").string());
  const auto tiles = manifest.total_tiles();
  if (tiles == 0) {
    throw core::InternalError(fmt::format("the bench job made no tiles; see {}", (work / "tile-warmup.log").string()));
  }

  // The stored tiles the job's tiles touch at the level the tiler reads, and the Python loop's regions.
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> tiles_of;  // slide id -> level-0 x, y
  for (const auto& entry : manifest.shards) {
    const auto shard = io::ShardFile::open((shards / entry.file).string());
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      tiles_of[shard.slides()[shard.slide_indices()[k]]].emplace_back(shard.coords()[2 * k], shard.coords()[2 * k + 1]);
    }
  }
  std::vector<std::pair<io::Slide, TouchedTiles>> touched;
  std::set<std::string> readers;
  const std::string rows_file = (work / "python-tiles.csv").string();
  {
    std::ofstream rows(rows_file);
    for (const auto& s : manifest.slides) {
      auto slide = io::Slide::open(s.path);
      readers.insert(slide.reader());
      TouchedTiles t;
      for (const auto& [x, y] : tiles_of[s.id]) {
        const auto r = slide.plan_read_at_mpp(x, y, o.tile_size, o.tile_size, o.mpp);
        const auto& level = slide.level(r.level);
        const double ds = level.downsample;
        rows << fmt::format("{},{},{},{},{},{}\n", s.path, std::llround(static_cast<double>(r.lx) * ds),
                            std::llround(static_cast<double>(r.ly) * ds), r.level, r.lw, r.lh);
        if (level.tile_width <= 0 || level.tile_height <= 0) {
          throw core::InputError(fmt::format("pyramid level {} is not tiled", r.level), s.path);
        }
        const std::int64_t x0 = std::max<std::int64_t>(r.lx, 0);
        const std::int64_t y0 = std::max<std::int64_t>(r.ly, 0);
        const std::int64_t x1 = std::min(r.lx + r.lw, level.width);
        const std::int64_t y1 = std::min(r.ly + r.lh, level.height);
        const std::int64_t across = (level.width + level.tile_width - 1) / level.tile_width;
        for (std::int64_t down = y0 / level.tile_height; down <= (y1 - 1) / level.tile_height; ++down) {
          for (std::int64_t column = x0 / level.tile_width; column <= (x1 - 1) / level.tile_width; ++column) {
            t.by_level[r.level].insert(static_cast<std::uint32_t>(down * across + column));
          }
        }
      }
      touched.emplace_back(std::move(slide), std::move(t));
    }
  }

  // 1-3. Rounds of: 1 rank, the same job capped at one tile per slide, 2 ranks, the decode, the Python loop; the
  // best of each. The capped job starts, plans and opens every slide as the full one does, so the difference of
  // their CPU times is the CPU time of extracting the tiles — a figure the other processes on a shared machine
  // hardly change, unlike wall times.
  const std::string capped_job = (work / "tile-capped.yaml").string();
  write_job(capped_job, csv, (work / "shards-capped").string(), o, 1);
  const std::vector<std::string> tile_capped = {tessera, "tile", capped_job, "--force", "--log-level", "info"};
  const std::string script = (fs::path(TESSERA_SOURCE_DIR) / "scripts" / "bench_tile_python.py").string();
  const std::string python_out = (work / "python-result.txt").string();
  TileRun one, two;
  double one_cpu = 0.0, capped_cpu = 0.0;
  DecodeResult decode;
  double python_rate = 0.0, python_cpu_rate = 0.0;
  bool python_failed = false;
  for (int round = 0; round < o.rounds; ++round) {
    const auto r1 =
        run_tile(tile_one, (work / fmt::format("tile-1rank-{}.log", round)).string(), "tessera tile (1 rank)");
    if (round == 0 || r1.extract_seconds < one.extract_seconds) one = r1;
    one_cpu = round == 0 ? r1.child.cpu_seconds : std::min(one_cpu, r1.child.cpu_seconds);
    const auto capped = run_tile(tile_capped, (work / "tile-capped.log").string(), "tessera tile (1 tile per slide)");
    capped_cpu = round == 0 ? capped.child.cpu_seconds : std::min(capped_cpu, capped.child.cpu_seconds);
    const auto r2 =
        run_tile(tile_two, (work / fmt::format("tile-2ranks-{}.log", round)).string(), "mpirun -n 2 tessera tile");
    if (round == 0 || r2.extract_seconds < two.extract_seconds) two = r2;
    DecodeResult d;
    for (const auto& [slide, t] : touched) decode_touched(slide, t, d);
    if (round == 0 || d.seconds < decode.seconds) {
      const double best_cpu = round == 0 ? d.cpu_seconds : std::min(decode.cpu_seconds, d.cpu_seconds);
      decode = d;
      decode.cpu_seconds = best_cpu;
    } else {
      decode.cpu_seconds = std::min(decode.cpu_seconds, d.cpu_seconds);
    }
    if (!python_failed) {
      fs::remove(python_out);
      const auto py = run_child({"/usr/bin/python3", script, rows_file, std::to_string(o.tile_size),
                                 (work / "python.h5").string(), python_out},
                                log);
      double rate = 0.0, cpu_rate = 0.0;
      if (py.code == 0 && fs::exists(python_out)) std::ifstream(python_out) >> rate >> cpu_rate;
      python_failed = rate <= 0.0 || cpu_rate <= 0.0;
      python_rate = std::max(python_rate, rate);
      python_cpu_rate = std::max(python_cpu_rate, cpu_rate);
    }
  }
  if (python_failed) python_rate = python_cpu_rate = 0.0;
  // Not measurable (printed as "-") when the job is so small that start-up jitter hides the extraction.
  const double extract_cpu = one_cpu - capped_cpu;
  const bool extract_cpu_known = extract_cpu > 0;

  // 4. The training reader against a sequential read of the same files, alternated, both from the page cache.
  // The reading set: the job's shards, copied as often as needed (a slide then appears in several shards, as
  // it may in any job).
  const fs::path read_set = work / "read-set";
  fs::remove_all(read_set);
  fs::create_directories(read_set);
  const auto written = io::read_manifest((shards / "manifest.json").string());  // the last run's shards
  io::Manifest read_manifest = written;
  read_manifest.shards.clear();
  const std::int64_t buffer_bytes =
      static_cast<std::int64_t>(io::ShardDatasetOptions{}.shuffle_buffer) * o.tile_size * o.tile_size * 3;
  const std::int64_t wanted = std::max(std::int64_t{o.read_set_mb} << 20, kReadSetBuffers * buffer_bytes);
  std::vector<std::string> shard_files;
  std::int64_t set_bytes = 0;
  int copies = 0;
  for (int copy = 0; set_bytes < wanted; ++copy, ++copies) {
    for (const auto& entry : written.shards) {
      auto copied = entry;
      copied.file = fmt::format("copy{:03}-{}", copy, entry.file);
      fs::copy_file(shards / entry.file, read_set / copied.file);
      shard_files.push_back((read_set / copied.file).string());
      set_bytes += static_cast<std::int64_t>(fs::file_size(read_set / copied.file));
      read_manifest.shards.push_back(copied);
    }
  }
  // Every slide's tiles are there `copies` times: the manifest's counts say so (readers check them against the shards).
  for (auto& slide : read_manifest.slides) {
    slide.tiles *= copies;
    slide.normal *= copies;
    slide.tumour *= copies;
  }
  io::write_manifest((read_set / "manifest.json").string(), read_manifest);
  std::vector<char> chunk(kSequentialChunk);
  io::ShardDatasetOptions shuffled_options;  // the trainer's defaults: batches and blocks of 64, 2048-tile buffer
  io::ShardDataset shuffled(read_set.string(), shuffled_options);
  io::ShardDatasetOptions ordered_options;
  ordered_options.shuffle = false;
  ordered_options.drop_last = false;
  io::ShardDataset ordered(read_set.string(), ordered_options);
  io::Batch batch;
  read_sequentially(shard_files, chunk);  // warm the page cache (and each side's buffers)
  read_epoch(shuffled, 0, batch);
  read_epoch(ordered, 0, batch);
  // Best round of each side, by wall time and by CPU time of the process (the reader's work is on its prefetch
  // thread; the waiting consumer costs nothing).
  struct Best {
    double rate = 0.0;      // bytes per wall second
    double cpu_rate = 0.0;  // bytes per CPU second
    double seconds = 0.0;
    double cpu_seconds = 0.0;
    double total = 0.0;
    void add(std::int64_t bytes, double s, double cpu) {
      total += s;
      const auto b = static_cast<double>(bytes);
      if (s > 0 && b / s > rate) {
        rate = b / s;
        seconds = s;
      }
      if (cpu > 0 && b / cpu > cpu_rate) {
        cpu_rate = b / cpu;
        cpu_seconds = cpu;
      }
    }
  };
  auto process_cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  Best sequential, reader, unshuffled;
  int rounds = 0;
  while (rounds < kMinReadRounds || std::min({sequential.total, reader.total, unshuffled.total}) < kMinReadSeconds) {
    ++rounds;
    auto t0 = clock_type::now();
    double cpu0 = process_cpu();
    const auto seq_bytes = read_sequentially(shard_files, chunk);
    sequential.add(seq_bytes, core::seconds_since(t0), process_cpu() - cpu0);
    t0 = clock_type::now();
    cpu0 = process_cpu();
    const auto shuffled_bytes = read_epoch(shuffled, rounds, batch);
    reader.add(shuffled_bytes, core::seconds_since(t0), process_cpu() - cpu0);
    t0 = clock_type::now();
    cpu0 = process_cpu();
    const auto ordered_bytes = read_epoch(ordered, rounds, batch);
    unshuffled.add(ordered_bytes, core::seconds_since(t0), process_cpu() - cpu0);
  }
  fs::remove_all(read_set);

  // Report.
  const double rate1 = static_cast<double>(tiles) / one.child.seconds;
  const double rate2 = static_cast<double>(tiles) / two.child.seconds;
  const double extract1 = static_cast<double>(tiles) / one.extract_seconds;
  const double extract2 = static_cast<double>(tiles) / two.extract_seconds;
  std::string reader_names;
  for (const auto& r : readers) {
    if (!reader_names.empty()) reader_names += "; ";
    reader_names += r;
  }
  std::string encodings;
  for (const auto& e : decode.encodings) {
    if (!encodings.empty()) encodings += ", ";
    encodings += e;
  }

  std::cout << fmt::format(
      "\n{} tiles from {} slides (read through: {}), quality control {}; {} stored {} tiles ({:.0f} Mpixel) "
      "under them\n",
      tiles, manifest.slides.size(), reader_names, o.qc ? "on" : "off", decode.tiles, encodings, decode.megapixels);
  std::cout << fmt::format("machine: {} cores; load average (1, 5, 15 min) {} at the start, {} at the end\n\n",
                           std::thread::hardware_concurrency(), load_before, load_average());
  std::cout << fmt::format("{:<58} {:>7} {:>8} {:>7} {:>8}  {:>7} {:>7}\n",
                           fmt::format("tiling (best of {} alternated rounds)", o.rounds), "wall s", "tiles/s", "CPU s",
                           "/CPU s", "ratio", "by CPU");
  std::cout << row("tessera tile, 1 rank: end to end", one.child.seconds, rate1, one_cpu,
                   static_cast<double>(tiles) / one_cpu);
  std::cout << row("tessera tile, 1 rank: extract phase", one.extract_seconds, extract1,
                   extract_cpu_known ? extract_cpu : -1,
                   extract_cpu_known ? static_cast<double>(tiles) / extract_cpu : -1);
  std::cout << row("tessera tile, 2 ranks: end to end (vs 1 rank)", two.child.seconds, rate2, two.child.cpu_seconds,
                   static_cast<double>(tiles) / two.child.cpu_seconds, times(rate2 / rate1));
  std::cout << row("tessera tile, 2 ranks: extract phase (vs 1 rank)", two.extract_seconds, extract2, -1, -1,
                   times(extract2 / extract1));
  std::cout << row(fmt::format("decode of the {} stored tiles (decode / extract)", decode.tiles), decode.seconds,
                   static_cast<double>(tiles) / decode.seconds, decode.cpu_seconds,
                   static_cast<double>(tiles) / decode.cpu_seconds, percent(decode.seconds / one.extract_seconds),
                   extract_cpu_known ? percent(decode.cpu_seconds / extract_cpu) : "-");
  if (python_rate > 0) {
    const double tiles_d = static_cast<double>(tiles);
    std::cout << row("python per-tile loop (extract / it)", tiles_d / python_rate, python_rate,
                     tiles_d / python_cpu_rate, python_cpu_rate, times(extract1 / python_rate),
                     extract_cpu_known ? times(tiles_d / extract_cpu / python_cpu_rate) : "-");
    std::cout << row("  the same, tessera tile end to end / it", one.child.seconds, rate1, one_cpu, tiles_d / one_cpu,
                     times(rate1 / python_rate), times(tiles_d / one_cpu / python_cpu_rate));
  } else {
    std::cout << "python per-tile loop: not measured (needs /usr/bin/python3 with openslide and h5py: "
                 "`scripts/install-deps.sh --bench`); see "
              << log << "\n";
  }
  std::cout
      << "  end to end: the process, from start to exit (CPU: with its MPI helpers). extract phase: wall time\n"
         "  from the `extract` progress line (reading, resampling, writing the shards); its CPU time is the\n"
         "  1-rank run's minus that of the same job capped at 1 tile per slide (same start, plan, slide opening).\n"
         "  decode: every stored tile of the pyramid level the tiler reads that some output tile's read\n"
         "  touches, decoded once to RGB with libtiff + libjpeg (TIFFReadEncodedTile, as the direct TIFF\n"
         "  reader does), 1 thread; 100% = extraction costs no more than decoding the JPEG it needs.\n"
         "  python: openslide-python read_region of the same level regions + box resize + one h5py write\n"
         "  per tile, 1 process (loop only). Ratios \"by CPU\" use CPU times, which a busy machine hardly\n"
         "  changes; wall-time ratios depend on the load.\n";

  const double mb = 1e6;
  std::cout << fmt::format(
      "\n{:<58} {:>7} {:>8} {:>7} {:>8}  {:>7} {:>7}\n",
      fmt::format("shard reading, {:.0f} MB, best of {} rounds", static_cast<double>(set_bytes) / mb, rounds), "wall s",
      "MB/s", "CPU s", "/CPU s", "ratio", "by CPU");
  std::cout << row(fmt::format("plain sequential read() of the {} shard files", shard_files.size()), sequential.seconds,
                   sequential.rate / mb, sequential.cpu_seconds, sequential.cpu_rate / mb);
  std::cout << row("ShardDataset, shuffled (vs sequential)", reader.seconds, reader.rate / mb, reader.cpu_seconds,
                   reader.cpu_rate / mb, percent(reader.rate / sequential.rate),
                   percent(reader.cpu_rate / sequential.cpu_rate));
  std::cout << row("ShardDataset, in order (vs sequential)", unshuffled.seconds, unshuffled.rate / mb,
                   unshuffled.cpu_seconds, unshuffled.cpu_rate / mb, percent(unshuffled.rate / sequential.rate),
                   percent(unshuffled.cpu_rate / sequential.cpu_rate));
  std::cout << fmt::format(
      "  the job's shards copied {} times, page cache warm for both sides; sequential: read() in {} KB chunks\n"
      "  into one buffer; ShardDataset: one epoch per round with the trainer's defaults (batches and blocks of 64\n"
      "  tiles, a 2048-tile shuffle buffer; in order: validation, no buffer), its bytes are the tiles delivered;\n"
      "  rounds alternate between the three\n",
      shard_files.size() / std::max<std::size_t>(1, written.shards.size()), kSequentialChunk >> 10);

  std::cout << fmt::format(
      "\npeak memory, tessera tile 1 rank: {}x{} slide ({} tiles) {:.0f} MB, {}x{} slide ({} "
      "tiles) {:.0f} MB\n  (ru_maxrss; figures at or below {:.0f} MB, this process's own peak "
      "when it started them, would be that peak)\n",
      o.size, o.size, small.tiles, small.child.max_rss_kb / 1024.0, 2 * o.size, 2 * o.size, large.tiles,
      large.child.max_rss_kb / 1024.0, own_peak_kb / 1024.0);
  return core::exit_ok;
}

}  // namespace tessera::bench
