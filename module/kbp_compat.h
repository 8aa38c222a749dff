/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Differences between the kernels kbp builds against (Debian 6.1, 6.12,
 * 6.12-rt, 7.2, 7.2-rt).  Everything kernel-dependent lives here; the KBP_HAVE_* macros
 * come from feature probes of the headers in Kbuild.
 */
#ifndef _KBP_COMPAT_H
#define _KBP_COMPAT_H

#include <linux/filter.h>
#include <linux/kernel.h>
#include <linux/netdevice.h>
#include <linux/netlink.h>
#include <linux/sched.h>
#include <linux/workqueue.h>
#ifdef KBP_HAVE_GRO_NODE
#include <net/gro.h>
#endif
#ifdef KBP_HAVE_RXQ_NAPI
#include <net/netdev_rx_queue.h>
#endif

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
 * The GRO part of the tail of __napi_poll() for a poll that used its whole
 * budget: flush GRO packets held for more than a jiffy (all of them if
 * HZ < 1000), then deliver the GRO_NORMAL skbs batched on rx_list.  After
 * 6.12 upstream moved this state out of napi_struct into struct gro_node
 * napi->gro, and __napi_poll() now calls gro_flush_normal(&n->gro, HZ >= 1000), i.e.
 * gro_flush() + gro_normal_list().  gro_normal_list() calls
 * netif_receive_skb_list_internal(), which is not exported: deliver through
 * netif_receive_skb_list(), the exported wrapper (the same work plus its
 * tracepoints), as kbp does on every kernel.
 */
#ifdef KBP_HAVE_GRO_NODE
/* @flush_old: only packets held for more than a jiffy; else all of them */
static inline void kbp_gro_flush(struct napi_struct *n, bool flush_old)
{
	gro_flush(&n->gro, flush_old);
}

static inline void kbp_gro_deliver_rx_list(struct napi_struct *n)
{
	struct gro_node *gro = &n->gro;

	if (!gro->rx_count)
		return;
	netif_receive_skb_list(&gro->rx_list);
	INIT_LIST_HEAD(&gro->rx_list);
	gro->rx_count = 0;
}
#else
static inline void kbp_gro_flush(struct napi_struct *n, bool flush_old)
{
	if (n->gro_bitmask)
		napi_gro_flush(n, flush_old);
}

static inline void kbp_gro_deliver_rx_list(struct napi_struct *n)
{
	if (!n->rx_count)
		return;
	netif_receive_skb_list(&n->rx_list);
	INIT_LIST_HEAD(&n->rx_list);
	n->rx_count = 0;
}
#endif

static inline void kbp_gro_flush_old(struct napi_struct *n)
{
	kbp_gro_flush(n, HZ >= 1000);
}

/*
 * dev_set_threaded() took a bool until upstream, adding threaded busy
 * polling, made it take enum netdev_napi_threaded (0 disabled, 1 enabled,
 * 2 busy-poll), the values dev->threaded now holds.  @mode is such a value; a kernel with the
 * bool reads it as on/off.
 */
static inline int kbp_dev_set_threaded(struct net_device *dev,
				       unsigned int mode)
{
#ifdef KBP_HAVE_NAPI_THREADED_MODE
	return dev_set_threaded(dev, (enum netdev_napi_threaded)mode);
#else
	return dev_set_threaded(dev, mode != 0);
#endif
}

/*
 * The device's instance lock.  Linux 6.14 added netdev_lock(dev) (dev->lock);
 * on 7.2 it, not rtnl, protects dev->napi_list, dev->threaded and the NAPI
 * fields from napi->thread on, and sysfs "threaded" and netlink "napi-set"
 * change threaded NAPI under it alone.  kbp takes it inside rtnl and kbp_lock
 * (the kernel's order: after rtnl) around its walks of dev->napi_list and its
 * writes of napi->thread, the THREADED bits and napi->config->threaded.
 * Before 6.14 rtnl covered all of that: nothing to take.
 */
#ifdef KBP_HAVE_NETDEV_LOCK
static inline void kbp_netdev_lock(struct net_device *dev)
{
	netdev_lock(dev);
}

