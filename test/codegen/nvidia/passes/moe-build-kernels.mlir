// RUN: moe-opt %s --moe-configure-matmuls --moe-build-kernels --split-input-file --verify-diagnostics | FileCheck %s

// A decomposed layer: one kernel per family (dispatch takes two), named after
// the family and the step moe-decompose named; the launch plan lists the
// caller's buffers (inputs, then the output), the workspace slices in
// order, the TMA descriptors of each matmul and the launches in stream order.
// CHECK-LABEL: func.func @layer
// CHECK-SAME: moe.launch_plan = #moe.launch_plan<buffers = [#moe.buffer<kind = argument>, #moe.buffer<kind = argument, index = 1>, #moe.buffer<kind = argument, index = 2>, #moe.buffer<kind = argument, index = 3>, #moe.buffer<kind = argument, index = 4>,
// Slices whose launches do not overlap share bytes: the expert ids (live
// through the dispatch plan), the dispatched rows (scatter to gate/up) and
// the down matmul's output (down to combine) all start at 0; the route's
// partial sums (product to select, 8 experts' f32 a token) and the
// dispatch's rows (plan to combine) both at 512 * T.
// CHECK-SAME: #moe.buffer<bytes = 8 * T>, #moe.buffer<bytes = 8 * T, offset = 256 * T>, #moe.buffer<bytes = 32 * T, offset = 512 * T>, #moe.buffer<bytes = 32, offset = 1024 * T>, #moe.buffer<bytes = 36, offset = 256 + 1024 * T>, #moe.buffer<bytes = 8 * T, offset = 512 * T>, #moe.buffer<bytes = 256 * T>, #moe.buffer<bytes = 128 * T, offset = 768 * T>, #moe.buffer<bytes = 256 * T>]
// CHECK-SAME: tensor_maps = [#moe.tensor_map<buffer = 11, element_bytes = 2, rows = 2 * T, cols = 64, box_rows = 128, box_cols = 64>, #moe.tensor_map<buffer = 2, element_bytes = 2, rows = 512, cols = 64, box_rows = 128, box_cols = 64>, #moe.tensor_map<buffer = 12, element_bytes = 2, rows = 2 * T, cols = 32, box_rows = 128, box_cols = 64>, #moe.tensor_map<buffer = 3, element_bytes = 2, rows = 512, cols = 32, box_rows = 128, box_cols = 64>]
// The route of bf16 rows is two kernels: the product on tensor cores into
// the workspace, then a warp per token choosing.
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route_product, work = 1 * T, per_block = 64, block = 256, shared_bytes = 41984, args = [buffer 0, buffer 1, buffer 7, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_route_select, work = 1 * T, per_block = 8, block = 256, args = [buffer 7, buffer 5, buffer 6, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_dispatch_plan, work = 1, block = 1024, args = [buffer 5, buffer 8, buffer 9, buffer 10, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_dispatch_scatter, work = 1 * T, block = 128, args = [buffer 0, buffer 10, buffer 11, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_grouped_matmul_gate_up, work = 2 * T, per_block = 128, extra_blocks = 8, block = 384, shared_bytes = 214016, args = [buffer 12, buffer 8, buffer 9, tensor_map 0, tensor_map 1, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_grouped_matmul_down, work = 2 * T, per_block = 128, extra_blocks = 8, block = 384, shared_bytes = 214016, args = [buffer 13, buffer 8, buffer 9, tensor_map 2, tensor_map 3, tokens]>,
// CHECK-SAME: #moe.launch<kernel = @moe_combine, work = 1 * T, block = 128, args = [buffer 13, buffer 10, buffer 4, buffer 6, tokens]>]>
// The function itself is untouched: the host code reads only its plan.
// CHECK: moe.route
// CHECK: moe.combine
// CHECK: gpu.module @layer_kernels
// Each kernel is launched as a programmatic dependent of the one before it:
// it waits for that one before its first memory access (the token count),
// and signals its own dependents only by exiting.
// CHECK: gpu.func @moe_route_product(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) kernel
// CHECK-NEXT: nvvm.griddepcontrol wait
// CHECK-NEXT: llvm.load
// CHECK-NOT: launch_dependents
// CHECK: gpu.func @moe_route_select(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) workgroup({{.*}}llvm.align = 16
// CHECK-SAME: kernel
// CHECK-NEXT: nvvm.griddepcontrol wait
// CHECK-NEXT: llvm.load
// CHECK-NOT: launch_dependents
// CHECK: gpu.func @moe_dispatch_plan(
// CHECK-NEXT: nvvm.griddepcontrol wait
// CHECK: gpu.func @moe_dispatch_scatter(
// CHECK: gpu.func @moe_grouped_matmul_gate_up({{.*}}) kernel attributes {known_block_size = array<i32: 384, 1, 1>, moe.tensor_map_args = array<i64: 3, 4>}
// CHECK: gpu.func @moe_grouped_matmul_down(
// CHECK: gpu.func @moe_combine(
#loc = loc("layer.mlir":1:1)
func.func @layer(%hidden: tensor<?x64xbf16>, %router: tensor<8x64xbf16>,
                 %w13: tensor<8x64x64xbf16>, %w2: tensor<8x64x32xbf16>)
    -> tensor<?x64xbf16> {
  %ids, %weights = moe.route %hidden, %router {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<8x64xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>) loc(#route)
  %dispatched, %counts, %offsets, %rows = moe.dispatch %hidden, %ids
      : (tensor<?x64xbf16>, tensor<?x2xi32>)
      -> (tensor<?x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>) loc(#dispatch)
  %0 = moe.grouped_matmul %dispatched, %w13 groups(%counts, %offsets)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>, tensor<8x64x64xbf16>, tensor<8xi32>, tensor<9xi32>)
      -> tensor<?x32xbf16> loc(#gate_up)
  %1 = moe.grouped_matmul %0, %w2 groups(%counts, %offsets)
      : (tensor<?x32xbf16>, tensor<8x64x32xbf16>, tensor<8xi32>, tensor<9xi32>)
      -> tensor<?x64xbf16> loc(#down)
  %2 = moe.combine %1, %rows weights %weights
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x64xbf16> loc(#combine)
  return %2 : tensor<?x64xbf16>
}
#route = loc("route"(#loc))
#dispatch = loc("dispatch"(#loc))
#gate_up = loc("gate_up"(#loc))
#down = loc("down"(#loc))
#combine = loc("combine"(#loc))

// -----

// Unnamed ops give plain family names, made unique in the module.
// CHECK-LABEL: func.func @dense
// CHECK-SAME: kernel = @moe_matmul,
// CHECK-SAME: kernel = @moe_matmul_1,
// CHECK: gpu.func @moe_matmul(
// CHECK: gpu.func @moe_matmul_1(
func.func @dense(%x: tensor<?x64xbf16>, %w1: tensor<96x64xbf16>,
                 %w2: tensor<64x48xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.grouped_matmul %x, %w1 {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>, tensor<96x64xbf16>) -> tensor<?x48xbf16>
  %1 = moe.grouped_matmul %0, %w2 : (tensor<?x48xbf16>, tensor<64x48xbf16>) -> tensor<?x64xbf16>
  return %1 : tensor<?x64xbf16>
}

// -----

func.func @undecomposed(%hidden: tensor<?x64xbf16>, %router: tensor<8x64xbf16>,
                        %w13: tensor<8x64x64xbf16>, %w2: tensor<8x64x32xbf16>)
    -> tensor<?x64xbf16> {
  // expected-error @+1 {{must be decomposed first (run moe-decompose)}}
  %0 = moe.layer %hidden router(%router) experts(%w13, %w2)
      {config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x64xbf16>, tensor<8x64xbf16>, tensor<8x64x64xbf16>, tensor<8x64x32xbf16>)
      -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// TMA reads rows of 16-byte multiples.
func.func @odd_k(%x: tensor<?x100xbf16>, %w: tensor<64x100xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{has K = 100 (the length of the rows it multiplies): sm_90a loads the operands with TMA, whose rows must be a multiple of 16 bytes, so K must be a multiple of 8}}
  %0 = moe.grouped_matmul %x, %w : (tensor<?x100xbf16>, tensor<64x100xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// A choosing warp keeps its token's scratch in shared memory: scores,
// choice keys and taken flags (9 bytes an expert) and the chosen weights.
// The select kernel takes as many warps a block as fit in 48 KiB, down to
// one: 5456 experts fit (49120 bytes), one more does not.
// CHECK-LABEL: func.func @most_experts
// CHECK-SAME: #moe.launch<kernel = @moe_route_select, work = 1 * T, block = 32,
// CHECK: gpu.func @moe_route_select({{.*}}) workgroup(%{{.*}} : memref<1x5456xf32, #gpu.address_space<workgroup>>
func.func @most_experts(%hidden: tensor<?x64xbf16>, %router: tensor<5456x64xbf16>)
    -> (tensor<?x2xi32>, tensor<?x2xf32>) {
  %ids, %weights = moe.route %hidden, %router {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<5456x64xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return %ids, %weights : tensor<?x2xi32>, tensor<?x2xf32>
}

// -----

func.func @too_many_experts(%hidden: tensor<?x64xbf16>, %router: tensor<5457x64xbf16>)
    -> (tensor<?x2xi32>, tensor<?x2xf32>) {
  // expected-error @+1 {{needs 49168 bytes of shared memory in moe_route_select; a sm_90a kernel has at most 49152 without opting in}}
  %ids, %weights = moe.route %hidden, %router {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<5457x64xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return %ids, %weights : tensor<?x2xi32>, tensor<?x2xf32>
}

// -----

// A router of f32 rows routes on CUDA cores, a block per four tokens whose
// scratch must all fit: 2048 experts need 4 x (9 x 2048 + 2 x 4) bytes.
func.func @too_many_experts_f32(%hidden: tensor<?x64xbf16>, %router: tensor<2048x64xf32>)
    -> (tensor<?x2xi32>, tensor<?x2xf32>) {
  // expected-error @+1 {{needs 73760 bytes of shared memory in moe_route; a sm_90a kernel has at most 49152 without opting in}}
  %ids, %weights = moe.route %hidden, %router {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<2048x64xf32>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return %ids, %weights : tensor<?x2xi32>, tensor<?x2xf32>
}

// -----

func.func @rank1(%x: tensor<256xbf16>) -> (tensor<256xf8E4M3FN>, tensor<8xf8E8M0FNU>) {
  // expected-error @+1 {{of rank 1 has no sm_90a kernel (ranks 2 and 3 have)}}
  %data, %scales = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<256xbf16>) -> (tensor<256xf8E4M3FN>, tensor<8xf8E8M0FNU>)
  return %data, %scales : tensor<256xf8E4M3FN>, tensor<8xf8E8M0FNU>
}

// -----

// expected-error @+1 {{must return distinct values computed by moe ops}}
func.func @returns_argument(%x: tensor<?x64xbf16>, %w: tensor<64x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>) {
  %0 = moe.grouped_matmul %x, %w : (tensor<?x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  return %0, %x : tensor<?x64xbf16>, tensor<?x64xbf16>
}

// -----

// expected-error @+1 {{argument 2 may be dynamic only in its first (token) dimension}}
func.func @dynamic_hidden(%x: tensor<?x64xbf16>, %w: tensor<64x64xbf16>,
                          %unused: tensor<?x?xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.grouped_matmul %x, %w : (tensor<?x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

func.func @attention(%q: tensor<1x16x4x64xbf16>, %k: tensor<1x16x4x64xbf16>,
                     %v: tensor<1x16x4x64xbf16>) -> tensor<1x16x4x64xbf16> {
  // expected-error @+1 {{must be split first (run moe-split-attention)}}
  %0 = moe.attention %q, %k, %v
      : (tensor<1x16x4x64xbf16>, tensor<1x16x4x64xbf16>, tensor<1x16x4x64xbf16>) -> tensor<1x16x4x64xbf16>
  return %0 : tensor<1x16x4x64xbf16>
}

// -----

// expected-error @+1 {{takes only ranked tensors}}
func.func @scalar_argument(%x: tensor<?x64xbf16>, %w: tensor<64x64xbf16>, %s: f32)
    -> tensor<?x64xbf16> {
  %0 = moe.grouped_matmul %x, %w : (tensor<?x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// expected-error @+1 {{must have a single block to be lowered}}
func.func @two_blocks(%x: tensor<?x64xbf16>, %w: tensor<64x64xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.grouped_matmul %x, %w : (tensor<?x64xbf16>, tensor<64x64xbf16>) -> tensor<?x64xbf16>
  cf.br ^next
^next:
  return %0 : tensor<?x64xbf16>
}

// -----

// With token buckets, each bucket gets a plan of its own beside the plan for
// any count. A bucket of up to 512 tokens takes the router's product in
// the split form (a warp per chunk of 256 columns of 16 experts for 8
// tokens, 128 threads a block), the plan for any count in the block form
// (a block sharing each step's rows, 64 tokens of 8 experts here); with
// one chunk (hidden 64) both leave one part a token, so they share the
// choosing kernel.
// A bucket's graph encodes TMA descriptors for its size, so the caller's
// rows that a matmul reads with TMA are first copied into the workspace;
// its matmuls take the decode tile (operands swapped: a consumer warpgroup
// and a producer warp). A bucket's kernel equal to one built before is
// launched from there, not built again (bucket 128 routes with bucket 1's
// kernels; its matmuls take decode tiles of 64 rows, 32 an expert on
// average).
// CHECK-LABEL: func.func @bucketed
// CHECK-SAME: moe.bucket_plans = [#moe.launch_plan<
// CHECK-SAME: #moe.launch<kernel = @moe_route_product_1, work = 1 * T, per_block = 8, block = 128, shared_bytes = 50176,
// CHECK-SAME: #moe.launch<kernel = @moe_route_select, work = 1 * T, per_block = 8, block = 256,
// CHECK-SAME: kernel = @moe_dispatch_plan,
// CHECK-SAME: kernel = @moe_copy_rows_shared,
// CHECK-SAME: #moe.launch<kernel = @moe_matmul_shared_1, work = 1, block = 160,
// CHECK-SAME: max_tokens = 1>, #moe.launch_plan<
// CHECK-SAME: #moe.launch<kernel = @moe_route_product_1, work = 1 * T, per_block = 8, block = 128,
// CHECK-SAME: #moe.launch<kernel = @moe_route_select,
// CHECK-SAME: kernel = @moe_grouped_matmul_gate_up_2,
// CHECK-SAME: kernel = @moe_copy_rows_shared,
// CHECK-SAME: kernel = @moe_matmul_shared_2,
// CHECK-SAME: max_tokens = 128>]
// CHECK-SAME: moe.launch_plan = #moe.launch_plan<
// CHECK-NOT: copy_rows
// CHECK-SAME: #moe.launch<kernel = @moe_route_product, work = 1 * T, per_block = 64, block = 256, shared_bytes = 41984,
// CHECK-SAME: #moe.launch<kernel = @moe_route_select,
// CHECK-SAME: kernel = @moe_matmul_shared,
// CHECK-NOT: max_tokens
// CHECK-SAME: >
// CHECK: gpu.module @bucketed_kernels
// CHECK-COUNT-1: gpu.func @moe_route_product(
// CHECK-COUNT-1: gpu.func @moe_route_select(
// CHECK-COUNT-1: gpu.func @moe_route_product_1(
// CHECK-COUNT-1: gpu.func @moe_copy_rows_shared(
// CHECK-COUNT-1: gpu.func @moe_matmul_shared_1(
// CHECK-COUNT-1: gpu.func @moe_grouped_matmul_gate_up_2(
// CHECK-COUNT-1: gpu.func @moe_grouped_matmul_down_2(
// CHECK-COUNT-1: gpu.func @moe_matmul_shared_2(
// CHECK-NOT: gpu.func
func.func @bucketed(%hidden: tensor<?x64xbf16>, %router: tensor<8x64xbf16>,
                    %w13: tensor<8x64x64xbf16>, %w2: tensor<8x64x32xbf16>,
                    %s13: tensor<64x64xbf16>)
    -> tensor<?x64xbf16> attributes {moe.token_buckets = array<i64: 1, 128>} {
  %ids, %weights = moe.route %hidden, %router {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x64xbf16>, tensor<8x64xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>) loc(#route)
  %dispatched, %counts, %offsets, %rows = moe.dispatch %hidden, %ids
      : (tensor<?x64xbf16>, tensor<?x2xi32>)
      -> (tensor<?x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>) loc(#dispatch)
  %0 = moe.grouped_matmul %dispatched, %w13 groups(%counts, %offsets)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>, tensor<8x64x64xbf16>, tensor<8xi32>, tensor<9xi32>)
      -> tensor<?x32xbf16> loc(#gate_up)
  %1 = moe.grouped_matmul %0, %w2 groups(%counts, %offsets)
      : (tensor<?x32xbf16>, tensor<8x64x32xbf16>, tensor<8xi32>, tensor<9xi32>)
      -> tensor<?x64xbf16> loc(#down)
  %s = moe.grouped_matmul %hidden, %s13 {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>, tensor<64x64xbf16>) -> tensor<?x32xbf16> loc(#shared)
  %2 = moe.combine %1, %rows weights %weights
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x64xbf16> loc(#combine)
  return %2 : tensor<?x64xbf16>
}
#loc1 = loc("layer.mlir":1:1)
#route = loc("route"(#loc1))
#dispatch = loc("dispatch"(#loc1))
#gate_up = loc("gate_up"(#loc1))
#down = loc("down"(#loc1))
#shared = loc("shared"(#loc1))
#combine = loc("combine"(#loc1))

// -----

// A backward reads what its training forward saved (moe.saved, its results
// after the output) with the rows that forward gave them: the dispatched
// rows are 2 * T, not the token count a dynamic argument otherwise has.
// CHECK-LABEL: func.func @layer_train
// CHECK-LABEL: func.func @layer_backward
// CHECK: #moe.launch<kernel = @moe_activation, work = 2 * T
func.func @layer_train(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>)
    -> (tensor<?x2xi32>, tensor<?x64xbf16>)
    attributes {moe.saved = ["dispatch.dispatched"]} {
  %d, %c, %o, %r = moe.dispatch %x, %ids
      : (tensor<?x64xbf16>, tensor<?x2xi32>)
      -> (tensor<?x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>)
  return %r, %d : tensor<?x2xi32>, tensor<?x64xbf16>
}
func.func @layer_backward(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>,
                          %g: tensor<?x2xi32>, %d: tensor<?x64xbf16>)
    -> tensor<?x32xbf16> attributes {moe.gradients = array<i64: 0>} {
  %a = moe.activation %d {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>) -> tensor<?x32xbf16>
  return %a : tensor<?x32xbf16>
}

// -----

func.func @orphan_backward(%x: tensor<?x64xbf16>, %d: tensor<?x64xbf16>)
    -> tensor<?x32xbf16> attributes {moe.gradients = array<i64: 0>} {
  // expected-error @-2 {{reads the tensors @orphan_train saves, which must come first}}
  %a = moe.activation %d {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xbf16>) -> tensor<?x32xbf16>
  return %a : tensor<?x32xbf16>
}
