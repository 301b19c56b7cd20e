set terminal pngcairo size 900,600 font "sans,11"
set output "throughput.png"
set title "synthetic compute 100 ms, 25.6 MB of gradients, 250 Mbit/s links, one network namespace per task" noenhanced
set xlabel "workers"
set ylabel "throughput (data/sec)"
set key top left noenhanced
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
4 48.285
EOD
$s1 << EOD
4 86.092
EOD
$s2 << EOD
4 85.617
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_sync (4 PS)", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce"
