set terminal pngcairo size 1000,650 font "sans,11"
set output "throughput.png"
set title "lenet5 on fashion_mnist, one machine" noenhanced font "sans,11"
set xlabel "workers"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set xrange [0.5:2.5]
set xtics 1
$s0 << EOD
1 6155.767 431.931
2 8742.482 140.967
EOD
$s1 << EOD
1 8926.489 301.506
2 11457.578 128.977
EOD
$s2 << EOD
1 11688.608 86.281
2 13722.093 318.847
EOD
$s3 << EOD
1 11783.017 195.584
2 11444.276 200.182
EOD
$s4 << EOD
1 14139.016 65.199
2 14883.008 73.279
EOD
$s5 << EOD
1 15229.130 66.050
2 16491.935 142.704
EOD
plot $s0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (2 PS), batch 32", \
     x * 6155.767 with lines dt 2 lw 2 lc 1 notitle, \
     $s1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "ps_sync (2 PS), batch 64", \
     x * 8926.489 with lines dt 2 lw 2 lc 2 notitle, \
     $s2 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 3 title "ps_sync (2 PS), batch 128", \
     x * 11688.608 with lines dt 2 lw 2 lc 3 notitle, \
     $s3 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 4 title "allreduce, batch 32", \
     x * 11783.017 with lines dt 2 lw 2 lc 4 notitle, \
     $s4 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 5 title "allreduce, batch 64", \
     x * 14139.016 with lines dt 2 lw 2 lc 5 notitle, \
     $s5 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 6 title "allreduce, batch 128", \
     x * 15229.130 with lines dt 2 lw 2 lc 6 notitle, \
     NaN with lines dt 2 lw 2 lc rgb "gray40" title "ideal (linear scaling from 1 worker)"
