// The gather of tile predictions (engine/inference.h): every rank packs its rows, rank 0 appends them in rank order.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "engine/inference.h"

namespace tessera::engine {
namespace {

TilePredictions rows(std::uint32_t slide, int count, float p0) {
  TilePredictions r;
  for (int i = 0; i < count; ++i) {
    r.slide.push_back(slide);
    r.xy.push_back(100 * i);
    r.xy.push_back(-7 * i);
    r.label.push_back(static_cast<std::uint8_t>(i % 2));
    r.p_tumor.push_back(p0 + 0.125f * static_cast<float>(i));
  }
  return r;
}

TEST(TilePredictions, PackedPartsAppendInOrderIntoTheSameRows) {
  const TilePredictions first = rows(0, 3, 0.0f);
  const TilePredictions empty;
  const TilePredictions second = rows(5, 2, 0.5f);
  TilePredictions all;
  for (const auto* part : {&first, &empty, &second}) all.append_packed(part->pack());
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.slide, (std::vector<std::uint32_t>{0, 0, 0, 5, 5}));
  EXPECT_EQ(all.xy, (std::vector<std::int64_t>{0, 0, 100, -7, 200, -14, 0, 0, 100, -7}));
  EXPECT_EQ(all.label, (std::vector<std::uint8_t>{0, 1, 0, 0, 1}));
  EXPECT_EQ(all.p_tumor, (std::vector<float>{0.0f, 0.125f, 0.25f, 0.5f, 0.625f}));
  EXPECT_EQ(empty.pack().size(), sizeof(std::uint64_t));
}

}  // namespace
}  // namespace tessera::engine
