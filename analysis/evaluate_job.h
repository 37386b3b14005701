// The evaluation job behind `tessera evaluate`: CAMELYON16-style scores of a model's outputs against the ground
// truth, and the files a person reads.
//
// Inputs
//   dataset      dataset.csv (tessera synth's, or any CSV with columns slide_id, slide, label, annotation_xml /
//                annotation_geojson / annotation, split, optional mpp; io/dataset.h); paths relative to the CSV's
//                folder
//   detections   folder of `tessera infer` outputs: <slide>.detections.csv (CAMELYON16 prob,X,Y, level-0) and
//                <slide>.report.json (its "slide_score"), also found as <slide>/<slide>.* or <slide>.csv
//   predictions  optional `tessera predict` CSV (slide_id,x,y,label,p_tumor) for the patch-level AUC
// Scores (analysis/evaluation.h states every rule): lesion-level FROC on the slides' annotations, slide-level ROC
// AUC of the reports' scores, patch-level ROC AUC of the predictions. When the detections folder holds quality
// control's masks (<slide>.qc.png, which infer writes when QC ran; io/qc_masks.h) for a tumour slide, also the FROC
// over the lesions mostly (more than half their area) outside excluded areas (FrocOutsideExcluded); the usual FROC
// stays CAMELYON16's.
// Outputs (each written to a temporary name and renamed): <output>/evaluation.json; froc.png when a slide was
// evaluated; roc.png when the slide or the patch scores have both classes.
//
// A slide without a detections file counts as a slide without detections and one without a report as score 0;
// both are listed. A slide whose inputs are broken (annotation, detections, report, unreadable slide) gets one
// error naming the file and is left out of every score; the others go on. Broken predictions leave out the patch
// AUC alike. Both are listed in EvaluateResult::failed (tessera evaluate then exits with code 3).
//
//   analysis::EvaluateJob job;
//   job.dataset = "data/synth/dataset.csv";
//   job.detections = "runs/infer";
//   analysis::check_evaluate_job(job);                     // before the output folder is locked
//   const auto result = analysis::run_evaluation(job);     // scores, writes evaluation.json, froc.png, roc.png
//   std::cout << analysis::evaluation_summary(job, result);
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "analysis/evaluation.h"
#include "io/annotations.h"
#include "io/dataset.h"

