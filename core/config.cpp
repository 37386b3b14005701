#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/world_rank.h"

namespace tessera::core {

namespace {

// Errors from an override name it as their file, "--set key=value"; they have no line.
std::string override_source(const std::string& assignment) { return "--set " + assignment; }

using Assignments = std::vector<std::pair<std::string, Value>>;

std::string last_component(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// True when some key lives under `path`, i.e. `path` names a section such as "tile" or "train.optimizer".
// Old names count ("slides" when "slides.assume_mpp" was renamed).
bool is_section(const Schema& schema, const std::string& path) {
  const std::string prefix = path + ".";
  const auto under = [&](const std::string& key) { return key.compare(0, prefix.size(), prefix) == 0; };
  return std::any_of(schema.keys().begin(), schema.keys().end(), [&](const KeySpec& key) { return under(key.path); }) ||
         std::any_of(schema.renames().begin(), schema.renames().end(),
                     [&](const auto& rename) { return under(rename.first); });
}

// Every key and every section, as dotted paths: what an unknown key may have been meant to be.
std::vector<std::string> known_paths(const Schema& schema) {
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const KeySpec& key : schema.keys()) {
    for (auto dot = key.path.find('.'); dot != std::string::npos; dot = key.path.find('.', dot + 1)) {
      std::string section = key.path.substr(0, dot);
      if (seen.insert(section).second) paths.push_back(std::move(section));
    }
    if (seen.insert(key.path).second) paths.push_back(key.path);
  }
  return paths;
}

// The best guess for an unknown key. Typos inside a name ("tile.sise") are caught on the full path; a right
// name in the wrong place ("size" at the top level) only on the last component, so both are tried and the
// closer one wins, the full path on a tie.
std::string suggest_key(const Schema& schema, const std::string& path) {
  const std::vector<std::string> paths = known_paths(schema);
  std::string by_path = closest_match(path, paths);

  const std::string name = last_component(path);
  std::vector<std::string> names;
  names.reserve(paths.size());
  for (const std::string& candidate : paths) names.push_back(last_component(candidate));
  const std::string by_name = closest_match(name, names);
  if (by_name.empty()) return by_path;
  if (!by_path.empty() && edit_distance(path, by_path) <= edit_distance(name, by_name)) return by_path;
  for (const std::string& candidate : paths) {
    if (last_component(candidate) == by_name) return candidate;
  }
  return by_path;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

const char* with_article(ValueType type) {
  switch (type) {
    case ValueType::boolean:
      return "a boolean (true or false)";
    case ValueType::integer:
      return "an integer";
    case ValueType::number:
      return "a number";
    case ValueType::string:
      return "a string";
    case ValueType::string_list:
      return "a list of strings";
  }
  return "a value";
}

// How a YAML node reads in "got ..." messages.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a section";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "no value";
}

// Shortest text that reads back as exactly `value` (std::to_chars guarantees the round trip), in plain
// notation for everyday magnitudes ("0.0001" rather than "1e-04") and scientific beyond them, as Python does.
std::string shortest(double value) {
  constexpr int min_plain_exponent = -5;
  constexpr int max_plain_exponent = 16;
  char buffer[64];  // enough: plain notation is only used for exponents in [-5, 16)
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  const auto e = scientific.find('e');
  if (e == std::string::npos) return scientific;  // inf or nan
  const int exponent = std::stoi(scientific.substr(e + 1));
  if (value != 0.0 && (exponent < min_plain_exponent || exponent >= max_plain_exponent)) return scientific;
  result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed);
  return std::string(buffer, result.ptr);
}

// A double as YAML: the shortest exact text, with a ".0" where it would otherwise look like an integer so
// that other YAML readers (PyYAML wants a dot in floats) also see a float.
std::string render_number(double value) {
  std::string text = shortest(value);
  if (text.find_first_of(".ni") != std::string::npos) return text;  // has a dot, or is inf/nan
  const auto exponent = text.find('e');
  text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  return text;
}

std::string render_bound(ValueType type, double bound) {
  return type == ValueType::integer ? std::to_string(static_cast<std::int64_t>(bound)) : shortest(bound);
}

// "must be between 1 and 10" when `value` is outside the key's range, else "".
std::string range_problem(const KeySpec& spec, double value) {
  const bool below = spec.min && value < *spec.min;
  const bool above = spec.max && value > *spec.max;
  if (!below && !above) return "";
  if (spec.min && spec.max) {
    return "must be between " + render_bound(spec.type, *spec.min) + " and " + render_bound(spec.type, *spec.max);
  }
  if (spec.min) return "must be at least " + render_bound(spec.type, *spec.min);
  return "must be at most " + render_bound(spec.type, *spec.max);
}

std::optional<std::int64_t> parse_integer(std::string text, bool& out_of_range) {
  out_of_range = false;
  if (!text.empty() && text.front() == '+') text.erase(0, 1);  // from_chars takes '-' but not '+'
  std::int64_t value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec == std::errc::result_out_of_range) out_of_range = true;
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> parse_number(std::string text) {
  if (!text.empty() && text.front() == '+') text.erase(0, 1);
  double value = 0.0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  // Infinities and NaN would slip past every range check, and no job setting needs them.
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || text.empty() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// Strings that a YAML reader would take for a boolean, a number or null get quotes, even though our own
// loader reads them by the schema type: the saved config is also read by people and by other tools.
bool looks_like_other_type(const std::string& text) {
  bool unused = false;
  if (YAML::convert<bool>::decode(YAML::Node(text), unused)) return true;
  bool out_of_range = false;
  return parse_integer(text, out_of_range).has_value() || out_of_range || parse_number(text).has_value() ||
         text == ".inf" || text == "-.inf" || text == ".nan" || text == ".NaN";
}

std::string render_string(const std::string& text) {
  YAML::Emitter emitter;
  if (looks_like_other_type(text)) emitter << YAML::DoubleQuoted;
  emitter << text;
  return emitter.c_str();
}

std::string render_list(const std::vector<std::string>& items) {
  YAML::Emitter emitter;
  emitter << YAML::Flow << YAML::BeginSeq;
  for (const std::string& item : items) {
    if (looks_like_other_type(item)) emitter << YAML::DoubleQuoted;
    emitter << item;
  }
  emitter << YAML::EndSeq;
  return emitter.c_str();
}

std::string render_value(const Value& value) {
  struct Renderer {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return render_number(v); }
    std::string operator()(const std::string& v) const { return render_string(v); }
    std::string operator()(const std::vector<std::string>& v) const { return render_list(v); }
  };
  return std::visit(Renderer{}, value);
}

// "# doc [range 1..4096]" or "# doc [one of: a, b]".
std::string comment_for(const KeySpec& key) {
  std::string note;
  if (key.min && key.max) {
    note = "range " + render_bound(key.type, *key.min) + ".." + render_bound(key.type, *key.max);
  } else if (key.min) {
    note = "range >= " + render_bound(key.type, *key.min);
  } else if (key.max) {
    note = "range <= " + render_bound(key.type, *key.max);
  } else if (!key.allowed.empty()) {
    note = "one of: " + join(key.allowed, ", ");
  }
  std::string comment = "#";
  if (!key.doc.empty()) comment += " " + key.doc;
  if (!note.empty()) comment += " [" + note + "]";
  return comment;
}

// Reads YAML nodes against a schema into (path, value) assignments. Nothing is applied until a whole
// source has been read, so a failing file or override leaves the config as it was.
class Reader {
 public:
  // `has_lines` is false for overrides: their YAML marks count within the value, not within any file.
  Reader(const Schema& schema, std::string file, bool has_lines)
      : schema_(schema), file_(std::move(file)), has_lines_(has_lines) {}

