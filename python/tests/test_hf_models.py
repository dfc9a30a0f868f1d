"""liboscar.hf beyond tiny-qwen3: calibrate / capture_attention (OSCAR
calibration with a transformers model's own forward) and OscarCache on
architectures the C engine does not run, hybrid ones included. Skipped
without torch, transformers or liboscar_calib; the tiny-qwen3 checks also
need the model.

- the captured q, k, v are the post-RoPE (post q/k-norm) rows transformers
  computes: against reference.safetensors (transformers in fp32, the same
  64 tokens), and the model's logits do not move while capturing;
- on tiny-qwen3 the parameters are oscar-calibrate's (where that tool is
  found): same clips, eigenvalues and rotations up to float rounding (the
  two forwards differ in the last bits: measured 2.5e-5 relative on the
  eigenvalues, 7e-5 on rotation entries, over 2 windows);
- architectures the C engine does not run (Gemma 2, Phi-3 with its head_dim
  96, GLM-4) calibrate,
  and the file serves the model through OscarCache (Gemma 2's soft-capping,
  which the decode does not compute, is refused);
- a hybrid model (Gemma 3: sliding-window and full-attention layers) keeps
  its sliding layers in transformers' cache and the full ones in liboscar:
  with the BF16 method it generates what the default cache does;
- Gemma's softmax scale (query_pre_attn_scalar) reaches the key target;
- bad tokens and unknown attention implementations raise, naming the fix.
"""
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import REPO, cache_kw, torch_devices

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import liboscar  # noqa: E402
from liboscar import _capi, hf  # noqa: E402

if not _capi.have_calib():
    pytest.skip("liboscar_calib not built (needs LAPACK)", allow_module_level=True)

MODEL = os.environ.get("OSCAR_HF_MODEL", str(REPO.parent / "shared/models/tiny-qwen3"))
DATA = REPO.parent / "shared/data/tiny-qwen3"
have_qwen = os.path.isdir(MODEL) and (DATA / "calib.tokens").exists()
need_qwen = pytest.mark.skipif(not have_qwen, reason=f"tiny-qwen3 not found ({MODEL})")

SMALL = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4)
ARCHS = {
    "llama": ("LlamaConfig", dict(num_key_value_heads=2, head_dim=64)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=1, head_dim=64, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2)),
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=128, query_pre_attn_scalar=64)),
    "phi3": ("Phi3Config", dict(hidden_size=384, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)),
    "glm4": ("Glm4Config", dict(num_key_value_heads=2, head_dim=64, pad_token_id=0)),
}


def tiny(arch):
    name, extra = ARCHS[arch]
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cls(**{**SMALL, **extra})).eval()


@pytest.fixture(scope="module")
def qwen():
    return transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


@need_qwen
def test_capture_is_what_transformers_computes(qwen):
    from safetensors.numpy import load_file
    ref = load_file(str(DATA / "reference.safetensors"))
    ids = torch.from_numpy(ref["input_ids"].astype(np.int64).reshape(1, -1))
    got = {}

    def keep(module, q, k, v, scaling):
        got[module.layer_idx] = [x[0].transpose(0, 1).numpy().copy() for x in (q, k, v)]

    impl = qwen.config._attn_implementation
    with torch.no_grad():
        plain = qwen(ids).logits
        with hf.capture_attention(qwen, keep):
            captured = qwen(ids).logits
    assert torch.equal(plain, captured), "capturing must not change the forward"
    assert qwen.config._attn_implementation == impl
    assert sorted(got) == list(range(qwen.config.num_hidden_layers))
    for layer, rows in got.items():
        for name, x in zip("qkv", rows):
            r = ref[f"layers.{layer}.{name}"]
            assert x.shape == r.shape, (layer, name)
            err = np.abs(x - r).max() / np.abs(r).max()
            assert err < 1e-4, f"layer {layer} {name}: {err:.2e} of max |x|"


def test_capture_restores_the_model_after_an_error():
    m = tiny("llama")
    impl = m.config._attn_implementation
    names = set(transformers.AttentionInterface._global_mapping)

    def boom(*args):
        raise KeyError("from the capture function")

    with pytest.raises(KeyError, match="from the capture function"), hf.capture_attention(m, boom):
        m(torch.zeros((1, 4), dtype=torch.long))
    assert m.config._attn_implementation == impl
    assert set(transformers.AttentionInterface._global_mapping) == names


