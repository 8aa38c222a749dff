/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kbp NetAP search: the golden-section search of the polling interval of
 * NetAP (Park et al., Applied Sciences 10(15):5219, 2020, Algorithm 2, with
 * the restart rules of Algorithm 1 lines 11-19).  See kbp_netap.c.
 *
 * This header and kbp_netap.c use nothing but integer types and errno
 * values, so the same file builds into kbp.ko and into the user-space unit
 * test (tests/module/netap/): in the kernel the types come from
 * <linux/types.h>, elsewhere from the typedefs below.
 */
#ifndef _KBP_NETAP_H
#define _KBP_NETAP_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/errno.h>
#else
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
/* as the kernel defines them (asm-generic/int-ll64.h) */
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
#endif

/*
 * The knobs' ranges and defaults, generated from netlink/kbp.yaml: the
 * paper's constants (Sect. 3.4.3) MinInterval and MaxInterval, the default
 * search range (KBP_NETAP_MIN_INTERVAL_US, KBP_NETAP_MAX_INTERVAL_US), the
 * defaults of the two restart knobs (the paper gives no values:
 * KBP_NETAP_MIN_CHANGE_PCT_DEF, KBP_NETAP_MAX_ROUND_DEF), and what
 * kbp_netap_check_params() accepts (KBP_NETAP_INTERVAL_US_LO/_HI,
 * KBP_NETAP_MIN_CHANGE_PCT_LO/_HI, KBP_NETAP_MAX_ROUND_LO/_HI).
 */
#include "kbp_spec.h"

/* The paper's end of the search (Sect. 3.4.3). */
#define KBP_NETAP_MIN_DISTANCE_US	30	/* MinDistance */
/* R = 0.618 as an integer ratio; kbp_netap.c holds its powers in Q32. */
#define KBP_NETAP_R_NUM			618
#define KBP_NETAP_R_DEN			1000
#define KBP_NETAP_NR_DIST		24	/* R^1 .. R^24 */

/* A constant of kbp_spec.h as a string, for messages. */
#define KBP_NETAP_STR_(x)		#x
#define KBP_NETAP_STR(x)		KBP_NETAP_STR_(x)

struct kbp_netap_params {
	u32 min_interval_us;	/* MinInterval */
	u32 max_interval_us;	/* MaxInterval, or a lower latency cap */
	u32 min_change_pct;	/* MinChange, in percent of the last round */
	u32 max_round;		/* MaxRound */
};

/* Which probe the round now running measures (Algorithm 2 "selected"). */
enum kbp_netap_probe {
	KBP_NETAP_PROBE_LOW,
	KBP_NETAP_PROBE_HIGH,
};

/* Why the search last (re)started. */
enum kbp_netap_start {
	KBP_NETAP_START_INIT,		/* kbp_netap_init() */
	KBP_NETAP_START_CHANGE,		/* bytes changed by more than MinChange */
	KBP_NETAP_START_MAX_ROUND,	/* round reached MaxRound */
	KBP_NETAP_START_CALLER,		/* kbp_netap_restart() */
};

/*
 * Search state of one poller.  low_us and high_us keep the paper's names:
 * interval_low starts at MinInterval + distance and interval_high at
 * MaxInterval - distance, so low_us is the longer of the two probes.  The
 * paper does not keep the bracket; range_lo_us..range_hi_us is it (the peak
 * of a unimodal curve stays inside), kept for status and tests.
 */
struct kbp_netap {
	struct kbp_netap_params p;
	u32 round;		/* rounds since the (re)start, round 0 included */
	u32 interval_us;	/* interval of the round now running */
	u32 low_us;		/* interval_low */
	u32 high_us;		/* interval_high */
	u32 range_lo_us;
	u32 range_hi_us;
	u32 distance_us;	/* distance */
	u32 dist_idx;		/* distance_us = round((max - min) * R^dist_idx) */
	u32 restarts;		/* restarts since init */
	u64 perf_low;		/* bytes of the round at interval_low */
	u64 perf_high;		/* bytes of the round at interval_high */
	u64 best_bytes;		/* bytes at the chosen interval, when converged */
	u64 prev_bytes;		/* bytes of the last round, when converged */
	u8 selected;		/* enum kbp_netap_probe */
	u8 converged;		/* search over: interval_us stays */
	u8 started_by;		/* enum kbp_netap_start */
};

void kbp_netap_default_params(struct kbp_netap_params *p);
int kbp_netap_check_params(const struct kbp_netap_params *p,
			   const char **why);
u32 kbp_netap_distance(const struct kbp_netap_params *p, u32 k);
int kbp_netap_init(struct kbp_netap *s, const struct kbp_netap_params *p);
void kbp_netap_restart(struct kbp_netap *s);
u32 kbp_netap_round(struct kbp_netap *s, u64 bytes);

#endif /* _KBP_NETAP_H */
