// Annotation polygons and the two formats pathologists' tools use, both in level-0 pixel coordinates:
//  - ASAP XML (CAMELYON16/17): <ASAP_Annotations><Annotations><Annotation Name Type PartOfGroup Color>
//    <Coordinates><Coordinate Order X Y/>..., plus <AnnotationGroups>. Types Polygon, Spline (read as the
//    polygon through its points), Rectangle, Dot and PointSet (points: no area).
//  - QuPath GeoJSON: a FeatureCollection (or a bare array of features) whose features have Polygon or
//    MultiPolygon geometry (rings: first outer, others holes) and properties.objectType /
//    properties.classification.name / properties.measurements.
// Readers reject broken files with a core::InputError naming the file and what is wrong (element, feature index).
// The class rules (AnnotationClasses) and the check of one slide's annotations (prepare_annotations) are here too:
// tiling (labels) and evaluation (the CAMELYON16 mask) both apply them.
#pragma once

#include <cstdint>
#include <functional>
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
// The same file from annotations made one at a time: `next` returns the next (valid until the following call) or
// nullptr after the last. The file is written as the features come (core::write_atomic_stream), so memory is one
// feature plus a write buffer of about 1 MiB whatever their number (a detection per tile of a CAMELYON-size slide
// is over 200,000).
void write_geojson_from(const std::string& path, const std::function<const Annotation*()>& next,
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

// How prepare_annotations checks one slide's annotations.
struct AnnotationCheck {
  std::string path;                               // the annotation file, named in warnings and errors
  std::string setting = "labels.tumour_classes";  // the setting that lists the tumour classes (for messages)
  bool tumour_slide = false;                      // the slide is labelled tumour: the file must label tumour
  std::int64_t width = 0;                         // the slide's level-0 size; 0 = unknown
  std::int64_t height = 0;
};

// One slide's annotations made ready to label it (tile) or to score detections against (evaluate):
//  - areas are clipped to the slide's level-0 rectangle [0, width] × [0, height] (size unknown: [0, 10^7]², the
//    range of any slide); polygons that reach past it are clipped and those wholly outside it dropped, with one
//    warning naming the file;
//  - on a slide labelled tumour, annotations that leave no tumour area inside the slide (no annotations, no
//    group/class that is a tumour class, tumour given only as points, tumour polygons wholly outside the slide)
//    are a core::InputError naming the file, the groups/classes found and the tumour classes configured, with a
//    "did you mean" when a group found is a likely misspelling of a tumour class.
// Without this a tumour slide whose file labels nothing would be tiled as all normal, and its detections all
// counted as false positives.
std::vector<Annotation> prepare_annotations(const std::vector<Annotation>& annotations,
                                            const AnnotationClasses& classes, const AnnotationCheck& check);

}  // namespace tessera::io
