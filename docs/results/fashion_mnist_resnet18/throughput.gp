set terminal pngcairo size 900,600 font "sans,11"
set output "throughput.png"
set title "resnet18 on fashion_mnist, one machine" noenhanced
set xlabel "workers"
set ylabel "throughput (data/sec)"
set key top left noenhanced
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
1 69.198
2 68.147
4 74.263
EOD
$s1 << EOD
1 62.734
2 78.390
4 79.352
EOD
$s2 << EOD
1 79.384
2 77.849
4 80.625
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 69.198 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_async (2 PS)", \
     x * 62.734 with lines dt 2 lw 1 lc 2 title "ps_async (2 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 79.384 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
