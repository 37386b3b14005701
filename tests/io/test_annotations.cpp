#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/annotations.h"
#include "tests/testing/testing.h"

namespace {

using tessera::io::Annotation;
using tessera::io::AsapGroup;
using tessera::io::Ring;
namespace io = tessera::io;
namespace core = tessera::core;
namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Ring square(double x, double y, double side) { return {{x, y}, {x + side, y}, {x + side, y + side}, {x, y + side}}; }

void expect_ring_eq(const Ring& expected, const Ring& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].x, actual[i].x) << "point " << i;  // exact: numbers are written round-trippable
    EXPECT_EQ(expected[i].y, actual[i].y) << "point " << i;
  }
}

std::vector<Annotation> sample_annotations() {
  Annotation tumour;
  tumour.name = "Tumor 1";
  tumour.group = "_0";
  tumour.color = "#F4FA58";
  // Awkward coordinates: large level-0 values with fractions that have no short binary form.
  tumour.outer = {{61232.1, 112345.6}, {61900.35, 112301.2}, {62010.0, 113000.75}, {61100.125, 113100.3333333}};
  Annotation exclusion;
  exclusion.name = "Exclusion 1";
  exclusion.group = "_2";
  exclusion.color = "#64FE2E";
  exclusion.outer = square(61500, 112600, 100.5);
  Annotation other;
  other.name = "Spline 7";
  other.group = "metastases";
  other.type = "Spline";
  other.color = "#0000FF";
  other.outer = {{1, 2}, {3, 5}, {8, 13}, {21, 34}, {55, 89}};
  return {tumour, exclusion, other};
}

// ---------------------------------------------------------------------------------------------------------
// Geometry

TEST(AnnotationsGeometry, RingAreaOfKnownShapes) {
  EXPECT_DOUBLE_EQ(io::ring_area(square(10, 20, 30)), 900.0);
  Ring clockwise = square(10, 20, 30);
  std::reverse(clockwise.begin(), clockwise.end());
  EXPECT_DOUBLE_EQ(io::ring_area(clockwise), 900.0);  // orientation does not matter
  EXPECT_DOUBLE_EQ(io::ring_area({{0, 0}, {4, 0}, {0, 3}}), 6.0);
  // Far from the origin the result must not lose precision.
  EXPECT_DOUBLE_EQ(io::ring_area(square(1.0e6, 2.0e6, 0.5)), 0.25);
  EXPECT_DOUBLE_EQ(io::ring_area({{0, 0}, {1, 1}}), 0.0);
  EXPECT_DOUBLE_EQ(io::ring_area({}), 0.0);
  // A regular 720-gon approaches the circle.
  Ring circle;
  for (int i = 0; i < 720; ++i) {
    const double t = 2.0 * M_PI * i / 720.0;
    circle.emplace_back(500.0 + 100.0 * std::cos(t), 500.0 + 100.0 * std::sin(t));
  }
  EXPECT_NEAR(io::ring_area(circle), M_PI * 100.0 * 100.0, 1.0);
  // An L shape (concave).
  EXPECT_DOUBLE_EQ(io::ring_area({{0, 0}, {4, 0}, {4, 1}, {1, 1}, {1, 3}, {0, 3}}), 6.0);
}

TEST(AnnotationsGeometry, AnnotationAreaSubtractsHoles) {
  Annotation a;
  a.outer = square(0, 0, 10);
  a.holes = {square(1, 1, 2), square(5, 5, 3)};
  EXPECT_DOUBLE_EQ(io::annotation_area(a), 100.0 - 4.0 - 9.0);
  a.type = "PointSet";
  EXPECT_DOUBLE_EQ(io::annotation_area(a), 0.0);
}

TEST(AnnotationsGeometry, BoundingBox) {
  const cv::Rect2d box = io::bounding_box({{3, 7}, {-2, 4}, {5, -1}});
  EXPECT_DOUBLE_EQ(box.x, -2);
  EXPECT_DOUBLE_EQ(box.y, -1);
  EXPECT_DOUBLE_EQ(box.width, 7);
  EXPECT_DOUBLE_EQ(box.height, 8);
  EXPECT_DOUBLE_EQ(io::bounding_box({}).area(), 0.0);
}

// ---------------------------------------------------------------------------------------------------------
// ASAP XML

