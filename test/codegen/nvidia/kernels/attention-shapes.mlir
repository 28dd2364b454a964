// RUN: moe-opt %s -split-input-file --moe-split-attention --moe-build-kernels -verify-diagnostics | FileCheck %s

// Decode: one position, 8 query heads per key/value head (one row tile of
// 8 rows), 4096 keys. 4 x 4 row tiles would leave the GPU idle, so the keys
// are cut into 8 ranges (moe-split-attention; 128 tiles): each writes f32
// partial rows ([8 x 128 rows, 128]) and their max and sum to the workspace,
// and moe_attention_merge (a block per row, a thread per column) combines
// them into the output.
// CHECK-LABEL: func.func @decode
// CHECK-SAME: #moe.buffer<bytes = 524288>, #moe.buffer<bytes = 8192, offset = 524288>
// CHECK-SAME: #moe.launch<kernel = @moe_attention, work = 128, block = 384, shared_bytes = 197632, args = [buffer 4, buffer 5, tensor_map 0, tensor_map 1, tensor_map 2, tokens], persistent = true>
// CHECK-SAME: #moe.launch<kernel = @moe_attention_merge, work = 128, block = 128, args = [buffer 4, buffer 5, buffer 3, tokens]>
// CHECK: gpu.func @moe_attention(
// CHECK: gpu.func @moe_attention_merge(
func.func @decode(%q: tensor<4x1x32x128xbf16>, %k: tensor<4x4096x4x128xbf16>, %v: tensor<4x4096x4x128xbf16>) -> tensor<4x1x32x128xbf16> {
  %o = moe.attention %q, %k, %v : (tensor<4x1x32x128xbf16>, tensor<4x4096x4x128xbf16>, tensor<4x4096x4x128xbf16>) -> tensor<4x1x32x128xbf16>
  return %o : tensor<4x1x32x128xbf16>
}

// -----

func.func @head_96(%q: tensor<1x64x2x96xbf16>, %k: tensor<1x64x2x96xbf16>, %v: tensor<1x64x2x96xbf16>) -> tensor<1x64x2x96xbf16> {
  // expected-error @below {{has head size 96: the sm_90a kernel takes 64, 128, 192 or 256 (whole 128-byte rows for TMA's swizzle, at most wgmma's N of 256)}}
  %o = moe.attention %q, %k, %v : (tensor<1x64x2x96xbf16>, tensor<1x64x2x96xbf16>, tensor<1x64x2x96xbf16>) -> tensor<1x64x2x96xbf16>
  return %o : tensor<1x64x2x96xbf16>
}

// -----

func.func @dynamic_batch(%q: tensor<?x64x2x64xbf16>, %k: tensor<?x64x2x64xbf16>, %v: tensor<?x64x2x64xbf16>) -> tensor<?x64x2x64xbf16> {
  // expected-error @below {{has a dynamic batch in 'query': the sm_90a attention kernel takes static shapes}}
  %o = moe.attention %q, %k, %v : (tensor<?x64x2x64xbf16>, tensor<?x64x2x64xbf16>, tensor<?x64x2x64xbf16>) -> tensor<?x64x2x64xbf16>
  return %o : tensor<?x64x2x64xbf16>
}

// -----

// Key tiles of 128 with a value head size of 256: S and O would take 192
// registers a thread.
func.func @registers(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x256xbf16>) -> tensor<1x64x1x256xbf16> {
  // expected-error @below {{has key tiles of 128 with value head size 256: S and O would not fit a thread's registers; use tile-n=64}}
  %o = moe.tiled_attention %q, %k, %v {groups = 2 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 128 : i64, schedule = [[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>, #moe.stage<kind = qk, group = 1>, #moe.stage<kind = pv, group = 1, tile = -1>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>, #moe.stage<kind = mask, group = 1>, #moe.stage<kind = max, group = 1>, #moe.stage<kind = exp, group = 1>, #moe.stage<kind = rescale, group = 1>, #moe.stage<kind = sum, group = 1>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x256xbf16>) -> tensor<1x64x1x256xbf16>
  return %o : tensor<1x64x1x256xbf16>
}

// -----

// One row group: a warpgroup of the kernel would sit idle.
func.func @one_group(%q: tensor<1x64x1x64xbf16>, %k: tensor<1x64x1x64xbf16>, %v: tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16> {
  // expected-error @below {{has row groups of 64 x 1: the sm_90a kernel runs two groups of 64 rows (one warpgroup each)}}
  %o = moe.tiled_attention %q, %k, %v {groups = 1 : i64, kv_splits = 1 : i64, scale = 0.125 : f32, tile_m = 64 : i64, tile_n = 64 : i64, schedule = [[#moe.stage<kind = qk, group = 0>, #moe.stage<kind = pv, group = 0, tile = -1>], [#moe.stage<kind = mask, group = 0>, #moe.stage<kind = max, group = 0>, #moe.stage<kind = exp, group = 0>, #moe.stage<kind = rescale, group = 0>, #moe.stage<kind = sum, group = 0>]]} : (tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x64xbf16>) -> tensor<1x64x1x64xbf16>
  return %o : tensor<1x64x1x64xbf16>
}
