#include "core/config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::core {
namespace {

namespace fs = std::filesystem;

// One schema for every test: sections, a nested section, a key declared after a nested section (so
// to_yaml's grouping is exercised), one- and two-sided ranges, allowed values, unbounded keys.
const Schema& test_schema() {
  static const Schema schema =
      Schema()
          .string("name", "demo", "Job name, used in output file names")
          .string_list("slides", {}, "Slides to process")
          .integer("tile.size", 256, "Tile edge in pixels", 1, 4096)
          .number("tile.mpp", 0.5, "Target resolution in um/px", 0.05, 100)
          .integer("tile.overlap", 0, "Overlap between tiles in pixels", 0)
          .string("tile.stain_normalization", "none", "Stain normalization", {"none", "reinhard", "macenko"})
          .boolean("tile.save_masks", false, "Write tissue masks next to the shards")
          .number("train.optimizer.momentum", 0.9, "SGD momentum", 0, 1)
          .integer("train.epochs", 10, "Number of epochs", std::nullopt, 1000)
          .number("train.weight_decay", 1e-4, "L2 penalty")
          .integer("train.seed", 42, "Random seed")
          .string_list("train.metrics", {"auc", "accuracy"}, "Metrics to log")
          .string("output", "out", "Output folder");
  return schema;
}

// Runs `action`, which must throw a ConfigError, and returns it.
ConfigError config_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const ConfigError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a ConfigError, got: " << e.what();
    return ConfigError("", "", 0, "");
  }
  ADD_FAILURE() << "expected a ConfigError, nothing was thrown";
  return ConfigError("", "", 0, "");
}

ConfigError parse_error(const std::string& yaml) {
  return config_error([&] { Config::parse(test_schema(), yaml, "job.yaml"); });
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// `text` as a YAML double-quoted scalar, escaped by hand so that the round-trip test does not rely on the
// quoting it is testing.
std::string double_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out + "\"";
}

// Compares every key of two configs over the same schema, by type.
void expect_same_values(const Config& a, const Config& b) {
  for (const KeySpec& key : test_schema().keys()) {
    SCOPED_TRACE(key.path);
    switch (key.type) {
      case ValueType::boolean:
        EXPECT_EQ(a.get_bool(key.path), b.get_bool(key.path));
        break;
      case ValueType::integer:
        EXPECT_EQ(a.get_int(key.path), b.get_int(key.path));
        break;
      // Exact equality on purpose: doubles must survive to_yaml bit for bit.
      case ValueType::number:
        EXPECT_EQ(a.get_number(key.path), b.get_number(key.path));
        break;
      case ValueType::string:
        EXPECT_EQ(a.get_string(key.path), b.get_string(key.path));
        break;
      case ValueType::string_list:
        EXPECT_EQ(a.get_string_list(key.path), b.get_string_list(key.path));
        break;
    }
  }
}

// ---- defaults and reading ----

TEST(ConfigDefaults, EveryKeyTakesItsDefault) {
  const Config config(test_schema());
  EXPECT_EQ(config.get_string("name"), "demo");
  EXPECT_TRUE(config.get_string_list("slides").empty());
  EXPECT_EQ(config.get_int("tile.size"), 256);
  EXPECT_EQ(config.get_number("tile.mpp"), 0.5);
  EXPECT_EQ(config.get_string("tile.stain_normalization"), "none");
  EXPECT_FALSE(config.get_bool("tile.save_masks"));
  EXPECT_EQ(config.get_number("train.optimizer.momentum"), 0.9);
  EXPECT_EQ(config.get_string_list("train.metrics"), (std::vector<std::string>{"auc", "accuracy"}));
  EXPECT_EQ(config.source(), "");
  for (const KeySpec& key : test_schema().keys()) EXPECT_FALSE(config.is_set(key.path)) << key.path;
}

TEST(ConfigDefaults, EmptyFileMeansAllDefaults) {
  for (const std::string text : {"", "\n\n", "# only a comment\n", "---\n"}) {
    SCOPED_TRACE(text);
    const Config config = Config::parse(test_schema(), text, "job.yaml");
    expect_same_values(config, Config(test_schema()));
    EXPECT_FALSE(config.is_set("tile.size"));
    EXPECT_EQ(config.source(), "job.yaml");
  }
}