TEST(AnnotationsAsap, RoundTripKeepsNamesGroupsColoursAndExactCoordinates) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("a.xml");
  const auto written = sample_annotations();
  io::write_asap_xml(path, written, {{"_0", "#FF0000"}, {"_2", "#00FF00"}});
  const auto read = io::read_asap_xml(path);
  ASSERT_EQ(read.size(), written.size());
  for (std::size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].name, written[i].name);
    EXPECT_EQ(read[i].group, written[i].group);
    EXPECT_EQ(read[i].type, written[i].type);
    EXPECT_EQ(read[i].color, written[i].color);
    expect_ring_eq(written[i].outer, read[i].outer);
  }
  // Groups: the listed ones in order, then the one only used by an annotation ("metastases").
  const std::string text = read_text(path);
  const auto g0 = text.find("<Group Name=\"_0\" PartOfGroup=\"None\" Color=\"#FF0000\"");
  const auto g2 = text.find("<Group Name=\"_2\" PartOfGroup=\"None\" Color=\"#00FF00\"");
  const auto gm = text.find("<Group Name=\"metastases\"");
  ASSERT_NE(g0, std::string::npos);
  ASSERT_NE(g2, std::string::npos);
  ASSERT_NE(gm, std::string::npos);
  EXPECT_LT(g0, g2);
  EXPECT_LT(g2, gm);
  // No temporary file is left beside the output.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);
}

TEST(AnnotationsAsap, HolesBecomeExclusionAnnotations) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("holes.xml");
  Annotation a;
  a.name = "Tumor 1";
  a.group = "_0";
  a.outer = square(0, 0, 1000);
  a.holes = {square(100, 100, 50)};
  io::write_asap_xml(path, {a});
  const auto read = io::read_asap_xml(path);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].group, "_0");
  EXPECT_EQ(read[0].color, "#FF0000");  // empty colour: the group's default
  EXPECT_EQ(read[1].group, "_2");
  expect_ring_eq(a.holes[0], read[1].outer);
  EXPECT_DOUBLE_EQ(io::annotation_area(read[0]) - io::annotation_area(read[1]), io::annotation_area(a));
}

TEST(AnnotationsAsap, ReadsCamelyon16StyleFile) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("tumor_001.xml");
  // As ASAP writes them: Order out of sequence here and there, a "_2" exclusion inside a "_0" region, and a
  // Dot annotation that has no area.
  write_text(path, R"(<?xml version="1.0"?>
<ASAP_Annotations>
	<Annotations>
		<Annotation Name="Annotation 0" Type="Polygon" PartOfGroup="_0" Color="#F4FA58">
			<Coordinates>
				<Coordinate Order="0" X="64281.7188" Y="110183.398" />
				<Coordinate Order="2" X="64530.5" Y="110422.203" />
				<Coordinate Order="1" X="64440.2031" Y="110173.203" />
				<Coordinate Order="3" X="64289.3008" Y="110440.398" />
			</Coordinates>
		</Annotation>
		<Annotation Name="Annotation 1" Type="Polygon" PartOfGroup="_2" Color="#64FE2E">
			<Coordinates>
				<Coordinate Order="0" X="64350" Y="110250" />
				<Coordinate Order="1" X="64400" Y="110250" />
				<Coordinate Order="2" X="64400" Y="110300" />
			</Coordinates>
		</Annotation>
		<Annotation Name="Annotation 2" Type="Dot" PartOfGroup="None" Color="#F4FA58">
			<Coordinates>
				<Coordinate Order="0" X="1000,5" Y="2000" />
			</Coordinates>
		</Annotation>
	</Annotations>
	<AnnotationGroups>
		<Group Name="_0" PartOfGroup="None" Color="#FF0000"><Attributes /></Group>
		<Group Name="_2" PartOfGroup="None" Color="#00FF00"><Attributes /></Group>
	</AnnotationGroups>
</ASAP_Annotations>
)");
  const auto annotations = io::read_annotations(path);
  ASSERT_EQ(annotations.size(), 3u);
  EXPECT_EQ(annotations[0].name, "Annotation 0");
  EXPECT_EQ(annotations[0].group, "_0");
  EXPECT_EQ(annotations[0].color, "#F4FA58");
  ASSERT_EQ(annotations[0].outer.size(), 4u);
  EXPECT_DOUBLE_EQ(annotations[0].outer[1].x, 64440.2031);  // sorted by Order
  EXPECT_DOUBLE_EQ(annotations[0].outer[2].y, 110422.203);
  EXPECT_TRUE(annotations[0].holes.empty());
  EXPECT_GT(io::annotation_area(annotations[0]), 50000.0);
  EXPECT_EQ(annotations[1].group, "_2");
  EXPECT_DOUBLE_EQ(io::annotation_area(annotations[1]), 1250.0);
  EXPECT_EQ(annotations[2].type, "Dot");
  EXPECT_EQ(annotations[2].group, "");                     // "None" means no group
  EXPECT_DOUBLE_EQ(annotations[2].outer.at(0).x, 1000.5);  // decimal comma
  EXPECT_DOUBLE_EQ(io::annotation_area(annotations[2]), 0.0);
}

