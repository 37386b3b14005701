// io::prepare_annotations (io/annotations.h): annotations clipped to the slide, and a tumour slide whose
// annotation file labels no tumour is an input error rather than a slide of normal tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/annotations.h"
#include "preprocessing/tiling.h"
#include "tests/testing/testing.h"

namespace {

namespace io = tessera::io;
namespace prep = tessera::prep;
namespace core = tessera::core;
namespace fs = std::filesystem;

// The slide every data-driven case is checked against.
constexpr std::int64_t kSide = 10000;

io::Ring square(double x, double y, double side) {
  return {{x, y}, {x + side, y}, {x + side, y + side}, {x, y + side}};
}

io::Annotation polygon(const std::string& group, io::Ring outer, std::vector<io::Ring> holes = {}) {
  io::Annotation a;
  a.group = group;
  a.outer = std::move(outer);
  a.holes = std::move(holes);
  return a;
}

io::AnnotationCheck tumour_slide(const std::string& path, std::int64_t width, std::int64_t height) {
  return {path, "labels.tumour_classes", true, width, height};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every folder under tests/data/tumour-annotations holds an annotation file that reads without error but labels
// no tumour on a 10000 × 10000 slide labelled tumour (default classes), and expected.txt, whose non-empty lines
// must each appear in the error.
std::vector<std::string> cases() {
  std::vector<std::string> names;
  const fs::path root = tessera::testing::test_data_dir() / "tumour-annotations";
  if (fs::is_directory(root)) {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.is_directory()) names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

class LabelsNothing : public ::testing::TestWithParam<std::string> {};

TEST_P(LabelsNothing, IsAnInputErrorNamingTheFileTheGroupsAndTheTumourClasses) {
  const fs::path folder = tessera::testing::test_data_dir() / "tumour-annotations" / GetParam();
  fs::path input;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.path().filename() != "expected.txt") input = entry.path();
  }
  ASSERT_FALSE(input.empty()) << "no input file";
  std::vector<std::string> expected;
  std::istringstream lines(read_text(folder / "expected.txt"));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) expected.push_back(line);
  }
  ASSERT_FALSE(expected.empty()) << "expected.txt is empty";
  const auto annotations = io::read_annotations(input.string());  // a valid file
  // On a slide not labelled tumour the same file is fine.
  EXPECT_NO_THROW(io::prepare_annotations(annotations, {}, {input.string(), "x", false, kSide, kSide}));
  try {
    io::prepare_annotations(annotations, {}, tumour_slide(input.string(), kSide, kSide));
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.file(), input.string());
    EXPECT_NE(message.find(input.string()), std::string::npos) << message;
    EXPECT_NE(message.find("the slide is labelled tumour but"), std::string::npos) << message;
    for (const auto& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LabelsNothing, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<std::string>& instance) { return instance.param; });

TEST(TumourAnnotations, EveryDataCaseIsFound) { EXPECT_GE(cases().size(), 8u); }

TEST(TumourAnnotations, NoSuggestionForExclusionGroupsOrUnrelatedNames) {
  // "_2" is one edit from "_0", and "Stroma" is no tumour class: neither is a misspelling to point out.
  for (const std::string group : {"_2", "Stroma", "Necrosis"}) {
    try {
      io::prepare_annotations({polygon(group, square(10, 10, 100))}, {}, tumour_slide("a.xml", kSide, kSide));
      ADD_FAILURE() << "no error for " << group;
    } catch (const core::InputError& e) {
      EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
    }
  }
  // A configured setting name is what the message tells the user to change (evaluate calls it classes.tumour).
  io::AnnotationClasses classes;
  classes.tumour = {"Carcinoma"};
  try {
    io::prepare_annotations({polygon("carcinoma", square(10, 10, 100))}, classes,
                            {"b.geojson", "classes.tumour", true, 0, 0});
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tumour classes (classes.tumour): Carcinoma"), std::string::npos) << message;
    EXPECT_NE(message.find("did you mean 'Carcinoma' for 'carcinoma'?"), std::string::npos) << message;
  }
}

