/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Differences between the kernels kbp builds against (Debian 6.1, 6.12,
 * 6.12-rt).  Everything kernel-dependent lives here; the KBP_HAVE_* macros
 * come from feature probes of the headers in Kbuild.
 */
#ifndef _KBP_COMPAT_H
#define _KBP_COMPAT_H

#include <linux/filter.h>
#include <linux/kernel.h>
#include <linux/netdevice.h>
#include <linux/netlink.h>
#include <linux/sched.h>

/* 6.11 added the per-task BPF net context that NAPI pollers set up. */
#ifdef KBP_HAVE_BPF_NET_CTX
struct kbp_bpf_ctx {
	struct bpf_net_context ctx;
	struct bpf_net_context *set;
};

static inline void kbp_bpf_ctx_set(struct kbp_bpf_ctx *c)
{
	c->set = bpf_net_ctx_set(&c->ctx);
}

static inline void kbp_bpf_ctx_clear(struct kbp_bpf_ctx *c)
{
	bpf_net_ctx_clear(c->set);
}
#else
struct kbp_bpf_ctx {
};

static inline void kbp_bpf_ctx_set(struct kbp_bpf_ctx *c)
{
}

static inline void kbp_bpf_ctx_clear(struct kbp_bpf_ctx *c)
{
}
#endif

/* 6.10 added napi->irq (netif_napi_set_irq()). */
static inline int kbp_napi_irq(const struct napi_struct *n)
{
#ifdef KBP_HAVE_NAPI_IRQ
	return n->irq;
#else
	return -1;
#endif
}

/*
 * Since 6.4 a running task can switch itself to a pending livepatch
 * (__klp_sched_try_switch(), which cond_resched() calls during a transition);
 * KBP_HAVE_KLP_COND_RESCHED says the kernel has it.
 */
#ifdef KBP_HAVE_KLP_COND_RESCHED
#include <linux/livepatch_sched.h>
#endif

/*
 * A preemption point for a thread that does not sleep.  __cond_resched()
 * exists where cond_resched() can matter: without CONFIG_PREEMPTION, or with
 * PREEMPT_DYNAMIC (the same condition as in include/linux/sched.h).  A fully
 * preemptible kernel without PREEMPT_DYNAMIC (a PREEMPT_RT build that does
 * not select it) preempts the poller anywhere and needs no explicit point.
 */
static inline void kbp_cond_resched(void)
{
#if !defined(CONFIG_PREEMPTION) || defined(CONFIG_PREEMPT_DYNAMIC)
	__cond_resched();
#endif
}

/*
 * Tell a netlink caller what is wrong: the formatted text where the kernel
 * has formatted extack messages (6.2+), @summary before that.
 */
static inline void kbp_tell_msg(struct netlink_ext_ack *extack,
				const char *summary, const char *msg)
{
	if (!extack)
		return;
#ifdef NL_SET_ERR_MSG_FMT_MOD
	/* what NL_SET_ERR_MSG_FMT_MOD() does, truncating without a warning */
	snprintf(extack->_msg_buf, NETLINK_MAX_FMTMSG_LEN, "kbp: %s", msg);
	extack->_msg = extack->_msg_buf;
#else
	extack->_msg = summary;
#endif
}

static inline __printf(4, 0)
void kbp_vtell(struct netlink_ext_ack *extack, bool log, const char *summary,
	       const char *fmt, va_list args)
{
	char msg[128];

	vsnprintf(msg, sizeof(msg), fmt, args);
	if (log)
		pr_info("kbp: refused: %s\n", msg);
	kbp_tell_msg(extack, summary, msg);
}

static inline __printf(3, 4)
void kbp_tell(struct netlink_ext_ack *extack, const char *summary,
	      const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	kbp_vtell(extack, false, summary, fmt, args);
	va_end(args);
}

/* Refuse a request: kbp_tell() it, and log one line naming the problem. */
static inline __printf(3, 4)
void kbp_refuse(struct netlink_ext_ack *extack, const char *summary,
		const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	kbp_vtell(extack, true, summary, fmt, args);
	va_end(args);
}

#endif /* _KBP_COMPAT_H */
