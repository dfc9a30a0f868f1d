#!/usr/bin/env python3
"""liboscar kernel generator: renders templates/*.jinja into CUDA (.cu),
HIP (.hip) and OpenCL (.cl embedded in C) sources plus a dispatch table.

  oscar_gen.py --target cuda|hip|opencl --set default|minimal|full|FILE.json
               --arch sm_90|gfx90a|opencl --out DIR [--list]

--list prints the files that would be written (one per line) and writes
nothing: CMake calls it at configure time to declare the outputs.
Python is used for code generation only; see docs/CODEGEN.md.
"""
import argparse
import json
import math
import os
import sys

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_spec(path):
    with open(path) as f:
        return json.load(f)


def choose_set(spec, name):
    if name in spec["sets"]:
        s = spec["sets"][name]
    elif os.path.isfile(name):
        s = load_spec(name)
    else:
        sys.exit("oscar_gen: unknown variant set %r; use one of %s or a JSON file" % (name, sorted(spec["sets"])))
    ax = spec["axes"]
    for sub in [s] + ([s["other_dims"]] if "other_dims" in s else []):
        for k, vals in sub.items():
            if k in ax:
                bad = [x for x in vals if x not in ax[k] and not (k == "group" and x == "default")]
                if bad:
                    sys.exit("oscar_gen: %s values %s not allowed by the format (allowed: %s)" % (k, bad, ax[k]))
    return s


