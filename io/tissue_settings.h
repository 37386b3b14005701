// How tiles were kept by their tissue (tessera tile's tissue.* keys): recorded from the shards' manifest into the
// checkpoint's /meta at training, so that inference finds tissue as the training tiles were found.
#pragma once

namespace tessera::io {

struct TissueSettings {
  double min_fraction = 0.5;     // tissue.min_fraction: least tissue fraction of a kept tile
  double mask_mpp = 8.0;         // tissue.mask_mpp: resolution of the tissue mask in µm/px
  bool reject_pen_marks = true;  // tissue.reject_pen_marks

  bool operator==(const TissueSettings&) const = default;
};

}  // namespace tessera::io
