set terminal pngcairo size 900,600 font "sans,11"
set output "throughput.png"
set title "synthetic compute 100 ms, 102.2 MB of gradients, 1000 Mbit/s links, one network namespace per task" noenhanced
set xlabel "workers"
set ylabel "throughput (data/sec)"
set key top left noenhanced
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
1 32.919
2 63.903
4 54.407
EOD
$s1 << EOD
1 32.613
2 61.785
4 112.596
EOD
$s2 << EOD
1 181.832
2 61.167
4 82.919
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 32.919 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_sync (4 PS)", \
     x * 32.613 with lines dt 2 lw 1 lc 2 title "ps_sync (4 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 181.832 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
