"""liboscar.hf (transformers integration) on the CPU backend with the real
tiny-qwen3 checkpoint (../shared/models/tiny-qwen3, or $OSCAR_HF_MODEL).
Skipped without torch, transformers or the model.

What is compared, and why the tolerances:
- per layer, teacher forced: the attention output of OscarCache's stepwise
  path (append + oscar_decode per token) against ``reference_attention``
  (float64 attention over oscar_fakequant rows in the 2-bit region, the
  CPU reference codec, with the 16-bit rows as the cache stores them) on the
  same inputs. Both round the output to bfloat16, so they may differ by a
  couple of bf16 steps (2^-8 relative each) of the largest output: 1 % of
  max |out| (measured: 0.38 % at most). A reference without the 2-bit region
  must be farther in some layer (3x the worst difference).
- generate with the BF16 method against transformers' default cache: the
  prompt's logits are the same SDPA computation (equal); decode steps differ
  by the cache's bfloat16 rounding of K/V, queries and outputs, which moves
  tiny-qwen3's logits by a few hundredths (measured 0.048 at most over 400
  positions): 0.25 allowed, and the greedy tokens must agree.
"""
import os

import numpy as np
import pytest

from conftest import REPO, cache_kw, torch_devices

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface, AutoModelForCausalLM  # noqa: E402

import liboscar  # noqa: E402
from liboscar import hf  # noqa: E402

MODEL = os.environ.get("OSCAR_HF_MODEL", str(REPO.parent / "shared/models/tiny-qwen3"))
TOKENS = os.environ.get("OSCAR_HF_TOKENS", str(REPO.parent / "shared/data/tiny-qwen3/eval.tokens"))
PARAMS = REPO / "docs/eval/tiny-qwen3.oscar.safetensors"
if not os.path.isdir(MODEL) or not os.path.exists(TOKENS):
    pytest.skip(f"tiny-qwen3 not found ({MODEL}; set OSCAR_HF_MODEL, OSCAR_HF_TOKENS)", allow_module_level=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokens():
    return np.fromfile(TOKENS, dtype=np.uint32)


def ids_of(tokens, n, offset=0):
    return torch.tensor(tokens[offset:offset + n].astype(np.int64))[None]


def params_for(method):
    return liboscar.Params.load(PARAMS) if method == "oscar2" else None


DEVICES = torch_devices()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["oscar2", "int2"])
def test_layer_outputs_match_reference(model, tokens, method, device):
    """Every layer's attention output, stepwise through the cache, against
    the fakequant reference on the same inputs (the reference's output is
    what the model carries on with, so each layer sees identical inputs).
    On CUDA (the H200 run) the CUDA plugin's kernels against the same CPU
    reference, within test_cuda.py's CUDA-vs-CPU bound (1.6 %: its 2-bit
    scores are int8 tensor-core dots of q limbs)."""
    n = 340  # the 2-bit region (64 <= p <= t - 256) holds rows from t = 320 on
    tol = 1e-2 if device == "cpu" else 1.6e-2
    model = model.to(device)
    prm = params_for(method)
    ref = hf.reference_attention(prm, method)
    unquantized = hf.reference_attention(prm, "bf16")
    cache = hf.OscarCache(model, prm, method=method, prefill="stepwise", switch_attention=False)
    worst, gap = [], []

    def both(module, q, k, v, mask, **kw):
        r, _ = ref(module, q, k, v, mask, **kw)
        u, _ = unquantized(module, q, k, v, mask, **kw)
        kk, vv = cache.update(k, v, module.layer_idx)
        o, _ = hf.oscar_attention_forward(module, q, kk, vv, mask, **kw)
        scale = float(r.abs().max())
        assert o.device == r.device == q.device
        worst.append(float((o - r).abs().max()) / scale)
        gap.append(float((u - r)[:, 320:].abs().max()) / scale)
        return r, None

    AttentionInterface.register("oscar_test_both", both)
    model.set_attn_implementation("oscar_test_both")
    try:
        with torch.no_grad():
            model(ids_of(tokens, n).to(device))
    finally:
        model.set_attn_implementation("sdpa")
        model.to("cpu")
    assert len(worst) == 8 and cache.get_seq_length() == n
    assert cache.variant.startswith(device + ":")
    assert max(worst) < tol, f"{method}: layer outputs differ from the reference by {max(worst):.2e} of max |out|"
    assert max(gap) > 3 * max(worst), f"{method}: the 2-bit region moves outputs by only {max(gap):.2e}"


