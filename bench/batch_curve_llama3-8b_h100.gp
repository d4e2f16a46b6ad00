# written by kvtier-curve; run with `gnuplot bench/batch_curve_llama3-8b_h100.gp`
set terminal svg size 1000,420 noenhanced background rgb 'white'
set output 'bench/batch_curve_llama3-8b_h100.svg'
set datafile separator ','
set multiplot layout 1,2 title 'llama3-8b on h100, HBM budget 65.0 GiB: batch-size sweep'
set grid
set key top left Left reverse samplen 3
set offsets 0, 0, graph 0.4, 0
set xlabel 'batch size (concurrency)'
set logscale x 2
set ylabel 'output throughput (tok/s)'
set yrange [0:*]
plot 'bench/batch_curve_llama3-8b_h100.csv' every ::1 using 1:((strcol(2) eq 'kvtier' && strcol(3) eq '1') ? $4 : 1/0) with linespoints lt 1 dt 1 lw 2 pt 5 ps 0.7 title 'kvtier, ws-control', \
     'bench/batch_curve_llama3-8b_h100.csv' every ::1 using 1:((strcol(2) eq 'kvtier' && strcol(3) eq '0') ? $4 : 1/0) with linespoints lt 2 dt 2 lw 2 pt 7 ps 0.7 title 'kvtier, no ws-control', \
     'bench/batch_curve_llama3-8b_h100.csv' every ::1 using 1:((strcol(2) eq 'snapstream' && strcol(3) eq '-') ? $4 : 1/0) with linespoints lt 3 dt 1 lw 2 pt 9 ps 0.7 title 'snapstream'
set ylabel 'blocks loaded per iteration'
set logscale y
set yrange [*:*]
plot 'bench/batch_curve_llama3-8b_h100.csv' every ::1 using 1:((strcol(2) eq 'kvtier' && strcol(3) eq '1') ? ($6 > 0.1 ? $6 : 0.1) : 1/0) with linespoints lt 1 dt 1 lw 2 pt 5 ps 0.7 title 'kvtier, ws-control', \
     'bench/batch_curve_llama3-8b_h100.csv' every ::1 using 1:((strcol(2) eq 'kvtier' && strcol(3) eq '0') ? ($6 > 0.1 ? $6 : 0.1) : 1/0) with linespoints lt 2 dt 2 lw 2 pt 7 ps 0.7 title 'kvtier, no ws-control'
unset multiplot
