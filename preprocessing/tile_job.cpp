// The tile job: preprocessing/tile_job.h says what it does; the resume records are preprocessing/tile_resume.h.
#include "preprocessing/tile_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/hash.h"
#include "core/output_dir.h"
#include "core/partition.h"
#include "core/progress.h"
#include "core/signals.h"
#include "core/threads.h"
#include "io/annotations.h"
#include "io/dataset.h"
#include "io/image.h"
#include "io/provenance.h"
#include "io/shard.h"
#include "io/slide.h"
#include "io/slide_list.h"
#include "preprocessing/qc.h"
#include "preprocessing/stain_norm.h"
#include "preprocessing/tile_resume.h"
#include "preprocessing/tiling.h"
#include "preprocessing/tissue.h"

namespace tessera::prep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The annotation file next to a slide: <stem>.xml, else <stem>.geojson, else none.
std::string sibling_annotation(const std::string& slide_path) {
  for (const char* ext : {".xml", ".geojson", ".json"}) {
    fs::path candidate = fs::path(slide_path).replace_extension(ext);
    if (fs::exists(candidate)) return candidate.string();
  }
  return "";
}

// dataset.csv (io/dataset.h): the slide file is needed on every row; the label is optional here (a slide with none
// is tiled without the tumour-annotation check).
// The rows of a dataset.csv in `splits` (every row when none are given); ConfigError naming input.splits when the
// file has no split column to select by.
std::vector<SlideInput> read_csv_inputs(const std::string& csv_path, const std::vector<std::string>& splits,
                                        const core::Config& config) {
  auto dataset = io::read_dataset_csv(csv_path, {.slide = true, .label = false});
  if (!splits.empty() && !dataset.has_column("split")) {
    throw core::ConfigError(
        fmt::format("splits {} were asked for, but {} has no 'split' column", fmt::join(splits, ", "), csv_path),
        config.source(), 0, "input.splits");
  }
  std::vector<SlideInput> inputs;
  for (auto& row : dataset.rows) {
    if (!splits.empty() && std::find(splits.begin(), splits.end(), row.split) == splits.end()) continue;
    inputs.push_back({std::move(row.id), std::move(row.slide), io::to_string(row.label), std::move(row.split),
                      std::move(row.annotation), row.mpp.value_or(0.0)});
  }
  return inputs;
}

}  // namespace

// A rerun with the same hash may keep what is finished.
std::string tile_job_hash(const core::Config& config, const StainReference& reference,
                          const std::vector<SlideInput>& inputs) {
  // tile.threads changes how fast the job runs, never what it writes: a rerun with another count keeps what is done.
  core::Config hashed = config;
  hashed.set_value("tile.threads", "0", "the job hash");
  std::string text = hashed.to_yaml() + stain_reference_digest(reference);
  for (const auto& s : inputs) {
    struct stat st {};
    const bool ok = ::stat(s.path.c_str(), &st) == 0;
    text +=
        fmt::format("\n{}|{}|{}|{}|{}", s.path, ok ? st.st_size : -1, ok ? st.st_mtim.tv_sec : 0, s.annotation, s.mpp);
    if (!s.annotation.empty() && ::stat(s.annotation.c_str(), &st) == 0) {
      text += fmt::format("|{}|{}", st.st_size, st.st_mtim.tv_sec);
    }
  }
  return fmt::format("{:016x}", core::fnv1a(text));
}

namespace {

struct TileSettings {
  GridOptions grid;
  TissueOptions tissue;
  io::AnnotationClasses classes;
  std::int64_t max_tiles = 0;
  double max_normal_per_tumour = 0.0;
  std::uint64_t seed = 1;
  double assume_mpp = 0.0;
  int preview_size = 0;
  fs::path previews;
  std::optional<QcOptions> qc;       // none: QC off
  bool keep_artefact_tiles = false;  // tile.artefact_tiles: keep (tiles over qc.max_fraction stay, marked)
};

// One slide's plan as every rank needs it for extraction.
struct PlanResult {
  SlideInput input;
  std::string error;  // non-empty: the slide failed in planning
  double footprint = 0.0;
  double slide_mpp = 0.0;
  double assume_mpp = 0.0;  // the mpp to open the slide with (override or job default)
  bool synthetic = false;   // made by tessera synth (io/provenance.h): the manifest records its origin
  std::map<std::string, std::int64_t> qc_dropped;  // tiles QC dropped, by artefact class
  std::map<std::string, std::int64_t> qc_kept;     // tiles over qc.max_fraction kept (tile.artefact_tiles: keep)
  std::vector<PlannedTile> tiles;
  // The slide as planning opened it, when it is read directly from its TIFF tiles: extraction reopens it from this
  // (io::Slide::reopen), without OpenSlide and without reading every TIFF directory again.
  std::optional<io::SlideLayout> layout;
};

json layout_json(const io::SlideLayout& l) {
  json levels = json::array();
  for (const auto& v : l.levels) levels.push_back({v.width, v.height, v.downsample, v.tile_width, v.tile_height});
  json tiff = json::array();
  for (const auto& t : l.tiff) {
    tiff.push_back({t.directory, t.width, t.height, t.tile_width, t.tile_height, t.compression, t.jpeg_ycbcr});
  }
  return {{"path", l.path},
          {"vendor", l.vendor},
          {"levels", levels},
          {"mpp_x", l.mpp_x},
          {"mpp_y", l.mpp_y},
          {"mpp_source", static_cast<int>(l.mpp_source)},
          {"tiff", tiff},
          {"blank", l.missing_tiles_blank},
          {"file_size", l.file_size},
          {"file_mtime_ns", l.file_mtime_ns}};
}

io::SlideLayout layout_from(const json& j) {
  io::SlideLayout l;
  l.path = j["path"];
  l.vendor = j["vendor"];
  for (const auto& v : j["levels"]) l.levels.push_back({v[0], v[1], v[2], v[3], v[4]});
  for (const auto& t : j["tiff"]) l.tiff.push_back({t[0], t[1], t[2], t[3], t[4], t[5], t[6]});
  l.mpp_x = j["mpp_x"];
  l.mpp_y = j["mpp_y"];
  l.mpp_source = static_cast<io::MppSource>(j["mpp_source"].get<int>());
  l.missing_tiles_blank = j["blank"];
  l.file_size = j["file_size"];
  l.file_mtime_ns = j["file_mtime_ns"];
  return l;
}

std::string serialize(const PlanResult& p) {
  json j = {{"id", p.input.id},
            {"path", p.input.path},
            {"label", p.input.label},
            {"split", p.input.split},
            {"annotation", p.input.annotation},
            {"mpp", p.input.mpp},
            {"error", p.error},
            {"footprint", p.footprint},
            {"slide_mpp", p.slide_mpp},
            {"assume_mpp", p.assume_mpp},
            {"synthetic", p.synthetic},
            {"qc_dropped", p.qc_dropped},
            {"qc_kept", p.qc_kept}};
  if (p.layout) j["layout"] = layout_json(*p.layout);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(p.tiles.data());
  j["tiles"] = json::binary(std::vector<std::uint8_t>(bytes, bytes + p.tiles.size() * sizeof(PlannedTile)));
  const auto packed = json::to_cbor(j);
  return std::string(packed.begin(), packed.end());
}

std::vector<PlanResult> deserialize(const std::string& bytes) {
  std::vector<PlanResult> out;
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    // Each rank's buffer is a sequence of [u64 length][cbor] records.
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data() + pos, sizeof n);
    pos += sizeof n;
    const json j = json::from_cbor(bytes.begin() + static_cast<std::ptrdiff_t>(pos),
                                   bytes.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    PlanResult p;
    p.input = {j["id"], j["path"], j["label"], j["split"], j["annotation"], j["mpp"]};
    p.error = j["error"];
    p.footprint = j["footprint"];
    p.slide_mpp = j["slide_mpp"];
    p.assume_mpp = j["assume_mpp"];
    p.synthetic = j["synthetic"];
    p.qc_dropped = j["qc_dropped"].get<std::map<std::string, std::int64_t>>();
    p.qc_kept = j["qc_kept"].get<std::map<std::string, std::int64_t>>();
    if (j.contains("layout")) p.layout = layout_from(j["layout"]);
    const auto& blob = j["tiles"].get_binary();
    p.tiles.resize(blob.size() / sizeof(PlannedTile));
    if (!p.tiles.empty()) std::memcpy(p.tiles.data(), blob.data(), p.tiles.size() * sizeof(PlannedTile));
    out.push_back(std::move(p));
  }
  return out;
}