  // Reads the entries of a map found at `prefix` ("" for the top level).
  void read_section(const std::string& prefix, const YAML::Node& map) {
    std::map<std::string, int> lines;  // key in this map -> its line, to catch duplicates
    for (const auto& entry : map) {
      const YAML::Node& key = entry.first;
      if (!key.IsScalar() || key.Scalar().empty()) {
        fail("expected a key name, got " + describe(key), key, prefix);
      }
      const std::string path = join_path(prefix, key.Scalar());
      if (const auto [it, inserted] = lines.emplace(key.Scalar(), line_of(key)); !inserted) {
        fail(duplicate_message(it->second), key, path);
      }
      read_entry(path, key, entry.second);
    }
  }

  // Reads the value given for `path`; `where` (the key, if there is one) locates unknown-key errors.
  void read_entry(const std::string& path, const YAML::Node& where, const YAML::Node& value) {
    if (const KeySpec* spec = schema_.find(path)) {
      read_leaf(*spec, path, where, value);
    } else if (const std::string* now = schema_.renamed_to(path);
               now != nullptr && !(value.IsMap() && is_section(schema_, path))) {
      if (current_world_rank() == 0) {  // every rank reads the job; one says so
        spdlog::warn("{}{}: '{}' is the old name of '{}': it is read in this release and not in the next; rename it",
                     file_, line_of(where) > 0 ? ":" + std::to_string(line_of(where)) : "", path, *now);
      }
      read_leaf(*schema_.find(*now), path, where, value);
    } else if (is_section(schema_, path)) {
      if (value.IsMap()) {
        read_section(path, value);
      } else if (!value.IsNull()) {  // "tile:" with every key commented out is an empty section
        fail("expected a section (a map of keys), got " + describe(value), value, path);
      }
    } else {
      std::string message = "unknown key";
      if (const std::string suggestion = suggest_key(schema_, path); !suggestion.empty()) {
        message += "; did you mean '" + suggestion + "'?";
      }
      fail(message, where, path);
    }
  }

