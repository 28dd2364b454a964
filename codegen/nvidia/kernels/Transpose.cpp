//===- Transpose.cpp - the transpose kernel -------------------------------===//
//
// moe.transpose: a block per 32 x 32 tile of a matrix (and per matrix of a
// stack) reads the tile's rows into shared memory and writes its columns as
// rows, both sides coalesced; the shared tile has a padding column so the
// column reads spread over the banks.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/Kernels.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static constexpr int64_t kTile = 32, kRowsAStep = 8;

LogicalResult nvidia::buildTranspose(LayerKernels &layer, TransposeOp op) {
  const TensorInfo &in = layer.info(op.getInput());
  if (in.type.getNumDynamicDims() != 0)
    return op.emitOpError() << "has no sm_90a kernel for a dynamic size";
  const TensorInfo &out = layer.define(op.getResult(), in.rows);
  ArrayRef<int64_t> shape = in.type.getShape();
  int64_t rank = shape.size();
  int64_t rows = shape[rank - 2], cols = shape[rank - 1];
  int64_t matrices = 1;
  for (int64_t d : shape.drop_back(2))
    matrices *= d;
  int64_t rowTiles = llvm::divideCeil(rows, kTile);
  int64_t colTiles = llvm::divideCeil(cols, kTile);
  Type element = in.type.getElementType();
  // Both as [matrices, rows, cols] and [matrices, cols, rows].
  auto flat = [&](const TensorInfo &info, int64_t r, int64_t c) {
    return TensorInfo{info.buffer, MemRefType::get({matrices, r, c}, element),
                      TokenLinear{matrices, 0}};
  };
  Kernel k = layer.kernelOn(op, "transpose", {in.buffer, out.buffer});
  k.launch.work = {matrices * rowTiles * colTiles, 0};
  k.launch.block = kTile * kRowsAStep;
  Emitter &e = k.e;
  Value src = k.view(0, flat(in, rows, cols));
  Value dst = k.view(1, flat(out, cols, rows));
  Value tile = k.workgroupBuffer({kTile, kTile + 1}, element);
  Value id = k.blockId(gpu::Dimension::x);
  k.onlyIf(e.ult(id, e.index(matrices * rowTiles * colTiles)));
  Value m = e.divUI(id, e.index(rowTiles * colTiles));
  Value within = e.remUI(id, e.index(rowTiles * colTiles));
  Value row0 = e.imul(e.divUI(within, e.index(colTiles)), kTile);
  Value col0 = e.imul(e.remUI(within, e.index(colTiles)), kTile);
  Value tid = k.threadId();
  Value tx = e.remUI(tid, e.index(kTile)), ty = e.divUI(tid, e.index(kTile));
  for (int64_t i = 0; i < kTile; i += kRowsAStep) {
    Value r = e.iadd(ty, e.index(i));
    Value row = e.iadd(row0, r), col = e.iadd(col0, tx);
    e.ifThen(e.andi(e.ult(row, e.index(rows)), e.ult(col, e.index(cols))), [&] {
      e.storeRaw(e.loadRaw(src, {m, row, col}), tile, {r, tx});
    });
  }
  gpu::BarrierOp::create(e.b, e.loc);
  for (int64_t i = 0; i < kTile; i += kRowsAStep) {
    // Row c of the result is column c of the tile.
    Value c = e.iadd(ty, e.index(i));
    Value outRow = e.iadd(col0, c), outCol = e.iadd(row0, tx);
    e.ifThen(e.andi(e.ult(outRow, e.index(cols)), e.ult(outCol, e.index(rows))),
             [&] {
               e.storeRaw(e.loadRaw(tile, {tx, c}), dst, {m, outRow, outCol});
             });
  }
  return k.finish(op);
}
