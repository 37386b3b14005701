#include "analysis/detections.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::analysis {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  for (std::size_t start = 0;;) {
    const std::size_t comma = line.find(',', start);
    fields.push_back(
        trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

bool parse_number(std::string_view text, double& value) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::vector<Detection> read_detections(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::FileNotFoundError(path);
  std::vector<Detection> detections;
  std::array<std::size_t, 3> column = {0, 1, 2};  // p, x, y
  std::size_t needed = 3;
  std::string line;
  bool first = true;
  for (int row = 1; std::getline(in, line); ++row) {
    const std::string_view text = trim(line);
    if (text.empty()) continue;
    const auto fields = split_fields(text);
    double p = 0.0;
    const bool header = first && !parse_number(fields[0], p);
    first = false;
    if (header) {
      // A header: find the columns by name.
      column = {fields.size(), fields.size(), fields.size()};
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const std::string name = lower(fields[i]);
        if (name == "p" || name == "prob" || name == "probability" || name == "score" || name == "confidence") {
          column[0] = i;
        } else if (name == "x") {
          column[1] = i;
        } else if (name == "y") {
          column[2] = i;
        }
      }
      if (std::any_of(column.begin(), column.end(), [&](std::size_t c) { return c == fields.size(); })) {
        throw core::InputError(fmt::format("line {}: the header '{}' does not name the probability, X and Y columns "
                                           "(expected e.g. 'prob,x,y')",
                                           row, text),
                               path);
      }
      needed = *std::max_element(column.begin(), column.end()) + 1;
      continue;
    }
    if (fields.size() < needed) {
      throw core::InputError(fmt::format("line {}: expected prob,X,Y, got '{}'", row, text), path);
    }
    Detection d;
    if (!parse_number(fields[column[0]], d.p) || !parse_number(fields[column[1]], d.x) ||
        !parse_number(fields[column[2]], d.y)) {
      throw core::InputError(fmt::format("line {}: not a number in '{}'", row, text), path);
    }
    if (!(d.p >= 0.0 && d.p <= 1.0)) {
      throw core::InputError(fmt::format("line {}: probability {} is outside [0, 1]", row, fields[column[0]]), path);
    }
    if (!std::isfinite(d.x) || !std::isfinite(d.y)) {
      throw core::InputError(fmt::format("line {}: the position is not finite", row), path);
    }
    detections.push_back(d);
  }
  if (in.bad()) throw core::InputError("read error", path);
  return detections;
}

void write_detections_csv(const std::string& path, const std::vector<Detection>& detections) {
  std::string text;
  text.reserve(detections.size() * 24);
  for (const auto& d : detections) text += fmt::format("{:.6f},{},{}\n", d.p, d.x, d.y);
  core::write_file_atomic(path, text);
}

}  // namespace tessera::analysis
