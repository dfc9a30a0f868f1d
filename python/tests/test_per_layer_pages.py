"""Per-layer page sizes (Layout.wide_per_layer, docs/FORMAT.md 3.3) through the binding: each layer's
pages hold only its own 3-bit head-tensors' 1-bit planes, Plan.layer_sizes gives them, PagedCache
allocates each layer's pool with them, and the cache then attends exactly as one of the largest pages."""
import numpy as np
import pytest

import liboscar
from conftest import bf16_exact

HQ, HKV, D, PAGE = 4, 2, 64, 16
LAY = dict(head_dim=D, num_q_heads=HQ, num_kv_heads=HKV, page_size=PAGE, sink=4, recent=8, max_seq_len=128,
           method="oscar2", wide_tensors=2)


def params():
    p = liboscar.Params.builtin("oscar2", 3, HQ, HKV, D)
    p.set_code_bits(1, 0, "k", 3)  # layer 0: none; layer 1: two; layer 2: one
    p.set_code_bits(1, 1, "v", 3)
    p.set_code_bits(2, 1, "k", 3)
    return p


def test_field_and_layer_sizes(cpu):
    lay = liboscar.Layout(**LAY, wide_per_layer=1)
    p = params()
    assert p.code_bits(1, 1, "v") == 3 and p.code_bits(0, 0, "k") == 2
    plan = liboscar.Plan(cpu, lay, p)
    assert plan.layout.wide_per_layer == 1
    big = lay.sizes()
    assert plan.sizes == big
    plane = PAGE * D // 8
    for layer, planes in enumerate((0, 2, 1)):
        s = plan.layer_sizes(layer)
        assert s.page_bytes == big.page_bytes - (2 - planes) * plane
        assert s.bits_per_element == pytest.approx(2.5 + planes / (2 * HKV))  # group 64
        assert (s.k_meta_offset, s.v_meta_offset, s.window_slot_bytes) == \
            (big.k_meta_offset, big.v_meta_offset, big.window_slot_bytes)
    with pytest.raises(liboscar.OscarError, match="oscar_plan_layer_sizes: layer 3"):
        plan.layer_sizes(3)
    with pytest.raises(liboscar.OscarError, match="wide_per_layer"):
        liboscar.Layout(**LAY, wide_per_layer=2).validate()
    with pytest.raises(liboscar.OscarError, match="wide_per_layer"):
        liboscar.Layout(**{**LAY, "method": "int2", "wide_tensors": 0}, wide_per_layer=1).validate()
    uniform = liboscar.Plan(cpu, liboscar.Layout(**LAY), p)
    assert all(uniform.layer_sizes(i) == big for i in range(3))


def test_cache_pools_per_layer_attend_as_uniform(cpu, rng):
    p = params()
    plans = [liboscar.Plan(cpu, liboscar.Layout(**LAY, wide_per_layer=w), p) for w in (1, 0)]
    caches = [pl.cache(num_layers=3, num_seqs=2, max_seq_len=100) for pl in plans]
    per, uni = caches
    for layer in range(3):
        assert per.pages[layer].nbytes == 2 * per.pages_per_seq * plans[0].layer_sizes(layer).page_bytes
        assert uni.pages[layer].nbytes == 2 * uni.pages_per_seq * plans[1].sizes.page_bytes
    assert per.pages[0].nbytes < per.pages[2].nbytes < per.pages[1].nbytes == uni.pages[1].nbytes
    lens = [37, 90]
    for layer in range(3):
        k = liboscar.to_bf16(bf16_exact(rng.standard_normal((sum(lens), HKV, D))))
        v = liboscar.to_bf16(bf16_exact(rng.standard_normal((sum(lens), HKV, D))))
        q = liboscar.to_bf16(bf16_exact(rng.standard_normal((2, HQ, D))))
        outs = []
        for c in caches:
            c.append(layer, k, v, new_tokens=lens)
            outs.append(np.asarray(c.decode(layer, q)).copy())
        assert np.array_equal(outs[0], outs[1]), f"layer {layer}"