TEST(ConfigParse, ReadsEveryTypeAndMarksGivenKeysAsSet) {
  const Config config = Config::parse(test_schema(),
                                      "name: run-7\n"
                                      "slides: [a.svs, b.svs]\n"
                                      "tile:\n"
                                      "  size: 512\n"
                                      "  mpp: 0.25\n"
                                      "  stain_normalization: macenko\n"
                                      "  save_masks: true\n"
                                      "train:\n"
                                      "  optimizer:\n"
                                      "    momentum: 0.95\n"
                                      "  seed: -3\n",
                                      "job.yaml");
  EXPECT_EQ(config.get_string("name"), "run-7");
  EXPECT_EQ(config.get_string_list("slides"), (std::vector<std::string>{"a.svs", "b.svs"}));
  EXPECT_EQ(config.get_int("tile.size"), 512);
  EXPECT_EQ(config.get_number("tile.mpp"), 0.25);
  EXPECT_EQ(config.get_string("tile.stain_normalization"), "macenko");
  EXPECT_TRUE(config.get_bool("tile.save_masks"));
  EXPECT_EQ(config.get_number("train.optimizer.momentum"), 0.95);
  EXPECT_EQ(config.get_int("train.seed"), -3);
  EXPECT_EQ(config.get_int("train.epochs"), 10);  // not given: default

  EXPECT_TRUE(config.is_set("tile.size"));
  EXPECT_TRUE(config.is_set("train.optimizer.momentum"));
  EXPECT_FALSE(config.is_set("train.epochs"));
  EXPECT_FALSE(config.is_set("output"));
}

TEST(ConfigParse, BooleansAcceptYamlSpellings) {
  const std::vector<std::pair<std::string, bool>> cases = {{"true", true}, {"false", false}, {"yes", true},
                                                           {"no", false},  {"True", true},   {"NO", false}};
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(Config::parse(test_schema(), "tile: {save_masks: " + text + "}", "job.yaml").get_bool("tile.save_masks"),
              expected);
  }
}

TEST(ConfigParse, IntegerIsFineForNumberKey) {
  const Config config = Config::parse(test_schema(), "tile:\n  mpp: 2\n", "job.yaml");
  EXPECT_EQ(config.get_number("tile.mpp"), 2.0);
}

TEST(ConfigParse, NumbersInExponentAndSignedForms) {
  const Config config = Config::parse(test_schema(), "train: {weight_decay: 5.0e-4, seed: +7}\n", "job.yaml");
  EXPECT_EQ(config.get_number("train.weight_decay"), 5.0e-4);
  EXPECT_EQ(config.get_int("train.seed"), 7);
}

TEST(ConfigParse, DottedKeysInTheFileReachNestedKeys) {
  const Config config = Config::parse(test_schema(), "tile.size: 128\ntrain.optimizer.momentum: 0.5\n", "job.yaml");
  EXPECT_EQ(config.get_int("tile.size"), 128);
  EXPECT_EQ(config.get_number("train.optimizer.momentum"), 0.5);
}

TEST(ConfigParse, EmptySectionKeepsDefaults) {
  const Config config = Config::parse(test_schema(), "tile:\n  # size: 1024\nname: x\n", "job.yaml");
  EXPECT_EQ(config.get_int("tile.size"), 256);
  EXPECT_EQ(config.get_string("name"), "x");
}

TEST(ConfigParse, ScalarsAreReadAsStringsForStringKeys) {
  // Whatever YAML would make of these, a string key reads the text.
  const Config config = Config::parse(test_schema(), "name: 123\noutput: 'yes'\n", "job.yaml");
  EXPECT_EQ(config.get_string("name"), "123");
  EXPECT_EQ(config.get_string("output"), "yes");
}

// ---- lists ----

TEST(ConfigLists, BlockAndFlowSequences) {
  const Config block = Config::parse(test_schema(), "slides:\n  - a.svs\n  - 'b c.svs'\n", "job.yaml");
  EXPECT_EQ(block.get_string_list("slides"), (std::vector<std::string>{"a.svs", "b c.svs"}));
  const Config flow = Config::parse(test_schema(), "slides: [x.tif]\n", "job.yaml");
  EXPECT_EQ(flow.get_string_list("slides"), (std::vector<std::string>{"x.tif"}));
}

TEST(ConfigLists, SingleScalarIsOneElementList) {
  const Config config = Config::parse(test_schema(), "slides: only.svs\n", "job.yaml");
  EXPECT_EQ(config.get_string_list("slides"), (std::vector<std::string>{"only.svs"}));
}

TEST(ConfigLists, EmptyListReplacesDefault) {
  const Config config = Config::parse(test_schema(), "train:\n  metrics: []\n", "job.yaml");
  EXPECT_TRUE(config.get_string_list("train.metrics").empty());
  EXPECT_TRUE(config.is_set("train.metrics"));
}

TEST(ConfigLists, NestedItemIsRejectedAtItsLine) {
  const ConfigError e = parse_error("slides:\n  - a.svs\n  - [b, c]\n");
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.key(), "slides");
  EXPECT_NE(std::string(e.what()).find("expected a list of strings, got a list as item 2"), std::string::npos)
      << e.what();
}

TEST(ConfigLists, SectionIsNotAList) {
  const ConfigError e = parse_error("slides:\n  a: 1\n");
  EXPECT_EQ(e.key(), "slides");
  EXPECT_EQ(e.message(), "expected a list of strings, got a section");
}

// ---- errors ----

TEST(ConfigErrors, UnknownKeyNamesFileLineKeyAndSuggestion) {
  const ConfigError e = parse_error(
      "name: x\n"
      "tile:\n"
      "  size: 128\n"
      "  sise: 256\n");
  EXPECT_EQ(e.file(), "job.yaml");
  EXPECT_EQ(e.line(), 4);
  EXPECT_EQ(e.key(), "tile.sise");
  EXPECT_EQ(e.kind(), ErrorKind::config);
  EXPECT_STREQ(e.what(), "file 'job.yaml', line 4, key 'tile.sise': unknown key; did you mean 'tile.size'?");
}