void append_record(std::string& buffer, const std::string& record) {
  const std::uint64_t n = record.size();
  buffer.append(reinterpret_cast<const char*>(&n), sizeof n);
  buffer += record;
}

// Quality control on the slide: every planned tile gets its artefact bits (io::kShardArtefact*: class k over
// options.max_fraction of the tile, and kShardArtefactExcluded when the excluded artefacts together are), and a tile
// over max_fraction in excluded artefacts its class covering most of it (worst_artefact). Unless `keep`, those tiles
// are dropped, counted by that class. A slide-level flag is a warning, or with refuse_flagged an InputError naming
// the slide. Fills `qc` with QC's result (for the preview); returns the counts of dropped tiles.
std::map<std::string, std::int64_t> mark_artefact_tiles(const io::Slide& slide, SlidePlan& plan,
                                                        const QcOptions& options, bool keep, QcResult& qc) {
  qc = run_qc(slide, options);
  for (const auto& flag : qc.flags) {
    if (options.refuse_flagged) {
      throw core::InputError("quality control flags the slide (qc.refuse_flagged): " + flag, slide.path());
    }
    spdlog::warn("{}: quality control: {}", slide.path(), flag);
  }
  std::map<std::string, std::int64_t> dropped;
  if (plan.tiles.empty()) return dropped;
  // The tiles lie on a grid: its distinct origins along x and y.
  std::vector<std::int64_t> xs, ys;
  for (const auto& t : plan.tiles) {
    xs.push_back(t.x);
    ys.push_back(t.y);
  }
  for (auto* v : {&xs, &ys}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const auto fractions_of = [&](const cv::Mat1b& mask) {
    TissueMask m = qc.tissue;
    m.mask = mask;
    return tissue_fractions(m, xs, ys, plan.footprint);
  };
  const std::vector<double> excluded = fractions_of(qc.excluded());
  std::vector<std::pair<int, std::vector<double>>> by_class;
  for (const Artefact a : all_artefacts()) {
    const auto i = static_cast<std::size_t>(index(a));
    if (cv::countNonZero(qc.masks[i]) > 0) by_class.emplace_back(index(a), fractions_of(qc.masks[i]));
  }
  std::vector<PlannedTile> kept;
  kept.reserve(plan.tiles.size());
  for (auto t : plan.tiles) {
    const auto col = static_cast<std::size_t>(std::lower_bound(xs.begin(), xs.end(), t.x) - xs.begin());
    const auto row = static_cast<std::size_t>(std::lower_bound(ys.begin(), ys.end(), t.y) - ys.begin());
    const std::size_t cell = row * xs.size() + col;
    t.artefacts = 0;
    t.worst_artefact = -1;
    for (const auto& [k, fractions] : by_class) {
      if (fractions[cell] > options.max_fraction) t.artefacts |= static_cast<std::uint16_t>(1u << k);
    }
    if (excluded[cell] > options.max_fraction) {
      t.artefacts |= io::kShardArtefactExcluded;
      // The class covering most of the tile; blur when no class has a mask here (severe blur is the only excluded
      // area outside every excluding class's mask).
      t.worst_artefact = static_cast<std::int8_t>(index(Artefact::blur));
      double most = -1.0;
      for (const auto& [k, fractions] : by_class) {
        if (fractions[cell] > most) {
          most = fractions[cell];
          t.worst_artefact = static_cast<std::int8_t>(k);
        }
      }
      if (!keep) {
        ++dropped[to_string(all_artefacts()[static_cast<std::size_t>(t.worst_artefact)])];
        continue;
      }
    }
    kept.push_back(t);
  }
  plan.tiles = std::move(kept);
  return dropped;
}

// The tiles of the plan kept over qc.max_fraction in excluded artefacts (tile.artefact_tiles: keep), by class.
std::map<std::string, std::int64_t> count_kept_artefact_tiles(const SlidePlan& plan) {
  std::map<std::string, std::int64_t> kept;
  for (const auto& t : plan.tiles) {
    if (t.worst_artefact >= 0) ++kept[to_string(all_artefacts()[static_cast<std::size_t>(t.worst_artefact)])];
  }
  return kept;
}

PlanResult plan_one(const SlideInput& input, const TileSettings& settings) {
  PlanResult result;
  result.input = input;
  result.assume_mpp = input.mpp > 0 ? input.mpp : settings.assume_mpp;
  try {
    io::SlideOpenOptions open_options;
    open_options.assume_mpp = result.assume_mpp;
    const auto slide = io::Slide::open(input.path, open_options);
    result.synthetic = slide.synthetic();
    const bool tumour_slide = input.label == io::to_string(io::SlideLabel::tumour);
    std::vector<io::Annotation> annotations;
    if (!input.annotation.empty()) {
      // Clipped to the slide; on a tumour slide, a file that labels no tumour area fails the slide (it would
      // otherwise be tiled as all normal).
      annotations = io::prepare_annotations(
          io::read_annotations(input.annotation), settings.classes,
          {input.annotation, "labels.tumour_classes", tumour_slide, slide.width(), slide.height()});
    } else if (tumour_slide) {
      throw core::InputError("the slide is labelled tumour but has no annotation file", input.path);
    }
    const auto tissue = detect_tissue(slide, settings.tissue);
    auto plan = plan_slide(slide, tissue, annotations, settings.classes, settings.grid);
    std::optional<QcResult> qc;
    if (settings.qc) {
      qc.emplace();
      result.qc_dropped = mark_artefact_tiles(slide, plan, *settings.qc, settings.keep_artefact_tiles, *qc);
    }
    cap_tiles(plan, settings.max_tiles, settings.max_normal_per_tumour, settings.seed ^ core::fnv1a(input.id));
    result.qc_kept = count_kept_artefact_tiles(plan);
    if (plan.tiles.empty()) {
      spdlog::warn("{}: no tiles ({:.2f} mm2 of tissue at min fraction {:g}); the slide is skipped", input.path,
                   tissue.tissue_area_mm2(), settings.grid.min_tissue);
    }
    if (settings.preview_size > 0) {
      std::vector<io::Annotation> tumour, exclusion;
      io::split_annotations(annotations, settings.classes, tumour, exclusion);
      io::write_png((settings.previews / (input.id + ".png")).string(),
                    render_plan_preview(slide, tissue, plan, tumour, settings.preview_size, qc ? &*qc : nullptr));
    }
    result.footprint = plan.footprint;
    result.slide_mpp = plan.slide_mpp;
    result.layout = slide.layout();
    result.tiles = std::move(plan.tiles);
  } catch (const core::Error& e) {
    if (e.kind() != core::ErrorKind::input) throw;
    result.error = e.what();
    result.tiles.clear();
    spdlog::error("{}", e.what());
  }
  return result;
}

// A tile of the job, in slide order.
struct JobTile {
  std::uint32_t slide = 0;  // index into the plans
  std::uint32_t tile = 0;   // index into that plan's tiles
};

// A finished shard as the file system sees it (size, modification time, inode): the state file records it when
// the manifest is written, so that a shard replaced or rewritten since is noticed without reading its pixels.
json file_identity(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return nullptr;
  return {{"size", st.st_size},
          {"mtime", fmt::format("{}.{:09d}", st.st_mtim.tv_sec, st.st_mtim.tv_nsec)},
          {"inode", st.st_ino}};
}

// "Up to date" needs the state file, the manifest and the shards to agree: the manifest was written by this job
// (its config_hash), and every shard it lists is there, is the file the state file recorded when the manifest was
// written and has the tiles the manifest lists. Says why not in the log.
bool manifest_matches(const fs::path& out, const fs::path& manifest_path, const std::string& hash, const json& state) {
  try {
    const json recorded = state.value("shards", json::object());
    const auto manifest = io::read_manifest(manifest_path.string());
    if (manifest.config_hash != hash) {
      spdlog::warn("{} was written by another job (config_hash {}, this job {}); rebuilding", manifest_path.string(),
                   manifest.config_hash, hash);
      return false;
    }
    if (recorded.size() != manifest.shards.size()) {
      spdlog::warn("{} lists {} shards, the state file {}; rebuilding", manifest_path.string(), manifest.shards.size(),
                   recorded.size());
      return false;
    }
    for (const auto& entry : manifest.shards) {
      if (!recorded.contains(entry.file) || recorded[entry.file] != file_identity(out / entry.file)) {
        spdlog::warn("{}: not the file this job finished (replaced or changed since); rebuilding",
                     (out / entry.file).string());
        return false;
      }
      const auto shard = io::ShardFile::open((out / entry.file).string());
      if (shard.size() != entry.tiles || shard.slides() != entry.slides) {
        spdlog::warn("{}: {} tiles of {} slide(s), the manifest lists {} of {}; rebuilding", shard.path(), shard.size(),
                     shard.slides().size(), entry.tiles, entry.slides.size());
        return false;
      }
    }
    return true;
  } catch (const core::Error& e) {
    spdlog::warn("{}; rebuilding", e.what());
    return false;
  }
}

std::int64_t rewrite_without(const std::string& from, const std::string& to, const std::set<std::string>& failed,
                             const std::set<std::int64_t>& dropped = {});

// Damaged tiles skipped on one slide (tile.on_corrupt_tile: skip).
struct CorruptTiles {
  std::int64_t count = 0;
  std::string first;  // the first one's error
};

class Extractor {
 public:
  // `threads`: how many threads read a batch's tiles on slides read directly (io::Slide's direct TIFF and DICOM
  // paths, whose reads are thread-safe); the shard's HDF5 writes run on one more, overlapping the reads.
  Extractor(const std::vector<PlanResult>& plans, const io::ShardAttributes& attributes,
            const StainNormalizer* normalizer, int write_batch, bool skip_corrupt, int threads)
      : plans_(plans),
        attributes_(attributes),
        normalizer_(normalizer),
        write_batch_(write_batch),
        skip_corrupt_(skip_corrupt),
        threads_(std::max(1, threads)) {}

  // Damaged tiles skipped so far, by slide id.
  const std::map<std::string, CorruptTiles>& corrupt() const { return corrupt_; }

  // Writes one shard of `tiles` to `path`; slides whose tiles cannot be read are added to `failed` (their
  // tiles are left blank here; the caller rewrites the shard without them). With skip_corrupt, a tile whose
  // pixels are damaged (CorruptTileError) is left out instead and counted in corrupt(); its slide goes on. Such a
  // shard holds fewer tiles than planned (none at all: no file; a rerun of the job then tries it again), and its
  // record's tile count (the planned one) no longer matches it: a rerun extracts it again rather than keep it.
  // Returns the checksum of the pixels the shard holds and their tile count.
  // Tiles are read in batches of write_batch; each batch is written (and checksummed) on a second thread while
  // the next is read, so the result is that of reading and writing one tile after the other: the same pixels,
  // the same first error per slide, in tile order.
  struct Written {
    std::string checksum;
    std::int64_t tiles = 0;
  };
  Written write_shard(const std::string& path, const std::vector<JobTile>& tiles,
                      std::map<std::string, std::string>& failed, core::Progress& progress) {
    std::vector<std::string> slide_ids;
    std::map<std::uint32_t, std::uint32_t> local_index;
    for (const auto& t : tiles) {
      if (local_index.emplace(t.slide, static_cast<std::uint32_t>(slide_ids.size())).second) {
        slide_ids.push_back(plans_[t.slide].input.id);
      }
    }
    current_shard_ = std::filesystem::path(path).filename().string();
    io::ShardWriter writer(path, attributes_, static_cast<std::int64_t>(tiles.size()), slide_ids);
    const int t_size = attributes_.tile_size;
    const std::size_t tile_bytes = static_cast<std::size_t>(t_size) * t_size * 3;
    PixelChecksum checksum;
    std::set<std::int64_t> dropped;  // tiles of this shard with damaged pixels (skip_corrupt)
    // Two batches: one being read, one being written. `writing` is declared last: its destructor waits for the
    // write in flight before the writer, the batches or the checksum go.
    struct Batch {
      std::int64_t first = 0;
      std::vector<io::ShardTileRecord> records;
      io::ImageBuffer images;  // aligned: the writer hands it to the disk directly
      std::vector<char> kept;  // per tile: its pixels go into the checksum (not dropped as damaged)
    };
    std::array<Batch, 2> batches;
    int filling = 0;
    std::int64_t written_count = 0;  // tiles of the batch in flight
    std::future<void> writing;
    const auto wait_for_write = [&] {
      if (!writing.valid()) return;
      writing.get();
      progress.advance(written_count);
      written_count = 0;
    };
    for (std::size_t begin = 0; begin < tiles.size(); begin += static_cast<std::size_t>(write_batch_)) {
      const std::size_t end = std::min(tiles.size(), begin + static_cast<std::size_t>(write_batch_));
      Batch& batch = batches[static_cast<std::size_t>(filling)];
      batch.first = static_cast<std::int64_t>(begin);
      batch.records.clear();
      batch.images.resize((end - begin) * tile_bytes);  // read_batch writes every tile (white where none is read)
      batch.kept.assign(end - begin, 1);
      read_batch(tiles, begin, end, batch.images.data(), failed);
      for (std::size_t k = begin; k < end; ++k) {
        const auto& t = tiles[k];
        const auto& planned = plans_[t.slide].tiles[t.tile];
        batch.records.push_back(
            {planned.label, planned.tumour_fraction, planned.x, planned.y, local_index[t.slide], planned.artefacts});
        if (read_dropped_[k - begin] != 0) {
          dropped.insert(static_cast<std::int64_t>(k));
          batch.kept[k - begin] = 0;
        }
      }
      wait_for_write();
      written_count = static_cast<std::int64_t>(end - begin);
      writing = std::async(std::launch::async, [&writer, &checksum, &batch, tile_bytes] {
        writer.write(batch.first, batch.records, batch.images.data());
        for (std::size_t j = 0; j < batch.records.size(); ++j) {  // the pixels of the tiles the shard keeps
          if (batch.kept[j] != 0) checksum.add(batch.images.data() + j * tile_bytes, tile_bytes);
        }
      });
      filling = 1 - filling;
    }
    wait_for_write();
    writer.finish();
    if (!dropped.empty()) {
      // Written whole (the writer wants its tile count up front), then copied without the damaged tiles. The
      // ".unchecked" ending: a killed run's leftover is removed by the next.
      const std::string whole = path + ".whole.unchecked";
      std::filesystem::rename(path, whole);
      rewrite_without(whole, path, {}, dropped);
      std::filesystem::remove(whole);
    }
    return {checksum.hex(), static_cast<std::int64_t>(tiles.size() - dropped.size())};
  }

 private:
  // What reading one tile gave: nothing (pixels in place), or the error a core::Error of kind input carried.
  struct ReadError {
    std::string what;
    bool corrupt = false;
  };
  // The outcome of a read that threw `error`: an input error becomes the tile's ReadError; anything else (an
  // internal error, a failing system) is thrown again, to end the job.
  static ReadError read_error(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      return {e.what(), dynamic_cast<const core::CorruptTileError*>(&e) != nullptr};
    }
  }

  // Reads tiles [begin, end) of `tiles` into `images` (tile_bytes each, white where nothing is read) and records
  // in read_dropped_ which were left out as damaged. Tiles of slides read directly are read on threads_ threads
  // first, each catching what its read throws; then, in tile order, each tile's outcome is taken as a sequential read
  // would: the others read through the slide's window, a slide's first failure recorded in `failed`, and its later
  // tiles left white whatever their reads gave (an internal error on a tile after its slide's failure ends nothing, as
  // one thread reading in order would never have read it). A slide that cannot be opened fails at its first tile,
  // opened once.
  void read_batch(const std::vector<JobTile>& tiles, std::size_t begin, std::size_t end, std::uint8_t* images,
                  std::map<std::string, std::string>& failed) {
    const int t_size = attributes_.tile_size;
    const std::size_t tile_bytes = static_cast<std::size_t>(t_size) * t_size * 3;
    const std::size_t n = end - begin;
    read_dropped_.assign(n, 0);
    std::vector<std::exception_ptr> errors(n);  // per tile: what its read threw
    std::vector<char> parallel(n, 0);           // read below, on the threads
    std::vector<int> injected(n, 0);            // fault point tile.read: the errno its read fails with
    while (!opened_.empty() && opened_.begin()->first < tiles[begin].slide) close_slide(opened_.begin()->first);
    for (std::size_t k = begin; k < end; ++k) {
      // SIGTERM: this shard is left unfinished (".unchecked"; the rerun removes it and extracts it again).
      core::fault::at("tile.tile");
      core::throw_if_terminated(current_shard_);
      const auto& plan = plans_[tiles[k].slide];
      if (failed.contains(plan.input.id)) continue;
      const io::Slide* s = open(tiles[k].slide, failed);
      if (s == nullptr) continue;  // failed now
      // Fault point "tile.read" (core/fault.h): each tile to be read, in tile order whatever the thread count; do=eio
      // makes its read fail as a failing disk would, which is not the slide's fault and ends the job.
      injected[k - begin] = core::fault::error_at("tile.read");
      parallel[k - begin] = s->reads_tiff_directly() || s->is_dicom() ? 1 : 0;
    }
    const auto read_tile = [&](std::size_t j, const auto& read) {
      try {
        if (injected[j] != 0) {
          const auto& t = tiles[begin + j];
          throw core::InternalError(fmt::format("{}: reading tile ({}, {}) failed: {} (fault injected at tile.read)",
                                                plans_[t.slide].input.path, plans_[t.slide].tiles[t.tile].x,
                                                plans_[t.slide].tiles[t.tile].y, std::strerror(injected[j])));
        }
        read();
      } catch (...) {
        errors[j] = std::current_exception();
      }
    };
    // Each thread claims runs of neighbouring tiles, which share most of their stored tiles: each stored tile is then
    // mostly needed by one thread (a thread that needs one another thread is decoding waits for it: io/tile_cache.h).
    constexpr std::size_t kClaimedTiles = 8;
    std::atomic<std::size_t> next{0};
    core::run_on_threads(threads_, [&](int) {
      for (std::size_t first = next.fetch_add(kClaimedTiles); first < n; first = next.fetch_add(kClaimedTiles)) {
        for (std::size_t j = first; j < std::min(n, first + kClaimedTiles); ++j) {
          if (parallel[j] == 0) continue;
          const auto& t = tiles[begin + j];
          const auto& planned = plans_[t.slide].tiles[t.tile];
          read_tile(j, [&] {
            std::uint8_t* pixels = images + j * tile_bytes;
            const cv::Mat into(t_size, t_size, CV_8UC3, pixels);  // read straight into the batch
            copy_tile(opened_.at(t.slide)->read_at_mpp(planned.x, planned.y, t_size, t_size, attributes_.mpp, into),
                      pixels);
          });
        }
      }
    });
    for (std::size_t j = 0; j < n; ++j) {
      const auto& t = tiles[begin + j];
      const auto& plan = plans_[t.slide];
      std::uint8_t* pixels = images + j * tile_bytes;
      if (failed.contains(plan.input.id)) {  // failed at an earlier tile: this one stays blank
        std::fill(pixels, pixels + tile_bytes, std::uint8_t{255});
        continue;
      }
      if (!errors[j] && parallel[j] == 0) {
        read_tile(j,
                  [&] { copy_tile(read_through_window(t.slide, plan.tiles[t.tile].x, plan.tiles[t.tile].y), pixels); });
      }
      if (!errors[j]) continue;
      const ReadError error = read_error(errors[j]);
      std::fill(pixels, pixels + tile_bytes, std::uint8_t{255});
      if (skip_corrupt_ && error.corrupt) {
        read_dropped_[j] = 1;
        auto& corrupt = corrupt_[plan.input.id];
        if (corrupt.count++ == 0) corrupt.first = error.what;
      } else {
        failed[plan.input.id] = error.what;
        spdlog::error("{}", error.what);
        close_slide(t.slide);
      }
    }
  }

  // The tile's pixels, stain-normalized when asked, into `to` (tile_bytes), where they may be already.
  void copy_tile(cv::Mat rgb, std::uint8_t* to) const {
    if (normalizer_ != nullptr) normalizer_->apply(rgb);
    if (rgb.data == to) return;
    if (!rgb.isContinuous()) rgb = rgb.clone();
    std::memcpy(to, rgb.data, rgb.total() * rgb.elemSize());
  }

  // The slide of plan `index`, opened when first needed (read_batch closes those of earlier plans: tiles come in
  // slide order). Null when it cannot be opened: the slide's failure is then recorded in `failed` (its first, since
  // its tiles come after its opening), so it is never tried again.
  const io::Slide* open(std::uint32_t index, std::map<std::string, std::string>& failed) {
    if (const auto it = opened_.find(index); it != opened_.end()) return it->second.get();
    const auto& plan = plans_[index];
    try {
      // Fault point "tile.open" (core/fault.h): each slide opened to extract its tiles; do=eio makes the opening fail
      // as an unreadable file would.
      if (const int error = core::fault::error_at("tile.open"); error != 0) {
        throw core::InputError(fmt::format("cannot open: {} (fault injected at tile.open)", std::strerror(error)),
                               plan.input.path);
      }
      io::SlideOpenOptions options;
      options.assume_mpp = plan.assume_mpp;
      return opened_
          .emplace(index, std::make_unique<io::Slide>(plan.layout ? io::Slide::reopen(*plan.layout)
                                                                  : io::Slide::open(plan.input.path, options)))
          .first->second.get();
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      failed[plan.input.id] = e.what();
      spdlog::error("{}", e.what());
      return nullptr;
    }
  }
  void close_slide(std::uint32_t index) {
    if (window_slide_ == index) {
      window_.reset();
      damaged_window_.reset();
    }
    opened_.erase(index);
  }

  // Slides read through OpenSlide: one OpenSlide read covers the next kWindowTiles tiles of a row, and the tiles
  // are cut from it (exactly the pixels a per-tile read gives; OpenSlide's per-call cost dominates small tiles).
  // With skip_corrupt, the tiles of a window that holds damaged pixels are read one by one, so that only the
  // damaged ones fail.
  cv::Mat read_through_window(std::uint32_t index, std::int64_t x, std::int64_t y) {
    constexpr int kWindowTiles = 32;
    const io::Slide& s = *opened_.at(index);
    const int t_size = attributes_.tile_size;
    const double mpp = attributes_.mpp;
    if (window_slide_ != index) {
      window_.reset();
      damaged_window_.reset();
      window_slide_ = index;
    }
    if (!window_ || !window_->contains(x, y, t_size, t_size, mpp)) {
      window_.reset();
      const auto side0 = static_cast<std::int64_t>(std::ceil(t_size * mpp / s.mpp()));
      const auto width0 = std::min<std::int64_t>(side0 * kWindowTiles, std::max<std::int64_t>(side0, s.width() - x));
      if (damaged_window_ && damaged_window_->holds(x, y, side0)) return s.read_at_mpp(x, y, t_size, t_size, mpp);
      try {
        window_.emplace(s, x, y, width0, side0, mpp);
      } catch (const core::CorruptTileError&) {
        if (!skip_corrupt_) throw;
        damaged_window_ = Area{x, y, width0, side0};
        return s.read_at_mpp(x, y, t_size, t_size, mpp);
      }
      if (!window_->contains(x, y, t_size, t_size, mpp)) {  // rounding at odd resolutions: read this tile alone
        window_.reset();
        return s.read_at_mpp(x, y, t_size, t_size, mpp);
      }
    }
    return window_->read_at_mpp(x, y, t_size, t_size, mpp);
  }

  const std::vector<PlanResult>& plans_;
  io::ShardAttributes attributes_;
  const StainNormalizer* normalizer_;
  int write_batch_;
  bool skip_corrupt_;
  int threads_;
  std::string current_shard_;
  std::map<std::string, CorruptTiles> corrupt_;
  std::vector<char> read_dropped_;  // per tile of the batch just read: left out as damaged
  std::map<std::uint32_t, std::unique_ptr<io::Slide>> opened_;
  std::uint32_t window_slide_ = std::numeric_limits<std::uint32_t>::max();
  std::optional<io::SlideWindow> window_;
  // A level-0 rectangle.
  struct Area {
    std::int64_t x, y, width, height;
    bool holds(std::int64_t ax, std::int64_t ay, std::int64_t side) const {
      return ax >= x && ay >= y && ax + side <= x + width && ay + side <= y + height;
    }
  };
  std::optional<Area> damaged_window_;  // level-0 area of the last window read that hit damaged pixels
};

