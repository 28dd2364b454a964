// RUN: moe-opt %s --split-input-file --moe-build-kernels --verify-diagnostics

// The sm_90a matmul builds what its #moe.matmul_config says, and refuses,
// naming the field, what it cannot honour.

func.func @cluster(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config cluster_m = 4, which the sm_90a kernel cannot honour: its clusters are of one or two blocks}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, cluster_m = 4, multicast = rhs>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @cluster_n(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config cluster_n = 2, which the sm_90a kernel cannot honour: its clusters share the weight tile, along M alone}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, cluster_n = 2, multicast = lhs>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @multicast(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config multicast = lhs, which the sm_90a kernel cannot honour: a cluster's blocks share the weight tile: multicast is rhs}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, cluster_m = 2, multicast = lhs>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @cluster_split(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config cluster_m = 2, which the sm_90a kernel cannot honour: a cluster's blocks walk whole K, not split_k ranges}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, cluster_m = 2, multicast = rhs, split_k = 2>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @tile(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config tile_n = 128, which the sm_90a kernel cannot honour: it takes tiles of 256 weight rows}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 128, tile_k = 64, stages = 4>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @tile_k(%a: tensor<?x256xf8E4M3FN>, %b: tensor<256x256xf8E4M3FN>,
                  %sa: tensor<?x2xf32>, %sb: tensor<2x2xf32>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config tile_k = 64, which the sm_90a kernel cannot honour: it takes 128 bytes of K a stage (128 elements)}}
  %0 = moe.grouped_matmul %a, %b scales(%sa, %sb) {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>]}
      : (tensor<?x256xf8E4M3FN>, tensor<256x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<2x2xf32>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @stages(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config stages = 5, which the sm_90a kernel cannot honour: the ring, its barriers and the buffers need 263248 bytes of shared memory, more than the 232448 a block may have}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 5, epilogue = shared>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @split(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config split_k = 2, which the sm_90a kernel cannot honour: splitting K needs a bucket's bound on the rows}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, split_k = 2>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @epilogue(%a: tensor<?x64xbf16>, %b: tensor<100x64xbf16>)
    -> tensor<?x100xbf16> {
  // expected-error @below {{has matmul_config epilogue = shared, which the sm_90a kernel cannot honour: its 16-byte stores need output rows of a multiple of 8 columns, and N is 100}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, epilogue = shared>]}
      : (tensor<?x64xbf16>, tensor<100x64xbf16>) -> tensor<?x100xbf16>
  return %0 : tensor<?x100xbf16>
}

// -----

func.func @missing(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 4>} {
  // expected-error @below {{has no matmul_config for calls of 4 tokens (run moe-configure-matmuls)}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @twice(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has two kernel configurations for calls of 0 tokens}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>, #moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 2>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @decode_rows(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 1>} {
  // expected-error @below {{has matmul_config tile_m = 12, which the sm_90a decode tile (swap_ab) cannot honour: its rows are wgmma's N: 8 to 64, a multiple of 8}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>, #moe.matmul_config<tokens = 1, tile_m = 12, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @decode_fragments(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x128xbf16> attributes {moe.token_buckets = array<i64: 1>} {
  // expected-error @below {{has matmul_config tile_n = 64, which the sm_90a decode tile (swap_ab) cannot honour: it takes 64-row weight fragments, at most 4, as many gate as up}}
  %0 = moe.grouped_matmul %a, %b {activation = #moe.activation<kind = swiglu>, configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>, #moe.matmul_config<tokens = 1, tile_m = 8, tile_n = 64, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x128xbf16>
  return %0 : tensor<?x128xbf16>
}

// -----

func.func @decode_registers(%x: tensor<?x256xf8E4M3FN>, %sx: tensor<?x2xf32>,
                            %b: tensor<256x256xf8E4M3FN>, %sb: tensor<2x2xf32>)
    -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 64>} {
  // expected-error @below {{has matmul_config tile_m = 64, which the sm_90a decode tile (swap_ab) cannot honour: its accumulators, FP8 partials, scale products and a stage's scales would take 408 registers a thread, more than 128}}
  %0 = moe.grouped_matmul %x, %b scales(%sx, %sb) {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 128, stages = 4>, #moe.matmul_config<tokens = 64, tile_m = 64, tile_n = 256, tile_k = 128, stages = 3, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x256xf8E4M3FN>, tensor<256x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<2x2xf32>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @decode_any(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config swap_ab = true, which the sm_90a decode tile (swap_ab) cannot honour: a decode tile needs a bucket's bound on the rows}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 8, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

func.func @one_stage(%a: tensor<?x64xbf16>, %b: tensor<256x64xbf16>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config stages = 1, which the sm_90a kernel cannot honour: a stage's slot is released while the next is multiplied: the ring needs two}}
  %0 = moe.grouped_matmul %a, %b {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 1>]}
      : (tensor<?x64xbf16>, tensor<256x64xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

// An activation's backward as the epilogue stages h through shared memory.
func.func @activation_grad_registers(%dy: tensor<?x64xbf16>,
    %w2: tensor<4x64x128xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>,
    %h: tensor<?x256xbf16>) -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config epilogue = registers, which the sm_90a kernel cannot honour: an activation's backward stages its input's rows in shared memory}}
  %0 = moe.grouped_matmul %dy, %w2 groups(%c, %o) activation_input %h {activation = #moe.activation<kind = swiglu>, transpose_rhs, configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, epilogue = registers>]}
      : (tensor<?x64xbf16>, tensor<4x64x128xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x256xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

// MXFP8 takes 128 codes a stage (promoted per scale block) or 64, which the
// consumers convert to bf16; any other tile_k is refused.
func.func @mx_tile_k(%a: tensor<?x256xf8E4M3FN>, %b: tensor<256x256xf8E4M3FN>,
                     %sa: tensor<?x8xf8E8M0FNU>, %sb: tensor<256x8xf8E8M0FNU>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config tile_k = 32, which the sm_90a kernel cannot honour: it takes 128 bytes of K a stage (128 elements), or 64 MXFP8 codes that it converts to bf16}}
  %0 = moe.grouped_matmul %a, %b scales(%sa, %sb) {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 32, stages = 4>]}
      : (tensor<?x256xf8E4M3FN>, tensor<256x256xf8E4M3FN>, tensor<?x8xf8E8M0FNU>,
         tensor<256x8xf8E8M0FNU>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

// Converted codes are read by the block that loaded them: no clusters.
func.func @mx_cluster(%a: tensor<?x256xf8E4M3FN>, %b: tensor<256x256xf8E4M3FN>,
                      %sa: tensor<?x8xf8E8M0FNU>, %sb: tensor<256x8xf8E8M0FNU>)
    -> tensor<?x256xbf16> {
  // expected-error @below {{has matmul_config cluster_m = 2, which the sm_90a kernel cannot honour: MXFP8 codes converted to bf16 (tile_k = 64) take one block's ring}}
  %0 = moe.grouped_matmul %a, %b scales(%sa, %sb) {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 2, cluster_m = 2, multicast = rhs>]}
      : (tensor<?x256xf8E4M3FN>, tensor<256x256xf8E4M3FN>, tensor<?x8xf8E8M0FNU>,
         tensor<256x8xf8E8M0FNU>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}
