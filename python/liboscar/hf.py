"""Hugging Face transformers on liboscar's 2-bit paged KV cache.

:class:`OscarCache` is a transformers ``Cache`` whose layers live in a
liboscar :class:`~liboscar.PagedCache` (per layer: a page pool of 2-bit rows,
a window pool for the BF16 sink and recent window, a block table and
``seq_lens``); the attention function registered as ``"oscar"`` in
transformers' ``AttentionInterface`` reads it with ``oscar_decode``, the fused
2-bit kernel: the cache is never dequantized back to BF16 (what transformers'
own ``QuantizedCache`` does). ::

    from transformers import AutoModelForCausalLM
    from liboscar.hf import OscarCache

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("cuda")
    cache = OscarCache(model, "model.oscar.safetensors")   # switches the model to attention "oscar"
    out = model.generate(ids, cache=cache, max_new_tokens=64, do_sample=False)  # transformers < 5.24: past_key_values=

What runs where, per attention layer and forward call:

- one new token per sequence (a decode step): ``oscar_append`` of its K/V,
  then ``oscar_decode`` of its query over sink, 2-bit history and recent window;
- several tokens into an empty cache (the prompt), ``prefill="exact"`` (the
  default): attention over the step's own K/V in the model's dtype with torch
  SDPA (transformers' ``sdpa_attention_forward``), then one ``oscar_append`` of
  all rows (most go straight into 2 bits). The prompt's own attention is
  therefore exact, as in the project's GPU engine; later tokens read the
  quantized cache;
- several tokens into a non-empty cache (a second turn, chunked prefill) with
  ``prefill="exact"``: chunks of ``extend_chunk`` tokens (default a quarter of
  the recent window, at most 64), each appended and then attended with
  ``oscar_extend`` (the chunk's queries over sink, 2-bit history, recent window
  and the chunk itself, causal; one launch per chunk and layer);
- any multi-token step with ``prefill="stepwise"``: token by token, append
  then decode, so every query reads the cache exactly as a decode step would
  (teacher-forced evaluation of the quantized cache, comparable to
  ``oscar-eval``).

Batches with left padding (``attention_mask`` from a tokenizer) are
supported in exact prefill: only each sequence's real tokens enter the
cache. CPU tensors use the CPU backend (the reference), CUDA tensors the CUDA
plugin on ``torch.cuda.current_stream()``. Models with float32 weights keep
the cache in bfloat16 (liboscar stores BF16 or FP16 rows): queries, keys and
values are rounded to it and the attention output is cast back.

Hybrid models (sliding-window or chunked layers beside full-attention ones,
e.g. Gemma 3): the full-attention layers live in liboscar, the others stay
transformers' own cache layers. Not supported (each raises
``NotImplementedError`` naming it): beam search and other batch reordering,
cropping (assisted decoding), offloading, models without a full-attention
layer, logit soft-capping and learned sink logits. The cache is not
compileable (no ``torch.compile`` or
CUDA graphs of the decode step).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import sys
import time
import warnings
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .core import Layout, OscarError, PagedCache, Params, Plan, Runtime, method_id

try:  # the mask builder that goes with SDPA, so padded prompts get their 4-D mask
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
except ImportError:  # pragma: no cover - older transformers
    ALL_MASK_ATTENTION_FUNCTIONS = sdpa_mask = None

ATTENTION_NAME = "oscar"
_KV_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
_BUILTIN = ("bf16", "int2", "quarot2", "oscar2", "oscar2-lm")

# Fresh key tensors handed from OscarCache.update to the attention function
# of the same layer in the same forward: id(key) -> (key, cache, layer). The
# attention function gets the tensors update returned, not the cache, so the
# key tensor itself says which cache and layer it belongs to.
_PENDING: dict = {}


def register() -> None:
    """Registers the ``"oscar"`` attention function (and SDPA's mask builder
    under the same name) with transformers. Idempotent; importing this module
    does it."""
    AttentionInterface.register(ATTENTION_NAME, oscar_attention_forward)
    if ALL_MASK_ATTENTION_FUNCTIONS is not None:
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


def _text_config(model_or_config: Any) -> Any:
    cfg = getattr(model_or_config, "config", model_or_config)
    get = getattr(cfg, "get_text_config", None)
    return get() if get else cfg


class OscarLayer(CacheLayerMixin):
    """One attention layer's view of the :class:`OscarCache`: its rows live
    in the shared liboscar PagedCache. Holds only the token count the model
    has fed (positions, including left padding)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, cache: "OscarCache", layer: int):
        super().__init__()
        self.cache, self.layer = cache, layer
        self.fed = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.cache._allocate(key_states)
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Hands the step's fresh K/V to the ``"oscar"`` attention function,
        which appends them (it needs the attention mask and the queries)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        stale = [k for k, (_, c, layer) in _PENDING.items() if c is self.cache and layer == self.layer]
        if stale:
            _PENDING.clear()
            raise RuntimeError(f"OscarCache: layer {self.layer}'s previous K/V were never consumed: the model is not "
                               f"using attention {ATTENTION_NAME!r}; create the cache with OscarCache(model, ...) "
                               f"(it switches the model) or load the model with attn_implementation="
                               f"{ATTENTION_NAME!r}")
        _PENDING[id(key_states)] = (key_states, self.cache, self.layer)
        self.fed += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.fed + query_length, 0

    def get_seq_length(self) -> int:
        return self.fed

    def get_max_length(self) -> int:
        return self.cache.max_seq_len

    def reset(self) -> None:
        self.fed = 0
        if self.cache.paged is not None:
            self.cache.paged.lens[self.layer] = 0

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(f"OscarCache does not support {what}: 2-bit rows cannot be removed or moved "
                                  f"between sequences (use greedy or sampling, one cache per batch)")

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse("crop (assisted decoding)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse("reorder_cache (beam search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("batch_repeat_interleave (num_return_sequences / beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse("batch_select_indices")

    def offload(self) -> None:
        self._refuse("offloading")

    def prefetch(self) -> None:
        self._refuse("offloading")


def _wide_in_layer(params: Params, layer: int, num_kv_heads: int) -> int:
    """The 3-bit head-tensors (code_bits 3) of one layer of ``params``."""
    return sum(params.code_bits(layer, h, kv) == 3 for h in range(num_kv_heads) for kv in ("k", "v"))


def _wide_tensors(params: Params, num_layers: int, num_kv_heads: int) -> int:
    """The most 3-bit head-tensors of any layer of ``params``: the layout's wide_tensors."""
    return max(_wide_in_layer(params, layer, num_kv_heads) for layer in range(num_layers))


class OscarCache(Cache):
    """A transformers ``Cache`` backed by liboscar's 2-bit paged cache.

    ``model``: a loaded causal LM (Llama, Qwen2, Qwen3, ... with full
    attention); its attention implementation is switched to ``"oscar"``
    (``switch_attention=False`` leaves it, for a model loaded with
    ``attn_implementation="oscar"``). ``params``: a :class:`~liboscar.Params`,
    the path of a parameter file from ``oscar-calibrate``, or None for the
    built-in parameters of ``method`` (oscar2: identity rotation with the
    published clips; int2, quarot2, bf16 need none). The pools are allocated
    at the first forward, for that batch size and ``max_seq_len`` tokens per
    sequence (default: the model's ``max_position_embeddings``).
    ``prefill``: "exact" or "stepwise" (module docstring). ``backend``: None
    picks "cuda" for CUDA tensors and "cpu" for CPU tensors.
    """

    def __init__(self, model: Any, params: Union[Params, str, os.PathLike, None] = None, method: str = "oscar2",
                 sink: int = 64, recent: int = 256, page_size: int = 64, group: int = 0,
                 max_seq_len: Optional[int] = None, prefill: str = "exact", backend: Optional[str] = None,
                 switch_attention: bool = True, extend_chunk: Optional[int] = None):
        cfg = _text_config(model)
        if prefill not in ("exact", "stepwise"):
            raise ValueError(f"prefill must be 'exact' or 'stepwise', got {prefill!r}")
        if extend_chunk is None:  # a quarter of W: as accurate as decode steps (docs/API.md, extend)
            extend_chunk = max(1, min(64, recent // 4))
        if not (isinstance(extend_chunk, int) and 1 <= extend_chunk <= max(1, recent)):
            raise ValueError(f"extend_chunk must be an int in [1, recent = {recent}] (a longer chunk leaves its first "
                             f"queries without 16-bit recent rows), got {extend_chunk!r}")
        self.extend_chunk = extend_chunk
        if getattr(cfg, "attn_logit_softcapping", None):
            raise NotImplementedError(f"OscarCache: attention logit soft-capping (attn_logit_softcapping "
                                      f"{cfg.attn_logit_softcapping}) is not computed by liboscar's decode")
        # transformers' own layer list for this config: its full-attention layers (plain DynamicLayer)
        # live in liboscar, the others (sliding-window, chunked, ...) stay transformers' layers.
        theirs = DynamicCache(config=model.config if hasattr(model, "config") else model).layers
        self.num_layers = int(cfg.num_hidden_layers)
        if len(theirs) != self.num_layers:  # pragma: no cover - a transformers without config layers
            theirs = [DynamicLayer() for _ in range(self.num_layers)]
        self.oscar_layers = [i for i, layer in enumerate(theirs) if type(layer) is DynamicLayer]
        if not self.oscar_layers:
            raise NotImplementedError(f"OscarCache: no full-attention layer to store in 2 bits (transformers' cache "
                                      f"layers: {sorted({type(x).__name__ for x in theirs})})")
        hq = int(cfg.num_attention_heads)
        hkv = int(getattr(cfg, "num_key_value_heads", None) or hq)
        d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
        if isinstance(params, (str, os.PathLike)):
            params = Params.load(os.fspath(params))
        if params is None and method_id(method) not in [method_id(m) for m in _BUILTIN]:
            raise ValueError(f"method {method!r} needs calibrated parameters (params=...)")
        if params is None and method != "bf16":
            params = Params.builtin(method, self.num_layers, hq, hkv, d)
        if params is not None:
            # With the model's fingerprint, as oscar-eval checks: another model's parameters of the same
            # shape (its rotations and clips) were taken without a word. Files without a hash pass.
            params.check_shape(self.num_layers, hq, hkv, d, model_fingerprint(model))
            method = params.info.method
        self.params, self.method, self.prefill, self.backend = params, method, prefill, backend
        self.max_seq_len = int(max_seq_len or getattr(cfg, "max_position_embeddings", 0) or 4096)
        # 3-bit head-tensors (the calibration's default code-width budget writes them): each layer's pages
        # room for its own 1-bit planes (FORMAT.md 3.3); a layout without them refuses such parameters.
        wide = _wide_tensors(params, self.num_layers, hkv) if params is not None and method == "oscar2" else 0
        self.layout = Layout(head_dim=d, group=group, num_q_heads=hq, num_kv_heads=hkv, page_size=page_size,
                             sink=sink, recent=recent, max_seq_len=self.max_seq_len, method=method,
                             wide_tensors=wide, wide_per_layer=1 if wide else 0)
        self.layout.validate()
        self.paged: Optional[PagedCache] = None
        self.runtime: Optional[Runtime] = None
        self.kv_dtype: Optional[torch.dtype] = None
        super().__init__(layers=[OscarLayer(self, i) if i in self.oscar_layers else theirs[i]
                                 for i in range(self.num_layers)])
        if switch_attention:
            register()
            if hasattr(model, "set_attn_implementation"):
                model.set_attn_implementation(ATTENTION_NAME)
            else:  # pragma: no cover - older transformers
                model.config._attn_implementation = ATTENTION_NAME

    # ---------------------------------------------------------------- setup
    def _allocate(self, key_states: torch.Tensor) -> None:
        """Runtime, plan and pools for the first forward's batch and device."""
        if self.paged is not None:
            return
        dev = key_states.device
        backend = self.backend or ("cuda" if dev.type == "cuda" else "cpu")
        if dev.type == "cuda" and backend in ("cuda", "hip"):
            torch.cuda.set_device(dev)
        elif dev.type != "cpu" or backend != "cpu":
            raise ValueError(f"OscarCache: tensors on {dev} with backend {backend!r}; use CPU tensors with 'cpu' "
                             f"or CUDA tensors with 'cuda'")
        self.kv_dtype = key_states.dtype if key_states.dtype in _KV_DTYPES else torch.bfloat16
        self.layout.kv_dtype = _KV_DTYPES[self.kv_dtype]
        self.runtime = Runtime(backend)
        plan = Plan(self.runtime, self.layout, self.params)
        self.paged = plan.cache(self.num_layers, int(key_states.shape[0]), self.max_seq_len, layers=self.oscar_layers)

    @property
    def variant(self) -> str:
        """The generated kernel variant liboscar chose (after the first forward)."""
        return self.paged.plan.variant if self.paged is not None else ""

    @property
    def bits_per_element(self) -> float:
        """Stored bits per K/V element of the 2-bit region (metadata and 1-bit planes counted), the mean
        over the layers liboscar stores: each layer's own page, whose 3-bit head-tensors (the default
        calibration writes some) add their planes there only. ``layout.sizes()`` is the largest page."""
        if self.params is None or self.method != "oscar2" or not self.layout.wide_tensors:
            return self.layout.sizes().bits_per_element
        hkv = self.layout.num_kv_heads
        per = [dataclasses.replace(self.layout, wide_per_layer=0, wide_tensors=_wide_in_layer(self.params, layer, hkv))
               .sizes().bits_per_element for layer in self.oscar_layers]
        return sum(per) / len(per)

    def nbytes(self) -> int:
        """Bytes of the pools and workspace allocated for this cache (0 before the first forward)."""
        p = self.paged
        if p is None:
            return 0
        size = lambda x: int(x.numel() * x.element_size()) if isinstance(x, torch.Tensor) else int(x.nbytes)  # noqa
        return sum(size(x) for x in (*p.pages, *p.windows, p.workspace))

    # --------------------------------------------------------------- rows
    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, d] -> [B * T, H, d] contiguous rows in the cache's dtype."""
        return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).to(self.kv_dtype).contiguous()

    def _append(self, layer: int, k: torch.Tensor, v: torch.Tensor, new_tokens: Optional[list] = None) -> None:
        self.paged.append(layer, k, v, new_tokens=new_tokens)

    def _decode(self, layer: int, q: torch.Tensor, scaling: Optional[float]) -> torch.Tensor:
        """q [B, Hq, d] (kv dtype) -> out [B, Hq, d]."""
        return self.paged.decode(layer, q, sm_scale=float(scaling or 0.0))

    def _attend_chunk(self, module: Any, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float],
                      **kwargs: Any) -> torch.Tensor:
        """Attention of this forward's queries [B, Hq, T, d] for one layer;
        appends the step's K/V. Returns [B, T, Hq, d] in query's dtype. After
        the forward's last liboscar layer the errors GPU kernels flagged (NaN/Inf
        K/V rows or queries) are raised (one synchronization per forward): they
        leave zero rows instead of raising on the device."""
        out = self._attend_chunk_rows(module, layer, query, key, value, attention_mask, scaling, **kwargs)
        if layer == self.oscar_layers[-1]:
            self.paged.check()
        return out

    def _attend_chunk_rows(self, module: Any, layer: int, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: Optional[torch.Tensor], scaling: Optional[float],
                           **kwargs: Any) -> torch.Tensor:
        B, _, T, _ = query.shape
        if B != self.paged.num_seqs:  # PagedCache's message named new_tokens, which the caller never passed
            raise ValueError(f"OscarCache: this forward has batch size {B}, but the cache's pools were allocated "
                             f"for batch size {self.paged.num_seqs} at its first forward; use a new "
                             f"OscarCache(model, ...) for a batch of another size")
        if T == 1:  # a decode step
            self._append(layer, self._rows(key), self._rows(value))
            out = self._decode(layer, query[:, :, 0].to(self.kv_dtype).contiguous(), scaling)
            return out.unsqueeze(1).to(query.dtype)
        if self.prefill == "exact" and int(self.paged.lens[layer].max()) == 0:
            out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            valid = self._valid_rows(attention_mask, B, T)
            k, v = self._rows(key), self._rows(value)
            if valid is None:
                self._append(layer, k, v, new_tokens=[T] * B)
            else:
                keep = valid.reshape(-1)
                self._append(layer, k[keep].contiguous(), v[keep].contiguous(),
                             new_tokens=valid.sum(1).tolist())
            return out
        if self._valid_rows(attention_mask, B, T) is not None:
            raise NotImplementedError("OscarCache: a padded multi-token step into a non-empty cache (or "
                                      "prefill='stepwise' with padding) is not supported")
        k, v = self._rows(key).view(B, T, *key.shape[1::2]), self._rows(value).view(B, T, *value.shape[1::2])
        q = query.transpose(1, 2).to(self.kv_dtype)
        outs = []
        if self.prefill == "stepwise":  # the decode path one token at a time
            for t in range(T):
                self._append(layer, k[:, t].contiguous(), v[:, t].contiguous())
                outs.append(self._decode(layer, q[:, t].contiguous(), scaling)[:, None])
        else:  # chunked prefill: append a chunk, then oscar_extend of its queries over the whole cache
            for t0 in range(0, T, self.extend_chunk):
                c = min(self.extend_chunk, T - t0)
                rows = lambda x: x[:, t0:t0 + c].reshape(B * c, *x.shape[2:]).contiguous()  # noqa: E731
                self._append(layer, rows(k), rows(v), new_tokens=[c] * B)
                out = self.paged.extend(layer, rows(q), [c] * B, sm_scale=float(scaling or 0.0))
                outs.append(out.view(B, c, *out.shape[1:]))
        return torch.cat(outs, 1).to(query.dtype)

    @staticmethod
    def _valid_rows(mask: Optional[torch.Tensor], B: int, T: int) -> Optional[torch.Tensor]:
        """[B, T] bool of the step's real (non-padding) tokens from the 4-D
        mask's last query row, or None when there is no padding."""
        if mask is None:
            return None
        last = mask[:, 0, -1, -T:]
        valid = last if last.dtype == torch.bool else last == 0
        return None if bool(valid.all()) else valid.expand(B, T)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer_idx].update(key_states, value_states)

    def __repr__(self) -> str:
        return (f"OscarCache(method={self.method!r}, layers={self.num_layers}, sink={self.layout.sink}, "
                f"recent={self.layout.recent}, seen={self.get_seq_length()}, variant={self.variant!r})")


def oscar_attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                            scaling: Optional[float] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function ``"oscar"``: decode attention over
    the :class:`OscarCache` with liboscar's fused 2-bit kernel. With any
    other cache (or none) it is transformers' SDPA attention."""
    entry = _PENDING.pop(id(key), None)
    if entry is None or entry[0] is not key:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise NotImplementedError("OscarCache: this layer's attention has a sliding window, logit soft-capping or "
                                  "learned sink logits, which liboscar's decode does not compute")
    _, cache, layer = entry
    return cache._attend_chunk(module, layer, query, key, value, attention_mask, scaling, **kwargs), None


def reference_attention(params: Optional[Params], method: str = "oscar2", sink: int = 64, recent: int = 256,
                        group: int = 0) -> Any:
    """An eager attention function for a whole sequence without cache that
    sees K/V as decoding over the 2-bit cache sees them (what ``oscar-eval``
    measures): rows rounded to bfloat16, and for query t the keys and values
    at positions ``sink <= p <= t - recent`` replaced by liboscar's
    ``oscar_fakequant`` of them (rotate, clip, 2-bit codes, un-rotate; the CPU
    reference codec). The 16-bit rows are what the cache stores there,
    the rotated row rounded to bfloat16 (FORMAT.md §1), turned back with R^T.
    Queries and outputs are rounded to bfloat16 as ``oscar_decode`` takes and
    gives them, the rest is float64 on the CPU (inputs on a GPU are copied; the
    output goes back to the query's device). ``group``: the quant group, 0
    for the cache's default at the head_dim (:class:`OscarCache`'s, 128 at
    head_dim 256). For checks; register it with
    ``AttentionInterface.register(name, fn)``."""
    from .core import fakequant

    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(device="cpu", dtype=torch.float64)

    def stored16(x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        """x [1, H, T, d] (bf16-exact) -> bf16(x R) R^T per KV head."""
        if params is None:
            return x
        heads = []
        for h in range(x.shape[1]):
            R = torch.from_numpy(params.rotation(layer, which, h if params.info.per_head else 0)).to(torch.float64)
            heads.append(rounded(x[:, h] @ R) @ R.T)
        return torch.stack(heads, 1)

    def quantized(x: torch.Tensor, layer: int, which: str) -> torch.Tensor:
        rows = x[0].transpose(0, 1).float().numpy()  # [T, H, d]
        # group 0: the cache's (Layout's) default for head_dim, not oscar_fakequant's 0 = head_dim (256 -> 128)
        g = group or Layout(head_dim=rows.shape[2]).group
        fq = fakequant(rows, method, params, layer=layer, which=which, group=g)
        return torch.from_numpy(fq).transpose(0, 1)[None].to(torch.float64)

    def forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        B, hq, T, d = query.shape
        if B != 1:
            raise ValueError("reference_attention: one sequence at a time")
        g = hq // key.shape[1]
        layer = module.layer_idx
        k, v = rounded(key), rounded(value)
        kq, vq = (quantized(k, layer, "k"), quantized(v, layer, "v")) if method != "bf16" else (k, v)
        k, v = stored16(k, layer, "k"), stored16(v, layer, "v")
        q = rounded(query)
        t = torch.arange(T)[:, None]
        p = torch.arange(T)[None, :]
        two_bit = (p >= sink) & (p <= t - recent)  # [T, T]: query t reads key p in 2 bits
        rep = lambda x: x.repeat_interleave(g, dim=1)  # noqa: E731
        s = torch.where(two_bit, q @ rep(kq).transpose(-1, -2), q @ rep(k).transpose(-1, -2))
        s = (s * (scaling or d ** -0.5)).masked_fill(p > t, float("-inf"))
        w = torch.softmax(s, dim=-1)
        out = (w * two_bit) @ rep(vq) + (w * ~two_bit) @ rep(v)
        out = out.to(torch.bfloat16).to(device=query.device, dtype=query.dtype)
        return out.transpose(1, 2).contiguous(), None

    return forward


# ------------------------------------------------------------ calibration
CALIB_ATTENTION_PREFIX = "oscar-calib:"


def model_fingerprint(model: Any) -> str:
    """The fingerprint ``oscar-calibrate`` stores as a parameter file's
    ``model_hash`` (tools/lib/oscar_calibrate_run.c, ``ocal_model_hash``):
    FNV-1a 64 over the config fields the parameters depend on, so a file
    calibrated here and one from ``oscar-calibrate`` name a Llama, Qwen2 or
    Qwen3 checkpoint alike. Other architectures get their ``model_type``."""
    cfg = _text_config(model)
    hq = int(cfg.num_attention_heads)
    rp = getattr(cfg, "rope_parameters", None)
    theta = getattr(cfg, "rope_theta", None)
    if theta is None and isinstance(rp, dict):
        theta = rp.get("rope_theta")
    text = "arch=%s;layers=%d;hidden=%d;heads=%d;kv_heads=%d;head_dim=%d;rope_theta=%.17g;qk_norm=%d;vocab=%d" % (
        cfg.model_type, int(cfg.num_hidden_layers), int(cfg.hidden_size), hq,
        int(getattr(cfg, "num_key_value_heads", None) or hq),
        int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // hq),
        float(theta if theta is not None else 10000.0), int(cfg.model_type == "qwen3"), int(cfg.vocab_size))
    # RoPE scaling named when not the default, as ocal_model_hash does
    rope_type = None
    for scaling in (rp, getattr(cfg, "rope_scaling", None)):
        if isinstance(scaling, dict) and rope_type is None:
            rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        text += ";rope_type=%s" % rope_type
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def _o_proj_metric(module: Any, hq: int, hkv: int, d: int) -> Optional[list]:
    """Per KV head the value-error metric sum_q W_O,q^T W_O,q over the query
    heads reading it (oscar_calib_set_value_metric; what oscar-calibrate
    takes from the model), from the attention module's output projection
    ([hidden, hq * d]: ``o_proj``, ``dense`` or ``out_proj``); None when it
    has none of that shape."""
    for name in ("o_proj", "dense", "out_proj"):
        w = getattr(getattr(module, name, None), "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[1] == hq * d:
            break
    else:
        return None
    wo = w.detach().to(device="cpu", dtype=torch.float64).reshape(w.shape[0], hq, d)
    g = hq // hkv
    return [torch.einsum("rqi,rqj->ij", wo[:, h * g:(h + 1) * g], wo[:, h * g:(h + 1) * g]).numpy()
            for h in range(hkv)]


@contextlib.contextmanager
def capture_attention(model: Any, fn: Any) -> Iterator[None]:
    """Within the block, each attention call of ``model`` first hands
    ``(module, query, key, value, scaling)`` to ``fn`` (query [B, Hq, T, d],
    key and value [B, Hkv, T, d]: after RoPE and any q/k-norm, what the KV
    cache stores) and then runs the model's own attention implementation
    (its mask builder too), so the forward's outputs are unchanged. Works for
    models whose attention goes through transformers' ``AttentionInterface``;
    the model's implementation is restored on exit."""
    cfg = _text_config(model)
    prev = getattr(cfg, "_attn_implementation", None) or "eager"
    if prev.startswith(CALIB_ATTENTION_PREFIX):
        raise RuntimeError("capture_attention: already capturing this model's attention")
    if prev != "eager" and prev not in AttentionInterface._global_mapping:
        raise ValueError(f"capture_attention: the model's attention implementation {prev!r} is not registered "
                         f"with transformers' AttentionInterface")

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                  **kwargs: Any) -> Any:
        fn(module, query, key, value, scaling)
        if prev == "eager":  # each modeling file has its own eager function
            inner = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
        else:
            inner = AttentionInterface._global_mapping[prev]
        return inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    name = CALIB_ATTENTION_PREFIX + "%x" % id(attention)  # one name per block: nested models stay apart
    AttentionInterface.register(name, attention)
    if ALL_MASK_ATTENTION_FUNCTIONS is not None and prev in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[prev])

    def switch(impl: str) -> None:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(impl)
        else:  # pragma: no cover - older transformers
            model.config._attn_implementation = impl

    switch(name)
    try:
        yield
    finally:
        switch(prev)
        AttentionInterface._global_mapping.pop(name, None)
        if ALL_MASK_ATTENTION_FUNCTIONS is not None:
            ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)


