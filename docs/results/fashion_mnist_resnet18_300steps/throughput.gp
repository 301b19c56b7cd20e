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
1 66.984
2 64.035
4 60.847
EOD
$s1 << EOD
1 34.041
2 75.685
4 76.168
EOD
$s2 << EOD
1 70.493
2 73.559
4 72.048
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (2 PS)", \
     x * 66.984 with lines dt 2 lw 1 lc 1 title "ps_sync (2 PS), ideal", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "ps_async (2 PS)", \
     x * 34.041 with lines dt 2 lw 1 lc 2 title "ps_async (2 PS), ideal", \
     $s2 using 1:2 with linespoints lw 2 pt 7 lc 3 title "allreduce", \
     x * 70.493 with lines dt 2 lw 1 lc 3 title "allreduce, ideal"
