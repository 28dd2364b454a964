//===- Quantize.cpp - the quantize and dequantize kernels -----------------===//
//
// moe.quantize and moe.dequantize, running the block code the CPU backend
// runs (codegen/common/Numerics.h), so both backends give the same codes and
// scales. Rows of a scale each (activations, MXFP8 weights): a block of
// threads per row, the lanes of a scale block meeting by shuffles. FP8
// block-128 weights: a block of threads per 128 x 128 scale block, meeting
// in shared memory. Dequantizing: a thread per 8 elements. Each reads and
// writes 8 elements at a time, coalesced along K; a layout none of these
// takes (K not a multiple of 8) runs one thread per scale block.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "codegen/common/FP8.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
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
  auto type = cast<RankedTensorType>(input.getType());
  c.cols = type.getDimSize(type.getRank() - 1);
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

/// Activations or MXFP8 weights (bf16 rows, a scale per row and block, rows
/// a multiple of 8 long; [E, N, K] weights as E x N rows): a block of 128
/// threads per row, each quantizing 8 elements of a block that its
/// neighbours share, statistics combined by shuffles; loads and stores
/// coalesced.
LogicalResult nvidia::buildRowQuantize(LayerKernels &layer, Operation *op,
                                       Value inputTensor, Value dataTensor,
                                       Value scalesTensor, QuantAttr scheme) {
  RowQuantizeConfig cfg = configureRowQuantize(inputTensor, scheme);
  int64_t k = cfg.cols, width = cfg.width, bs = cfg.blockSize;
  auto inputType = cast<RankedTensorType>(inputTensor.getType());
  bool stacked = inputType.getRank() == 3;
  int64_t perMatrix = stacked ? inputType.getDimSize(1) : 0;
  TokenLinear rows = layer.info(inputTensor).rows;
  layer.define(dataTensor, rows);
  layer.define(scalesTensor, rows);
  Kernel kernel =
      layer.kernel(op, "quantize", {inputTensor, dataTensor, scalesTensor});
  TokenLinear allRows =
      stacked ? TokenLinear{inputType.getDimSize(0) * perMatrix, 0} : rows;
  kernel.launch.work = allRows;
  kernel.launch.block = cfg.threads;
  Emitter &e = kernel.e;
  Value input = kernel.view(0, layer.info(inputTensor));
  Value data = kernel.view(1, layer.info(dataTensor));
  Value scales = kernel.view(2, layer.info(scalesTensor));
  Value r = kernel.blockId(gpu::Dimension::x), tid = kernel.threadId();
  kernel.onlyIf(e.ult(r, kernel.linear(allRows)));
  // A stacked row's matrix and row within it.
  auto at = [&](Value col) -> SmallVector<Value> {
    if (!stacked)
      return {r, col};
    return {e.divUI(r, perMatrix), e.remUI(r, perMatrix), col};
  };
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
            e.b, e.loc, vecType, input, at(e.minUI(c, e.index(k - width))),
            false, vectorAlign(width, bf16));
        Value zeros = arith::ConstantOp::create(
            e.b, e.loc, DenseElementsAttr::get(vecType, e.b.getZeroAttr(bf16)));
        auto [codes, stored] = quantizeVector(
            e, scheme, e.select(valid, loaded, zeros), cfg.lanes);
        e.ifThen(valid, [&] {
          vector::StoreOp::create(e.b, e.loc, codes, data, at(c), false,
                                  vectorAlign(width, i8));
          e.ifThen(e.eq(e.remUI(tid, cfg.lanes), e.index(0)),
                   [&] { e.storeRaw(stored, scales, at(e.divUI(c, bs))); });
        });
      },
      e.index(cfg.threads * width));
  return kernel.finish(op);
}

