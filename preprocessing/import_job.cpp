#include "preprocessing/import_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/csv.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/hash.h"
#include "core/output_dir.h"
#include "core/progress.h"
#include "core/random.h"
#include "core/threads.h"
#include "io/image.h"
#include "io/provenance.h"
#include "io/shard.h"
#include "preprocessing/tile_job.h"
#include "preprocessing/tile_resume.h"

namespace tessera::prep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::set<std::string> kImageExtensions = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp"};

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// The label's class by the job's lists (compared without case); nullopt for a label in neither.
std::optional<std::uint8_t> class_of(const std::string& label, const core::Config& config) {
  const std::string l = lower(label);
  for (const auto& name : config.get_string_list("import.tumour_labels")) {
    if (lower(name) == l) return 1;
  }
  for (const auto& name : config.get_string_list("import.normal_labels")) {
    if (lower(name) == l) return 0;
  }
  return std::nullopt;
}

std::string label_lists(const core::Config& config) {
  return fmt::format("import.normal_labels: [{}], import.tumour_labels: [{}]",
                     fmt::join(config.get_string_list("import.normal_labels"), ", "),
                     fmt::join(config.get_string_list("import.tumour_labels"), ", "));
}

std::vector<PatchInput> read_csv_patches(const std::string& csv, const core::Config& config) {
  std::ifstream in(csv);
  if (!fs::exists(csv)) throw core::FileNotFoundError(csv);
  if (!in) throw core::InputError("cannot be read", csv);
  std::string line;
  int number = 0;
  std::vector<std::string> header;
  while (header.empty() && std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") != std::string::npos) header = core::split_csv_line(line, csv, number);
  }
  if (header.empty()) throw core::InputError("is empty: expected a header line 'path,label[,group][,split]'", csv);
  auto column = [&](std::initializer_list<const char*> names) -> int {
    for (const char* name : names) {
      for (std::size_t i = 0; i < header.size(); ++i) {
        if (lower(header[i]) == name) return static_cast<int>(i);
      }
    }
    return -1;
  };
  const int path_col = column({"path", "file", "image"});
  const int label_col = column({"label", "class"});
  const int group_col = column({"group", "patient", "slide_id", "slide"});
  const int split_col = column({"split"});
  if (path_col < 0 || label_col < 0) {
    throw core::InputError(fmt::format("the header '{}' has no '{}' column (expected path,label[,group][,split])", line,
                                       path_col < 0 ? "path" : "label"),
                           csv);
  }
  const fs::path base = fs::path(csv).parent_path();
  std::vector<PatchInput> patches;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto fields = core::split_csv_line(line, csv, number, header);
    auto field = [&](int col) { return col >= 0 && col < static_cast<int>(fields.size()) ? fields[col] : ""; };
    const std::string where = fmt::format("file '{}': line {}", csv, number);
    PatchInput p;
    p.where = where;
    const std::string path = field(path_col);
    if (path.empty()) throw core::InputError(fmt::format("line {}, column 'path': empty", number), csv);
    p.path = fs::path(path).is_absolute() ? path : (base / path).lexically_normal().string();
    const std::string label = field(label_col);
    const auto cls = class_of(label, config);
    if (!cls) {
      throw core::InputError(
          fmt::format("line {}, column '{}': '{}' is neither a normal nor a tumour label ({})", number,
                      header[static_cast<std::size_t>(label_col)], label, label_lists(config)),
          csv);
    }
    p.label = *cls;
    p.group = field(group_col);
    p.split = field(split_col);
    if (split_col >= 0 && p.split.empty()) {
      throw core::InputError(
          fmt::format("line {}, column 'split': empty (a split column must name every row's split)", number), csv);
    }
    patches.push_back(std::move(p));
  }
  if (patches.empty()) throw core::InputError("lists no patches", csv);
  return patches;
}

// A CSV field, quoted when it holds a comma, a quote or a line end.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

bool is_image(const fs::path& path) { return kImageExtensions.contains(lower(path.extension().string())); }

std::vector<PatchInput> read_folder_patches(const std::string& folder, const core::Config& config) {
  if (!fs::is_directory(folder)) {
    throw core::ConfigError(fmt::format("'{}' is not a folder", folder), config.source(), 0, "input.folder");
  }
  const std::string layout = config.get_string("input.layout");
  std::vector<PatchInput> patches;
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder, fs::directory_options::follow_directory_symlink)) {
    if (entry.is_regular_file() && is_image(entry.path())) files.push_back(entry.path());
  }
  for (const auto& file : files) {
    const fs::path relative = file.lexically_relative(folder);
    std::vector<std::string> parts;
    for (const auto& part : relative.parent_path()) parts.push_back(part.string());
    const std::size_t needed = layout == "class" ? 1 : 2;
    if (parts.size() < needed) {
      throw core::InputError(fmt::format("is not inside a {} folder (input.layout: {})",
                                         layout == "class"         ? "<class>"
                                         : layout == "class/group" ? "<class>/<group>"
                                                                   : "<group>/<class>",
                                         layout),
                             file.string());
    }
    const std::string& label = layout == "group/class" ? parts[1] : parts[0];
    const auto cls = class_of(label, config);
    if (!cls) {
      throw core::InputError(
          fmt::format("folder '{}' is neither a normal nor a tumour class ({})", label, label_lists(config)),
          file.string());
    }
    PatchInput p;
    p.path = file.string();
    p.where = file.string();
    p.label = *cls;
    if (layout == "class/group") p.group = parts[1];
    if (layout == "group/class") p.group = parts[0];
    patches.push_back(std::move(p));
  }
  if (patches.empty()) {
    throw core::ConfigError(fmt::format("no image files (.png, .jpg, .tif, .bmp) under '{}'", folder), config.source(),
                            0, "input.folder");
  }
  return patches;
}

