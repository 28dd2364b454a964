//===- Quantize.cpp - the quantize and dequantize kernels -----------------===//
//
// moe.quantize and moe.dequantize, running the block code the CPU backend
// runs (codegen/common/Numerics.h), so both backends give the same codes and
// scales: activations (bf16 rows) with a block of threads per row and the
// lanes of a scale block meeting by shuffles; anything else with one thread
// per scale block.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

ScaleBlockConfig nvidia::configureScaleBlocks(Value data, Value scales,
                                              QuantAttr scheme) {
  ScaleBlockConfig c;
  auto dataType = cast<RankedTensorType>(data.getType());
  c.rank = dataType.getRank();
  c.rowsPerBlock = common::scaleRowsPerBlock(
      dataType.getShape(), cast<RankedTensorType>(scales.getType()).getShape(),
      scheme);
  c.dynamicRows = dataType.isDynamicDim(0);
  c.blockSize = scheme.getBlockSize();
  c.cols = dataType.getDimSize(c.rank - 1);
  c.colBlocks = llvm::divideCeil(c.cols, c.blockSize);
  c.prefix = c.rank == 3 ? dataType.getDimSize(0) : 1;
  if (!c.dynamicRows)
    c.rowBlocks =
        llvm::divideCeil(dataType.getDimSize(c.rank - 2), c.rowsPerBlock);
  return c;
}

RowQuantizeConfig nvidia::configureRowQuantize(Value input, QuantAttr scheme) {
  RowQuantizeConfig c;
  c.cols = cast<RankedTensorType>(input.getType()).getDimSize(1);
  c.blockSize = scheme.getBlockSize();
  c.lanes = c.blockSize / c.width;
  return c;
}

/// A kernel of one thread per scale block: quantizes `input` into `output`
/// and `scales`, or dequantizes `input` with `scales` into `output`.
static LogicalResult buildBlocks(LayerKernels &layer, Operation *op,
                                 Value input, Value output, Value scales,
                                 QuantAttr scheme, bool quantize) {
  // `input` is the bf16 side for quantize, the codes for dequantize.
  Value data = quantize ? output : input;
  int64_t rank = cast<RankedTensorType>(data.getType()).getRank();
  if (rank != 2 && rank != 3)
    return op->emitOpError() << "of rank " << rank
                             << " has no sm_90a kernel (ranks 2 and 3 have)";
  ScaleBlockConfig cfg = configureScaleBlocks(data, scales, scheme);
  int64_t rowsPerBlock = cfg.rowsPerBlock, kBlocks = cfg.colBlocks;
  // The verifiers give token rows (dynamic) one scale row each.
  assert((!cfg.dynamicRows || rowsPerBlock == 1) &&
         "token rows in 128-row blocks");
  TokenLinear rows = layer.info(input).rows;
  layer.define(output, rows);
  if (quantize)
    layer.define(scales, rows);
  Kernel k = layer.kernel(op, quantize ? "quantize" : "dequantize",
                          quantize ? SmallVector<Value>{input, output, scales}
                                   : SmallVector<Value>{input, scales, output});
  // One thread per block: prefix x rowBlocks x kBlocks of them.
  TokenLinear blockRows =
      cfg.dynamicRows ? rows : TokenLinear{cfg.rowBlocks, 0};
  k.launch.work = blockRows * cfg.blocksPerRowBlock();
  k.launch.perBlock = cfg.threads;
  k.launch.block = cfg.threads;
  Emitter &e = k.e;
  Value in = k.view(0, layer.info(input));
  Value second = k.view(1, layer.info(quantize ? output : scales));
  Value third = k.view(2, layer.info(quantize ? scales : output));
  Value rowCount = e.dim(in, rank - 2);
  Value rowBlocks =
      arith::CeilDivUIOp::create(e.b, e.loc, rowCount, e.index(rowsPerBlock));
  Value id =
      e.iadd(e.imul(k.blockId(gpu::Dimension::x), cfg.threads), k.threadId());
  Value total = arith::MulIOp::create(e.b, e.loc, e.imul(rowBlocks, kBlocks),
                                      e.index(cfg.prefix));
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
    Value firstCol = e.imul(kb, cfg.blockSize);
    Value lastCol =
        e.minUI(e.iadd(firstCol, e.index(cfg.blockSize)), e.index(cfg.cols));
    if (quantize)
      common::quantizeBlock(e, scheme, in, second, third, prefixIndex, rb, kb,
                            firstRow, lastRow, firstCol, lastCol);
    else
      common::dequantizeBlock(e, in, second, third, prefixIndex, rb, kb,
                              firstRow, lastRow, firstCol, lastCol);
  });
  return k.finish(op);
}

