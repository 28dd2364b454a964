//===- KernelConfigTest.cpp - the sm_90a kernels' configurations ----------===//
//
// The shapes the kernel families choose, checked without building a kernel:
// tiles, rings, shared memory, split counts and launch geometry.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/KernelConfigs.h"
#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
class KernelConfigTest : public ::testing::Test {
protected:
  KernelConfigTest() { context.loadDialect<MoeDialect, func::FuncDialect>(); }

  /// The first `OpT` of the module parsed from `source`.
  template <typename OpT> OpT parse(StringRef source) {
    module = parseSourceString<ModuleOp>(source, &context);
    EXPECT_TRUE(module);
    OpT found;
    module->walk([&](OpT op) {
      if (!found)
        found = op;
    });
    EXPECT_TRUE(found);
    return found;
  }

  /// `op`'s kernel configuration for calls of at most `maxTokens` tokens,
  /// as moe-configure-matmuls chooses it.
  MatmulConfig configure(GroupedMatmulOp op, int64_t maxTokens) {
    if (!op.getConfigsAttr()) {
      PassManager pm(&context);
      pm.addPass(createConfigureMatmuls());
      EXPECT_TRUE(succeeded(pm.run(*module)));
    }
    FailureOr<MatmulConfig> c =
        configureMatmul(op, TokenLinear{0, 1}, maxTokens);
    EXPECT_TRUE(succeeded(c));
    return succeeded(c) ? *c : MatmulConfig();
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module;
};
} // namespace

TEST_F(KernelConfigTest, GroupedGateUpMatmulFillsTheRing) {
  auto op = parse<GroupedMatmulOp>(R"(
    func.func @f(%x: tensor<?x64xbf16>, %w: tensor<8x256x64xbf16>,
                 %counts: tensor<8xi32>, %offsets: tensor<9xi32>)
        -> tensor<?x128xbf16> attributes {moe.token_buckets = array<i64: 4>} {
      %0 = moe.grouped_matmul %x, %w groups(%counts, %offsets)
          {activation = #moe.activation<kind = clamped_swiglu>}
          : (tensor<?x64xbf16>, tensor<8x256x64xbf16>, tensor<8xi32>,
             tensor<9xi32>) -> tensor<?x128xbf16>
      return %0 : tensor<?x128xbf16>
    })");
  MatmulConfig c = configure(op, /*maxTokens=*/0);
  EXPECT_TRUE(c.grouped);
  EXPECT_TRUE(c.gated);
  EXPECT_EQ(c.experts, 8);
  EXPECT_EQ(c.n, 256);
  EXPECT_EQ(c.outN, 128);
  EXPECT_EQ(c.outTile, 128);
  EXPECT_EQ(c.enc.tileK(), 64);
  EXPECT_EQ(c.enc.halves(), 1);
  EXPECT_EQ(c.kTiles, 1);
  EXPECT_EQ(c.colTiles, 1);
  EXPECT_EQ(c.splits, 1);
  EXPECT_EQ(c.rowTiles, 0);
  // Four stages of 128 + 256 rows of 128 bytes, each consumer
  // warpgroup's 64 x 64 bf16 epilogue buffer, and room to align.
  EXPECT_TRUE(c.sharedEpilogue);
  EXPECT_EQ(c.sharedBytes(), 4 * 384 * 128 + 2 * 64 * 64 * 2 + 1024);
  // A bucket of 4 tokens: at most 4 non-empty row tiles, K too short to
  // split.
  MatmulConfig bucket = configure(op, 4);
  EXPECT_EQ(bucket.rowTiles, 4);
  EXPECT_EQ(bucket.splits, 1);
}

TEST_F(KernelConfigTest, DecodeTileSplitsALongK) {
  auto op = parse<GroupedMatmulOp>(R"(
    func.func @f(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>)
        -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 1>} {
      %0 = moe.grouped_matmul %x, %w
          : (tensor<?x7168xbf16>, tensor<256x7168xbf16>) -> tensor<?x256xbf16>
      return %0 : tensor<?x256xbf16>
    })");
  MatmulConfig c = configure(op, /*maxTokens=*/1);
  EXPECT_FALSE(c.grouped);
  EXPECT_EQ(c.kTiles, 112);
  EXPECT_EQ(c.rowTiles, 1);
  // A row: the decode tile, two column tiles of 128 weight rows, whose K
  // splits eight ways (the most splits) to spread the weights.
  EXPECT_TRUE(c.swapAb);
  EXPECT_EQ(c.tileM, 8);
  EXPECT_EQ(c.tileN, 128);
  EXPECT_EQ(c.warpGroups, 1);
  EXPECT_EQ(c.colTiles, 2);
  EXPECT_EQ(c.splits, 8);
  EXPECT_EQ(c.tilesPerSplit, 14);
  // Without a bucket the whole K stays in one block.
  EXPECT_EQ(configure(op, 0).splits, 1);
}

