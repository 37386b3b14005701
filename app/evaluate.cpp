// `tessera evaluate [job.yaml]`: CAMELYON16-style scores of a model's outputs against the ground truth. The verb
// turns the command line and YAML job into an analysis::EvaluateJob, runs it (analysis/evaluate_job.h: the inputs,
// the scores, evaluation.json, froc.png and roc.png) and prints its summary. Exit code 3 when a slide's inputs (or
// the predictions) are broken; the rest is still scored.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analysis/evaluate_job.h"
#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/output_dir.h"
#include "io/annotations.h"
#include "io/slide_list.h"

namespace tessera::app {
namespace {

const core::Schema& evaluate_schema() {
  static const core::Schema instance = [] {
    const io::AnnotationClasses classes;
    core::Schema schema;
    io::declare_input_keys(schema, /*files=*/false)
        .renamed("dataset", "input.csv")
        .renamed("splits", "input.splits")
        .renamed("slides.assume_mpp", "input.assume_mpp")
        .string("detections", "", "Folder with <slide>.detections.csv and <slide>.report.json (tessera infer)")
        .string_list("also_excluded", {},
                     "More folders of infer outputs whose <slide>.qc.png excluded areas also count in the FROC outside "
                     "excluded areas (a twin run: lesions mostly outside excluded areas in both)")
        .string("predictions", "", "Optional patch predictions CSV (tessera predict) for the patch-level AUC")
        .string("output", "evaluation", "Folder for evaluation.json, froc.png and roc.png")
        .integer("froc.mask_level", 5, "Evaluation mask pixel = 2^level level-0 pixels (CAMELYON16: 5)", 0, 16)
        .number("froc.dilation_um", 75.0,
                "CAMELYON16's 75 um: lesion borders grow by half of it (distance < 75 / (2 * mask um/px))", 0.001,
                10000)
        .number("froc.itc_diameter_um", 200.0, "Isolated tumour cells: major axis < this + dilation_um", 0, 100000)
        .boolean("froc.include_itc", false, "Count isolated-tumour-cell lesions like the others (default: ignored)")
        .string_list("classes.tumour", classes.tumour, "Annotation groups/classes that are tumour")
        .string_list("classes.exclusion", classes.exclusion,
                     "Annotation groups/classes that are not tumour (drawn over tumour, e.g. ASAP _2)");
    return schema;
  }();
  return instance;
}

struct EvaluateOptions {
  JobOptions job;
};

// The job's settings from the effective config.
analysis::EvaluateJob job_from_config(const core::Config& config) {
  analysis::EvaluateJob job;
  job.dataset = config.get_string("input.csv");
  job.detections = config.get_string("detections");
  job.predictions = config.get_string("predictions");
  job.also_excluded = config.get_string_list("also_excluded");
  job.output = config.get_string("output");
  job.splits = config.get_string_list("input.splits");
  job.assume_mpp = config.get_number("input.assume_mpp");
  job.froc.mask_level = static_cast<int>(config.get_int("froc.mask_level"));
  job.froc.dilation_um = config.get_number("froc.dilation_um");
  job.froc.itc_diameter_um = config.get_number("froc.itc_diameter_um");
  job.froc.include_itc = config.get_bool("froc.include_itc");
  job.classes.tumour = config.get_string_list("classes.tumour");
  job.classes.exclusion = config.get_string_list("classes.exclusion");
  job.source = config.source();
  return job;
}

int run_evaluate(const EvaluateOptions& options) {
  const auto config = load_job(evaluate_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  // One process does the work; under mpirun the other ranks have nothing to do.
  if (!core::Comm::world().is_root()) return core::exit_ok;

  const analysis::EvaluateJob job = job_from_config(config);
  // Said here with the flags that give them (check_evaluate_job makes the same two checks for other callers).
  if (job.dataset.empty()) {
    throw core::ConfigError("no dataset given (--dataset or the job's 'input.csv' key)", config.source(), 0,
                            "input.csv");
  }
  if (job.detections.empty() && job.predictions.empty()) {
    throw core::ConfigError("nothing to evaluate: give --detections (FROC, slide AUC) and/or --predictions (patch AUC)",
                            config.source(), 0, "detections");
  }
  analysis::check_evaluate_job(job);
  // Checked and held before any scoring: a folder that cannot be written fails now, not after the work.
  const core::OutputLock lock = core::OutputLock::acquire(job.output, "evaluate");
  const analysis::EvaluateResult result = analysis::run_evaluation(job);
  std::cout << analysis::evaluation_summary(job, result) << std::flush;
  return result.failed.empty() ? core::exit_ok : core::exit_input;
}

}  // namespace

Action setup_evaluate(CLI::App& command) {
  auto options = std::make_shared<EvaluateOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-d,--dataset", {"input.csv"},
               "Ground truth, e.g. data/synth/dataset.csv (input.csv)");
  add_key_flag(command, options->job, "--detections", {"detections"},
               "Folder of <slide>.detections.csv and <slide>.report.json from tessera infer (detections)");
  add_key_flag(command, options->job, "-p,--predictions", {"predictions"},
               "Patch predictions CSV from tessera predict, for the patch AUC (predictions)");
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output; default: evaluation)");
  add_key_flag(command, options->job, "--splits", {"input.splits"},
               "Comma-separated splits to evaluate, e.g. test (input.splits; default: all)", FlagForm::list);
  add_key_flag(command, options->job, "--include-itc", {"froc.include_itc"},
               "Count isolated-tumour-cell lesions like the others (froc.include_itc)", FlagForm::on);
  add_key_flag(command, options->job, "--assume-mpp", {"input.assume_mpp"},
               "um/px for slides that record none (input.assume_mpp)");
  command.footer(
      "Lesion-level FROC exactly as CAMELYON16 scores it (evaluation mask at 32x the level-0 um/px, borders grown by "
      "37.5 um, ITC lesions < 275 um ignored, one true positive per lesion; score = mean sensitivity at 1/4, 1/2, "
      "1, 2, 4, 8 false positives per slide), slide-level ROC AUC of the reports' scores, patch-level ROC AUC. "
      "Writes evaluation.json, froc.png and roc.png. Exit code 3 when a slide's inputs are broken (the rest is "
      "still scored).");
  return [options] { return run_evaluate(*options); };
}

}  // namespace tessera::app