TEST(AnnotationsAsap, EmptyAnnotationListIsValid) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("empty.xml");
  write_text(path, "<ASAP_Annotations><Annotations/><AnnotationGroups/></ASAP_Annotations>");
  EXPECT_TRUE(io::read_asap_xml(path).empty());
  io::write_asap_xml(path, {});
  EXPECT_TRUE(io::read_asap_xml(path).empty());
}

// ---------------------------------------------------------------------------------------------------------
// QuPath GeoJSON

TEST(AnnotationsGeoJson, RoundTripKeepsHolesMeasurementsClassesAndColours) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("a.geojson");
  Annotation tumour;
  tumour.name = "Tumor 1";
  tumour.group = "Tumor";
  tumour.color = "#C80000";
  tumour.outer = {{61232.1, 112345.6}, {62900.35, 112301.2}, {63010.0, 114000.75}, {61100.125, 114100.3333333}};
  tumour.holes = {square(61500, 112600, 100.5), square(62000, 113000, 10.25)};
  tumour.measurements = {{"tumor_prob", 0.93}, {"area_um2", 1.0e-7}};
  Annotation tile;
  tile.object_type = "tile";
  tile.group = "Stroma";
  tile.color = "#123456";
  tile.outer = square(0, 0, 256);
  tile.measurements = {{"tumor_prob", 0.1}};
  Annotation unclassified;
  unclassified.name = "free";
  unclassified.outer = {{1, 1}, {2, 1}, {2, 2}};
  const std::vector<Annotation> written = {tumour, tile, unclassified};
  io::write_geojson(path, written, {{"Stroma", "#00AA00"}});
  const auto read = io::read_geojson(path);
  ASSERT_EQ(read.size(), written.size());
  for (std::size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].name, written[i].name);
    EXPECT_EQ(read[i].group, written[i].group);
    EXPECT_EQ(read[i].object_type, written[i].object_type);
    EXPECT_EQ(read[i].type, "Polygon");
    EXPECT_EQ(read[i].color, written[i].color);
    EXPECT_EQ(read[i].measurements, written[i].measurements);
    expect_ring_eq(written[i].outer, read[i].outer);
    ASSERT_EQ(read[i].holes.size(), written[i].holes.size());
    for (std::size_t h = 0; h < read[i].holes.size(); ++h) expect_ring_eq(written[i].holes[h], read[i].holes[h]);
  }
  EXPECT_DOUBLE_EQ(io::annotation_area(read[0]), io::annotation_area(tumour));
  // Classification colours come from the map (Stroma) or QuPath's default (Tumor).
  const std::string text = read_text(path);
  EXPECT_NE(text.find("\"FeatureCollection\""), std::string::npos);
  const auto stroma = text.find("\"Stroma\"");
  ASSERT_NE(stroma, std::string::npos);
  EXPECT_NE(text.find("170", stroma - 80), std::string::npos);  // #00AA00 → [0, 170, 0]
}

