// RUN: moe-opt %s -split-input-file -moe-lower-to-loops -verify-diagnostics | FileCheck %s

// A decomposed layer becomes one function on buffers; the result is written
// into a trailing output argument and scratch buffers are freed.
// CHECK-LABEL: func.func @layer(
// CHECK-SAME: %[[X:[^:]*]]: memref<?x8xbf16>, %[[RW:[^:]*]]: memref<4x8xbf16>, %[[W13:[^:]*]]: memref<4x16x8xbf16>, %[[W2:[^:]*]]: memref<4x8x8xbf16>, %[[OUT:[^:]*]]: memref<?x8xbf16>)
// CHECK-NOT: -> tensor
// CHECK: %[[T:.*]] = memref.dim %[[X]], %{{.*}} : memref<?x8xbf16>
// CHECK: %[[IDS:.*]] = memref.alloc(%[[T]]) : memref<?x2xi32>
// CHECK: %[[WTS:.*]] = memref.alloc(%[[T]]) : memref<?x2xf32>
// Router: logits in f32 from bf16 operands, softmax, top-k.
// CHECK: scf.for
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: math.exp
// Dispatch: the expert-major buffer is sized by the computed offsets.
// CHECK: %[[ROWS:.*]] = memref.alloc(%{{.*}}) : memref<?x8xbf16>
// Expert matmuls round the activation and the expert rows to bf16.
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// Combine writes into the caller's buffer.
// CHECK: memref.store %{{.*}}, %[[OUT]]
// CHECK: memref.dealloc %[[IDS]]
// CHECK: return
// CHECK-NOT: moe.
func.func @layer(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  %ids, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk, renormalize = true>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  %d, %c, %o, %r = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  %h = moe.grouped_matmul %d, %w13 groups(%c, %o) {activation = #moe.activation<kind = swiglu>} : (tensor<?x8xbf16>, tensor<4x16x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x8xbf16>
  %y = moe.grouped_matmul %h, %w2 groups(%c, %o) : (tensor<?x8xbf16>, tensor<4x8x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x8xbf16>
  %out = moe.combine %y, %r weights %w : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x8xbf16>
  return %out : tensor<?x8xbf16>
}

// -----

// Functions without moe ops are left alone.
// CHECK-LABEL: func.func @untouched(%{{.*}}: tensor<4xf32>) -> tensor<4xf32>
func.func @untouched(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

func.func @not_decomposed(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{must be decomposed first (run moe-decompose)}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// FP8: codes live in i8 buffers; MXFP8 scales are E8M0 codes.
// CHECK-LABEL: func.func @fp8(
// CHECK-SAME: memref<?x64xbf16>, %{{[^:]*}}: memref<32x64xi8>, %{{[^:]*}}: memref<32x2xi8>, %{{[^:]*}}: memref<?x32xf32>)
// CHECK: memref.alloc(%{{.*}}) : memref<?x64xi8>
// CHECK: memref.alloc(%{{.*}}) : memref<?x2xi8>
// CHECK: arith.bitcast %{{.*}} : f32 to i32
// CHECK: arith.trunci %{{.*}} : i32 to i8
// CHECK: memref.store %{{.*}}, %{{.*}} : memref<?x32xf32>
func.func @fp8(%x: tensor<?x64xbf16>, %b: tensor<32x64xf8E4M3FN>, %bs: tensor<32x2xf8E8M0FNU>) -> tensor<?x32xf32> {
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  %0 = moe.grouped_matmul %d, %b scales(%s, %bs) : (tensor<?x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>, tensor<32x2xf8E8M0FNU>) -> tensor<?x32xf32>
  return %0 : tensor<?x32xf32>
}

// -----

func.func @attention(%q: tensor<1x4x2x8xbf16>, %k: tensor<1x4x2x8xbf16>, %v: tensor<1x4x2x8xbf16>) -> tensor<1x4x2x8xbf16> {
  // expected-error @+1 {{must be split first (run moe-split-attention)}}
  %0 = moe.attention %q, %k, %v : (tensor<1x4x2x8xbf16>, tensor<1x4x2x8xbf16>, tensor<1x4x2x8xbf16>) -> tensor<1x4x2x8xbf16>
  return %0 : tensor<1x4x2x8xbf16>
}

// -----

// The split form, row by row: per key tile of 4 the masked scores in base 2
// (times scale * log2 e), the running max, P = exp2(s - max), the sum of P
// in f32 and P rounded to bf16 times V; two key ranges merged at the end.
// CHECK-LABEL: func @tiled_attention
// CHECK: memref.alloc() : memref<4xf32>
// CHECK: memref.alloc() : memref<2x8xf32>
// CHECK: arith.constant 0.180336878 : f32
// CHECK: scf.for
// CHECK: arith.cmpi sle
// CHECK: arith.maximumf
// CHECK: math.exp2
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: math.exp2
func.func @tiled_attention(%q: tensor<1x4x2x8xbf16>, %k: tensor<1x6x1x8xbf16>, %v: tensor<1x6x1x8xbf16>) -> tensor<1x4x2x8xbf16> {
  %0 = moe.tiled_attention %q, %k, %v {causal, groups = 1 : i64, kv_splits = 2 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 4 : i64, schedule = [[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>]]} : (tensor<1x4x2x8xbf16>, tensor<1x6x1x8xbf16>, tensor<1x6x1x8xbf16>) -> tensor<1x4x2x8xbf16>
  return %0 : tensor<1x4x2x8xbf16>
}

// -----

func.func @returns_argument(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  %d, %c, %o, %r = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  // expected-error @-2 {{must return distinct values computed by moe ops}}
  return %x : tensor<?x8xbf16>
}

// -----

// Expert-parallel halves call the runtime (runtime/moe_ep.h) with buffer
// addresses and the row sizes the generated code fixed: 8 bf16 = 16 bytes.
// CHECK-LABEL: func.func private @moe_ep_combine_recv(i64, i64, i64, i64)
// CHECK-LABEL: func.func private @moe_ep_combine_send(i64, i64, i64, i64, i64, i64)
// CHECK-LABEL: func.func private @moe_ep_dispatch_unpack(i64, i64, i64, i64, i64, i64)
// CHECK-LABEL: func.func private @moe_ep_dispatch_wait() -> i64
// CHECK-LABEL: func.func private @moe_ep_dispatch_send(i64, i64, i64, i64, i64, i64, i64, i64, i64)
// CHECK-LABEL: func @expert_parallel
// CHECK: %[[ROW:.*]] = arith.constant 16 : i64
// CHECK: call @moe_ep_dispatch_send(%{{.*}}, %[[ROW]],
// CHECK: %[[N:.*]] = call @moe_ep_dispatch_wait() : () -> i64
// CHECK: call @moe_ep_dispatch_unpack(
// CHECK: call @moe_ep_combine_send(
// CHECK: call @moe_ep_combine_recv(
func.func @expert_parallel(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  %back = moe.ep_combine_send %d, %origin : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  %g = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  %out = moe.combine %g, %rows : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  return %out : tensor<?x8xbf16>
}

// -----

func.func @not_split(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{has ep_size = 2: run moe-expert-parallel first}}
  %d, %c, %o, %r = moe.dispatch %x, %ids {ep_size = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  return %d : tensor<?x8xbf16>
}

// -----

// moe.pad copies each row and stores zeros past the input's columns.
// CHECK-LABEL: func.func @pad(
// CHECK: scf.for
// CHECK: scf.for %[[C:.*]] = %{{.*}} to %{{.*}}
// CHECK: %[[IN:.*]] = arith.cmpi ult, %[[C]]
// CHECK: scf.if %[[IN]] -> (bf16)
// CHECK: memref.load
// CHECK: else
// CHECK: scf.yield %{{.*}} : bf16
// CHECK: memref.store
func.func @pad(%x: tensor<?x100xbf16>) -> tensor<?x104xbf16> {
  %0 = moe.pad %x : tensor<?x100xbf16> -> tensor<?x104xbf16>
  return %0 : tensor<?x104xbf16>
}