namespace tessera::analysis {

// The settings of one evaluation (tessera evaluate's job keys, named beside each field).
struct EvaluateJob {
  std::string dataset;                // dataset: the ground truth, dataset.csv
  std::string detections;             // detections: folder of infer outputs; "" = no FROC and no slide AUC
  std::string predictions;            // predictions: predict's CSV; "" = no patch AUC
  std::string output = "evaluation";  // output: folder for evaluation.json, froc.png and roc.png
  // also_excluded: more folders of infer outputs whose <slide>.qc.png excluded areas count too, united with the
  // detections folder's (a twin run of the same slides: the FROC over lesions mostly outside excluded areas in both)
  std::vector<std::string> also_excluded;
  std::vector<std::string> splits;  // splits: evaluate the slides of these splits; empty = every slide
  double assume_mpp = 0.0;          // slides.assume_mpp: µm/px for slides that record none (0 = they fail)
  FrocOptions froc;                 // froc.mask_level, froc.dilation_um, froc.itc_diameter_um, froc.include_itc
  io::AnnotationClasses classes;    // classes.tumour, classes.exclusion
  std::string source;               // where the settings came from (the job file), named by ConfigErrors
};

// One slide scored against its ground truth.
struct SlideEvaluation {
  io::DatasetRow slide;
  bool tumour = false;
  SlideFroc froc;
  std::string detections_file;  // "" = none found (counted as no detections)
  std::string report_file;      // "" = none found (slide score 0)
  std::optional<double> score;  // the report's "slide_score"
  double mpp = 0.0;             // tumour slides: the level-0 µm/px the mask was made at
  std::vector<Lesion> lesions;  // tumour slides: the mask's lesions (boxes in mask pixels)
  double downsample = 0.0;      // tumour slides: level-0 pixels per mask pixel
  // Tumour slides with quality control's masks (<slide>.qc.png in the detections folder, io/qc_masks.h): the file,
  // those found in the job's also_excluded folders, and per lesion (by label - 1) the share of its mask area in the
  // union of their excluded artefacts (bit 14). Empty without any such file.
  std::string qc_file;
  std::vector<std::string> also_excluded_files;
  std::vector<double> lesion_excluded;
  bool has_qc_masks() const { return !qc_file.empty() || !also_excluded_files.empty(); }
};

// Lesions with more than this share of their area in excluded artefacts are left out of the FROC "outside excluded
// areas" (a lesion counts when its area is mostly, more than half, outside them).
inline constexpr double kMostlyExcluded = 0.5;

// The FROC over lesions mostly outside quality control's excluded areas: the evaluated slides' matches with the
// lesions whose excluded share is at least kMostlyExcluded left out (their hits are neither true nor false
// positives); false positives and normal slides as in the usual FROC. Slides without QC masks keep every lesion.
struct FrocOutsideExcluded {
  FrocResult froc;
  int slides_with_masks = 0;  // tumour slides whose <slide>.qc.png was found (in detections or also_excluded)
  int excluded_lesions = 0;   // countable lesions left out (mostly under excluded areas)
  std::vector<std::string> tumour_slides_without_masks;
};

// The patch predictions of the evaluated slides and their ROC.
struct PatchEvaluation {
  std::vector<float> p;
  std::vector<std::uint8_t> label;
  std::int64_t other_slides = 0;  // rows of slides that are not evaluated
  double auc = std::numeric_limits<double>::quiet_NaN();
  std::vector<RocPoint> roc;  // empty when a class is absent
};

// What could not be scored: a slide (by id) or "predictions", and the error naming the file.
struct EvaluateFailure {
  std::string what;
  std::string error;
};

struct EvaluateResult {
  std::size_t slides = 0;                  // slides selected (those of the splits)
  std::vector<SlideEvaluation> evaluated;  // in dataset order; none without detections
  std::vector<std::string> missing_detections;
  std::vector<std::string> missing_reports;
  std::optional<FrocResult> froc;  // when a slide was evaluated
  // When a tumour slide had QC masks: the FROC counting only lesions mostly outside excluded areas.
  std::optional<FrocOutsideExcluded> froc_outside_excluded;
  double slide_auc = std::numeric_limits<double>::quiet_NaN();
  std::vector<RocPoint> slide_roc;       // empty when no report was found or a class is absent
  std::size_t scored_slides = 0;         // slides in the slide AUC (0 when no report was found)
  std::optional<PatchEvaluation> patch;  // when predictions were given and could be read
  std::vector<EvaluateFailure> failed;
  std::vector<std::string> written;  // the files written, in order
};

// The checks made before any work (tessera evaluate makes them before it locks the output folder): ConfigError
// naming the key when no dataset is given or neither detections nor predictions; InputError when the detections
// folder does not exist.
void check_evaluate_job(const EvaluateJob& job);

// Runs the job: check_evaluate_job, the dataset (InputError for a broken one; ConfigError naming "splits" when no
// slide is in the splits), every selected slide, the scores, then the outputs in job.output (created if needed).
// Slides and predictions that fail are in `failed` (errors of kind internal are thrown). Does not lock the folder.
EvaluateResult run_evaluation(const EvaluateJob& job);

// The lines a person reads: slides evaluated, FROC score and operating points, slide and patch AUC, the files
// written, missing files and failures.
std::string evaluation_summary(const EvaluateJob& job, const EvaluateResult& result);

// froc.png: the FROC curve on a log2 FP/slide axis with the six operating points of the score (a note when there
// is no lesion).
cv::Mat froc_chart(const FrocResult& froc);

// roc.png: the slide and patch ROC curves (either may be empty) with their AUCs and counts, over the chance line.
cv::Mat roc_chart(const std::vector<RocPoint>& slides, double slide_auc, std::size_t n_slides,
                  const std::vector<RocPoint>& patches, double patch_auc, std::size_t n_patches);

}  // namespace tessera::analysis
