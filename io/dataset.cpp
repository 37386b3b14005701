#include "io/dataset.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <system_error>

#include "core/config.h"
#include "core/csv.h"
#include "core/error.h"
#include "io/slide_list.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::optional<SlideLabel> parse_label(const std::string& text) {
  const std::string word = lower(trim(text));
  if (word == "tumor" || word == "tumour" || word == "1") return SlideLabel::tumour;
  if (word == "normal" || word == "0") return SlideLabel::normal;
  return std::nullopt;
}

// A positive finite number, the whole field (locale-independent).
std::optional<double> parse_mpp(const std::string& text) {
  const std::string word = trim(text);
  double value = 0.0;
  const auto result = std::from_chars(word.data(), word.data() + word.size(), value);
  if (word.empty() || result.ec != std::errc() || result.ptr != word.data() + word.size() || !std::isfinite(value) ||
      !(value > 0.0)) {
    return std::nullopt;
  }
  return value;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

const char* to_string(SlideLabel label) {
  switch (label) {
    case SlideLabel::tumour:
      return "tumor";
    case SlideLabel::normal:
      return "normal";
    case SlideLabel::unknown:
      break;
  }
  return "";
}

bool Dataset::has_column(const std::string& name) const {
  return std::find(columns.begin(), columns.end(), name) != columns.end();
}

Dataset read_dataset_csv(const std::string& path, const DatasetNeeds& needs) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw core::FileNotFoundError(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError("cannot open the slide list for reading", path);
  std::string text;
  if (!std::getline(in, text)) throw core::InputError("empty slide list (no header line)", path);
  const auto names = core::split_csv_line(text, path, 1);
  Dataset dataset;
  std::map<std::string, std::size_t> column;
  for (std::size_t i = 0; i < names.size(); ++i) {
    dataset.columns.push_back(trim(names[i]));
    column.emplace(dataset.columns.back(), i);
  }
  const auto missing = [&](const std::string& what) {
    return core::InputError("line 1: no " + what + " column (the header has: " + join(names) + ")", path);
  };
  if (needs.slide && !column.contains("slide")) throw missing("'slide'");
  if (!column.contains("slide") && !column.contains("slide_id")) throw missing("'slide' or 'slide_id'");
  if (needs.label && !column.contains("label")) throw missing("'label'");

  const fs::path base = fs::path(path).parent_path();
  const auto resolve = [&](const std::string& p) {
    return p.empty() || fs::path(p).is_absolute() ? p : (base / p).string();
  };
  auto& rows = dataset.rows;
  for (int number = 2; std::getline(in, text); ++number) {
    if (trim(text).empty() || text == "\r") continue;
    const auto fields = core::split_csv_line(text, path, number, dataset.columns);
    const auto field = [&](const std::string& name) -> std::string {
      const auto it = column.find(name);
      return it != column.end() && it->second < fields.size() ? trim(fields[it->second]) : std::string();
    };
    const auto bad = [&](const std::string& name, const std::string& problem) {
      return core::InputError("line " + std::to_string(number) + ", column '" + name + "': " + problem, path);
    };
    DatasetRow row;
    row.line = number;
    row.slide = resolve(field("slide"));
    if (needs.slide && row.slide.empty()) throw bad("slide", "empty (every row needs its slide file)");
    row.id = field("slide_id");
    if (row.id.empty()) row.id = slide_id_of(row.slide);
    if (row.id.empty()) throw bad(column.contains("slide_id") ? "slide_id" : "slide", "empty (no slide id)");

    const std::string label = field("label");
    if (!label.empty() || needs.label) {
      const auto parsed = parse_label(label);
      if (!parsed) {
        std::string message = "'" + label + "' is not tumor or normal";
        if (const auto suggestion = core::closest_match(lower(label), {"tumor", "tumour", "normal"});
            !suggestion.empty()) {
          message += "; did you mean '" + suggestion + "'?";
        }
        throw bad("label", message);
      }
      row.label = *parsed;
    }
    row.split = field("split");
    for (const char* name : {"annotation", "annotation_xml", "annotation_geojson"}) {
      if (row.annotation.empty()) row.annotation = resolve(field(name));
    }
    if (const std::string mpp = field("mpp"); !mpp.empty()) {
      row.mpp = parse_mpp(mpp);
      if (!row.mpp) throw bad("mpp", "'" + mpp + "' is not a positive number (µm per pixel of level 0)");
    }
    rows.push_back(std::move(row));
  }
  if (in.bad()) throw core::InputError("read error", path);
  return dataset;
}

}  // namespace tessera::io