// Splits by group: the groups in a seeded random order, the first share of them to the first split, and so on (the
// shares by largest remainder, so the counts add up). Depends only on the group ids and the seed.
void assign_splits(std::vector<PatchInput>& patches, const core::Config& config) {
  const auto& names = config.get_string_list("splits.names");
  const auto& fractions_text = config.get_string_list("splits.fractions");
  if (names.empty() || names.size() != fractions_text.size()) {
    throw core::ConfigError(fmt::format("splits.names has {} names and splits.fractions {} numbers: give one fraction "
                                        "per split",
                                        names.size(), fractions_text.size()),
                            config.source(), 0, "splits.fractions");
  }
  std::vector<double> fractions;
  double sum = 0;
  for (const auto& text : fractions_text) {
    double f = -1;
    try {
      std::size_t used = 0;
      f = std::stod(text, &used);
      if (used != text.size()) f = -1;
    } catch (const std::exception&) {
      f = -1;
    }
    if (!(f >= 0)) {
      throw core::ConfigError(fmt::format("'{}' is not a fraction (a number from 0 to 1)", text), config.source(), 0,
                              "splits.fractions");
    }
    fractions.push_back(f);
    sum += f;
  }
  if (sum <= 0) throw core::ConfigError("the fractions add up to 0", config.source(), 0, "splits.fractions");
  std::set<std::string> group_set;
  for (const auto& p : patches) group_set.insert(p.group);
  std::vector<std::string> groups(group_set.begin(), group_set.end());
  core::SplitMix64 random(static_cast<std::uint64_t>(config.get_int("splits.seed")));
  for (std::size_t i = groups.size(); i > 1; --i) {
    std::swap(groups[i - 1], groups[random.next() % i]);
  }
  // Largest remainder: floor shares first, then one more to the splits with the largest remainders.
  const auto n = static_cast<double>(groups.size());
  std::vector<std::size_t> counts(names.size());
  std::vector<std::pair<double, std::size_t>> remainders;
  std::size_t given = 0;
  for (std::size_t s = 0; s < names.size(); ++s) {
    const double share = n * fractions[s] / sum;
    counts[s] = static_cast<std::size_t>(share);
    given += counts[s];
    remainders.emplace_back(share - static_cast<double>(counts[s]), s);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < groups.size(); ++k, ++given) ++counts[remainders[k % remainders.size()].second];
  std::map<std::string, std::string> split_of;
  std::size_t next = 0;
  for (std::size_t s = 0; s < names.size(); ++s) {
    for (std::size_t k = 0; k < counts[s]; ++k) split_of[groups[next++]] = names[s];
  }
  for (auto& p : patches) p.split = split_of.at(p.group);
}

// FNV-1a over the effective config, the stain reference's bytes and each patch's path, label, group, split, size and
// modification time.
std::string job_hash(const core::Config& config, const StainReference& reference,
                     const std::vector<PatchInput>& patches) {
  // import.threads changes how fast the job runs, never what it writes: a rerun with another count keeps what is done.
  core::Config hashed = config;
  hashed.set_value("import.threads", "0", "the job hash");
  std::uint64_t hash = core::fnv1a(hashed.to_yaml() + stain_reference_digest(reference));
  for (const auto& p : patches) {
    struct stat st {};
    const bool ok = ::stat(p.path.c_str(), &st) == 0;
    const std::string text = fmt::format("\n{}|{}|{}|{}|{}|{}", p.path, p.label, p.group, p.split, ok ? st.st_size : -1,
                                         ok ? st.st_mtim.tv_sec : 0);
    hash = core::fnv1a(text.data(), text.size(), hash);
  }
  return fmt::format("{:016x}", hash);
}

struct FitSettings {
  int tile_size = 0;
  bool resize = false;
};