/// Activations (bf16 rows, a scale per row and block, rows a multiple of 8
/// long): a block of 128 threads per row, each quantizing 8 elements of a
/// block that its neighbours share, statistics combined by shuffles; loads
/// and stores coalesced.
LogicalResult nvidia::buildRowQuantize(LayerKernels &layer, Operation *op,
                                       Value inputTensor, Value dataTensor,
                                       Value scalesTensor, QuantAttr scheme) {
  RowQuantizeConfig cfg = configureRowQuantize(inputTensor, scheme);
  int64_t k = cfg.cols, width = cfg.width, bs = cfg.blockSize;
  TokenLinear rows = layer.info(inputTensor).rows;
  layer.define(dataTensor, rows);
  layer.define(scalesTensor, rows);
  Kernel kernel =
      layer.kernel(op, "quantize", {inputTensor, dataTensor, scalesTensor});
  kernel.launch.work = rows;
  kernel.launch.block = cfg.threads;
  Emitter &e = kernel.e;
  Value input = kernel.view(0, layer.info(inputTensor));
  Value data = kernel.view(1, layer.info(dataTensor));
  Value scales = kernel.view(2, layer.info(scalesTensor));
  Value r = kernel.blockId(gpu::Dimension::x), tid = kernel.threadId();
  kernel.onlyIf(e.ult(r, kernel.linear(rows)));
  Type bf16 = e.b.getBF16Type(), i8 = e.b.getI8Type();
  auto vecType = VectorType::get({width}, bf16);
  // Every thread runs every chunk (zeros past K), so shuffles see whole
  // warps.
  e.forEach(
      e.index(0), e.index(cfg.chunkedCols()),
      [&](Value chunk) {
        Value c = e.iadd(chunk, e.imul(tid, width));
        Value valid = e.ult(c, e.index(k));
        Value loaded = vector::LoadOp::create(
            e.b, e.loc, vecType, input, {r, e.minUI(c, e.index(k - width))},
            false, vectorAlign(width, bf16));
        Value zeros = arith::ConstantOp::create(
            e.b, e.loc, DenseElementsAttr::get(vecType, e.b.getZeroAttr(bf16)));
        auto [codes, stored] = quantizeVector(
            e, scheme, e.select(valid, loaded, zeros), cfg.lanes);
        e.ifThen(valid, [&] {
          vector::StoreOp::create(e.b, e.loc, codes, data, {r, c}, false,
                                  vectorAlign(width, i8));
          e.ifThen(e.eq(e.remUI(tid, cfg.lanes), e.index(0)), [&] {
            e.storeRaw(stored, scales, {r, e.divUI(c, bs)});
          });
        });
      },
      e.index(cfg.threads * width));
  return kernel.finish(op);
}

LogicalResult nvidia::buildQuantize(LayerKernels &layer, QuantizeOp op) {
  auto input = cast<RankedTensorType>(op.getInput().getType());
  auto scales = cast<RankedTensorType>(op.getScales().getType());
  if (input.getRank() == 2 && input.getElementType().isBF16() &&
      input.getDimSize(1) % 8 == 0 &&
      scales.getDimSize(0) == input.getDimSize(0))
    return buildRowQuantize(layer, op, op.getInput(), op.getData(),
                            op.getScales(), op.getScheme());
  return buildBlocks(layer, op, op.getInput(), op.getData(), op.getScales(),
                     op.getScheme(), /*quantize=*/true);
}

LogicalResult nvidia::buildDequantize(LayerKernels &layer, DequantizeOp op) {
  return buildBlocks(layer, op, op.getData(), op.getOutput(), op.getScales(),
                     op.getScheme(), /*quantize=*/false);
}