  // A key's value, given under `given_as` (the key, or its old name).
  void read_leaf(const KeySpec& spec, const std::string& given_as, const YAML::Node& where, const YAML::Node& value) {
    // The same key can be reached twice in one file through a dotted name ("tile.size: 1" next to
    // "tile: {size: 2}"), or under its old name and its new one; the per-map check cannot see that.
    if (const auto [it, inserted] = leaf_lines_.emplace(spec.path, Given{line_of(where), given_as}); !inserted) {
      std::string message = duplicate_message(it->second.line);
      if (it->second.as != given_as) {
        message = fmt::format("'{}' and '{}' are the same key ({} is its old name); give it once", it->second.as,
                              given_as, it->second.as == spec.path ? given_as : it->second.as);
      }
      fail(message, where, spec.path);
    }
    assignments_.emplace_back(spec.path, read_value(spec, where, value));
  }

  Assignments take() { return std::move(assignments_); }

  [[noreturn]] void fail(const std::string& message, const YAML::Node& where, const std::string& key) const {
    throw ConfigError(message, file_, line_of(where), key);
  }

 private:
  int line_of(const YAML::Node& node) const {
    if (!has_lines_) return 0;
    const int line = node.Mark().line;
    return line >= 0 ? line + 1 : 0;
  }

  std::string duplicate_message(int first_line) const {
    return first_line > 0 ? "duplicate key (first given on line " + std::to_string(first_line) + ")" : "duplicate key";
  }

