// dataset.csv (io/dataset.h): the one reader tile, infer and evaluate share.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/csv.h"
#include "core/error.h"
#include "io/dataset.h"
#include "io/slide_list.h"
#include "tests/testing/testing.h"

namespace {

namespace io = tessera::io;
namespace core = tessera::core;
namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(DatasetCsv, ReadsEveryColumnAndResolvesPathsAgainstTheFilesFolder) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("dataset.csv");
  // Columns in an unusual order, an extra column, quoted fields with a comma and a quote, spellings of the labels
  // in several cases, a blank line, an absolute path, and both annotation columns (annotation wins).
  write_text(path,
             "split,notes,label,slide,annotation_xml,annotation,mpp,slide_id\n"
             "train,\"first, \"\"best\"\"\",Tumor,slides/a.svs,slides/a.xml,,0.25,\n"
             "\n"
             "test,,NORMAL,/data/b.tif,,,,\n"
             "val,,tumour,c.svs,c.xml,c.geojson, 1e-1 ,custom\n"
             "val,,1,d.svs,,,,\n"
             "val,,0,e.svs,,,,\n");
  const auto dataset = io::read_dataset_csv(path, {.slide = true, .label = true});
  EXPECT_TRUE(dataset.has_column("notes"));
  EXPECT_FALSE(dataset.has_column("tumour_regions"));
  const auto& rows = dataset.rows;
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].line, 2);
  EXPECT_EQ(rows[0].id, "a");
  EXPECT_EQ(rows[0].slide, (dir.path() / "slides/a.svs").string());
  EXPECT_EQ(rows[0].annotation, (dir.path() / "slides/a.xml").string());
  EXPECT_EQ(rows[0].label, io::SlideLabel::tumour);
  EXPECT_EQ(rows[0].split, "train");
  ASSERT_TRUE(rows[0].mpp.has_value());
  EXPECT_DOUBLE_EQ(*rows[0].mpp, 0.25);
  EXPECT_EQ(rows[1].line, 4);  // the blank line still counts
  EXPECT_EQ(rows[1].slide, "/data/b.tif");
  EXPECT_EQ(rows[1].id, "b");
  EXPECT_EQ(rows[1].label, io::SlideLabel::normal);
  EXPECT_FALSE(rows[1].mpp.has_value());
  EXPECT_EQ(rows[1].annotation, "");
  EXPECT_EQ(rows[2].id, "custom");
  EXPECT_EQ(rows[2].label, io::SlideLabel::tumour);
  EXPECT_EQ(rows[2].annotation, (dir.path() / "c.geojson").string());  // 'annotation' before 'annotation_xml'
  EXPECT_DOUBLE_EQ(rows[2].mpp.value_or(0.0), 0.1);
  EXPECT_EQ(rows[3].label, io::SlideLabel::tumour);
  EXPECT_EQ(rows[4].label, io::SlideLabel::normal);
  EXPECT_STREQ(io::to_string(rows[0].label), "tumor");
  EXPECT_STREQ(io::to_string(rows[1].label), "normal");
  EXPECT_STREQ(io::to_string(io::SlideLabel::unknown), "");
}

TEST(DatasetCsv, LabelAndSlideFileAreRequiredOnlyWhenAsked) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("list.csv");
  write_text(path, "slide,label\na.svs,\nb.svs,normal\n");
  const auto rows = io::read_dataset_csv(path, {.slide = true, .label = false}).rows;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].label, io::SlideLabel::unknown);
  EXPECT_EQ(rows[1].label, io::SlideLabel::normal);
  EXPECT_THROW(io::read_dataset_csv(path, {.slide = true, .label = true}), core::InputError);

  // evaluate's ground truth may name slides by id only (the mpp column then gives the resolution).
  write_text(path, "slide_id,label,mpp\nx,tumor,0.5\n");
  const auto by_id = io::read_dataset_csv(path, {.slide = false, .label = true}).rows;
  ASSERT_EQ(by_id.size(), 1u);
  EXPECT_EQ(by_id[0].id, "x");
  EXPECT_EQ(by_id[0].slide, "");
  EXPECT_THROW(io::read_dataset_csv(path, {.slide = true, .label = true}), core::InputError);
  // Even a wrong label is an error where the label is optional: it is never silently "unknown".
  write_text(path, "slide,label\na.svs,tumr\n");
  EXPECT_THROW(io::read_dataset_csv(path, {.slide = true, .label = false}), core::InputError);
}

TEST(DatasetCsv, MissingFileIsFileNotFound) {
  tessera::testing::TempDir dir;
  try {
    io::read_dataset_csv(dir.file("none.csv"));
    ADD_FAILURE() << "no error";
  } catch (const core::FileNotFoundError& e) {
    EXPECT_EQ(e.file(), dir.file("none.csv"));
  }
}