// Rewrites the shard at `from` into `to` without the tiles of `failed` slides and the `dropped` tiles (indices in
// `from`); returns the tiles kept (none: `to` is not written).
std::int64_t rewrite_without(const std::string& from, const std::string& to, const std::set<std::string>& failed,
                             const std::set<std::int64_t>& dropped) {
  const auto shard = io::ShardFile::open(from);
  std::vector<std::string> slides;
  std::map<std::uint32_t, std::uint32_t> remap;
  for (std::uint32_t i = 0; i < shard.slides().size(); ++i) {
    if (!failed.contains(shard.slides()[i])) {
      remap[i] = static_cast<std::uint32_t>(slides.size());
      slides.push_back(shard.slides()[i]);
    }
  }
  std::vector<std::int64_t> keep;
  for (std::int64_t i = 0; i < shard.size(); ++i) {
    if (remap.contains(shard.slide_indices()[static_cast<std::size_t>(i)]) && !dropped.contains(i)) keep.push_back(i);
  }
  if (keep.empty()) return 0;
  io::ShardWriter writer(to, shard.attributes(), static_cast<std::int64_t>(keep.size()), slides);
  std::vector<std::uint8_t> image(shard.tile_bytes());
  for (std::size_t k = 0; k < keep.size(); ++k) {
    const auto i = static_cast<std::size_t>(keep[k]);
    shard.read_images(keep[k], 1, image.data());
    const io::ShardTileRecord record{shard.labels()[i],         shard.tumor_fractions()[i],      shard.coords()[2 * i],
                                     shard.coords()[2 * i + 1], remap[shard.slide_indices()[i]], shard.artefacts()[i]};
    writer.write(static_cast<std::int64_t>(k), {record}, image.data());
  }
  writer.finish();
  return static_cast<std::int64_t>(keep.size());
}

}  // namespace