// The patch as a tile_size² RGB tile: padded (centred on white; a larger side centre-cropped) or resized.
cv::Mat fit_patch(const cv::Mat& rgb, const FitSettings& fit) {
  const int t = fit.tile_size;
  if (rgb.cols == t && rgb.rows == t) return rgb;
  if (fit.resize) {
    cv::Mat out;
    const bool shrink = rgb.cols > t || rgb.rows > t;
    cv::resize(rgb, out, cv::Size(t, t), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    return out;
  }
  cv::Mat out(t, t, CV_8UC3, cv::Scalar(255, 255, 255));
  const int w = std::min(t, rgb.cols), h = std::min(t, rgb.rows);
  const cv::Rect from((rgb.cols - w) / 2, (rgb.rows - h) / 2, w, h);
  const cv::Rect to((t - w) / 2, (t - h) / 2, w, h);
  rgb(from).copyTo(out(to));
  return out;
}

// The patch of `p` decoded and fitted to the tile. core::Error or cv::Exception when it cannot be decoded whole.
cv::Mat decode_patch(const PatchInput& p, const FitSettings& fit) { return fit_patch(io::read_rgb_image(p.path), fit); }

// A group's normalizer, or a split's target, is fitted on at most this many pixels of its patches (evenly spread over
// them): 4 M pixels, 12 MB of RGB and 48 MB of float L*a*b* while it is fitted.
constexpr std::int64_t kMaxFitPixels = std::int64_t{1} << 22;

// The patches `indices` name (at most kMaxFitPixels pixels of them, spread evenly), decoded and fitted to the
// tile with up to `threads` threads (no more than the sample's patches); a patch that cannot be decoded is left out
// (the shard that holds it lists it).
std::vector<cv::Mat> decode_sample(const std::vector<PatchInput>& patches, const std::vector<std::size_t>& indices,
                                   const FitSettings& fit, int threads) {
  const std::int64_t tile_pixels = static_cast<std::int64_t>(fit.tile_size) * fit.tile_size;
  const auto most = static_cast<std::size_t>(std::max<std::int64_t>(1, kMaxFitPixels / tile_pixels));
  const std::size_t step = (indices.size() + most - 1) / most;  // every patch while they fit in kMaxFitPixels
  std::vector<std::size_t> sample;
  for (std::size_t i = 0; i < indices.size(); i += step) sample.push_back(indices[i]);
  std::vector<cv::Mat> images(sample.size());
  std::atomic<std::size_t> next{0};
  core::run_on_threads(static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads), sample.size())),
                       [&](int) {
                         for (std::size_t k = next++; k < sample.size(); k = next++) {
                           try {
                             images[k] = decode_patch(patches[sample[k]], fit);
                           } catch (const core::Error&) {
                           } catch (const cv::Exception&) {
                           }
                         }
                       });
  return images;
}

// The job's stain target: stain_target()'s (from the reference's bytes the job's hash covers), or with
// stain.target_split fitted on that split's patches taken together.
std::unique_ptr<StainNormalizer> import_stain_target(const core::Config& config, const StainReference& reference,
                                                     const std::vector<PatchInput>& patches, const FitSettings& fit,
                                                     int threads) {
  const std::string& split = config.get_string("stain.target_split");
  if (split.empty() || config.get_string("stain.method") == "none") return stain_target(config, reference);
  std::vector<std::size_t> in_split;
  for (std::size_t i = 0; i < patches.size(); ++i) {
    if (patches[i].split == split) in_split.push_back(i);
  }
  if (in_split.empty()) {
    throw core::ConfigError(fmt::format("no patches are in split '{}'", split), config.source(), 0,
                            "stain.target_split");
  }
  return make_stain_normalizer(parse_stain_method(config.get_string("stain.method")),
                               decode_sample(patches, in_split, fit, threads),
                               fmt::format("split {}, {} patches", split, in_split.size()));
}

// A group's patches decoded for its stain fit are kept for its shard while all the patches kept stay under this many
// bytes (64 MB: about 8,900 tiles of 50 px, 340 of 256 px); a group whose patches would pass it, or that was fitted
// on a sample of its patches (kMaxFitPixels), is decoded again when its shard is written.
constexpr std::size_t kMaxHeldBytes = std::size_t{64} << 20;

// Stain normalization of the job: the target, and with stain.fit: group each group's normalizer (the target fitted
// on the group's patches taken together), fitted when a shard first needs it. Null entries leave patches as they are.
// The patches a group's fit decoded are kept for its shard when they fit in kMaxHeldBytes (take_decoded).
class PatchStains {
 public:
  // `mine`: the first and the end of this rank's patches (the only ones whose decoded tiles are kept).
  PatchStains(const std::vector<PatchInput>& patches, const FitSettings& fit, std::unique_ptr<StainNormalizer> target,
              bool per_group, int threads, std::pair<std::size_t, std::size_t> mine)
      : patches_(patches),
        fit_(fit),
        target_(std::move(target)),
        per_group_(per_group),
        threads_(threads),
        mine_(mine) {}

  // True when groups are fitted, the only way a group can keep its stain (so a shard's record must say which did).
  bool fits_groups() const { return target_ && per_group_; }

  // The normalizer of each patch of the span.
  std::vector<const StainNormalizer*> of_span(const ShardSpan& span) {
    std::vector<const StainNormalizer*> out(static_cast<std::size_t>(span.count), per_group_ ? nullptr : target_.get());
    if (!target_ || !per_group_) return out;
    for (std::int64_t k = 0; k < span.count; ++k) {
      const std::size_t index = static_cast<std::size_t>(span.first + k);
      const std::string& group = patches_[index].group;
      auto it = fitted_.find(group);
      if (it == fitted_.end()) it = fitted_.emplace(group, fit_group(index)).first;
      out[static_cast<std::size_t>(k)] = it->second.get();
    }
    return out;
  }

