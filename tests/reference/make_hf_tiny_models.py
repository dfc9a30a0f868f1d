"""Writes hf_tiny_models.json: transformers' fp32 logits of tiny Llama / Mistral / Qwen2 / Qwen3
checkpoints whose weights are a formula of (tensor index, element index), so that
tests/test_engine_reference.c rebuilds each checkpoint in C (no torch in CI) and compares the engine's
logits with these. Each case's config.json is written verbatim, in the style a checkpoint carries it
(transformers 5 rope_parameters or 4.x rope_scaling with a top-level rope_theta).

    python tests/reference/make_hf_tiny_models.py   # torch, transformers, safetensors, numpy

Generated with transformers 5.25.0 and torch 2.15 (CPU), fp32, eager attention."""
import json
import os
import struct
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

N_TOKENS = 12
HERE = os.path.dirname(os.path.abspath(__file__))


def uniform(tensor_index: int, n: int) -> np.ndarray:
    """u in [-1, 1) per element: a 32-bit integer hash of (tensor_index, i), 24 bits of it (exact in fp32).
    test_engine_reference.c's ref_uniform computes the same."""
    m = np.uint64(0xFFFFFFFF)
    i = np.arange(n, dtype=np.uint64)
    h = ((np.uint64(tensor_index + 1) * np.uint64(0x9E3779B1)) ^ (i * np.uint64(0x85EBCA77))) & m
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x7FEB352D)) & m
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x846CA68B)) & m
    h ^= h >> np.uint64(16)
    return ((h >> np.uint64(8)).astype(np.float32) / np.float32(1 << 24)) * np.float32(2) - np.float32(1)


def value(name: str, u: np.ndarray) -> np.ndarray:
    """Scales by powers of two (exact, so C and numpy agree bit for bit, FMA or not)."""
    if "norm" in name:
        return np.float32(1) + np.float32(0.25) * u
    if name.endswith("bias"):
        return np.float32(0.0625) * u
    if "embed_tokens" in name:
        return np.float32(0.5) * u
    return np.float32(0.125) * u


def header_tensors(path: str) -> list:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return sorted([k, v["shape"]] for k, v in h.items() if k != "__metadata__")


CASES = [
    # head_dim 32 with hidden 48 / 3 heads, GQA 3, untied lm_head, transformers 5 rope_parameters
    ("llama_gqa3_hd32_untied", "F32", {
        "model_type": "llama", "vocab_size": 32, "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 32, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 2345.6}}),
    # q/k/v/o biases (attention_bias), llama3 scaling over an 8-token pretraining context, tied, BF16 weights
    ("llama_bias_llama3_tied_bf16", "BF16", {
        "model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True,
        "tie_word_embeddings": True, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8, "rope_theta": 500000.0}}),
    # YaRN with mscale / mscale_all_dim, beta_fast / beta_slow, truncate false; no head_dim key
    ("llama_yarn_mscale", "F32", {
        "model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "tie_word_embeddings": False,
        "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                            "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16.0, "beta_slow": 2.0,
                            "truncate": False, "rope_theta": 10000.0}}),
    # Mistral, GQA 5, head_dim null, no tie_word_embeddings key (transformers: untied)
    ("mistral_gqa5", "F32", {
        "model_type": "mistral", "vocab_size": 32, "hidden_size": 40, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 5, "num_key_value_heads": 1, "head_dim": None, "sliding_window": None,
        "max_position_embeddings": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Qwen2 (q/k/v biases), tied, a transformers 4 config: top-level rope_theta, rope_scaling linear (legacy "type")
    ("qwen2_legacy_linear_tied_f16", "F16", {
        "model_type": "qwen2", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True, "use_sliding_window": False,
        "max_position_embeddings": 64, "rope_theta": 1000000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}),
    # Qwen3 (q/k norm) with attention_bias, head_dim 32 over hidden 48 / 3 heads, YaRN written as rope_scaling
    # holding its own rope_theta (transformers 5 reads rope_scaling as rope_parameters)
    ("qwen3_bias_yarn_scaling_theta", "F32", {
        "model_type": "qwen3", "vocab_size": 32, "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 32, "attention_bias": True,
        "tie_word_embeddings": False, "max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                         "rope_theta": 50000.0}}),
]

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def main() -> None:
    out = {"generator": f"tests/reference/make_hf_tiny_models.py, transformers {transformers.__version__}, "
                        f"torch {torch.__version__}", "tokens": N_TOKENS, "cases": []}
    g = np.random.default_rng(1234)
    for name, dtype, cfg in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            kw = {k: v for k, v in cfg.items() if k != "model_type"}
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg["model_type"], **kw))
            model.save_pretrained(tmp)  # for the tensor names and shapes a checkpoint holds
            tensors = header_tensors(os.path.join(tmp, "model.safetensors"))
            weights = {}
            for idx, (tname, shape) in enumerate(tensors):
                n = int(np.prod(shape))
                weights[tname] = torch.from_numpy(value(tname, uniform(idx, n)).reshape(shape)).to(DTYPES[dtype])
            for f in os.listdir(tmp):
                os.remove(os.path.join(tmp, f))
            save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
            m.eval()
            ids = g.integers(0, cfg["vocab_size"], size=N_TOKENS)
            with torch.no_grad():
                logits = m(torch.tensor(ids)[None]).logits[0].float().numpy()
        out["cases"].append({"name": name, "dtype": dtype, "config": cfg, "tensors": tensors,
                             "input_ids": [int(x) for x in ids],
                             "logits": [float("%.8g" % x) for x in logits.reshape(-1)]})
        print(f"{name}: {len(tensors)} tensors, logits {logits.shape}, |max| {np.abs(logits).max():.3f}")
    with open(os.path.join(HERE, "hf_tiny_models.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
