// RUN: moe-opt %s --split-input-file --moe-configure-matmuls | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-configure-matmuls="matmul-config=tile=128x256x64,stages=3,raster=n,group=4,persistent=false,epilogue=registers" | FileCheck %s --check-prefix=PIN
// RUN: not moe-opt %s --moe-configure-matmuls="matmul-config=tiles=128x256" 2>&1 | FileCheck %s --check-prefix=KEY
// RUN: not moe-opt %s --moe-configure-matmuls="matmul-config=raster=diagonal" 2>&1 | FileCheck %s --check-prefix=ENUM
// RUN: not moe-opt %s --moe-configure-matmuls="matmul-config=tile=128" 2>&1 | FileCheck %s --check-prefix=DIMS
// RUN: not moe-opt %s --moe-configure-matmuls="matmul-config=stages=-1" 2>&1 | FileCheck %s --check-prefix=COUNT
// RUN: not moe-opt %s --moe-configure-matmuls="matmul-config=tile=0x256" 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not moe-opt %s --split-input-file --moe-configure-matmuls="matmul-config=multicast=rhs" 2>&1 | FileCheck %s --check-prefix=MULTICAST
// RUN: moe-opt %s --split-input-file --moe-configure-matmuls="matmul-config=split-k=2" -verify-diagnostics -o /dev/null

// KEY: matmul-config has no field 'tiles'
// ENUM: matmul-config raster has no value 'diagonal'
// DIMS: matmul-config tile takes MxN or MxNxK, not '128'
// COUNT: matmul-config stages must be a count of at least 1, not '-1'
// ZERO: matmul-config tile must be a count of at least 1, not '0'
// MULTICAST: 'moe.grouped_matmul' op matmul_config multicast needs a cluster of more than one block

// DeepSeek-V3's up matmul on one expert-parallel shard (32 experts, K =
// 7168): one configuration for any token count, then one per bucket. Any
// count: 128 x 256 tiles of 64 bf16 a stage, four stages beside the
// epilogue's buffers, persistent (more tiles than multiprocessors). One
// token takes the decode tile: 8 rows as wgmma's N, 128 weight rows, six
// 17 KiB stages (two blocks a multiprocessor), and its 32 column tiles
// split K five ways to fill 132 multiprocessors. 128 tokens give an expert
// 4 rows on average: still the decode tile, 64 rows (one row tile an
// expert), no split. Pinning the tile keeps the wide one for every bucket.
// CHECK-LABEL: func.func @dsv3_up
// CHECK: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, persistent = true, epilogue = shared>,
// CHECK-SAME: #moe.matmul_config<tokens = 1, tile_m = 8, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, split_k = 5, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 128, tile_m = 64, tile_n = 128, tile_k = 64, stages = 4, warpgroups = 1, swap_ab = true>]
// PIN-LABEL: func.func @dsv3_up
// PIN: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 3, raster = n, group = 4>,
// PIN-SAME: #moe.matmul_config<tokens = 1, tile_m = 128, tile_n = 256, tile_k = 64, stages = 3, raster = n, group = 4, split_k = 3>,
func.func @dsv3_up(%a: tensor<?x7168xbf16>, %b: tensor<32x4096x7168xbf16>,
                   %c: tensor<32xi32>, %o: tensor<33xi32>)
    -> tensor<?x4096xbf16> attributes {moe.token_buckets = array<i64: 1, 128>} {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o)
      : (tensor<?x7168xbf16>, tensor<32x4096x7168xbf16>, tensor<32xi32>,
         tensor<33xi32>) -> tensor<?x4096xbf16>
  return %0 : tensor<?x4096xbf16>
}

// -----

// Mixtral's down matmul: K = 14336 and 4096 x 14336 weights an expert, so
// blocks launched in order (not persistent) keep a wave's weights in L2.
// CHECK-LABEL: func.func @mixtral_down
// CHECK: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, epilogue = shared>]
func.func @mixtral_down(%a: tensor<?x14336xbf16>, %b: tensor<8x4096x14336xbf16>,
                        %c: tensor<8xi32>, %o: tensor<9xi32>)
    -> tensor<?x4096xbf16> {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o)
      : (tensor<?x14336xbf16>, tensor<8x4096x14336xbf16>, tensor<8xi32>,
         tensor<9xi32>) -> tensor<?x4096xbf16>
  return %0 : tensor<?x4096xbf16>
}

// -----

