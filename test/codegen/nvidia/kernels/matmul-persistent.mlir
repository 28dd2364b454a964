// RUN: moe-opt %s --split-input-file --moe-configure-matmuls="matmul-config=persistent=true" --moe-build-kernels | FileCheck %s

// A persistent matmul launches a block per tile, at most one per
// multiprocessor. Its tiles are ceil(T / 128) a column, so the launch
// counts T x 4 columns / 128 and one more tile a column: at one token 4
// blocks, one for each tile, not one block walking all four.
// CHECK: launches = [#moe.launch<kernel = @moe_matmul, work = 4 * T, per_block = 128, extra_blocks = 4, block = 384, {{.*}}persistent = true>]
func.func @dense(%x: tensor<?x64xbf16>, %w: tensor<1024x64xbf16>)
    -> tensor<?x1024xbf16> {
  %0 = moe.grouped_matmul %x, %w : (tensor<?x64xbf16>, tensor<1024x64xbf16>) -> tensor<?x1024xbf16>
  return %0 : tensor<?x1024xbf16>
}

// -----

// Grouped: a row tile per 128 rows, one more per expert, and one more for
// the rounding, in each column.
// CHECK: launches = [#moe.launch<kernel = @moe_grouped_matmul, work = 2 * T, per_block = 128, extra_blocks = 18, block = 384, {{.*}}persistent = true>]
func.func @grouped(%x: tensor<?x64xbf16>, %w: tensor<8x512x64xbf16>,
                   %counts: tensor<8xi32>, %offsets: tensor<9xi32>)
    -> tensor<?x512xbf16> {
  %0 = moe.grouped_matmul %x, %w groups(%counts, %offsets)
      : (tensor<?x64xbf16>, tensor<8x512x64xbf16>, tensor<8xi32>, tensor<9xi32>) -> tensor<?x512xbf16>
  return %0 : tensor<?x512xbf16>
}
