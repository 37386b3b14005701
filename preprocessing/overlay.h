// Drawing on slide thumbnails: annotation outlines and a scale bar, for previews a person checks at a
// glance (synth previews, tile previews, inference overlays).
#pragma once

#include <vector>

#include <opencv2/core.hpp>

#include "io/annotations.h"

namespace tessera::prep {

// Draws the outlines (outer ring and holes) of `annotations`, given in level-0 pixels, on `thumbnail`,
// whose pixels are `scale` level-0 pixels wide (thumbnail = level 0 / scale). RGB colour.
void draw_outlines(cv::Mat& thumbnail, const std::vector<io::Annotation>& annotations, double scale,
                   const cv::Scalar& rgb, int thickness = 2);

// Draws a scale bar in the bottom-left corner: a round length (e.g. 1 mm, 500 µm) about a fifth of the width,
// with its label. `um_per_pixel` is the thumbnail's resolution.
void draw_scale_bar(cv::Mat& thumbnail, double um_per_pixel);

}  // namespace tessera::prep
