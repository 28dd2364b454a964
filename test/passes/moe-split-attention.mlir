// RUN: moe-opt %s -split-input-file -moe-split-attention -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-split-attention="ping-pong=false" -verify-diagnostics | FileCheck %s --check-prefix=SERIAL

// Prefill, head size 128: tiles of 64 rows x 128 keys; the scale defaults
// to 1/sqrt(128). With ping-pong each slot runs one group's matrix stages
// (qk of this tile, pv of the previous one) beside the other group's
// vector stages: slot 0 group 0's matmuls beside group 1's softmax of the
// previous tile, slot 1 the other way round.
// CHECK-LABEL: func @prefill
// CHECK: moe.tiled_attention %arg0, %arg1, %arg2 {causal, groups = 2 : i64, kv_splits = 1 : i64, scale = 0.0883883461 : f32,
// CHECK-SAME: schedule = {{\[}}[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>,
// CHECK-SAME: #moe.stage<kind = mask, group = 1, tile = -1>, #moe.stage<kind = max, group = 1, tile = -1>, #moe.stage<kind = exp, group = 1, tile = -1>, #moe.stage<kind = rescale, group = 1, tile = -1>, #moe.stage<kind = sum, group = 1, tile = -1>],
// CHECK-SAME: [#moe.stage<kind = qk, group = 1>, #moe.stage<kind = pv, group = 1, tile = -1>,
// CHECK-SAME: #moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>]]
// CHECK-SAME: tile_m = 64 : i64, tile_n = 128 : i64}
// CHECK-NOT: moe.attention
// Without ping-pong both groups run their matmuls, then both their softmax.
// SERIAL-LABEL: func @prefill
// SERIAL: schedule = {{\[}}[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>, #moe.stage<kind = qk, group = 1>, #moe.stage<kind = pv, group = 1, tile = -1>],
// SERIAL-SAME: [#moe.stage<kind = mask, group = 0>, {{.*}}, #moe.stage<kind = sum, group = 0>, #moe.stage<kind = mask, group = 1>, {{.*}}, #moe.stage<kind = sum, group = 1>]]
func.func @prefill(%q: tensor<4x2048x16x128xbf16>, %k: tensor<4x2048x16x128xbf16>, %v: tensor<4x2048x16x128xbf16>) -> tensor<4x2048x16x128xbf16> {
  %o = moe.attention %q, %k, %v {causal} : (tensor<4x2048x16x128xbf16>, tensor<4x2048x16x128xbf16>, tensor<4x2048x16x128xbf16>) -> tensor<4x2048x16x128xbf16>
  return %o : tensor<4x2048x16x128xbf16>
}

// -----

// Decode, one query against 8192 keys, GQA 8:1: 4 x 8 row tiles would
// leave most of 132 multiprocessors idle, so the keys are cut into 4
// ranges (128 blocks, the fewest within 10% of whole waves); head
// size 256 takes tiles of 64 keys; a given scale is kept.
// CHECK-LABEL: func @decode
// CHECK: moe.tiled_attention {{.*}}kv_splits = 4 : i64, scale = 5.000000e-02 : f32{{.*}}tile_n = 64 : i64}
func.func @decode(%q: tensor<4x1x64x256xbf16>, %k: tensor<4x8192x8x256xbf16>, %v: tensor<4x8192x8x256xbf16>) -> tensor<4x1x64x256xbf16> {
  %o = moe.attention %q, %k, %v {scale = 0.05 : f32} : (tensor<4x1x64x256xbf16>, tensor<4x8192x8x256xbf16>, tensor<4x8192x8x256xbf16>) -> tensor<4x1x64x256xbf16>
  return %o : tensor<4x1x64x256xbf16>
}

// -----

// A dynamic batch keeps one key range.
// CHECK-LABEL: func @dynamic
// CHECK: moe.tiled_attention {{.*}}kv_splits = 1 : i64
func.func @dynamic(%q: tensor<?x1x8x64xbf16>, %k: tensor<?x4096x8x64xbf16>, %v: tensor<?x4096x8x64xbf16>) -> tensor<?x1x8x64xbf16> {
  %o = moe.attention %q, %k, %v : (tensor<?x1x8x64xbf16>, tensor<?x4096x8x64xbf16>, tensor<?x4096x8x64xbf16>) -> tensor<?x1x8x64xbf16>
  return %o : tensor<?x1x8x64xbf16>
}

// -----

// The verifier checks a schedule's order: here group 0's pv would read P
// in the slot its exp computes it.
func.func @bad_order(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16> {
  // expected-error @below {{schedule runs pv of row group 0 before the exp it reads}}
  %o = moe.tiled_attention %q, %k, %v {groups = 1 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 64 : i64, schedule = [[#moe.stage<kind = qk, group = 0>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>, #moe.stage<kind = pv, group = 0>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16>
  return %o : tensor<1x64x1x64xbf16>
}

// -----

func.func @missing_stage(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16> {
  // expected-error @below {{schedule has no sum stage for row group 0}}
  %o = moe.tiled_attention %q, %k, %v {groups = 1 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 64 : i64, schedule = [[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16>
  return %o : tensor<1x64x1x64xbf16>
}

// -----

func.func @rescale_too_early(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16> {
  // expected-error @below {{schedule rescales row group 0's output before pv of the previous tile}}
  %o = moe.tiled_attention %q, %k, %v {groups = 1 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 64 : i64, schedule = [[#moe.stage<kind = qk, group = 0>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>], [], [#moe.stage<kind = pv, group = 0, tile = -1>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16>
  return %o : tensor<1x64x1x64xbf16>
}

// -----

func.func @bad_group(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16> {
  // expected-error @below {{schedule slot 0 names row group 3, but there are 2}}
  %o = moe.tiled_attention %q, %k, %v {groups = 2 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 64 : i64, schedule = [[#moe.stage<kind = qk, group = 3>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16>
  return %o : tensor<1x64x1x64xbf16>
}