// Qwen3-30B-A3B's gate/up matmul in MXFP8 after its dispatch (top-8 of
// 128 experts): 64 codes a stage, which the consumers convert into two
// bf16 stages (96 KiB), each with 2 x 256 f32 column scales and 2 x 128
// E8M0 row scales staged in shared memory, which leaves room for four
// stages; K = 2048 is 32 stages, short enough to run persistent. The
// decode tile takes 128 codes a stage. At 8 tokens the dispatch
// brings 64 rows (8 x top-8) to at most 64 experts, at most 8 rows each:
// decode tiles of 8 rows and 64 gate with their 64 up rows, 12 column
// tiles an expert, which fill the GPU with K whole.
// CHECK-LABEL: func.func @qwen3_up
// CHECK: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, persistent = true, epilogue = shared>,
// CHECK-SAME: #moe.matmul_config<tokens = 8, tile_m = 8, tile_n = 128, tile_k = 128, stages = 6, warpgroups = 1, swap_ab = true>]
func.func @qwen3_up(%x: tensor<?x2048xbf16>, %ids: tensor<?x8xi32>,
                    %b: tensor<128x1536x2048xf8E4M3FN>,
                    %sb: tensor<128x1536x64xf8E8M0FNU>)
    -> tensor<?x768xbf16> attributes {moe.token_buckets = array<i64: 8>} {
  %d, %counts, %offsets, %rows, %sa = moe.dispatch %x, %ids
      {quant = #moe.quant<kind = mxfp8>}
      : (tensor<?x2048xbf16>, tensor<?x8xi32>)
      -> (tensor<?x2048xf8E4M3FN>, tensor<128xi32>, tensor<129xi32>,
          tensor<?x8xi32>, tensor<?x64xf8E8M0FNU>)
  %0 = moe.grouped_matmul %d, %b groups(%counts, %offsets) scales(%sa, %sb)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x2048xf8E4M3FN>, tensor<128x1536x2048xf8E4M3FN>,
         tensor<128xi32>, tensor<129xi32>, tensor<?x64xf8E8M0FNU>,
         tensor<128x1536x64xf8E8M0FNU>) -> tensor<?x768xbf16>
  return %0 : tensor<?x768xbf16>
}

// -----

