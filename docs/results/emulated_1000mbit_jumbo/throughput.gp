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
1 34.117
2 66.274
4 60.394
EOD
$s1 << EOD
1 33.666
2 65.631
4 116.331
EOD
$s2 << EOD
1 192.328
2 62.785
4 85.714
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 34.117 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_sync (4 PS)", \
     x * 33.666 with lines dt 2 lw 1 lc 2 title "ps_sync (4 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 192.328 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