const core::Schema& tile_schema() {
  static const core::Schema instance = [] {
    core::Schema schema;
    io::declare_input_keys(schema)
        .string("output", "data/shards", "Folder for manifest.json and shard-NNNNN.h5")
        .integer("tile.size", 256, "Tile side in pixels at tile.mpp", 16, 4096)
        .number("tile.mpp", 0.5, "Target resolution in um/px (tiles are resampled to it from the best level)", 0.05, 64)
        .integer("tile.stride", 0, "Pixels (at tile.mpp) between tile origins; 0 = tile.size (stride = size - overlap)",
                 0, 4096)
        .string("tile.on_corrupt_tile", "fail",
                "A tile whose pixels cannot be decoded (damaged file): fail the slide, or skip the tile and count it "
                "in the manifest",
                {"fail", "skip"})
        .string("tile.artefact_tiles", "drop",
                "Tiles with more than qc.max_fraction of their area in excluded artefacts: drop them, or keep them "
                "(e.g. as hard negatives) with their artefact bits in the shard's 'artefacts' dataset",
                {"drop", "keep"})
        .number("labels.tumour_threshold", 0.5, "A tile is tumour when its annotated tumour fraction is at least this",
                0.0001, 1)
        .string("labels.ambiguous", "drop", "Tiles with 0 < tumour fraction < threshold: drop, or keep as normal",
                {"drop", "keep"})
        .string_list("labels.tumour_classes", {"_0", "_1", "Tumor", "Tumour", "tumor", "metastases"},
                     "ASAP groups / QuPath classes that mark tumour ('*' at the end matches any suffix)")
        .string_list("labels.exclusion_classes", {"_2", "Exclusion", "Ignore*"},
                     "Groups/classes that mark non-tumour areas inside tumour annotations")
        .integer("sampling.max_tiles_per_slide", 0, "Keep at most this many tiles per slide (0 = all)", 0, 1e9)
        .number("sampling.max_normal_per_tumour", 0.0,
                "On slides with tumour, keep at most this many normal tiles per tumour tile (0 = all)", 0, 1e6)
        .integer("sampling.seed", 1, "Seed of the tile sampling", 0, 9.0e15)
        .string("stain.method", "none", "Stain normalization", {"none", "reinhard", "macenko"})
        .string("stain.reference", "", "Reference image for the stain target ('' = Tessera's built-in H&E target)")
        .integer("shards.tiles_per_shard", 4096, "Tiles per shard file", 1, 1e7)
        .integer("shards.write_batch", 64, "Tiles written to HDF5 per call", 1, 65536)
        .integer("tile.threads", 0,
                 "Threads per rank that plan slides and read tiles; the HDF5 writes take one more (0 = the cores "
                 "this rank may use)",
                 0, 1024)
        .boolean("preview.enabled", false, "Write previews/<slide>.png (tissue mask and tile grid by label)")
        .integer("preview.size", 1024, "Longer side of the previews in pixels", 128, 8192);
    declare_tissue_keys(schema);
    declare_qc_keys(schema);
    return schema;
  }();
  return instance;
}