// A gated matmul whose epilogue quantizes its output stores from
// registers; an output of 100 columns cannot take 16-byte row pieces.
// The registers epilogue is the default, which the config does not print.
// CHECK-LABEL: func.func @epilogues
// CHECK: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>]
// CHECK: configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>]
func.func @epilogues(%a: tensor<?x128xbf16>, %b: tensor<4x512x128xbf16>,
                     %c: tensor<4xi32>, %o: tensor<5xi32>,
                     %b2: tensor<4x100x128xbf16>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x100xbf16>) {
  %0, %s = moe.grouped_matmul %a, %b groups(%c, %o)
      {activation = #moe.activation<kind = swiglu>,
       out_quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x128xbf16>, tensor<4x512x128xbf16>, tensor<4xi32>,
         tensor<5xi32>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  %1 = moe.grouped_matmul %a, %b2 groups(%c, %o)
      : (tensor<?x128xbf16>, tensor<4x100x128xbf16>, tensor<4xi32>,
         tensor<5xi32>) -> tensor<?x100xbf16>
  return %0, %s, %1 : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x100xbf16>
}

// -----

// Decode tiles of an FP8 block-128 gate/up that quantizes its output in
// blocks of 128: a tile holds a whole block, 128 gate and 128 up rows (four
// fragments). At one token (a row, one expert) its 6 column tiles split K
// four ways, each split 4 of K's 16 stages. At 64 tokens an expert may get
// 64 rows, but four fragments' accumulators, FP8 partials, scale products
// and scales fit 128 registers only at 16 rows (108): four tiles take an
// expert's 64. 128 tokens give an expert one row on average (a row a token
// here): the decode tile too.
// CHECK-LABEL: func.func @fp8_decode
// CHECK: #moe.matmul_config<tokens = 1, tile_m = 8, tile_n = 256, tile_k = 128, stages = 3, warpgroups = 1, split_k = 4, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 64, tile_m = 16, tile_n = 256, tile_k = 128, stages = 3, warpgroups = 1, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 128, tile_m = 16, tile_n = 256, tile_k = 128, stages = 3, warpgroups = 1, swap_ab = true>]
func.func @fp8_decode(%x: tensor<?x2048xf8E4M3FN>, %sx: tensor<?x16xf32>,
                      %b: tensor<128x1536x2048xf8E4M3FN>,
                      %sb: tensor<128x12x16xf32>, %c: tensor<128xi32>,
                      %o: tensor<129xi32>)
    -> (tensor<?x768xf8E4M3FN>, tensor<?x6xf32>)
    attributes {moe.token_buckets = array<i64: 1, 64, 128>} {
  %0, %s = moe.grouped_matmul %x, %b groups(%c, %o) scales(%sx, %sb)
      {activation = #moe.activation<kind = swiglu>,
       out_quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x2048xf8E4M3FN>, tensor<128x1536x2048xf8E4M3FN>,
         tensor<128xi32>, tensor<129xi32>, tensor<?x16xf32>,
         tensor<128x12x16xf32>) -> (tensor<?x768xf8E4M3FN>, tensor<?x6xf32>)
  return %0, %s : tensor<?x768xf8E4M3FN>, tensor<?x6xf32>
}

// -----

// Rows other ranks send take the decode tile whole in a decode bucket (the
// partials of a split would be sized for every rank's capacity): a split-k
// pin is left out there, and the pass says so.
// CHECK-LABEL: func.func @received
// CHECK: #moe.matmul_config<tokens = 1, tile_m = 8, tile_n = 128, tile_k = 64, stages = 4, warpgroups = 1, swap_ab = true>
func.func @received(%x: tensor<?x256xbf16>, %ids: tensor<?x2xi32>,
                    %b: tensor<2x512x256xbf16>) -> tensor<?x512xbf16>
    attributes {moe.token_buckets = array<i64: 1, 128>} {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64}
      : (tensor<?x256xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent
      : (tensor<2xi32>) -> (tensor<?x256xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  // expected-remark @+1 {{matmul-config split-k=2 is not applied to the rows other ranks send in buckets of at most 64 tokens: their partials would be sized for every rank's capacity}}
  %y = moe.grouped_matmul %d, %b groups(%c, %o)
      : (tensor<?x256xbf16>, tensor<2x512x256xbf16>, tensor<2xi32>,
         tensor<3xi32>) -> tensor<?x512xbf16>
  return %y : tensor<?x512xbf16>
}

// -----

// Above 64 tokens the decode tile serves a bucket while an expert has at
// most 32 rows on average and a weight tile takes at most two row tiles:
// 8 experts at 128 tokens (16 rows each, one tile of 64) take it, at 512
// (64 rows each) the wide tile. A dense matmul whose wide tiles leave the
// GPU idle takes it up to eight row tiles a weight tile: 512 bf16 rows
// are eight tiles of 64 (16 column tiles of 256 are 16 wide tiles a row
// tile); 1024 tokens are past the decode tile's reach.
// CHECK-LABEL: func.func @decode_reach
// CHECK: #moe.matmul_config<tokens = 128, tile_m = 64, tile_n = 128, tile_k = 64, stages = 4, warpgroups = 1, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 512, tile_m = 128, tile_n = 256,
// CHECK: #moe.matmul_config<tokens = 128, tile_m = 64, tile_n = 128, tile_k = 64, stages = 4, warpgroups = 1, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 512, tile_m = 64, tile_n = 128, tile_k = 64, stages = 4, warpgroups = 1, swap_ab = true>,
// CHECK-SAME: #moe.matmul_config<tokens = 1024, tile_m = 128, tile_n = 256,
func.func @decode_reach(%x: tensor<?x1024xbf16>, %b: tensor<8x4096x1024xbf16>,
                        %c: tensor<8xi32>, %o: tensor<9xi32>,
                        %w: tensor<4096x1024xbf16>)
    -> (tensor<?x4096xbf16>, tensor<?x4096xbf16>)
    attributes {moe.token_buckets = array<i64: 128, 512, 1024>} {
  %0 = moe.grouped_matmul %x, %b groups(%c, %o)
      : (tensor<?x1024xbf16>, tensor<8x4096x1024xbf16>, tensor<8xi32>,
         tensor<9xi32>) -> tensor<?x4096xbf16>
  %1 = moe.grouped_matmul %x, %w
      : (tensor<?x1024xbf16>, tensor<4096x1024xbf16>) -> tensor<?x4096xbf16>
  return %0, %1 : tensor<?x4096xbf16>, tensor<?x4096xbf16>
}

// -----

// A shared expert's rows are the tokens themselves, quantized by the
// dispatch beside the dispatched rows (its second and third quantized
// results): 128 rows at 128 tokens, not 128 x 8. Four row tiles of 32 (FP8
// accumulators, partials and scale products fit 128 registers at 32 rows)
// read each weight tile, and the wide tiles (two columns) would leave the
// GPU idle: the decode tile.
// CHECK-LABEL: func.func @shared_rows
// CHECK: #moe.matmul_config<tokens = 128, tile_m = 32, tile_n = 128, tile_k = 128, stages = 2, warpgroups = 1, swap_ab = true>]
func.func @shared_rows(%x: tensor<?x256xbf16>, %ids: tensor<?x8xi32>,
                       %w: tensor<512x256xf8E4M3FN>, %ws: tensor<4x2xf32>)
    -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 128>} {
  %d, %c, %o, %rows, %q:3 = moe.dispatch %x, %ids
      {quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>, tensor<?x8xi32>)
      -> (tensor<?x256xf8E4M3FN>, tensor<16xi32>, tensor<17xi32>,
          tensor<?x8xi32>, tensor<?x2xf32>, tensor<?x256xf8E4M3FN>,
          tensor<?x2xf32>)
  %s = moe.grouped_matmul %q#1, %w scales(%q#2, %ws)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x256xf8E4M3FN>, tensor<512x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<4x2xf32>) -> tensor<?x256xbf16>
  return %s : tensor<?x256xbf16>
}
