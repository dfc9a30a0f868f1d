#!/bin/bash
cd /tmp/acc25
for s in valA valB; do for p in t1-base t1-p1; do ./ev.sh $p $s >> results.txt; done; done
for t in t2 t3; do ./cal.sh $t 0 $t-base; KPOW=1 ./cal.sh $t 0 $t-p1; done
for t in t2 t3; do for s in valA valB; do for p in $t-base $t-p1; do ./ev.sh $p $s >> results.txt; done; done; done
echo CHAIN1DONE >> results.txt