/// FP8 block-128 weights ([E,] N, K bf16, K a multiple of 8, a scale per
/// 128 x 128 block): a block of 128 threads per scale block, each thread 8
/// columns in every 8th of its rows. Statistics meet by shuffles, then
/// across the four warps in shared memory; every thread then quantizes
/// what it read (again, from cache).
static LogicalResult buildSquareQuantize(LayerKernels &layer, QuantizeOp op) {
  QuantAttr scheme = op.getScheme();
  ScaleBlockConfig cfg =
      configureScaleBlocks(op.getData(), op.getScales(), scheme);
  constexpr int64_t width = 8, threads = 128, warps = threads / 32;
  int64_t bs = cfg.blockSize, rowsPerBlock = cfg.rowsPerBlock;
  int64_t colLanes = bs / width, rowLanes = threads / colLanes;
  // Rows and columns of the input (with `transpose`, the data's columns
  // and rows); its blocks are the data's, transposed.
  auto inputType = cast<RankedTensorType>(op.getInput().getType());
  int64_t n = inputType.getDimSize(cfg.rank - 2);
  int64_t k = inputType.getDimSize(cfg.rank - 1);
  int64_t rowBlocks = llvm::divideCeil(n, bs),
          colBlocks = llvm::divideCeil(k, bs);
  // With `transpose` the codes are written transposed only; with
  // `transposed` results, both ways.
  bool both = !op.getTransposed().empty();
  bool transposed = op.getTranspose() || both;
  TokenLinear rows = layer.info(op.getInput()).rows;
  layer.define(op.getData(), rows);
  layer.define(op.getScales(), rows);
  SmallVector<Value> buffers = {op.getInput(), op.getData(), op.getScales()};
  for (Value v : op.getTransposed()) {
    layer.define(v, rows);
    buffers.push_back(v);
  }
  Kernel kernel = layer.kernel(op, "quantize", buffers);
  kernel.launch.work = TokenLinear{cfg.prefix * rowBlocks * colBlocks, 0};
  kernel.launch.block = threads;
  Emitter &e = kernel.e;
  Value input = kernel.view(0, layer.info(op.getInput()));
  Value data = kernel.view(1, layer.info(op.getData()));
  Value scales = kernel.view(2, layer.info(op.getScales()));
  // Where the transposed codes and scales go.
  Value tData = data, tScales = scales;
  if (both) {
    tData = kernel.view(3, layer.info(op.getTransposed()[0]));
    tScales = kernel.view(4, layer.info(op.getTransposed()[1]));
  }
  Value block = kernel.blockId(gpu::Dimension::x), tid = kernel.threadId();
  Value kb = e.remUI(block, colBlocks);
  Value rest = e.divUI(block, colBlocks);
  Value rb = e.remUI(rest, rowBlocks);
  SmallVector<Value> prefix;
  if (cfg.rank == 3)
    prefix.push_back(e.divUI(rest, rowBlocks));
  Value c = e.iadd(e.imul(kb, bs), e.imul(e.remUI(tid, colLanes), width));
  Value colValid = e.ult(c, e.index(k));
  Value firstRow = e.iadd(e.imul(rb, rowsPerBlock), e.divUI(tid, colLanes));
  Type bf16 = e.b.getBF16Type(), i8 = e.b.getI8Type(), f32 = e.b.getF32Type();
  auto vecType = VectorType::get({width}, bf16);
  auto at = [&](Value row, Value col) {
    SmallVector<Value> index(prefix);
    index.append({row, col});
    return index;
  };
  // This thread's i-th row of the block, whether it holds one, and its
  // elements (clamped inside the matrix; zeros where not valid).
  auto rowOf = [&](Value i) { return e.iadd(firstRow, e.imul(i, rowLanes)); };
  auto loadAt = [&](Value row, Value valid) {
    Value loaded = vector::LoadOp::create(
        e.b, e.loc, vecType, input,
        at(e.minUI(row, e.index(n - 1)), e.minUI(c, e.index(k - width))), false,
        vectorAlign(width, bf16));
    Value zeros = arith::ConstantOp::create(
        e.b, e.loc, DenseElementsAttr::get(vecType, e.b.getZeroAttr(bf16)));
    return e.select(valid, loaded, zeros);
  };
  auto validAt = [&](Value row) {
    return e.andi(colValid, e.ult(row, e.index(n)));
  };
  // A thread's rows, `unroll` loads in flight at a time: one at a time
  // leaves the memory idle, all 16 at once costs the registers of
  // occupancy.
  int64_t steps = rowsPerBlock / rowLanes, unroll = 4;
  auto loadRows = [&](Value i) {
    SmallVector<std::pair<Value, Value>> loaded;
    for (int64_t u = 0; u < unroll; ++u) {
      Value row = rowOf(e.iadd(e.imul(i, unroll), e.index(u)));
      Value valid = validAt(row);
      loaded.push_back({row, valid});
    }
    SmallVector<Value> vectors;
    for (auto [row, valid] : loaded)
      vectors.push_back(loadAt(row, valid));
    return std::make_pair(loaded, vectors);
  };
  SmallVector<Value> stats = e.reduce(
      e.index(0), e.index(steps / unroll), {e.f32(0.0), e.f32(0.0)},
      [&](Value i, ValueRange acc) -> SmallVector<Value> {
        Value amax = acc[0], special = acc[1];
        for (Value v : loadRows(i).second)
          for (int64_t j = 0; j < width; ++j) {
            Value x = arith::ExtFOp::create(
                e.b, e.loc, f32,
                Value(vector::ExtractOp::create(e.b, e.loc, v, j)));
            Value isSpecial;
            amax = arith::MaxNumFOp::create(
                e.b, e.loc, amax, common::blockStats(e, x, isSpecial));
            special = arith::MaximumFOp::create(e.b, e.loc, special, isSpecial);
          }
        return {amax, special};
      });
  Value amax = stats[0], special = stats[1];
  reduceBlockStats(e, amax, special, 32);
  // The warps' statistics, then every thread's of them all.
  Value shared = kernel.workgroupBuffer({2, warps}, f32);
  Value warp = e.divUI(tid, 32);
  e.ifThen(e.eq(e.remUI(tid, 32), e.index(0)), [&] {
    e.storeRaw(amax, shared, {e.index(0), warp});
    e.storeRaw(special, shared, {e.index(1), warp});
  });
  gpu::BarrierOp::create(e.b, e.loc);
  for (int64_t w = 0; w < warps; ++w) {
    amax = arith::MaxNumFOp::create(
        e.b, e.loc, amax, e.loadRaw(shared, {e.index(0), e.index(w)}));
    special = arith::MaximumFOp::create(
        e.b, e.loc, special, e.loadRaw(shared, {e.index(1), e.index(w)}));
  }
  common::BlockScale scale = common::blockScale(e, scheme, amax, special);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    SmallVector<Value> index(prefix), swapped(prefix);
    index.append({rb, kb});
    swapped.append({kb, rb});
    if (both || !transposed)
      e.storeRaw(scale.stored, scales, index);
    if (transposed)
      e.storeRaw(scale.stored, tScales, swapped);
  });
  auto codesType = VectorType::get({width}, i8);
  // Transposed, the codes meet in shared memory (rows of 129 bytes, so
  // that reading down a column touches different banks), and each thread
  // then writes 8 of a data row: 8 input rows of one column.
  Value tile = transposed ? kernel.workgroupBuffer({bs, bs + 1}, i8) : Value();
  Value localCol = e.imul(e.remUI(tid, colLanes), width);
  e.forEach(e.index(0), e.index(steps / unroll), [&](Value i) {
    auto [loaded, vectors] = loadRows(i);
    for (int64_t u = 0; u < unroll; ++u) {
      auto [row, valid] = loaded[u];
      Value v = vectors[u];
      Value codes = arith::ConstantOp::create(
          e.b, e.loc,
          DenseElementsAttr::get(codesType, e.b.getI8IntegerAttr(0)));
      for (int64_t j = 0; j < width; ++j) {
        Value x = arith::ExtFOp::create(
            e.b, e.loc, f32,
            Value(vector::ExtractOp::create(e.b, e.loc, v, j)));
        codes =
            vector::InsertOp::create(e.b, e.loc, scale.encode(e, x), codes, j);
      }
      if (transposed) {
        Value localRow =
            e.iadd(e.divUI(tid, colLanes),
                   e.imul(e.iadd(e.imul(i, unroll), e.index(u)), rowLanes));
        for (int64_t j = 0; j < width; ++j)
          e.storeRaw(Value(vector::ExtractOp::create(e.b, e.loc, codes, j)),
                     tile, {localRow, e.iadd(localCol, e.index(j))});
        if (!both)
          continue;
      }
      e.ifThen(valid, [&] {
        vector::StoreOp::create(e.b, e.loc, codes, data, at(row, c), false,
                                vectorAlign(width, i8));
      });
    }
  });
  if (!transposed)
    return kernel.finish(op);
  gpu::BarrierOp::create(e.b, e.loc);
  // Data row (input column) kb * bs + r, columns rb * bs + 8 q ... + 7.
  int64_t chunks = bs / width, rowsAtOnce = threads / chunks;
  Value q = e.remUI(tid, chunks);
  Value dataCol = e.iadd(e.imul(rb, bs), e.imul(q, width));
  e.forEach(e.index(0), e.index(bs / rowsAtOnce), [&](Value i) {
    Value r = e.iadd(e.divUI(tid, chunks), e.imul(i, rowsAtOnce));
    SmallVector<Value> bytes;
    for (int64_t j = 0; j < width; ++j)
      bytes.push_back(
          e.loadRaw(tile, {e.iadd(e.imul(q, width), e.index(j)), r}));
    Value codes = vector::FromElementsOp::create(e.b, e.loc, codesType, bytes);
    Value dataRow = e.iadd(e.imul(kb, bs), r);
    e.ifThen(e.andi(e.ult(dataRow, e.index(k)), e.ult(dataCol, e.index(n))),
             [&] {
               vector::StoreOp::create(e.b, e.loc, codes, tData,
                                       at(dataRow, dataCol), false,
                                       vectorAlign(width, i8));
             });
  });
  return kernel.finish(op);
}