  Value read_value(const KeySpec& spec, const YAML::Node& key, const YAML::Node& node) const {
    // yaml-cpp marks an empty value at the next token, possibly lines later, so those point at the key.
    const YAML::Node& where = node.IsNull() ? key : node;
    const std::string expected = std::string("expected ") + with_article(spec.type) + ", got ";
    if (spec.type == ValueType::string_list) {
      if (node.IsScalar()) return std::vector<std::string>{node.Scalar()};
      if (!node.IsSequence()) {
        std::string message = expected + describe(node);
        if (node.IsNull()) message += " (write [] for an empty list)";
        fail(message, where, spec.path);
      }
      std::vector<std::string> items;
      for (const YAML::Node& item : node) {
        if (!item.IsScalar()) {
          fail(expected + describe(item) + " as item " + std::to_string(items.size() + 1), item.IsNull() ? node : item,
               spec.path);
        }
        items.push_back(item.Scalar());
      }
      return items;
    }
    if (!node.IsScalar()) fail(expected + describe(node), where, spec.path);

    const std::string& text = node.Scalar();
    switch (spec.type) {
      case ValueType::boolean: {
        bool value = false;
        if (!YAML::convert<bool>::decode(node, value)) fail(expected + describe(node), where, spec.path);
        return value;
      }
      case ValueType::integer: {
        bool out_of_range = false;
        const auto value = parse_integer(text, out_of_range);
        if (!value) fail(expected + describe(node) + (out_of_range ? " (too large)" : ""), where, spec.path);
        check_range(spec, static_cast<double>(*value), text, where);
        return *value;
      }
      case ValueType::number: {
        const auto value = parse_number(text);
        if (!value) fail(expected + describe(node), where, spec.path);
        check_range(spec, *value, text, where);
        return *value;
      }
      case ValueType::string: {
        if (!spec.allowed.empty() && std::find(spec.allowed.begin(), spec.allowed.end(), text) == spec.allowed.end()) {
          std::string message = "expected one of: " + join(spec.allowed, ", ") + ", got '" + text + "'";
          if (const std::string suggestion = closest_match(text, spec.allowed); !suggestion.empty()) {
            message += "; did you mean '" + suggestion + "'?";
          }
          fail(message, where, spec.path);
        }
        return text;
      }
      case ValueType::string_list:
        break;  // handled above
    }
    fail("unsupported value type", where, spec.path);
  }

  void check_range(const KeySpec& spec, double value, const std::string& text, const YAML::Node& where) const {
    if (const std::string problem = range_problem(spec, value); !problem.empty()) {
      fail(problem + ", got " + text, where, spec.path);
    }
  }

  const Schema& schema_;
  std::string file_;
  bool has_lines_;
  struct Given {
    int line = 0;
    std::string as;  // the key, or its old name
  };
  std::map<std::string, Given> leaf_lines_;
  Assignments assignments_;
};

// Where each document of a YAML text starts. Not YAML::LoadAll: on some broken text (",!int s: :") yaml-cpp 0.7's
// parser hands out empty documents at the same place forever, and LoadAll never returns (found by fuzz/config). A
// document that starts where the previous one did is that: the text cannot be parsed past it.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Reads a whole YAML document (the file's text) against the schema.
Assignments read_document(const Schema& schema, const std::string& text, const std::string& file) {
  DocumentStarts starts;
  YAML::Node root;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(starts)) {
      const std::size_t n = starts.marks.size();
      if (n >= 2 && starts.marks[n - 1].pos <= starts.marks[n - 2].pos) {
        const YAML::Mark& at = starts.marks[n - 1];
        throw ConfigError("invalid YAML: cannot be read past line " + std::to_string(at.line + 1) + ", column " +
                              std::to_string(at.column + 1),
                          file, at.line + 1, "");
      }
    }
    if (starts.marks.size() == 1) root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("invalid YAML: " + e.msg, file, e.mark.line >= 0 ? e.mark.line + 1 : 0, "");
  }
  if (starts.marks.empty()) return {};  // an empty file, or only comments: all defaults
  if (starts.marks.size() > 1) {
    throw ConfigError("expected one YAML document, got " + std::to_string(starts.marks.size()), file,
                      starts.marks[1].line + 1, "");
  }
  Reader reader(schema, file, true);
  if (root.IsNull()) return {};
  if (!root.IsMap()) reader.fail("expected a map of keys at the top level, got " + describe(root), root, "");
  reader.read_section("", root);
  return reader.take();
}