def greedy(model, ids, n, cache=None, mask=None):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, **cache_kw(model, cache), max_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def test_generate_bf16_matches_default_cache(model, tokens):
    ids = ids_of(tokens, 300)
    model.set_attn_implementation("sdpa")
    ref_tok, ref_log = greedy(model, ids, 12)
    cache = hf.OscarCache(model, method="bf16")
    assert model.config._attn_implementation == "oscar"
    tok, log = greedy(model, ids, 12, cache)
    model.set_attn_implementation("sdpa")
    assert torch.equal(log[:, 0], ref_log[:, 0]), "prompt logits: both are SDPA over the same rows"
    diff = float((log - ref_log).abs().max())
    assert diff < 0.25, f"decode logits differ from the default cache by {diff:.3f}"
    assert torch.equal(tok, ref_tok)
    assert cache.get_seq_length() == 300 + 11 and cache.paged.lens[:, 0].tolist() == [311] * 8


def test_generate_oscar2_runs_on_the_2bit_kernel(model, tokens):
    ids = ids_of(tokens, 400, offset=5000)
    cache = hf.OscarCache(model, str(PARAMS), max_seq_len=512)
    tok, log = greedy(model, ids, 8, cache)
    model.set_attn_implementation("sdpa")
    ref_tok, ref_log = greedy(model, ids, 8)
    # the shipped file is the default calibration: 3-bit head-tensors get their 1-bit planes (FORMAT.md 2.7),
    # 1/4 bit per element of their layer each at 2 KV heads; bits_per_element is the mean over the layers
    # (the largest page, layout.sizes(), holds layout.wide_tensors of them)
    assert cache.variant.startswith("cpu:") and cache.method == "oscar2"
    wide = [sum(cache.params.code_bits(L, h, kv) == 3 for h in range(2) for kv in "kv") for L in cache.oscar_layers]
    assert cache.layout.wide_tensors == max(wide) > 0
    assert cache.bits_per_element == pytest.approx(2.25 + sum(wide) / len(wide) / 4, rel=1e-12)
    assert cache.layout.sizes().bits_per_element == 2.25 + max(wide) / 4
    assert torch.equal(log[:, 0], ref_log[:, 0])
    assert torch.isfinite(log).all() and tok.shape == (1, 8)
    assert 0 < cache.nbytes() < 8 * 2 * 512 * 2 * 128 * 2  # below the BF16 size of the same tokens
    # The 2-bit region is read: the first decode step's logits move, but stay close.
    d = float((log[:, 1] - ref_log[:, 1]).abs().max())
    assert 0 < d < 2.0, d


def test_wide_parameters_get_their_planes(model, tokens):
    """Parameters with 3-bit head-tensors (the calibration's default code-width budget writes them) give a
    layout with room for their planes, per layer; the layout had wide_tensors 0 and the plan refused them."""
    prm = liboscar.Params.load(PARAMS)
    prm.set_code_bits(4, 1, "k", 3)
    prm.set_code_bits(6, 0, "v", 3)
    prm.set_code_bits(6, 1, "v", 3)
    cache = hf.OscarCache(model, prm, max_seq_len=512)
    assert cache.layout.wide_tensors == 2 and cache.layout.wide_per_layer == 1
    tok, log = greedy(model, ids_of(tokens, 400, offset=5000), 4, cache)
    assert torch.isfinite(log).all() and tok.shape == (1, 4)


