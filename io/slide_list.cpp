#include "io/slide_list.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "io/dataset.h"
#include "io/dicom_slide.h"

namespace tessera::io {

std::string slide_id_of(const std::string& path) {
  if (looks_like_dicom(path)) return dicom_slide_id(path);
  return std::filesystem::path(path).stem().string();
}

namespace {

std::uintmax_t folder_bytes(const std::filesystem::path& folder) {
  std::uintmax_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code file_ec;
    if (!it->is_regular_file(file_ec)) continue;
    const std::uintmax_t size = it->file_size(file_ec);
    if (!file_ec) total += size;
  }
  return total;
}

}  // namespace

std::uintmax_t slide_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return folder_bytes(path);
  if (looks_like_dicom(path)) {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    return folder_bytes(folder.empty() ? std::filesystem::path(".") : folder);
  }
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

std::vector<std::string> expand_slide_patterns(const std::vector<std::string>& patterns, const std::string& source,
                                               const std::string& key) {
  std::vector<std::string> paths;
  for (const auto& pattern : patterns) {
    glob_t matches{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    std::vector<std::string> files(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    globfree(&matches);
    if (rc == GLOB_NOMATCH || files.empty()) {
      if (pattern.find_first_of("*?[") != std::string::npos) {
        throw core::ConfigError("no slide matches '" + pattern + "'", source, 0, key);
      }
      files = {pattern};
    }
    std::sort(files.begin(), files.end());
    paths.insert(paths.end(), files.begin(), files.end());
  }
  return paths;
}

void check_unique_slide_ids(const std::vector<std::string>& ids, const std::string& source, const std::string& key,
                            const std::string& why) {
  std::set<std::string> seen;
  for (const auto& id : ids) {
    if (!seen.insert(id).second) {
      throw core::ConfigError("two slides share the id '" + id + "' (" + why + ")", source, 0, key);
    }
  }
}

core::Schema& declare_input_keys(core::Schema& schema, bool files) {
  if (files) {
    schema.string_list("input.slides", {},
                       "Slide files or globs (e.g. data/slides/*.svs); a single .csv is read as input.csv");
  }
  return schema
      .string("input.csv", "",
              files ? "dataset.csv: columns slide, label, annotation (or annotation_xml/_geojson), split, slide_id, mpp"
                    : "Ground truth dataset.csv: columns slide_id, slide, label, annotation_xml/_geojson, split, mpp")
      .string_list("input.splits", {}, "With input.csv: only the slides of these splits (empty = every row)")
      .number("input.assume_mpp", 0.0, "um/px for slides that record none (0 = such slides fail)", 0, 100);
}

std::string input_csv(const core::Config& config) {
  const std::string& csv = config.get_string("input.csv");
  const core::Schema& schema = config.schema();
  if (schema.find("input.slides") == nullptr) return csv;
  const auto& files = config.get_string_list("input.slides");
  if (!csv.empty() && !files.empty()) {
    throw core::ConfigError("give the slides either as input.slides (files or globs) or as input.csv, not both",
                            config.source(), 0, "input.slides");
  }
  if (files.size() == 1 && std::filesystem::path(files.front()).extension() == ".csv") return files.front();
  return csv;
}

namespace {

// The rows of a dataset.csv, less those outside `splits` (when given).
std::vector<ListedSlide> dataset_slides(const std::string& csv_path, const std::vector<std::string>& splits,
                                        const std::string& source, const std::string& splits_key) {
  const auto dataset = read_dataset_csv(csv_path, {.slide = true, .label = false});
  if (!splits.empty() && !dataset.has_column("split")) {
    throw core::ConfigError(
        fmt::format("splits {} were asked for, but {} has no 'split' column", fmt::join(splits, ", "), csv_path),
        source, 0, splits_key);
  }
  std::vector<ListedSlide> slides;
  std::set<std::string> present;
  for (const auto& row : dataset.rows) {
    present.insert(row.split.empty() ? "(none)" : row.split);
    if (!splits.empty() && std::find(splits.begin(), splits.end(), row.split) == splits.end()) continue;
    slides.push_back({row.id, row.slide, row.mpp.value_or(0.0)});
  }
  if (slides.empty() && !splits.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {} (the list has: {})", csv_path,
                                        fmt::join(splits, ", "), fmt::join(present, ", ")),
                            source, 0, splits_key);
  }
  return slides;
}

// Unique ids and at least one slide.
std::vector<ListedSlide> checked_slides(std::vector<ListedSlide> slides, const std::string& source,
                                        const std::string& key) {
  std::vector<std::string> ids;
  for (const auto& s : slides) ids.push_back(s.id);
  check_unique_slide_ids(ids, source, key,
                         "ids are file names without extension; the outputs would overwrite each other");
  if (slides.empty()) throw core::ConfigError("no slides to run", source, 0, key);
  return slides;
}

}  // namespace

std::vector<ListedSlide> list_input_slides(const core::Config& config) {
  const std::string csv = input_csv(config);
  if (csv.empty()) {
    return list_slides(config.get_string_list("input.slides"), config.get_string_list("input.splits"), config.source(),
                       "input.slides", "input.splits");
  }
  // input.csv is read as a dataset.csv whatever its name ends with.
  const std::string key = config.get_string("input.csv") == csv ? "input.csv" : "input.slides";
  return checked_slides(dataset_slides(csv, config.get_string_list("input.splits"), config.source(), "input.splits"),
                        config.source(), key);
}

std::vector<ListedSlide> list_slides(const std::vector<std::string>& entries, const std::vector<std::string>& splits,
                                     const std::string& source, const std::string& key, const std::string& splits_key) {
  if (entries.empty()) {
    throw core::ConfigError("no slides given (--slides, or the job's '" + key + "' key)", source, 0, key);
  }
  std::vector<ListedSlide> slides;
  if (entries.size() == 1 && std::filesystem::path(entries.front()).extension() == ".csv") {
    slides = dataset_slides(entries.front(), splits, source, splits_key);
  } else {
    if (!splits.empty()) {
      throw core::ConfigError("splits select rows of a dataset.csv; the slides here are files or globs", source, 0,
                              splits_key);
    }
    for (const auto& path : expand_slide_patterns(entries, source, key)) {
      slides.push_back({slide_id_of(path), path, 0.0});
    }
  }
  return checked_slides(std::move(slides), source, key);
}

}  // namespace tessera::io
