#!/usr/bin/env python3
"""Writes a Baton random-weight checkpoint as a GGUF file llama.cpp can load.

    PYTHONPATH=<llama.cpp>/gguf-py python3 bench/llama_cpp/write_gguf.py MODEL_DIR OUT.gguf

MODEL_DIR is what `baton make-model` writes (Hugging Face layout: config.json
and model.safetensors). The GGUF holds the same weights in the same element
type (F32, F16 or BF16), so llama.cpp and Baton are timed on identical models.

This follows the vendored convert_hf_to_gguf.py (conversion/llama.py,
conversion/qwen.py and TextModel in conversion/base.py) for the two
architectures Baton's presets use, without its torch dependency:

  * LlamaForCausalLM -> `llama`. llama.cpp applies RoPE to adjacent pairs
    (GPT-J style) while Hugging Face Llama checkpoints rotate the two halves of
    each head, so Q and K rows are permuted (LlamaModel.permute).
  * Qwen2ForCausalLM -> `qwen2`. llama.cpp runs qwen2 with NeoX RoPE, the
    checkpoint's own layout: no permutation. Q/K/V carry biases.

As in the converter, 1-D tensors (norm weights, biases) are stored as F32:
llama.cpp's CPU code expects F32 there. Widening BF16/F16 to F32 is exact, so
the values are unchanged. Tied embeddings (no lm_head.weight) write no
`output` tensor; llama.cpp then reuses token_embd.

The checkpoint has no real tokenizer, and llama-bench feeds random token ids,
so the vocabulary is tokenizer.ggml.model = "none" with <arch>.vocab_size:
llama.cpp then makes that many placeholder tokens and no BOS. llama-server
also turns every sampled id into text, which a "none" vocabulary cannot do;
--spm-vocab writes a SentencePiece-style one instead (<unk>, <s>, </s>, the
256 byte tokens, then placeholder words), enough to serve token-id prompts.

Only numpy (and the gguf package from the llama.cpp source tree) is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

import gguf

# safetensors dtype -> (numpy dtype of the stored bits, GGML type). BF16 has
# no numpy type: its bits are carried as uint16 and written raw.
SAFETENSORS_TYPES = {
    "F32": (np.float32, gguf.GGMLQuantizationType.F32),
    "F16": (np.float16, gguf.GGMLQuantizationType.F16),
    "BF16": (np.uint16, gguf.GGMLQuantizationType.BF16),
}

FILE_TYPES = {
    gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
    gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
    gguf.GGMLQuantizationType.BF16: gguf.LlamaFileType.MOSTLY_BF16,
}

ARCHITECTURES = {
    "LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
}


def read_safetensors(path: Path) -> dict[str, tuple[np.ndarray, str]]:
    """Maps each tensor name to (array over the file's bytes, safetensors dtype).

    The format is an 8-byte little-endian header length, a JSON header of
    {name: {dtype, shape, data_offsets}} and the raw data; the arrays are
    read-only memory maps, so a large checkpoint is not read in up front.
    """
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_TYPES:
            sys.exit(f"write_gguf.py: {name}: unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        array = data[begin:end].view(SAFETENSORS_TYPES[dtype][0]).reshape(info["shape"])
        tensors[name] = (array, dtype)
    return tensors


def to_f32(array: np.ndarray, dtype: str) -> np.ndarray:
    """Widens a tensor to float32 exactly (BF16 is the top half of an F32)."""
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """LlamaModel.permute: each head's rows from [half 0 | half 1] to pairs."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="checkpoint directory (config.json, model.safetensors)")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--spm-vocab", action="store_true",
                        help="a SentencePiece-style vocabulary llama-server can detokenize")
    args = parser.parse_args()

    config = json.loads((args.model_dir / "config.json").read_text())
    hf_arch = config["architectures"][0]
    if hf_arch not in ARCHITECTURES:
        sys.exit(f"write_gguf.py: unsupported architecture {hf_arch}")
    arch = ARCHITECTURES[hf_arch]
    tensors = read_safetensors(args.model_dir / "model.safetensors")

    n_layer = config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads", n_head)
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head

    # The file type follows the matrices; the checkpoint has a single dtype.
    matrix_types = {dtype for array, dtype in tensors.values() if array.ndim >= 2}
    if len(matrix_types) != 1:
        sys.exit(f"write_gguf.py: expected one weight dtype, found {sorted(matrix_types)}")
    weight_type = SAFETENSORS_TYPES[matrix_types.pop()][1]

    # Write to a temporary name first so an interrupted run leaves no file
    # that looks complete.
    tmp = args.out.with_name(args.out.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(args.model_dir.name)
    writer.add_block_count(n_layer)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(FILE_TYPES[weight_type])
    writer.add_vocab_size(config["vocab_size"])
    if args.spm_vocab:
        add_spm_vocab(writer, config["vocab_size"])
    else:
        writer.add_tokenizer_model("none")

    name_map = gguf.get_tensor_name_map(arch, n_layer)
    for name, (array, dtype) in tensors.items():
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            sys.exit(f"write_gguf.py: no GGUF name for tensor {name}")
        if arch == gguf.MODEL_ARCH.LLAMA:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                array = permute(array, n_head)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                array = permute(array, n_head_kv)
        if array.ndim <= 1 or gguf_name.endswith("_norm.weight"):
            writer.add_tensor(gguf_name, to_f32(array, dtype))
        elif dtype == "BF16":
            # Raw bytes with an explicit type: the writer derives the element
            # shape from the byte shape.
            array = np.ascontiguousarray(array).view(np.uint8)
            writer.add_tensor(gguf_name, array, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({gguf.MODEL_ARCH_NAMES[arch]}, {weight_type.name}, {len(tensors)} tensors)")


def add_spm_vocab(writer, vocab_size):
    """A SentencePiece-style vocabulary of vocab_size tokens that llama.cpp can
    detokenize: control tokens 0-2, byte tokens 3-258, placeholder words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    words = vocab_size - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(words)]
    types += [gguf.TokenType.NORMAL] * words
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens[:vocab_size])
    writer.add_token_scores([-float(i) for i in range(vocab_size)])
    writer.add_token_types(types[:vocab_size])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)


if __name__ == "__main__":
    main()
