// Plain CSV as the slide lists use it (dataset.csv, tile and infer inputs, evaluate's ground truth).
#pragma once

#include <string>
#include <vector>

namespace tessera::core {

// One line's fields: separated by commas, optionally "quoted" (with "" for a quote inside); a trailing '\r' of a
// Windows line end is dropped. An empty line is one empty field. A quote left open at the end of the line is
// taken as closed there.
std::vector<std::string> split_csv_line(const std::string& line);

// The same, for files where a quote left open is a mistake to report (a field cannot span lines here): throws
// an InputError naming `file`, the 1-based `line_number` and the column (its name from `header` when given, else
// its 1-based number).
std::vector<std::string> split_csv_line(const std::string& line, const std::string& file, int line_number,
                                        const std::vector<std::string>& header = {});

}  // namespace tessera::core