def _find_oscar_calibrate():
    for cand in (os.environ.get("OSCAR_CALIBRATE"), shutil.which("oscar-calibrate"),
                 str(REPO / "build/bin/oscar-calibrate")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


@need_qwen
def test_same_parameters_as_oscar_calibrate(qwen, tmp_path):
    tool = _find_oscar_calibrate()
    if tool is None:
        pytest.skip("oscar-calibrate not found (set OSCAR_CALIBRATE)")
    ref_path = tmp_path / "c.safetensors"
    subprocess.run([tool, MODEL, "--tokens", str(DATA / "calib.tokens"), "--out", str(ref_path),
                    "--max-tokens", "4096"], check=True, capture_output=True)
    tokens = np.fromfile(DATA / "calib.tokens", dtype=np.uint32)
    lines = []
    p = hf.calibrate(qwen, tokens, max_tokens=4096, progress=lines.append)
    assert lines and lines[-1].startswith("finalize")
    c = liboscar.Params.load(str(ref_path))
    assert p.info == c.info, "same shape, method, token count and model fingerprint"
    for layer in range(p.info.num_layers):
        for which in "kv":
            for h in range(p.info.num_kv_heads):
                assert p.clip(layer, which, h) == c.clip(layer, which, h)
                ep, ec = p.eigenvalues(layer, which, h), c.eigenvalues(layer, which, h)
                assert np.abs(ep - ec).max() < 1e-4 * np.abs(ec).max(), (layer, which, h)
                dr = np.abs(p.rotation(layer, which, h) - c.rotation(layer, which, h)).max()
                assert dr < 1e-3, (layer, which, h, dr)


def test_mistral_same_parameters_as_oscar_calibrate(tmp_path):
    """Mistral runs in both tools (the C engine reads it as the Llama layout):
    the same file up to float rounding, and the same fingerprint."""
    tool = _find_oscar_calibrate()
    if tool is None:
        pytest.skip("oscar-calibrate not found (set OSCAR_CALIBRATE)")
    m = tiny("mistral")
    m.save_pretrained(tmp_path / "model")
    tok = tmp_path / "t.tokens"
    ids = np.random.default_rng(5).integers(0, 512, 1024).astype("<u4")
    ids.tofile(tok)
    subprocess.run([tool, str(tmp_path / "model"), "--tokens", str(tok), "--out", str(tmp_path / "c.safetensors"),
                    "--window", "512", "--sink", "8", "--recent", "32"], check=True, capture_output=True)
    c = liboscar.Params.load(str(tmp_path / "c.safetensors"))
    p = hf.calibrate(m, ids, window=512, progress=None, sink=8, recent=32)
    assert p.info == c.info
    for layer in range(2):
        for which in "kv":
            assert p.clip(layer, which) == c.clip(layer, which)
            assert np.abs(p.rotation(layer, which, 0) - c.rotation(layer, which, 0)).max() < 1e-3


@need_qwen
def test_fingerprint_is_oscar_calibrates(qwen):
    committed = liboscar.Params.load(str(REPO / "docs/eval/tiny-qwen3.oscar.safetensors"))
    assert hf.model_fingerprint(qwen) == committed.info.model_hash


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_architectures_the_c_engine_does_not_run(arch):
    m = tiny(arch)
    cfg = m.config
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, cfg.vocab_size, 1024))
    with torch.no_grad():
        before = m(ids[None, :64]).logits
    p = hf.calibrate(m, ids, window=256, max_tokens=512, progress=None, sink=8, recent=32)
    with torch.no_grad():
        assert torch.equal(before, m(ids[None, :64]).logits)
    hq = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    assert (p.info.num_layers, p.info.num_q_heads, p.info.num_kv_heads, p.info.head_dim) == (
        cfg.num_hidden_layers, hq, cfg.num_key_value_heads, d)
    assert p.info.calib_tokens == 512 and p.info.model_hash == hf.model_fingerprint(m)
    for layer in range(cfg.num_hidden_layers):
        for which in "kv":
            assert p.orthogonality_error(layer, which, 0) < 1e-5
            assert 0.5 <= p.clip(layer, which) <= 1.0
    if getattr(cfg, "attn_logit_softcapping", None):
        with pytest.raises(NotImplementedError, match="soft-capping"):
            hf.OscarCache(m, p, sink=8, recent=32, max_seq_len=256)
        return
    cache = hf.OscarCache(m, p, sink=8, recent=32, max_seq_len=256)
    with torch.no_grad():
        out = m.generate(ids[None, :96], **cache_kw(m, cache), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 100)


