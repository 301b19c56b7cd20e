set terminal pngcairo size 1000,650 font "sans,11"
set output "throughput.png"
set title "lenet5 on fashion_mnist, one machine" noenhanced font "sans,11"
set xlabel "workers"
set ylabel "throughput (samples/sec)"
set key top left noenhanced box opaque
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
1 6987.728 172.307
2 10653.675 259.851
4 10810.562 114.506
EOD
$s1 << EOD
1 7296.971 283.627
2 10139.821 1334.772
4 12266.744 358.194
EOD
$s2 << EOD
1 17497.205 2896.761
2 13343.647 111.892
4 11477.243 212.537
EOD
plot $s0 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 1 title "ps_sync (2 PS)", \
     x * 6987.728 with lines dt 2 lw 2 lc 1 notitle, \
     $s1 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 2 title "ps_async (2 PS)", \
     x * 7296.971 with lines dt 2 lw 2 lc 2 notitle, \
     $s2 using 1:2:3 with yerrorlines lw 2 pt 7 ps 1.2 lc 3 title "allreduce", \
     x * 17497.205 with lines dt 2 lw 2 lc 3 notitle, \
     NaN with lines dt 2 lw 2 lc rgb "gray40" title "ideal (linear scaling from 1 worker)"