  // The groups of the span whose fit failed (group → why), once of_span(span) has fitted them: their patches keep
  // their colours.
  std::map<std::string, std::string> unfitted_of(const ShardSpan& span) const {
    std::map<std::string, std::string> out;
    for (std::int64_t k = span.first; k < span.first + span.count; ++k) {
      const std::string& group = patches_[static_cast<std::size_t>(k)].group;
      if (const auto it = unfitted_.find(group); it != unfitted_.end()) out.insert(*it);
    }
    return out;
  }

  // The span's patches as their groups' fits decoded them (an empty Mat for one not kept: decode it); afterwards
  // nothing of the span, or before it, is kept.
  std::vector<cv::Mat> take_decoded(const ShardSpan& span) {
    std::vector<cv::Mat> out(static_cast<std::size_t>(span.count));
    const auto end = static_cast<std::size_t>(span.first + span.count);
    for (auto it = held_.begin(); it != held_.end() && it->first < end; it = held_.erase(it)) {
      held_bytes_ -= it->second.total() * it->second.elemSize();
      if (it->first >= static_cast<std::size_t>(span.first)) {
        out[it->first - static_cast<std::size_t>(span.first)] = std::move(it->second);
      }
    }
    return out;
  }

 private:
  // The target fitted on the group of patch `index` (its patches are consecutive in job order); null, recorded in
  // unfitted_, when together they hold too little tissue (or, for Macenko, one stain only).
  std::unique_ptr<StainNormalizer> fit_group(std::size_t index) {
    const std::string& group = patches_[index].group;
    std::size_t begin = index, end = index + 1;
    while (begin > 0 && patches_[begin - 1].group == group) --begin;
    while (end < patches_.size() && patches_[end].group == group) ++end;
    std::vector<std::size_t> members(end - begin);
    for (std::size_t i = begin; i < end; ++i) members[i - begin] = i;
    std::string failure;
    auto images = decode_sample(patches_, members, fit_, threads_);
    auto normalizer = target_->fitted_to(images, failure);
    if (!normalizer) unfitted_.emplace(group, failure);
    if (images.size() == members.size()) {  // every patch was decoded for the fit: keep them for the shard
      std::size_t bytes = 0;
      for (const auto& image : images) bytes += image.total() * image.elemSize();
      if (held_bytes_ + bytes <= kMaxHeldBytes) {
        for (std::size_t k = 0; k < members.size(); ++k) {
          if (images[k].empty() || members[k] < mine_.first || members[k] >= mine_.second) continue;
          held_bytes_ += images[k].total() * images[k].elemSize();
          held_.emplace(members[k], std::move(images[k]));
        }
      }
    }
    return normalizer;
  }

  const std::vector<PatchInput>& patches_;
  FitSettings fit_;
  std::unique_ptr<StainNormalizer> target_;
  bool per_group_;
  int threads_;
  std::map<std::string, std::unique_ptr<StainNormalizer>> fitted_;
  std::map<std::string, std::string> unfitted_;
  std::pair<std::size_t, std::size_t> mine_;
  std::map<std::size_t, cv::Mat> held_;  // patch index → its decoded tile, for its shard
  std::size_t held_bytes_ = 0;
};

// Every rank's `pairs` (key → text) merged into `pairs` on every rank.
void gather_pairs(const core::Comm& world, std::map<std::string, std::string>& pairs) {
  std::string mine;
  for (const auto& [key, text] : pairs) mine += json({key, text}).dump() + "\n";
  for (const auto& part : world.allgather_bytes(mine)) {
    std::istringstream lines(part);
    std::string line;
    while (std::getline(lines, line)) {
      const auto entry = json::parse(line);
      pairs.emplace(entry[0].get<std::string>(), entry[1].get<std::string>());
    }
  }
}

struct ShardResult {
  std::int64_t tiles = 0;
  std::string checksum;
  std::map<std::string, std::string> failed;  // patch path → error
};