@pytest.mark.parametrize("device", torch_devices())
def test_hybrid_model_keeps_its_sliding_layers_in_transformers(device):
    cls = getattr(transformers, "Gemma3TextConfig", None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no Gemma3TextConfig")
    torch.manual_seed(0)
    cfg = cls(**{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=128, sliding_window=32,
              query_pre_attn_scalar=128,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    m = transformers.AutoModelForCausalLM.from_config(cfg).eval().to(device)
    ids = torch.from_numpy(np.random.default_rng(6).integers(0, 512, (1, 120))).to(device)
    kw = dict(max_new_tokens=10, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = m.generate(ids, **kw)
        cache = hf.OscarCache(m, method="bf16", sink=8, recent=32, max_seq_len=256)
        out = m.generate(ids, **cache_kw(m, cache), **kw)
    assert cache.oscar_layers == [1, 3]
    assert [type(x).__name__ for x in cache.layers] == ["DynamicSlidingWindowLayer", "OscarLayer"] * 2
    assert cache.paged.lens[:, 0].tolist() == [0, 129, 0, 129] and cache.get_seq_length() == 129
    size = lambda x: x.numel() if isinstance(x, torch.Tensor) else x.size  # noqa: E731
    assert size(cache.paged.pages[0]) == 0 and size(cache.paged.pages[1]) > 0
    assert cache.variant.startswith(device + ":")
    with pytest.raises(ValueError, match="no pools"):
        cache.paged.decode(0, np.zeros((1, 4, 128), np.uint16))
    diff = float((torch.stack(out.logits) - torch.stack(ref.logits)).abs().max())
    assert torch.equal(out.sequences, ref.sequences) and diff < 0.05, diff
    all_sliding = cls(**SMALL, num_key_value_heads=2, head_dim=64, sliding_window=32,
                      layer_types=["sliding_attention"] * 2)
    with pytest.raises(NotImplementedError, match="no full-attention layer"):
        hf.OscarCache(transformers.AutoModelForCausalLM.from_config(all_sliding), method="bf16")
    # The cache's quant group is the one calibration fits clips for (the format's default, which the
    # calibration options carry: 128 at head_dim 256).
    d256 = cls(**SMALL, num_key_value_heads=2, head_dim=256, layer_types=["full_attention"] * 2)
    assert hf.OscarCache(transformers.AutoModelForCausalLM.from_config(d256), method="bf16").layout.group == 128
    assert _capi.defaults(_capi.CalibOptions, _capi.calib().oscar_calib_options_default, 2, 4, 2, 256).group == 128


def test_softmax_scale_reaches_the_key_target():
    """Gemma 2 scores with query_pre_attn_scalar**-0.5, not head_dim**-0.5:
    with the published key target (key_attn_weight 0) the eigenvalues must be
    those of E[q q^T] of the queries scaled by scaling * sqrt(d)."""
    m = tiny("gemma2")
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 512, 256))
    qs = []

    def keep(module, q, k, v, scaling):
        if module.layer_idx == 0:
            qs.append((q[0].double() * (scaling * math.sqrt(q.shape[-1]))).transpose(0, 1).numpy())

    with torch.no_grad(), hf.capture_attention(m, keep):
        m(ids[None])
    p = hf.calibrate(m, ids, window=256, max_tokens=256, progress=None, key_attn_weight=0.0, sink=8, recent=32)
    q = qs[0]  # [T, Hq, d]
    g = q.shape[1] // p.info.num_kv_heads
    for h in range(p.info.num_kv_heads):
        x = q[:, h * g:(h + 1) * g].reshape(-1, q.shape[2])
        want = np.sort(np.linalg.eigvalsh(x.T @ x / len(x)))[::-1]
        got = p.eigenvalues(0, "k", h)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-6 * want[0]), (h, got[:4], want[:4])
    unscaled = np.linalg.eigvalsh(x.T @ x / len(x)).max() / (m.config.head_dim / m.config.query_pre_attn_scalar)
    assert not np.isclose(got[0], unscaled, rtol=1e-2), "the test must tell scaled from unscaled queries"


def test_pass1_from_memory_or_recomputed_is_the_same():
    m = tiny("qwen2")
    ids = np.random.default_rng(3).integers(0, 512, 512).astype(np.uint32)
    a = hf.calibrate(m, ids, window=256, progress=None, pass1="cache", sink=8, recent=32)
    b = hf.calibrate(m, ids, window=256, progress=None, pass1="recompute", sink=8, recent=32)
    for layer in range(2):
        for which in "kv":
            assert np.array_equal(a.rotation(layer, which, 1), b.rotation(layer, which, 1))
            assert a.clip(layer, which) == b.clip(layer, which)


def test_bad_input_is_named():
    m = tiny("llama")
    with pytest.raises(ValueError, match="outside \\[0, 512\\)"):
        hf.calibrate(m, np.full(512, 512), window=256, progress=None)
    with pytest.raises(ValueError, match="do not fill one window"):
        hf.calibrate(m, np.zeros(100, np.int64), window=256, progress=None)
    with pytest.raises(ValueError, match="1-D array of integer ids"):
        hf.calibrate(m, np.zeros((2, 256)), window=256, progress=None)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        hf.calibrate(m, np.zeros(1 << 16, np.int64), window=m.config.max_position_embeddings + 1, progress=None)
    with pytest.raises(ValueError, match="pass1"):
        hf.calibrate(m, np.zeros(512, np.int64), window=256, progress=None, pass1="sometimes")
    with pytest.raises(TypeError, match="unknown option"):
        hf.calibrate(m, np.zeros(512, np.int64), window=256, progress=None, clipk=0.9)
    # A model whose activations overflow: the core refuses the non-finite row, naming the window.
    with torch.no_grad():
        m.model.layers[1].self_attn.k_proj.weight[0, 0] = float("inf")
    with pytest.raises(liboscar.OscarError, match="pass 0, windows 0..0 .*key of token .* is not finite"):
        hf.calibrate(m, np.ones(512, np.int64), window=256, progress=None)
    assert m.config._attn_implementation == "sdpa"
    m.config._attn_implementation = "no-such-attention"
    with pytest.raises(ValueError, match="not registered"):
        hf.calibrate(m, np.zeros(512, np.int64), window=256, progress=None)


def test_reference_attention_groups_as_the_cache_at_head_dim_256():
    # reference_attention(group=0) quantized whole 256-wide rows (oscar_fakequant's 0 = head_dim) while
    # OscarCache (Layout group 0) stores the format's default group for head_dim 256, 128: the "reference"
    # of the cache's stepwise path measured another codec at head dims above 128.
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=256)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ref = hf.reference_attention(None, "int2", sink=4, recent=8)
    cache = hf.OscarCache(model, None, method="int2", sink=4, recent=8, page_size=16, prefill="stepwise",
                          switch_attention=False)
    worst = []

    def both(module, q, k, v, mask, **kw):
        r, _ = ref(module, q, k, v, mask, **kw)
        kk, vv = cache.update(k, v, module.layer_idx)
        o, _ = hf.oscar_attention_forward(module, q, kk, vv, mask, **kw)
        worst.append(float((o - r).abs().max()) / float(r.abs().max()))
        return r, None

    transformers.AttentionInterface.register("oscar_test_d256", both)
    model.set_attn_implementation("oscar_test_d256")
    try:
        with torch.no_grad():
            model(torch.randint(0, 512, (1, 48)))
    finally:
        model.set_attn_implementation("sdpa")
    assert cache.layout.group == 128 and len(worst) == 2
    assert max(worst) < 1e-2, f"layer outputs differ from the reference by {max(worst):.2e} of max |out|"


