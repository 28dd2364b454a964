//===- quantize-reference.cpp - run the reference quantizers on a file ----===//
//
// moe-quantize-reference IN.safetensors OUT.safetensors: quantizes the F32
// matrix "x" [rows, cols] every way moe.quantize can, so a script can compare
// the codes with ml_dtypes' conversions.
//
//===----------------------------------------------------------------------===//

#include "runtime/Safetensors.h"
#include "test/reference/Quantize.h"

#include <cstdio>
#include <cstring>

using namespace moe;

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(
        stderr,
        "usage: moe-quantize-reference IN.safetensors OUT.safetensors\n");
    return 2;
  }
  std::string error;
  auto file = rt::SafetensorsFile::read(argv[1], error);
  if (!file) {
    std::fprintf(stderr, "moe-quantize-reference: %s\n", error.c_str());
    return 1;
  }
  const rt::TensorInfo *x = file->find("x");
  if (!x || x->dtype != rt::DType::F32 || x->shape.size() != 2) {
    std::fprintf(stderr, "moe-quantize-reference: %s needs an F32 matrix 'x'\n",
                 argv[1]);
    return 1;
  }
  int64_t rows = x->shape[0], cols = x->shape[1];
  std::vector<float> matrix(rows * cols);
  std::memcpy(matrix.data(), file->data(*x), x->bytes);

  auto floorMx =
      ref::quantizeMXFP8(matrix, rows, cols, ref::ScaleRounding::Floor);
  auto ceilMx =
      ref::quantizeMXFP8(matrix, rows, cols, ref::ScaleRounding::Ceil);
  auto act = ref::quantizeFP8Block128(matrix, rows, cols, 1);
  auto weight = ref::quantizeFP8Block128(matrix, rows, cols, 128);
  int64_t mxBlocks = (cols + 31) / 32, blocks = (cols + 127) / 128;
  int64_t rowBlocks = (rows + 127) / 128;
  using rt::DType;
  std::vector<rt::TensorToWrite> out = {
      {"mx_floor_data", DType::F8_E4M3, {rows, cols}, floorMx.data.data()},
      {"mx_floor_scales",
       DType::F8_E8M0,
       {rows, mxBlocks},
       floorMx.e8m0.data()},
      {"mx_ceil_data", DType::F8_E4M3, {rows, cols}, ceilMx.data.data()},
      {"mx_ceil_scales", DType::F8_E8M0, {rows, mxBlocks}, ceilMx.e8m0.data()},
      {"b128_data", DType::F8_E4M3, {rows, cols}, act.data.data()},
      {"b128_scales", DType::F32, {rows, blocks}, act.f32Scales.data()},
      {"b128w_data", DType::F8_E4M3, {rows, cols}, weight.data.data()},
      {"b128w_scales",
       DType::F32,
       {rowBlocks, blocks},
       weight.f32Scales.data()},
  };
  if (!rt::writeSafetensors(argv[2], out, error)) {
    std::fprintf(stderr, "moe-quantize-reference: %s\n", error.c_str());
    return 1;
  }
  return 0;
}
