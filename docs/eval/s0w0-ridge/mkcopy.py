import array, sys
# mkcopy.py OUT BASE_START NCOPY COPY_START : 32 windows of calib.tokens from BASE_START, then NCOPY copy
# windows (64 tokens, a 992-token span, the span again) cut from calib.tokens from COPY_START
src = array.array('I'); src.frombytes(open('/work/shared/data/tiny-qwen3/calib.tokens','rb').read())
out, base, nc, cs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
a = array.array('I', src[base:base+65536])
for i in range(nc):
    o = cs + i*1056
    a.extend(src[o:o+64]); a.extend(src[o+64:o+1056]); a.extend(src[o+64:o+1056])
assert len(a) == 65536 + nc*2048
open(out,'wb').write(a.tobytes())