// Reads one "a.b=value" override.
Assignments read_override(const Schema& schema, const std::string& assignment) {
  const auto equals = assignment.find('=');
  const auto is_space = [](unsigned char c) { return std::isspace(c) != 0; };
  std::string path = assignment.substr(0, equals);
  while (!path.empty() && is_space(path.back())) path.pop_back();
  while (!path.empty() && is_space(path.front())) path.erase(0, 1);
  if (equals == std::string::npos || path.empty()) {
    throw ConfigError("expected 'key=value', got '" + assignment + "'", override_source(assignment), 0, "");
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("invalid YAML value: " + e.msg, override_source(assignment), 0, path);
  }
  Reader reader(schema, override_source(assignment), false);
  reader.read_entry(path, value, value);
  return reader.take();
}

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(),
                                      [](unsigned char c) { return std::isalnum(c) != 0 || c == '_' || c == '-'; });
}

}  // namespace

const char* to_string(ValueType type) {
  switch (type) {
    case ValueType::boolean:
      return "boolean";
    case ValueType::integer:
      return "integer";
    case ValueType::number:
      return "number";
    case ValueType::string:
      return "string";
    case ValueType::string_list:
      return "string list";
  }
  return "unknown";
}

// ---- Schema ----

Schema& Schema::boolean(const std::string& path, bool def, const std::string& doc) {
  return add({path, ValueType::boolean, def, doc, std::nullopt, std::nullopt, {}});
}

Schema& Schema::integer(const std::string& path, std::int64_t def, const std::string& doc, std::optional<double> min,
                        std::optional<double> max) {
  return add({path, ValueType::integer, def, doc, min, max, {}});
}

Schema& Schema::number(const std::string& path, double def, const std::string& doc, std::optional<double> min,
                       std::optional<double> max) {
  return add({path, ValueType::number, def, doc, min, max, {}});
}

Schema& Schema::string(const std::string& path, const std::string& def, const std::string& doc,
                       std::vector<std::string> allowed) {
  return add({path, ValueType::string, def, doc, std::nullopt, std::nullopt, std::move(allowed)});
}

Schema& Schema::string_list(const std::string& path, std::vector<std::string> def, const std::string& doc) {
  return add({path, ValueType::string_list, std::move(def), doc, std::nullopt, std::nullopt, {}});
}

const KeySpec* Schema::find(const std::string& path) const {
  const auto it = std::find_if(keys_.begin(), keys_.end(), [&](const KeySpec& key) { return key.path == path; });
  return it == keys_.end() ? nullptr : &*it;
}

Schema& Schema::renamed(const std::string& old_path, const std::string& path) {
  const auto bad = [&](const std::string& why) { return InternalError("schema rename '" + old_path + "': " + why); };
  if (find(path) == nullptr) throw bad("'" + path + "' is not declared");
  for (const KeySpec& key : keys_) {
    if (key.path == old_path || key.path.rfind(old_path + ".", 0) == 0 || old_path.rfind(key.path + ".", 0) == 0) {
      throw bad("the name is in use ('" + key.path + "')");
    }
  }
  if (!renames_.emplace(old_path, path).second) throw bad("renamed twice");
  return *this;
}

const std::string* Schema::renamed_to(const std::string& old_path) const {
  const auto it = renames_.find(old_path);
  return it == renames_.end() ? nullptr : &it->second;
}