TEST(ConfigErrors, UnknownKeySuggestsByLastComponentWhenMisplaced) {
  // "size" is far from "tile.size" as a path but is exactly its last component.
  const ConfigError e = parse_error("size: 128\n");
  EXPECT_EQ(e.key(), "size");
  EXPECT_EQ(e.message(), "unknown key; did you mean 'tile.size'?");
}

TEST(ConfigErrors, UnknownSectionSuggestsSection) {
  const ConfigError e = parse_error("name: x\ntiel:\n  size: 128\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "tiel");
  EXPECT_EQ(e.message(), "unknown key; did you mean 'tile'?");
}

TEST(ConfigErrors, UnknownKeyInNestedSection) {
  const ConfigError e = parse_error("train:\n  optimizer:\n    momentun: 0.9\n");
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.key(), "train.optimizer.momentun");
  EXPECT_EQ(e.message(), "unknown key; did you mean 'train.optimizer.momentum'?");
}

TEST(ConfigErrors, UnknownKeyFarFromAnyHasNoSuggestion) {
  const ConfigError e = parse_error("completely_unrelated: 1\n");
  EXPECT_EQ(e.message(), "unknown key");
}

TEST(ConfigErrors, WrongTypes) {
  struct Case {
    std::string yaml;
    std::string key;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"tile:\n  size: abc\n", "tile.size", "expected an integer, got 'abc'"},
      {"tile:\n  size: 1.5\n", "tile.size", "expected an integer, got '1.5'"},
      {"tile:\n  size: 99999999999999999999\n", "tile.size",
       "expected an integer, got '99999999999999999999' (too large)"},
      {"tile:\n  mpp: fast\n", "tile.mpp", "expected a number, got 'fast'"},
      {"tile:\n  mpp: .inf\n", "tile.mpp", "expected a number, got '.inf'"},
      {"tile:\n  save_masks: maybe\n", "tile.save_masks", "expected a boolean (true or false), got 'maybe'"},
      {"tile:\n  size: [1, 2]\n", "tile.size", "expected an integer, got a list"},
      {"tile:\n  size: {a: 1}\n", "tile.size", "expected an integer, got a section"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    const ConfigError e = parse_error(c.yaml);
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.key(), c.key);
    EXPECT_EQ(e.message(), c.message);
  }
}

TEST(ConfigErrors, MissingValuePointsAtTheKey) {
  const ConfigError e = parse_error("tile:\n  size:\n\n\n  mpp: 1\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "tile.size");
  EXPECT_EQ(e.message(), "expected an integer, got no value");
}

TEST(ConfigErrors, OutOfRange) {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"tile: {size: 0}", "must be between 1 and 4096, got 0"},
      {"tile: {size: 4097}", "must be between 1 and 4096, got 4097"},
      {"tile: {overlap: -1}", "must be at least 0, got -1"},
      {"train: {epochs: 5000}", "must be at most 1000, got 5000"},
      {"tile: {mpp: 0.01}", "must be between 0.05 and 100, got 0.01"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    EXPECT_EQ(parse_error(c.yaml).message(), c.message);
  }
  // The bounds themselves are inside.
  EXPECT_EQ(Config::parse(test_schema(), "tile: {size: 4096, overlap: 0}", "job.yaml").get_int("tile.size"), 4096);
  EXPECT_EQ(Config::parse(test_schema(), "train: {epochs: -5}", "job.yaml").get_int("train.epochs"), -5);
}

