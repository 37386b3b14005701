// A training set made in a second, for the tests of `tessera train` that need one: 64 patches of 24 px from 8
// patients (tumour patches darker), imported into shards.
#pragma once

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera::testing {

// Writes the patches and labels.csv into `dir` and imports them into dir/shards (patients 0-5 train, 6-7 val), at
// 2 µm/px; returns the shard folder.
inline std::string patch_shards(const TempDir& dir) {
  std::ofstream csv(dir.file("labels.csv"));
  csv << "path,label,group,split\n";
  for (int i = 0; i < 64; ++i) {
    const int label = i % 2;
    cv::Mat bgr(24, 24, CV_8UC3, cv::Scalar(label ? 120 : 200, label ? 60 : 150, label ? 140 : 210));
    for (int y = 0; y < 24; y += 3) bgr.row(y).setTo(cv::Scalar((i * 13) % 255, 90, 160));
    const std::string name = "p" + std::to_string(i) + ".png";
    cv::imwrite(dir.file(name), bgr);
    csv << name << "," << label << ",patient" << i % 8 << "," << (i % 8 < 6 ? "train" : "val") << "\n";
  }
  csv.close();
  const auto r = run("import --csv " + dir.file("labels.csv") + " --mpp 2 --out " + dir.file("shards"));
  EXPECT_EQ(r.code, 0) << r.err;
  return dir.file("shards");
}

}  // namespace tessera::testing
