"""Hugging Face output of the tiny-llama trainers (train.py in JAX, train_torch.py in PyTorch): a BF16
safetensors file without a bfloat16 numpy dtype, the Llama config and tiny-qwen3's tokenizer. numpy only."""
import json
import os
import shutil

import numpy as np


def write_bf16_safetensors(path, tensors):
    """safetensors with BF16 tensors (round to nearest even), without a bfloat16 numpy dtype."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(tensors):
        x = np.ascontiguousarray(tensors[k], np.float32).view(np.uint32)
        b = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype("<u2").tobytes()
        header[k] = {"dtype": "BF16", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def save_hf(p, c, out, tok_dir):
    os.makedirs(out, exist_ok=True)
    t = {"model.embed_tokens.weight": p["embed"], "model.norm.weight": p["norm"]}
    for i, L in enumerate(p["layers"]):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = L["ln1"]
        t[pre + "post_attention_layernorm.weight"] = L["ln2"]
        for a, b in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
            t[pre + "self_attn." + b + ".weight"] = L[a]
        for a in ("gate", "up", "down"):
            t[pre + "mlp." + a + "_proj.weight"] = L[a]
    write_bf16_safetensors(os.path.join(out, "model.safetensors"), {k: np.asarray(v, np.float32) for k, v in t.items()})
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["hidden"],
        "initializer_range": 0.02, "intermediate_size": c["inter"], "max_position_embeddings": c["max_pos"],
        "mlp_bias": False, "num_attention_heads": c["heads"], "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["kv_heads"], "rms_norm_eps": c["eps"],
        "rope_parameters": {"rope_theta": c["theta"], "rope_type": "default"},
        "tie_word_embeddings": True, "dtype": "bfloat16", "use_cache": True, "vocab_size": c["vocab"],
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for n in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok_dir, n)):
            shutil.copy(os.path.join(tok_dir, n), os.path.join(out, n))
