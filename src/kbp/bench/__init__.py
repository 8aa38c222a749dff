"""kbp.bench: the benchmark suite (``kbpctl bench``, ``python -m kbp.bench``).

Compares the receive modes of names.BENCH_MODES against stock NAPI on a netns + veth testbed:
kernel-timestamped round trips of an RT request/response flow with and without a competing
flood, EE-KBP's Table 2 traffic conditions, RFC 2544 zero-loss throughput, CPU time,
interrupts, softirqs, poller counters and kernel-side delays (bpftrace on tracepoints).
"""