// Decodes the span's patches with `threads` threads (those not in `decoded`, the span's patches decoded already or
// empty), then writes the good ones in job order.
ShardResult write_shard(const std::string& path, const std::vector<PatchInput>& patches, const ShardSpan& span,
                        const std::vector<std::string>& groups, const std::map<std::string, std::uint32_t>& group_index,
                        const io::ShardAttributes& attributes, const FitSettings& fit,
                        const std::vector<const StainNormalizer*>& normalizers, std::vector<cv::Mat> decoded,
                        int threads) {
  const auto count = static_cast<std::size_t>(span.count);
  const std::size_t tile_bytes = static_cast<std::size_t>(fit.tile_size) * fit.tile_size * 3;
  std::vector<std::uint8_t> pixels(count * tile_bytes);
  std::vector<std::string> errors(count);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t k = next++; k < count; k = next++) {
      const auto& p = patches[static_cast<std::size_t>(span.first) + k];
      try {
        cv::Mat tile = decoded[k].empty() ? decode_patch(p, fit) : std::move(decoded[k]);
        if (const auto* normalizer = normalizers[k]) normalizer->apply(tile);
        for (int y = 0; y < tile.rows; ++y) {
          std::memcpy(pixels.data() + k * tile_bytes + static_cast<std::size_t>(y) * tile.cols * 3, tile.ptr(y),
                      static_cast<std::size_t>(tile.cols) * 3);
        }
      } catch (const core::Error& e) {
        errors[k] = e.what();
      } catch (const cv::Exception& e) {
        errors[k] = core::InputError(fmt::format("cannot be decoded ({})", e.what()), p.path).what();
      }
    }
  };
  core::run_on_threads(threads, [&](int) { work(); });

  ShardResult result;
  std::vector<io::ShardTileRecord> records;
  std::vector<std::size_t> good;
  for (std::size_t k = 0; k < count; ++k) {
    const auto& p = patches[static_cast<std::size_t>(span.first) + k];
    if (!errors[k].empty()) {
      result.failed.emplace(p.path, errors[k]);
      continue;
    }
    good.push_back(k);
    // A patch has no place on a slide: its x is its number in the job (the row of patches.csv), y is 0.
    records.push_back(
        {p.label, static_cast<float>(p.label), span.first + static_cast<std::int64_t>(k), 0, group_index.at(p.group)});
  }
  result.tiles = static_cast<std::int64_t>(good.size());
  if (good.empty()) return result;
  // The shard's slide list is every group of the job (slide_index is the row there), as tile's lists every slide.
  io::ShardWriter writer(path, attributes, result.tiles, groups);
  PixelChecksum checksum;
  constexpr std::size_t block = 256;
  std::vector<std::uint8_t> staged;
  for (std::size_t first = 0; first < good.size(); first += block) {
    const std::size_t n = std::min(block, good.size() - first);
    staged.resize(n * tile_bytes);
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(staged.data() + i * tile_bytes, pixels.data() + good[first + i] * tile_bytes, tile_bytes);
    }
    checksum.add(staged.data(), staged.size());
    const std::vector<io::ShardTileRecord> part(records.begin() + static_cast<std::ptrdiff_t>(first),
                                                records.begin() + static_cast<std::ptrdiff_t>(first + n));
    writer.write(static_cast<std::int64_t>(first), part, staged.data());
  }
  writer.finish();
  result.checksum = checksum.hex();
  return result;
}

// The most common patch side (of the first few hundred patches), for import.fit: resize's µm/px.
int common_side(const std::vector<PatchInput>& patches) {
  std::map<int, int> sides;
  for (std::size_t i = 0; i < patches.size() && i < 256; ++i) {
    try {
      const cv::Mat rgb = io::read_rgb_image(patches[i].path);
      if (rgb.cols == rgb.rows) ++sides[rgb.cols];
    } catch (const core::Error&) {
    }
  }
  int best = 0, seen = 0;
  for (const auto& [side, n] : sides) {
    if (n > seen) best = side, seen = n;
  }
  return best;
}

}  // namespace

const core::Schema& import_schema() {
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("input.csv", "", "CSV of the patches: path,label[,group][,split] (a 'patient' column is the group)")
        .string("input.folder", "",
                "Folder of patches by class: <class>/..., <class>/<group>/... or <group>/<class>/...")
        .string("input.layout", "class/group",
                "How input.folder is organised: class (<class>/<file>), class/group (<class>/<group>/<file>) or "
                "group/class (<group>/<class>/<file>)",
                {"class", "class/group", "group/class"})
        .string_list("import.normal_labels", {"0", "normal", "negative", "benign"},
                     "Labels (CSV label or class folder name, any case) of normal patches")
        .string_list("import.tumour_labels", {"1", "tumor", "tumour", "positive", "malignant"},
                     "Labels (CSV label or class folder name, any case) of tumour patches")
        .number("import.mpp", 0.0,
                "um/px of the patches as given (required: patch files record no resolution Tessera can trust)", 0, 64)
        .string("import.fit", "pad",
                "pad: centre each patch on a white tile.size tile (a larger one is centre-cropped; um/px kept); "
                "resize: scale every patch to tile.size (um/px = import.mpp x patch side / tile.size)",
                {"pad", "resize"})
        .integer("import.threads", 0, "Decoding threads per rank (0 = the cores this rank may use)", 0, 1024)
        .integer("tile.size", 0, "Tile side in pixels (0 = the patches' most common side)", 0, 4096)
        .string("stain.method", "none", "Stain normalization of every patch to one target",
                {"none", "reinhard", "macenko"})
        .string("stain.reference", "", "Reference image for the stain target ('' = Tessera's built-in H&E target)")
        .string("stain.target_split", "",
                "Fit the stain target on the patches of this split taken together, e.g. train (no val or test patient "
                "then shapes it); '' = stain.reference or the built-in target")
        .string("stain.fit", "group",
                "group: the colours of a group (patient) fitted once on all of its patches, so the differences between "
                "its patches stay; patch: each patch fitted alone, as tile fits each tile",
                {"group", "patch"})
        .string_list("splits.names", {"train", "val", "test"}, "Splits assigned by group when the CSV has none")
        .string_list("splits.fractions", {"0.7", "0.15", "0.15"}, "Share of the groups (patients) in each split")
        .integer("splits.seed", 1, "Seed of the assignment of groups to splits", 0, 9.0e15)
        .string("output", "data/import", "Folder for manifest.json and shard-NNNNN.h5")
        .integer("shards.tiles_per_shard", 4096, "Patches per shard file (fewer when a shard would pass 512 MB)", 1,
                 1e7);
    return schema;
  }();
  return instance;
}