TEST_F(KernelConfigTest, CausalGqaAttentionPacksHeadsAndPairsTiles) {
  parse<AttentionOp>(R"(
    func.func @f(%q: tensor<2x100x8x64xbf16>, %k: tensor<2x300x2x64xbf16>,
                 %v: tensor<2x300x2x64xbf16>) -> tensor<2x100x8x64xbf16> {
      %o = moe.attention %q, %k, %v {causal}
          : (tensor<2x100x8x64xbf16>, tensor<2x300x2x64xbf16>,
             tensor<2x300x2x64xbf16>) -> tensor<2x100x8x64xbf16>
      return %o : tensor<2x100x8x64xbf16>
    })");
  PassManager pm(&context);
  pm.addPass(createSplitAttention());
  ASSERT_TRUE(succeeded(pm.run(*module)));
  TiledAttentionOp op;
  module->walk([&](TiledAttentionOp found) { op = found; });
  ASSERT_TRUE(op);
  AttentionConfig c = configureAttention(op);
  EXPECT_TRUE(c.causal);
  EXPECT_TRUE(c.pingPong);
  EXPECT_EQ(c.tileN, 128);
  EXPECT_EQ(c.splits, 1);
  // Four query heads per key/value head share a row tile.
  EXPECT_EQ(c.group, 4);
  EXPECT_EQ(c.pack, 4);
  EXPECT_EQ(c.rowTiles, 4);
  EXPECT_EQ(c.keyTiles, 3);
  EXPECT_EQ(c.qBuffers, 2);
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.sharedBytes(), 2 * 16384 + 4 * 2 * 16384 + 1024);
  // Heads x batch, in causal pairs of row tiles.
  EXPECT_EQ(c.headTiles, 4);
  EXPECT_EQ(c.unitsPerHead, 2);
  EXPECT_TRUE(c.tmaStore);
  EXPECT_EQ(c.rowsTotal, 1600);
}

TEST_F(KernelConfigTest, DispatchPadsEachExpertsRows) {
  auto op = parse<DispatchOp>(R"(
    func.func @f(%hidden: tensor<?x200xbf16>, %ids: tensor<?x3xi32>)
        -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>,
            tensor<?x3xi32>) {
      %d, %c, %o, %r = moe.dispatch %hidden, %ids
          : (tensor<?x200xbf16>, tensor<?x3xi32>)
          -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>,
              tensor<?x3xi32>)
      return %d, %c, %o, %r
          : tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>
    })");
  DispatchConfig c = configureDispatch(op, TokenLinear{0, 1});
  EXPECT_EQ(c.experts, 10);
  EXPECT_EQ(c.topK, 3);
  EXPECT_EQ(c.width, 8);
  EXPECT_EQ(c.quantBlock, 0);
  EXPECT_EQ(c.dispatchedRows.perToken, 3);
  EXPECT_EQ(c.dispatchedRows.fixed, 10 * (c.align - 1));
}