def test_command_line(tmp_path, capsys):
    m = tiny("mistral")
    model_dir = tmp_path / "model"
    m.save_pretrained(model_dir)
    tok = tmp_path / "calib.tokens"
    np.random.default_rng(4).integers(0, 512, 600).astype("<u4").tofile(tok)
    out = tmp_path / "p.safetensors"
    assert hf.main([str(model_dir), "--tokens", str(tok), "--out", str(out), "--window", "256",
                    "--sink", "8", "--recent", "0"]) == 0
    assert "wrote" in capsys.readouterr().out
    p = liboscar.Params.load(str(out))
    assert (p.info.calib_tokens, p.info.model_hash) == (512, hf.model_fingerprint(m))
    # Refused before any model is loaded: what cannot be read or written.
    odd = tmp_path / "odd.tokens"
    odd.write_bytes(b"\0" * 1023)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, why in ((["--tokens", str(tok), "--out", str(tmp_path / "no/such/dir/p.safetensors")], "not writable"),
                      (["--tokens", str(tok), "--out", str(tmp_path)], "not a regular file"),
                      (["--tokens", str(fifo), "--out", str(out)], "not a regular file"),
                      (["--tokens", str(odd), "--out", str(out)], "multiple of 4")):
        with pytest.raises(SystemExit) as e:
            hf.main([str(model_dir), *args])
        assert e.value.code == 2 and why in capsys.readouterr().err, args
    # An output over an input (written after the whole calibration) replaced it: the token file, or a file of
    # the checkpoint (config.json; a shard through a link).
    (model_dir / "alias.safetensors").symlink_to(model_dir / "model.safetensors")
    before = {p: p.read_bytes() for p in (tok, model_dir / "config.json", model_dir / "model.safetensors")}
    for args, why in ((["--tokens", str(tok), "--out", str(tok)], "same file"),
                      (["--tokens", str(tok), "--out", str(model_dir / "config.json")], "model's config.json"),
                      (["--tokens", str(tok), "--out", str(model_dir / "alias.safetensors")],
                       "model's model.safetensors")):
        with pytest.raises(SystemExit) as e:
            hf.main([str(model_dir), *args, "--window", "256"])
        assert e.value.code == 2 and why in capsys.readouterr().err, args
    assert all(p.read_bytes() == b for p, b in before.items())
    dangling = tmp_path / "dangling.safetensors"  # as oscar-calibrate --out: the save replaced the link
    dangling.symlink_to(tmp_path / "no/such/target.safetensors")
    with pytest.raises(SystemExit) as e:
        hf.main([str(model_dir), "--tokens", str(tok), "--out", str(dangling), "--window", "256"])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err and dangling.is_symlink()
    assert hf.main([str(model_dir), "--tokens", str(tok), "--out", str(out), "--window", "256"]) == 0  # again: fine


