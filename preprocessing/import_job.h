// The import job (`tessera import`): labelled patches (PNG, JPEG, TIFF files) → the same HDF5 shards `tessera tile`
// writes, so that patch datasets (the IDC set, PatchCamelyon exported to files, folders exported by QuPath) train and
// are evaluated like tiled slides.
//
// 1. Inputs, resolved identically on every rank: input.csv (`path,label[,group][,split]`; `patient` is read as
//    `group`) or input.folder (`<class>/...`, `<class>/<group>/...` or `<group>/<class>/...` by input.layout).
//    Labels map to normal/tumour through import.normal_labels and import.tumour_labels; any other label is an
//    error naming the file and line (or the folder).
// 2. Groups: the group (patient) id is the shard's slide id, so splits, `predict` and the manifest count per patient.
//    Splits are the CSV's own (every row has one, a group never in two) or assigned by group with splits.seed in
//    the proportions of splits.fractions — never by patch. Without any group every patch is its own group (a
//    warning says so: correlated patches then straddle splits).
// 3. Extract: patches in group order are cut into shards (assign_shards, as tile), each rank its part, each shard
//    decoded by import.threads threads, fitted to tile.size (import.fit: pad keeps µm/px, centred on white and a
//    larger patch centre-cropped; resize scales every patch to the tile, so the shard's µm/px is import.mpp ×
//    the patches' side ÷ tile.size), stain-normalized when stain.method asks (stain.fit: group fits the source's
//    colours once on all of a group's patches, so a patient's stain moves to the target and the differences between
//    its patches stay; patch fits each patch alone, as tile does; the shards record the target's text, with
//    kPerGroupSuffix for group) and written as `shard-NNNNN.h5.unchecked`, then its record
//    (preprocessing/tile_resume.h). A patch that cannot be decoded whole (io::read_rgb_image: a truncated PNG or
//    JPEG is an error, never grey pixels) is left out and listed; the job ends with exit code 3 and the list.
//    A patch has no place on a slide: its tile's x coordinate is its number in the job, and `patches.csv` (number,
//    path, group, label, split, status) leads from a tile or a prediction back to the file.
// 4. Rank 0 puts the shards in place and writes manifest.json last. Resume as tile: the job's hash (config, the
//    stain reference's bytes and every patch file's size and time) is kept in `.tessera-import-state.json`; a rerun
//    of the same job keeps the shards whose record and pixels agree (the record also names the groups whose stain was
//    kept, for patches.csv) and decodes only the rest; a finished job is reported up to date.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/config.h"

namespace tessera::prep {

// The job's settings: every key, its default, its range and its help text (tessera import --help-config).
const core::Schema& import_schema();

// One patch of the job.
struct PatchInput {
  std::string path;
  std::uint8_t label = 0;  // 0 normal, 1 tumour
  std::string group;       // the shard's slide id
  std::string split;       // "" until assigned
  std::string where;       // for messages: "file 'labels.csv': line 12" or the file itself
};

// The job's patches in job order (group by group, each group's patches by path), splits assigned. core::ConfigError
// or core::InputError naming the file, line or key for every mistake (no patches, an unknown label, a group in two
// splits, a split column with empty rows).
std::vector<PatchInput> resolve_import_inputs(const core::Config& config);

struct ImportJobResult {
  bool up_to_date = false;      // the output was already this job's; nothing was done
  bool patches_failed = false;  // some patches could not be read and were left out (listed in the manifest)
  std::int64_t patches = 0;     // patches in the shards
};

// Runs the job of `config` (validated against import_schema()) on every rank of `world`. Locks the output folder.
ImportJobResult run_import_job(const core::Config& config, bool force, const core::Comm& world);

}  // namespace tessera::prep
