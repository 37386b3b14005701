#include "core/csv.h"

#include "core/error.h"

namespace tessera::core {
namespace {

// Splits `line`; returns whether a quote was still open at its end.
bool split(const std::string& line, std::vector<std::string>& fields) {
  fields.assign(1, std::string());
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else if (c != '\r' || i + 1 != line.size()) {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return quoted;
}

}  // namespace

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  split(line, fields);
  return fields;
}

std::vector<std::string> split_csv_line(const std::string& line, const std::string& file, int line_number,
                                        const std::vector<std::string>& header) {
  std::vector<std::string> fields;
  if (split(line, fields)) {
    const std::size_t index = fields.size() - 1;  // the field the open quote is in
    const std::string column =
        index < header.size() ? "column '" + header[index] + "'" : "field " + std::to_string(index + 1);
    throw InputError("line " + std::to_string(line_number) + ", " + column +
                         ": unterminated quote (a field that opens with \" must close with \" on the same line)",
                     file);
  }
  return fields;
}

}  // namespace tessera::core
