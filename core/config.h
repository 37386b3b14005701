// Typed YAML job configuration.
//
// A verb declares a Schema: every key it accepts, as a dotted path ("tile.size"), with its type, default,
// allowed range or values, and a one-line doc. Config::load reads a YAML file against the schema, applies
// `--set a.b=value` overrides, and rejects with a ConfigError that names the file, the line and the key:
//   - unknown keys, with a "did you mean 'x'?" suggestion (edit distance over the known keys),
//   - values of the wrong type ("expected an integer, got 'abc'"),
//   - values out of range or not among the allowed values,
//   - sections given as scalars and scalars given as sections.
// A key that was renamed keeps its old name for one release (Schema::renamed): a job that uses it is read as if it
// had used the new one, with a warning naming both; giving both is an error.
// Keys not in the file take their defaults. Config::to_yaml renders the full effective config with every
// key and its doc as a comment (what `--print-config` prints and what is saved next to every job's outputs).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace tessera::core {

enum class ValueType { boolean, integer, number, string, string_list };

const char* to_string(ValueType type);

using Value = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>>;

struct KeySpec {
  std::string path;  // dotted, e.g. "tile.mpp"
  ValueType type = ValueType::string;
  Value default_value;
  std::string doc;            // one line
  std::optional<double> min;  // integer/number: inclusive bounds
  std::optional<double> max;
  std::vector<std::string> allowed;  // string: allowed values (empty = any)
};

class Schema {
 public:
  // Builders; each returns *this so a verb's schema reads as one list.
  Schema& boolean(const std::string& path, bool def, const std::string& doc);
  Schema& integer(const std::string& path, std::int64_t def, const std::string& doc,
                  std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  Schema& number(const std::string& path, double def, const std::string& doc, std::optional<double> min = std::nullopt,
                 std::optional<double> max = std::nullopt);
  Schema& string(const std::string& path, const std::string& def, const std::string& doc,
                 std::vector<std::string> allowed = {});
  Schema& string_list(const std::string& path, std::vector<std::string> def, const std::string& doc);

  // `old_path` is the name `path` had before: still read, for one release, with a warning. InternalError when
  // `path` is not declared (declare it first) or `old_path` is a key or section of its own.
  Schema& renamed(const std::string& old_path, const std::string& path);

  const KeySpec* find(const std::string& path) const;
  const std::vector<KeySpec>& keys() const { return keys_; }  // in declaration order
  // The key an old name stands for, or nullptr.
  const std::string* renamed_to(const std::string& old_path) const;
  const std::map<std::string, std::string>& renames() const { return renames_; }  // old name -> key

 private:
  Schema& add(KeySpec spec);
  std::vector<KeySpec> keys_;
  std::map<std::string, std::string> renames_;
};

class Config {
 public:
  // All defaults.
  explicit Config(const Schema& schema);
  // A Config keeps a pointer to its schema: a temporary schema would dangle, so these do not compile.
  explicit Config(Schema&&) = delete;
  static Config load(Schema&&, const std::string&, const std::vector<std::string>& = {}) = delete;
  static Config parse(Schema&&, const std::string&, const std::string&, const std::vector<std::string>& = {}) = delete;

  // Reads `path` (FileNotFoundError when missing; ConfigError on any YAML syntax or schema problem) and then
  // applies overrides of the form "a.b=value" (value parsed as a YAML scalar or flow sequence).
  static Config load(const Schema& schema, const std::string& path, const std::vector<std::string>& overrides = {});
  // Same from YAML text; `source_name` is what errors call the file.
  static Config parse(const Schema& schema, const std::string& yaml_text, const std::string& source_name,
                      const std::vector<std::string>& overrides = {});

  // Applies one "a.b=value" override; errors name "--set a.b=value".
  void set(const std::string& assignment);
  // Sets `path` from `text`, read as the key's type and checked like a YAML value; errors name `source` (a
  // command-line flag such as "--batch") as their file.
  void set_value(const std::string& path, const std::string& text, const std::string& source);
  // Sets `path` to a typed value (of the key's type: InternalError otherwise), checked against its range or allowed
  // values; a ConfigError names `source` as its file.
  void assign(const std::string& path, const Value& value, const std::string& source);
  // Sets the list key `path` to `items`, checked like a YAML list; errors name `source`.
  void set_list(const std::string& path, const std::vector<std::string>& items, const std::string& source);

  bool get_bool(const std::string& path) const;
  std::int64_t get_int(const std::string& path) const;
  double get_number(const std::string& path) const;  // integers are accepted for number keys
  const std::string& get_string(const std::string& path) const;
  const std::vector<std::string>& get_string_list(const std::string& path) const;
  // True when the value came from the file or an override rather than the default.
  bool is_set(const std::string& path) const;

  // The full effective config as YAML, nested by section, each key preceded by "# doc" and, where it
  // applies, the range or allowed values.
  std::string to_yaml() const;
  // Writes to_yaml() to `path` atomically and durably (core/atomic_file.h); core::InternalError naming the file.
  void save(const std::string& path) const;
  // The file this config came from ("" when only defaults/overrides).
  const std::string& source() const { return source_; }
  const Schema& schema() const { return *schema_; }

 private:
  const Value& value(const std::string& path, ValueType type) const;

  const Schema* schema_;
  std::map<std::string, Value> values_;
  std::map<std::string, bool> set_;
  std::string source_;
};

// Levenshtein distance, used for "did you mean" suggestions (also by the CLI for unknown verbs).
std::size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` if it is close enough to be a plausible typo, else "".
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace tessera::core
