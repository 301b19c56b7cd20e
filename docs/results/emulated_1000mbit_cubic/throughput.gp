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
1 32.961
2 63.335
4 56.662
EOD
$s1 << EOD
1 32.564
2 63.732
4 118.904
EOD
$s2 << EOD
1 156.399
2 58.177
4 77.505
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 32.961 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_sync (4 PS)", \
     x * 32.564 with lines dt 2 lw 1 lc 2 title "ps_sync (4 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 156.399 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
