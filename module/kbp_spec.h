/* SPDX-License-Identifier: GPL-2.0 */
/* Do not edit directly, auto-generated from: */
/*	module/netlink/kbp.yaml */
/* by tools/kbp_spec.py gen */
/*
 * The definitions of scope kernel of the family "kbp": the ranges and
 * defaults of its knobs.  Plain integers, nothing included: kbp_netap.h, which
 * builds in user space too, includes it.  The attributes' checks in the spec
 * name them; kbp_check_knobs() (kbp_main.c) and kbp_netap_check_params()
 * enforce them.
 */
#ifndef _KBP_SPEC_H
#define _KBP_SPEC_H

/*
 * quota: packets per NAPI per pass, at most the NAPI weight
 * (NAPI_POLL_WEIGHT); also the default of an rt poller
 */
#define KBP_QUOTA_MAX		64
/* quota of a non-rt poller by default (docs/design.md, "Classes") */
#define KBP_NONRT_QUOTA_DEF	8
/* linger_us: 1 s */
#define KBP_LINGER_US_MAX	1000000
/* above it, linger_us needs CAP_SYS_NICE (kbp_genl.c, kbp_takes_cpu()) */
#define KBP_LINGER_US_FREE	100
/* rt_prio: MAX_RT_PRIO - 1 */
#define KBP_RT_PRIO_MAX		99
/* nice of a non-rt poller: MIN_NICE */
#define KBP_NICE_MIN		(-20)
/* MAX_NICE */
#define KBP_NICE_MAX		19
/* entries of a queue map (KBP_A_QUEUE_MAP) */
#define KBP_MAP_MAX		256
/* periodic: the interval while the search is off, by default */
#define KBP_INTERVAL_US_DEF	1000
/* periodic: a search round, by default */
#define KBP_ROUND_MS_DEF	1000
#define KBP_ROUND_MS_MIN	10
/* 1 min */
#define KBP_ROUND_MS_MAX	60000
/*
 * NetAP's MinInterval (Park et al. 2020, Sect. 3.4.3): min_interval_us
 * by default; an interval_us or min_interval_us below it needs
 * CAP_SYS_NICE (kbp_genl.c, kbp_takes_cpu())
 */
#define KBP_NETAP_MIN_INTERVAL_US	100
/* NetAP's MaxInterval: max_interval_us by default */
#define KBP_NETAP_MAX_INTERVAL_US	4000
/* min_change by default (the paper gives no value) */
#define KBP_NETAP_MIN_CHANGE_PCT_DEF	20
/* max_round by default (the paper gives no value) */
#define KBP_NETAP_MAX_ROUND_DEF	300
/* interval_us, min_interval_us, max_interval_us: the range */
#define KBP_NETAP_INTERVAL_US_LO	10
#define KBP_NETAP_INTERVAL_US_HI	100000
/* min_change, in percent of the last round */
#define KBP_NETAP_MIN_CHANGE_PCT_LO	1
#define KBP_NETAP_MIN_CHANGE_PCT_HI	1000
/* above the longest search (17 rounds, for the range 10..100000 us) */
#define KBP_NETAP_MAX_ROUND_LO	20
#define KBP_NETAP_MAX_ROUND_HI	1000000

#endif /* _KBP_SPEC_H */
