#include "app/cli.h"

#include <iostream>
#include <map>
#include <string>

#include "core/comm.h"
#include "core/error.h"

namespace tessera::app {

const std::vector<Verb>& verbs() {
  static const std::vector<Verb> list = {
      {"synth", "Generate synthetic H&E whole-slide images with ground-truth tumour annotations", setup_synth},
      {"qc", "Slide quality control: artefact masks (blur, pen ink, folds, bubbles, exposure), flags, a cohort table",
       setup_qc},
      {"tile", "Tile slides with tumour annotations into contiguous HDF5 shards of labelled tiles (parallel)",
       setup_tile, true},
      {"import", "Import labelled patches (a CSV or a folder by class) into the same shards, split by patient",
       setup_import},
      {"train", "Train a tumour/normal CNN on tile shards (oneDNN; one replica per MPI rank)", setup_train},
      {"predict", "Score the tiles of shards with a trained checkpoint: P(tumour) per tile as CSV, AUC summary",
       setup_predict},
      {"quantize", "Calibrate a trained checkpoint for int8 inference: activation ranges stored in the checkpoint",
       setup_quantize},
      {"infer", "Run a trained checkpoint over whole slides: tumour-probability heatmaps per slide (parallel)",
       setup_infer},
      {"evaluate", "Score detections and predictions against the ground truth: CAMELYON16 FROC, slide and patch AUC",
       setup_evaluate},
      {"view", "Show slides with their heatmaps and regions in a web browser (a local web server)", setup_view},
      {"info", "Show a slide's vendor, pyramid levels, resolution and associated images", setup_info},
      {"bench", "Measure speed: the machine's compute peak and the stages' throughput", setup_bench},
  };
  return list;
}

bool alone_without_mpi(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string word = argv[1];
  for (const auto& verb : verbs()) {
    if (word == verb.name) return verb.alone_without_mpi;
  }
  return false;
}

void add_job_options(CLI::App& command, JobOptions& options) {
  command.add_option("job", options.file, "YAML job file (optional: every key has a default)")
      ->check(CLI::ExistingFile);
  command.add_option("--set", options.overrides, "Override a config key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  command.add_flag("--print-config", options.print_config,
                   "Print the full effective config (every key, its default and doc) and exit");
}

CLI::Option* add_key_flag(CLI::App& command, JobOptions& options, const std::string& names,
                          std::vector<std::string> keys, const std::string& doc, FlagForm form,
                          std::vector<std::string> clears) {
  KeyFlag& flag = options.key_flags.emplace_back();
  flag.keys = std::move(keys);
  flag.clears = std::move(clears);
  flag.form = form;
  if (form == FlagForm::on) {
    flag.option = command.add_flag(names, flag.on, doc);
    return flag.option;
  }
  // A string, not the key's type: CLI11's own conversion would report "could not be converted" in its words,
  // and the schema's check is the one the YAML key gets.
  flag.option = command.add_option(names, flag.value, doc)->type_name(form == FlagForm::list ? "A,B,..." : "VALUE");
  return flag.option;
}

core::Config load_job(const core::Schema& schema, const JobOptions& options) {
  core::Config config =
      options.file.empty() ? core::Config(schema) : core::Config::load(schema, options.file, options.overrides);
  if (options.file.empty()) {
    for (const auto& assignment : options.overrides) config.set(assignment);
  }
  std::map<std::string, std::string> by_flag;  // key -> the flag that set it
  for (const KeyFlag& flag : options.key_flags) {
    if (flag.option->count() == 0) continue;
    const std::string name = flag.option->get_name();
    for (const auto& key : flag.keys) by_flag.emplace(key, name);
  }
  for (const KeyFlag& flag : options.key_flags) {
    if (flag.option->count() == 0) continue;
    const std::string name = flag.option->get_name();
    // A flag that gives the slides one way takes the place of the job's other way (--slides of its input.csv);
    // both ways on one command line is a mistake.
    for (const auto& key : flag.clears) {
      if (const auto other = by_flag.find(key); other != by_flag.end()) {
        throw core::UsageError(name + " and " + other->second + " cannot both be given");
      }
      config.assign(key, schema.find(key)->default_value, name);
    }
    for (const auto& key : flag.keys) {
      switch (flag.form) {
        case FlagForm::value:
          config.set_value(key, flag.value, name);
          break;
        case FlagForm::list:
          config.set_list(key, comma_list(flag.value), name);
          break;
        case FlagForm::on:
          if (flag.on) config.set_value(key, "true", name);
          break;
      }
    }
  }
  return config;
}

bool maybe_print_config(const core::Config& config, const JobOptions& options) {
  if (!options.print_config) return false;
  if (core::Comm::world().is_root()) std::cout << config.to_yaml() << std::flush;
  return true;
}

std::string required_checkpoint(const core::Config& config) {
  std::string checkpoint = config.get_string("checkpoint");
  if (checkpoint.empty()) {
    throw core::ConfigError("no checkpoint given (--checkpoint or the job's 'checkpoint' key)", config.source(), 0,
                            "checkpoint");
  }
  return checkpoint;
}

// "a, b,c" → {"a", "b", "c"} (empty items dropped).
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> items(1);
  for (const char c : text) {
    if (c == ',') {
      items.emplace_back();
    } else {
      items.back() += c;
    }
  }
  for (auto& item : items) {
    const auto first = item.find_first_not_of(' ');
    const auto last = item.find_last_not_of(' ');
    item = first == std::string::npos ? std::string() : item.substr(first, last - first + 1);
  }
  std::erase(items, std::string());
  return items;
}

}  // namespace tessera::app
