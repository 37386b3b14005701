// tessera bench dicom — DICOM reading against the direct TIFF path on the same slide with the same JPEG tiles.
//
// One synthetic slide (tessera synth's renderer, generic TIFF, JPEG tiles) is written as a tiled TIFF and converted
// into a DICOM series whose frames are the TIFF's JPEG tiles byte for byte (io/dicom_writer.h): same tile size, same
// levels, same JPEG streams, so the two readers differ only in how they find and fetch a tile. The same level-0
// regions (tile-sized, at seeded random positions, so most touch four tiles) are read from each through
// io::Slide::read_region, in alternated rounds (TIFF, DICOM, DICOM, TIFF, ...), each round on a freshly opened
// slide (an empty decoded-tile cache), on one thread; the best round of each counts. The first regions are also
// compared pixel for pixel (they must be identical). Wall and CPU time are both given: the machine may be shared.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

#include "bench/bench.h"
#include "bench/child.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "io/dicom_writer.h"
#include "io/provenance.h"
#include "io/slide.h"
#include "synth/synth.h"

namespace tessera::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct Timing {
  double wall = 1e300;
  double cpu = 1e300;
};

// Reads every region from a freshly opened slide; returns the time taken.
Timing read_all(const std::string& path, const std::vector<cv::Point>& regions, int side, std::uint64_t& checksum) {
  const auto start = clock_type::now();
  const double cpu_start = cpu_seconds();
  const io::Slide slide = io::Slide::open(path);
  std::uint64_t sum = 0;
  for (const auto& p : regions) {
    const cv::Mat pixels = slide.read_region(p.x, p.y, 0, side, side);
    sum += pixels.at<cv::Vec3b>(side / 2, side / 2)[1];
  }
  checksum = sum;
  Timing t;
  t.wall = std::chrono::duration<double>(clock_type::now() - start).count();
  t.cpu = cpu_seconds() - cpu_start;
  return t;
}

}  // namespace

