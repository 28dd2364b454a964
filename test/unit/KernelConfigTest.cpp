//===- KernelConfigTest.cpp - the sm_90a kernels' configurations ----------===//
//
// The shapes the kernel families choose, checked without building a kernel:
// tiles, rings, shared memory, split counts and launch geometry.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/KernelConfigs.h"
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

TEST_F(KernelConfigTest, Bf16RouterTakesChunksOnTensorCores) {
  // DeepSeek-V3's router: 7168 columns are 28 chunks of 256; a bucket of
  // at most 512 tokens spreads the chunks over warps, a larger one (or any
  // count) shares each step's rows a block.
  auto op = parse<RouteOp>(R"(
    func.func @f(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>,
                 %b: tensor<256xf32>) -> (tensor<?x8xi32>, tensor<?x8xf32>) {
      %ids, %weights = moe.route %x, %w bias %b
          {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true,
                                n_group = 8, topk_group = 4, scaling = 2.5>}
          : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>)
          -> (tensor<?x8xi32>, tensor<?x8xf32>)
      return %ids, %weights : tensor<?x8xi32>, tensor<?x8xf32>
    })");
  RouteConfig decode = configureRoute(op, TokenLinear{0, 1}, 128);
  EXPECT_TRUE(decode.tensorCores);
  EXPECT_EQ(decode.chunks, 28);
  EXPECT_TRUE(decode.split);
  EXPECT_FALSE(configureRoute(op, TokenLinear{0, 1}, 1024).split);
  EXPECT_FALSE(configureRoute(op, TokenLinear{0, 1}, 0).split);
  // Without buckets an expert-parallel layer shares the rows a block too.
  EXPECT_FALSE(configureRoute(op, TokenLinear{0, 1}, 0, true).split);
  // One warp's selection scratch a token: the experts' scores, choices and
  // flags, the groups' and the chosen weights fit 8 warps a block.
  EXPECT_EQ(decode.selectWarps, 8);
}

TEST_F(KernelConfigTest, RouterOfOddWidthStaysOnCudaCores) {
  // 100 columns are not whole 16-byte copies: the logits on CUDA cores.
  auto op = parse<RouteOp>(R"(
    func.func @f(%x: tensor<?x100xbf16>, %w: tensor<8x100xbf16>)
        -> (tensor<?x2xi32>, tensor<?x2xf32>) {
      %ids, %weights = moe.route %x, %w
          {router = #moe.router<kind = softmax_topk>}
          : (tensor<?x100xbf16>, tensor<8x100xbf16>)
          -> (tensor<?x2xi32>, tensor<?x2xf32>)
      return %ids, %weights : tensor<?x2xi32>, tensor<?x2xf32>
    })");
  RouteConfig c = configureRoute(op, TokenLinear{0, 1}, 64);
  EXPECT_FALSE(c.tensorCores);
  EXPECT_TRUE(c.split);
  EXPECT_FALSE(configureRoute(op, TokenLinear{0, 1}, 128).split);
}

namespace {
/// Grouped matmuls of each encoding and epilogue the kernels have, at every
/// plan a layer takes (any count, then decode and prefill buckets).
const char *const kLayoutShapes[] = {
    // bf16 gate/up: a gated tile, a shared epilogue.
    R"(func.func @f(%x: tensor<?x2048xbf16>, %w: tensor<8x1536x2048xbf16>,
                    %c: tensor<8xi32>, %o: tensor<9xi32>) -> tensor<?x768xbf16>
         attributes {moe.token_buckets = array<i64: 1, 8, 64, 512>} {
       %0 = moe.grouped_matmul %x, %w groups(%c, %o)
           {activation = #moe.activation<kind = swiglu>}
           : (tensor<?x2048xbf16>, tensor<8x1536x2048xbf16>, tensor<8xi32>,
              tensor<9xi32>) -> tensor<?x768xbf16>
       return %0 : tensor<?x768xbf16>
     })",
    // Dense bf16 with rows of 100 columns: the register epilogue.
    R"(func.func @f(%x: tensor<?x512xbf16>, %w: tensor<100x512xbf16>)
         -> tensor<?x100xbf16>
         attributes {moe.token_buckets = array<i64: 1, 8, 64, 512>} {
       %0 = moe.grouped_matmul %x, %w
           : (tensor<?x512xbf16>, tensor<100x512xbf16>) -> tensor<?x100xbf16>
       return %0 : tensor<?x100xbf16>
     })",
    // FP8 block-128: staged row scales and square weight-block scales.
    R"(func.func @f(%x: tensor<?x256xf8E4M3FN>, %w: tensor<4x320x256xf8E4M3FN>,
                    %c: tensor<4xi32>, %o: tensor<5xi32>, %sx: tensor<?x2xf32>,
                    %sw: tensor<4x3x2xf32>) -> tensor<?x160xbf16>
         attributes {moe.token_buckets = array<i64: 1, 8, 64, 512>} {
       %0 = moe.grouped_matmul %x, %w groups(%c, %o) scales(%sx, %sw)
           {activation = #moe.activation<kind = swiglu>}
           : (tensor<?x256xf8E4M3FN>, tensor<4x320x256xf8E4M3FN>,
              tensor<4xi32>, tensor<5xi32>, tensor<?x2xf32>,
              tensor<4x3x2xf32>) -> tensor<?x160xbf16>
       return %0 : tensor<?x160xbf16>
     })",
    // MXFP8: E8M0 row codes and per-column weight scales staged per stage.
    R"(func.func @f(%a: tensor<?x128xf8E4M3FN>, %b: tensor<96x128xf8E4M3FN>,
                    %sa: tensor<?x4xf8E8M0FNU>, %sb: tensor<96x4xf8E8M0FNU>)
         -> tensor<?x96xbf16>
         attributes {moe.token_buckets = array<i64: 1, 8, 64, 512>} {
       %0 = moe.grouped_matmul %a, %b scales(%sa, %sb)
           : (tensor<?x128xf8E4M3FN>, tensor<96x128xf8E4M3FN>,
              tensor<?x4xf8E8M0FNU>, tensor<96x4xf8E8M0FNU>)
           -> tensor<?x96xbf16>
       return %0 : tensor<?x96xbf16>
     })",
    // FP8 with a quantizing epilogue.
    R"(func.func @f(%x: tensor<?x256xf8E4M3FN>, %sx: tensor<?x2xf32>,
                    %b: tensor<4x512x256xf8E4M3FN>, %sb: tensor<4x4x2xf32>,
                    %c: tensor<4xi32>, %o: tensor<5xi32>)
         -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
         attributes {moe.token_buckets = array<i64: 1, 8, 64, 512>} {
       %0, %s = moe.grouped_matmul %x, %b groups(%c, %o) scales(%sx, %sb)
           {activation = #moe.activation<kind = swiglu>,
            out_quant = #moe.quant<kind = fp8_block128>}
           : (tensor<?x256xf8E4M3FN>, tensor<4x512x256xf8E4M3FN>,
              tensor<4xi32>, tensor<5xi32>, tensor<?x2xf32>,
              tensor<4x4x2xf32>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
       return %0, %s : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
     })",
};

