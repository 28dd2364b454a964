// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The router weight's gradient, dl^T x summed over the tokens: wgmma takes
// no f32 operand, so a block of 256 threads takes a 64 x 64 tile of the
// [E, H] result (2 x 2 blocks here), 16 tokens at a time through shared
// memory, each thread 4 x 4 sums.
// CHECK-LABEL: func.func @router_wgrad
// CHECK: launches = [#moe.launch<kernel = @moe_simt_wgrad, work = 100, per_block = 64, grid_y = 2, block = 256, args = [buffer 0, buffer 1, buffer 2, tokens]>]
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
  // expected-error @+1 {{has an f32 output gradient and groups or no matrix lhs: sm_90a takes an f32 one only in a dense product with a matrix (the router's weight gradient)}}
  %0 = moe.grouped_matmul_wgrad %dl lhs %x groups(%c, %o)
      : (tensor<?x16xf32>, tensor<?x96xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x16x96xf32>
  return %0 : tensor<4x16x96xf32>
}
