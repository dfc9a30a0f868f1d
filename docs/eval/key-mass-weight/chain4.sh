#!/bin/bash
cd /tmp/acc25
while ! grep -q CHAIN1DONE results.txt; do sleep 10; done
KPOW=3 ./cal.sh t1 0 t1-q2
./ev.sh t1-q2 valB >> results.txt
KPOW=3 ./cal.sh t2 0 t2-q2
./ev.sh t2-q2 valA >> results.txt
echo Q2SCREENDONE >> results.txt
./ev.sh t1-q2 valA >> results.txt
./ev.sh t2-q2 valB >> results.txt
echo CHAIN4DONE >> results.txt
