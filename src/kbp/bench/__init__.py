"""kbp.bench: the benchmark suite (``kbpctl bench``, ``python -m kbp.bench``).

Compares the receive modes of kbp.bench.modes' table against stock NAPI on a netns + veth
testbed: kernel-timestamped round trips of an RT request/response flow with and without a
competing flood, EE-KBP's Table 2 traffic conditions, RFC 2544 zero-loss throughput, CPU time,
interrupts, softirqs, poller counters and kernel-side delays (bpftrace on tracepoints).

Layout: ``cli`` (options, presets, output), ``runner`` (Bench: config, checks, plan, the
run's exit stack), ``context`` (RunContext, Bench's base: testbed, RT app, modes on and off,
signals), ``measure/`` (one latency run, one RFC 2544 search, one idle-cost run with any
mode), ``testbed`` (netns + veth testbeds), ``scenarios/`` (the registry; one file per
scenario: its links, roles, tools, plan, run loop, summary, tables, plots), ``parts`` (the
measurements scenarios compose: rtt blocks, Table 2, RFC 2544), ``placement`` (roles to
CPUs), ``modes`` (the modes' table: each mode's name, category, backend, colour, summary,
whether it spins, and one adapter per mode with its quirks), ``heavy`` (the heavy receiver
shared-cpu and rt-split share, and the modes that move or split its flow), ``report`` /
``plots`` (tables and PNGs, CPUs by role), ``workloads`` (sockperf server, iperf3 flood),
``tester`` (kbp-rtt), ``trace`` (bpftrace), ``sysstat`` / ``netstats`` / ``machine`` (what
the system counted).
"""
