// SPDX-License-Identifier: GPL-2.0-only
/*
 * Generated from outsource/guest/kbp_so_proc.yaml by tools/kbp_so_spec.py gen: do not edit.
 * The names /proc/kbp_so writes its keys under (kbp_so_proc.c).
 */
#include "kbp_so_spec.h"

const struct kbp_so_key_desc kbp_so_keys[KBP_SO_NR_KEYS] = {
	[KBP_SO_K_STATE] = { "state", true },
	[KBP_SO_K_EPOCH] = { "epoch", false },
	[KBP_SO_K_QUEUES] = { "queues", false },
	[KBP_SO_K_SOCKETS] = { "sockets", false },
	[KBP_SO_K_PINNED_PAGES] = { "pinned_pages", false },
	[KBP_SO_K_ORPHAN_PAGES] = { "orphan_pages", false },
	[KBP_SO_K_FALLBACKS] = { "fallbacks", false },
	[KBP_SO_K_HOST_TIMEOUT_MS] = { "host_timeout_ms", false },
	[KBP_SO_K_POLL_US] = { "poll_us", false },
	[KBP_SO_K_IDLE] = { "idle", true },
	[KBP_SO_K_IDLE_POLL_US] = { "idle_poll_us", false },
	[KBP_SO_K_IRQS] = { "irqs", false },
	[KBP_SO_K_IRQS_SENT] = { "irqs_sent", false },
	[KBP_SO_K_COMPLETIONS_IRQ] = { "completions_irq", false },
	[KBP_SO_K_COMPLETIONS_POLLED] = { "completions_polled", false },
	[KBP_SO_K_COMPLETIONS_SYSCALL] = { "completions_syscall", false },
	[KBP_SO_K_COMPLETIONS_IDLE] = { "completions_idle", false },
	[KBP_SO_K_COMPLETIONS_TICK] = { "completions_tick", false },
	[KBP_SO_K_IDLE_POLL_NS] = { "idle_poll_ns", false },
	[KBP_SO_K_IDLE_HALTS] = { "idle_halts", false },
	[KBP_SO_K_IDLE_RACES] = { "idle_races", false },
	[KBP_SO_K_REFUSED_NETNS] = { "refused_netns", false },
	[KBP_SO_K_REFUSED_USER] = { "refused_user", false },
	[KBP_SO_K_CLOSES_PENDING] = { "closes_pending", false },
};

const char * const kbp_so_stat_keys[KBP_SO_NR_STATS] = {
	[KBP_SO_ST_REQUESTS] = "requests",
	[KBP_SO_ST_COMPLETIONS] = "completions",
	[KBP_SO_ST_BYTES_OUT] = "bytes_out",
	[KBP_SO_ST_BYTES_IN] = "bytes_in",
	[KBP_SO_ST_COPIES] = "copies",
	[KBP_SO_ST_FALLBACKS] = "fallbacks",
	[KBP_SO_ST_ERRORS] = "errors",
};
