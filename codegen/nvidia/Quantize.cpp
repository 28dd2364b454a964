//===- Quantize.cpp - the quantize and dequantize kernels -----------------===//
//
// moe.quantize and moe.dequantize: one thread per scale block, running the
// block code the CPU backend runs (codegen/common/Numerics.h), so both
// backends give the same codes and scales.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/KernelBuilder.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

/// A kernel of one thread per scale block: quantizes `input` into `output`
/// and `scales`, or dequantizes `input` with `scales` into `output`.
static LogicalResult buildBlocks(LayerKernels &layer, Operation *op,
                                 Value input, Value output, Value scales,
                                 QuantAttr scheme, bool quantize) {
  // `input` is the bf16 side for quantize, the codes for dequantize.
  Value data = quantize ? output : input;
  auto dataType = cast<RankedTensorType>(data.getType());
  int64_t rank = dataType.getRank();
  if (rank != 2 && rank != 3)
    return op->emitOpError() << "of rank " << rank
                             << " has no sm_90a kernel (ranks 2 and 3 have)";
  int64_t rowsPerBlock = common::scaleRowsPerBlock(
      dataType.getShape(), cast<RankedTensorType>(scales.getType()).getShape(),
      scheme);
  bool dynamic = dataType.isDynamicDim(0);
  // The verifiers give token rows (dynamic) one scale row each.
  assert((!dynamic || rowsPerBlock == 1) && "token rows in 128-row blocks");
  int64_t kBlock = scheme.getBlockSize(), kDim = dataType.getDimSize(rank - 1);
  int64_t kBlocks = llvm::divideCeil(kDim, kBlock);
  TokenLinear rows = layer.info(input).rows;
  layer.define(output, rows);
  if (quantize)
    layer.define(scales, rows);
  Kernel k = layer.kernel(op, quantize ? "quantize" : "dequantize",
                          quantize ? SmallVector<Value>{input, output, scales}
                                   : SmallVector<Value>{input, scales, output});
  // One thread per block: prefix x rowBlocks x kBlocks of them.
  int64_t prefix = rank == 3 ? dataType.getDimSize(0) : 1;
  TokenLinear blockRows =
      dynamic ? rows
              : TokenLinear{int64_t(llvm::divideCeil(
                                dataType.getDimSize(rank - 2), rowsPerBlock)),
                            0};
  int64_t perRowBlock = prefix * kBlocks;
  k.launch.work = blockRows * perRowBlock;
  k.launch.perBlock = 128;
  k.launch.block = 128;
  Emitter &e = k.e;
  Value in = k.view(0, layer.info(input));
  Value second = k.view(1, layer.info(quantize ? output : scales));
  Value third = k.view(2, layer.info(quantize ? scales : output));
  Value rowCount = e.dim(in, rank - 2);
  Value rowBlocks =
      arith::CeilDivUIOp::create(e.b, e.loc, rowCount, e.index(rowsPerBlock));
  Value id = e.iadd(e.imul(k.blockId(gpu::Dimension::x), 128), k.threadId());
  Value total = arith::MulIOp::create(e.b, e.loc, e.imul(rowBlocks, kBlocks),
                                      e.index(prefix));
  e.ifThen(e.ult(id, total), [&] {
    Value kb = e.remUI(id, kBlocks);
    Value rest = e.divUI(id, kBlocks);
    Value rb = arith::RemUIOp::create(e.b, e.loc, rest, rowBlocks);
    SmallVector<Value> prefixIndex;
    if (rank == 3)
      prefixIndex.push_back(
          arith::DivUIOp::create(e.b, e.loc, rest, rowBlocks));
    Value firstRow = e.imul(rb, rowsPerBlock);
    Value lastRow = e.minUI(e.iadd(firstRow, e.index(rowsPerBlock)), rowCount);
    Value firstCol = e.imul(kb, kBlock);
    Value lastCol = e.minUI(e.iadd(firstCol, e.index(kBlock)), e.index(kDim));
    if (quantize)
      common::quantizeBlock(e, scheme, in, second, third, prefixIndex, rb, kb,
                            firstRow, lastRow, firstCol, lastCol);
    else
      common::dequantizeBlock(e, in, second, third, prefixIndex, rb, kb,
                              firstRow, lastRow, firstCol, lastCol);
  });
  return k.finish(op);
}

LogicalResult nvidia::buildQuantize(LayerKernels &layer, QuantizeOp op) {
  return buildBlocks(layer, op, op.getInput(), op.getData(), op.getScales(),
                     op.getScheme(), /*quantize=*/true);
}

LogicalResult nvidia::buildDequantize(LayerKernels &layer, DequantizeOp op) {
  return buildBlocks(layer, op, op.getData(), op.getOutput(), op.getScales(),
                     op.getScheme(), /*quantize=*/false);
}
