// RUN: moe-opt %s -split-input-file -moe-decompose -moe-fuse-quantization -moe-expert-parallel -verify-diagnostics | FileCheck %s

// A bf16 layer over 2 ranks: send and receive replace the dispatch; each
// expert output goes home right after the down matmul, and the combine sums
// what came back, laid out as the send's rows say.
// CHECK-LABEL: func @bf16
// CHECK: %[[IDS:.*]], %[[WTS:.*]] = moe.route
// CHECK: %[[SENT:.*]], %[[ROWS:.*]] = moe.ep_dispatch_send %{{.*}}, %[[IDS]] {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
// CHECK: %[[D:.*]], %[[C:.*]], %[[O:.*]], %[[ORIGIN:.*]] = moe.ep_dispatch_recv %[[SENT]] : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[D]], %{{.*}} groups(%[[C]], %[[O]])
// CHECK: %[[Y:.*]] = moe.grouped_matmul %[[H]], %{{.*}} groups(%[[C]], %[[O]])
// CHECK-NEXT: %[[BACK:.*]] = moe.ep_combine_send %[[Y]], %[[ORIGIN]] : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
// CHECK-NEXT: %[[G:.*]] = moe.ep_combine_recv %[[BACK]], %[[ROWS]] : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x8xbf16>
// CHECK-NEXT: moe.combine %[[G]], %[[ROWS]] weights %[[WTS]]
// CHECK-NOT: moe.dispatch
func.func @bf16(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// Shared experts run between the combine's two halves, while the expert
// outputs travel.
// CHECK-LABEL: func @shared_experts
// CHECK: moe.ep_dispatch_send
// CHECK: moe.ep_dispatch_recv
// CHECK: moe.ep_combine_send
// CHECK: moe.grouped_matmul
// CHECK: moe.grouped_matmul
// CHECK: moe.ep_combine_recv
// CHECK-NEXT: moe.combine
func.func @shared_experts(%x: tensor<?x8xbf16>, %rw: tensor<8x8xbf16>, %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>, %sw13: tensor<16x8xbf16>, %sw2: tensor<8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 8, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 8, ep_size = 4>}
      : (tensor<?x8xbf16>, tensor<8x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>, tensor<16x8xbf16>, tensor<8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// MXFP8: tokens travel as E4M3 codes with their scales, which the shared
// experts read too; the receiver's rows are codes and scales.
// CHECK-LABEL: func @quantized
// CHECK: %{{.*}}, %[[ROWS:.*]], %[[Q:.*]]:2 = moe.ep_dispatch_send %{{.*}} {local_experts = 2 : i64, quant = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>, tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
// CHECK: moe.ep_dispatch_recv %{{.*}} {quant = #moe.quant<kind = mxfp8>} : (tensor<2xi32>) -> (tensor<?x64xf8E4M3FN>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x2xf8E8M0FNU>)
// CHECK: moe.ep_combine_send
// CHECK: moe.grouped_matmul %[[Q]]#0, %{{.*}} scales(%[[Q]]#1,
func.func @quantized(%x: tensor<?x64xbf16>, %rw: tensor<4x64xbf16>, %w13: tensor<2x128x64xbf16>, %w2: tensor<2x64x64xbf16>, %sw13: tensor<128x64xbf16>, %sw2: tensor<64x64xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 64, intermediate = 64, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 64, quant = <kind = mxfp8>, ep_size = 2>}
      : (tensor<?x64xbf16>, tensor<4x64xbf16>, tensor<2x128x64xbf16>, tensor<2x64x64xbf16>, tensor<128x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// Llama-4 weights each expert's input: the weights travel with the tokens
// (in bf16) and the receiver scales its rows.
// CHECK-LABEL: func @scaled_input
// CHECK: %[[IDS:.*]], %[[WTS:.*]] = moe.route
// CHECK: moe.ep_dispatch_send %{{.*}}, %[[IDS]] scale %[[WTS]] {local_experts = 1 : i64}
// CHECK: moe.ep_dispatch_recv %{{.*}} {scaled}
// CHECK: moe.combine %{{.*}}, %{{.*}} :
func.func @scaled_input(%x: tensor<?x8xbf16>, %rw: tensor<2x8xbf16>, %w13: tensor<1x16x8xbf16>, %w2: tensor<1x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 2, top_k = 1, hidden = 8, intermediate = 8, router = <kind = sigmoid_scale_input>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<2x8xbf16>, tensor<1x16x8xbf16>, tensor<1x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// One rank: nothing to split.
// CHECK-LABEL: func @one_rank
// CHECK: moe.dispatch
// CHECK-NOT: moe.ep_
func.func @one_rank(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// Rows of an expert-parallel dispatch mean nothing until outputs come home.
func.func @rows_escape(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x2xi32> {
  %d, %c, %o, %r = moe.dispatch %x, %ids {ep_size = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  // expected-error @+1 {{'func.return' op reads an expert-parallel dispatch's rows; only moe.combine can, once the expert outputs have come home}}
  return %r : tensor<?x2xi32>
}

// -----

func.func @aligned(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{aligns expert rows to 128; expert-parallel dispatch lays them out back to back}}
  %d, %c, %o, %r = moe.dispatch %x, %ids {align = 128 : i64, ep_size = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  return %d : tensor<?x8xbf16>
}
