#!/usr/bin/env python3
"""Copy an OSCAR parameter file with some clip ratios replaced (diagnosis only).

  set_clips.py IN OUT [--k C|keep] [--v C|keep] [--layers 0,3,4]

Rewrites the F32 [num_layers, 2] `clip` tensor (FORMAT.md section 6) in place
in a copy; everything else is byte for byte the same. The model hash and the
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
    layers = None
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
    if not t or t["dtype"] != "F32" or len(t["shape"]) != 2 or t["shape"][1] != 2:
        print("set_clips: no F32 [L, 2] clip tensor", file=sys.stderr)
        return 2
    base = 8 + hlen + t["data_offsets"][0]
    nl = t["shape"][0]
    for l in range(nl):
        if layers is not None and l not in layers:
            continue
        for which, c in ((0, k), (1, v)):
            if c is not None:
                struct.pack_into("<f", data, base + 4 * (2 * l + which), c)
    open(dst, "wb").write(data)
    clips = struct.unpack_from("<%df" % (2 * nl), data, base)
    print(" ".join("L%d %.2f/%.2f" % (l, clips[2 * l], clips[2 * l + 1]) for l in range(nl)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
