#!/bin/bash
cd /tmp/acc25
while [ ! -f /tmp/acc25/san.built ]; do sleep 5; done
KPOW=5 ./cal.sh t1 0 t1-g
./ev.sh t1-g valB >> results.txt
KPOW=5 ./cal.sh t2 0 t2-g
./ev.sh t2-g valA >> results.txt
echo CHAIN5DONE >> results.txt
