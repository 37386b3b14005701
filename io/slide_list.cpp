#include "io/slide_list.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"

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

}  // namespace tessera::io