def calibrate(model: Any, tokens: Any, window: int = 2048, max_tokens: int = 65536, batch_size: int = 1,
              pass1: str = "auto", progress: Any = "stderr", **options: Any) -> Params:
    """Calibrates OSCAR parameters for any transformers causal LM whose
    attention goes through transformers' ``AttentionInterface`` (Llama,
    Mistral, Qwen2/3, Gemma, Phi-3, GLM, OLMo, ...), on whatever device and
    dtype the model is loaded with: what ``oscar-calibrate`` does with its
    CPU engine, with the model's own forward.

    ``tokens``: 1-D token ids (a NumPy array, list or tensor; e.g. a
    ``uint32`` file as ``oscar-calibrate`` reads it) cut into
    ``floor(min(len, max_tokens) / window)`` independent windows. Pass 0
    feeds each layer's post-RoPE q, k, v (after q/k-norm where the model has
    it) to :class:`~liboscar.Calibrator`, pass 1 the k, v again (kept from
    pass 0 when they fit in half the physical memory, ``pass1="auto"``;
    ``"cache"`` / ``"recompute"`` force one way); then ``finalize``. The
    value metric of error-feedback rounding comes from each layer's output
    projection, as ``oscar-calibrate`` takes it (rounding falls back to the
    unweighted error, with a warning, for a module without one of shape
    [hidden, heads * head_dim]). Queries are scaled by ``scaling * sqrt(d)``
    where the model's softmax scale is not ``1/sqrt(d)`` (Gemma's
    ``query_pre_attn_scalar``), so the core's probes see the model's
    attention; logit soft-capping is not modelled. ``options``: the
    Calibrator's (``sink``, ``recent``, ``wide_bits``, ...); ``model_hash``
    defaults to :func:`model_fingerprint`. ``batch_size`` windows go through
    the model at once (1 feeds in ``oscar-calibrate``'s order, window by
    window). ``progress``: "stderr", None or a callable taking a line.

    Returns the :class:`~liboscar.Params`; ``.save(path)`` writes the
    parameter file every backend loads."""
    from .core import Calibrator

    cfg = _text_config(model)
    L, hq = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
    hkv = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // hq)
    if pass1 not in ("auto", "cache", "recompute"):
        raise ValueError(f"pass1 must be 'auto', 'cache' or 'recompute', got {pass1!r}")
    if window < 2 or max_tokens < window or batch_size < 1:
        raise ValueError(f"window {window} (>= 2), max_tokens {max_tokens} (>= window) and batch_size "
                         f"{batch_size} (>= 1) do not make a window")
    max_pos = int(getattr(cfg, "max_position_embeddings", 0) or 0)
    if max_pos and window > max_pos:  # as oscar-calibrate's --window
        raise ValueError(f"window {window} exceeds the model's max_position_embeddings {max_pos}; use at most "
                         f"{max_pos}")
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    ids = np.asarray(tokens)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(f"tokens: a 1-D array of integer ids, got shape {ids.shape} dtype {ids.dtype}")
    nw = min(len(ids), max_tokens) // window
    if nw < 1:
        raise ValueError(f"{len(ids)} tokens do not fill one window of {window}: give more tokens or a smaller "
                         f"window")
    vocab = int(cfg.vocab_size)
    if ids[:nw * window].size and (int(ids[:nw * window].min()) < 0 or int(ids[:nw * window].max()) >= vocab):
        raise ValueError(f"tokens: ids outside [0, {vocab}) (vocab_size of the model): wrong tokenizer or file")
    windows = torch.from_numpy(ids[:nw * window].astype(np.int64)).view(nw, window)
    if progress == "stderr":
        progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    options.setdefault("model_hash", model_fingerprint(model))
    calib = Calibrator(L, hq, hkv, d, **options)

    metric_set: set = set()
    seen: list = []
    kv_cache: Optional[list] = None
    if pass1 != "recompute":
        need = nw * L * 2 * window * hkv * d * 4
        try:
            limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        except (ValueError, OSError):  # pragma: no cover - platforms without sysconf
            limit = 1 << 30
        if pass1 == "cache" or need <= limit:
            kv_cache = [[None] * L for _ in range(nw)]

    dev = next(model.parameters()).device
    skip_head = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}

    def rows(x: torch.Tensor, b: int) -> np.ndarray:
        """[B, H, T, d] -> window b's [T, H, d] float32 rows on the host."""
        return x[b].transpose(0, 1).to(device="cpu", dtype=torch.float32).contiguous().numpy()

    def run(pass_: int) -> None:
        t0 = time.monotonic()
        for w0 in range(0, nw, batch_size):
            w1 = min(nw, w0 + batch_size)
            if pass_ == 1 and kv_cache is not None:
                for w in range(w0, w1):
                    for layer in range(L):
                        calib.feed(layer, None, *kv_cache[w][layer])
            else:
                seen.clear()

                def sink(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: Any) -> None:
                    layer = getattr(module, "layer_idx", len(seen))
                    if q.shape[1:] != (hq, window, d) or k.shape[1:] != (hkv, window, d) or v.shape != k.shape:
                        raise ValueError(f"calibrate: layer {layer} gives q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                         f"v {tuple(v.shape)}; expected [B, {hq}, {window}, {d}] and "
                                         f"[B, {hkv}, {window}, {d}] from the config")
                    seen.append(layer)
                    if layer not in metric_set:
                        metric_set.add(layer)
                        ms = _o_proj_metric(module, hq, hkv, d) if options.get("rounding", 1) else []
                        if ms is None:
                            warnings.warn(f"calibrate: layer {layer}'s attention has no output projection of "
                                          f"shape [hidden, {hq * d}]; error feedback weighs value errors "
                                          f"unweighted", stacklevel=2)
                        for h, m in enumerate(ms or []):
                            calib.set_value_metric(layer, h, m)
                    if scaling is not None and abs(scaling * math.sqrt(d) - 1.0) > 1e-6:
                        q = q * (scaling * math.sqrt(d))  # the core scores with 1/sqrt(d)
                    for b in range(q.shape[0]):
                        kr, vr = rows(k, b), rows(v, b)
                        calib.feed(layer, rows(q, b) if pass_ == 0 else None, kr, vr)
                        if pass_ == 0 and kv_cache is not None:
                            kv_cache[w0 + b][layer] = (kr, vr)

                try:
                    with torch.no_grad(), capture_attention(model, sink):
                        model(input_ids=windows[w0:w1].to(dev), use_cache=False, **skip_head)
                except OscarError as e:  # which window: a NaN in the model's activations is found there
                    raise OscarError(e.status, f"calibrate: pass {pass_}, windows {w0}..{w1 - 1} (tokens "
                                     f"{w0 * window}..{w1 * window - 1}): {str(e).rsplit(' [', 1)[0]}") from e
                if sorted(seen) != list(range(L)):
                    raise RuntimeError(f"calibrate: the forward called the attention function for layers "
                                       f"{sorted(seen)}, expected 0..{L - 1}: this model's attention does not go "
                                       f"through transformers' AttentionInterface")
            if progress:
                el = time.monotonic() - t0
                progress(f"pass {pass_}  window {w1}/{nw}  {w1 * window / max(el, 1e-9):.0f} tokens/s  "
                         f"ETA {el / w1 * (nw - w1):.1f} s")

    for p in (0, 1):
        calib.begin_pass(p)
        run(p)
    kv_cache = None
    t0 = time.monotonic()
    params = calib.finalize()
    if progress:
        progress(f"finalize  {time.monotonic() - t0:.1f} s  ({nw} windows of {window} tokens, {L} layers)")
    return params


