"""moe-pack: one layer of a HuggingFace checkpoint as the inputs moe-exec
takes.

    moe-pack CHECKPOINT --layer N -o layer.safetensors
    moe-exec libLAYER.so --inputs layer.safetensors --inputs tokens.safetensors \\
        --outputs out.safetensors

The layer's weights, named as the layer compiled by moe-compile
--from-hf-config CHECKPOINT/config.json takes them; the hidden states come
from another file. Needs numpy, ml_dtypes and safetensors' format only (no
PyTorch).
"""
import argparse
import sys

from .checkpoint import CheckpointError, load_layer
from .safetensors_io import SafetensorsError, write_safetensors


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="moe-pack",
        description="Write one MoE layer of a HuggingFace checkpoint in the "
                    "argument layout of the layer moe-compile builds from "
                    "its config.json.")
    ap.add_argument("checkpoint",
                    help="folder with config.json and model.safetensors (or "
                         "model.safetensors.index.json and its shards)")
    ap.add_argument("--layer", type=int, required=True,
                    help="decoder layer index (its MoE block)")
    ap.add_argument("-o", "--output", required=True,
                    help="the .safetensors file to write")
    opts = ap.parse_args(argv)
    try:
        weights = load_layer(opts.checkpoint, opts.layer)
        write_safetensors(opts.output, weights.tensors)
    except (CheckpointError, SafetensorsError, OSError) as e:
        print(f"moe-pack: {e}", file=sys.stderr)
        return 1
    shapes = ", ".join(f"{k} {list(v.shape)}"
                       for k, v in weights.tensors.items())
    print(f"moe-pack: layer {opts.layer} of {weights.model_type}: {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
