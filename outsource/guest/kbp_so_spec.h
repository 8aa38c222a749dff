/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Generated from outsource/guest/kbp_so_proc.yaml by tools/kbp_so_spec.py gen: do not edit.
 * /proc/kbp_so's keys and the module parameters' ranges, as kbpctl reads them
 * (src/kbp/outsource/_spec.py).
 */
#ifndef _KBP_SO_SPEC_H
#define _KBP_SO_SPEC_H

#include <linux/types.h>

/* poll_us range 0..this (a caller polls its own request this long) */
#define KBP_SO_POLL_US_MAX	1000
/* idle_poll_us range 0..this (0 off; an idle vCPU polls the rings this long) */
#define KBP_SO_IDLE_POLL_US_MAX	2000
/* host_timeout_ms range, lower end */
#define KBP_SO_TIMEOUT_MIN	200
/* host_timeout_ms range, upper end */
#define KBP_SO_TIMEOUT_MAX	600000

/*
 * The module line's keys after "kbp_so", in order (what each means:
 * kbp_so_proc.yaml).
 */
enum kbp_so_key {
	KBP_SO_K_STATE,
	KBP_SO_K_EPOCH,
	KBP_SO_K_QUEUES,
	KBP_SO_K_SOCKETS,
	KBP_SO_K_PINNED_PAGES,
	KBP_SO_K_ORPHAN_PAGES,
	KBP_SO_K_FALLBACKS,
	KBP_SO_K_HOST_TIMEOUT_MS,
	KBP_SO_K_POLL_US,
	KBP_SO_K_IDLE,
	KBP_SO_K_IDLE_POLL_US,
	KBP_SO_K_IRQS,
	KBP_SO_K_IRQS_SENT,
	KBP_SO_K_COMPLETIONS_IRQ,
	KBP_SO_K_COMPLETIONS_POLLED,
	KBP_SO_K_COMPLETIONS_SYSCALL,
	KBP_SO_K_COMPLETIONS_IDLE,
	KBP_SO_K_COMPLETIONS_TICK,
	KBP_SO_K_IDLE_POLL_NS,
	KBP_SO_K_IDLE_HALTS,
	KBP_SO_K_IDLE_RACES,
	KBP_SO_K_REFUSED_NETNS,
	KBP_SO_K_REFUSED_USER,
	KBP_SO_K_CLOSES_PENDING,
	KBP_SO_NR_KEYS
};

/*
 * The socket line's counters after its names, in order: struct kbp_so_stats'
 * atomic64_t c[] (what each counts: kbp_so_proc.yaml).
 */
enum kbp_so_stat {
	KBP_SO_ST_REQUESTS,
	KBP_SO_ST_COMPLETIONS,
	KBP_SO_ST_BYTES_OUT,
	KBP_SO_ST_BYTES_IN,
	KBP_SO_ST_COPIES,
	KBP_SO_ST_FALLBACKS,
	KBP_SO_ST_ERRORS,
	KBP_SO_NR_STATS
};

/* Their names in the file (kbp_so_spec.c); text: a word, not a number. */
struct kbp_so_key_desc {
	const char *key;
	bool text;
};

extern const struct kbp_so_key_desc kbp_so_keys[KBP_SO_NR_KEYS];
extern const char * const kbp_so_stat_keys[KBP_SO_NR_STATS];

#endif /* _KBP_SO_SPEC_H */