TEST(ConfigErrors, StringNotAllowedListsValuesAndSuggests) {
  const ConfigError e = parse_error("tile:\n  stain_normalization: macenk\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "tile.stain_normalization");
  EXPECT_EQ(e.message(), "expected one of: none, reinhard, macenko, got 'macenk'; did you mean 'macenko'?");
  EXPECT_EQ(parse_error("tile: {stain_normalization: vahadane}").message(),
            "expected one of: none, reinhard, macenko, got 'vahadane'");
}

TEST(ConfigErrors, SectionGivenAsScalar) {
  const ConfigError e = parse_error("name: x\ntile: 256\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "tile");
  EXPECT_EQ(e.message(), "expected a section (a map of keys), got '256'");
}

TEST(ConfigErrors, ScalarGivenAsSection) {
  const ConfigError e = parse_error("name:\n  first: x\n");
  EXPECT_EQ(e.key(), "name");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.message(), "expected a string, got a section");
}

TEST(ConfigErrors, YamlSyntaxErrorNamesFileAndLine) {
  const ConfigError e = parse_error("name: x\ntile:\n  size: [1, 2\n  mpp: 1\n");
  EXPECT_EQ(e.file(), "job.yaml");
  EXPECT_GE(e.line(), 3);  // yaml-cpp reports where it noticed: the line after the open '['
  EXPECT_LE(e.line(), 4);
  EXPECT_NE(std::string(e.what()).find("file 'job.yaml', line "), std::string::npos) << e.what();
  EXPECT_NE(e.message().find("invalid YAML: "), std::string::npos) << e.message();

  const ConfigError bad_map = parse_error("a: b: c\n");
  EXPECT_EQ(bad_map.line(), 1);
}

TEST(ConfigErrors, TopLevelMustBeAMap) {
  const ConfigError list = parse_error("- a\n- b\n");
  EXPECT_EQ(list.line(), 1);
  EXPECT_EQ(list.message(), "expected a map of keys at the top level, got a list");
  EXPECT_EQ(parse_error("just text\n").message(), "expected a map of keys at the top level, got 'just text'");
}

TEST(ConfigErrors, DuplicateKeys) {
  const ConfigError same_map = parse_error("tile:\n  size: 1\n  size: 2\n");
  EXPECT_EQ(same_map.line(), 3);
  EXPECT_EQ(same_map.key(), "tile.size");
  EXPECT_EQ(same_map.message(), "duplicate key (first given on line 2)");

  const ConfigError dotted = parse_error("tile.size: 1\ntile:\n  size: 2\n");
  EXPECT_EQ(dotted.line(), 3);
  EXPECT_EQ(dotted.message(), "duplicate key (first given on line 1)");
}

TEST(ConfigErrors, MoreThanOneDocument) {
  const ConfigError e = parse_error("name: a\n---\nname: b\n");
  EXPECT_EQ(e.message(), "expected one YAML document, got 2");
}

// ---- overrides ----

TEST(ConfigOverrides, ValuesAreParsedAsYaml) {
  Config config(test_schema());
  config.set("tile.size=512");
  config.set("slides=[a.svs,b.svs]");
  config.set("name=\"x y\"");
  config.set("output=plain words");
  config.set("tile.save_masks=yes");
  config.set("train.metrics=auc");
  EXPECT_EQ(config.get_int("tile.size"), 512);
  EXPECT_EQ(config.get_string_list("slides"), (std::vector<std::string>{"a.svs", "b.svs"}));
  EXPECT_EQ(config.get_string("name"), "x y");
  EXPECT_EQ(config.get_string("output"), "plain words");
  EXPECT_TRUE(config.get_bool("tile.save_masks"));
  EXPECT_EQ(config.get_string_list("train.metrics"), (std::vector<std::string>{"auc"}));
  EXPECT_TRUE(config.is_set("tile.size"));
  EXPECT_FALSE(config.is_set("tile.mpp"));
}

TEST(ConfigOverrides, ValueMayContainEqualsAndKeyMaySpace) {
  Config config(test_schema());
  config.set("name=a=b");
  EXPECT_EQ(config.get_string("name"), "a=b");
  config.set(" tile.size =64");
  EXPECT_EQ(config.get_int("tile.size"), 64);
}

TEST(ConfigOverrides, ApplyAfterTheFile) {
  const Config config =
      Config::parse(test_schema(), "tile:\n  size: 128\n  mpp: 1\n", "job.yaml", {"tile.size=1024", "train.seed=1"});
  EXPECT_EQ(config.get_int("tile.size"), 1024);
  EXPECT_EQ(config.get_number("tile.mpp"), 1.0);
  EXPECT_EQ(config.get_int("train.seed"), 1);
  EXPECT_TRUE(config.is_set("train.seed"));
}

TEST(ConfigOverrides, WholeSectionAsFlowMap) {
  Config config(test_schema());
  config.set("tile={size: 128, mpp: 0.25}");
  EXPECT_EQ(config.get_int("tile.size"), 128);
  EXPECT_EQ(config.get_number("tile.mpp"), 0.25);
}

TEST(ConfigOverrides, MissingEqualsIsAnError) {
  const ConfigError e = config_error([] { Config(test_schema()).set("tile.size"); });
  EXPECT_EQ(e.file(), "--set tile.size");
  EXPECT_EQ(e.line(), 0);
  EXPECT_STREQ(e.what(), "--set tile.size: expected 'key=value', got 'tile.size'");
  EXPECT_EQ(config_error([] { Config(test_schema()).set("=3"); }).message(), "expected 'key=value', got '=3'");
}

TEST(ConfigOverrides, UnknownKeyIsAnErrorWithSuggestion) {
  const ConfigError e = config_error([] { Config(test_schema()).set("tile.sise=3"); });
  EXPECT_EQ(e.file(), "--set tile.sise=3");
  EXPECT_EQ(e.line(), 0);
  EXPECT_EQ(e.key(), "tile.sise");
  EXPECT_STREQ(e.what(), "--set tile.sise=3: unknown key; did you mean 'tile.size'?");
}

TEST(ConfigOverrides, BadValuesAreErrors) {
  EXPECT_STREQ(config_error([] { Config(test_schema()).set("tile.size=abc"); }).what(),
               "--set tile.size=abc: expected an integer, got 'abc'");
  EXPECT_EQ(config_error([] { Config(test_schema()).set("tile.size=0"); }).message(),
            "must be between 1 and 4096, got 0");
  const ConfigError syntax = config_error([] { Config(test_schema()).set("slides=[a.svs"); });
  EXPECT_EQ(syntax.key(), "slides");
  EXPECT_EQ(syntax.line(), 0);
  EXPECT_NE(syntax.message().find("invalid YAML value"), std::string::npos) << syntax.message();
}

TEST(ConfigOverrides, OverrideErrorFromParseNamesSet) {
  const ConfigError e = config_error([] { Config::parse(test_schema(), "name: x\n", "job.yaml", {"tile.mpp=big"}); });
  EXPECT_EQ(e.file(), "--set tile.mpp=big");
  EXPECT_EQ(e.key(), "tile.mpp");
}

// A command-line flag's value goes through the same checks as the key's YAML value, and errors name the flag.
TEST(ConfigOverrides, FlagValuesAreCheckedLikeTheKey) {
  Config config(test_schema());
  config.set_value("tile.size", "128", "--size");
  EXPECT_EQ(config.get_int("tile.size"), 128);
  EXPECT_TRUE(config.is_set("tile.size"));
  config.set_value("tile.mpp", "0.25", "--mpp");
  EXPECT_EQ(config.get_number("tile.mpp"), 0.25);

  const ConfigError range = config_error([] { Config(test_schema()).set_value("tile.size", "0", "--size"); });
  EXPECT_STREQ(range.what(), "--size: must be between 1 and 4096, got 0");
  EXPECT_EQ(range.file(), "--size");
  EXPECT_EQ(range.key(), "tile.size");
  EXPECT_STREQ(config_error([] { Config(test_schema()).set_value("tile.size", "-5", "--size"); }).what(),
               "--size: must be between 1 and 4096, got -5");
  EXPECT_STREQ(config_error([] { Config(test_schema()).set_value("tile.size", "abc", "--size"); }).what(),
               "--size: expected an integer, got 'abc'");
  // The text is one value, never YAML syntax: a flow sequence or a bracket is just a bad integer.
  EXPECT_STREQ(config_error([] { Config(test_schema()).set_value("tile.size", "[1", "--size"); }).what(),
               "--size: expected an integer, got '[1'");
  EXPECT_STREQ(config_error([] { Config(test_schema()).set_value("tile.mpp", "nan", "--mpp"); }).what(),
               "--mpp: expected a number, got 'nan'");
  EXPECT_EQ(config.get_int("tile.size"), 128) << "a failed flag changes nothing";
}

TEST(ConfigOverrides, FailedOverrideChangesNothing) {
  Config config(test_schema());
  EXPECT_THROW(config.set("tile={size: 128, mpp: -1}"), ConfigError);
  EXPECT_EQ(config.get_int("tile.size"), 256);
  EXPECT_FALSE(config.is_set("tile.size"));
}

// ---- programming errors ----

TEST(ConfigAccess, UnknownPathIsInternalErrorNamingTheKey) {
  const Config config(test_schema());
  try {
    config.get_int("tile.sise");
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("tile.sise"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config.is_set("nope"), InternalError);
  EXPECT_THROW(config.get_bool("tile"), InternalError);  // a section, not a key
}

TEST(ConfigAccess, WrongTypeIsInternalErrorNamingTheKey) {
  const Config config(test_schema());
  try {
    config.get_string("tile.size");
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("tile.size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config.get_number("tile.size"), InternalError);
  EXPECT_THROW(config.get_int("tile.mpp"), InternalError);
  EXPECT_THROW(config.get_string("slides"), InternalError);
  EXPECT_THROW(config.get_string_list("name"), InternalError);
}

TEST(ConfigSchema, MistakesInTheSchemaAreInternalErrors) {
  EXPECT_THROW(Schema().integer("a.b", 1, "").integer("a.b", 2, ""), InternalError);
  EXPECT_THROW(Schema().integer("a.b", 1, "").integer("a", 2, ""), InternalError);
  EXPECT_THROW(Schema().integer("a", 1, "").integer("a.b", 2, ""), InternalError);
  EXPECT_THROW(Schema().integer("a", 0, "", 1, 10), InternalError);
  EXPECT_THROW(Schema().string("a", "x", "", {"y", "z"}), InternalError);
  EXPECT_THROW(Schema().string("a..b", "x", ""), InternalError);
  EXPECT_THROW(Schema().string("a b", "x", ""), InternalError);
  EXPECT_THROW(Schema().string("a.", "x", ""), InternalError);
  EXPECT_THROW(Schema().number("a", 1, "", 2, 1), InternalError);
  EXPECT_NO_THROW(Schema().integer("a.b", 1, "").integer("a.c", 2, "").integer("ab", 3, ""));
}

TEST(ConfigSchema, FindAndDeclarationOrder) {
  const Schema& schema = test_schema();
  ASSERT_NE(schema.find("tile.mpp"), nullptr);
  EXPECT_EQ(schema.find("tile.mpp")->type, ValueType::number);
  EXPECT_EQ(schema.find("tile"), nullptr);
  EXPECT_EQ(schema.keys().front().path, "name");
  EXPECT_EQ(schema.keys().back().path, "output");
  EXPECT_STREQ(to_string(ValueType::string_list), "string list");
}

// ---- to_yaml, save, load ----

TEST(ConfigToYaml, DefaultsRenderNestedWithDocs) {
  const std::string expected =
      "# Job name, used in output file names\n"
      "name: demo\n"
      "# Slides to process\n"
      "slides: []\n"
      "\n"
      "tile:\n"
      "  # Tile edge in pixels [range 1..4096]\n"
      "  size: 256\n"
      "  # Target resolution in um/px [range 0.05..100]\n"
      "  mpp: 0.5\n"
      "  # Overlap between tiles in pixels [range >= 0]\n"
      "  overlap: 0\n"
      "  # Stain normalization [one of: none, reinhard, macenko]\n"
      "  stain_normalization: none\n"
      "  # Write tissue masks next to the shards\n"
      "  save_masks: false\n"
      "\n"
      "train:\n"
      "  optimizer:\n"
      "    # SGD momentum [range 0..1]\n"
      "    momentum: 0.9\n"
      "  # Number of epochs [range <= 1000]\n"
      "  epochs: 10\n"
      "  # L2 penalty\n"
      "  weight_decay: 0.0001\n"
      "  # Random seed\n"
      "  seed: 42\n"
      "  # Metrics to log\n"
      "  metrics: [auc, accuracy]\n"
      "# Output folder\n"
      "output: out\n";
  EXPECT_EQ(Config(test_schema()).to_yaml(), expected);
}

TEST(ConfigToYaml, RoundTripsThroughParseExactly) {
  const std::vector<std::string> tricky = {"true", "null", "~",  "a: b", "#x",  "",   " lead", "multi\nline", "123",
                                           "1.5",  "é",    "[x", "a,b",  "yes", "'q", "\"dq",  "-",           "*a"};
  for (const std::string& text : tricky) {
    SCOPED_TRACE(text);
    Config config(test_schema());
    const std::string quoted = double_quoted(text);
    config.set("name=" + quoted);
    config.set("slides=[" + quoted + ", plain, " + quoted + "]");
    ASSERT_EQ(config.get_string("name"), text);
    ASSERT_EQ(config.get_string_list("slides"), (std::vector<std::string>{text, "plain", text}));

    const std::string yaml = config.to_yaml();
    const Config back = Config::parse(test_schema(), yaml, "printed.yaml");
    expect_same_values(config, back);
    EXPECT_EQ(back.to_yaml(), yaml);
  }
}

TEST(ConfigToYaml, DoublesAndIntegersRoundTripBitForBit) {
  const double lowest = std::numeric_limits<double>::denorm_min();
  const double largest = std::numeric_limits<double>::max();
  for (double value : {0.1 + 0.2, 1.0 / 3.0, 1e-300, lowest, largest, -2.5e17, 0.0, 1.0, 1e21}) {
    SCOPED_TRACE(value);
    Config config(test_schema());
    config.set("train.weight_decay=" + [&] {
      std::ostringstream out;
      out.precision(17);
      out << value;
      return out.str();
    }());
    ASSERT_EQ(config.get_number("train.weight_decay"), value);
    config.set("tile.mpp=" + std::to_string(1.0 / 7.0));
    config.set("train.seed=" + std::to_string(std::numeric_limits<std::int64_t>::min()));
    const Config back = Config::parse(test_schema(), config.to_yaml(), "printed.yaml");
    expect_same_values(config, back);
  }
  // Numbers keep a float look, so other YAML readers do not take them for integers.
  Config whole(test_schema());
  whole.set("train.weight_decay=3");
  EXPECT_NE(whole.to_yaml().find("weight_decay: 3.0\n"), std::string::npos) << whole.to_yaml();
  whole.set("train.weight_decay=1e-30");
  EXPECT_NE(whole.to_yaml().find("weight_decay: 1.0e-30\n"), std::string::npos) << whole.to_yaml();
}

TEST(ConfigToYaml, StringsThatLookLikeOtherTypesAreQuoted) {
  Config config(test_schema());
  config.set("name='true'");
  config.set("output='42'");
  config.set("slides=['null', 'no', '']");
  const std::string yaml = config.to_yaml();
  EXPECT_NE(yaml.find("name: \"true\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("output: \"42\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("slides: [\"null\", \"no\", \"\"]\n"), std::string::npos) << yaml;
}

TEST(ConfigToYaml, EveryKeyIsSetAfterLoadingThePrintedConfig) {
  const Config back = Config::parse(test_schema(), Config(test_schema()).to_yaml(), "printed.yaml");
  for (const KeySpec& key : test_schema().keys()) EXPECT_TRUE(back.is_set(key.path)) << key.path;
}

TEST(ConfigSave, WritesAtomicallyAndLeavesNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir.file("job.yaml");
  write_text(path, "old content\n");
  Config config(test_schema());
  config.set("tile.size=1024");
  config.set("name=saved run");
  config.save(path);

  EXPECT_EQ(read_text(path), config.to_yaml());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"job.yaml"}));

  const Config back = Config::load(test_schema(), path);
  expect_same_values(config, back);
  EXPECT_EQ(back.source(), path);
}

TEST(ConfigSave, FailureIsInternalErrorNamingTheFile) {
  testing::TempDir dir;
  const std::string path = dir.file("missing-folder/job.yaml");
  try {
    Config(test_schema()).save(path);
    FAIL() << "expected InternalError";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(ConfigLoad, MissingFileIsFileNotFound) {
  testing::TempDir dir;
  const std::string path = dir.file("nope.yaml");
  try {
    Config::load(test_schema(), path);
    FAIL() << "expected FileNotFoundError";
  } catch (const FileNotFoundError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.kind(), ErrorKind::input);
  }
}

TEST(ConfigLoad, ReadsFileAppliesOverridesAndNamesFileInErrors) {
  testing::TempDir dir;
  const std::string path = dir.file("job.yaml");
  write_text(path, "tile:\n  size: 128\n");
  const Config config = Config::load(test_schema(), path, {"train.epochs=3"});
  EXPECT_EQ(config.get_int("tile.size"), 128);
  EXPECT_EQ(config.get_int("train.epochs"), 3);
  EXPECT_EQ(config.source(), path);

  write_text(path, "tile:\n  size: 128\n  zise: 3\n");
  const ConfigError e = config_error([&] { Config::load(test_schema(), path); });
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.line(), 3);
}

// Data-driven cases: tests/data/config/<case>/job.yaml must fail with the text in expected.txt.
TEST(ConfigDataCases, EachCaseFailsWithItsExpectedMessage) {
  const fs::path root = testing::test_data_dir() / "config";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    SCOPED_TRACE(entry.path().filename().string());
    const std::string job = (entry.path() / "job.yaml").string();
    std::string expected = read_text(entry.path() / "expected.txt");
    while (!expected.empty() && (expected.back() == '\n' || expected.back() == '\r')) expected.pop_back();
    ASSERT_FALSE(expected.empty());
    const ConfigError e = config_error([&] { Config::load(test_schema(), job); });
    EXPECT_EQ(e.file(), job);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "what(): " << e.what() << "\nexpected to contain: " << expected;
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

// ---- suggestions ----

TEST(EditDistance, Levenshtein) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("sitting", "kitten"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("size", "sise"), 1u);
  EXPECT_EQ(edit_distance("ab", "ba"), 2u);  // plain Levenshtein: a transposition is two edits
  EXPECT_EQ(edit_distance("tile.size", "tile.sizes"), 1u);
}

TEST(ClosestMatch, PicksNearestWithinAThirdOfTheWord) {
  const std::vector<std::string> verbs = {"tile", "train", "infer", "evaluate", "synth", "bench", "info"};
  EXPECT_EQ(closest_match("trian", verbs), "train");
  EXPECT_EQ(closest_match("evalute", verbs), "evaluate");
  EXPECT_EQ(closest_match("infr", verbs), "infer");
  EXPECT_EQ(closest_match("tile", verbs), "tile");
  EXPECT_EQ(closest_match("completely", verbs), "");
  EXPECT_EQ(closest_match("anything", {}), "");
}

TEST(ClosestMatch, ThresholdIsMaxOfTwoAndAThird) {
  // Nine letters allow three edits.
  EXPECT_EQ(closest_match("abcdefghi", {"abcdefXXX"}), "abcdefXXX");
  EXPECT_EQ(closest_match("abcdefghi", {"abcdeXXXX"}), "");
  // Short words still allow two.
  EXPECT_EQ(closest_match("ab", {"xy"}), "xy");
  EXPECT_EQ(closest_match("abc", {"xyz"}), "");
  // On a tie the first candidate wins.
  EXPECT_EQ(closest_match("cat", {"bat", "hat"}), "bat");
}

}  // namespace
}  // namespace tessera::core

