#!/usr/bin/env python3
"""Loads a model written by train.py with transformers (LlamaForCausalLM) and prints its fp32 perplexity on
the held-out windows train.py reports (calib.tokens[65536:81920], 8 x 2048): the file format check.
    python3 check_hf.py MODEL_DIR [SHARED_DIR]"""
import math
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
shared = sys.argv[2] if len(sys.argv) > 2 else "/work/shared"
toks = np.fromfile(shared + "/data/tiny-qwen3/calib.tokens", "<u4").astype(np.int64)[65536:65536 + 8 * 2048 + 1]
nll = []
with torch.no_grad():
    for i in range(0, 8 * 2048, 2048):
        ids = torch.from_numpy(toks[i:i + 2049])[None]
        out = m(ids[:, :-1]).logits.float()
        nll.append(torch.nn.functional.cross_entropy(out[0], ids[0, 1:]).item())
print(f"transformers {type(m).__name__}: held-out calib.tokens[65536:81920] ppl {math.exp(np.mean(nll)):.3f}")