std::vector<SlideInput> resolve_tile_inputs(const core::Config& config) {
  std::vector<SlideInput> inputs;
  const std::string csv = io::input_csv(config);
  const auto& patterns = config.get_string_list("input.slides");
  const auto& splits = config.get_string_list("input.splits");
  if (csv.empty() && patterns.empty()) {
    throw core::ConfigError("give the slides as input.slides (files or globs) or as input.csv", config.source(), 0,
                            "input.slides");
  }
  if (!csv.empty()) {
    inputs = read_csv_inputs(csv, splits, config);
    if (inputs.empty() && !splits.empty()) {
      throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {}", csv, fmt::join(splits, ", ")),
                              config.source(), 0, "input.splits");
    }
  } else {
    if (!splits.empty()) {
      throw core::ConfigError("input.splits selects rows of input.csv; the slides here are files or globs",
                              config.source(), 0, "input.splits");
    }
    for (const auto& f : io::expand_slide_patterns(patterns, config.source(), "input.slides")) {
      inputs.push_back({io::slide_id_of(f), f, "", "", sibling_annotation(f), 0.0});
    }
  }
  std::vector<std::string> ids;
  for (const auto& s : inputs) ids.push_back(s.id);
  io::check_unique_slide_ids(ids, config.source(), csv.empty() ? "input.slides" : "input.csv",
                             "ids are file names without extension");
  if (inputs.empty()) throw core::ConfigError("no slides to tile", config.source(), 0, "input.slides");
  return inputs;
}

