set terminal pngcairo size 1000,650 font "sans,11"
set output "throughput.png"
set title "resnet50 on synthetic, one machine" noenhanced font "sans,11"
set xlabel "workers"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set xrange [0.5:2.5]
set xtics 1
$s0 << EOD
1 8.538 1.319
2 9.042 1.108
EOD
$s1 << EOD
1 11.156 0.532
2 13.043 0.165
EOD
plot $s0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (1 PS)", \
     x * 8.538 with lines dt 2 lw 2 lc 1 notitle, \
     $s1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "allreduce", \
     x * 11.156 with lines dt 2 lw 2 lc 2 notitle, \
     NaN with lines dt 2 lw 2 lc rgb "gray40" title "ideal (linear scaling from 1 worker)"