static inline void kbp_netdev_unlock(struct net_device *dev)
{
	netdev_unlock(dev);
}

static inline void kbp_netdev_assert_locked(struct net_device *dev)
{
	lockdep_assert_held(&dev->lock);
}
#else
static inline void kbp_netdev_lock(struct net_device *dev)
{
}

static inline void kbp_netdev_unlock(struct net_device *dev)
{
}

static inline void kbp_netdev_assert_locked(struct net_device *dev)
{
}
#endif

/*
 * dev->threaded, read under rtnl: on 7.2 it is written under the instance
 * lock alone (sysfs), so read it once; 6.1 has it as a bit-field.
 */
static inline unsigned int kbp_dev_threaded(const struct net_device *dev)
{
#ifdef KBP_HAVE_NETDEV_LOCK
	return READ_ONCE(dev->threaded);
#else
	return dev->threaded;
#endif
}

/*
 * Drivers with instance-lock ops (queue API, shapers, request_ops_lock: 6.15+)
 * add, enable, disable and delete NAPIs under the instance lock, possibly
 * without rtnl, and their NETDEV_UP and GOING_DOWN notifiers run with that
 * lock held: kbp follows their state from the reconcile work instead
 * (docs/design.md, sections 7 and 8).
 */
#ifdef KBP_HAVE_NETDEV_OPS_LOCK
#include <net/netdev_lock.h>

static inline bool kbp_dev_needs_ops_lock(const struct net_device *dev)
{
	return netdev_need_ops_lock(dev);
}
#else
static inline bool kbp_dev_needs_ops_lock(const struct net_device *dev)
{
	return false;
}
#endif

/*
 * Threaded busy polling (7.x): NAPI_STATE_THREADED_BUSY_POLL asks the NAPI's
 * kthread to busy poll.  kbp's poller ignores it; a detach clears it with
 * THREADED, and the bit set on an attached NAPI means someone asked for the
 * kernel's threaded busy polling there (netlink "napi-set threaded busy-poll").
 */
static inline void kbp_napi_clear_threaded(struct napi_struct *n)
{
#ifdef KBP_HAVE_NAPI_THREADED_BUSY_POLL
	clear_bit(NAPI_STATE_THREADED_BUSY_POLL, &n->state);
#endif
	clear_bit(NAPI_STATE_THREADED, &n->state);
}

static inline bool kbp_napi_busy_poll_asked(const struct napi_struct *n)
{
#ifdef KBP_HAVE_NAPI_THREADED_BUSY_POLL
	return test_bit(NAPI_STATE_THREADED_BUSY_POLL, &n->state);
#else
	return false;
#endif
}

/*
 * The persistent per-NAPI threaded mode (7.x): a NAPI added with
 * netif_napi_add_config() (virtio-net's rx NAPIs) has napi->config, whose
 * threaded field napi_enable() applies with napi_set_threaded() before it
 * enables the NAPI.  Set to disabled while napi->thread is kbp's poller, that
 * calls napi_stop_kthread(), which waits forever for a disabled NAPI to become
 * idle: so while kbp holds a NAPI its config says enabled, and the detach puts
 * back what it said before (unless someone changed it meanwhile).
 * napi_set_threaded() itself and sysfs "threaded" turned off stop
 * napi->thread: kbp_napi_threaded_dropped() says a NAPI the poller owns
 * has to go to the softirq for that.  Before, config->threaded did not exist
 * and turning threaded NAPI off only cleared THREADED: nothing to do.
 * Instance lock held (kbp_netdev_lock()) for the claim and the release.
 */
#ifdef KBP_HAVE_NAPI_CONFIG_THREADED
struct kbp_napi_cfg {
	struct napi_config *config;	/* in dev->napi_config[]: lives with the device */
	u8 saved;			/* config->threaded before kbp's claim */
};

static inline void kbp_napi_cfg_claim(struct kbp_napi_cfg *c,
				      struct napi_struct *n)
{
	if (!n->config)
		return;
	if (c->config != n->config) {
		c->config = n->config;
		c->saved = READ_ONCE(n->config->threaded);
	}
	WRITE_ONCE(n->config->threaded, NETDEV_NAPI_THREADED_ENABLED);
}

