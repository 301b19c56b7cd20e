set terminal pngcairo size 900,600 font "sans,11"
set output "throughput.png"
set title "lenet5 on fashion_mnist, one machine" noenhanced
set xlabel "workers"
set ylabel "throughput (data/sec)"
set key top left noenhanced
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
1 5341.773
2 7248.500
4 7870.152
EOD
$s1 << EOD
1 6984.757
2 9561.326
4 9427.842
EOD
$s2 << EOD
1 8292.495
2 7869.434
4 7725.292
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 5341.773 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_async (2 PS)", \
     x * 6984.757 with lines dt 2 lw 1 lc 2 title "ps_async (2 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 8292.495 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