int run_bench_dicom(const DicomBenchOptions& options) {
  const fs::path work(options.workdir);
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) throw core::InputError("cannot create the bench folder: " + ec.message(), work.string());
  const fs::path tiff = work / fmt::format("slide-{}-{}.tif", options.size, options.tile_size);
  const fs::path series = work / fmt::format("slide-{}-{}-dicom", options.size, options.tile_size);

  // The slide: made once per size and tile size, kept for later runs.
  bool made = false;
  if (!fs::exists(tiff)) {
    synth::SynthSlideOptions slide;
    slide.width = options.size;
    slide.height = options.size;
    slide.seed = 7;
    slide.mpp = 0.25;
    slide.tiff.flavor = io::TiffFlavor::generic;
    slide.tiff.compression = io::TiffCompression::jpeg;
    slide.tiff.tile_size = options.tile_size;
    slide.tiff.software = io::kSyntheticSlideSoftware;
    std::cout << fmt::format("writing a {}x{} synthetic slide ({}-px JPEG tiles) to {}\n", options.size, options.size,
                             options.tile_size, tiff.string());
    synth::write_synthetic_slide(tiff.string(), slide);
    made = true;
  }
  if (made || !fs::exists(series)) {
    std::cout << fmt::format("converting it to a DICOM series (the same JPEG tiles) in {}\n", series.string());
    io::write_dicom_series(tiff.string(), series.string(), {});
  }

  // The regions: seeded random positions on level 0, the same for both readers.
  std::mt19937_64 random(11);
  std::uniform_int_distribution<std::int64_t> position(0, options.size - options.tile_size);
  std::vector<cv::Point> regions;
  for (int i = 0; i < options.regions; ++i) {
    regions.emplace_back(static_cast<int>(position(random)), static_cast<int>(position(random)));
  }

  // The same pixels first.
  const std::size_t checked = std::min<std::size_t>(regions.size(), 64);
  bool identical = true;
  {
    const io::Slide a = io::Slide::open(tiff.string());
    const io::Slide b = io::Slide::open(series.string());
    for (std::size_t i = 0; i < checked; ++i) {
      const cv::Mat x = a.read_region(regions[i].x, regions[i].y, 0, options.tile_size, options.tile_size);
      const cv::Mat y = b.read_region(regions[i].x, regions[i].y, 0, options.tile_size, options.tile_size);
      identical = identical && cv::countNonZero(cv::Mat(x != y).reshape(1)) == 0;
    }
  }

  const std::string load_before = load_average();
  Timing best_tiff;
  Timing best_dicom;
  std::uint64_t sum_tiff = 0;
  std::uint64_t sum_dicom = 0;
  for (int round = 0; round < options.rounds; ++round) {
    // TIFF first in even rounds, DICOM first in odd ones.
    for (int k = 0; k < 2; ++k) {
      const bool dicom = (round + k) % 2 == 1;
      const Timing t =
          read_all(dicom ? series.string() : tiff.string(), regions, options.tile_size, dicom ? sum_dicom : sum_tiff);
      Timing& best = dicom ? best_dicom : best_tiff;
      best.wall = std::min(best.wall, t.wall);
      best.cpu = std::min(best.cpu, t.cpu);
    }
  }
  const std::string load_after = load_average();
  const double n = static_cast<double>(regions.size());
  const double ratio_wall = best_tiff.wall / best_dicom.wall;
  const double ratio_cpu = best_tiff.cpu / best_dicom.cpu;
  std::cout << fmt::format(
      "\n{} level-0 regions of {}x{} px at seeded random positions of a {}x{} slide ({}-px JPEG tiles), one thread,\n"
      "best of {} alternated rounds, each on a freshly opened slide; load average {} at the start, {} at the end\n"
      "pixels of the first {} regions identical on both paths: {}\n\n",
      regions.size(), options.tile_size, options.tile_size, options.size, options.size, options.tile_size,
      options.rounds, load_before, load_after, checked, identical ? "yes" : "NO");
  std::cout << fmt::format("{:<34} {:>9} {:>11} {:>9} {:>11}\n", "reader", "wall s", "regions/s", "CPU s", "regions/s");
  std::cout << fmt::format("{:<34} {:>9.3f} {:>11.0f} {:>9.3f} {:>11.0f}\n", "direct TIFF (libtiff + libjpeg)",
                           best_tiff.wall, n / best_tiff.wall, best_tiff.cpu, n / best_tiff.cpu);
  std::cout << fmt::format("{:<34} {:>9.3f} {:>11.0f} {:>9.3f} {:>11.0f}\n", "DICOM (DCMTK + libjpeg)", best_dicom.wall,
                           n / best_dicom.wall, best_dicom.cpu, n / best_dicom.cpu);
  std::cout << fmt::format("DICOM / TIFF speed: {:.3f} by wall time, {:.3f} by CPU time\n", ratio_wall, ratio_cpu);
  if (sum_tiff != sum_dicom) std::cout << "warning: the two readers' checksums differ\n";
  if (!options.json_file.empty()) {
    const nlohmann::json j = {{"regions", regions.size()},
                              {"region_side", options.tile_size},
                              {"slide_side", options.size},
                              {"rounds", options.rounds},
                              {"identical_pixels", identical},
                              {"tiff", {{"wall_s", best_tiff.wall}, {"cpu_s", best_tiff.cpu}}},
                              {"dicom", {{"wall_s", best_dicom.wall}, {"cpu_s", best_dicom.cpu}}},
                              {"dicom_over_tiff_wall", ratio_wall},
                              {"dicom_over_tiff_cpu", ratio_cpu},
                              {"load_average", {{"start", load_before}, {"end", load_after}}}};
    core::write_file_atomic(options.json_file, j.dump(2) + "\n");
  }
  return identical ? core::exit_ok : core::exit_internal;
}

}  // namespace tessera::bench
