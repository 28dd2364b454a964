// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The router's backward: the fused route's logits (4 tokens a block, each
// warp two experts a pass, reduced by shuffles into shared memory), then a
// warp per token through the CPU backend's Jacobian, its lanes on stripes
// of experts and the softmax's sums across the warp.
// CHECK-LABEL: func.func @softmax
// CHECK: launches = [#moe.launch<kernel = @moe_route_grad, work = 1 * T, per_block = 4, block = 256, args = [buffer 0, buffer 1, buffer 2, buffer 3, buffer 4, tokens]>]
// CHECK: gpu.func @moe_route_grad({{.*}} workgroup(%{{.*}} : memref<4x16xf32, #gpu.address_space<workgroup>> {{.*}}, %{{.*}} : memref<4x16xf32, #gpu.address_space<workgroup>>
// CHECK-COUNT-5: gpu.shuffle xor
// CHECK: gpu.barrier
// CHECK: math.exp
// CHECK: nvvm.bar.warp.sync
// PTX-LABEL: .visible .entry moe_route_grad(
// PTX: shfl.sync.bfly.b32
// PTX: bar.sync
func.func @softmax(%x: tensor<?x96xbf16>, %wr: tensor<16x96xbf16>,
                   %ids: tensor<?x4xi32>, %dw: tensor<?x4xf32>)
    -> tensor<?x16xf32> {
  %dl = moe.route_grad %x, %wr choices(%ids, %dw)
      {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x96xbf16>, tensor<16x96xbf16>, tensor<?x4xi32>,
         tensor<?x4xf32>) -> tensor<?x16xf32>
  return %dl : tensor<?x16xf32>
}

// -----

// DeepSeek-V3's router: the bias is a kernel argument (it only ranks, so no
// logit adds it); sigmoid scores, no softmax.
// CHECK-LABEL: func.func @sigmoid_grouped
// CHECK: launches = [#moe.launch<kernel = @moe_route_grad, work = 1 * T, per_block = 4, block = 256, args = [buffer 0, buffer 1, buffer 2, buffer 3, buffer 4, buffer 5, tokens]>]
func.func @sigmoid_grouped(%x: tensor<?x96xbf16>, %wr: tensor<16x96xbf16>,
                           %bias: tensor<16xf32>, %ids: tensor<?x4xi32>,
                           %dw: tensor<?x4xf32>) -> tensor<?x16xf32> {
  %dl = moe.route_grad %x, %wr bias %bias choices(%ids, %dw)
      {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true,
                            n_group = 4, topk_group = 2, scaling = 2.5>}
      : (tensor<?x96xbf16>, tensor<16x96xbf16>, tensor<16xf32>,
         tensor<?x4xi32>, tensor<?x4xf32>) -> tensor<?x16xf32>
  return %dl : tensor<?x16xf32>
}

// -----

// The training forward's saved logits: each warp copies its token's row,
// and no logit is computed (the kernel takes neither the hidden states,
// buffer 0, nor the router weights, buffer 1).
// CHECK-LABEL: func.func @saved_logits
// CHECK: launches = [#moe.launch<kernel = @moe_route_grad, work = 1 * T, per_block = 4, block = 256, args = [buffer 2, buffer 3, buffer 4, buffer 5, tokens]>]
// PTX-LABEL: .visible .entry moe_route_grad(
func.func @saved_logits(%x: tensor<?x96xbf16>, %wr: tensor<16x96xbf16>,
                        %logits: tensor<?x16xf32>, %ids: tensor<?x4xi32>,
                        %dw: tensor<?x4xf32>) -> tensor<?x16xf32> {
  %dl = moe.route_grad %x, %wr logits %logits choices(%ids, %dw)
      {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x96xbf16>, tensor<16x96xbf16>, tensor<?x16xf32>,
         tensor<?x4xi32>, tensor<?x4xf32>) -> tensor<?x16xf32>
  return %dl : tensor<?x16xf32>
}

// -----

// Two f32 rows of every expert for each of a block's 4 tokens: 2048
// experts do not fit the 48 KiB a kernel has without opting in.
func.func @too_many_experts(%x: tensor<?x64xbf16>, %wr: tensor<2048x64xbf16>,
                            %ids: tensor<?x2xi32>, %dw: tensor<?x2xf32>)
    -> tensor<?x2048xf32> {
  // expected-error @+1 {{has 2048 experts: sm_90a's route gradient keeps 32 bytes an expert in shared memory, at most 49152}}
  %dl = moe.route_grad %x, %wr choices(%ids, %dw)
      {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<2048x64xbf16>, tensor<?x2xi32>,
         tensor<?x2xf32>) -> tensor<?x2048xf32>
  return %dl : tensor<?x2048xf32>
}