TEST(CsvLine, AnOpenQuoteIsReportedOnlyWhenAFileIsNamed) {
  EXPECT_EQ(core::split_csv_line("a,\"b,c"), (std::vector<std::string>{"a", "b,c"}));
  EXPECT_EQ(core::split_csv_line("a,\"b,\"\"c\"\"\",d\r", "f.csv", 7), (std::vector<std::string>{"a", "b,\"c\"", "d"}));
  try {
    core::split_csv_line("a,\"b,c", "f.csv", 7, {"one", "two"});
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), "f.csv");
    EXPECT_NE(std::string(e.what()).find("line 7, column 'two': unterminated quote"), std::string::npos) << e.what();
  }
}

// Every folder under tests/data/datasets holds a broken dataset.csv and expected.txt, whose non-empty lines must
// each appear in the error. The file is read as evaluate reads it (slide and label required).
std::vector<std::string> dataset_cases() {
  std::vector<std::string> names;
  const fs::path root = tessera::testing::test_data_dir() / "datasets";
  if (fs::is_directory(root)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.is_directory()) names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

class BrokenDataset : public ::testing::TestWithParam<std::string> {};

TEST_P(BrokenDataset, FailsNamingTheFileLineAndColumn) {
  const fs::path folder = tessera::testing::test_data_dir() / "datasets" / GetParam();
  const std::string input = (folder / "dataset.csv").string();
  ASSERT_TRUE(fs::is_regular_file(input));
  std::vector<std::string> expected;
  std::istringstream lines(read_text(folder / "expected.txt"));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) expected.push_back(line);
  }
  ASSERT_FALSE(expected.empty()) << "expected.txt is empty";
  try {
    io::read_dataset_csv(input, {.slide = true, .label = true});
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.file(), input);
    EXPECT_NE(message.find(input), std::string::npos) << message;
    for (const auto& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BrokenDataset, ::testing::ValuesIn(dataset_cases()),
                         [](const ::testing::TestParamInfo<std::string>& instance) { return instance.param; });

TEST(DatasetCsv, EveryBrokenCaseIsFound) { EXPECT_GE(dataset_cases().size(), 10u); }

}  // namespace

// ---- the slides of a job (io/slide_list.h) ----

namespace {

const core::Schema& input_schema() {
  static const core::Schema schema = [] {
    core::Schema s;
    io::declare_input_keys(s);
    return s;
  }();
  return schema;
}

TEST(InputSlides, InputCsvIsADatasetWhateverItsNameEndsWith) {
  tessera::testing::TempDir dir;
  std::ofstream(dir.file("truth.txt")) << "slide,split\na.svs,test\nb.svs,train\n";
  const auto config = core::Config::parse(
      input_schema(), "input:\n  csv: " + dir.file("truth.txt") + "\n  splits: [test]\n", "job.yaml");
  const auto slides = io::list_input_slides(config);
  ASSERT_EQ(slides.size(), 1u);
  EXPECT_EQ(slides[0].id, "a");
  EXPECT_EQ(slides[0].path, dir.file("a.svs"));
  // The same file named in input.slides is a slide (a glob), not a dataset: only .csv is read as one there.
  const auto as_file = io::list_input_slides(
      core::Config::parse(input_schema(), "input:\n  slides: [" + dir.file("truth.txt") + "]\n", "job.yaml"));
  ASSERT_EQ(as_file.size(), 1u);
  EXPECT_EQ(as_file[0].id, "truth");
}

// The bytes by which infer orders and splits slides: a DICOM series counts every file of its folder, whether the folder
// or one of its files is named (a file with the DICOM preamble, "DICM" at byte 128); another slide its file's size.
TEST(InputSlides, SlideBytesCountEveryFileOfADicomSeries) {
  tessera::testing::TempDir dir;
  const fs::path series = dir.file("series");
  fs::create_directories(series / "nested");
  write_text((series / "1.dcm").string(), std::string(128, '\0') + "DICM" + std::string(868, 'x'));  // 1000 bytes
  write_text((series / "2.dcm").string(), std::string(128, '\0') + "DICM" + std::string(368, 'x'));  // 500
  write_text((series / "nested/3.dcm").string(), std::string(700, 'x'));  // not the series' (the reader skips it)
  write_text(dir.file("plain.svs"), std::string(300, 'x'));
  EXPECT_EQ(io::slide_bytes(series.string()), 1500u);
  EXPECT_EQ(io::slide_bytes((series / "2.dcm").string()), 1500u);
  EXPECT_EQ(io::slide_bytes((series / "nested/3.dcm").string()), 700u) << "no preamble: the file alone";
  EXPECT_EQ(io::slide_bytes(dir.file("plain.svs")), 300u);
  EXPECT_EQ(io::slide_bytes(dir.file("missing.svs")), 0u);
}

}  // namespace
