set terminal pngcairo size 900,600 font "sans,11"
set output "throughput.png"
set title "synthetic compute 1000 ms, 102.2 MB of gradients (the last 67% of compute a backward pass that allreduce overlaps: its Exchange/step is what is left after compute), 1000 Mbit/s links, one network namespace per task" noenhanced
set xlabel "workers"
set ylabel "throughput (data/sec)"
set key top left noenhanced
set grid
set xrange [0.5:4.5]
set yrange [0:*]
set xtics 1
$s0 << EOD
4 100.700
EOD
$s1 << EOD
4 66.011
EOD
plot $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "ps_sync (4 PS)", \
     $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title "allreduce"
