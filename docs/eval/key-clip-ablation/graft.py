#!/usr/bin/env python3
"""graft.py BASE DONOR OUT TENSOR HEAD: write OUT = BASE with TENSOR[HEAD] (one KV head's slice of a
[Hkv, ...] tensor, e.g. layers.4.fb_k 1) taken from DONOR (diagnosis only: both files must come
from the same model and, for feedback weights, the same rotation; docs/eval/key-clip-ablation).
Standard library only."""
import json, struct, sys
base,donor,out,name,head=sys.argv[1],sys.argv[2],sys.argv[3],sys.argv[4],int(sys.argv[5])
def load(f):
    d=bytearray(open(f,'rb').read()); n=struct.unpack_from('<Q',d,0)[0]; return d,json.loads(d[8:8+n]),8+n
b,hb,ob=load(base); d,hd,od=load(donor)
tb,td=hb[name],hd[name]; assert tb['shape']==td['shape'] and tb['dtype']==td['dtype']
per=(tb['data_offsets'][1]-tb['data_offsets'][0])//tb['shape'][0]
sb=ob+tb['data_offsets'][0]+head*per; sd=od+td['data_offsets'][0]+head*per
b[sb:sb+per]=d[sd:sd+per]; open(out,'wb').write(b)
