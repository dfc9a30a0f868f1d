set terminal pngcairo size 900,600
set output 'docs/eval/plot.png'
set title "KL(p_bf16 || p_method) per token vs bits per element\ncontext 2048, sink 64, recent 256 (bf16: 16 bits, KL 0, not shown)" noenhanced
set xlabel 'bits per element (quantized region, metadata counted)'
set ylabel 'mean KL per token (nats), log scale'
set logscale y
set grid
set key outside right top noenhanced
set xrange [1.5:*]
names = "int4 int2 quarot2 kivi2 oscar2 oscar2-lm"
pts = "5 7 9 11 13 15 4 6 8 10 12 14"
cols = "#1b9e77 #d95f02 #7570b3 #e7298a #66a61e #a6761d #000000 #666666 #1f78b4 #b2df8a #fb9a99 #cab2d6"
plot for [i=1:words(names)] 'docs/eval/plot.png.dat' every ::(i-1)::(i-1) using 2:3 with points pt int(word(pts, (i - 1) % 12 + 1)) ps 2 lc rgb word(cols, (i - 1) % 12 + 1) title word(names, i)