static inline void kbp_napi_cfg_release(struct kbp_napi_cfg *c)
{
	if (c->config &&
	    READ_ONCE(c->config->threaded) == NETDEV_NAPI_THREADED_ENABLED)
		WRITE_ONCE(c->config->threaded, c->saved);
	c->config = NULL;
}

/* Someone asked for the kernel's threaded busy polling in the config. */
static inline bool kbp_napi_cfg_busy_poll(const struct kbp_napi_cfg *c)
{
	return c->config && READ_ONCE(c->config->threaded) ==
			    NETDEV_NAPI_THREADED_BUSY_POLL;
}

/* What napi_enable() will apply: the config's mode (0 without a config). */
static inline unsigned int kbp_napi_cfg_threaded(const struct napi_struct *n)
{
	return n->config ? READ_ONCE(n->config->threaded) : 0;
}

static inline bool kbp_napi_threaded_dropped(const struct napi_struct *n)
{
	return !test_bit(NAPI_STATE_THREADED, &n->state);
}
#else
struct kbp_napi_cfg {
};

static inline void kbp_napi_cfg_claim(struct kbp_napi_cfg *c,
				      struct napi_struct *n)
{
}

static inline void kbp_napi_cfg_release(struct kbp_napi_cfg *c)
{
}

static inline bool kbp_napi_cfg_busy_poll(const struct kbp_napi_cfg *c)
{
	return false;
}

static inline unsigned int kbp_napi_cfg_threaded(const struct napi_struct *n)
{
	return 0;
}

static inline bool kbp_napi_threaded_dropped(const struct napi_struct *n)
{
	return false;
}
#endif

/*
 * The workqueue of the reconcile work, which needs no particular CPU.  7.x
 * deprecates system_wq (a warning in dmesg at the first use) in favour of
 * system_percpu_wq and the unbound system_dfl_wq.
 */
static inline struct workqueue_struct *kbp_wq(void)
{
#ifdef KBP_HAVE_SYSTEM_DFL_WQ
	return system_dfl_wq;
#else
	return system_wq;
#endif
}

/*
 * Since 6.4 a running task can switch itself to a pending livepatch
 * (__klp_sched_try_switch(), which cond_resched() calls during a transition);
 * KBP_HAVE_KLP_COND_RESCHED says the kernel has it.  Later kernels (7.2
 * does) moved the switch into __schedule(): a task switches when it enters a sleep
 * whose state has TASK_FREEZABLE (klp_sched_try_switch(prev)), and
 * __klp_sched_try_switch() is no longer exported; KBP_HAVE_KLP_SCHED_SWITCH
 * says so.
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
 * has formatted extack messages (6.2+) and it fits their NETLINK_MAX_FMTMSG_LEN
 * (80) bytes, else @summary (a static string of any length: kbpctl says
 * the rest, and the log line has the whole text).  Never a message cut off
 * in the middle.
 */
static inline void kbp_tell_msg(struct netlink_ext_ack *extack,
				const char *summary, const char *msg)
{
	if (!extack)
		return;
#ifdef NL_SET_ERR_MSG_FMT_MOD
	/* what NL_SET_ERR_MSG_FMT_MOD() does */
	if (snprintf(extack->_msg_buf, NETLINK_MAX_FMTMSG_LEN, "kbp: %s",
		     msg) < NETLINK_MAX_FMTMSG_LEN) {
		extack->_msg = extack->_msg_buf;
		return;
	}
#endif
	extack->_msg = summary;
}

static inline __printf(4, 0)
void kbp_vtell(struct netlink_ext_ack *extack, bool log, const char *summary,
	       const char *fmt, va_list args)
{
	char msg[128];

	vsnprintf(msg, sizeof(msg), fmt, args);
	if (log)	/* the reconcile work may meet the same refusal every period */
		pr_info_ratelimited("kbp: refused: %s\n", msg);
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
