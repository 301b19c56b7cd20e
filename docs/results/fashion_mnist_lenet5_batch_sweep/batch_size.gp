set terminal pngcairo size 1000,650 font "sans,11"
set output "batch_size.png"
set title "lenet5 on fashion_mnist, one machine" noenhanced font "sans,11"
set xlabel "batch size per worker (samples)"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set logscale x 2
set xrange [22.857:179.200]
$b0 << EOD
32 6155.767 431.931
64 8926.489 301.506
128 11688.608 86.281
EOD
$b1 << EOD
32 8742.482 140.967
64 11457.578 128.977
128 13722.093 318.847
EOD
$b2 << EOD
32 11783.017 195.584
64 14139.016 65.199
128 15229.130 66.050
EOD
$b3 << EOD
32 11444.276 200.182
64 14883.008 73.279
128 16491.935 142.704
EOD
plot $b0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (2 PS), 1 worker", \
     $b1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "ps_sync (2 PS), 2 workers", \
     $b2 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 3 title "allreduce, 1 worker", \
     $b3 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 4 title "allreduce, 2 workers"