def test_command_line_refuses_a_model_it_cannot_calibrate(tmp_path, capsys):
    """A model the library cannot store (head_dim 24) or a window past its positions: the command names the
    problem on stderr with exit status 2, as its other bad input; it ended in a Python traceback."""
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                   max_position_embeddings=512)
    model_dir = tmp_path / "model"
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    tok = tmp_path / "calib.tokens"
    np.random.default_rng(5).integers(0, 64, 2048).astype("<u4").tofile(tok)
    for window, why in (("256", "head_dim 24 is not supported"), ("1024", "max_position_embeddings 512")):
        with pytest.raises(SystemExit) as e:
            hf.main([str(model_dir), "--tokens", str(tok), "--out", str(tmp_path / "p.safetensors"), "--window",
                     window, "--max-tokens", "2048"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and why in err and "python -m liboscar.hf: error:" in err, err
    assert not (tmp_path / "p.safetensors").exists()


@need_qwen
def test_command_line_tokenizes_text(tmp_path, capsys):
    text = tmp_path / "calib.txt"
    with open(REPO.parent / "shared/data/calib.txt", encoding="utf-8", errors="replace") as f:
        text.write_text(f.read(20000), encoding="utf-8")
    out = tmp_path / "p.safetensors"
    assert hf.main([MODEL, "--text", str(text), "--out", str(out), "--window", "512", "--max-tokens", "1024",
                    "--sink", "8", "--recent", "32"]) == 0
    p = liboscar.Params.load(str(out))
    assert p.info.calib_tokens == 1024 and p.info.head_dim == 128 and "wrote" in capsys.readouterr().out
