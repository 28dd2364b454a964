//===- Pad.cpp - the padding kernel ---------------------------------------===//
//
// moe.pad: a block per row (the leading dimensions flattened) copies the
// row and zeros its new columns. moe-legalize adds it where a matmul's K is
// not a whole number of 16-byte units; its remark names what it copies.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

LogicalResult nvidia::buildPad(LayerKernels &layer, PadOp op) {
  TensorInfo in = layer.info(op.getInput());
  int64_t rank = in.type.getRank();
  // Rows: the product of the leading dimensions, times T if the first is
  // the token count.
  int64_t fixedRows = 1;
  for (int64_t d = in.type.isDynamicDim(0) ? 1 : 0; d < rank - 1; ++d)
    fixedRows *= in.type.getDimSize(d);
  TokenLinear rows =
      in.type.isDynamicDim(0) ? in.rows * fixedRows : TokenLinear{fixedRows, 0};
  const TensorInfo &out = layer.define(op.getResult(), in.rows);
  int64_t k = in.type.getDimSize(rank - 1);
  int64_t kPadded = out.type.getDimSize(rank - 1);
  Type element = in.type.getElementType();
  bool dynamic = rows.perToken != 0;
  auto flat = [&](const TensorInfo &info, int64_t cols) {
    return TensorInfo{
        info.buffer,
        MemRefType::get({dynamic ? ShapedType::kDynamic : rows.fixed, cols},
                        element),
        rows};
  };
  TensorInfo from = flat(in, k), to = flat(out, kPadded);
  Kernel kernel = layer.kernelOn(op, "pad", {from.buffer, to.buffer});
  kernel.launch.work = rows;
  kernel.launch.block = 128;
  Emitter &e = kernel.e;
  Value src = kernel.view(0, from), dst = kernel.view(1, to);
  Value r = kernel.blockId(gpu::Dimension::x);
  kernel.onlyIf(e.ult(r, kernel.linear(rows)));
  Value zero =
      arith::ConstantOp::create(e.b, e.loc, element, e.b.getZeroAttr(element));
  e.forEach(
      kernel.threadId(), e.index(kPadded),
      [&](Value c) {
        Value inside = e.ult(c, e.index(k));
        Value v = e.loadRaw(src, {r, e.minUI(c, e.index(k - 1))});
        e.storeRaw(e.select(inside, v, zero), dst, {r, c});
      },
      e.index(128));
  return kernel.finish(op);
}
