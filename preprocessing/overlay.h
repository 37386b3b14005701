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

// Quality control's colours (RGB), as infer's overlay and the viewer's QC layer use them: excluded areas grey,
// flagged ones amber.
inline const cv::Scalar kQcExcludedRgb(110, 110, 110);
inline const cv::Scalar kQcFlaggedRgb(255, 170, 0);

// Outlines the areas of `mask` (255 = in; pixel (c, r) covers level-0 [c·downsample, (c+1)·downsample) × ...) on
// `thumbnail`, whose pixels are `scale` level-0 pixels wide. Drawn without anti-aliasing: the outline has exactly
// colour `rgb`.
void draw_mask_outline(cv::Mat& thumbnail, const cv::Mat1b& mask, double downsample, double scale,
                       const cv::Scalar& rgb, int thickness = 2);

// Draws a scale bar in the bottom-left corner: a round length (e.g. 1 mm, 500 µm) about a fifth of the width,
// with its label. `um_per_pixel` is the thumbnail's resolution.
void draw_scale_bar(cv::Mat& thumbnail, double um_per_pixel);

}  // namespace tessera::prep