# What from_pretrained reads from a checkpoint directory (besides the shards an index names).
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")


def _model_file(model: str, path: str) -> Optional[str]:
    """The name of the file of checkpoint directory ``model`` that ``path``
    is (a link, another spelling), or None."""
    if not os.path.isdir(model):
        return None
    names = list(_MODEL_FILES)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        ip = os.path.join(model, index)
        if not os.path.isfile(ip):  # (a FIFO would block the read)
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            with open(ip, encoding="utf-8") as f:
                names += [n for n in json.load(f)["weight_map"].values() if isinstance(n, str)]
    for name in names:
        with contextlib.suppress(OSError):
            if os.path.samefile(os.path.join(model, name), path):
                return name
    return None


def main(argv: Optional[list] = None) -> int:
    """``python -m liboscar.hf MODEL --tokens F | --text F --out P``: calibrate a
    transformers checkpoint (a directory or hub id already in the local cache)
    with :func:`calibrate` and write the parameter file."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m liboscar.hf",
                                 description="OSCAR calibration with a transformers model's own forward; writes "
                                             "the parameter file every liboscar backend loads.")
    ap.add_argument("model", help="checkpoint directory (or a hub id in the local cache)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="uint32 little-endian token ids (what oscar-calibrate reads)")
    src.add_argument("--text", help="UTF-8 text, tokenized with the model's tokenizer")
    ap.add_argument("--out", required=True, help="parameter file to write (.safetensors)")
    ap.add_argument("--window", type=int, default=2048, help="tokens per independent window (2048)")
    ap.add_argument("--max-tokens", type=int, default=65536, help="calibration tokens (65536)")
    ap.add_argument("--batch-size", type=int, default=1, help="windows per forward (1)")
    ap.add_argument("--device", default="cpu", help="torch device of the model (cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="model weights' dtype (float32)")
    ap.add_argument("--sink", type=int, help="cache sink the clips are fitted for (default 64; 0: none)")
    ap.add_argument("--recent", type=int, help="recent window the clips are fitted for (default 256; 0: none)")
    ap.add_argument("--wide-bits", type=float,
                    help="budget of 3-bit head-tensors in bits per element (default: the library's, 0.05 for "
                         "oscar2, 0 with --lloyd-max; 0: none)")
    ap.add_argument("--per-layer", action="store_true", help="one rotation per layer instead of per KV head")
    ap.add_argument("--lloyd-max", action="store_true", help="fit for Lloyd-Max levels (oscar2-lm)")
    a = ap.parse_args(argv)

    out = os.path.abspath(a.out)
    if os.path.islink(out) and not os.path.exists(out):  # the save would replace the link, not make its target
        ap.error(f"--out {a.out} is a symbolic link to '{os.readlink(out)}', which does not exist; give a file name "
                 f"(remove the link) or create the link's target first")
    if os.path.exists(out) and not os.path.isfile(out):
        ap.error(f"--out {a.out}: exists and is not a regular file")
    if not os.access(os.path.dirname(out), os.W_OK):
        ap.error(f"--out {a.out}: its folder does not exist or is not writable")
    src_path = a.tokens or a.text
    if not os.path.isfile(src_path):
        ap.error(f"{src_path}: not a regular file")
    # Written after the whole calibration: over an input it would replace it (oscar-calibrate refuses the same).
    if os.path.exists(out):
        if os.path.samefile(out, src_path):
            ap.error(f"--out {a.out} and --{'tokens' if a.tokens else 'text'} name the same file; choose another --out")
        hit = _model_file(a.model, out)
        if hit:
            ap.error(f"--out {a.out} is the model's {hit} (an input); choose another --out")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.tokens:
        if os.path.getsize(src_path) % 4:
            ap.error(f"--tokens {src_path}: size is not a multiple of 4 (uint32 ids)")
        tokens = np.fromfile(src_path, dtype="<u4")
    else:
        with open(src_path, encoding="utf-8") as f:
            tokens = np.asarray(AutoTokenizer.from_pretrained(a.model)(f.read())["input_ids"], dtype=np.int64)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(a.device).eval()
    options: dict = {} if a.wide_bits is None else {"wide_bits": a.wide_bits}
    for key in ("sink", "recent"):
        if getattr(a, key) is not None:
            options[key] = getattr(a, key)
    if a.per_layer:
        options["per_head"] = 0
    if a.lloyd_max:
        options["method"] = "oscar2-lm"
    t0 = time.monotonic()
    try:
        params = calibrate(model, tokens, window=a.window, max_tokens=a.max_tokens, batch_size=a.batch_size,
                           **options)
    except (ValueError, NotImplementedError) as e:  # a model or window it cannot calibrate: bad input, named
        ap.error(str(e))
    except OscarError as e:  # the library's refusal of the model's shape is bad input too; the rest a failure
        bad_input = e.status in (1, 2, 3, 4, 5, 7, 8)  # invalid, head_dim, group, unsupported, shape, empty, long
        if bad_input:
            ap.error(str(e))
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 1
    params.save(out)
    i = params.info
    print(f"wrote {a.out} ({i.num_layers} layers, {i.num_q_heads}/{i.num_kv_heads} heads, head_dim {i.head_dim}, "
          f"{i.method}, {i.calib_tokens} calibration tokens, fingerprint {i.model_hash}) in "
          f"{time.monotonic() - t0:.1f} s")
    return 0


register()

if __name__ == "__main__":
    sys.exit(main())
