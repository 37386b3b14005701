// Plain CSV as the slide lists use it (dataset.csv, tile and infer inputs, evaluate's ground truth).
#pragma once

#include <string>
#include <vector>

namespace tessera::io {

// One line's fields: separated by commas, optionally "quoted" (with "" for a quote inside); a trailing '\r' of a
// Windows line end is dropped. An empty line is one empty field.
std::vector<std::string> split_csv_line(const std::string& line);

}  // namespace tessera::io