TEST(AnnotationsGeoJson, ReadsQuPathExportWithMultiPolygonAndClassification) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("slide.geojson");
  write_text(path, R"({
  "type": "FeatureCollection",
  "features": [
    {
      "type": "Feature",
      "id": "3b1a7c52-8d4e-4c8b-9a57-1d1a1f0e2b6c",
      "geometry": {
        "type": "MultiPolygon",
        "coordinates": [
          [[[1000, 1000], [2000, 1000], [2000, 2000], [1000, 2000], [1000, 1000]],
           [[1200, 1200], [1300, 1200], [1300, 1300], [1200, 1300], [1200, 1200]]],
          [[[5000, 5000], [5100, 5000], [5100, 5100], [5000, 5000]]]
        ]
      },
      "properties": {
        "objectType": "annotation",
        "name": "Region A",
        "classification": {"name": "Tumor", "color": [200, 0, 0]},
        "isLocked": false
      }
    },
    {
      "type": "Feature",
      "id": "8f0c2d6e-41a2-4b7e-b3c9-5a6d7e8f9a0b",
      "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [224, 0], [224, 224], [0, 224], [0, 0]]]},
      "properties": {
        "objectType": "detection",
        "classification": {"name": "Tumor", "color": [200, 0, 0]},
        "measurements": {"tumor_prob": 0.87, "nucleus_count": 41, "missing": null}
      }
    },
    {
      "type": "Feature",
      "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 0]]]},
      "properties": {"objectType": "annotation", "color": [16, 32, 48]}
    }
  ]
})");
  const auto annotations = io::read_annotations(path);
  ASSERT_EQ(annotations.size(), 4u);  // the MultiPolygon gives two annotations
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(annotations[i].name, "Region A");
    EXPECT_EQ(annotations[i].group, "Tumor");
    EXPECT_EQ(annotations[i].color, "#C80000");
    EXPECT_EQ(annotations[i].object_type, "annotation");
  }
  EXPECT_EQ(annotations[0].outer.size(), 4u);  // closing point dropped
  ASSERT_EQ(annotations[0].holes.size(), 1u);
  EXPECT_DOUBLE_EQ(io::annotation_area(annotations[0]), 1.0e6 - 1.0e4);
  EXPECT_TRUE(annotations[1].holes.empty());
  EXPECT_DOUBLE_EQ(io::annotation_area(annotations[1]), 5000.0);
  EXPECT_EQ(annotations[2].object_type, "detection");
  EXPECT_DOUBLE_EQ(annotations[2].measurements.at("tumor_prob"), 0.87);
  EXPECT_DOUBLE_EQ(annotations[2].measurements.at("nucleus_count"), 41.0);
  EXPECT_TRUE(std::isnan(annotations[2].measurements.at("missing")));
  EXPECT_EQ(annotations[3].group, "");
  EXPECT_EQ(annotations[3].color, "#102030");
}

TEST(AnnotationsGeoJson, BareFeatureArrayAndPoints) {
  tessera::testing::TempDir dir;
  const auto path = dir.file("points.json");
  Annotation dot;
  dot.type = "Dot";
  dot.group = "Other";
  dot.outer = {{5.5, 6.5}};
  Annotation set;
  set.type = "PointSet";
  set.outer = {{1, 2}, {3, 4}};
  io::write_geojson(path, {dot, set});
  auto read = io::read_annotations(path);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].type, "Dot");
  expect_ring_eq(dot.outer, read[0].outer);
  EXPECT_EQ(read[1].type, "PointSet");
  expect_ring_eq(set.outer, read[1].outer);

  write_text(path, R"([{"type": "Feature", "geometry": {"type": "Polygon",
                       "coordinates": [[[0, 0], [3, 0], [3, 3], [0, 3]]]}}])");
  read = io::read_geojson(path);
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].object_type, "annotation");
  EXPECT_DOUBLE_EQ(io::annotation_area(read[0]), 9.0);
}

