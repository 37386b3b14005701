// dataset.csv: the slide list that `tile`, `infer` and `evaluate` read (and `synth` writes), read in one place
// so that every command accepts the same file.
//
// Columns are found by name in the header line, in any order; other columns are ignored:
//   slide        the slide file
//   slide_id     the slide's id (default: the slide file's name without extension)
//   label        tumor (also tumour, 1) or normal (also 0), in any case; empty = unknown, unless required
//   annotation, annotation_xml, annotation_geojson
//                the annotation file: the first non-empty of these, in this order
//   split        free text (train, val, test, ...)
//   mpp          µm/px of the slide's level 0, overriding what the slide records: a positive number
// Relative paths are relative to the CSV's folder. Blank lines are skipped. A field in double quotes may hold
// commas ("" is a quote inside it); a quote left open is an error.
// Every mistake is one core::InputError naming the file, the line and the column, e.g.
//   file 'data/dataset.csv': line 4, column 'label': 'tumr' is not tumor or normal; did you mean 'tumor'?
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessera::io {

enum class SlideLabel { unknown, normal, tumour };

// "tumor", "normal" or "" (the spelling written to manifests and reports).
const char* to_string(SlideLabel label);

struct DatasetRow {
  int line = 0;  // 1-based line in the file
  std::string id;
  std::string slide;  // resolved path; "" when the file has no slide column (only slide_id)
  SlideLabel label = SlideLabel::unknown;
  std::string split;
  std::string annotation;  // resolved path; "" = none
  std::optional<double> mpp;
};

// What a command needs from the file beyond an id per row.
struct DatasetNeeds {
  bool slide = true;   // a 'slide' column with a file on every row (else 'slide' or 'slide_id' suffices)
  bool label = false;  // a 'label' column with tumor or normal on every row
};

struct Dataset {
  std::vector<std::string> columns;  // the header's names, in order
  std::vector<DatasetRow> rows;      // in file order
  bool has_column(const std::string& name) const;
};

// Reads the file; core::FileNotFoundError when it does not exist, core::InputError for any mistake in it.
Dataset read_dataset_csv(const std::string& path, const DatasetNeeds& needs = {});

}  // namespace tessera::io