std::string shard_name(std::int64_t index) { return fmt::format("shard-{:05d}.h5", index); }

StainReference read_stain_reference(const core::Config& config) {
  const auto& path = config.get_string("stain.reference");
  if (path.empty() || parse_stain_method(config.get_string("stain.method")) == StainMethod::none) return {};
  return {path, io::read_file_bytes(path)};
}

std::unique_ptr<StainNormalizer> stain_target(const core::Config& config, const StainReference& reference) {
  const auto method = parse_stain_method(config.get_string("stain.method"));
  if (method == StainMethod::none) return nullptr;
  return reference.path.empty()
             ? make_stain_normalizer(method)
             : make_stain_normalizer(method, io::decode_rgb_image(reference.bytes, reference.path), reference.path);
}

std::string stain_reference_digest(const StainReference& reference) {
  if (reference.path.empty()) return "";
  return fmt::format("\nstain.reference bytes: {:016x}", core::fnv1a(reference.bytes.data(), reference.bytes.size()));
}

std::vector<std::vector<ShardSpan>> assign_shards(std::int64_t total, int ranks, std::int64_t per_shard) {
  std::vector<std::vector<ShardSpan>> spans(static_cast<std::size_t>(ranks));
  std::int64_t index = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::int64_t begin = core::part_begin(total, ranks, r);
    const std::int64_t end = core::part_begin(total, ranks, r + 1);
    for (std::int64_t first = begin; first < end; first += per_shard) {
      spans[static_cast<std::size_t>(r)].push_back({index++, first, std::min(per_shard, end - first)});
    }
  }
  return spans;
}