/// No pins (the cost model's choices) and the pins the lit tests give
/// moe-configure-matmuls.
const char *const kLayoutPins[] = {
    "",
    "epilogue=shared",
    "epilogue=registers",
    "stages=3",
    "cluster=2x1,multicast=rhs",
    "split-k=2",
    "persistent=true,raster=n,group=4",
    "swap-ab=true",
    "swap-ab=true,tile=16x128",
    "swap-ab=false",
};
} // namespace

// The cost model sizes each ring by the shared memory the kernel lays out
// (sm90a::MatmulLayout): for every configuration it chooses, the kernel's
// buffers and mbarriers fit the block (the builder accepts it), and unless
// the stages are pinned, one stage more would not.
TEST_F(KernelConfigTest, RingStagesFillTheSharedMemoryTheKernelAsksFor) {
  int64_t checked = 0, decodeTiles = 0;
  // The builder refuses some pinned configurations, saying why.
  std::string refused;
  context.getDiagEngine().registerHandler(
      [&](Diagnostic &d) { refused = d.str(); });
  for (const char *shape : kLayoutShapes) {
    for (const char *pins : kLayoutPins) {
      SCOPED_TRACE(std::string("pins '") + pins + "' on " + shape);
      auto op = parse<GroupedMatmulOp>(shape);
      PassManager pm(&context);
      pm.addPass(createConfigureMatmuls(ConfigureMatmulsOptions{pins}));
      // Some pins do not apply to every shape (no bucket bound for a
      // decode tile of any count): those are the builder's errors, below.
      if (failed(pm.run(*module)))
        continue;
      bool stagesPinned = StringRef(pins).contains("stages");
      for (Attribute attr : op.getConfigsAttr()) {
        auto config = cast<MatmulConfigAttr>(attr);
        refused.clear();
        FailureOr<MatmulConfig> c =
            configureMatmul(op, TokenLinear{0, 1}, config.getTokens());
        if (failed(c)) {
          // Only a pin the kernel cannot honour, never the cost model's
          // own choice, and never for want of shared memory.
          EXPECT_NE(*pins, '\0') << refused;
          EXPECT_EQ(refused.find("shared memory"), std::string::npos)
              << refused;
          continue;
        }
        ++checked;
        sm90a::MatmulLayout more = *c;
        more.stages += 1;
        if (c->swapAb) {
          ++decodeTiles;
          // Two blocks a multiprocessor, up to the K stages there are.
          EXPECT_LE(c->totalBytes(), sm90a::kSharedTwoBlocks);
          if (!stagesPinned && c->stages < std::max<int64_t>(c->kTiles, 2)) {
            EXPECT_GT(more.totalBytes(), sm90a::kSharedTwoBlocks)
                << "stages " << c->stages << " at " << config.getTokens();
          }
          continue;
        }
        EXPECT_LE(c->totalBytes(), sm90a::kSharedPerBlock);
        if (!stagesPinned) {
          EXPECT_GT(more.totalBytes(), sm90a::kSharedPerBlock)
              << "stages " << c->stages << " at " << config.getTokens();
        }
      }
    }
  }
  // Every shape at every plan, less the pins that do not apply.
  EXPECT_GT(checked, 150);
  EXPECT_GT(decodeTiles, 40);
}
