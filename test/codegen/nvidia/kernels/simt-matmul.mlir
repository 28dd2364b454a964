// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The router weight's gradient, dl^T x summed over the tokens: wgmma takes
// no f32 operand, so a block of 256 threads takes a 64 x 64 tile of the
// [E, H] result (2 x 2 tiles here), 16 tokens at a time through shared
// memory, each thread 4 x 4 sums. Four tiles would leave the GPU idle: the
// tokens are split 32 ways (2 x 32 blocks on x), each split's sums go to a
// workspace slice of 32 x 100 x 96 f32, and a second kernel adds them.
// CHECK-LABEL: func.func @router_wgrad
// CHECK-SAME: #moe.buffer<bytes = 1228800>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_simt_wgrad, work = 4096, per_block = 64, grid_y = 2, block = 256, args = [buffer 0, buffer 1, buffer 3, tokens]>, #moe.launch<kernel = @moe_simt_wgrad_sum, work = 9600, per_block = 256, block = 256, args = [buffer 3, buffer 2, tokens]>]
// CHECK: gpu.func @moe_simt_wgrad({{.*}} workgroup(%{{.*}} : memref<16x64xf32, #gpu.address_space<workgroup>> {{.*}}, %{{.*}} : memref<16x64xf32, #gpu.address_space<workgroup>>
// CHECK-COUNT-256: math.fma
// PTX-LABEL: .visible .entry moe_simt_wgrad(
// PTX: fma.rn.f32
func.func @router_wgrad(%dl: tensor<?x100xf32>, %x: tensor<?x96xbf16>)
    -> tensor<100x96xf32> {
  %0 = moe.grouped_matmul_wgrad %dl lhs %x
      : (tensor<?x100xf32>, tensor<?x96xbf16>) -> tensor<100x96xf32>
  return %0 : tensor<100x96xf32>
}

// -----

// The hidden states' gradient through the router, plus `acc`: a block per
// 64 tokens and 64 columns.
// CHECK-LABEL: func.func @router_dgrad
// CHECK: launches = [#moe.launch<kernel = @moe_simt_dgrad, work = 1 * T, per_block = 64, grid_y = 2, block = 256, args = [buffer 0, buffer 1, buffer 3, buffer 2, tokens]>]
// PTX-LABEL: .visible .entry moe_simt_dgrad(
// PTX: fma.rn.f32
func.func @router_dgrad(%dl: tensor<?x16xf32>, %wr: tensor<16x96xbf16>,
                        %acc: tensor<?x96xf32>) -> tensor<?x96xf32> {
  %0 = moe.grouped_matmul_dgrad %dl, %wr acc %acc
      : (tensor<?x16xf32>, tensor<16x96xbf16>, tensor<?x96xf32>)
      -> tensor<?x96xf32>
  return %0 : tensor<?x96xf32>
}

// -----

func.func @grouped_f32(%dl: tensor<?x16xf32>, %x: tensor<?x96xbf16>,
                       %c: tensor<4xi32>, %o: tensor<5xi32>)
    -> tensor<4x16x96xf32> {
  // expected-error @+1 {{has an f32 output gradient and groups: sm_90a takes an f32 one only in a dense product (the router's weight gradient)}}
  %0 = moe.grouped_matmul_wgrad %dl lhs %x groups(%c, %o)
      : (tensor<?x16xf32>, tensor<?x96xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x16x96xf32>
  return %0 : tensor<4x16x96xf32>
}

// -----

// A bias's gradient, each expert's rows summed: a block per expert and 32
// columns (2 x 3 blocks), a lane a column, 32 warps on the rows.
// CHECK-LABEL: func.func @bias_grad
// CHECK: launches = [#moe.launch<kernel = @moe_simt_row_sums, work = 6, block = 1024, args = [buffer 0, buffer 3, buffer 1, buffer 2, tokens]>]
// CHECK: gpu.func @moe_simt_row_sums({{.*}} workgroup(%{{.*}} : memref<32x32xf32, #gpu.address_space<workgroup>>
// CHECK: gpu.barrier
// PTX-LABEL: .visible .entry moe_simt_row_sums(
func.func @bias_grad(%dy: tensor<?x72xbf16>, %c: tensor<2xi32>,
                     %o: tensor<3xi32>) -> tensor<2x72xf32> {
  %0 = moe.grouped_matmul_wgrad %dy groups(%c, %o)
      : (tensor<?x72xbf16>, tensor<2xi32>, tensor<3xi32>) -> tensor<2x72xf32>
  return %0 : tensor<2x72xf32>
}

// -----

// The router bias's gradient: the f32 logit gradient's columns summed over
// every token.
// CHECK-LABEL: func.func @router_bias_grad
// CHECK: launches = [#moe.launch<kernel = @moe_simt_row_sums, work = 1, block = 1024, args = [buffer 0, buffer 1, tokens]>]
func.func @router_bias_grad(%dl: tensor<?x8xf32>) -> tensor<8xf32> {
  %0 = moe.grouped_matmul_wgrad %dl : (tensor<?x8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// A dgrad moe-legalize kept for its bias_dot alone (its rows went to the
// matmul): a warp a row, its expert found by bisecting the offsets.
// CHECK-LABEL: func.func @bias_dot
// CHECK: launches = [#moe.launch<kernel = @moe_bias_dot, work = 1 * T, per_block = 8, block = 256, args = [buffer 0, buffer 4, buffer 5, buffer 3, tokens]>]
// CHECK-COUNT-5: gpu.shuffle xor
// PTX-LABEL: .visible .entry moe_bias_dot(
func.func @bias_dot(%dy: tensor<?x64xbf16>, %w: tensor<4x64x32xbf16>,
                    %c: tensor<4xi32>, %o: tensor<5xi32>,
                    %bias: tensor<4x64xbf16>) -> tensor<?x1xf32> {
  %out, %dot = moe.grouped_matmul_dgrad %dy, %w groups(%c, %o) bias %bias
      : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>,
         tensor<5xi32>, tensor<4x64xbf16>)
      -> (tensor<?x32xbf16>, tensor<?x1xf32>)
  return %dot : tensor<?x1xf32>
}