/// Codes and their scales back to values (K a multiple of 8): a thread per 8
/// consecutive codes, which one scale block holds (blocks are 32 or 128
/// long), read and written 8 at a time.
static LogicalResult buildVectorDequantize(LayerKernels &layer,
                                           DequantizeOp op) {
  ScaleBlockConfig cfg =
      configureScaleBlocks(op.getData(), op.getScales(), op.getScheme());
  constexpr int64_t width = 8, threads = 256;
  int64_t k = cfg.cols, vectors = k / width;
  TokenLinear rows = layer.info(op.getData()).rows;
  layer.define(op.getOutput(), rows);
  Kernel kernel = layer.kernel(op, "dequantize",
                               {op.getData(), op.getScales(), op.getOutput()});
  auto dataType = cast<RankedTensorType>(op.getData().getType());
  int64_t perMatrix = dataType.getDimSize(cfg.rank - 2);
  // Token rows are the leading dimension's; static ones every matrix's.
  TokenLinear allRows =
      cfg.dynamicRows ? rows : TokenLinear{cfg.prefix * perMatrix, 0};
  kernel.launch.work = allRows * vectors;
  kernel.launch.perBlock = threads;
  kernel.launch.block = threads;
  Emitter &e = kernel.e;
  Value data = kernel.view(0, layer.info(op.getData()));
  Value scales = kernel.view(1, layer.info(op.getScales()));
  Value out = kernel.view(2, layer.info(op.getOutput()));
  Value id = e.iadd(e.imul(kernel.blockId(gpu::Dimension::x), threads),
                    kernel.threadId());
  kernel.onlyIf(e.ult(id, e.imul(kernel.linear(allRows), vectors)));
  Value c = e.imul(e.remUI(id, vectors), width);
  Value r = e.divUI(id, vectors);
  SmallVector<Value> index, scaleIndex;
  if (cfg.rank == 3) {
    index = {e.divUI(r, perMatrix), e.remUI(r, perMatrix), c};
    scaleIndex = {index[0], e.divUI(index[1], cfg.rowsPerBlock),
                  e.divUI(c, cfg.blockSize)};
  } else {
    index = {r, c};
    scaleIndex = {e.divUI(r, cfg.rowsPerBlock), e.divUI(c, cfg.blockSize)};
  }
  Type i8 = e.b.getI8Type();
  Type element = cast<MemRefType>(out.getType()).getElementType();
  Value codes =
      vector::LoadOp::create(e.b, e.loc, VectorType::get({width}, i8), data,
                             index, false, vectorAlign(width, i8));
  Value scale = common::loadScale(e, scales, scaleIndex);
  auto outType = VectorType::get({width}, element);
  Value values = arith::ConstantOp::create(
      e.b, e.loc, DenseElementsAttr::get(outType, e.b.getZeroAttr(element)));
  for (int64_t j = 0; j < width; ++j) {
    Value x = e.mul(
        common::decodeE4M3(e, vector::ExtractOp::create(e.b, e.loc, codes, j)),
        scale);
    if (!element.isF32())
      x = arith::TruncFOp::create(e.b, e.loc, element, x);
    values = vector::InsertOp::create(e.b, e.loc, x, values, j);
  }
  vector::StoreOp::create(e.b, e.loc, values, out, index, false,
                          vectorAlign(width, element));
  return kernel.finish(op);
}

