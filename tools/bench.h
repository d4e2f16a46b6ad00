/* SPDX-License-Identifier: MIT */
/* Subcommands of kvtier-bench that live in their own files. */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

/* kvtier-bench recall (tools/bench_recall.c): argv[0] is "recall". Exit status. */
int bench_recall(int argc, char **argv);
/* kvtier-bench attend (tools/bench_attend.c). */
int bench_attend(int argc, char **argv);
/* kvtier-bench disk (tools/bench_disk.c). */
int bench_disk(int argc, char **argv);
/* kvtier-bench create (tools/bench_create.c). */
int bench_create(int argc, char **argv);
/* kvtier-bench calibrate (tools/bench_calibrate.c). */
int bench_calibrate(int argc, char **argv);

#endif /* KVT_BENCH_H */
