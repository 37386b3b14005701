#include "io/slide_list.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "io/dataset.h"

namespace tessera::io {

std::string slide_id_of(const std::string& path) { return std::filesystem::path(path).stem().string(); }

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

std::vector<ListedSlide> list_slides(const std::vector<std::string>& entries, const std::vector<std::string>& splits,
                                     const std::string& source, const std::string& key, const std::string& splits_key) {
  if (entries.empty()) {
    throw core::ConfigError("no slides given (--" + key + " or the job's '" + key + "' key)", source, 0, key);
  }
  std::vector<ListedSlide> slides;
  if (entries.size() == 1 && std::filesystem::path(entries.front()).extension() == ".csv") {
    const std::string& csv_path = entries.front();
    const auto dataset = read_dataset_csv(csv_path, {.slide = true, .label = false});
    if (!splits.empty() && !dataset.has_column("split")) {
      throw core::ConfigError(
          fmt::format("splits {} were asked for, but {} has no 'split' column", fmt::join(splits, ", "), csv_path),
          source, 0, splits_key);
    }
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
  } else {
    if (!splits.empty()) {
      throw core::ConfigError("splits select rows of a dataset.csv; the slides here are files or globs", source, 0,
                              splits_key);
    }
    for (const auto& path : expand_slide_patterns(entries, source, key))
      slides.push_back({slide_id_of(path), path, 0.0});
  }
  std::vector<std::string> ids;
  for (const auto& s : slides) ids.push_back(s.id);
  check_unique_slide_ids(ids, source, key,
                         "ids are file names without extension; the outputs would overwrite each other");
  if (slides.empty()) throw core::ConfigError("no slides to run", source, 0, key);
  return slides;
}

}  // namespace tessera::io