def test_left_padding_matches_each_sequence_alone(model, tokens):
    """A padded batch: only each sequence's real tokens enter the cache, so
    every row decodes as it does alone."""
    lens = [120, 90]
    width = max(lens)
    ids = torch.zeros((2, width), dtype=torch.long)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, width - n:] = ids_of(tokens, n, offset=1000 * i)[0]
        mask[i, width - n:] = 1
    cache = hf.OscarCache(model, method="int2", sink=16, recent=32)
    tok, _ = greedy(model, ids, 6, cache, mask)
    assert cache.paged.lens[0].tolist() == [n + 5 for n in lens]
    for i, n in enumerate(lens):
        alone, _ = greedy(model, ids_of(tokens, n, offset=1000 * i), 6, hf.OscarCache(model, method="int2", sink=16,
                                                                                       recent=32))
        assert torch.equal(tok[i], alone[0]), f"sequence {i}: {tok[i].tolist()} padded, {alone[0].tolist()} alone"
    model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("device", DEVICES)
def test_second_turn_runs_oscar_extend(model, tokens, device):
    """Several tokens into a filled cache (a second turn): chunks appended and
    attended with oscar_extend. Chunks of 1 are decode steps (extend with one
    query per sequence is oscar_decode bit for bit on the CPU backend), so they
    must give the stepwise logits exactly (on CUDA, where the extend and decode
    kernels differ, as closely as chunks of 64); chunks of 64 read a few rows of the
    chunk's end in 2 bits that a decode step would read in BF16, so they move
    the logits a little: KL against BF16 within 1.5x of the stepwise one
    (docs/API.md: chunks well below W are as accurate as decode steps)."""
    first, second = ids_of(tokens, 330, offset=9000).to(device), ids_of(tokens, 150, offset=9330).to(device)
    prm = liboscar.Params.load(PARAMS)
    model = model.to(device)

    def second_logits(prefill="exact", **kw):
        cache = hf.OscarCache(model, prm, max_seq_len=512, **kw)
        with torch.no_grad():
            model(first, **cache_kw(model, cache))  # the same exact prefill (SDPA) for all
            cache.prefill = prefill
            out = model(second, **cache_kw(model, cache)).logits
        assert cache.paged.lens[:, 0].tolist() == [480] * 8
        return out

    try:
        step = second_logits("stepwise")
        one = second_logits(extend_chunk=1)
        chunk = second_logits()
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            bf16 = model(torch.cat([first, second], 1)).logits[:, 330:]
    finally:
        model.set_attn_implementation("sdpa")
        model.to("cpu")
    kl = lambda x: float(torch.nn.functional.kl_div(x.log_softmax(-1), bf16.log_softmax(-1), log_target=True,  # noqa
                                                    reduction="batchmean")) / x.shape[1]
    print(f"{device}: KL against BF16 per token: stepwise {kl(step):.5f}, chunks of 1 {kl(one):.5f}, "
          f"chunks of 64 {kl(chunk):.5f}")
    if device == "cpu":
        assert torch.equal(one, step), float((one - step).abs().max())
    else:
        assert kl(one) < 1.5 * kl(step)
    assert not torch.equal(chunk, step) and kl(chunk) < 1.5 * kl(step)
    with pytest.raises(ValueError, match="extend_chunk"):
        hf.OscarCache(model, prm, extend_chunk=257)


def test_errors(model, tokens):
    with pytest.raises(liboscar.OscarError, match="SHAPE_MISMATCH|shape|layers"):
        hf.OscarCache(model, liboscar.Params.builtin("oscar2", 4, 8, 2, 128))
    with pytest.raises(ValueError, match="prefill must be"):
        hf.OscarCache(model, method="int2", prefill="chunked")
    ids = ids_of(tokens, 40)
    with pytest.raises(NotImplementedError, match="beam search|batch_repeat_interleave"):
        with torch.no_grad():
            model.generate(ids, **cache_kw(model, hf.OscarCache(model, method="int2")), max_new_tokens=3, num_beams=2,
                           do_sample=False)
    # A model that does not use the "oscar" attention would read only the fresh rows: refused.
    cache = hf.OscarCache(model, method="int2", switch_attention=False)
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="not using attention 'oscar'"):
        with torch.no_grad():
            model(ids, **cache_kw(model, cache))
            model(ids[:, :1], **cache_kw(model, cache))
    hf._PENDING.clear()
    # Without an OscarCache the "oscar" attention is SDPA.
    model.set_attn_implementation("oscar")
    with torch.no_grad():
        a = model(ids).logits
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        b = model(ids).logits
    assert torch.equal(a, b)