std::vector<PatchInput> resolve_import_inputs(const core::Config& config) {
  const std::string& csv = config.get_string("input.csv");
  const std::string& folder = config.get_string("input.folder");
  if (csv.empty() == folder.empty()) {
    throw core::ConfigError(csv.empty() ? "give the patches as input.csv or input.folder"
                                        : "give the patches as input.csv or input.folder, not both",
                            config.source(), 0, csv.empty() ? "input.csv" : "input.folder");
  }
  auto patches = csv.empty() ? read_folder_patches(folder, config) : read_csv_patches(csv, config);
  const bool grouped = std::any_of(patches.begin(), patches.end(), [](const auto& p) { return !p.group.empty(); });
  if (!grouped) {
    spdlog::warn(
        "the patches name no group (patient): each patch is its own group, so patches of one patient may "
        "straddle the splits; give a group column (CSV) or input.layout class/group or group/class");
    for (auto& p : patches) p.group = fs::path(p.path).stem().string();
  } else {
    for (const auto& p : patches) {
      if (p.group.empty()) throw core::InputError("has no group, while other patches have one", p.where);
    }
  }
  const bool given = std::any_of(patches.begin(), patches.end(), [](const auto& p) { return !p.split.empty(); });
  if (given) {
    std::map<std::string, std::string> split_of;
    for (const auto& p : patches) {
      const auto [it, fresh] = split_of.emplace(p.group, p.split);
      if (!fresh && it->second != p.split) {
        throw core::InputError(fmt::format("group '{}' is in split '{}' here and in split '{}' on an earlier line: a "
                                           "group (patient) must be in one split",
                                           p.group, p.split, it->second),
                               p.where);
      }
    }
  } else {
    assign_splits(patches, config);
  }
  std::set<std::string> paths;
  for (const auto& p : patches) {
    if (!paths.insert(p.path).second) throw core::InputError(fmt::format("'{}' is listed twice", p.path), p.where);
  }
  std::stable_sort(patches.begin(), patches.end(), [](const PatchInput& a, const PatchInput& b) {
    return std::tie(a.group, a.path) < std::tie(b.group, b.path);
  });
  return patches;
}