/// Ranks 2 and 3 have kernels; buildBlocks refuses others.
static bool hasKernelRank(Value data) {
  int64_t rank = cast<RankedTensorType>(data.getType()).getRank();
  return rank == 2 || rank == 3;
}

LogicalResult nvidia::buildQuantize(LayerKernels &layer, QuantizeOp op) {
  auto input = cast<RankedTensorType>(op.getInput().getType());
  if (!hasKernelRank(op.getData()))
    return buildBlocks(layer, op, op.getInput(), op.getData(), op.getScales(),
                       op.getScheme(), /*quantize=*/true);
  ScaleBlockConfig cfg =
      configureScaleBlocks(op.getData(), op.getScales(), op.getScheme());
  if (op.getTranspose() || !op.getTransposed().empty()) {
    // moe-legalize makes these from a transpose and a quantize (and a
    // quantize of the same weights) where they fit this kernel.
    ArrayRef<int64_t> shape = input.getShape();
    if (!input.getElementType().isBF16() || cfg.dynamicRows ||
        cfg.rowsPerBlock != cfg.blockSize || shape.back() % 8 != 0 ||
        shape[shape.size() - 2] % 8 != 0)
      return op.emitOpError()
             << "quantizes its input transposed, which sm_90a does for bf16 "
                "input whose last two dimensions are static multiples of 8, "
                "quantized in square blocks (input shape "
             << input << ")";
    return buildSquareQuantize(layer, op);
  }
  bool vectors = input.getElementType().isBF16() && cfg.cols % 8 == 0;
  // Rows of a scale each: activations, and static stacks of them.
  if (vectors && cfg.rowsPerBlock == 1 &&
      (input.getRank() == 2 || !cfg.dynamicRows))
    return buildRowQuantize(layer, op, op.getInput(), op.getData(),
                            op.getScales(), op.getScheme());
  if (vectors && !cfg.dynamicRows && cfg.rowsPerBlock == cfg.blockSize)
    return buildSquareQuantize(layer, op);
  return buildBlocks(layer, op, op.getInput(), op.getData(), op.getScales(),
                     op.getScheme(), /*quantize=*/true);
}

LogicalResult nvidia::buildDequantize(LayerKernels &layer, DequantizeOp op) {
  if (hasKernelRank(op.getData()) &&
      configureScaleBlocks(op.getData(), op.getScales(), op.getScheme()).cols %
              8 ==
          0)
    return buildVectorDequantize(layer, op);
  return buildBlocks(layer, op, op.getData(), op.getOutput(), op.getScales(),
                     op.getScheme(), /*quantize=*/false);
}
