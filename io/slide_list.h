// The slides of a job given as files and globs: one expansion and one id rule for every verb (tile, infer).
//
// A glob's matches are taken in sorted order; a glob that matches nothing is a mistake in the job (a ConfigError
// naming the setting), while a plain path that does not exist is kept, to fail later as that slide. A slide's id is
// its file name without the extension; two slides with one id are a ConfigError (their outputs would collide).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace tessera::io {

// The slides of a job, named alike in every verb that reads slides (tile, infer, evaluate):
//   input.slides      slide files or globs; a single .csv among them is read as input.csv
//   input.csv         a dataset.csv (io/dataset.h): one row per slide
//   input.splits      with input.csv: only the rows of these splits (empty = every row)
//   input.assume_mpp  um/px for slides that record none (0 = such slides fail)
// `files`: whether the verb takes input.slides (evaluate needs a dataset.csv's labels, so it does not).
core::Schema& declare_input_keys(core::Schema& schema, bool files = true);

// The dataset.csv of a job declared with declare_input_keys: input.csv, or input.slides when it is one .csv; ""
// when the job names slide files. ConfigError naming input.slides when both input.slides and input.csv are given.
std::string input_csv(const core::Config& config);

// "data/slides/tumor_001.tif" → "tumor_001"; a DICOM series (a folder, or one file of it) → its folder's name, or its
// Series Instance UID when the folder holds several series (io/dicom_slide.h).
std::string slide_id_of(const std::string& path);

// The bytes of a slide's files, by which infer orders and splits the slides over the ranks: a file's size; a folder's
// (a DICOM series) regular files added up; a DICOM file named directly, its folder's (where the reader finds its
// series; other series there count too). 0 when the path cannot be read (the slide fails when it is opened).
std::uintmax_t slide_bytes(const std::string& path);

// Files and globs → slide paths, in the order given (each glob's matches sorted). `source` and `key` name the
// setting in errors (the job file and e.g. "input.slides").
std::vector<std::string> expand_slide_patterns(const std::vector<std::string>& patterns, const std::string& source,
                                               const std::string& key);

// ConfigError naming `key` when two of `ids` are equal: "two slides share the id 'x' (<why>)".
void check_unique_slide_ids(const std::vector<std::string>& ids, const std::string& source, const std::string& key,
                            const std::string& why);

// One slide of a job that names its slides as files, globs or one dataset.csv.
struct ListedSlide {
  std::string id;
  std::string path;
  double mpp = 0.0;  // the dataset's per-slide override (0 = from the slide)
};

// The slides of `entries`: one dataset.csv (io/dataset.h; `splits` selects rows by their split column), or files
// and globs (then `splits` must be empty). ConfigError naming `key` or `splits_key` of `source` for no slides, a
// glob matching nothing, splits without a dataset.csv or without its split column, no row in the splits, or two
// slides with one id (their outputs would overwrite each other).
std::vector<ListedSlide> list_slides(const std::vector<std::string>& entries, const std::vector<std::string>& splits,
                                     const std::string& source, const std::string& key, const std::string& splits_key);
// The same for a job declared with declare_input_keys.
std::vector<ListedSlide> list_input_slides(const core::Config& config);

}  // namespace tessera::io
