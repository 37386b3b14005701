// Annotation polygons and the two formats pathologists' tools use, both in level-0 pixel coordinates:
//  - ASAP XML (CAMELYON16/17): <ASAP_Annotations><Annotations><Annotation Name Type PartOfGroup Color>
//    <Coordinates><Coordinate Order X Y/>..., plus <AnnotationGroups>. Types Polygon, Spline (read as the
//    polygon through its points), Rectangle, Dot and PointSet (points: no area).
//  - QuPath GeoJSON: a FeatureCollection (or a bare array of features) whose features have Polygon or
//    MultiPolygon geometry (rings: first outer, others holes) and properties.objectType /
//    properties.classification.name / properties.measurements.
// Readers reject broken files with a core::InputError naming the file and what is wrong (element, feature index).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

using Ring = std::vector<cv::Point2d>;

struct Annotation {
  std::string name;
  // ASAP group (e.g. "_0", "_2", "metastases") or QuPath classification name (e.g. "Tumor").
  std::string group;
  std::string type = "Polygon";                // ASAP type; GeoJSON features are "Polygon"
  std::string object_type = "annotation";      // GeoJSON properties.objectType ("annotation", "detection", "tile")
  Ring outer;                                  // closed implicitly (first point not repeated)
  std::vector<Ring> holes;                     // GeoJSON interior rings; ASAP has none
  std::string color;                           // "#RRGGBB" ("" = default for the group)
  std::map<std::string, double> measurements;  // GeoJSON properties.measurements
};

// Signed-area-free geometry helpers.
double ring_area(const Ring& ring);           // absolute area in px² (shoelace)
double annotation_area(const Annotation& a);  // outer minus holes
cv::Rect2d bounding_box(const Ring& ring);

struct AsapGroup {
  std::string name;
  std::string color;
};

std::vector<Annotation> read_asap_xml(const std::string& path);
// Writes atomically. Groups are written to <AnnotationGroups> in the order given; groups used by the
// annotations but not listed are added with a default colour.
void write_asap_xml(const std::string& path, const std::vector<Annotation>& annotations,
                    const std::vector<AsapGroup>& groups = {});

std::vector<Annotation> read_geojson(const std::string& path);
// Writes a QuPath FeatureCollection atomically; classification colours are taken from `class_colors`
// (name → "#RRGGBB") or a default per name. `pretty` indents (one tab per level); compact output is about a
// third of the size, for files with many features (a detection per tile).
void write_geojson(const std::string& path, const std::vector<Annotation>& annotations,
                   const std::map<std::string, std::string>& class_colors = {}, bool pretty = true);

// Reads either format, by extension (.xml → ASAP, .geojson/.json → QuPath).
std::vector<Annotation> read_annotations(const std::string& path);

// Which annotation groups/classes mean what. Matching is exact, except that a trailing '*' matches any suffix.
struct AnnotationClasses {
  std::vector<std::string> tumour = {"_0", "_1", "Tumor", "Tumour", "tumor", "metastases"};
  std::vector<std::string> exclusion = {"_2", "Exclusion", "Ignore*"};
  bool is_tumour(const std::string& group) const;
  bool is_exclusion(const std::string& group) const;
};

// Splits annotations into tumour and exclusion sets; annotations of other classes are ignored and points
// (Dot/PointSet) are never areas.
void split_annotations(const std::vector<io::Annotation>& annotations, const AnnotationClasses& classes,
                       std::vector<io::Annotation>& tumour, std::vector<io::Annotation>& exclusion);

}  // namespace tessera::io