def tuning_for(spec, arch, d):
    """Tuning of head_dim d on arch: d's own entry, else that of the smallest tuned head_dim above d
    (80 and 96 run with 128's, 160 and 192 with 256's; the OpenCL plugin applies the same rule at plan
    time, backends/opencl/opencl_backend.c tuning_of). Threads need not split into whole V-pass parts
    there: decode.jinja idles the threads past floor(threads / (d / elems)) parts."""
    t = spec["tuning"].get(arch)
    if t is None:
        sys.exit("oscar_gen: no tuning table for arch %r; add one to gen/variants.json" % arch)
    tuned = sorted(int(k) for k in t if k.isdigit())
    above = [x for x in tuned if x >= d]
    if not above:
        sys.exit("oscar_gen: no tuning entry of %s at or above head_dim %d in gen/variants.json" % (arch, d))
    tt = t[str(above[0])]
    nt, e = tt["threads"], tt["elems"]
    if str(d) in t and (d % e or (d // e) > nt or nt % (d // e) or nt & (nt - 1) or (tt["tpt"] * d // e) % tt["vb"]):
        sys.exit("oscar_gen: tuning %s d=%d: threads %d / elems %d do not tile head_dim" % (arch, d, nt, e))
    if d % e or (d // e) > nt or nt & (nt - 1):
        sys.exit("oscar_gen: tuning %s d=%d (from %d): elems %d must divide head_dim and d / elems fit in %d threads"
                 % (arch, d, above[0], e, nt))
    return tt


def group_default(d):
    """The format's default group of head_dim d: format/oscar_format.h oscar_group_default (the one home
    of the rule; mirrored here for the sets' "default" group, checked against it on the GPU by the
    conformance tests, which plan every head_dim with its default group)."""
    if d <= 128:
        return d
    return d // 2 if (d // 2) % 16 == 0 and d // 2 >= 32 else d


def tc_target(spec, target, arch):
    """The tensor-core decode settings of arch (CUDA only), or None."""
    return spec["tuning"].get(arch, {}).get("tc_decode") if target == "cuda" else None


def tc_smem(v, tc):
    """Pipeline depths and shared memory per warp of a tensor-core decode variant:
    the 2-bit stages (32-token tiles) and the 16-bit stages (16-row tiles) share
    one region per warp; the region also holds the final [4][heads][d] partials."""
    d, ng, msz = v["D"], v["NG"], 4 if v["MF32"] else 2
    stb16 = 32 * (2 * d + 16)
    if v["BF16M"]:
        nst16 = 2 if 2 * stb16 <= tc["region_max"] else 1
        region, nst = nst16 * stb16, 0
    else:
        stb2 = 64 * (d // 4) + 64 * (ng * 2 * msz)
        nst = next((n for n in (4, 3, 2) if n * stb2 <= tc["region_max"]), 2)
        region = max(nst * stb2, stb16)
        nst16 = region // stb16
    region = max(region, 4 * 8 * v["NT"] * d)  # [4 warps][heads][d] fp32 partials / 4 warps
    out = dict(NST=nst, NST16=nst16, REGION=(region + 15) // 16 * 16)
    if not v["BF16M"]:
        out["VMAP"] = vmap_of(v["G"] // 16)
    if not v["BF16M"] and 8 % (v["G"] // 16) == 0:
        # W3 (layers with 3-bit head-tensors): each stage also holds the tile's two plane rows
        # (2 x 4 d bytes), and the warp their spread words (4 x 4 d); 3 stages, or 2 at d 256
        plb = 4 * d
        nst3 = next((n for n in (3, 2) if n * (stb2 + 2 * plb) + 4 * plb <= tc["region_max"]), 2)
        region3 = max(region, nst3 * (stb2 + 2 * plb) + 4 * plb)
        out.update(NST3=nst3, REGION3=(region3 + 15) // 16 * 16)
    return out


def ext_variant(base, tt, tc, sfx):
    """The generic (fp32) extend kernel that serves a tensor-core decode
    variant's shape until a tensor-core extend exists: one head capacity
    (tc["extend_gqa"]; larger ratios run in several work-groups)."""
    return dict(base, GQ=tc["extend_gqa"], LM=0, NT=tt["threads"], E=tt["elems"], TPT=tt["tpt"], VB=tt["vb"],
                TC=False, sfx=sfx)


def tc_other_shape(d, g):
    """Whether the tensor-core decode (decode_tc.jinja) serves an other_dims shape: every head_dim and
    group of the format (multiples of 16). Groups whose code words do not divide 8 (G 48, 80, 96, ...)
    map the V words onto the MMA rows with the general rule of vmap_of; an odd number of words per group
    (G a multiple of 16 but not of 32) ends each group's scores with a 16-dim k-step; such layers with
    3-bit head-tensors run on the generic kernels (no W3 instance, tc_smem). group None: the BF16
    method."""
    return d % 16 == 0 and (g is None or g % 16 == 0)


def vmap_of(wpg):
    """The V side of the 2-bit tensor-core decode: m-tile s of a group and MMA row g (0..7) read code
    word n % wpg of the group at half-position J = n // wpg, n = g + 8 s (for wpg dividing 8: word
    g % wpg for every s, J = s * 8 / wpg + g / wpg). HS[s]: whether the 8 rows of m-tile s all read the
    >> 8 copy (J >= 4; 1), none does (0), or the rows differ (-1: a shift per lane); PER: the period of
    the word map over m-tiles (m-tiles s and s + PER read the same word)."""
    hs = []
    for s in range(wpg):
        up = {(g + 8 * s) // wpg >= 4 for g in range(8)}
        hs.append(-1 if len(up) != 1 else int(up.pop()))
    return dict(HS=hs, PER=wpg // math.gcd(8, wpg))


def sfx_of(*parts):
    return "_" + "_".join(str(p) for p in parts)


# Shapes every CUDA/HIP family is written for: the tensor-core decode (decode_tc.jinja: its fragment
# mappings) and the CUDA warp/tile write paths (appendw/appendt: head_dim / 32 values per lane, groups
# of 32, 64, 128). A set's "other_dims" (gen/variants.json) takes any other shape the format allows into
# the generic (fp32) decode/extend family and the block-wide write kernels, the code OpenCL runs: word
# loads of the codes where head_dim is not a multiple of 64, 16-bit plane loads where d or G is not a
# multiple of 32, floor(threads / (d / elems)) V-pass parts (decode.jinja).
CUDA_HIP_HEAD_DIMS = (64, 128, 256)
CUDA_HIP_GROUPS = (32, 64, 128)


def subsets(sel):
    """(selection, full) per part of a set: the set itself (full: every family) and its "other_dims"
    (keys it lacks inherit the set's; group "default" is the format's default group of each head_dim)."""
    out = [(sel, True)]
    if "other_dims" in sel:
        o = dict(sel, **sel["other_dims"])
        del o["other_dims"]
        out.append((o, False))
    return out


def groups_of(sub, d):
    gs = [group_default(d) if g == "default" else g for g in sub["group"]]
    return [g for i, g in enumerate(gs) if g not in gs[:i] and g <= d and d % g == 0]


def enumerate_variants(spec, sel, arch, target):
    """Returns (append, decode, rotq) lists of dicts for the GPU targets.
    Decode: on CUDA the tensor-core family (decode_tc.jinja) serves uniform
    levels and the BF16 method for every head_dim, group and metadata width
    of the set proper, with NT n-tiles of 8 query heads (NT 1 and 2 cover 1..16
    heads per KV head; more run in several CTAs); Lloyd-Max, the HIP target and
    the set's other_dims use the generic family (decode.jinja), instantiated per
    head capacity of sel["gqa"]."""
    append, decode, rotq = [], [], []
    bad = [d for d in sel["head_dim"] if d not in CUDA_HIP_HEAD_DIMS] + \
        [g for g in sel["group"] if g not in CUDA_HIP_GROUPS]
    if bad:
        sys.exit("oscar_gen: %s kernels of every family are written for head_dim %s and group %s; put %s under "
                 "the set's other_dims (generic family only)" % (target, list(CUDA_HIP_HEAD_DIMS),
                                                                  list(CUDA_HIP_GROUPS), bad))
    if "other_dims" in sel:
        both = [d for d in sel["other_dims"].get("head_dim", []) if d in sel["head_dim"]]
        if both:
            sys.exit("oscar_gen: head_dim %s both in the set and in its other_dims" % both)
    for sub, full in subsets(sel):
        enumerate_sub(spec, sub, full, arch, target, append, decode, rotq)
    tc = tc_target(spec, target, arch)
    for v in decode:
        if v["TC"]:
            v.update(tc_smem(v, tc))
    for v in append:
        v["TILE"] = tile_geom(v["D"], v["NG"]) if v["WT"] else None
        v["with_helpers"] = True
        v["qsfx"] = v["sfx"]
        v["BF16M_CONST"] = bool(v["BF16M"])
    return append, decode, rotq


def enumerate_sub(spec, sel, full, arch, target, append, decode, rotq):
    """The variants of one part of a set (subsets); full: the tensor-core decode and the warp/tile
    write paths too (CUDA), else the generic family and the block-wide write kernels only."""
    methods = sel["method"]
    tc_all = tc_target(spec, target, arch)
    n0 = len(decode)
    for d in sel["head_dim"]:
        tt = tuning_for(spec, arch, d)
        for kv in sel["kv_dtype"]:
            kvb = 1 if kv == "bf16" else 0
            rotq.append(dict(D=d, KVB=kvb, sfx=sfx_of("d%d" % d, kv)))
            quant = [m for m in methods if m in ("uniform", "lloyd_max")]
            for g in groups_of(sel, d) if quant else []:
                for meta in sel["meta_dtype"]:
                    mf32 = 1 if meta == "f32" else 0
                    base = dict(D=d, G=g, NG=d // g, KVB=kvb, MF32=mf32, BF16M=0)
                    append.append(dict(base, WT=full, sfx=sfx_of("d%d" % d, "g%d" % g, kv, "m" + meta)))
                    tc = tc_all if full or tc_other_shape(d, g) else None
                    for m in quant:
                        lm = 1 if m == "lloyd_max" else 0
                        if tc and not lm:
                            ext = ext_variant(base, tt, tc, sfx_of("d%d" % d, "g%d" % g, "x%d" % tc["extend_gqa"],
                                                                   kv, "m" + meta, "u"))
                            for nt in tc["n_tiles"]:
                                # O3: a second decode kernel at 3 CTAs per SM (the 16-head 2-bit
                                # variants at d <= 128 run at 2: decode_tc.jinja, gpu_core.c);
                                # LP: the 8-head variants' decode for GQA <= 4 (limb-packed columns)
                                decode.append(dict(base, GQ=8 * nt, NT=nt, LM=0, TC=True, E=0, EXT=ext,
                                                   O3=int(nt == 2 and d <= 128), LP=int(nt == 1),
                                                   sfx=sfx_of("d%d" % d, "g%d" % g, "h%d" % (8 * nt), kv,
                                                              "m" + meta, "u", "tc")))
                            continue
                        for q in sel["gqa"]:
                            decode.append(dict(base, GQ=q, LM=lm, NT=tt["threads"], E=tt["elems"], TPT=tt["tpt"],
                                               VB=tt["vb"], TC=False,
                                               sfx=sfx_of("d%d" % d, "g%d" % g, "q%d" % q, kv, "m" + meta,
                                                          "lm" if lm else "u")))
            if "bf16" in methods:
                tc = tc_all if full or tc_other_shape(d, None) else None
                base = dict(D=d, G=d, NG=1, KVB=kvb, MF32=0, BF16M=1)
                append.append(dict(base, WT=full, sfx=sfx_of("d%d" % d, "paged16", kv)))
                if tc:
                    ext = ext_variant(base, tt, tc, sfx_of("d%d" % d, "paged16", "x%d" % tc["extend_gqa"], kv))
                    for nt in tc["n_tiles"]:
                        decode.append(dict(base, GQ=8 * nt, NT=nt, LM=0, TC=True, E=0, EXT=ext, O3=0,
                                           sfx=sfx_of("d%d" % d, "paged16", "h%d" % (8 * nt), kv, "tc")))
                    continue
                for q in sel["gqa"]:
                    decode.append(dict(base, GQ=q, LM=0, NT=tt["threads"], E=tt["elems"], TPT=tt["tpt"], VB=tt["vb"],
                                       TC=False, sfx=sfx_of("d%d" % d, "paged16", "q%d" % q, kv)))
    for v in decode[n0:]:
        v["WT"] = full


def tile_geom(d, ng):
    """Geometry of the tile write path (templates/append.jinja appendt_family), the
    one home of these numbers for the kernel and the host table: L = d / NPL lanes
    per row in the feedback chain, each holding NPL = 16 places (values L m + l; 32 at d 256),
    32 / L rows per warp, 4 warps, so T = 4 * 32 / L tokens per CTA; rotation chunks
    of RK rows (8 KB, NR of them in the ring), feedback chunks of KC rows (8 KB, staged in xn); SMEM: dynamic
    shared bytes (xs, xn, the R/F ring, group values, LM scratch, codes).
    NPL 16 rather than 32 (L = d / 32, twice the tokens per CTA): a chain step's
    updates are the lane's live places, so 16 halve a warp's instructions per step
    and the grid has twice the CTAs (H200, sixteenth session: perf/RESULTS-attention.md)."""
    NPL = 16 if d <= 128 else 32  # d 256: a block's L steps must fit a feedback chunk staged in xn
    L = d // NPL
    g = dict(L=L, NPL=NPL, RPW=32 // L, T=4 * (32 // L), NT=128, RK=2048 // d, KC=2048 // d, FSW=NPL + 4, XSS=d + 4)
    g["KC"] = max(g["KC"], L)  # a block's L steps read one chunk
    assert g["KC"] % L == 0 and g["KC"] * d <= g["T"] * g["XSS"], "a feedback chunk is staged in xn"
    g["NR"] = 4  # rotation chunks in the ring (NR - 1 in flight)
    g["RING"] = max(g["NR"] * g["RK"] * d, g["KC"] * L * g["FSW"])
    g["SMEM"] = 4 * (2 * g["T"] * g["XSS"] + g["RING"] + g["T"] * ng * 10 + 4 * d + g["T"] * L * 2)
    return g


def format_constants(path=os.path.join(ROOT, "format", "oscar_format.h")):
    """The storage format's level constants, read from their one home
    (format/oscar_format.h: `#define OSCAR_LM_<NAME> <decimal>f`), as the
    template globals LM_<NAME> spelled exactly as there ("1.5104f")."""
    import re
    with open(path) as f:
        found = dict(re.findall(r"^#define OSCAR_(LM_[A-Z0-9]+) ([0-9.]+f)$", f.read(), re.M))
    for name in ("LM_L0", "LM_L1", "LM_T"):
        if name not in found:
            sys.exit(f"oscar_gen.py: {path} does not define OSCAR_{name} as `#define OSCAR_{name} <decimal>f`")
    return found


def env():
    e = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROOT, "templates")),
                           undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                           trim_blocks=True, lstrip_blocks=True)
    e.globals.update(format_constants())
    return e


HEADER = """/* Generated by gen/oscar_gen.py. Do not edit: change templates/ or gen/variants.json. */
#ifndef OSCAR_{T}_VARIANTS_H
#define OSCAR_{T}_VARIANTS_H
#ifdef __cplusplus
extern "C" {{
#endif
/* One generated decode kernel set; key = (d, group, kv bf16?, meta f32?, lloyd-max?, bf16 method?) and the
 * head capacity. */
/* cap: query heads one CTA serves (more run in ceil(gqa / cap) CTAs per KV head);
 * tc: tensor-core family (decode_tc.jinja: one oscar_tc_decode_params argument,
 * smem bytes of dynamic shared memory, merge takes oscar_tc_merge_params). */
/* extend, merge_ext: the generic extend kernels of the shape (decode.jinja, ext),
 * ext_cap query heads per work-group, ext_threads threads, ext_elems V elements per thread. */
typedef struct oscar_gpu_decode_variant {{
    int d, group, cap, kvb, mf32, lm, bf16m, threads, elems, tc, smem;
    const void *decode, *rotate_q, *merge;
    const char *name;
    const void *extend, *merge_ext;
    int ext_cap, ext_threads, ext_elems;
    const void *extend_tc; /* tc: the extend instantiation of decode (same smem), else NULL */
    const void *decode_o3; /* tc: decode at 3 CTAs per SM where decode runs at 2, else NULL */
    const void *decode_lp; /* tc: decode for at most 4 query heads per KV head (limb-packed), else NULL */
    /* tc, 2-bit methods: decode and extend of layers with 3-bit head-tensors (W3), their dynamic
     * shared bytes; else NULL, 0 */
    const void *decode_w3, *extend_w3;
    int smem_w3;
    /* tc, head_dim 64 or 128 with one group per row, F16 metadata, uniform levels: the long-chunk
     * extend over the 2-bit history (extend_fa.jinja) and its many-row q rotation and merge, else NULL */
    const void *extend_fa, *rotate_rows, *merge_rows;
    const void *extend_o3; /* tc: extend at 3 CTAs per SM where extend_tc runs at 2, else NULL */
}} oscar_gpu_decode_variant;
typedef struct oscar_gpu_append_variant {{
    int d, group, kvb, mf32, bf16m;
    const void *store, *demote; /* two-launch write path (every target) */
    const void *append1;        /* one-launch write path (oscar_append1_params), or NULL */
    const char *name;
    /* warp write path (CUDA, quantized methods; oscar_append1_params): plain loads (many CTAs),
     * cp.async rings (few CTAs), or NULL */
    const void *append_w, *append_wr;
    /* tile write path (CUDA, quantized methods; oscar_append1_params): many tokens per CTA,
     * its tokens per CTA and dynamic shared bytes, or NULL */
    const void *append_t;
    int tile_tokens, tile_smem;
    const void *append_wf; /* warp write path with all of F in wf_smem dynamic shared bytes, or NULL */
    int wf_smem;
    /* warp write path with blockDim.x / 64 tokens per CTA sharing F (wf_smem bytes): up to 4, and 8, or NULL */
    const void *append_wk, *append_wk8;
}} oscar_gpu_append_variant;
typedef struct oscar_gpu_tuning {{
    int d, threads, elems, min_chunk, blocks_per_sm;
}} oscar_gpu_tuning;
extern const oscar_gpu_decode_variant *const oscar_{t}_decode_tables[];
extern const int *const oscar_{t}_decode_table_sizes[];
extern const int oscar_{t}_num_decode_tables;
extern const oscar_gpu_append_variant *const oscar_{t}_append_tables[];
extern const int *const oscar_{t}_append_table_sizes[];
extern const int oscar_{t}_num_append_tables;
extern const oscar_gpu_tuning oscar_{t}_tuning[];
extern const int oscar_{t}_num_tuning;
#ifdef __cplusplus
}}
#endif
#endif
"""


def gpu_files(target, sel):
    ext = "cu" if target == "cuda" else "hip"
    files = ["oscar_%s_variants.h" % target, "oscar_%s_dispatch.%s" % (target, ext)]
    files += ["oscar_%s_append_%s.%s" % (target, part, ext) for part in append_parts(sel)]
    files += ["oscar_%s_decode_%s.%s" % (target, part, ext) for part in decode_parts(sel)]
    return files


def append_parts(sel):
    """Append kernels: one file per head_dim x kv dtype (the error-feedback
    chain unrolls into long kernels; a parallel build compiles them side by side);
    the other dims' small kernels one file per kv dtype (fewer compiler runs)."""
    out = []
    for sub, full in subsets(sel):
        out += ["d%d_%s" % (d, kv) for d in sub["head_dim"] for kv in sub["kv_dtype"]] if full else \
            ["other_%s" % kv for kv in sub["kv_dtype"]]
    return out


def append_part_of(v):
    kv = "bf16" if v["KVB"] else "f16"
    return "d%d_%s" % (v["D"], kv) if v["WT"] else "other_%s" % kv


def decode_parts(sel):
    """Decode kernels are split over several files (head_dim x kv dtype x
    method class) so a parallel build compiles them side by side."""
    out = []
    for sub, full in subsets(sel):
        classes = []
        if "uniform" in sub["method"]:
            classes.append("u")
        if "lloyd_max" in sub["method"]:
            classes.append("lm")
        if "bf16" in sub["method"]:
            classes.append("paged16")
        out += ["d%d_%s_%s" % (d, kv, c) for d in sub["head_dim"] for kv in sub["kv_dtype"] for c in classes] \
            if full else ["other_%s_%s" % (kv, c) for kv in sub["kv_dtype"] for c in classes]
    return out


def fa_ok(target, v):
    """The long-chunk extend (extend_fa.jinja) serves this tensor-core variant: CUDA, head_dim 64 or 128
    with one group per row, F16 metadata, a 2-bit method of uniform levels."""
    return (target == "cuda" and v["TC"] and v["D"] in (64, 128) and v["G"] == v["D"] and not v["MF32"]
            and not v["BF16M"] and not v["LM"])


def unit_of(v):
    """A decode variant's head_dim x kv dtype x method class: its rotate_q / merge suffix."""
    c = "paged16" if v["BF16M"] else ("lm" if v["LM"] else "u")
    return "d%d_%s_%s" % (v["D"], "bf16" if v["KVB"] else "f16", c)


def part_of(v):
    """Its file: one per unit in the set proper, one per kv dtype x class for the other dims."""
    return unit_of(v) if v["WT"] else "other_" + unit_of(v).split("_", 1)[1]


def write(path, text):
    # Rewrite only on change so the build does not recompile needlessly.
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


# Warp shuffle for the append kernels' error-feedback chain (templates/append.jinja):
# SHFL32(v, s) is v of lane s of the calling thread's aligned 32-thread segment
# (a CUDA warp, half an AMD wave64); every thread of the segment calls it.
# OpenCL 1.2 has none: the template uses barriers there.
SHFL32 = {
    "cuda": "#define OSCAR_SHFL32 1\n#define SHFL32(v, s) __shfl_sync(0xffffffffu, v, s, 32)\n",
    "hip": "#define OSCAR_SHFL32 1\n#define SHFL32(v, s) __shfl(v, s, 32)\n",
    "opencl": "#define OSCAR_SHFL32 0\n",
}
# SHFL32M(m, v, s): the same among the lanes of mask m (CUDA; the last, partial warp of a block of d
# threads where d is not a multiple of 32); defined in the files whose variants use it (groups not
# a multiple of 32: append.jinja warp_fast).
SHFL32M = {
    "cuda": "#define SHFL32M(m, v, s) __shfl_sync(m, v, s, 32)\n",
    "hip": "#define SHFL32M(m, v, s) __shfl(((void)(m), (v)), s, 32)\n",
}


def appendw_ptrs(target, v):
    """The warp write path's kernels (plain loads, rings; at d <= 128 F in shared memory
    for one token or several per CTA) and the tile write path (templates/append.jinja
    appendw_family, appendt_family) with its geometry: CUDA and the quantized methods
    only; OSCAR_NO_APPENDW (A/B timing) leaves them out."""
    if target != "cuda" or v["BF16M"] or not v["WT"]:
        return "0, 0, 0, 0, 0, 0, 0, 0, 0"
    wf = ("OSCAR_APPENDW_PTR(oscar_append_wf%s), %d, OSCAR_APPENDW_PTR(oscar_append_wk%s), "
          "OSCAR_APPENDW_PTR(oscar_append_wk8%s)" % (v["sfx"], 4 * v["D"] * v["D"], v["sfx"], v["sfx"])) \
        if v["D"] <= 128 else "0, 0, 0, 0"
    return ("OSCAR_APPENDW_PTR(oscar_append_w%s), OSCAR_APPENDW_PTR(oscar_append_wr%s), "
            "OSCAR_APPENDW_PTR(oscar_append_t%s), %d, %d, %s"
            % (v["sfx"], v["sfx"], v["sfx"], v["TILE"]["T"], v["TILE"]["SMEM"], wf))


def gen_gpu(target, spec, sel, arch, out):
    e = env()
    ext = "cu" if target == "cuda" else "hip"
    append, decode, rotq = enumerate_variants(spec, sel, arch, target)
    prelude = e.get_template("prelude.jinja").render(target=target)
    app_t = e.get_template("append.jinja").module
    dec_t = e.get_template("decode.jinja").module
    tc_t = e.get_template("decode_tc.jinja").module
    fa_t = e.get_template("extend_fa.jinja").module
    write(os.path.join(out, "oscar_%s_variants.h" % target), HEADER.format(T=target.upper(), t=target))

    # Tables live next to their kernels (HIP cannot reference a __global__
    # function of another translation unit without -fgpu-rdc); the dispatch
    # file only collects the per-file tables.
    for part in append_parts(sel):
        av = [v for v in append if append_part_of(v) == part]
        lines = ['extern "C" const oscar_gpu_append_variant oscar_%s_append_table_%s[] = {' % (target, part)]
        for v in av:
            lines.append('    {%d, %d, %d, %d, %d, (const void *)oscar_store%s, (const void *)oscar_demote%s, '
                         'OSCAR_APPEND1_PTR(oscar_append1%s), "%s", %s},'
                         % (v["D"], v["G"], v["KVB"], v["MF32"], v["BF16M"], v["sfx"], v["sfx"], v["sfx"],
                            v["sfx"][1:], appendw_ptrs(target, v)))
        if not av:
            lines.append('    {0, 0, 0, 0, 0, 0, 0, 0, "", 0, 0, 0, 0, 0},')
        lines.append("};")
        lines.append('extern "C" const int oscar_%s_append_table_%s_n = %d;' % (target, part, len(av)))
        body = [prelude, "#define GRID_X gridDim.x\n", SHFL32[target], '#include "oscar_%s_variants.h"' % target]
        if any(v["G"] % 32 for v in av):
            body.insert(3, SHFL32M[target])
        body += [app_t.append_family(v) for v in av]
        body.append('#include "append_params.h"\n'
                    '/* OSCAR_NO_APPEND1: A/B timing only, the two-launch write path on CUDA/HIP too. */\n'
                    '#ifdef OSCAR_NO_APPEND1\n#define OSCAR_APPEND1_PTR(f) NULL\n#else\n'
                    '#define OSCAR_APPEND1_PTR(f) (const void *)f\n#endif\n'
                    '#ifdef OSCAR_NO_APPENDW\n#define OSCAR_APPENDW_PTR(f) NULL\n#else\n'
                    '#define OSCAR_APPENDW_PTR(f) (const void *)f\n#endif')
        body += [app_t.append1_family(v) for v in av]
        if target == "cuda" and any(not v["BF16M"] and v["WT"] for v in av):
            body.append(app_t.appendw_helpers())
            body += [app_t.appendw_family(v) for v in av if not v["BF16M"] and v["WT"]]
            body += [app_t.appendt_family(v) for v in av if not v["BF16M"] and v["WT"]]
        write(os.path.join(out, "oscar_%s_append_%s.%s" % (target, part, ext)), "\n".join(body + lines) + "\n")

    parts = decode_parts(sel)
    for part in parts:
        body = [prelude, "#define GRID_X gridDim.x\n", '#include "oscar_%s_variants.h"' % target]
        dv = [v for v in decode if part_of(v) == part]
        # Each file carries its own (small) rotate_q / merge per unit: HIP cannot take the
        # address of a kernel defined in another translation unit.
        units = sorted({unit_of(v) for v in dv}, key=lambda u: int(u.split("_")[0][1:]))
        if not dv and not part.startswith("other"):
            units = [part]
        for u in units:
            rv = [v for v in rotq if "d%d_%s" % (v["D"], "bf16" if v["KVB"] else "f16") == u.rsplit("_", 1)[0]][0]
            body.append(dec_t.rotq_merge_family(dict(rv, sfx="_" + u)))
        if any(v["TC"] for v in dv):
            body.append(tc_t.tc_helpers())
            # one tensor-core merge per unit (a file of other dims holds several head_dims)
            for u in units:
                if any(v["TC"] and unit_of(v) == u for v in dv):
                    ru = [r for r in rotq if "d%d_%s" % (r["D"], "bf16" if r["KVB"] else "f16") == u.rsplit("_", 1)[0]][0]
                    body.append(tc_t.merge_tc_family(dict(ru, sfx="_" + u)))
        done_ext = set()
        for v in dv:
            if fa_ok(target, v) and ("fa", unit_of(v)) not in done_ext:
                done_ext.add(("fa", unit_of(v)))
                body.append(fa_t.extend_fa_family(dict(D=v["D"], KVB=v["KVB"], sfx="_" + unit_of(v))))
            if v["TC"]:
                body.append(tc_t.decode_tc_family(v))
                x = v["EXT"]
                if x["sfx"] not in done_ext:  # one generic extend serves both n-tile variants
                    done_ext.add(x["sfx"])
                    body.append(dec_t.decode_family(x, True, True))
            else:
                body.append(dec_t.decode_family(v))
                body.append(dec_t.decode_family(v, True, False))
        body.append('extern "C" const oscar_gpu_decode_variant oscar_%s_decode_table_%s[] = {' % (target, part))
        for v in dv:
            r = "_" + unit_of(v)
            merge = ("oscar_merge_tc" if v["TC"] else "oscar_merge") + r
            x = v["EXT"] if v["TC"] else v
            body.append('    {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, (const void *)oscar_decode%s, '
                        '(const void *)oscar_rotate_q%s, (const void *)%s, "%s", (const void *)oscar_extend%s, '
                        '(const void *)oscar_merge_ext%s, %d, %d, %d, %s, %s, %s, %s, %s, %d, %s, %s},'
                        % (v["D"], v["G"], v["GQ"], v["KVB"], v["MF32"], v["LM"], v["BF16M"],
                           128 if v["TC"] else v["NT"], v["E"], int(v["TC"]), 4 * v["REGION"] if v["TC"] else 0,
                           v["sfx"], r, merge, v["sfx"][1:], x["sfx"], r, x["GQ"], x["NT"], x["E"],
                           "(const void *)oscar_extend_tc" + v["sfx"] if v["TC"] else "0",
                           "(const void *)oscar_decode_o3" + v["sfx"] if v.get("O3") else "0",
                           "(const void *)oscar_decode_lp" + v["sfx"] if v.get("LP") else "0",
                           "(const void *)oscar_decode_w3" + v["sfx"] if v.get("REGION3") else "0",
                           "(const void *)oscar_extend_w3" + v["sfx"] if v.get("REGION3") else "0",
                           4 * v["REGION3"] if v.get("REGION3") else 0,
                           ("(const void *)oscar_extend_fa_%s, (const void *)oscar_rotate_rows_%s, "
                            "(const void *)oscar_merge_rows_%s" % ((unit_of(v),) * 3)) if fa_ok(target, v)
                           else "0, 0, 0",
                           "(const void *)oscar_extend_o3" + v["sfx"] if v.get("O3") else "0"))
        if not dv:
            body.append("    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \"\", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},")
        body.append("};")
        body.append('extern "C" const int oscar_%s_decode_table_%s_n = %d;' % (target, part, len(dv)))
        write(os.path.join(out, "oscar_%s_decode_%s.%s" % (target, part, ext)), "\n".join(body) + "\n")

    ds = parts
    lines = ['/* Generated by gen/oscar_gen.py. Do not edit. */', '#include "oscar_%s_variants.h"' % target,
             'extern "C" {']
    for d in ds:
        lines.append("extern const oscar_gpu_decode_variant oscar_%s_decode_table_%s[];" % (target, d))
        lines.append("extern const int oscar_%s_decode_table_%s_n;" % (target, d))
    aps = append_parts(sel)
    for d in aps:
        lines.append("extern const oscar_gpu_append_variant oscar_%s_append_table_%s[];" % (target, d))
        lines.append("extern const int oscar_%s_append_table_%s_n;" % (target, d))
    lines.append("const oscar_gpu_decode_variant *const oscar_%s_decode_tables[] = {%s};"
                 % (target, ", ".join("oscar_%s_decode_table_%s" % (target, d) for d in ds)))
    lines.append("const int *const oscar_%s_decode_table_sizes[] = {%s};"
                 % (target, ", ".join("&oscar_%s_decode_table_%s_n" % (target, d) for d in ds)))
    lines.append("const int oscar_%s_num_decode_tables = %d;" % (target, len(ds)))
    lines.append("const oscar_gpu_append_variant *const oscar_%s_append_tables[] = {%s};"
                 % (target, ", ".join("oscar_%s_append_table_%s" % (target, d) for d in aps)))
    lines.append("const int *const oscar_%s_append_table_sizes[] = {%s};"
                 % (target, ", ".join("&oscar_%s_append_table_%s_n" % (target, d) for d in aps)))
    lines.append("const int oscar_%s_num_append_tables = %d;" % (target, len(aps)))
    lines.append("const oscar_gpu_tuning oscar_%s_tuning[] = {" % target)
    dims = sorted(d for sub, _ in subsets(sel) for d in sub["head_dim"])
    for d in dims:
        tt = tuning_for(spec, arch, d)
        lines.append("    {%d, %d, %d, %d, %d}," % (d, tt["threads"], tt["elems"], tt["min_chunk"], tt["blocks_per_sm"]))
    lines.append("};")
    lines.append("const int oscar_%s_num_tuning = %d;" % (target, len(dims)))
    lines.append("}")
    write(os.path.join(out, "oscar_%s_dispatch.%s" % (target, ext)), "\n".join(lines) + "\n")


def c_string(text):
    out = []
    for line in text.split("\n"):
        out.append('"' + line.replace("\\", "\\\\").replace('"', '\\"') + '\\n"')
    return "\n".join(out)


def gen_opencl(spec, out):
    """One OpenCL C source; the plan compiles it with -D constants for its shape."""
    e = env()
    prelude = e.get_template("prelude.jinja").render(target="opencl")
    app_t = e.get_template("append.jinja").module
    dec_t = e.get_template("decode.jinja").module
    m = dict(D="OSCAR_D", G="OSCAR_G", NG="OSCAR_NG", KVB="OSCAR_KVB", MF32="OSCAR_MF32", BF16M="OSCAR_BF16M",
             GQ="OSCAR_GQ", LM="OSCAR_LM", NT="OSCAR_NT", E="OSCAR_E", TPT="OSCAR_TPT", VB="OSCAR_VB", sfx="", qsfx="", with_helpers=True,
             BF16M_CONST=False)
    src = "\n".join([prelude, "#define GRID_X get_num_groups(0)\n", SHFL32["opencl"], app_t.append_family(m),
                     dec_t.rotq_merge_family(m), dec_t.decode_family(m), dec_t.decode_family(m, True, False)])
    write(os.path.join(out, "oscar_opencl_kernels.cl"), src)
    lines = ["/* Generated by gen/oscar_gen.py from the templates folder. Do not edit. */",
             "#include <stddef.h>",
             "const char oscar_opencl_source[] =", c_string(src) + ";",
             "const size_t oscar_opencl_source_len = sizeof oscar_opencl_source - 1;",
             "/* Tuning per head_dim: d, threads, elems, min_chunk, blocks per compute unit, tpt, vb. */",
             "const int oscar_opencl_tuning[3][7] = {"]
    for d in (64, 128, 256):
        tt = tuning_for(spec, "opencl", d)
        lines.append("    {%d, %d, %d, %d, %d, %d, %d}," % (d, tt["threads"], tt["elems"], tt["min_chunk"],
                                                        tt["blocks_per_sm"], tt["tpt"], tt["vb"]))
    lines.append("};")
    write(os.path.join(out, "oscar_opencl_source.c"), "\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, choices=["cuda", "hip", "opencl"])
    ap.add_argument("--set", default="default")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--spec", default=os.path.join(HERE, "variants.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    spec = load_spec(a.spec)
    sel = choose_set(spec, a.set)
    arch = a.arch or {"cuda": "sm_90", "hip": "gfx90a", "opencl": "opencl"}[a.target]
    if a.target == "opencl":
        files = ["oscar_opencl_kernels.cl", "oscar_opencl_source.c"]
    else:
        files = gpu_files(a.target, sel)
    if a.list:
        print(";".join(os.path.join(a.out, f) for f in files))
        return
    os.makedirs(a.out, exist_ok=True)
    if a.target == "opencl":
        gen_opencl(spec, a.out)
    else:
        gen_gpu(a.target, spec, sel, arch, a.out)


if __name__ == "__main__":
    main()