TEST(TumourAnnotations, PartlyOutsidePolygonsAreClippedToTheSlide) {
  // A tumour square over the top-left corner (a quarter inside), one with a hole reaching past the right edge,
  // one wholly outside, and one wholly inside.
  const std::vector<io::Annotation> read = {
      polygon("_0", square(-500, -500, 1000)),
      polygon("_0", square(9000, 5000, 2000), {square(9500, 5500, 1000)}),
      polygon("_0", square(20000, 20000, 100)),
      polygon("_0", square(3000, 3000, 100)),
  };
  const auto out = io::prepare_annotations(read, {}, tumour_slide("c.xml", kSide, kSide));
  ASSERT_EQ(out.size(), 3u) << "the polygon wholly outside is dropped";
  EXPECT_DOUBLE_EQ(io::annotation_area(out[0]), 500.0 * 500.0);
  // 1000 × 2000 inside, minus the hole's 500 × 1000 inside.
  EXPECT_DOUBLE_EQ(io::annotation_area(out[1]), 1000.0 * 2000.0 - 500.0 * 1000.0);
  EXPECT_DOUBLE_EQ(io::annotation_area(out[2]), 100.0 * 100.0);
  EXPECT_EQ(out[2].outer, read[3].outer) << "polygons inside the slide are kept as they are";
  for (const auto& a : out) {
    const cv::Rect2d box = io::bounding_box(a.outer);
    EXPECT_GE(box.x, 0.0);
    EXPECT_GE(box.y, 0.0);
    EXPECT_LE(box.x + box.width, static_cast<double>(kSide));
    EXPECT_LE(box.y + box.height, static_cast<double>(kSide));
  }
  // The labels from the clipped polygons: the corner tile is wholly tumour.
  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(out, {}, tumour, exclusion);
  EXPECT_DOUBLE_EQ(prep::tumour_fraction(tumour, exclusion, 0, 0, 500, 50), 1.0);
  EXPECT_DOUBLE_EQ(prep::tumour_fraction(tumour, exclusion, 9500, 5500, 500, 50), 0.0);  // the hole
}

TEST(TumourAnnotations, AbsurdButFiniteCoordinatesAreClippedExactly) {
  // A triangle with one vertex at x = 1e300: inside the slide it is the band under the line from (0, 1000) to
  // (1e300, 0), which is 1000 high everywhere on the slide to within 1e-293.
  const std::vector<io::Annotation> read = {polygon("Tumor", {{0, 0}, {1e300, 0}, {0, 1000}})};
  const auto out = io::prepare_annotations(read, {}, tumour_slide("d.geojson", kSide, kSide));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(io::annotation_area(out[0]), 1000.0 * static_cast<double>(kSide), 1e-3);
  for (const auto& p : out[0].outer) {
    EXPECT_TRUE(p.x >= 0.0 && p.x <= static_cast<double>(kSide)) << p.x;
    EXPECT_TRUE(p.y >= 0.0 && p.y <= 1000.0) << p.y;
  }
}

TEST(TumourAnnotations, UnknownSlideSizeClipsToTheRangeOfAnySlide) {
  // evaluate without the slide file: negative coordinates and absurd ones are still off any slide.
  const std::vector<io::Annotation> read = {polygon("_0", square(-500, -500, 1000)),
                                            polygon("_0", square(5e6, 5e6, 1000)),
                                            polygon("_0", square(1e300, 1e300, 1e299))};
  const auto out = io::prepare_annotations(read, {}, tumour_slide("e.xml", 0, 0));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_DOUBLE_EQ(io::annotation_area(out[0]), 500.0 * 500.0);
  EXPECT_EQ(out[1].outer, read[1].outer);
  try {
    io::prepare_annotations({read[2]}, {}, tumour_slide("e.xml", 0, 0));
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("its tumour polygons lie wholly outside the level-0 range of any slide"),
              std::string::npos)
        << e.what();
  }
}

// The CAMELYON16 ground truth of tumor_009 names its group "metastasis" (CAMELYON17's spelling is
// "metastases"): with the default classes the slide would have been all normal.
TEST(TumourAnnotations, Camelyon16FileWithMetastasisGroup) {
  const fs::path file = tessera::testing::shared_data_dir() / "real-slides" / "camelyon16-tumor_009.xml";
  if (!fs::exists(file)) GTEST_SKIP() << "no real data at " << file << " (../shared/data is absent)";
  const auto annotations = io::read_annotations(file.string());
  ASSERT_FALSE(annotations.empty());
  try {
    io::prepare_annotations(annotations, {}, tumour_slide(file.string(), 0, 0));
    ADD_FAILURE() << "no error";
  } catch (const core::InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(file.string()), std::string::npos) << message;
    EXPECT_NE(message.find("'metastasis' (" + std::to_string(annotations.size()) + ")"), std::string::npos) << message;
    EXPECT_NE(message.find("did you mean 'metastases' for 'metastasis'?"), std::string::npos) << message;
  }
  // With the group configured as tumour (--set labels.tumour_classes=[metastasis]) the file labels tumour.
  io::AnnotationClasses classes;
  classes.tumour = {"metastasis"};
  const auto out = io::prepare_annotations(annotations, classes, tumour_slide(file.string(), 0, 0));
  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(out, classes, tumour, exclusion);
  EXPECT_EQ(tumour.size(), annotations.size());
  double area = 0.0;
  for (const auto& a : tumour) area += io::annotation_area(a);
  EXPECT_GT(area, 0.0);
}

}  // namespace