def test_another_models_parameters_are_refused(model, tmp_path):
    """Parameters of the same shape calibrated for another model (another fingerprint) are refused by
    name, as oscar-eval refuses them; they were taken without a word. A file without a hash passes."""
    raw = PARAMS.read_bytes()
    mine = hf.model_fingerprint(model)
    assert mine.encode() in raw  # the shipped file names this model
    other = tmp_path / "other.safetensors"
    other.write_bytes(raw.replace(mine.encode(), b"0123456789abcdef"))
    with pytest.raises(liboscar.OscarError, match="model hash"):
        hf.OscarCache(model, str(other))
    hf.OscarCache(model, str(PARAMS))
    hf.OscarCache(model, liboscar.Params.builtin("oscar2", 8, 8, 2, 128))


def test_readme_transformers_example(model, monkeypatch):
    """README.md's transformers example runs as written from the repository root."""
    import contextlib
    import io
    import re

    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- test: README transformers example[^\n]*\n```python\n(.*?)\n```", text, re.S)
    assert m, "README.md has no marked transformers example"
    code = m.group(1).replace('"../shared/models/tiny-qwen3"', repr(MODEL))
    if "cache" not in cache_kw(model, None):
        code = code.replace("cache=cache", "past_key_values=cache")  # its name before transformers 5.24
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    buf = io.StringIO()
    env = {}
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "README.md", "exec"), env)
    env["model"].set_attn_implementation("sdpa")
    assert env["out"].shape == (1, env["ids"].shape[1] + 24)
    # the line the README shows it printing ends as this run's does (the value is the cache's mean)
    shown = re.search(re.escape(m.group(0)) + r"\n[^`]*```\n(.*?)\n```", text, re.S)
    assert shown, "README.md shows no output of its transformers example"
    tail = f"| {env['cache'].bits_per_element} bits per element in the 2-bit region"
    assert shown.group(1).rstrip().endswith(tail) and buf.getvalue().rstrip().endswith(tail), buf.getvalue()


def test_each_forward_raises_what_the_kernels_flagged(model, tokens, monkeypatch):
    """GPU kernels flag NaN/Inf K/V rows and queries in the workspace and write zero rows; OscarCache
    never read the flag, so a GPU user got zeros without an error. Now every forward ends with the
    PagedCache's check (once, after its last liboscar layer). Counted here on the CPU backend, whose
    check is the same call."""
    calls = []
    real = liboscar.PagedCache.check
    monkeypatch.setattr(liboscar.PagedCache, "check", lambda self, *a, **k: (calls.append(1), real(self, *a, **k)))
    cache = hf.OscarCache(model, method="int2")
    greedy(model, ids_of(tokens, 40), 3, cache)
    model.set_attn_implementation("sdpa")
    assert len(calls) == 3, f"{len(calls)} checks for a prompt forward and 2 decode steps"


def test_a_cache_reused_for_another_batch_size_says_so(model, tokens):
    """The pools are allocated for the first forward's batch size. A forward of another batch size
    through the same cache was refused by PagedCache.append with a message about new_tokens, an
    argument the caller never passed; OscarCache names the batch sizes and the fix. (Written on a
    machine without torch: not run there; liboscar's own message is checked in test_bad_input.py.)"""
    cache = hf.OscarCache(model, method="int2")
    with torch.no_grad():
        model(ids_of(tokens, 16), **cache_kw(model, cache))
        with pytest.raises(ValueError, match=r"batch size 2, .* batch size 1 .* new OscarCache") as e:
            model(torch.cat([ids_of(tokens, 1, 16)] * 2), **cache_kw(model, cache))
    assert "new_tokens" not in str(e.value)
    hf._PENDING.clear()
    model.set_attn_implementation("sdpa")
