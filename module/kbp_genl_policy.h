/* SPDX-License-Identifier: GPL-2.0 */
/* Do not edit directly, auto-generated from: */
/*	module/netlink/kbp.yaml */
/* by tools/kbp_spec.py gen */
/*
 * The input policy of the family "kbp" (kernel-policy: global): the
 * attributes of every request with their types, and the policy of each set
 * nested in them, for kbp_genl.c alone.  The knobs' ranges (the spec's checks)
 * are not in it: kbp_check_knobs() (kbp_main.c) enforces them after the
 * CAP_SYS_NICE check, with a message naming the knob and its range and one
 * kernel log line, which a policy refusal would pre-empt.
 */
#ifndef _KBP_GENL_POLICY_H
#define _KBP_GENL_POLICY_H

#include <net/netlink.h>

#include "uapi/kbp.h"

static const struct nla_policy kbp_map_policy[KBP_MAP_A_MAX + 1] = {
	[KBP_MAP_A_NAPI_INDEX]	= { .type = NLA_U32, },
	[KBP_MAP_A_CPU]		= { .type = NLA_U32, },
};

static const struct nla_policy kbp_policy[KBP_A_MAX + 1] = {
	[KBP_A_CPU]		= { .type = NLA_U32, },
	[KBP_A_MODE]		= { .type = NLA_U32, },
	[KBP_A_LINGER_US]	= { .type = NLA_U32, },
	[KBP_A_QUOTA]		= { .type = NLA_U32, },
	[KBP_A_IFINDEX]		= { .type = NLA_U32, },
	[KBP_A_IFNAME]		= { .type = NLA_STRING, .len = IFNAMSIZ - 1, },
	[KBP_A_NETNS_FD]	= { .type = NLA_U32, },
	[KBP_A_QUEUE_MAP]	= { .type = NLA_NESTED, },
	[KBP_A_RT_PRIO]		= { .type = NLA_U32, },
	[KBP_A_FREQ_CTL]	= { .type = NLA_U32, },
	[KBP_A_INTERVAL_US]	= { .type = NLA_U32, },
	[KBP_A_NETAP]		= { .type = NLA_U32, },
	[KBP_A_ROUND_MS]	= { .type = NLA_U32, },
	[KBP_A_MIN_INTERVAL_US]	= { .type = NLA_U32, },
	[KBP_A_MAX_INTERVAL_US]	= { .type = NLA_U32, },
	[KBP_A_MIN_CHANGE]	= { .type = NLA_U32, },
	[KBP_A_MAX_ROUND]	= { .type = NLA_U32, },
	[KBP_A_OBJECTIVE]	= { .type = NLA_U32, },
	[KBP_A_CLASS]		= { .type = NLA_U32, },
	[KBP_A_NICE]		= { .type = NLA_S32, },
};

#endif /* _KBP_GENL_POLICY_H */
