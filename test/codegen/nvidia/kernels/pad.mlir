// RUN: moe-opt %s -split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// moe.pad copies each row (a block a row, 128 threads over the padded
// columns) and zeros the new columns: rows of the token count for
// activations, the flattened leading dimensions for weights.

// CHECK-LABEL: func.func @pad_rows
// CHECK: launches = [#moe.launch<kernel = @moe_pad, work = 1 * T, block = 128, args = [buffer 0, buffer 1, tokens]>]
// CHECK: gpu.func @moe_pad({{.*}}) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// A block past the call's rows does nothing.
// CHECK: %[[ROW:.*]] = gpu.block_id  x
// CHECK: arith.cmpi ult, %[[ROW]]
// A bf16 row is 200 bytes in and 208 out; a thread reads column min(c, 99)
// and stores zero from column 100 on.
// PTX-LABEL: .visible .entry moe_pad(
// PTX: .maxntid 128, 1, 1
// PTX: setp.gt.u32 {{[^,]*}}, {{[^,]*}}, 103;
// PTX-SAME: mad.lo.s64 {{[^,]*}}, {{[^,]*}}, 200,
// PTX-SAME: mad.lo.s64 {{[^,]*}}, {{[^,]*}}, 208,
// PTX-SAME: setp.lt.u32 {{[^,]*}}, {{[^,]*}}, 100;
// PTX-SAME: min.u64 {{[^,]*}}, {{[^,]*}}, 99;
// PTX-SAME: ld.global.b16
// PTX-SAME: selp.b16 {{[^,]*}}, {{[^,]*}}, 0x0000,
// PTX-SAME: st.global.b16
func.func @pad_rows(%x: tensor<?x100xbf16>) -> tensor<?x104xbf16> {
  %0 = moe.pad %x : tensor<?x100xbf16> -> tensor<?x104xbf16>
  return %0 : tensor<?x104xbf16>
}

// -----

// FP8 expert weights [4, 64, 40]: 256 rows of 40 bytes become 48.
// CHECK-LABEL: func.func @pad_weights
// CHECK: launches = [#moe.launch<kernel = @moe_pad, work = 256, block = 128, args = [buffer 0, buffer 1, tokens]>]
// PTX-LABEL: .visible .entry moe_pad(
// PTX: setp.gt.u32 {{[^,]*}}, {{[^,]*}}, 255;
// PTX-SAME: setp.gt.u32 {{[^,]*}}, {{[^,]*}}, 47;
// PTX-SAME: mad.lo.s64 {{[^,]*}}, {{[^,]*}}, 40,
// PTX-SAME: mad.lo.s64 {{[^,]*}}, {{[^,]*}}, 48,
// PTX-SAME: setp.lt.u32 {{[^,]*}}, {{[^,]*}}, 40;
// PTX-SAME: min.u64 {{[^,]*}}, {{[^,]*}}, 39;
// PTX-SAME: ld.global.b8
// PTX-SAME: st.global.b8
func.func @pad_weights(%w: tensor<4x64x40xf8E4M3FN>) -> tensor<4x64x48xf8E4M3FN> {
  %0 = moe.pad %w : tensor<4x64x40xf8E4M3FN> -> tensor<4x64x48xf8E4M3FN>
  return %0 : tensor<4x64x48xf8E4M3FN>
}
