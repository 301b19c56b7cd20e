set terminal pngcairo size 1000,650 font "sans,11"
set output "batch_size.png"
set title "alexnet on synthetic, one machine" noenhanced font "sans,11"
set xlabel "batch size per worker (samples)"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set logscale x 2
set xrange [22.857:89.600]
$b0 << EOD
32 10.963 2.089
64 17.321 0.798
EOD
$b1 << EOD
32 14.187 1.153
64 21.239 0.441
EOD
plot $b0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (1 PS), 1 worker", \
     $b1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "ps_sync (1 PS), 2 workers"
