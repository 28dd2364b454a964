//===- DialectTest.cpp - C++ API of the moe dialect -----------------------===//

#include "dialects/moe/MoeOps.h"
#include "passes/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::moe;

namespace {
class MoeDialectTest : public ::testing::Test {
protected:
  MoeDialectTest() { context.loadDialect<MoeDialect>(); }

  QuantAttr quant(QuantKind kind) {
    return QuantAttr::get(&context, kind, ScaleRounding::Floor);
  }

  /// Verifies a config built from C++ and returns the diagnostic, if any.
  std::string configError(int64_t experts, int64_t topK, RouterAttr router,
                          int64_t epSize = 1) {
    std::string message;
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      message = diag.str();
      return success();
    });
    auto activation = ActivationAttr::get(&context, ActivationKind::SwiGLU,
                                          APFloat(1.702), APFloat(7.0));
    auto config = ConfigAttr::getChecked(
        UnknownLoc::get(&context), &context, experts, topK, int64_t{64},
        int64_t{32}, router, activation, int64_t{0}, false, QuantAttr(),
        epSize);
    EXPECT_EQ(static_cast<bool>(config), message.empty());
    return message;
  }

  RouterAttr router(RouterKind kind, int64_t nGroup = 1,
                    int64_t topkGroup = 1) {
    return RouterAttr::get(&context, kind, false, nGroup, topkGroup,
                           APFloat(1.0));
  }

  MLIRContext context;
};
} // namespace

TEST_F(MoeDialectTest, MXFP8ScalesOnePerBlockOf32AlongK) {
  QuantAttr mx = quant(QuantKind::MXFP8);
  EXPECT_EQ(mx.getBlockSize(), 32);
  EXPECT_TRUE(isa<Float8E8M0FNUType>(mx.getScaleType()));
  int64_t dyn = ShapedType::kDynamic;
  EXPECT_EQ(getScaleShape(mx, {dyn, 7168}, false),
            (SmallVector<int64_t>{dyn, 224}));
  // A partial last block still gets a scale; square blocks are FP8-only.
  EXPECT_EQ(getScaleShape(mx, {8, 4096, 33}, true),
            (SmallVector<int64_t>{8, 4096, 2}));
}

TEST_F(MoeDialectTest, FP8Block128WeightsMayUseSquareBlocks) {
  QuantAttr fp8 = quant(QuantKind::FP8Block128);
  EXPECT_TRUE(fp8.getScaleType().isF32());
  EXPECT_EQ(getScaleShape(fp8, {256, 4096, 7168}, false),
            (SmallVector<int64_t>{256, 4096, 56}));
  EXPECT_EQ(getScaleShape(fp8, {256, 4096, 7168}, true),
            (SmallVector<int64_t>{256, 32, 56}));
  EXPECT_EQ(getScaleShape(fp8, {3, 200}, true), (SmallVector<int64_t>{1, 2}));
}

TEST_F(MoeDialectTest, ConfigRejectsImpossibleRouting) {
  EXPECT_EQ(configError(8, 2, router(RouterKind::SoftmaxTopK)), "");
  EXPECT_NE(configError(8, 9, router(RouterKind::SoftmaxTopK))
                .find("must not exceed the number of experts (8)"),
            std::string::npos);
  EXPECT_NE(configError(256, 8, router(RouterKind::SigmoidGroupedTopK, 7, 4))
                .find("n_group (7) must divide the number of experts (256)"),
            std::string::npos);
  EXPECT_NE(configError(64, 9, router(RouterKind::SigmoidGroupedTopK, 8, 1))
                .find("exceeds the 8 experts"),
            std::string::npos);
  EXPECT_NE(configError(8, 2, router(RouterKind::SoftmaxTopK), 3)
                .find("ep_size (3) must divide"),
            std::string::npos);
  EXPECT_EQ(configError(256, 8, router(RouterKind::SigmoidGroupedTopK, 8, 4)),
            "");
}

TEST_F(MoeDialectTest, DecomposeBuildsTheL1Steps) {
  context.getOrLoadDialect<tensor::TensorDialect>();
  OpBuilder b(&context);
  Location loc = UnknownLoc::get(&context);
  auto module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module.getBody());
  Type bf16 = b.getBF16Type();
  auto tensor = [&](ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, bf16);
  };
  auto x = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{5, 8}, bf16);
  auto rw = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{4, 8}, bf16);
  auto w13 = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{4, 32, 8}, bf16);
  auto w2 = tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{4, 8, 16}, bf16);
  auto config =
      ConfigAttr::get(&context, 4, 2, 8, 16, router(RouterKind::SoftmaxTopK),
                      ActivationAttr::get(&context, ActivationKind::SwiGLU,
                                          APFloat(1.702), APFloat(7.0)),
                      0, false, QuantAttr(), 1);
  LayerOp::create(b, loc, tensor({5, 8}), /*router_logits=*/Type(), x, rw,
                  Value(), w13, w2, Value(), Value(), Value(), Value(), Value(),
                  Value(), Value(), Value(), Value(), config);
  ASSERT_TRUE(succeeded(verify(module)));

  PassManager pm(&context);
  pm.addPass(createDecompose());
  ASSERT_TRUE(succeeded(pm.run(module)));

  SmallVector<StringRef> names;
  module.walk([&](Operation *op) {
    if (isa<MoeDialect>(op->getDialect()))
      names.push_back(op->getName().getStringRef());
  });
  EXPECT_EQ(names, (SmallVector<StringRef>{
                       "moe.route", "moe.dispatch", "moe.grouped_matmul",
                       "moe.grouped_matmul", "moe.combine"}));
  module->destroy();
}
