#include "io/annotations.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include "core/atomic_file.h"
#include "core/config.h"
#include "core/error.h"

namespace tessera::io {

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------------------
// Small text helpers

// Shortest text that reads back to the same double (locale-independent).
std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// Parses a whole attribute as a finite number, locale-independently. Some ASAP files written on machines
// with a decimal comma carry "1234,5"; a single comma with no dot is read as the decimal separator.
std::optional<double> parse_number(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  std::string copy(text);
  if (copy.front() == '+') copy.erase(0, 1);
  if (copy.find('.') == std::string::npos && std::count(copy.begin(), copy.end(), ',') == 1) {
    std::replace(copy.begin(), copy.end(), ',', '.');
  }
  double value = 0.0;
  const auto result = std::from_chars(copy.data(), copy.data() + copy.size(), value);
  if (result.ec != std::errc() || result.ptr != copy.data() + copy.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

bool is_point_type(const std::string& type) { return type == "Dot" || type == "PointSet"; }

void check_exists(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw core::FileNotFoundError(path);
}

std::string read_text_file(const std::string& path) {
  check_exists(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError("cannot open file for reading", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw core::InputError("read error", path);
  return text;
}

// "#RRGGBB" from 0..255 components.
std::string hex_color(int r, int g, int b) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "#%02X%02X%02X", std::clamp(r, 0, 255), std::clamp(g, 0, 255),
                std::clamp(b, 0, 255));
  return buffer;
}

// Parses "#RRGGBB" (or "RRGGBB"); nullopt when it is not that.
std::optional<cv::Vec3i> parse_hex_color(const std::string& text) {
  std::string_view s(text);
  if (!s.empty() && s.front() == '#') s.remove_prefix(1);
  if (s.size() != 6) return std::nullopt;
  unsigned value = 0;
  const auto result = std::from_chars(s.data(), s.data() + s.size(), value, 16);
  if (result.ec != std::errc() || result.ptr != s.data() + s.size()) return std::nullopt;
  return cv::Vec3i(static_cast<int>((value >> 16) & 0xFF), static_cast<int>((value >> 8) & 0xFF),
                   static_cast<int>(value & 0xFF));
}

// A stable colour for a name nobody chose a colour for (FNV-1a of the name, kept away from grey/white).
std::string hashed_color(const std::string& name) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return hex_color(40 + static_cast<int>(h & 0xFF) * 3 / 4, 40 + static_cast<int>((h >> 8) & 0xFF) * 3 / 4,
                   40 + static_cast<int>((h >> 16) & 0xFF) * 3 / 4);
}

// Default colours: ASAP's CAMELYON16 conventions for groups, QuPath's built-in classes for classifications.
std::string default_group_color(const std::string& group) {
  if (group == "_0" || group == "_1" || group == "metastases" || group == "Tumor") return "#FF0000";
  if (group == "_2" || group == "normal") return "#00FF00";
  if (group == "Stroma") return "#96C896";
  if (group == "Immune cells") return "#A05AA0";
  if (group == "Necrosis") return "#323232";
  if (group == "Other") return "#FFC800";
  if (group == "Region*") return "#0000B4";
  if (group == "Ignore*") return "#B4B4B4";
  return hashed_color(group);
}

// QuPath's default for "Tumor" is (200, 0, 0); the ASAP default for tumour groups is pure red.
std::string default_class_color(const std::string& name) {
  if (name == "Tumor") return "#C80000";
  return default_group_color(name);
}

// "line L, column C" (1-based) of a byte offset into the file, for parser messages that give only the offset.
std::string line_and_column(const std::string& path, std::ptrdiff_t offset) {
  std::ifstream in(path, std::ios::binary);
  std::size_t line = 1, column = 1;
  char c = 0;
  for (std::ptrdiff_t i = 0; i < offset && in.get(c); ++i) {
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

// ---------------------------------------------------------------------------------------------------------
// ASAP XML

std::string annotation_label(const std::string& name, std::size_t index) {
  return name.empty() ? "annotation #" + std::to_string(index) : "annotation '" + name + "'";
}

Annotation read_asap_annotation(const pugi::xml_node& node, std::size_t index, const std::string& path) {
  Annotation a;
  a.name = node.attribute("Name").as_string();
  a.type = node.attribute("Type").as_string("Polygon");
  if (a.type.empty()) a.type = "Polygon";
  a.group = node.attribute("PartOfGroup").as_string();
  if (a.group == "None") a.group.clear();
  a.color = node.attribute("Color").as_string();
  const std::string label = annotation_label(a.name, index);

  // Points are listed with an Order attribute; files written by hand sometimes list them out of order.
  std::vector<std::pair<double, cv::Point2d>> points;
  std::size_t position = 0;
  for (const auto& coordinate : node.child("Coordinates").children("Coordinate")) {
    const auto x = parse_number(coordinate.attribute("X").as_string());
    const auto y = parse_number(coordinate.attribute("Y").as_string());
    if (!x || !y) {
      throw core::InputError(label + ", coordinate #" + std::to_string(position) +
                                 ": X and Y must be numbers (got X=\"" + coordinate.attribute("X").as_string() +
                                 "\", Y=\"" + coordinate.attribute("Y").as_string() + "\")",
                             path);
    }
    const auto order = parse_number(coordinate.attribute("Order").as_string());
    points.emplace_back(order ? *order : static_cast<double>(position), cv::Point2d(*x, *y));
    ++position;
  }
  std::stable_sort(points.begin(), points.end(), [](const auto& p, const auto& q) { return p.first < q.first; });
  a.outer.reserve(points.size());
  for (const auto& [order, point] : points) a.outer.push_back(point);
  // Some writers close the ring explicitly; the model keeps it implicit.
  if (a.outer.size() > 3 && a.outer.front() == a.outer.back() && !is_point_type(a.type)) a.outer.pop_back();

  if (is_point_type(a.type)) {
    if (a.outer.empty()) throw core::InputError(label + " (" + a.type + ") has no coordinates", path);
  } else if (a.outer.size() < 3) {
    throw core::InputError(
        label + " (" + a.type + ") has " + std::to_string(a.outer.size()) + " point(s); a polygon needs at least 3",
        path);
  }
  return a;
}

// ---------------------------------------------------------------------------------------------------------
// GeoJSON

std::string feature_label(std::size_t index) { return "feature #" + std::to_string(index); }

std::optional<std::string> color_from_json(const json& value) {
  if (value.is_array() && value.size() >= 3 && value[0].is_number() && value[1].is_number() && value[2].is_number()) {
    return hex_color(static_cast<int>(std::lround(value[0].get<double>())),
                     static_cast<int>(std::lround(value[1].get<double>())),
                     static_cast<int>(std::lround(value[2].get<double>())));
  }
  if (value.is_number_integer()) {  // QuPath 0.2 "colorRGB": packed (A)RGB
    const auto packed = static_cast<std::uint32_t>(value.get<std::int64_t>());
    return hex_color(static_cast<int>((packed >> 16) & 0xFF), static_cast<int>((packed >> 8) & 0xFF),
                     static_cast<int>(packed & 0xFF));
  }
  if (value.is_string()) {
    if (const auto rgb = parse_hex_color(value.get<std::string>())) return hex_color((*rgb)[0], (*rgb)[1], (*rgb)[2]);
  }
  return std::nullopt;
}

json color_to_json(const std::string& color) {
  const auto rgb = parse_hex_color(color);
  if (!rgb) return json::array({255, 0, 0});
  return json::array({(*rgb)[0], (*rgb)[1], (*rgb)[2]});
}

cv::Point2d read_position(const json& value, const std::string& where, const std::string& path) {
  if (!value.is_array() || value.size() < 2 || !value[0].is_number() || !value[1].is_number()) {
    throw core::InputError(where + ": coordinates must be [x, y] pairs of numbers (got " + value.dump() + ")", path);
  }
  const cv::Point2d p(value[0].get<double>(), value[1].get<double>());
  if (!std::isfinite(p.x) || !std::isfinite(p.y)) {
    throw core::InputError(where + ": coordinates must be finite numbers (got " + value.dump() + ")", path);
  }
  return p;
}

Ring read_ring(const json& value, const std::string& where, const std::string& path) {
  if (!value.is_array()) throw core::InputError(where + ": a ring must be an array of positions", path);
  Ring ring;
  ring.reserve(value.size());
  for (const auto& position : value) ring.push_back(read_position(position, where, path));
  if (ring.size() > 1 && ring.front() == ring.back()) ring.pop_back();  // GeoJSON rings repeat the first point
  if (ring.size() < 3) {
    throw core::InputError(
        where + ": a polygon ring has " + std::to_string(ring.size()) + " distinct point(s); it needs at least 3",
        path);
  }
  return ring;
}

// Reads one Polygon's rings (first outer, then holes) into `a`.
void read_polygon_rings(const json& rings, Annotation& a, const std::string& where, const std::string& path) {
  if (!rings.is_array() || rings.empty()) {
    throw core::InputError(where + ": Polygon coordinates must be a non-empty array of rings", path);
  }
  a.outer = read_ring(rings[0], where + ", outer ring", path);
  for (std::size_t i = 1; i < rings.size(); ++i) {
    a.holes.push_back(read_ring(rings[i], where + ", hole " + std::to_string(i - 1), path));
  }
}

void read_feature(const json& feature, std::size_t index, const std::string& path, std::vector<Annotation>& out) {
  const std::string where = feature_label(index);
  if (!feature.is_object()) throw core::InputError(where + " is not a JSON object", path);
  const auto geometry_it = feature.find("geometry");
  if (geometry_it == feature.end() || geometry_it->is_null()) throw core::InputError(where + " has no geometry", path);
  const json& geometry = *geometry_it;
  if (!geometry.is_object() || !geometry.contains("type") || !geometry["type"].is_string()) {
    throw core::InputError(where + ": geometry has no type", path);
  }
  const std::string geometry_type = geometry["type"].get<std::string>();
  const auto coordinates_it = geometry.find("coordinates");
  if (geometry_type != "Polygon" && geometry_type != "MultiPolygon" && geometry_type != "Point" &&
      geometry_type != "MultiPoint") {
    throw core::InputError(where + ": unsupported geometry type '" + geometry_type +
                               "' (supported: Polygon, MultiPolygon, Point, MultiPoint)",
                           path);
  }
  if (coordinates_it == geometry.end()) throw core::InputError(where + ": geometry has no coordinates", path);

  Annotation base;
  base.type = "Polygon";
  const json empty = json::object();
  const json& properties =
      feature.contains("properties") && feature["properties"].is_object() ? feature["properties"] : empty;
  if (const auto it = properties.find("name"); it != properties.end() && it->is_string()) {
    base.name = it->get<std::string>();
  }
  if (const auto it = properties.find("objectType"); it != properties.end() && it->is_string()) {
    base.object_type = it->get<std::string>();
  } else if (const auto id = feature.find("id"); id != feature.end() && id->is_string()) {
    // QuPath 0.2 exports name the object class in "id" instead.
    if (*id == "PathDetectionObject" || *id == "PathCellObject") base.object_type = "detection";
    if (*id == "PathTileObject") base.object_type = "tile";
  }
  std::optional<std::string> class_color;
  if (const auto it = properties.find("classification"); it != properties.end() && it->is_object()) {
    if (const auto name = it->find("name"); name != it->end() && name->is_string())
      base.group = name->get<std::string>();
    if (const auto color = it->find("color"); color != it->end()) class_color = color_from_json(*color);
    if (const auto color = it->find("colorRGB"); !class_color && color != it->end())
      class_color = color_from_json(*color);
  }
  if (const auto it = properties.find("color"); it != properties.end()) {
    if (auto color = color_from_json(*it)) base.color = *color;
  }
  if (base.color.empty() && class_color) base.color = *class_color;
  if (const auto it = properties.find("measurements"); it != properties.end()) {
    auto add = [&](const std::string& name, const json& value) {
      if (value.is_number()) {
        base.measurements[name] = value.get<double>();
      } else if (value.is_null()) {  // QuPath writes NaN as null
        base.measurements[name] = std::numeric_limits<double>::quiet_NaN();
      } else {
        throw core::InputError(where + ": measurement '" + name + "' is not a number (got " + value.dump() + ")", path);
      }
    };
    if (it->is_object()) {
      for (const auto& [name, value] : it->items()) add(name, value);
    } else if (it->is_array()) {  // QuPath 0.2: [{"name": ..., "value": ...}]
      for (const auto& entry : *it) {
        if (entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("value")) {
          add(entry["name"].get<std::string>(), entry["value"]);
        }
      }
    }
  }

  const json& coordinates = *coordinates_it;
  if (geometry_type == "Polygon") {
    Annotation a = base;
    read_polygon_rings(coordinates, a, where, path);
    out.push_back(std::move(a));
  } else if (geometry_type == "MultiPolygon") {
    if (!coordinates.is_array() || coordinates.empty()) {
      throw core::InputError(where + ": MultiPolygon coordinates must be a non-empty array of polygons", path);
    }
    for (std::size_t p = 0; p < coordinates.size(); ++p) {
      Annotation a = base;
      read_polygon_rings(coordinates[p], a, where + ", polygon " + std::to_string(p), path);
      out.push_back(std::move(a));
    }
  } else if (geometry_type == "Point") {
    Annotation a = base;
    a.type = "Dot";
    a.outer.push_back(read_position(coordinates, where, path));
    out.push_back(std::move(a));
  } else {  // MultiPoint
    if (!coordinates.is_array() || coordinates.empty()) {
      throw core::InputError(where + ": MultiPoint coordinates must be a non-empty array of positions", path);
    }
    Annotation a = base;
    a.type = "PointSet";
    for (const auto& position : coordinates) a.outer.push_back(read_position(position, where, path));
    out.push_back(std::move(a));
  }
}

json ring_to_json(const Ring& ring) {
  json out = json::array();
  for (const auto& p : ring) out.push_back(json::array({p.x, p.y}));
  if (!ring.empty()) out.push_back(json::array({ring.front().x, ring.front().y}));  // GeoJSON closes rings
  return out;
}

std::string extension_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

}  // namespace

// -------------------------------------------------------------------------------------------------------------
// Geometry

double ring_area(const Ring& ring) {
  if (ring.size() < 3) return 0.0;
  // Shoelace about the first point, which keeps the sum well conditioned for large level-0 coordinates.
  const cv::Point2d origin = ring.front();
  double twice = 0.0;
  for (std::size_t i = 1; i + 1 < ring.size(); ++i) {
    const cv::Point2d p = ring[i] - origin;
    const cv::Point2d q = ring[i + 1] - origin;
    twice += p.x * q.y - q.x * p.y;
  }
  return std::abs(twice) * 0.5;
}

double annotation_area(const Annotation& a) {
  if (is_point_type(a.type)) return 0.0;
  double area = ring_area(a.outer);
  for (const auto& hole : a.holes) area -= ring_area(hole);
  return std::max(0.0, area);
}

cv::Rect2d bounding_box(const Ring& ring) {
  if (ring.empty()) return {};
  double x0 = ring.front().x, x1 = x0, y0 = ring.front().y, y1 = y0;
  for (const auto& p : ring) {
    x0 = std::min(x0, p.x);
    x1 = std::max(x1, p.x);
    y0 = std::min(y0, p.y);
    y1 = std::max(y1, p.y);
  }
  return {x0, y0, x1 - x0, y1 - y0};
}

// -------------------------------------------------------------------------------------------------------------
// ASAP XML

std::vector<Annotation> read_asap_xml(const std::string& path) {
  check_exists(path);
  pugi::xml_document doc;
  const pugi::xml_parse_result parsed = doc.load_file(path.c_str());
  if (!parsed) {
    if (parsed.status == pugi::status_file_not_found) throw core::FileNotFoundError(path);
    if (parsed.status == pugi::status_io_error || parsed.status == pugi::status_out_of_memory) {
      throw core::InputError(std::string("cannot read XML: ") + parsed.description(), path);
    }
    throw core::InputError("malformed XML at byte offset " + std::to_string(parsed.offset) + " (" +
                               line_and_column(path, parsed.offset) + "): " + parsed.description(),
                           path);
  }
  const pugi::xml_node root = doc.child("ASAP_Annotations");
  if (!root) {
    const pugi::xml_node first = doc.document_element();
    throw core::InputError(
        std::string("not an ASAP annotation file: missing <ASAP_Annotations> root element") +
            (first ? std::string(" (found <") + first.name() + ">)" : std::string(" (document is empty)")),
        path);
  }
  std::vector<Annotation> out;
  std::size_t index = 0;
  for (const auto& node : root.child("Annotations").children("Annotation")) {
    out.push_back(read_asap_annotation(node, index, path));
    ++index;
  }
  return out;
}

void write_asap_xml(const std::string& path, const std::vector<Annotation>& annotations,
                    const std::vector<AsapGroup>& groups) {
  pugi::xml_document doc;
  auto declaration = doc.append_child(pugi::node_declaration);
  declaration.append_attribute("version") = "1.0";
  auto root = doc.append_child("ASAP_Annotations");
  auto list = root.append_child("Annotations");

  std::vector<AsapGroup> all_groups = groups;
  std::set<std::string> known;
  for (const auto& g : groups) known.insert(g.name);
  auto use_group = [&](const std::string& name) {
    if (!name.empty() && known.insert(name).second) all_groups.push_back({name, default_group_color(name)});
  };
  auto group_color = [&](const std::string& name) {
    for (const auto& g : all_groups) {
      if (g.name == name && !g.color.empty()) return g.color;
    }
    return default_group_color(name);
  };

  auto write_one = [&](const std::string& name, const std::string& type, const std::string& group,
                       const std::string& color, const Ring& ring) {
    use_group(group);
    auto node = list.append_child("Annotation");
    node.append_attribute("Name") = name.c_str();
    node.append_attribute("Type") = type.c_str();
    node.append_attribute("PartOfGroup") = group.empty() ? "None" : group.c_str();
    node.append_attribute("Color") = (color.empty() ? group_color(group) : color).c_str();
    auto coordinates = node.append_child("Coordinates");
    for (std::size_t i = 0; i < ring.size(); ++i) {
      auto c = coordinates.append_child("Coordinate");
      c.append_attribute("Order") = static_cast<unsigned long long>(i);
      c.append_attribute("X") = format_number(ring[i].x).c_str();
      c.append_attribute("Y") = format_number(ring[i].y).c_str();
    }
  };

  for (const auto& a : annotations) {
    write_one(a.name, a.type, a.group, a.color, a.outer);
    // ASAP has no holes: they become CAMELYON16 "_2" exclusion annotations (non-tumour inside an annotation).
    for (std::size_t h = 0; h < a.holes.size(); ++h) {
      write_one(a.name + " hole " + std::to_string(h), "Polygon", "_2", "", a.holes[h]);
    }
  }

  auto group_list = root.append_child("AnnotationGroups");
  for (const auto& g : all_groups) {
    auto node = group_list.append_child("Group");
    node.append_attribute("Name") = g.name.c_str();
    node.append_attribute("PartOfGroup") = "None";
    node.append_attribute("Color") = (g.color.empty() ? default_group_color(g.name) : g.color).c_str();
    node.append_child("Attributes");
  }

  std::ostringstream text;
  doc.save(text, "\t", pugi::format_default, pugi::encoding_utf8);
  core::write_file_atomic(path, text.str());
}

// -------------------------------------------------------------------------------------------------------------
// QuPath GeoJSON

std::vector<Annotation> read_geojson(const std::string& path) {
  const std::string text = read_text_file(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error for broken syntax; out_of_range (406) for a number past a double's range, e.g. 1e400.
    // nlohmann's message already says "parse error at line L, column C: ..."; keep the byte offset too.
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; the rest says line, column and what is wrong.
    std::string detail = e.what();
    if (const auto tag = detail.find("] "); detail.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) {
      detail.erase(0, tag + 2);
    }
    const auto* syntax = dynamic_cast<const json::parse_error*>(&e);
    throw core::InputError(
        "invalid JSON" + (syntax ? " at byte " + std::to_string(syntax->byte) : std::string()) + ": " + detail, path);
  }
  const json* features = nullptr;
  json single = json::array();
  // Not doc.value("type", ""): it throws nlohmann's type_error when "type" is there but is not a string.
  const auto type_it = doc.is_object() ? doc.find("type") : doc.end();
  const std::string type = type_it != doc.end() && type_it->is_string() ? type_it->get<std::string>() : "";
  if (doc.is_array()) {
    features = &doc;
  } else if (type == "FeatureCollection") {
    const auto it = doc.find("features");
    if (it == doc.end() || !it->is_array()) {
      throw core::InputError("FeatureCollection has no \"features\" array", path);
    }
    features = &*it;
  } else if (type == "Feature") {
    single.push_back(doc);
    features = &single;
  } else {
    throw core::InputError("expected a GeoJSON FeatureCollection, a Feature or an array of features", path);
  }
  std::vector<Annotation> out;
  for (std::size_t i = 0; i < features->size(); ++i) {
    try {
      read_feature((*features)[i], i, path, out);
    } catch (const json::exception& e) {
      // read_feature checks every value's type before it reads it; should a check be missing, the input is still
      // what is wrong, and the message says which feature.
      throw core::InputError(feature_label(i) + ": unexpected JSON value (" + std::string(e.what()) + ")", path);
    }
  }
  return out;
}

namespace {

json feature_json(const Annotation& a, const std::map<std::string, std::string>& class_colors) {
  json geometry;
  if (a.type == "Dot" && a.outer.size() == 1) {
    geometry = {{"type", "Point"}, {"coordinates", json::array({a.outer[0].x, a.outer[0].y})}};
  } else if (is_point_type(a.type)) {
    json points = json::array();
    for (const auto& p : a.outer) points.push_back(json::array({p.x, p.y}));
    geometry = {{"type", "MultiPoint"}, {"coordinates", points}};
  } else {
    json rings = json::array({ring_to_json(a.outer)});
    for (const auto& hole : a.holes) rings.push_back(ring_to_json(hole));
    geometry = {{"type", "Polygon"}, {"coordinates", rings}};
  }
  json properties = {{"objectType", a.object_type.empty() ? std::string("annotation") : a.object_type}};
  if (!a.name.empty()) properties["name"] = a.name;
  if (!a.group.empty()) {
    const auto it = class_colors.find(a.group);
    const std::string color = it != class_colors.end() ? it->second : default_class_color(a.group);
    properties["classification"] = {{"name", a.group}, {"color", color_to_json(color)}};
  }
  if (!a.color.empty()) properties["color"] = color_to_json(a.color);
  if (!a.measurements.empty()) {
    json measurements = json::object();
    for (const auto& [name, value] : a.measurements) {
      measurements[name] = std::isfinite(value) ? json(value) : json(nullptr);
    }
    properties["measurements"] = measurements;
  }
  return {{"type", "Feature"}, {"geometry", geometry}, {"properties", properties}};
}

}  // namespace

void write_geojson_from(const std::string& path, const std::function<const Annotation*()>& next,
                        const std::map<std::string, std::string>& class_colors, bool pretty) {
  // The document json::dump makes of {"features": [...], "type": "FeatureCollection"} (json sorts keys), its features
  // dumped one at a time; pretty, each feature's lines indented two levels deeper, as they sit in the document.
  core::write_atomic_stream(path, [&](const core::Put& put) {
    put(pretty ? "{\n\t\"features\": [" : "{\"features\":[");
    std::string text;
    bool empty = true;
    for (const Annotation* a = next(); a != nullptr; a = next()) {
      text.clear();
      if (!empty) text += ',';
      empty = false;
      if (pretty) {
        text += "\n\t\t";
        for (const char c : feature_json(*a, class_colors).dump(1, '\t')) {
          text += c;
          if (c == '\n') text += "\t\t";
        }
      } else {
        text += feature_json(*a, class_colors).dump();
      }
      put(text);
    }
    put(!pretty ? "],\"type\":\"FeatureCollection\"}\n"
        : empty ? "],\n\t\"type\": \"FeatureCollection\"\n}\n"
                : "\n\t],\n\t\"type\": \"FeatureCollection\"\n}\n");
  });
}

void write_geojson(const std::string& path, const std::vector<Annotation>& annotations,
                   const std::map<std::string, std::string>& class_colors, bool pretty) {
  auto it = annotations.begin();
  write_geojson_from(
      path, [&]() { return it == annotations.end() ? nullptr : &*it++; }, class_colors, pretty);
}

// -------------------------------------------------------------------------------------------------------------

std::vector<Annotation> read_annotations(const std::string& path) {
  const std::string ext = extension_of(path);
  if (ext == ".xml") return read_asap_xml(path);
  if (ext == ".geojson" || ext == ".json") return read_geojson(path);
  check_exists(path);
  throw core::InputError(
      "unknown annotation format '" + ext + "' (expected .xml for ASAP or .geojson/.json for QuPath)", path);
}

namespace {

// A class pattern matches a group exactly, or by prefix when it ends in '*'.
bool class_matches(const std::string& pattern, const std::string& group) {
  if (!pattern.empty() && pattern.back() == '*') {
    return std::string_view(group).starts_with(std::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return pattern == group;
}

bool matches_any(const std::vector<std::string>& patterns, const std::string& group) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return class_matches(p, group); });
}

}  // namespace

bool AnnotationClasses::is_tumour(const std::string& group) const { return matches_any(tumour, group); }
bool AnnotationClasses::is_exclusion(const std::string& group) const { return matches_any(exclusion, group); }

void split_annotations(const std::vector<io::Annotation>& annotations, const AnnotationClasses& classes,
                       std::vector<io::Annotation>& tumour, std::vector<io::Annotation>& exclusion) {
  tumour.clear();
  exclusion.clear();
  for (const auto& a : annotations) {
    if (is_point_type(a.type) || a.outer.size() < 3) continue;
    // A group named in both lists is an exclusion: not calling something tumour is the safer error.
    if (classes.is_exclusion(a.group)) {
      exclusion.push_back(a);
    } else if (classes.is_tumour(a.group)) {
      tumour.push_back(a);
    }
  }
}

namespace {

// Sutherland–Hodgman clipping of a ring to the rectangle [0, width] × [0, height]. Exact for any simple ring
// (the clip window is convex); where a concave ring leaves and re-enters, the result runs along the border,
// which adds no area. Computed in long double so that absurd but finite coordinates (±1e300) cannot overflow.
Ring clip_ring(const Ring& ring, double width, double height) {
  using Point = std::pair<long double, long double>;
  std::vector<Point> points;
  points.reserve(ring.size());
  for (const auto& p : ring) points.emplace_back(p.x, p.y);
  // Each edge of the window: inside test and the crossing of segment p–q with the window's edge line.
  const auto clip = [&](auto inside, auto cross) {
    std::vector<Point> out;
    for (std::size_t k = 0; k < points.size(); ++k) {
      const Point& p = points[k];
      const Point& q = points[(k + 1) % points.size()];
      const bool p_in = inside(p);
      const bool q_in = inside(q);
      if (p_in) out.push_back(p);
      if (p_in != q_in) out.push_back(cross(p, q));
    }
    points = std::move(out);
  };
  const auto at_x = [](const Point& p, const Point& q, long double x) {
    const long double t = (x - p.first) / (q.first - p.first);
    return Point(x, p.second + t * (q.second - p.second));
  };
  const auto at_y = [](const Point& p, const Point& q, long double y) {
    const long double t = (y - p.second) / (q.second - p.second);
    return Point(p.first + t * (q.first - p.first), y);
  };
  const long double w = width, h = height;
  clip([](const Point& p) { return p.first >= 0; }, [&](const Point& p, const Point& q) { return at_x(p, q, 0); });
  clip([&](const Point& p) { return p.first <= w; }, [&](const Point& p, const Point& q) { return at_x(p, q, w); });
  clip([](const Point& p) { return p.second >= 0; }, [&](const Point& p, const Point& q) { return at_y(p, q, 0); });
  clip([&](const Point& p) { return p.second <= h; }, [&](const Point& p, const Point& q) { return at_y(p, q, h); });
  Ring out;
  out.reserve(points.size());
  for (const auto& [x, y] : points) out.emplace_back(static_cast<double>(x), static_cast<double>(y));
  return out;
}

bool inside_slide(const Ring& ring, double width, double height) {
  return std::all_of(ring.begin(), ring.end(),
                     [&](const cv::Point2d& p) { return p.x >= 0 && p.x <= width && p.y >= 0 && p.y <= height; });
}

std::string group_text(const std::string& group) { return group.empty() ? "(no class)" : "'" + group + "'"; }

std::string join(const std::vector<std::string>& items) { return fmt::format("{}", fmt::join(items, ", ")); }

// "group 'a' (3), group (no class) (1)": what a list of annotations holds, by group, in first-seen order.
std::string groups_found(const std::vector<Annotation>& annotations) {
  std::vector<std::string> order;
  std::map<std::string, int> count;
  for (const auto& a : annotations) {
    if (count[a.group]++ == 0) order.push_back(a.group);
  }
  std::vector<std::string> parts;
  for (const auto& g : order) parts.push_back(fmt::format("{} ({})", group_text(g), count[g]));
  return join(parts);
}

// The error for a tumour slide whose annotations label nothing.
[[noreturn]] void labels_nothing(const std::string& why, const std::vector<Annotation>& annotations,
                                 const AnnotationClasses& classes, const AnnotationCheck& check) {
  std::string message = "the slide is labelled tumour but " + why;
  if (!annotations.empty()) message += "; groups/classes found: " + groups_found(annotations);
  message += "; tumour classes (" + check.setting + "): " + join(classes.tumour);
  // A group that is close to a tumour class is most likely a misspelling of it (CAMELYON's "metastasis" for
  // "metastases"). Exclusion groups and very short names ("_2" is one edit from "_0") are meant as they are.
  constexpr std::size_t kMinSuggestLength = 4;
  std::vector<std::string> suggested;
  for (const auto& a : annotations) {
    if (a.group.size() < kMinSuggestLength || classes.is_exclusion(a.group) || classes.is_tumour(a.group)) continue;
    const std::string match = core::closest_match(a.group, classes.tumour);
    const std::string text = fmt::format("did you mean '{}' for '{}'?", match, a.group);
    if (!match.empty() && std::find(suggested.begin(), suggested.end(), text) == suggested.end()) {
      suggested.push_back(text);
    }
  }
  for (const auto& s : suggested) message += "; " + s;
  const bool any_tumour_class = std::any_of(annotations.begin(), annotations.end(),
                                            [&](const Annotation& a) { return classes.is_tumour(a.group); });
  if (!annotations.empty() && !any_tumour_class) {
    message += fmt::format(" (to count another group as tumour, add it to {})", check.setting);
  }
  throw core::InputError(message, check.path);
}

}  // namespace

std::vector<Annotation> prepare_annotations(const std::vector<Annotation>& annotations,
                                            const AnnotationClasses& classes, const AnnotationCheck& check) {
  std::vector<Annotation> out;
  out.reserve(annotations.size());
  // Without the slide's size, polygons are still clipped to the level-0 range any slide can have: coordinates
  // are never negative, and no scanner makes a slide 10^7 pixels (2.5 m at 0.25 µm/px) across. Absurd
  // coordinates (±1e300) must not reach the rasterizers, whose masks span the annotations' bounding box.
  constexpr double kMaxExtent = 1e7;
  const bool known = check.width > 0 && check.height > 0;
  const double width = known ? static_cast<double>(check.width) : kMaxExtent;
  const double height = known ? static_cast<double>(check.height) : kMaxExtent;
  const std::string slide_text =
      known ? fmt::format("the slide ({} x {} level-0 pixels)", check.width, check.height)
            : fmt::format("the level-0 range of any slide (0 to {:g} pixels; the slide's size is unknown)", kMaxExtent);
  std::size_t clipped = 0, dropped = 0;
  for (const auto& a : annotations) {
    if (is_point_type(a.type) || a.outer.size() < 3) {
      out.push_back(a);
      continue;
    }
    bool whole = inside_slide(a.outer, width, height);
    for (const auto& hole : a.holes) whole = whole && inside_slide(hole, width, height);
    if (whole) {
      out.push_back(a);
      continue;
    }
    Annotation c = a;
    c.outer = clip_ring(a.outer, width, height);
    c.holes.clear();
    for (const auto& hole : a.holes) {
      Ring h = clip_ring(hole, width, height);
      if (h.size() >= 3 && ring_area(h) > 0.0) c.holes.push_back(std::move(h));
    }
    if (c.outer.size() < 3 || ring_area(c.outer) <= 0.0) {
      ++dropped;
      continue;
    }
    ++clipped;
    out.push_back(std::move(c));
  }
  if (clipped + dropped > 0) {
    std::vector<std::string> parts;
    if (clipped > 0) parts.push_back(fmt::format("{} annotation polygon(s) reach past it and are clipped", clipped));
    if (dropped > 0) parts.push_back(fmt::format("{} lie wholly outside it and are ignored", dropped));
    spdlog::warn("{}: not all annotations lie inside {}: {}", check.path, slide_text, join(parts));
  }
  if (!check.tumour_slide) return out;

  std::vector<Annotation> tumour_read, exclusion_read;
  split_annotations(annotations, classes, tumour_read, exclusion_read);
  if (annotations.empty()) labels_nothing("the annotation file has no annotations", annotations, classes, check);
  const bool any_tumour_class = std::any_of(annotations.begin(), annotations.end(), [&](const Annotation& a) {
    return classes.is_tumour(a.group) && !classes.is_exclusion(a.group);
  });
  if (!any_tumour_class) labels_nothing("no annotation is of a tumour class", annotations, classes, check);
  if (tumour_read.empty()) {
    labels_nothing("its tumour annotations are points, which have no area", annotations, classes, check);
  }
  std::vector<Annotation> tumour, exclusion;
  split_annotations(out, classes, tumour, exclusion);
  double area = 0.0;
  for (const auto& a : tumour) area += annotation_area(a);
  if (area > 0.0) return out;
  if (tumour.empty()) {
    cv::Rect2d box = bounding_box(tumour_read.front().outer);
    for (const auto& a : tumour_read) box |= bounding_box(a.outer);
    labels_nothing(fmt::format("its tumour polygons lie wholly outside {}: they span x {:g} to {:g}, y {:g} to {:g}",
                               slide_text, box.x, box.x + box.width, box.y, box.y + box.height),
                   annotations, classes, check);
  }
  labels_nothing("its tumour polygons have no area", annotations, classes, check);
}

}  // namespace tessera::io