// A schema is written by a programmer, so every mistake in it is an InternalError, raised when the verb
// builds its schema rather than when some user happens to hit the bad key.
Schema& Schema::add(KeySpec spec) {
  const auto bad = [&](const std::string& why) { return InternalError("schema key '" + spec.path + "': " + why); };
  std::stringstream components(spec.path);
  for (std::string name; std::getline(components, name, '.');) {
    if (!valid_name(name)) throw bad("names are letters, digits, '_' and '-', separated by single dots");
  }
  if (spec.path.empty() || spec.path.back() == '.') throw bad("empty name");
  if (spec.doc.find('\n') != std::string::npos) throw bad("the doc must be one line");
  if (renames_.contains(spec.path)) throw bad("is the old name of '" + renames_.at(spec.path) + "'");
  for (const KeySpec& key : keys_) {
    if (key.path == spec.path) throw bad("declared twice");
    if (key.path.rfind(spec.path + ".", 0) == 0 || spec.path.rfind(key.path + ".", 0) == 0) {
      throw bad("a key cannot also be a section ('" + key.path + "')");
    }
  }
  if (spec.min && spec.max && *spec.min > *spec.max) throw bad("min is above max");
  double numeric = 0.0;
  if (const auto* i = std::get_if<std::int64_t>(&spec.default_value)) numeric = static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&spec.default_value)) numeric = *d;
  if ((spec.min && numeric < *spec.min) || (spec.max && numeric > *spec.max)) throw bad("default out of range");
  if (const auto* s = std::get_if<std::string>(&spec.default_value);
      s && !spec.allowed.empty() && std::find(spec.allowed.begin(), spec.allowed.end(), *s) == spec.allowed.end()) {
    throw bad("default '" + *s + "' is not among the allowed values");
  }
  keys_.push_back(std::move(spec));
  return *this;
}

// ---- Config ----

Config::Config(const Schema& schema) : schema_(&schema) {
  for (const KeySpec& key : schema.keys()) {
    values_.emplace(key.path, key.default_value);
    set_.emplace(key.path, false);
  }
}

Config Config::load(const Schema& schema, const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (!std::filesystem::exists(path, ec)) throw FileNotFoundError(path);
    throw InputError("not a regular file", path);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw InputError("cannot read the file", path);
  return parse(schema, text.str(), path, overrides);
}

Config Config::parse(const Schema& schema, const std::string& yaml_text, const std::string& source_name,
                     const std::vector<std::string>& overrides) {
  Config config(schema);
  config.source_ = source_name;
  for (auto& [path, value] : read_document(schema, yaml_text, source_name)) {
    config.values_[path] = std::move(value);
    config.set_[path] = true;
  }
  for (const std::string& assignment : overrides) config.set(assignment);
  return config;
}

void Config::set(const std::string& assignment) {
  for (auto& [path, value] : read_override(*schema_, assignment)) {
    values_[path] = std::move(value);
    set_[path] = true;
  }
}

void Config::set_value(const std::string& path, const std::string& text, const std::string& source) {
  // A plain scalar node, not YAML text: a flag's value is one value whatever characters it holds.
  const YAML::Node node(text);
  Reader reader(*schema_, source, false);
  reader.read_entry(path, node, node);
  for (auto& [key, value] : reader.take()) {
    values_[key] = std::move(value);
    set_[key] = true;
  }
}

void Config::set_list(const std::string& path, const std::vector<std::string>& items, const std::string& source) {
  YAML::Node node(YAML::NodeType::Sequence);
  for (const std::string& item : items) node.push_back(YAML::Node(item));
  Reader reader(*schema_, source, false);
  reader.read_entry(path, node, node);
  for (auto& [key, value] : reader.take()) {
    values_[key] = std::move(value);
    set_[key] = true;
  }
}

