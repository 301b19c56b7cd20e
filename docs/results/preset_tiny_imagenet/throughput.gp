set terminal pngcairo size 1000,650 font "sans,11"
set output "throughput.png"
set title "alexnet on synthetic, one machine" noenhanced font "sans,11"
set xlabel "workers"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set xrange [0.5:2.5]
set xtics 1
$s0 << EOD
1 10.963 2.089
2 14.187 1.153
EOD
$s1 << EOD
1 17.321 0.798
2 21.239 0.441
EOD
plot $s0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (1 PS), batch 32", \
     x * 10.963 with lines dt 2 lw 2 lc 1 notitle, \
     $s1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "ps_sync (1 PS), batch 64", \
     x * 17.321 with lines dt 2 lw 2 lc 2 notitle, \
     NaN with lines dt 2 lw 2 lc rgb "gray40" title "ideal (linear scaling from 1 worker)"
