set terminal pngcairo size 1000,650 font "sans,11"
set output "throughput.png"
set title "resnet18 on fashion_mnist, one machine" noenhanced font "sans,11"
set xlabel "workers"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set yrange [0:*]
set xrange [0.5:2.5]
set xtics 1
$s0 << EOD
1 63.326 1.053
2 78.630 0.224
EOD
$s1 << EOD
1 80.514 0.376
2 91.598 0.766
EOD
plot $s0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (2 PS)", \
     x * 63.326 with lines dt 2 lw 2 lc 1 notitle, \
     $s1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "allreduce", \
     x * 80.514 with lines dt 2 lw 2 lc 2 notitle, \
     NaN with lines dt 2 lw 2 lc rgb "gray40" title "ideal (linear scaling from 1 worker)"
