//===- EpLayoutTest.cpp - an expert-parallel GPU rank's state -------------===//
//
// The state's regions (runtime/EpLayout.h), which the generated kernels, the
// proxy routine and the runtime address by offset: in order, apart, aligned
// and within the bytes the runtime allocates, for shapes from one rank of a
// tiny layer to DeepSeek-V3 at 64 ranks.
//
//===----------------------------------------------------------------------===//

#include "runtime/EpLayout.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

using moe::rt::EpDeviceLayout;
using moe::rt::EpLayout;

namespace {
TEST(EpLayout, DeviceStateRegionsLieApartInOrder) {
  struct Shape {
    int64_t hidden, topK, experts, ranks, maxTokens;
  };
  for (Shape s : {Shape{8, 2, 4, 2, 64}, Shape{200, 3, 10, 2, 77},
                  Shape{7168, 8, 256, 2, 4096}, Shape{7168, 8, 256, 64, 512},
                  Shape{2048, 8, 128, 4, 4096}}) {
    EpDeviceLayout l{
        EpLayout{s.hidden, s.topK, s.experts, s.ranks, s.maxTokens}};
    size_t rows = size_t(s.ranks) * size_t(s.maxTokens) * size_t(s.topK);
    EXPECT_EQ(l.receiveRows(), rows);
    // Each region: where it starts and the bytes it holds.
    std::vector<std::pair<size_t, size_t>> regions = {
        {EpDeviceLayout::kRecv, l.recvLayout.recvBytes()},
        {l.combineFlags(), 16 * size_t(s.ranks)},
        {l.recordIndex(), 4 * size_t(s.maxTokens) * size_t(s.ranks)},
        {l.choicePosition(), 4 * size_t(s.maxTokens) * size_t(s.topK)},
        {l.expertChoices(), 4 * size_t(s.experts)},
        {l.rowStamps(), 4 * rows},
        {l.rowChecks(), 8 * size_t(s.ranks)}};
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i].first % 256, 0u) << "region " << i;
      size_t end = regions[i].first + regions[i].second;
      size_t next = i + 1 < regions.size() ? regions[i + 1].first : l.bytes();
      EXPECT_LE(end, next) << "region " << i << " overlaps the next";
    }
    // The control words end before the receive area, the test hooks among
    // them; the peers' addresses fit before it too.
    EXPECT_LT(EpDeviceLayout::kTestReturnBase + 4, EpDeviceLayout::kSentCounts);
    EXPECT_LE(EpDeviceLayout::kPeers + 8 * size_t(EpDeviceLayout::kMaxRanks),
              size_t(EpDeviceLayout::kRecv));
  }
}
} // namespace