ImportJobResult run_import_job(const core::Config& config, bool force, const core::Comm& world) {
  const fs::path out = config.get_string("output");
  const auto lock = core::lock_output_folder(world, out.string(), "tessera import");
  if (config.get_number("import.mpp") <= 0) {
    throw core::ConfigError("give the patches' um/px as import.mpp (e.g. 0.5 for 20x, about 4 for the IDC patches)",
                            config.source(), 0, "import.mpp");
  }
  const auto patches = resolve_import_inputs(config);
  std::vector<std::string> groups;
  std::map<std::string, std::uint32_t> group_index;
  for (const auto& p : patches) {
    if (group_index.emplace(p.group, static_cast<std::uint32_t>(groups.size())).second) groups.push_back(p.group);
  }

  FitSettings fit;
  fit.resize = config.get_string("import.fit") == "resize";
  const int side = common_side(patches);
  fit.tile_size = static_cast<int>(config.get_int("tile.size"));
  if (fit.tile_size == 0) {
    if (side == 0) {
      throw core::ConfigError("the first patches are not square or not readable: give tile.size", config.source(), 0,
                              "tile.size");
    }
    fit.tile_size = side;
  }
  io::ShardAttributes attributes;
  attributes.tile_size = fit.tile_size;
  attributes.mpp = config.get_number("import.mpp");
  if (fit.resize && side > 0) attributes.mpp *= static_cast<double>(side) / fit.tile_size;
  int threads = static_cast<int>(config.get_int("import.threads"));
  if (threads == 0) {
    threads = core::usable_cores();
  }
  // Per group only when some group has more than one patch: else (the patches name no group) each patch is fitted
  // alone, on the way tile and stain.fit: patch take, with no fit ahead of its shard.
  const bool per_group = config.get_string("stain.fit") == "group" && groups.size() < patches.size();
  if (!config.get_string("stain.target_split").empty() && !config.get_string("stain.reference").empty() &&
      config.get_string("stain.method") != "none") {
    throw core::ConfigError("give stain.reference or stain.target_split, not both", config.source(), 0,
                            "stain.target_split");
  }
  // Read once: the job's hash and its stain target come from the same bytes.
  const auto reference = read_stain_reference(config);
  const std::string hash = job_hash(config, reference, patches);
  const fs::path state_path = out / ".tessera-import-state.json";
  const fs::path manifest_path = out / "manifest.json";
  int up_to_date = 0;
  if (world.is_root()) {
    bool same_job = false;
    if (!force && fs::exists(state_path)) {
      try {
        std::ifstream in(state_path);
        same_job = json::parse(in).value("hash", "") == hash;
      } catch (const std::exception&) {
        same_job = false;  // an unreadable state file means: start over
      }
    }
    if (same_job && fs::exists(manifest_path)) {
      try {
        const auto manifest = io::read_manifest(manifest_path.string());
        bool whole = manifest.config_hash == hash;
        for (const auto& shard : manifest.shards) {
          whole = whole && io::ShardFile::open((out / shard.file).string()).size() == shard.tiles;
        }
        if (whole) up_to_date = manifest.failures.empty() ? 1 : 2;
      } catch (const core::Error& e) {
        spdlog::warn("{}; importing again", e.what());
      }
      if (!up_to_date) same_job = false;
    }
    if (!same_job) {
      for (const auto& entry : fs::directory_iterator(out)) {
        const auto name = entry.path().filename().string();
        if (name.starts_with("shard-") || name == "manifest.json") fs::remove(entry.path());
      }
      fs::remove_all(out / kTileRecordFolder);
      core::write_file_atomic(state_path.string(), json({{"hash", hash}}).dump() + "\n");
    }
    fs::create_directories(out / kTileRecordFolder);
    for (const fs::path& folder : {out, out / kTileRecordFolder}) {
      for (const auto& entry : fs::directory_iterator(folder)) {
        if (entry.path().filename().string().find(".tmp-") != std::string::npos) fs::remove(entry.path());
      }
    }
  }
  world.broadcast(&up_to_date, sizeof up_to_date, 0);
  if (up_to_date) {
    const auto manifest = io::read_manifest(manifest_path.string());
    if (world.is_root()) {
      spdlog::info("{} is up to date for this job (same config and patches); use --force to import again",
                   manifest_path.string());
      for (const auto& f : manifest.failures) spdlog::error("{}: failed in that run: {}", f.slide, f.error);
    }
    return {.up_to_date = true, .patches_failed = up_to_date == 2, .patches = manifest.total_tiles()};
  }
  world.barrier();

  // The stain target is fitted only for a job that has patches to write (a finished one returned above).
  auto target = import_stain_target(config, reference, patches, fit, threads);
  attributes.stain_normalization = target ? target->describe() + (per_group ? kPerGroupSuffix : "") : "none";

  const auto total = static_cast<std::int64_t>(patches.size());
  const std::int64_t tile_bytes = static_cast<std::int64_t>(fit.tile_size) * fit.tile_size * 3;
  const std::int64_t per_shard = std::max<std::int64_t>(
      1, std::min(config.get_int("shards.tiles_per_shard"), (std::int64_t{512} << 20) / tile_bytes));
  const auto spans = assign_shards(total, world.size(), per_shard);
  // This rank's patches: the run its spans cover, as assign_shards shared them out.
  const auto& my_spans = spans[static_cast<std::size_t>(world.rank())];
  const auto mine = my_spans.empty() ? std::pair<std::size_t, std::size_t>{0, 0}
                                     : std::pair<std::size_t, std::size_t>{
                                           static_cast<std::size_t>(my_spans.front().first),
                                           static_cast<std::size_t>(my_spans.back().first + my_spans.back().count)};
  PatchStains stains(patches, fit, std::move(target), per_group, threads, mine);
  std::map<std::string, std::string> failed;
  std::map<std::string, std::string> stain_kept;  // group → why its stain could not be fitted, of this rank's shards
  {
    core::Progress progress(world, total, {.label = "import", .unit = "patches"});
    bool earlier_records_logged = false;  // a record of an earlier version of Tessera was logged
    for (const auto& span : spans[static_cast<std::size_t>(world.rank())]) {
      const fs::path final_path = out / shard_name(span.index);
      const std::string unchecked = final_path.string() + ".unchecked";
      PixelChecksum digest;
      for (std::int64_t k = span.first; k < span.first + span.count; ++k) {
        const auto& p = patches[static_cast<std::size_t>(k)];
        digest.add(p.path);
        digest.add(p.group);
        const std::uint8_t label = p.label;
        digest.add(&label, 1);
      }
      const auto record = finished_shard(out, hash, span, digest.hex(), &earlier_records_logged, stains.fits_groups());
      if (record) {
        spdlog::info("{}: kept from an earlier run of this job ({} patches, pixels verified)", shard_name(span.index),
                     record->kept);
        failed.insert(record->failed.begin(), record->failed.end());
        if (record->stain_kept) stain_kept.insert(record->stain_kept->begin(), record->stain_kept->end());
        progress.advance(span.count);
        continue;
      }
      fs::remove(shard_record_path(out, span.index));
      fs::remove(final_path);
      fs::remove(unchecked);
      const auto normalizers = stains.of_span(span);
      const auto shard = write_shard(unchecked, patches, span, groups, group_index, attributes, fit, normalizers,
                                     stains.take_decoded(span), threads);
      failed.insert(shard.failed.begin(), shard.failed.end());
      const auto kept_here = stains.unfitted_of(span);
      stain_kept.insert(kept_here.begin(), kept_here.end());
      write_shard_record(out, {hash, span.index, span.first, span.count, digest.hex(), shard.tiles, shard.checksum,
                               shard.failed, kept_here});
      // Fault point "import.shard-finished" (core/fault.h): after a shard and its record are complete.
      core::fault::at("import.shard-finished");
      progress.advance(span.count);
    }
    progress.finish();
  }
  // Every rank's shards are finished: each puts its own in place, then rank 0 writes the manifest from the disk.
  for (const auto& span : spans[static_cast<std::size_t>(world.rank())]) {
    const fs::path final_path = out / shard_name(span.index);
    const std::string unchecked = final_path.string() + ".unchecked";
    if (fs::exists(unchecked)) fs::rename(unchecked, final_path);
  }
  gather_pairs(world, failed);
  gather_pairs(world, stain_kept);

  ImportJobResult result;
  result.patches_failed = !failed.empty();
  if (world.is_root()) {
    std::set<std::string> ours;
    for (const auto& rank_spans : spans) {
      for (const auto& span : rank_spans) ours.insert(shard_name(span.index));
    }
    // Every shard of this job is in place now: a shard beyond them (or an unchecked one left) is of an earlier run
    // on another rank count.
    for (const auto& entry : fs::directory_iterator(out)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("shard-") && !ours.contains(name)) fs::remove(entry.path());
    }
    io::Manifest manifest;
    manifest.config_hash = hash;
    manifest.config_yaml = config.to_yaml();
    manifest.attributes = attributes;
    std::map<std::string, io::ManifestSlide> slides;
    for (const auto& p : patches) {
      auto& slide = slides[p.group];
      slide.id = p.group;
      slide.path =
          config.get_string("input.csv").empty() ? config.get_string("input.folder") : config.get_string("input.csv");
      slide.split = p.split;
      slide.origin = io::slide_origin(false);
      if (p.label == 1) slide.label = "tumor";
    }
    for (auto& [id, slide] : slides) {
      if (slide.label.empty()) slide.label = "normal";
    }
    std::int64_t shard_count = 0;
    for (const auto& rank_spans : spans) shard_count += static_cast<std::int64_t>(rank_spans.size());
    for (std::int64_t index = 0; index < shard_count; ++index) {
      const fs::path path = out / shard_name(index);
      if (!fs::exists(path)) continue;  // every patch of it failed
      const auto shard = io::ShardFile::open(path.string());
      io::ManifestShard entry{path.filename().string(), shard.size(), 0, 0, {}};
      std::set<std::string> in_shard;
      for (std::int64_t i = 0; i < shard.size(); ++i) {
        const auto label = shard.labels()[static_cast<std::size_t>(i)];
        const std::string& id = shard.slides()[shard.slide_indices()[static_cast<std::size_t>(i)]];
        auto& slide = slides.at(id);
        ++slide.tiles;
        (label == 1 ? entry.tumour : entry.normal) += 1;
        (label == 1 ? slide.tumour : slide.normal) += 1;
        in_shard.insert(id);
      }
      entry.slides.assign(in_shard.begin(), in_shard.end());
      manifest.shards.push_back(std::move(entry));
    }
    for (const auto& [id, slide] : slides) {
      if (slide.tiles > 0) manifest.slides.push_back(slide);
    }
    for (const auto& [path, error] : failed) manifest.failures.push_back({path, error});
    // patches.csv: each patch's number in the job (the shards' x coordinate), so that a tile or a prediction leads
    // back to its file.
    std::string table = "number,path,group,label,split,status\n";
    for (std::size_t k = 0; k < patches.size(); ++k) {
      const auto& p = patches[k];
      table += fmt::format("{},{},{},{},{},{}\n", k, csv_field(p.path), csv_field(p.group), io::kLabelNames[p.label],
                           csv_field(p.split),
                           failed.contains(p.path)        ? "failed"
                           : stain_kept.contains(p.group) ? "imported-stain-kept"
                                                          : "imported");
    }
    core::write_file_atomic((out / "patches.csv").string(), table);
    io::write_manifest(manifest_path.string(), manifest);
    config.save((out / "import.config.yaml").string());
    result.patches = manifest.total_tiles();
    std::int64_t tumour = 0;
    std::map<std::string, std::int64_t> per_split;
    for (const auto& s : manifest.shards) tumour += s.tumour;
    for (const auto& s : manifest.slides) per_split[s.split] += 1;
    std::string split_text;
    for (const auto& [split, n] : per_split)
      split_text += fmt::format("{}{} {}", split_text.empty() ? "" : ", ", n, split);
    spdlog::info(
        "{} patches ({} tumour, {} normal) of {} groups ({}) in {} shards of {} px at {:.3g} um/px; manifest {}",
        result.patches, tumour, result.patches - tumour, manifest.slides.size(), split_text, manifest.shards.size(),
        fit.tile_size, attributes.mpp, manifest_path.string());
    if (!failed.empty()) {
      std::fprintf(stderr, "tessera import: %zu of %zu patches could not be read and were left out:\n", failed.size(),
                   patches.size());
      for (const auto& [path, error] : failed) std::fprintf(stderr, "  %s\n", error.c_str());
    }
    if (!stain_kept.empty()) {
      std::string list;
      for (const auto& [group, why] : stain_kept)
        list += fmt::format("{}'{}' ({})", list.empty() ? "" : "; ", group, why);
      spdlog::warn(
          "stain normalization could not be fitted on {} groups, whose patches keep their colours "
          "(imported-stain-kept in patches.csv): {}",
          stain_kept.size(), list);
    }
  }
  std::int64_t imported = result.patches;
  world.broadcast(&imported, sizeof imported, 0);
  result.patches = imported;
  return result;
}

}  // namespace tessera::prep