TileJobResult run_tile_job(const core::Config& config, const TileJobOptions& options, const core::Comm& world) {
  const fs::path out = config.get_string("output");
  const auto inputs = resolve_tile_inputs(config);
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "tile");

  TileSettings settings;
  settings.grid.tile_size = static_cast<int>(config.get_int("tile.size"));
  settings.grid.mpp = config.get_number("tile.mpp");
  settings.grid.stride = static_cast<int>(config.get_int("tile.stride"));
  const io::TissueSettings tissue = tissue_settings(config);
  settings.grid.min_tissue = tissue.min_fraction;
  settings.grid.tumour_threshold = config.get_number("labels.tumour_threshold");
  settings.grid.keep_ambiguous = config.get_string("labels.ambiguous") == "keep";
  settings.tissue.mask_mpp = tissue.mask_mpp;
  settings.tissue.reject_pen_marks = tissue.reject_pen_marks;
  if (qc_enabled(config)) settings.qc = qc_options(config);
  settings.keep_artefact_tiles = config.get_string("tile.artefact_tiles") == "keep";
  settings.classes.tumour = config.get_string_list("labels.tumour_classes");
  settings.classes.exclusion = config.get_string_list("labels.exclusion_classes");
  settings.max_tiles = config.get_int("sampling.max_tiles_per_slide");
  settings.max_normal_per_tumour = config.get_number("sampling.max_normal_per_tumour");
  settings.seed = static_cast<std::uint64_t>(config.get_int("sampling.seed"));
  settings.assume_mpp = config.get_number("input.assume_mpp");
  settings.preview_size = config.get_bool("preview.enabled") ? static_cast<int>(config.get_int("preview.size")) : 0;
  settings.previews = out / "previews";
  const bool preview_only = options.preview_only;
  int threads = static_cast<int>(config.get_int("tile.threads"));
  if (threads == 0) {
    threads = core::usable_cores();
  }

  // Stain target: fitted once (every rank reads the reference and fits the same numbers from it), from the very bytes
  // the job's hash covers.
  const auto reference = read_stain_reference(config);
  const auto normalizer = stain_target(config, reference);

  // Resume: same hash → keep finished shards; otherwise (or --force) start over.
  const std::string hash = tile_job_hash(config, reference, inputs);
  const fs::path state_path = out / ".tessera-tile-state.json";
  const fs::path manifest_path = out / "manifest.json";
  int up_to_date = 0;
  if (world.is_root()) {
    fs::create_directories(out);
    if (settings.preview_size > 0) fs::create_directories(settings.previews);
    bool same_job = false;
    json state;
    if (!options.force && fs::exists(state_path)) {
      try {
        std::ifstream in(state_path);
        state = json::parse(in);
        same_job = state.value("hash", "") == hash;
      } catch (const std::exception&) {
        same_job = false;  // an unreadable state file means: start over
      }
    }
    if (same_job && !preview_only && fs::exists(manifest_path)) {
      if (manifest_matches(out, manifest_path, hash, state)) {
        up_to_date = io::read_manifest(manifest_path.string()).failures.empty() ? 1 : 2;  // 2: with failed slides
      } else {
        same_job = false;  // what is there cannot be trusted as this job's: start over
      }
    }
    if (!same_job && !preview_only) {
      // A different job (or --force): nothing of the old one may be mistaken for this one's output.
      for (const auto& entry : fs::directory_iterator(out)) {
        const auto name = entry.path().filename().string();
        if (name.rfind("shard-", 0) == 0 || name == "manifest.json") fs::remove(entry.path());
      }
      fs::remove_all(out / kTileRecordFolder);
      core::write_file_atomic(state_path.string(), json({{"hash", hash}}).dump() + "\n");
    }
    if (!preview_only) fs::create_directories(out / kTileRecordFolder);
    // Half-written files of a killed run are never complete: remove them. Finished (unchecked) shards stay for
    // the extraction below to verify and keep.
    for (const fs::path& folder : {out, out / kTileRecordFolder}) {
      if (!fs::is_directory(folder)) continue;
      for (const auto& entry : fs::directory_iterator(folder)) {
        if (entry.path().filename().string().find(".tmp-") != std::string::npos) fs::remove(entry.path());
      }
    }
  }
  world.broadcast(&up_to_date, sizeof up_to_date, 0);
  if (up_to_date) {
    if (world.is_root()) {
      spdlog::info("{} is up to date for this job (same config and slides); use --force to rebuild",
                   manifest_path.string());
      // The job as it stands had failures: say so again, and exit as it did (a slide whose failure was passing,
      // such as a permission since fixed, is tried again with --force).
      for (const auto& f : io::read_manifest(manifest_path.string()).failures) {
        spdlog::error("slide {} failed in that run: {}", f.slide, f.error);
      }
    }
    return {.up_to_date = true, .slides_failed = up_to_date == 2};
  }
  world.barrier();

  // Phase 1: plan, slides spread over ranks.
  std::string mine;
  {
    core::Progress progress(world, static_cast<std::int64_t>(inputs.size()), {.label = "plan", .unit = "slides"});
    // This rank's slides, planned on `threads` threads; the records are appended in input order.
    std::vector<std::size_t> my_inputs;
    for (std::size_t i = static_cast<std::size_t>(world.rank()); i < inputs.size();
         i += static_cast<std::size_t>(world.size())) {
      my_inputs.push_back(i);
    }
    std::vector<std::string> records(my_inputs.size());
    std::atomic<std::size_t> next{0};
    std::atomic<std::int64_t> planned{0};
    std::int64_t shown = 0;
    core::run_on_threads(threads, [&](int thread) {
      try {
        for (std::size_t k = next++; k < my_inputs.size(); k = next++) {
          if (core::stop_requested() == core::StopRequest::now) break;  // SIGTERM: the plans are not kept anyway
          records[k] = serialize(plan_one(inputs[my_inputs[k]], settings));
          ++planned;
          if (thread == 0) {  // the progress display is this thread's (it may talk MPI)
            const std::int64_t done = planned;
            progress.advance(done - shown);
            shown = done;
          }
        }
      } catch (...) {
        next = my_inputs.size();  // the others stop too
        throw;
      }
    });
    progress.advance(planned - shown);
    for (const auto& record : records) {
      if (!record.empty()) append_record(mine, record);
    }
    progress.finish();
  }
  // Nothing of the plans is recorded: a stop now leaves them all to the rerun.
  if (const auto stop = core::agree_stop(world); stop != core::StopRequest::none) {
    if (world.is_root()) spdlog::warn("{}: stopped after planning; nothing extracted yet", core::signal_name(stop));
    return {.up_to_date = false, .slides_failed = false, .stopped = stop};
  }
  std::vector<PlanResult> plans;
  for (const auto& part : world.allgather_bytes(mine)) {
    for (auto& p : deserialize(part)) plans.push_back(std::move(p));
  }
  // Back to input order, so the job's tile order (and so the shards) do not depend on the rank count.
  std::map<std::string, std::size_t> order;
  for (std::size_t i = 0; i < inputs.size(); ++i) order[inputs[i].id] = i;
  std::sort(plans.begin(), plans.end(),
            [&](const PlanResult& a, const PlanResult& b) { return order[a.input.id] < order[b.input.id]; });

  std::map<std::string, std::string> failed;
  for (const auto& p : plans) {
    if (!p.error.empty()) failed[p.input.id] = p.error;
  }
  if (preview_only) {
    if (world.is_root()) {
      spdlog::info("previews written to {}", settings.previews.string());
      for (const auto& p : plans) {
        if (p.error.empty()) {
          spdlog::info("{}: {} tiles ({} tumour)", p.input.id, p.tiles.size(),
                       std::count_if(p.tiles.begin(), p.tiles.end(), [](const auto& t) { return t.label == 1; }));
        }
      }
    }
    return {.up_to_date = false, .slides_failed = !failed.empty()};
  }

  // Phase 2: extract, equal shares of the job's tiles per rank, each in slide order.
  std::vector<JobTile> job;
  for (std::uint32_t s = 0; s < plans.size(); ++s) {
    for (std::uint32_t t = 0; t < plans[s].tiles.size(); ++t) job.push_back({s, t});
  }
  const auto total = static_cast<std::int64_t>(job.size());
  const auto spans = assign_shards(total, world.size(), config.get_int("shards.tiles_per_shard"));

  io::ShardAttributes attributes;
  attributes.tile_size = settings.grid.tile_size;
  attributes.mpp = settings.grid.mpp;
  attributes.stain_normalization = normalizer ? normalizer->describe() : "none";
  attributes.artefacts = settings.qc.has_value();  // QC ran: every tile has its artefact bits

  const bool skip_corrupt = config.get_string("tile.on_corrupt_tile") == "skip";
  Extractor extractor(plans, attributes, normalizer.get(), static_cast<int>(config.get_int("shards.write_batch")),
                      skip_corrupt, threads);
  std::map<std::string, std::string> extract_failed;
  std::vector<ShardSpan> written;  // shards of this rank still to be checked and put in place
  {
    core::Progress progress(world, total, {.label = "extract", .unit = "tiles"});
    bool earlier_records_logged = false;  // a record of an earlier version of Tessera was logged
    for (const auto& span : spans[static_cast<std::size_t>(world.rank())]) {
      // SIGUSR1: the shard in hand was finished and recorded; no new one is begun.
      if (core::stop_requested() != core::StopRequest::none) break;
      const fs::path final_path = out / shard_name(span.index);
      const std::string unchecked = final_path.string() + ".unchecked";
      const std::vector<JobTile> tiles(job.begin() + span.first, job.begin() + span.first + span.count);
      PixelChecksum digest;
      for (const auto& t : tiles) {
        const auto& planned = plans[t.slide].tiles[t.tile];
        digest.add(plans[t.slide].input.id);
        const std::int64_t fields[] = {planned.x, planned.y, planned.label};
        digest.add(reinterpret_cast<const std::uint8_t*>(fields), sizeof fields);
      }
      // Finished by an earlier run of this same job: kept when its record and its file agree. Only an extracted
      // (unchecked) shard is kept: one already put in place (a run killed between that and its manifest) may have
      // been rewritten without slides that failed elsewhere in that run, which this run's failures need not match;
      // it is extracted again.
      if (const auto record = finished_shard(out, hash, span, digest.hex(), &earlier_records_logged)) {
        spdlog::info("{}: kept from an earlier run of this job ({} tiles, pixels verified)", shard_name(span.index),
                     record->kept);
        extract_failed.insert(record->failed.begin(), record->failed.end());
        written.push_back(span);
        progress.advance(span.count);
        continue;
      }
      // The old record goes first: a new shard next to it is never taken for the recorded one.
      fs::remove(shard_record_path(out, span.index));
      fs::remove(final_path);
      fs::remove(unchecked);
      ShardRecord record{hash, span.index, span.first, span.count, digest.hex(), 0, {}, {}, std::nullopt};
      const auto shard = extractor.write_shard(unchecked, tiles, extract_failed, progress);
      record.checksum = shard.checksum;
      record.kept = shard.tiles;
      // Every slide of the span whose tiles are placeholders here, whenever its failure was first seen: a rerun
      // that keeps this shard must drop them again.
      for (const auto& t : tiles) {
        const auto& id = plans[t.slide].input.id;
        if (const auto it = extract_failed.find(id); it != extract_failed.end()) record.failed.emplace(id, it->second);
      }
      write_shard_record(out, record);
      // Fault point "tile.shard-finished" (core/fault.h): after a shard and its record are complete, e.g.
      // "tile.shard-finished after=1 do=kill" kills the job once its first shard is finished.
      core::fault::at("tile.shard-finished");
      written.push_back(span);
    }
    progress.finish();
  }
  // Every rank's finished shards are recorded (the rerun keeps them); the manifest is the rerun's to write.
  if (const auto stop = core::agree_stop(world); stop != core::StopRequest::none) {
    const auto done = static_cast<std::int64_t>(written.size());
    const std::int64_t all = world.allreduce_value(done, core::ReduceOp::sum);
    if (world.is_root()) {
      spdlog::warn("{}: stopped with {} shard(s) finished and recorded; run the job again to extract the rest",
                   core::signal_name(stop), all);
    }
    return {.up_to_date = false, .slides_failed = false, .stopped = stop};
  }
  for (const auto& [id, corrupt] : extractor.corrupt()) {
    spdlog::warn("slide {}: skipped {} damaged tile(s) (tile.on_corrupt_tile: skip); the first: {}", id, corrupt.count,
                 corrupt.first);
  }

  // Slides that failed on any rank are dropped everywhere; then shards are checked and put in place.
  std::string failures_text;
  for (const auto& [id, error] : extract_failed) append_record(failures_text, json({id, error}).dump());
  for (const auto& part : world.allgather_bytes(failures_text)) {
    std::size_t pos = 0;
    while (pos < part.size()) {
      std::uint64_t n = 0;
      std::memcpy(&n, part.data() + pos, sizeof n);
      const auto entry = json::parse(part.substr(pos + sizeof n, n));
      failed.emplace(entry[0].get<std::string>(), entry[1].get<std::string>());
      pos += sizeof n + n;
    }
  }
  std::set<std::string> failed_ids;
  for (const auto& [id, error] : failed) failed_ids.insert(id);
  for (const auto& span : written) {
    const fs::path final_path = out / shard_name(span.index);
    const std::string unchecked = final_path.string() + ".unchecked";
    if (!fs::exists(unchecked)) continue;  // every tile of it was damaged and skipped
    bool touched = false;
    for (std::int64_t k = span.first; k < span.first + span.count; ++k) {
      touched = touched || failed_ids.contains(plans[job[static_cast<std::size_t>(k)].slide].input.id);
    }
    if (touched) {
      rewrite_without(unchecked, final_path.string(), failed_ids);
      fs::remove(unchecked);
    } else {
      fs::rename(unchecked, final_path);
    }
  }
  world.barrier();

  // Manifest (rank 0), from the shards as they are on disk.
  bool slides_failed = !failed.empty();
  if (world.is_root()) {
    // Every shard of this job is in place now; an unchecked one left, or a shard (and its record) beyond this
    // job's, is of an earlier run on another rank count.
    std::set<std::string> ours;
    for (const auto& rank_spans : spans) {
      for (const auto& span : rank_spans) ours.insert(shard_name(span.index));
    }
    for (const auto& entry : fs::directory_iterator(out)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".unchecked") ||
          (name.starts_with("shard-") && name.ends_with(".h5") && !ours.contains(name))) {
        fs::remove(entry.path());
      }
    }
    for (const auto& entry : fs::directory_iterator(out / kTileRecordFolder)) {  // records of shards not of this job
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".json") && !ours.contains(name.substr(0, name.size() - 5))) fs::remove(entry.path());
    }
    io::Manifest manifest;
    manifest.config_hash = hash;
    manifest.config_yaml = config.to_yaml();
    manifest.attributes = attributes;
    manifest.tissue = tissue_settings(config);
    std::map<std::string, io::ManifestSlide> slides;
    for (const auto& p : plans) {
      if (!p.error.empty() || failed_ids.contains(p.input.id)) continue;
      io::ManifestSlide& slide = slides[p.input.id];
      slide.id = p.input.id;
      slide.path = p.input.path;
      slide.label = p.input.label;
      slide.split = p.input.split;
      slide.origin = io::slide_origin(p.synthetic);
      slide.qc_dropped_tiles = p.qc_dropped;
      slide.qc_kept_tiles = p.qc_kept;
    }
    std::int64_t shard_count = 0;
    for (const auto& rank_spans : spans) shard_count += static_cast<std::int64_t>(rank_spans.size());
    for (std::int64_t index = 0; index < shard_count; ++index) {
      const fs::path path = out / shard_name(index);
      if (!fs::exists(path)) continue;  // every tile of it belonged to failed slides
      const auto shard = io::ShardFile::open(path.string());
      io::ManifestShard entry{path.filename().string(), shard.size(), 0, 0, shard.slides()};
      for (std::int64_t i = 0; i < shard.size(); ++i) {
        const auto label = shard.labels()[static_cast<std::size_t>(i)];
        const std::string& id = shard.slides()[shard.slide_indices()[static_cast<std::size_t>(i)]];
        const auto found = slides.find(id);
        if (found == slides.end()) {
          throw core::InternalError(
              fmt::format("{} holds tiles of slide '{}', which failed or is not in this job", path.string(), id));
        }
        auto& slide = found->second;
        ++slide.tiles;
        (label == 1 ? entry.tumour : entry.normal) += 1;
        (label == 1 ? slide.tumour : slide.normal) += 1;
      }
      manifest.shards.push_back(std::move(entry));
    }
    for (const auto& p : plans) {
      if (!slides.contains(p.input.id)) continue;
      auto& slide = slides[p.input.id];
      // The shards on disk are the record (they survive a resumed run; this run's counts do not): a planned
      // tile that no shard holds was skipped as damaged.
      if (skip_corrupt) slide.corrupt_tiles = static_cast<std::int64_t>(p.tiles.size()) - slide.tiles;
      if (!p.tiles.empty() && slide.tiles == 0 && slide.corrupt_tiles > 0) {
        failed[p.input.id] =
            core::InputError(
                fmt::format("all {} of its tiles are damaged (tile.on_corrupt_tile: skip)", p.tiles.size()),
                p.input.path)
                .what();
        slides_failed = true;
        continue;
      }
      manifest.slides.push_back(slide);
    }
    for (const auto& [id, error] : failed) manifest.failures.push_back({id, error});
    // The state file first: a manifest without the shards it lists recorded is rebuilt, never trusted.
    json finished = json::object();
    for (const auto& entry : manifest.shards) finished[entry.file] = file_identity(out / entry.file);
    core::write_file_atomic(state_path.string(), json({{"hash", hash}, {"shards", finished}}).dump() + "\n");
    io::write_manifest(manifest_path.string(), manifest);
    config.save((out / "tile.config.yaml").string());

    std::int64_t tumour = 0;
    for (const auto& s : manifest.shards) tumour += s.tumour;
    spdlog::info("{} tiles ({} tumour, {} normal) from {} slides in {} shards; manifest {}", manifest.total_tiles(),
                 tumour, manifest.total_tiles() - tumour, manifest.slides.size(), manifest.shards.size(),
                 manifest_path.string());
    if (!failed.empty()) {
      std::fprintf(stderr, "tessera tile: %zu of %zu slides failed and were left out:\n", failed.size(), inputs.size());
      for (const auto& [id, error] : failed) std::fprintf(stderr, "  %s\n", error.c_str());
    }
  }
  // Rank 0 alone may have found a slide whose tiles were all damaged: every rank reports what it found.
  int any_failed = slides_failed ? 1 : 0;
  world.broadcast(&any_failed, sizeof any_failed, 0);
  return {.up_to_date = false, .slides_failed = any_failed != 0};
}

}  // namespace tessera::prep