void Config::assign(const std::string& path, const Value& value, const std::string& source) {
  const KeySpec* spec = schema_->find(path);
  if (spec == nullptr) throw InternalError("config key '" + path + "' is not in the schema");
  if (value.index() != spec->default_value.index()) {
    throw InternalError("config key '" + path + "' has type " + to_string(spec->type) + ", not the value's");
  }
  std::string problem;
  if (const auto* number = std::get_if<double>(&value)) {
    problem = std::isfinite(*number) ? range_problem(*spec, *number) : "must be a finite number";
    if (!problem.empty()) problem += fmt::format(", got {}", *number);
  } else if (const auto* integer = std::get_if<std::int64_t>(&value)) {
    problem = range_problem(*spec, static_cast<double>(*integer));
    if (!problem.empty()) problem += fmt::format(", got {}", *integer);
  } else if (const auto* text = std::get_if<std::string>(&value);
             text != nullptr && !spec->allowed.empty() &&
             std::find(spec->allowed.begin(), spec->allowed.end(), *text) == spec->allowed.end()) {
    problem = "expected one of: " + join(spec->allowed, ", ") + ", got '" + *text + "'";
  }
  if (!problem.empty()) throw ConfigError(problem, source, 0, path);
  values_[path] = value;
  set_[path] = true;
}

const Value& Config::value(const std::string& path, ValueType type) const {
  const KeySpec* spec = schema_->find(path);
  if (!spec) throw InternalError("config key '" + path + "' is not in the schema");
  if (spec->type != type) {
    throw InternalError("config key '" + path + "' has type " + to_string(spec->type) + ", not " + to_string(type));
  }
  return values_.at(path);
}

bool Config::get_bool(const std::string& path) const { return std::get<bool>(value(path, ValueType::boolean)); }

std::int64_t Config::get_int(const std::string& path) const {
  return std::get<std::int64_t>(value(path, ValueType::integer));
}

double Config::get_number(const std::string& path) const { return std::get<double>(value(path, ValueType::number)); }

const std::string& Config::get_string(const std::string& path) const {
  return std::get<std::string>(value(path, ValueType::string));
}

const std::vector<std::string>& Config::get_string_list(const std::string& path) const {
  return std::get<std::vector<std::string>>(value(path, ValueType::string_list));
}

bool Config::is_set(const std::string& path) const {
  const auto it = set_.find(path);
  if (it == set_.end()) throw InternalError("config key '" + path + "' is not in the schema");
  return it->second;
}

std::string Config::to_yaml() const {
  std::string out;
  // Emits the keys and sections under `prefix` in the order their first key was declared.
  const auto emit = [&](const auto& self, const std::string& prefix, int depth) -> void {
    const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
    std::set<std::string> done;
    for (const KeySpec& key : schema_->keys()) {
      if (key.path.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = key.path.substr(prefix.size());
      const std::string name = rest.substr(0, rest.find('.'));
      if (!done.insert(name).second) continue;
      if (name == rest) {
        out += indent + comment_for(key) + "\n";
        out += indent + name + ": " + render_value(values_.at(key.path)) + "\n";
      } else {
        if (depth == 0 && !out.empty()) out += "\n";  // a blank line between top-level sections
        out += indent + name + ":\n";
        self(self, prefix + name + ".", depth + 1);
      }
    }
  };
  emit(emit, "", 0);
  return out;
}

void Config::save(const std::string& path) const {
  // Written beside the target, synced and renamed over it (core/atomic_file.h): a reader sees the old file or
  // the new one, never half.
  try {
    write_file_atomic(path, to_yaml());
  } catch (Error& e) {
    e.add_context("file", path);
    throw;
  }
}

// ---- Suggestions ----

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // Two rows of the classic dynamic programme: row[j] is the distance between a[0, i) and b[0, j).
  std::vector<std::size_t> previous(b.size() + 1);
  std::vector<std::size_t> current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // Up to a third of the word may be wrong (at least two edits, so short names still get suggestions);
  // anything further off is more likely a different word than a typo.
  constexpr std::size_t min_allowed_edits = 2;
  constexpr std::size_t length_per_edit = 3;
  const std::size_t allowed = std::max(min_allowed_edits, word.size() / length_per_edit);
  std::string best;
  std::size_t best_distance = allowed + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace tessera::core