// The features are written one at a time: the file is still exactly the document nlohmann::json dumps (keys sorted,
// pretty with tabs or compact), whether the annotations come as a vector or one by one, and with none.
TEST(AnnotationsGeoJson, StreamedFileIsTheWholeDocumentsDump) {
  tessera::testing::TempDir dir;
  std::vector<Annotation> annotations = sample_annotations();
  Annotation dot;
  dot.type = "Dot";
  dot.outer = {{5.5, 6.5}};
  annotations.push_back(dot);
  annotations.back().holes = {square(1, 1, 0.5)};
  annotations.back().type = "Polygon";
  annotations.back().measurements = {{"tumor_prob", 0.123456789}, {"nan", std::nan("")}};
  annotations.push_back(dot);
  // Text that json escapes or leaves as UTF-8 (names, a measurement key like the regions' "Longest diameter µm") and
  // a group whose colour comes from the map.
  annotations.back().name = "a \"quoted\" \\ name,\n\ttabbed, 5 µm \u2028";
  annotations.back().group = "Stroma";
  annotations.back().measurements = {{"Longest diameter µm", 12.5}, {"\"key\"\\", -0.0}};
  for (const bool pretty : {true, false}) {
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, annotations.size()}) {
      const std::vector<Annotation> some(annotations.begin(), annotations.begin() + static_cast<std::ptrdiff_t>(count));
      const auto path = dir.file("a.geojson");
      io::write_geojson(path, some, {{"Stroma", "#00AA00"}}, pretty);
      const std::string text = read_text(path);
      const auto doc = nlohmann::json::parse(text);
      EXPECT_EQ(text, (pretty ? doc.dump(1, '\t') : doc.dump()) + "\n") << "pretty " << pretty << ", " << count;
      EXPECT_EQ(doc["features"].size(), count);
      if (count == annotations.size()) {
        const auto& last = doc["features"].back()["properties"];
        EXPECT_EQ(last["name"], annotations.back().name);
        EXPECT_EQ(last["classification"]["color"], nlohmann::json::array({0, 170, 0}));
        EXPECT_EQ(last["measurements"]["Longest diameter µm"], 12.5);
      }
      std::size_t k = 0;
      const auto streamed = dir.file("b.geojson");
      io::write_geojson_from(
          streamed, [&]() { return k < some.size() ? &some[k++] : nullptr; }, {{"Stroma", "#00AA00"}}, pretty);
      EXPECT_EQ(read_text(streamed), text);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Errors

TEST(AnnotationsErrors, MissingFileIsFileNotFound) {
  tessera::testing::TempDir dir;
  for (const std::string name : {"none.xml", "none.geojson", "none.json", "none.txt"}) {
    const auto path = dir.file(name);
    try {
      io::read_annotations(path);
      ADD_FAILURE() << "no error for " << name;
    } catch (const core::FileNotFoundError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    }
  }
  EXPECT_THROW(io::read_asap_xml(dir.file("none.xml")), core::FileNotFoundError);
  EXPECT_THROW(io::read_geojson(dir.file("none.geojson")), core::FileNotFoundError);
}

TEST(AnnotationsErrors, WriteIntoMissingFolderFailsWithoutLeftovers) {
  tessera::testing::TempDir dir;
  EXPECT_THROW(io::write_asap_xml(dir.file("no/such/folder/a.xml"), sample_annotations()), core::InternalError);
  EXPECT_THROW(io::write_geojson(dir.file("no/such/folder/a.geojson"), sample_annotations()), core::InternalError);
  // A feature that fails half-way through the file leaves nothing either.
  int made = 0;
  const Annotation one = sample_annotations().front();
  EXPECT_THROW(io::write_geojson_from(dir.file("a.geojson"),
                                      [&]() -> const Annotation* {
                                        if (++made > 3) throw core::InternalError("no fourth feature");
                                        return &one;
                                      }),
               core::InternalError);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 0);
}

// Every folder under tests/data/annotations holds one broken input file and expected.txt, whose non-empty
// lines must each appear in the error message.
TEST(AnnotationsErrors, DataDrivenBrokenFiles) {
  const fs::path root = tessera::testing::test_data_dir() / "annotations";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  std::vector<fs::path> cases;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) cases.push_back(entry.path());
  }
  std::sort(cases.begin(), cases.end());
  ASSERT_GE(cases.size(), 10u);
  for (const auto& folder : cases) {
    SCOPED_TRACE(folder.filename().string());
    fs::path input;
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().filename() != "expected.txt") input = entry.path();
    }
    ASSERT_FALSE(input.empty()) << "no input file";
    std::vector<std::string> expected;
    std::istringstream lines(read_text((folder / "expected.txt").string()));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) expected.push_back(line);
    }
    ASSERT_FALSE(expected.empty()) << "expected.txt is empty";
    try {
      io::read_annotations(input.string());
      ADD_FAILURE() << "no error";
    } catch (const core::InputError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.file(), input.string());
      EXPECT_NE(message.find(input.string()), std::string::npos) << message;
      for (const auto& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

}  // namespace
