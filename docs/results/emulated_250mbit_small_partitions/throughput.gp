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
1 34.431
2 67.964
4 59.750
EOD
$s1 << EOD
1 34.135
2 67.709
4 132.106
EOD
$s2 << EOD
1 275.889
2 67.348
4 92.938
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 34.431 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_sync (4 PS)", \
     x * 34.135 with lines dt 2 lw 1 lc 2 title "ps_sync (4 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 275.889 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
