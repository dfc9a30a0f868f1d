#!/usr/bin/env python3
"""Copy an OSCAR parameter file with some clip ratios replaced (diagnosis only).

  set_clips.py IN OUT [--k C|keep] [--v C|keep] [--layers 0,3,4] [--heads 4:1,3:0]

Rewrites the F32 `clip` tensor (FORMAT.md section 6: [num_layers, 2], or
[num_layers, num_kv_heads, 2] per KV head) in place in a copy; --heads L:H
picks (layer, KV head) pairs and needs a per-head file; everything else is byte for byte the same. The model hash and the
feedback weights are kept, so oscar-eval accepts the file for the same model.
Used for the retrieval diagnosis in docs/eval/retrieval.md (K clips off,
V clips off, per layer). Standard library only.
"""
import json, struct, sys


def main(argv):
    args = argv[1:]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, rest = args[0], args[1], args[2:]
    k = v = None
    layers = heads = None
    i = 0
    while i < len(rest):
        a = rest[i]
        val = rest[i + 1] if i + 1 < len(rest) else None
        if val is None:
            print(f"set_clips: {a} needs a value", file=sys.stderr)
            return 2
        if a == "--k":
            k = None if val == "keep" else float(val)
        elif a == "--v":
            v = None if val == "keep" else float(val)
        elif a == "--layers":
            layers = {int(x) for x in val.split(",") if x}
        elif a == "--heads":
            heads = {tuple(int(y) for y in x.split(":")) for x in val.split(",") if x}
        else:
            print(f"set_clips: unknown option {a}", file=sys.stderr)
            return 2
        i += 2
    for c in (k, v):
        if c is not None and not (0.0 < c <= 1.0):
            print("set_clips: a clip ratio must be in (0, 1]", file=sys.stderr)
            return 2
    data = bytearray(open(src, "rb").read())
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen])
    t = header.get("clip")
    if not t or t["dtype"] != "F32" or t["shape"][-1] != 2 or len(t["shape"]) not in (2, 3):
        print("set_clips: no F32 [L, 2] or [L, Hkv, 2] clip tensor", file=sys.stderr)
        return 2
    base = 8 + hlen + t["data_offsets"][0]
    nl = t["shape"][0]
    nh = t["shape"][1] if len(t["shape"]) == 3 else 1
    if heads is not None and len(t["shape"]) != 3:
        print("set_clips: --heads needs a file with per-head clips ([L, Hkv, 2], format_version 3)", file=sys.stderr)
        return 2
    for l in range(nl):
        for h in range(nh):
            if (layers is not None and l not in layers) or (heads is not None and (l, h) not in heads):
                continue
            for which, c in ((0, k), (1, v)):
                if c is not None:
                    struct.pack_into("<f", data, base + 4 * (2 * (l * nh + h) + which), c)
    open(dst, "wb").write(data)
    clips = struct.unpack_from("<%df" % (2 * nl * nh), data, base)
    print(" ".join("L%d%s %.2f/%.2f" % (i // nh, "h%d" % (i % nh) if nh > 1 else "", clips[2 * i], clips[2 * i + 1])
                   for i in range(nl * nh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
