#!/usr/bin/env python3
"""Generate golden reference data for Baton from Hugging Face transformers.

Builds tiny randomly initialised decoder-only checkpoints with transformers'
own model classes (no hub downloads, no tokenizers), saves each one in float32
and bfloat16 safetensors, and records float32 eager-attention reference
log-probabilities plus a greedy continuation in golden.json next to it.

Usage (from the repository root, see tests/golden/README.md for the venv):
    python tests/golden/make_golden.py [--out tests/golden/data]
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import (
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

SEQ_LEN = 24          # tokens in the scored sequence
PROMPT_LEN = 10       # prefix used for the greedy continuation
NEW_TOKENS = 8        # greedy tokens generated
TOKEN_SEED = 20240601
MIN_TOKEN_ID = 3      # ids 0..2 are left out of the input (1 = bos, 2 = eos)
BOS_ID, EOS_ID = 1, 2
MIN_GREEDY_MARGIN = 1e-3  # top1 - top2 log-prob gap required at each greedy step
LM_HEAD_GAIN = 2.5    # lm_head std = gain / sqrt(hidden): logits std ~ 2.5
QK_GAIN = 1.5         # sharper attention than the plain 1/sqrt(fan_in)

# Granite's four scalings (every one away from 1) and its biases.
GRANITE_SCALINGS = dict(
    attention_bias=True,
    embedding_multiplier=3.0,
    residual_multiplier=0.6,
    attention_multiplier=0.1,
    logits_scaling=2.0,
)
# Qwen2's windows: from max_window_layers on (layer 1 masks, layer 0 sees
# everything), shorter than the sequence.
QWEN2_WINDOWS = dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)

COMMON = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    vocab_size=300,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
)


def model_specs():
    """(name, seed, config class, model class, config kwargs)."""
    return [
        ("llama_gqa", 1001, LlamaConfig, LlamaForCausalLM, dict(
            COMMON,
            num_attention_heads=8,
            num_key_value_heads=2,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )),
        ("llama3_rope", 1002, LlamaConfig, LlamaForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
        )),
        ("qwen2_bias_tied", 1003, Qwen2Config, Qwen2ForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
        )),
        ("mistral_nosw", 1004, MistralConfig, MistralForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_theta=10000.0,
            sliding_window=None,
            tie_word_embeddings=False,
        )),
        # Sliding windows shorter than the sequence: Mistral's on every
        # layer; Qwen2's from max_window_layers on (layer 1, not layer 0).
        ("mistral_sw", 1005, MistralConfig, MistralForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            sliding_window=7,
            tie_word_embeddings=False,
        )),
        ("qwen2_sw", 1006, Qwen2Config, Qwen2ForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            **QWEN2_WINDOWS,
        )),
        # Qwen3: RMSNorm over each head of q and k before RoPE, heads wider
        # than hidden_size / num_heads, and attention_bias (q/k/v and o_proj
        # biases, which Qwen3 and Llama share).
        ("qwen3_qknorm", 1008, Qwen3Config, Qwen3ForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            attention_bias=True,
        )),
        # SmolLM3: every fourth layer applies no RoPE (its config class's
        # default no_rope_layers), Llama 3's default token ids.
        ("smollm3_nope", 1010, SmolLM3Config, SmolLM3ForCausalLM, dict(
            COMMON,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=5000000.0,
            tie_word_embeddings=True,
            pad_token_id=None,  # its default, 128004, is past this vocabulary
        )),
        # Phi3: q/k/v in one qkv_proj and gate/up in one gate_up_proj, and a
        # window on every layer shorter than the sequence.
        ("phi3_fused_sw", 1011, Phi3Config, Phi3ForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            sliding_window=9,
            tie_word_embeddings=False,
            pad_token_id=None,  # its default, 32000, is past this vocabulary
        )),
        # Granite: embeddings scaled up, block outputs scaled down before the
        # residual, its own attention scale, logits divided; all four biases.
        ("granite_scalings", 1017, GraniteConfig, GraniteForCausalLM, dict(
            COMMON,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            **GRANITE_SCALINGS,
        )),
    ]


def gpu_model_specs():
    """The same families at the head dims the CUDA backend serves (its
    FlashInfer kernels take head_dim 64 and 128); hidden and FFN sizes
    multiples of 8. Written by --gpu-shapes into data-gpu/."""
    wide = dict(COMMON, hidden_size=128, intermediate_size=256)
    return [
        ("llama_gqa_hd64", 2001, LlamaConfig, LlamaForCausalLM, dict(
            wide,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )),
        ("llama3_rope_hd128", 2002, LlamaConfig, LlamaForCausalLM, dict(
            wide,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=128,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
        )),
        ("qwen2_bias_tied_hd64", 2003, Qwen2Config, Qwen2ForCausalLM, dict(
            wide,
            hidden_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
        )),
        ("mistral_nosw_hd64", 2004, MistralConfig, MistralForCausalLM, dict(
            wide,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_theta=10000.0,
            sliding_window=None,
            tie_word_embeddings=False,
        )),
        ("qwen3_qknorm_hd64", 2005, Qwen3Config, Qwen3ForCausalLM, dict(
            wide,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            attention_bias=True,
        )),
        # Sliding windows shorter than the sequence: on every layer (blocks
        # behind it are given back as a sequence runs), and Qwen2's from
        # max_window_layers on (layer 1 masks, layer 0 sees everything).
        ("mistral_sw_hd64", 2006, MistralConfig, MistralForCausalLM, dict(
            wide,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_theta=10000.0,
            sliding_window=7,
            tie_word_embeddings=False,
        )),
        ("qwen2_sw_hd64", 2007, Qwen2Config, Qwen2ForCausalLM, dict(
            wide,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            **QWEN2_WINDOWS,
        )),
        # Granite's four scalings and biases.
        ("granite_scalings_hd64", 2008, GraniteConfig, GraniteForCausalLM, dict(
            wide,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            **GRANITE_SCALINGS,
        )),
    ]


def build_config(config_cls, kwargs):
    kwargs = dict(kwargs)
    rope_theta = kwargs.pop("rope_theta")
    rope_scaling = kwargs.pop("rope_scaling", None)
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        # transformers 5 keeps theta and scaling together in rope_parameters.
        rope = dict(rope_scaling) if rope_scaling else {"rope_type": "default"}
        rope["rope_theta"] = rope_theta
        kwargs["rope_parameters"] = rope
    else:
        kwargs["rope_theta"] = rope_theta
        if rope_scaling:
            kwargs["rope_scaling"] = rope_scaling
    cfg = config_cls(**kwargs)
    cfg.bos_token_id = BOS_ID
    cfg.eos_token_id = EOS_ID
    return cfg


@torch.no_grad()
def perturb(model, hidden):
    """Re-draw weights so that nothing is symmetric and logits are well spread.

    Linear weights ~ N(0, (gain / sqrt(fan_in))^2) with gain 1 (1.5 for q/k,
    2.5 for lm_head), untied embeddings ~ N(0, 1), tied embeddings use the
    lm_head scale, biases ~ 0.1 N(0, 1), RMSNorm weights ~ 1 + 0.1 N(0, 1).
    Uses the global torch RNG (seeded by the caller).
    """
    tied = model.config.tie_word_embeddings
    for name, p in model.named_parameters():  # tied parameters appear once
        if name.endswith("embed_tokens.weight"):
            std = LM_HEAD_GAIN / math.sqrt(hidden) if tied else 1.0
            p.copy_(torch.randn_like(p) * std)
        elif name.endswith("lm_head.weight"):
            p.copy_(torch.randn_like(p) * LM_HEAD_GAIN / math.sqrt(p.shape[1]))
        elif name.endswith(".bias"):
            p.copy_(torch.randn_like(p) * 0.1)
        elif "norm" in name and p.ndim == 1:
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif p.ndim == 2:
            gain = QK_GAIN if (".q_proj." in name or ".k_proj." in name) else 1.0
            p.copy_(torch.randn_like(p) * gain / math.sqrt(p.shape[1]))
        else:
            raise RuntimeError(f"unhandled parameter {name} {tuple(p.shape)}")


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def greedy_reference(model, prompt, n):
    """Plain argmax loop with full recomputation; returns tokens and margins."""
    ids = list(prompt)
    toks, margins = [], []
    for _ in range(n):
        lp = torch.log_softmax(logits_of(model, ids)[-1].double(), dim=-1)
        top2 = torch.topk(lp, 2)
        toks.append(int(top2.indices[0]))
        margins.append(float(top2.values[0] - top2.values[1]))
        ids.append(toks[-1])
    return toks, margins


@torch.no_grad()
def greedy_generate(model, prompt, n):
    out = model.generate(
        input_ids=torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        use_cache=True,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt):]]


def f32_list(t):
    """Shortest decimal strings that round-trip to the exact float32 values."""
    arr = t.detach().to(torch.float32).cpu().numpy()
    return [[float(str(np.float32(v))) for v in row] for row in arr]


def check_safetensors(path, want_dtype):
    names = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            names[k] = f.get_slice(k).get_dtype()
    bad = {k: d for k, d in names.items() if d != want_dtype}
    if bad:
        raise RuntimeError(f"{path}: unexpected dtypes {bad}")
    return sorted(names)


def to_legacy_config(d):
    """Rewrite config.json in the transformers 4 layout (top-level rope_theta,
    rope_scaling, torch_dtype) that most published checkpoints use."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = dict(cfg.pop("rope_parameters", None) or {})
    if "rope_theta" in rope:
        cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def load(model_cls, d):
    return model_cls.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager").eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--gpu-shapes", action="store_true",
                    help="write the CUDA backend's shapes (head_dim 64 and 128) "
                         "instead, by default into data-gpu/")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="write only these models, keeping the others in --out")
    ap.add_argument("--legacy-config", action="store_true",
                    help="write config.json in the transformers 4 layout "
                         "(rope_theta/rope_scaling/torch_dtype at top level)")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "data-gpu" if args.gpu_shapes else "data")

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(TOKEN_SEED)
    token_ids = [int(t) for t in torch.randint(
        MIN_TOKEN_ID, COMMON["vocab_size"], (SEQ_LEN,), generator=g)]
    prompt = token_ids[:PROMPT_LEN]

    specs = gpu_model_specs() if args.gpu_shapes else model_specs()
    if args.only:
        unknown = set(args.only) - {spec[0] for spec in specs}
        if unknown:
            raise SystemExit(f"no such models: {sorted(unknown)}")
        specs = [spec for spec in specs if spec[0] in args.only]
        for name, *_ in specs:
            shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
        os.makedirs(args.out, exist_ok=True)
    else:
        if os.path.isdir(args.out):
            shutil.rmtree(args.out)
        os.makedirs(args.out)

    versions = {"transformers_version": transformers.__version__,
                "torch_version": torch.__version__}
    print("versions:", versions)
    print("token_ids:", token_ids)

    for name, seed, config_cls, model_cls, kw in specs:
        torch.manual_seed(seed)
        cfg = build_config(config_cls, kw)
        cfg._attn_implementation = "eager"
        model = model_cls(cfg).eval()
        perturb(model, cfg.hidden_size)
        model.config.bos_token_id = BOS_ID
        model.config.eos_token_id = EOS_ID
        model.generation_config.bos_token_id = BOS_ID
        model.generation_config.eos_token_id = EOS_ID

        variants = [
            ("f32", "float32", "F32", model),
            ("bf16", "bfloat16", "BF16", copy.deepcopy(model).to(torch.bfloat16)),
        ]
        if args.gpu_shapes:
            variants = variants[1:]  # the CUDA backend computes in BF16
        ref32 = None
        for sub, dtype_name, st_dtype, m in variants:
            d = os.path.join(args.out, name, sub)
            m.save_pretrained(d, safe_serialization=True)
            if args.legacy_config:
                to_legacy_config(d)
            st = os.path.join(d, "model.safetensors")
            tensor_names = check_safetensors(st, st_dtype)
            if cfg.tie_word_embeddings and "lm_head.weight" in tensor_names:
                raise RuntimeError(f"{name}: tied model saved lm_head.weight")
            if not cfg.tie_word_embeddings and "lm_head.weight" not in tensor_names:
                raise RuntimeError(f"{name}: untied model lacks lm_head.weight")

            # In-memory expectation: the f32 model with its parameters rounded
            # to the saved dtype (buffers such as the RoPE inv_freq stay f32,
            # as they are recomputed on load).
            mem = copy.deepcopy(model).eval()
            with torch.no_grad():
                for p in mem.parameters():
                    p.copy_(p.to(m.dtype).to(torch.float32))
            want = logits_of(mem, token_ids)

            # Reference: the checkpoint as written, loaded back in float32.
            ref = load(model_cls, d)
            if ref.config._attn_implementation != "eager":
                raise RuntimeError("eager attention not selected")
            logits = logits_of(ref, token_ids)
            diff = (logits - want).abs().max().item()
            if diff != 0.0:
                raise RuntimeError(f"{name}/{sub}: reload mismatch {diff}")
            # Incremental decoding with the KV cache must agree too.
            with torch.no_grad():
                out = ref(input_ids=torch.tensor([token_ids[:PROMPT_LEN]]),
                          use_cache=True)
                pkv, steps = out.past_key_values, [out.logits[0, -1]]
                for t in token_ids[PROMPT_LEN:]:
                    out = ref(input_ids=torch.tensor([[t]]),
                              past_key_values=pkv, use_cache=True)
                    pkv = out.past_key_values
                    steps.append(out.logits[0, -1])
            cache_diff = (torch.stack(steps) - logits[PROMPT_LEN - 1:]).abs().max().item()
            if cache_diff > 1e-4:
                raise RuntimeError(f"{name}/{sub}: kv-cache mismatch {cache_diff}")

            # The llama3 rope scaling must really change some (not all)
            # frequencies at this head_dim, or the test would not cover it.
            rope_type = ref.config.rope_parameters.get("rope_type", "default")
            if rope_type != "default":
                inv = ref.model.rotary_emb.inv_freq.double()
                hd = ref.config.head_dim
                theta = ref.config.rope_parameters["rope_theta"]
                plain = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
                changed = int((~torch.isclose(inv, plain, rtol=1e-6)).sum())
                if not 0 < changed < len(plain):
                    raise RuntimeError(f"{name}: rope scaling changed {changed} freqs")
                print(f"{name}/{sub}: {rope_type} rope changes {changed}/{len(plain)} "
                      f"frequencies: {[f'{x:.4g}' for x in inv.tolist()]}")

            log_probs = torch.log_softmax(logits.double(), dim=-1)
            cont, margins = greedy_reference(ref, prompt, NEW_TOKENS)
            gen = greedy_generate(ref, prompt, NEW_TOKENS)
            if gen != cont or len(gen) != NEW_TOKENS:
                raise RuntimeError(f"{name}/{sub}: generate {gen} != argmax {cont}")
            if min(margins) < MIN_GREEDY_MARGIN:
                raise RuntimeError(f"{name}/{sub}: greedy near-tie {margins}")

            # Second reload must reproduce the recorded numbers exactly.
            again = logits_of(load(model_cls, d), token_ids)
            if not torch.equal(again, logits):
                raise RuntimeError(f"{name}/{sub}: non-deterministic reload")

            golden = {
                "model": name,
                "architecture": type(ref).__name__,
                "dtype": dtype_name,
                "compute_dtype": "float32",
                "attn_implementation": "eager",
                "vocab_size": cfg.vocab_size,
                "token_ids": token_ids,
                "log_probs": f32_list(log_probs),
                "greedy_prompt": prompt,
                "greedy_continuation": gen,
                "greedy_margins": [float(f"{x:.6g}") for x in margins],
                **versions,
            }
            with open(os.path.join(d, "golden.json"), "w") as f:
                json.dump(golden, f, separators=(",", ":"))
                f.write("\n")

            std = logits.std(dim=-1)
            spread = (logits.max(dim=-1).values - logits.min(dim=-1).values)
            extra = ""
            if ref32 is not None:
                extra = f" |bf16-f32 logits|max={(logits - ref32).abs().max().item():.3f}"
            else:
                ref32 = logits
            size = os.path.getsize(st)
            print(f"{name}/{sub}: {len(tensor_names)} tensors, {size} B; "
                  f"logit std mean={std.mean().item():.2f} min={std.min().item():.2f}; "
                  f"max-min mean={spread.mean().item():.2f}; "
                  f"max|logit|={logits.abs().max().item():.2f}; "
                  f"kv-cache diff={cache_diff:.2e}; "
                  f"greedy={gen} min margin={min(margins):.3f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