// ---- renamed keys ----

namespace tessera::core {
namespace {

const Schema& renamed_schema() {
  static const Schema schema = Schema()
                                   .string_list("input.slides", {}, "Slides")
                                   .number("input.assume_mpp", 0.0, "um/px", 0, 100)
                                   .integer("tile.size", 256, "Tile edge", 1, 4096)
                                   .renamed("slides", "input.slides")
                                   .renamed("slides.assume_mpp", "input.assume_mpp");
  return schema;
}

// The warnings logged while `action` runs.
std::string warnings_of(const std::function<void()>& action) {
  std::ostringstream text;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
  const auto logger = spdlog::default_logger();
  logger->sinks().push_back(sink);
  try {
    action();
  } catch (...) {
    logger->sinks().pop_back();
    throw;
  }
  logger->sinks().pop_back();
  return text.str();
}

TEST(ConfigRenamed, AnOldNameIsReadAsTheNewKeyWithAWarningNamingBoth) {
  Config config(renamed_schema());
  const std::string warnings = warnings_of(
      [&] { config = Config::parse(renamed_schema(), "slides: [a.svs]\nslides.assume_mpp: 0.25\n", "job.yaml"); });
  EXPECT_EQ(config.get_string_list("input.slides"), std::vector<std::string>{"a.svs"});
  EXPECT_EQ(config.get_number("input.assume_mpp"), 0.25);
  EXPECT_TRUE(config.is_set("input.slides"));
  EXPECT_NE(warnings.find("job.yaml:1: 'slides' is the old name of 'input.slides'"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("'slides.assume_mpp' is the old name of 'input.assume_mpp'"), std::string::npos) << warnings;
  // The effective config speaks the new names only.
  EXPECT_NE(config.to_yaml().find("input:"), std::string::npos);
  EXPECT_EQ(config.to_yaml().find("slides:\n  assume_mpp"), std::string::npos);
}

TEST(ConfigRenamed, AnOldNameIsCheckedLikeTheNewKey) {
  const ConfigError e =
      config_error([] { Config::parse(renamed_schema(), "slides:\n  assume_mpp: -1\n", "job.yaml"); });
  EXPECT_EQ(e.key(), "input.assume_mpp");
  EXPECT_NE(std::string(e.what()).find("must be between 0 and 100"), std::string::npos) << e.what();
}

TEST(ConfigRenamed, GivingTheOldAndTheNewNameIsOneErrorNamingBoth) {
  for (const std::string yaml : {"input:\n  slides: [a]\nslides: [b]\n", "slides: [b]\ninput.slides: [a]\n"}) {
    SCOPED_TRACE(yaml);
    const ConfigError e = config_error([&] { Config::parse(renamed_schema(), yaml, "job.yaml"); });
    EXPECT_EQ(e.line(), 3 - (yaml[0] == 's'));
    EXPECT_NE(std::string(e.what()).find("are the same key (slides is its old name)"), std::string::npos) << e.what();
  }
}

TEST(ConfigRenamed, OverridesAndFlagsTakeTheOldNameToo) {
  Config config(renamed_schema());
  config.set("slides=[x.svs]");
  EXPECT_EQ(config.get_string_list("input.slides"), std::vector<std::string>{"x.svs"});
}

TEST(ConfigRenamed, ASchemaCannotRenameToAnUndeclaredKeyOrFromAKeyInUse) {
  EXPECT_THROW(Schema().integer("a", 1, "A").renamed("b", "c"), InternalError);
  EXPECT_THROW(Schema().integer("a", 1, "A").integer("b.c", 1, "B").renamed("b", "a"), InternalError);
  EXPECT_THROW(Schema().integer("a", 1, "A").renamed("b", "a").renamed("b", "a"), InternalError);
}

}  // namespace
}  // namespace tessera::core

// ---- typed values from code and lists from flags ----

namespace tessera::core {
namespace {

TEST(ConfigAssign, ATypedValueIsCheckedLikeAYamlOneAndErrorsNameTheSource) {
  Config config(test_schema());
  config.assign("tile.mpp", 0.25, "ckpt.h5");
  EXPECT_EQ(config.get_number("tile.mpp"), 0.25);
  EXPECT_TRUE(config.is_set("tile.mpp"));
  config.assign("tile.save_masks", true, "ckpt.h5");
  EXPECT_TRUE(config.get_bool("tile.save_masks"));
  ConfigError e = config_error([&] { config.assign("tile.mpp", 1000.0, "ckpt.h5"); });
  EXPECT_EQ(e.file(), "ckpt.h5");
  EXPECT_EQ(e.key(), "tile.mpp");
  EXPECT_NE(std::string(e.what()).find("must be between 0.05 and 100, got 1000"), std::string::npos) << e.what();
  e = config_error([&] { config.assign("tile.mpp", std::numeric_limits<double>::quiet_NaN(), "ckpt.h5"); });
  EXPECT_NE(std::string(e.what()).find("must be a finite number"), std::string::npos) << e.what();
  e = config_error([&] { config.assign("tile.stain_normalization", std::string("grey"), "ckpt.h5"); });
  EXPECT_NE(std::string(e.what()).find("expected one of: none, reinhard, macenko, got 'grey'"), std::string::npos);
  EXPECT_EQ(config.get_number("tile.mpp"), 0.25) << "a refused value changes nothing";
  EXPECT_THROW(config.assign("tile.mpp", std::int64_t{1}, "code"), InternalError) << "the key's own type only";
  EXPECT_THROW(config.assign("no.such", 1.0, "code"), InternalError);
}

TEST(ConfigSetList, ItemsAreTakenAsGivenAndCheckedAsAList) {
  Config config(test_schema());
  config.set_list("slides", {"a: b.svs", "#c.svs", "[d].svs"}, "--slides");
  EXPECT_EQ(config.get_string_list("slides"), (std::vector<std::string>{"a: b.svs", "#c.svs", "[d].svs"}));
  const ConfigError e = config_error([&] { config.set_list("tile.size", {"1"}, "--size"); });
  EXPECT_EQ(e.file(), "--size");
  EXPECT_NE(std::string(e.what()).find("expected an integer, got a list"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace tessera::core
