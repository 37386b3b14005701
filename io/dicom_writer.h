// A small writer of DICOM whole-slide image series (VL Whole Slide Microscopy Image Storage), for `tessera synth
// --format dicom`, the DICOM-vs-TIFF benchmark and the DICOM reader's test fixtures.
//
// It converts a tiled pyramidal TIFF as io::TiffWriter makes it into a series in a folder: one instance per
// pyramid level (`level-<i>.dcm`, the same tile size and levels) and one per associated image (`label.dcm`,
// `macro.dcm`, `thumbnail.dcm` as LABEL / OVERVIEW / THUMBNAIL). With JPEG Baseline the TIFF's JPEG tiles are
// copied as they are (the TIFF's shared JPEG tables merged into each frame), so both files hold the same JPEG
// streams; uncompressed syntaxes (explicit or implicit VR little endian) store the decoded tiles as RGB or
// YBR_FULL_422. Associated images are always uncompressed RGB, one frame.
//
// UIDs are UUID-derived (`2.25.<128-bit decimal>`) from `uid_seed`: the same seed gives the same UIDs, so synth
// stays byte-reproducible. The series is written into a temporary folder beside `folder`, every file synced, and
// renamed into place (an existing `folder` is replaced): a reader never sees half a series.
//
// Memory: a level's frames are held until its file is written (JPEG: the compressed tiles; uncompressed: the
// whole level's pixels — meant for small fixtures).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>

namespace tessera::io {

enum class DicomTransferSyntax { jpeg_baseline, explicit_little, implicit_little };

struct DicomWriterOptions {
  DicomTransferSyntax syntax = DicomTransferSyntax::jpeg_baseline;
  // TILED_SPARSE: every frame's position in a Plane Position (Slide) item, frames stored in reverse order (so that
  // only the positions say where a frame goes); otherwise TILED_FULL.
  bool sparse = false;
  // (level, tile index = row × tiles across + column) left out of a TILED_SPARSE level.
  std::set<std::pair<int, std::int64_t>> omit_tiles;
  // Uncompressed syntaxes: store YBR_FULL_422 (two pixels in Y1 Y2 Cb Cr) instead of RGB.
  bool ybr_full_422 = false;
  // JPEG: the Photometric Interpretation written over the (YCbCr-coded) frames. "YBR_FULL_422" is what the standard
  // asks; "RGB" is what some converters write over YCbCr frames.
  std::string jpeg_photometric = "YBR_FULL_422";
  // JPEG: each frame split into this many fragments (the reader must then walk the fragments).
  int fragments_per_frame = 1;
  // JPEG: fill the Basic Offset Table (otherwise it is left empty, as most converters do).
  bool offset_table = false;
  // JPEG: an Extended Offset Table (64-bit offsets, with the frames' lengths) instead of the Basic Offset Table, which
  // is left empty as the standard asks; one fragment per frame.
  bool extended_offset_table = false;
  // Optical paths "1", "2"... (uncompressed syntaxes only): path 1 holds the slide's pixels, every other path their
  // inverse (255 - v), so a reader that takes the wrong path's frames is far off. TILED_FULL stores all frames of
  // path 1, then of path 2... (the standard's order); TILED_SPARSE gives each frame its path, path 1 last of each tile.
  int optical_paths = 1;
  // Focal planes (uncompressed syntaxes only): plane 1 at Z 0 holds the slide's pixels, every other plane (Z 0.001 mm
  // apart) their inverse. TILED_FULL: planes after column and row, before optical paths (the standard's order);
  // TILED_SPARSE: each frame's Z Offset, plane 1 first of each tile and path.
  int focal_planes = 1;
  // An ICC profile (bytes) for the first optical path; none when empty.
  std::string icc_profile;
  // false: no Pixel Spacing, only Imaged Volume Width/Height (the reader's fallback).
  bool pixel_spacing = true;
  std::string uid_seed = "tessera";
};

// Writes the slide `tiff_path` as a DICOM series in `folder`. Throws core::InputError for a source it cannot
// convert (not a tiled TIFF pyramid of 8-bit RGB, or JPEG Baseline asked of a slide whose tiles are not JPEG) and
// core::InternalError when writing fails; nothing is left half-written.
void write_dicom_series(const std::string& tiff_path, const std::string& folder, const DicomWriterOptions& options);

// A UUID-derived DICOM UID ("2.25." and 39 digits at most) from `seed` and `label`; the same arguments give the same
// UID.
std::string derived_uid(const std::string& seed, const std::string& label);

}  // namespace tessera::io
