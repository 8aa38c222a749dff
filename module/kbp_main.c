// SPDX-License-Identifier: GPL-2.0
/*
 * kbp: kernel busy poll.
 *
 * Attach network devices to per-CPU poller kthreads that poll their NAPI
 * instances instead of NET_RX_SOFTIRQ (KBP), optionally sleeping while idle
 * and being woken from the hardIRQ path (EE-KBP).  No kernel patch: kbp uses
 * the threaded-NAPI wake path every kernel since 5.12 has.  See
 * docs/design.md.
 *
 * This file: the registries, attach/detach, the netdevice notifier and the
 * reconcile work.  Locking rules are in kbp_priv.h.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpuhotplug.h>
#include <linux/delay.h>
#include <linux/cpumask.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "kbp_priv.h"
#include "kbp_compat.h"

/*
 * kbp_spec.h (generated from netlink/kbp.yaml) spells out as numbers the
 * limits that are the kernel's, for kbpctl; they must stay the kernel's.
 * (That the defaults lie in their ranges: tests/kbpctl/test_spec.py.)
 */
static_assert(KBP_QUOTA_MAX == NAPI_POLL_WEIGHT);
static_assert(KBP_RT_PRIO_MAX + 1 == MAX_RT_PRIO);
static_assert(KBP_NICE_MIN == MIN_NICE && KBP_NICE_MAX == MAX_NICE);

static char *default_mode = "hybrid";
module_param(default_mode, charp, 0444);
MODULE_PARM_DESC(default_mode, "mode of a poller created without one: busy, hybrid or periodic (default hybrid)");

static unsigned int reconcile_ms = 200;
module_param(reconcile_ms, uint, 0644);
MODULE_PARM_DESC(reconcile_ms, "period of the check that re-hooks NAPIs a driver disabled/enabled or re-added (default 200 ms)");

/* the registries below; see kbp_priv.h for the lock order */
DEFINE_MUTEX(kbp_lock);
LIST_HEAD(kbp_devs);
struct list_head *kbp_slots;		/* [kbp_nr_slots()]: kbp_slot() */
struct kbp_conf *kbp_conf;		/* [kbp_nr_slots()]: kbp_slot() */
/* written under kbp_lock; read without it by kbp_reconcile_soon() */
static bool kbp_exiting;
static u32 kbp_default_mode;

static void kbp_reconcile_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(kbp_reconcile_work, kbp_reconcile_fn);

/* --- validation ------------------------------------------------------- */

int kbp_check_cpu(int cpu, struct netlink_ext_ack *extack)
{
	if (cpu < 0 || cpu >= nr_cpu_ids) {
		kbp_refuse(extack, "CPU out of range",
			   "CPU %d out of range (0-%u)", cpu, nr_cpu_ids - 1);
		return -ERANGE;
	}
	if (!cpu_online(cpu)) {
		kbp_refuse(extack, "CPU is offline",
			   "CPU %d is offline", cpu);
		return -ENXIO;
	}
	return 0;
}

/* One u32 knob of a request within [lo, hi], else ERANGE naming it. */
static int kbp_check_range(bool has, u32 v, u32 lo, u32 hi, const char *name,
			   struct netlink_ext_ack *extack)
{
	if (!has || (v >= lo && v <= hi))
		return 0;
	kbp_refuse(extack, "knob out of range", "%s %u out of range (%u-%u)",
		   name, v, lo, hi);
	return -ERANGE;
}

/*
 * The periodic knobs' own ranges (whatever the mode: they are stored for a
 * later switch to periodic).  Whether min_interval_us <= max_interval_us
 * holds is checked on the merged knobs, by periodic's check.
 */
static int kbp_check_periodic_knobs(const struct kbp_knobs *req,
				    struct netlink_ext_ack *extack)
{
	const struct kbp_conf *c = &req->conf;

	return kbp_check_range(req->has_interval, c->interval_us,
			       KBP_NETAP_INTERVAL_US_LO,
			       KBP_NETAP_INTERVAL_US_HI, "interval_us", extack) ?:
	       kbp_check_range(req->has_netap, c->netap, 0, 1, "netap",
			       extack) ?:
	       kbp_check_range(req->has_round_ms, c->round_ms,
			       KBP_ROUND_MS_MIN, KBP_ROUND_MS_MAX, "round_ms",
			       extack) ?:
	       kbp_check_range(req->has_min_interval, c->np.min_interval_us,
			       KBP_NETAP_INTERVAL_US_LO,
			       KBP_NETAP_INTERVAL_US_HI, "min_interval_us",
			       extack) ?:
	       kbp_check_range(req->has_max_interval, c->np.max_interval_us,
			       KBP_NETAP_INTERVAL_US_LO,
			       KBP_NETAP_INTERVAL_US_HI, "max_interval_us",
			       extack) ?:
	       kbp_check_range(req->has_min_change, c->np.min_change_pct,
			       KBP_NETAP_MIN_CHANGE_PCT_LO,
			       KBP_NETAP_MIN_CHANGE_PCT_HI, "min_change", extack) ?:
	       kbp_check_range(req->has_max_round, c->np.max_round,
			       KBP_NETAP_MAX_ROUND_LO, KBP_NETAP_MAX_ROUND_HI,
			       "max_round", extack) ?:
	       kbp_check_range(req->has_objective, c->objective,
			       KBP_OBJECTIVE_BYTES, KBP_OBJECTIVE_MAX,
			       "objective", extack);
}

int kbp_check_knobs(const struct kbp_knobs *req,
		    struct netlink_ext_ack *extack)
{
	const struct kbp_conf *c = &req->conf;

	if (req->has_mode && !kbp_mode_ops(c->mode)) {
		kbp_refuse(extack, "unknown mode",
			   "unknown mode %u (busy=%d, hybrid=%d, periodic=%d)",
			   c->mode, KBP_MODE_BUSY, KBP_MODE_HYBRID,
			   KBP_MODE_PERIODIC);
		return -EINVAL;
	}
	if (req->has_quota && (c->quota < 1 || c->quota > KBP_QUOTA_MAX)) {
		kbp_refuse(extack, "quota out of range",
			   "quota %u out of range (1-%d)", c->quota,
			   KBP_QUOTA_MAX);
		return -ERANGE;
	}
	if (req->has_linger && c->linger_us > KBP_LINGER_US_MAX) {
		kbp_refuse(extack, "linger_us out of range",
			   "linger_us %u out of range (0-%u)", c->linger_us,
			   KBP_LINGER_US_MAX);
		return -ERANGE;
	}
	if (req->has_rt_prio && c->rt_prio > KBP_RT_PRIO_MAX) {
		kbp_refuse(extack, "rt_prio out of range",
			   "rt_prio %u out of range (0-%d)", c->rt_prio,
			   KBP_RT_PRIO_MAX);
		return -ERANGE;
	}
	if (req->has_nice && (c->nice < KBP_NICE_MIN || c->nice > KBP_NICE_MAX)) {
		kbp_refuse(extack, "nice out of range",
			   "nice %d out of range (%d-%d)", c->nice, KBP_NICE_MIN,
			   KBP_NICE_MAX);
		return -ERANGE;
	}
	if (req->has_freq_ctl && c->freq_ctl > 1) {
		kbp_refuse(extack, "freq_ctl out of range",
			   "freq_ctl %u out of range (0 or 1)", c->freq_ctl);
		return -ERANGE;
	}
	return kbp_check_periodic_knobs(req, extack);
}

/*
 * The merged knobs @c can run on @cpu's poller of class @cls: the class's
 * checks, its mode's, then freq_ctl's.  @cpu -1: a CPU not known yet (a
 * device that is down): all but freq_ctl's, which needs the CPU's policy.
 */
static int kbp_conf_check(int cpu, u32 cls, const struct kbp_conf *c,
			  struct netlink_ext_ack *extack)
{
	const struct kbp_class_ops *cops = kbp_class_ops(cls);
	const struct kbp_mode_ops *ops = kbp_mode_ops(c->mode);
	char where[KBP_CPU_LABEL_LEN];
	int err;

	if (cops->check) {
		err = cops->check(cpu, c, extack);
		if (err)
			return err;
	}
	if (c->nice && cls != KBP_CLASS_NON_RT) {
		kbp_refuse(extack, "nice applies to the non-rt poller only",
			   "%s: nice applies to the non-rt poller only",
			   kbp_cpu_label(cpu, where));
		return -EINVAL;
	}
	if (ops && ops->check) {
		err = ops->check(cpu, c, extack);
		if (err)
			return err;
	}
	return cpu < 0 ? 0 : kbp_freq_check(cpu, c, extack);
}

/* The configuration @req asks for on top of @base. */
static void kbp_conf_merge_over(const struct kbp_conf *base,
				const struct kbp_knobs *req,
				struct kbp_conf *out)
{
	*out = *base;
	if (req->has_mode)
		out->mode = req->conf.mode;
	if (req->has_linger)
		out->linger_us = req->conf.linger_us;
	if (req->has_quota)
		out->quota = req->conf.quota;
	if (req->has_rt_prio)
		out->rt_prio = req->conf.rt_prio;
	if (req->has_nice)
		out->nice = req->conf.nice;
	if (req->has_freq_ctl)
		out->freq_ctl = req->conf.freq_ctl;
	else if (req->has_mode && kbp_mode_ops(req->conf.mode) &&
		 kbp_mode_ops(req->conf.mode)->no_freq_ctl)
		out->freq_ctl = 0;	/* asking for busy turns it off */
	if (req->has_interval)
		out->interval_us = req->conf.interval_us;
	if (req->has_netap)
		out->netap = req->conf.netap;
	if (req->has_round_ms)
		out->round_ms = req->conf.round_ms;
	if (req->has_min_interval)
		out->np.min_interval_us = req->conf.np.min_interval_us;
	if (req->has_max_interval)
		out->np.max_interval_us = req->conf.np.max_interval_us;
	if (req->has_min_change)
		out->np.min_change_pct = req->conf.np.min_change_pct;
	if (req->has_max_round)
		out->np.max_round = req->conf.np.max_round;
	if (req->has_objective)
		out->objective = req->conf.objective;
}

/* The configuration @req asks for in @slot, on top of what is there. */
static void kbp_conf_merge(unsigned int slot, const struct kbp_knobs *req,
			   struct kbp_conf *out)
{
	kbp_conf_merge_over(&kbp_conf[slot], req, out);
}

/*
 * Set up @c as the knobs of a CPU's poller of class @cls before any request:
 * a non-rt poller is hybrid with a small quota (docs/design.md, "Classes").
 */
static void kbp_conf_init(struct kbp_conf *c, u32 cls, u32 mode)
{
	memset(c, 0, sizeof(*c));
	c->mode = cls == KBP_CLASS_NON_RT ? KBP_MODE_HYBRID : mode;
	c->quota = cls == KBP_CLASS_NON_RT ? KBP_NONRT_QUOTA_DEF : KBP_QUOTA_MAX;
	c->interval_us = KBP_INTERVAL_US_DEF;
	c->round_ms = KBP_ROUND_MS_DEF;
	kbp_netap_default_params(&c->np);
}

static bool kbp_conf_equal(const struct kbp_conf *a, const struct kbp_conf *b)
{
	return a->mode == b->mode && a->linger_us == b->linger_us &&
	       a->quota == b->quota && a->rt_prio == b->rt_prio &&
	       a->nice == b->nice &&
	       a->freq_ctl == b->freq_ctl && a->interval_us == b->interval_us &&
	       a->netap == b->netap && a->round_ms == b->round_ms &&
	       a->objective == b->objective &&
	       !memcmp(&a->np, &b->np, sizeof(a->np));
}

/* --- pollers ---------------------------------------------------------- */

/*
 * Pollers are per CPU, class and device (kbp_priv.h); the pollers of a
 * slot (a CPU and class) all run that slot's knobs, kbp_conf[slot]: every
 * write of it is followed by kbp_slot_apply().  kbp_lock held throughout.
 */
#define kbp_for_each_poller(p, slot) \
	list_for_each_entry(p, &kbp_slots[slot], slot_node)

/* A poller that is not being stopped. */
static bool kbp_poller_live(const struct kbp_poller *p)
{
	return !test_bit(KBP_POLLER_STOPPING, &p->flags);
}

/* Some poller of @slot serves NAPIs. */
static bool kbp_slot_serving(unsigned int slot)
{
	struct kbp_poller *p;

	kbp_for_each_poller(p, slot)
		if (!list_empty(&p->napis))
			return true;
	return false;
}

/* Some live poller runs in @slot. */
static bool kbp_slot_live(unsigned int slot)
{
	struct kbp_poller *p;

	kbp_for_each_poller(p, slot)
		if (kbp_poller_live(p))
			return true;
	return false;
}

/* The CPU's freq_ctl follows its rt pollers (kbp_freq.c). */
static void kbp_slot_freq_ctl(unsigned int slot)
{
	if (kbp_slot_class(slot) == KBP_CLASS_RT)
		kbp_freq_set_ctl(kbp_slot_cpu(slot), kbp_slot_live(slot) &&
				 kbp_conf[slot].freq_ctl);
}

/* Give @slot's live pollers the slot's knobs. */
static void kbp_slot_apply(unsigned int slot)
{
	struct kbp_poller *p;

	kbp_for_each_poller(p, slot)
		if (kbp_poller_live(p))
			kbp_poller_apply(p, &kbp_conf[slot]);
	kbp_slot_freq_ctl(slot);
}

/* @kd names @cpu: its default CPU or a CPU of its queue map. */
static bool kbp_dev_names_cpu(const struct kbp_dev *kd, int cpu)
{
	unsigned int i;

	if (kd->cpu == cpu)
		return true;
	for (i = 0; i < kd->nr_map; i++)
		if (kd->map[i].cpu == cpu)
			return true;
	return false;
}

/*
 * The poller of @cpu for the NAPIs of @kd: started with the CPU's knobs if
 * it does not run yet.  The knobs of a CPU none of whose pollers serves
 * NAPIs become @kd's first; a CPU serving NAPIs keeps its own
 * (kbp_check_conflict() refused a conflict already).
 */
static struct kbp_poller *kbp_poller_get(int cpu, struct kbp_dev *kd)
{
	unsigned int slot = kbp_slot(cpu, kd->cls);
	struct kbp_poller *p;

	lockdep_assert_held(&kbp_lock);
	if (!kbp_slot_serving(slot)) {
		kbp_conf_merge(slot, &kd->knobs, &kbp_conf[slot]);
		kbp_slot_apply(slot);
	}
	kbp_for_each_poller(p, slot)
		if (p->kd == kd && kbp_poller_live(p) &&
		    !test_bit(KBP_POLLER_FAILED, &p->flags))
			return p;
	p = kbp_poller_create(cpu, kd->cls, kd, &kbp_conf[slot]);
	if (IS_ERR(p))
		return p;
	list_add_tail_rcu(&p->slot_node, &kbp_slots[slot]);
	kbp_slot_freq_ctl(slot);
	pr_info("%s started (pid %d, mode %s)\n", p->name, p->pid,
		p->ops->name);
	return p;
}

/*
 * Is @slot's CPU named by an attachment of its class other than @self (its
 * default CPU or its queue map)?
 */
static bool kbp_slot_named_by_other(unsigned int slot,
				    const struct kbp_dev *self)
{
	int cpu = kbp_slot_cpu(slot);
	struct kbp_dev *kd;

	list_for_each_entry(kd, &kbp_devs, node)
		if (kd != self && kd->cls == kbp_slot_class(slot) &&
		    kbp_dev_names_cpu(kd, cpu))
			return true;
	return false;
}

static bool kbp_slot_named(unsigned int slot)
{
	return kbp_slot_named_by_other(slot, NULL);
}

/* Out of the registry, after a grace period (its siblings read it). */
static void kbp_poller_free(struct kbp_poller *p)
{
	list_del_rcu(&p->slot_node);
	kbp_freq_poller_del(p->cpu);
	kfree_rcu(p, rcu);
}

/*
 * Free the stopped pollers whose thread has left kbp's code, then the
 * records of finished threads.  kbp_lock held.
 */
static void kbp_pollers_reap(void)
{
	unsigned int slot;

	lockdep_assert_held(&kbp_lock);
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p, *tmp;

		list_for_each_entry_safe(p, tmp, &kbp_slots[slot], slot_node)
			if (!kbp_poller_live(p) && kbp_poller_exited(p))
				kbp_poller_free(p);
	}
	kbp_threads_reap(false);
}

/*
 * Stop the pollers nothing needs any more: idle (no NAPIs, no respawn
 * running) and their device gone, or not naming their CPU, or the CPU
 * inactive.  Stopping does not wait (kbp_poller_stop_idle()): a stopped poller
 * stays listed until its thread has exited and the reaper frees it.  A
 * poller whose respawn failed has no thread: freed at once.  rtnl and
 * kbp_lock held.
 */
static void kbp_pollers_gc(void)
{
	unsigned int slot;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p, *tmp;
		bool gone = false;

		list_for_each_entry_safe(p, tmp, &kbp_slots[slot], slot_node) {
			int cpu = p->cpu;

			if (!kbp_poller_live(p) || !kbp_poller_idle(p))
				continue;
			if (test_bit(KBP_POLLER_FAILED, &p->flags)) {
				kbp_poller_free(p);
				gone = true;
				continue;
			}
			if (!kbp_exiting && p->kd && cpu_active(cpu) &&
			    kbp_dev_names_cpu(p->kd, cpu))
				continue;
			/* idle again under its lock: a respawn may have begun */
			if (!kbp_poller_stop_idle(p))
				continue;
			pr_info("%s stopped\n", p->name);
			gone = true;
		}
		if (!gone)
			continue;
		kbp_slot_freq_ctl(slot);
		/*
		 * Nothing runs on or names the CPU any more: its knobs go back
		 * to the defaults, so the next attach gets what it asks for and
		 * not what an earlier request left (a CPU merely offline keeps
		 * them for its devices' return).
		 */
		if (!kbp_slot_live(slot) && !kbp_slot_named(slot))
			kbp_conf_init(&kbp_conf[slot], kbp_slot_class(slot),
				      kbp_default_mode);
	}
	kbp_pollers_reap();
}

/*
 * The running poller (or the stored knobs) on @cpu conflict with @req of
 * @self?  A CPU's knobs are changed by poller-set, or by the attachment that
 * starts its poller; a later one (up again, hooked by the reconcile work, or
 * from another netns) that asks for others is refused, even while the
 * poller is idle: it would rewrite the knobs of a CPU another attachment
 * names (a container's attach, those of the host's CPU).  A poller that has
 * not run for seconds (KBP_POLLER_STUCK, starved) takes no new NAPI.
 */
static int kbp_check_conflict(int cpu, u32 cls, const struct kbp_knobs *req,
			      const struct kbp_dev *self,
			      struct netlink_ext_ack *extack)
{
	unsigned int slot = kbp_slot(cpu, cls);
	const char *prefix = kbp_class_ops(cls)->prefix;
	const struct kbp_conf *have = &kbp_conf[slot];
	struct kbp_conf want;
	struct kbp_poller *p;

	kbp_for_each_poller(p, slot) {
		if (kbp_poller_live(p) && test_bit(KBP_POLLER_STUCK, &p->flags)) {
			kbp_refuse(extack, "poller is starved",
				   "%s has not run for seconds (a higher-priority task hogs CPU %d): try again once it runs",
				   p->name, cpu);
			return -EBUSY;
		}
	}
	kbp_conf_merge(slot, req, &want);
	if (kbp_conf_equal(&want, have))
		return 0;
	if (!kbp_slot_serving(slot)) {
		if (!kbp_slot_named_by_other(slot, self))
			return 0;
		kbp_refuse(extack, "CPU's knobs belong to another attached device",
			   "CPU %d's %s poller knobs belong to another attached device (mode=%s linger_us=%u rt_prio=%u nice=%d): ask for the same, or change them with poller-set",
			   cpu, kbp_class_ops(cls)->name,
			   kbp_mode_ops(have->mode)->name, have->linger_us,
			   have->rt_prio, have->nice);
		return -EBUSY;
	}
	kbp_refuse(extack, "poller serves other devices with other knobs",
		   "%s/%d serves other devices with mode=%s linger_us=%u quota=%u rt_prio=%u nice=%d freq_ctl=%u interval_us=%u netap=%u objective=%u; change them with poller-set",
		   prefix, cpu, kbp_mode_ops(have->mode)->name, have->linger_us,
		   have->quota, have->rt_prio, have->nice, have->freq_ctl,
		   have->interval_us, have->netap, have->objective);
	return -EBUSY;
}

/*
 * POLLER_SET: store knobs for @cpu's poller of class @cls and apply them to
 * it if it runs.
 */
int kbp_poller_configure(int cpu, u32 cls, const struct kbp_knobs *req,
			 struct netlink_ext_ack *extack)
{
	unsigned int slot;
	struct kbp_conf want;
	int err;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	if (cpu < 0 || cpu >= nr_cpu_ids)
		return kbp_check_cpu(cpu, extack);
	err = kbp_check_knobs(req, extack);
	if (err)
		return err;
	slot = kbp_slot(cpu, cls);
	kbp_conf_merge(slot, req, &want);
	err = kbp_conf_check(cpu, cls, &want, extack);
	if (err)
		return err;
	kbp_conf[slot] = want;
	kbp_slot_apply(slot);
	return 0;
}

/*
 * What the knobs @c take from a CPU's other tasks as they run, or NULL: the
 * knobs an attach asks for only with CAP_SYS_NICE (kbp_genl.c,
 * kbp_takes_cpu()).
 */
static const char *kbp_conf_takes_cpu(const struct kbp_conf *c)
{
	const struct kbp_mode_ops *ops = kbp_mode_ops(c->mode);
	u32 interval = c->netap ? c->np.min_interval_us : c->interval_us;

	if (ops && !ops->sleeps)
		return "mode busy";
	if (c->rt_prio)
		return "SCHED_FIFO";
	if (c->nice < 0)
		return "a nice below 0";
	if (c->mode == KBP_MODE_HYBRID && c->linger_us > KBP_LINGER_US_FREE)
		return "linger_us above the limit";
	if (c->mode == KBP_MODE_PERIODIC &&
	    interval < KBP_NETAP_MIN_INTERVAL_US)
		return "an interval below the limit";
	return NULL;
}

/*
 * @kd's merged knobs @c on @cpu (-1: not known yet), as far as the
 * attach's caller goes: a caller without CAP_SYS_NICE does not join a
 * poller whose knobs take a CPU (a host's SCHED_FIFO poller: the
 * container's traffic would run there at the host's priority).
 */
static int kbp_check_caller_knobs(int cpu, const struct kbp_conf *c,
				  const struct kbp_dev *kd,
				  struct netlink_ext_ack *extack)
{
	const char *what = kbp_conf_takes_cpu(c);
	char where[KBP_CPU_LABEL_LEN];

	if (!what || kd->may_take_cpu)
		return 0;
	kbp_refuse(extack, "its poller's knobs take a CPU: needs CAP_SYS_NICE",
		   "%s: its %s poller would run %s: needs CAP_SYS_NICE",
		   kbp_cpu_label(cpu, where), kbp_class_ops(kd->cls)->name,
		   what);
	return -EPERM;
}

/*
 * @kd may be served on @cpu with the knobs @req asks for, merged over the
 * CPU's: the CPU is online and one the attach's caller may run on (its
 * cpuset), the merged knobs suit the class, the mode and freq_ctl and the
 * caller (kbp_check_caller_knobs()), and no other attachment's knobs
 * conflict.  At attach, and again whenever a NAPI is hooked later (the
 * device comes up, a new NAPI, a CPU back online), when the CPU may come
 * from the NAPI's IRQ and the CPU's knobs may have changed.  rtnl and
 * kbp_lock held.
 */
static int kbp_check_cpu_for(int cpu, const struct kbp_knobs *req,
			     const struct kbp_dev *kd,
			     struct netlink_ext_ack *extack)
{
	struct kbp_conf want;
	int err;

	err = kbp_check_cpu(cpu, extack);
	if (err)
		return err;
	if (kd->cpus && !cpumask_test_cpu(cpu, kd->cpus)) {
		kbp_refuse(extack, "CPU is outside the caller's cpuset",
			   "CPU %d is not one the caller may run on (its cpuset)",
			   cpu);
		return -EPERM;
	}
	kbp_conf_merge(kbp_slot(cpu, kd->cls), req, &want);
	return kbp_conf_check(cpu, kd->cls, &want, extack) ?:
	       kbp_check_caller_knobs(cpu, &want, kd, extack) ?:
	       kbp_check_conflict(cpu, kd->cls, req, kd, extack);
}

/* --- NAPI <-> poller -------------------------------------------------- */

/*
 * dev->napi_list.  kbp walks it with rtnl and (6.14+) the device's instance
 * lock held, under which every driver adds and deletes NAPIs on 6.14+ and
 * most do before.  But before 6.14 some delete them without rtnl, from a
 * reset work of their own (ice: ice_reset_subtask() -> ice_rebuild() ->
 * ice_vsi_rebuild(), then kfree() of the queue vector), so the list is
 * walked as what it is, an RCU list (netif_napi_add() and __netif_napi_del()
 * use list_add_rcu() and list_del_rcu(), and netif_napi_del() waits for a
 * grace period before the driver may free the NAPI): a napi_struct found on
 * it is valid only inside the rcu_read_lock() section that found it.
 */
static unsigned int kbp_napi_count_rcu(struct net_device *dev)
{
	struct napi_struct *n;
	unsigned int nr = 0;

	list_for_each_entry_rcu(n, &dev->napi_list, dev_list)
		nr++;
	return nr;
}

static unsigned int kbp_napi_count(struct net_device *dev)
{
	unsigned int nr;

	rcu_read_lock();
	nr = kbp_napi_count_rcu(dev);
	rcu_read_unlock();
	return nr;
}

/*
 * dev->napi_list is newest first (netif_napi_add() uses list_add_rcu());
 * index 0 is the NAPI the driver added first.  rcu_read_lock() held.
 */
static struct napi_struct *kbp_napi_by_index(struct net_device *dev,
					     unsigned int index)
{
	unsigned int nr = kbp_napi_count_rcu(dev), pos = 0;
	struct napi_struct *n;

	list_for_each_entry_rcu(n, &dev->napi_list, dev_list) {
		if (nr - 1 - pos == index)
			return n;
		pos++;
	}
	return NULL;
}

/*
 * kbp serves the NAPIs a socket may busy-poll.  NAPI_STATE_NO_BUSY_POLL marks
 * the ones that must run where they are scheduled: gro_cells' per-CPU NAPIs
 * (vxlan, geneve, gre, ipip, ip6tnl), fed from their own CPU by an unlocked
 * __skb_queue_tail(), and TX-only NAPIs (netif_napi_add_tx()).  Those stay
 * with the kernel.
 */
static bool kbp_napi_servable(const struct napi_struct *n)
{
	return !test_bit(NAPI_STATE_NO_BUSY_POLL, &n->state);
}

static int kbp_refuse_unservable(struct net_device *dev,
				 struct netlink_ext_ack *extack)
{
	kbp_refuse(extack, "device has only per-CPU or TX-only NAPIs",
		   "%s: its NAPIs are per-CPU or TX-only (NO_BUSY_POLL, as gro_cells' of tunnels): polled from another CPU they corrupt their queues",
		   dev->name);
	return -EOPNOTSUPP;
}

/* @t is the thread of one of kbp's pollers.  kbp_lock held. */
static bool kbp_napi_ours(struct task_struct *t)
{
	struct kbp_poller *p;
	unsigned int slot;

	for (slot = 0; slot < kbp_nr_slots(); slot++)
		kbp_for_each_poller(p, slot)
			if (READ_ONCE(p->task) == t)
				return true;
	return false;
}

/* The NAPIs of @kd that kbp serves now (its live links). */
static unsigned int kbp_dev_served(struct kbp_dev *kd)
{
	struct kbp_napi *kn;
	unsigned int nr = 0;

	list_for_each_entry(kn, &kd->napis, dev_node)
		nr += !test_bit(KBP_NAPI_DEAD, &kn->flags);
	return nr;
}

static bool kbp_napi_owned(struct kbp_dev *kd, struct napi_struct *n)
{
	struct kbp_napi *kn;

	list_for_each_entry(kn, &kd->napis, dev_node)
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags) && kn->napi == n)
			return true;
	return false;
}

/*
 * @n's place among @dev's servable NAPIs in the order the driver added them
 * (dev->napi_list is newest first: count the servable ones after it).
 * rcu_read_lock() held.
 */
static unsigned int kbp_napi_rx_pos(struct net_device *dev,
				    struct napi_struct *n)
{
	unsigned int pos = 0;
	struct napi_struct *m;
	bool after = false;

	list_for_each_entry_rcu(m, &dev->napi_list, dev_list) {
		if (m == n)
			after = true;
		else if (after && kbp_napi_servable(m))
			pos++;
	}
	return pos;
}

/*
 * A NAPI's index, what queue maps, replies and kbpctl call "NAPI #i": the RX
 * queue it serves, where the driver says so (netif_queue_set_napi(), 6.10+:
 * ice, mlx5, bnxt...), under rtnl or (7.x) the instance lock, both held
 * here.  That survives what list positions do not: a driver that adds its
 * NAPIs in another order than its queues, a channel change that deletes and
 * adds them again, and 6.18+ keeping dev->napi_list sorted by NAPI id.
 * Else (6.1, and the many drivers that do not say: Debian 12's virtio-net
 * among them) its place among the device's servable NAPIs in the order the
 * driver added them: TX-only NAPIs (NO_BUSY_POLL) are not counted, so
 * virtio-net's rx0, tx0, rx1, tx1 are #0 and #1, its RX queues, as
 * netdev netlink lists them (TX-only NAPIs have no NAPI id there) and as
 * kbpctl numbers them for its queue maps.  rcu_read_lock() held.
 */
static unsigned int kbp_napi_index(struct net_device *dev,
				   struct napi_struct *n)
{
#ifdef KBP_HAVE_RXQ_NAPI
	unsigned int i;

	for (i = 0; i < dev->real_num_rx_queues; i++)
		if (READ_ONCE(__netif_get_rx_queue(dev, i)->napi) == n)
			return i;
#endif
	return kbp_napi_rx_pos(dev, n);
}

/* How many of @dev's NAPIs kbp may serve.  rcu_read_lock() held. */
static unsigned int kbp_napi_count_servable(struct net_device *dev)
{
	struct napi_struct *n;
	unsigned int nr = 0;

	list_for_each_entry_rcu(n, &dev->napi_list, dev_list)
		nr += kbp_napi_servable(n);
	return nr;
}

/*
 * The CPU that serves @n: queue map (by kbp_napi_index()), default, IRQ.
 * rcu_read_lock() held.
 */
static int kbp_napi_cpu(struct kbp_dev *kd, struct napi_struct *n,
			struct netlink_ext_ack *extack)
{
	unsigned int i, index = kbp_napi_index(kd->dev, n);
	int irq;

	for (i = 0; i < kd->nr_map; i++)
		if (kd->map[i].index == index)
			return kd->map[i].cpu;
	if (kd->cpu >= 0)
		return kd->cpu;
	irq = kbp_napi_irq(n);
	if (irq > 0) {
		const struct cpumask *m = irq_get_effective_affinity_mask(irq);
		unsigned int cpu;

		if (!m || cpumask_empty(m))
			m = irq_get_affinity_mask(irq);
		cpu = m ? cpumask_first_and(m, cpu_online_mask) : nr_cpu_ids;
		if (cpu < nr_cpu_ids)
			return cpu;
	}
	kbp_refuse(extack, "no CPU given and the NAPI has no IRQ",
		   "%s: no CPU for NAPI #%u (no IRQ known): give a cpu or a queue map",
		   kd->dev->name, index);
	return -EINVAL;
}

/*
 * A kthread left on a NAPI by threaded NAPI that was turned off again: until
 * the NAPI is deleted the kernel keeps napi->thread (dev_set_threaded(false)
 * only clears NAPI_STATE_THREADED; 7.2 stops it instead).  With THREADED and
 * SCHED_THREADED clear no schedule can reach it and it owns nothing: it
 * sleeps in napi_thread_wait().  On 7.2 the NAPI's persistent config must say
 * disabled too: a disabled NAPI of per-NAPI threaded mode has THREADED clear
 * until napi_enable() sets it again.  rtnl and the instance lock held, which
 * dev_set_threaded() needs too.
 */
static bool kbp_thread_is_stale(struct net_device *dev, struct napi_struct *n)
{
	return !kbp_dev_threaded(dev) && !kbp_napi_cfg_threaded(n) &&
	       !test_bit(NAPI_STATE_THREADED, &n->state) &&
	       !test_bit(NAPI_STATE_SCHED_THREADED, &n->state);
}

/*
 * Stop the stale kthread of NAPI #@index, as __netif_napi_del() would; a
 * later dev_set_threaded(true) creates a new one.  Taken off napi->thread
 * first, inside the RCU section that found the NAPI, so a driver deleting
 * the NAPI meanwhile does not stop it too; kthread_stop() outside it.
 */
static void kbp_reap_stale_thread(struct net_device *dev, unsigned int index)
{
	struct task_struct *t = NULL;
	struct napi_struct *n;
	unsigned int id = 0;

	rcu_read_lock();
	n = kbp_napi_by_index(dev, index);
	if (n && kbp_thread_is_stale(dev, n)) {
		/*
		 * xchg() is fully ordered, as the deleter's clearing of
		 * LISTED: if LISTED is still set it will find NULL and stop
		 * nothing; if not, it may be stopping @t already, and a
		 * second kthread_stop() would wait forever.
		 */
		t = xchg(&n->thread, NULL);
		if (t && !test_bit(NAPI_STATE_LISTED, &n->state))
			t = NULL;
		if (t)
			get_task_struct(t);
		id = n->napi_id;
	}
	rcu_read_unlock();
	if (!t)
		return;
	pr_info("%s: stopping idle threaded-NAPI kthread %s (pid %d) of NAPI %u\n",
		dev->name, t->comm, t->pid, id);
	kthread_stop(t);
	put_task_struct(t);
}

/*
 * A link of @kd to the poller of @cpu (started if need be), for a NAPI that
 * kbp_napi_link() gives it.  May sleep: no RCU read-side section.
 */
static struct kbp_napi *kbp_napi_new(struct kbp_dev *kd, int cpu)
{
	struct kbp_poller *p;
	struct kbp_napi *kn;

	kn = kzalloc(sizeof(*kn), GFP_KERNEL);
	if (!kn)
		return ERR_PTR(-ENOMEM);
	p = kbp_poller_get(cpu, kd);
	if (IS_ERR(p)) {
		kfree(kn);
		return ERR_CAST(p);
	}
	kn->poller = p;
	kn->kdev = kd;
	refcount_set(&kn->ref, 1);
	u64_stats_init(&kn->syncp);
	return kn;
}

/*
 * Hook @n (found on the device's list in the caller's rcu_read_lock()
 * section) with @kn.  A NAPI a driver is deleting meanwhile leaves a DEAD
 * link (kbp_poller_add_napi()).
 */
static void kbp_napi_link(struct kbp_dev *kd, struct kbp_napi *kn,
			  struct napi_struct *n)
{
	kn->napi = n;
	kn->index = kbp_napi_index(kd->dev, n);
	kn->napi_id = n->napi_id;
	list_add_tail(&kn->dev_node, &kd->napis);
	kbp_poller_add_napi(kn->poller, kn);
}

/*
 * NAPI #@index of @kd, if it is still there and still free to hook: found,
 * servable, not ours already, no kthread on it.  rcu_read_lock() held.
 */
static struct napi_struct *kbp_napi_free_at(struct kbp_dev *kd,
					    unsigned int index)
{
	struct napi_struct *n = kbp_napi_by_index(kd->dev, index);

	if (!n || !kbp_napi_servable(n) || kbp_napi_owned(kd, n) ||
	    READ_ONCE(n->thread))
		return NULL;
	return n;
}

static void kbp_napi_free(struct kbp_dev *kd, struct kbp_napi *kn)
{
	u64 packets, polls;

	kbp_napi_read(kn, &packets, &polls);
	kd->packets_gone += packets;
	kd->polls_gone += polls;
	list_del(&kn->dev_node);
	kbp_napi_put(kn);	/* a poll in progress holds its own reference */
}

/*
 * Someone turned threaded NAPI on (sysfs "threaded") while kbp held the
 * device: dev_set_threaded() found our poller in napi->thread, created no
 * kthread and set dev->threaded.  Once we hand the NAPIs back, give the
 * operator what sysfs says: the kernel's own NAPI kthreads.  rtnl held, not
 * the instance lock: dev_set_threaded() takes it.
 */
static void kbp_dev_restore_threaded(struct net_device *dev)
{
	unsigned int mode = kbp_dev_threaded(dev);
	int err;

	if (!mode || dev->reg_state != NETREG_REGISTERED)
		return;
	kbp_dev_set_threaded(dev, 0);
	err = kbp_dev_set_threaded(dev, mode);
	pr_info("%s: threaded NAPI was turned on while attached: %s\n",
		dev->name, err ? "could not start its kthreads, softirq" :
				 "NAPIs handed to their threaded-NAPI kthreads");
}

/*
 * Hand every NAPI of @kd back to stock NAPI.  rtnl, kbp_lock and the
 * device's instance lock held: neither sysfs "threaded" nor netlink
 * "napi-set" (7.2) changes napi->thread or the THREADED bits meanwhile.
 * The caller gives the operator the threaded mode sysfs says once it has
 * dropped the instance lock (kbp_dev_restore_threaded()).
 */
static void __kbp_dev_deactivate(struct kbp_dev *kd)
{
	struct kbp_napi *kn, *tmp;
	unsigned long deadline;
	bool any = false;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	kbp_netdev_assert_locked(kd->dev);
	/* a driver may delete a NAPI meanwhile without rtnl: see kbp_napi_count() */
	rcu_read_lock();
	list_for_each_entry(kn, &kd->napis, dev_node)
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags))
			any |= kbp_poller_unhook_napi(kn);
	rcu_read_unlock();
	if (any)	/* every ____napi_schedule() that saw THREADED is done */
		synchronize_rcu();

	/* the poller completes each NAPI or hands it to the softirq */
	deadline = jiffies + KBP_RELEASE_WAIT;
	list_for_each_entry(kn, &kd->napis, dev_node)
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags) &&
		    !test_bit(KBP_NAPI_FOREIGN, &kn->flags))
			kbp_poller_wait_released(kn, deadline);

	list_for_each_entry_safe(kn, tmp, &kd->napis, dev_node) {
		rcu_read_lock();
		kbp_poller_del_napi(kn);
		rcu_read_unlock();
		kbp_napi_free(kd, kn);
	}
	kd->active = false;
	kbp_pollers_gc();
}

/* The same, taking the instance lock.  rtnl and kbp_lock held. */
static void kbp_dev_deactivate(struct kbp_dev *kd)
{
	/* after rtnl and kbp_lock; see kbp_priv.h */
	kbp_netdev_lock(kd->dev);
	__kbp_dev_deactivate(kd);
	kbp_netdev_unlock(kd->dev);
	kbp_dev_restore_threaded(kd->dev);
}

/* Every NAPI of @kd would be served by an active CPU (no log, no extack). */
static bool kbp_dev_cpus_active(struct kbp_dev *kd)
{
	struct napi_struct *n;
	unsigned int nr, i;
	bool ok = true;
	int cpu;

	rcu_read_lock();
	nr = kbp_napi_count_rcu(kd->dev);
	for (i = 0; i < nr && ok; i++) {
		n = kbp_napi_by_index(kd->dev, i);
		if (!n || !kbp_napi_servable(n))
			continue;
		cpu = kbp_napi_cpu(kd, n, NULL);
		ok = cpu >= 0 && cpu < nr_cpu_ids && cpu_active(cpu);
	}
	rcu_read_unlock();
	return ok;
}

/* A NAPI of @kd is served by a poller whose CPU is going or gone offline. */
static bool kbp_dev_on_inactive_cpu(struct kbp_dev *kd)
{
	struct kbp_napi *kn;

	list_for_each_entry(kn, &kd->napis, dev_node)
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags) &&
		    !cpu_active(kn->poller->cpu))
			return true;
	return false;
}

/*
 * Hook every NAPI of a running device.  All or nothing: on error nothing is
 * left hooked.  rtnl, kbp_lock and the device's instance lock held (the
 * NAPI list, napi->thread and the THREADED bits stay as we see them).
 */
static int kbp_dev_activate(struct kbp_dev *kd, struct netlink_ext_ack *extack)
{
	struct net_device *dev = kd->dev;
	unsigned int nr = kbp_napi_count(dev), i, served = 0;
	struct kbp_napi **kns = NULL;
	struct napi_struct *n;
	int err = 0, *cpus;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	kbp_netdev_assert_locked(dev);
	if (!nr) {
		kbp_refuse(extack, "device has no NAPI instance",
			   "%s has no NAPI instance", dev->name);
		return -EOPNOTSUPP;
	}
	rcu_read_lock();
	served = kbp_napi_count_servable(dev);
	rcu_read_unlock();
	for (i = 0; i < kd->nr_map; i++) {
		if (kd->map[i].index >= max(served, dev->real_num_rx_queues)) {
			kbp_refuse(extack, "queue map names a NAPI the device does not have",
				   "queue map names NAPI #%u but %s has %u",
				   kd->map[i].index, dev->name, served);
			return -EINVAL;
		}
	}
	served = 0;
	/*
	 * Validate everything before changing anything.  Each NAPI's CPU is
	 * computed once: an IRQ's affinity may change between two looks.  A
	 * NAPI is looked at only inside an RCU section (kbp_napi_count()).
	 */
	cpus = kmalloc_array(nr, sizeof(*cpus), GFP_KERNEL);
	kns = kcalloc(nr, sizeof(*kns), GFP_KERNEL);
	if (!cpus || !kns) {
		err = -ENOMEM;
		goto out;
	}
	rcu_read_lock();
	for (i = 0; i < nr && !err; i++) {
		cpus[i] = -1;
		n = kbp_napi_by_index(dev, i);
		if (!n || !kbp_napi_servable(n))
			continue;
		if (READ_ONCE(n->thread) && !kbp_thread_is_stale(dev, n)) {
			kbp_refuse(extack, "NAPI is served by a threaded-NAPI kthread",
				   "%s: NAPI #%u is served by its threaded-NAPI kthread",
				   dev->name, kbp_napi_index(dev, n));
			err = -EBUSY;
			break;
		}
		cpus[i] = kbp_napi_cpu(kd, n, extack);
		if (cpus[i] < 0)
			err = cpus[i];
		served++;
	}
	rcu_read_unlock();
	if (!err && !served)
		err = kbp_refuse_unservable(dev, extack);
	/*
	 * Every CPU, whether named or the IRQ's: up again, or retried, the
	 * knobs and the IRQs may have changed meanwhile.
	 */
	for (i = 0; i < nr && !err; i++)
		if (cpus[i] >= 0)
			err = kbp_check_cpu_for(cpus[i], &kd->knobs, kd, extack);
	if (err)
		goto out;
	/* the links and their pollers (may sleep), then the hooks */
	for (i = 0; i < nr; i++) {
		if (cpus[i] < 0)
			continue;
		kns[i] = kbp_napi_new(kd, cpus[i]);
		if (IS_ERR(kns[i])) {
			err = PTR_ERR(kns[i]);
			kns[i] = NULL;
			if (err == -EBUSY)
				NL_SET_ERR_MSG_MOD(extack, "new poller starved");
			else
				NL_SET_ERR_MSG_MOD(extack, "out of memory starting a poller");
			pr_warn("%s: cannot hook NAPI #%u: %d\n", dev->name, i, err);
			goto out;
		}
	}
	for (i = 0; i < nr; i++) {
		/* every NAPI's, served or not: what __netif_napi_del() would stop */
		kbp_reap_stale_thread(dev, i);
		if (!kns[i])
			continue;
		rcu_read_lock();
		n = kbp_napi_free_at(kd, i);
		if (n) {	/* else deleted meanwhile by a driver's reset */
			kbp_napi_link(kd, kns[i], n);
			kns[i] = NULL;
		}
		rcu_read_unlock();
	}
	kd->active = true;
	kd->retry = false;
out:
	if (kns)
		for (i = 0; i < nr; i++)
			kfree(kns[i]);	/* not linked: not on any list */
	if (err)
		kbp_pollers_gc();	/* the ones started for it */
	kfree(kns);
	kfree(cpus);
	return err;
}

/* --- attachments ------------------------------------------------------ */

struct kbp_dev *kbp_dev_find(const struct net_device *dev)
{
	struct kbp_dev *kd;

	lockdep_assert_held(&kbp_lock);
	list_for_each_entry(kd, &kbp_devs, node)
		if (kd->dev == dev)
			return kd;
	return NULL;
}

/*
 * Forget @kd: its pollers no longer name it (the ones still stopping are
 * freed by the reaper; kbp_pollers_gc() stops the others), and it is freed.
 * kbp_lock held.
 */
static void kbp_dev_free(struct kbp_dev *kd)
{
	struct kbp_poller *p;
	unsigned int slot;

	for (slot = 0; slot < kbp_nr_slots(); slot++)
		kbp_for_each_poller(p, slot)
			if (p->kd == kd)
				p->kd = NULL;
	list_del(&kd->node);
	netdev_put(kd->dev, &kd->tracker);
	kfree(kd->map);
	kfree(kd->cpus);
	kfree(kd);
}

static void kbp_dev_unbind(struct kbp_dev *kd)
{
	if (kd->active || !list_empty(&kd->napis))
		kbp_dev_deactivate(kd);
	pr_info("%s: detached\n", kd->dev->name);
	kbp_dev_free(kd);
	kbp_pollers_gc();
}

/*
 * Kick the reconcile work (it also reaps stopped pollers and finished
 * threads).  Not once module exit has begun: exit waits for every thread
 * (they call this on their way out) and then cancels the work for good.
 */
void kbp_reconcile_soon(void)
{
	if (!READ_ONCE(kbp_exiting))
		mod_delayed_work(kbp_wq(), &kbp_reconcile_work, 0);
}

/*
 * A stopped poller is still listed: its thread has not left kbp's code.
 * The thread kicks the reconcile work just before it exits, so that pass
 * can miss the exit; the reaper looks again next period.  kbp_lock held.
 */
static bool kbp_pollers_stopping(void)
{
	struct kbp_poller *p;
	unsigned int slot;

	lockdep_assert_held(&kbp_lock);
	for (slot = 0; slot < kbp_nr_slots(); slot++)
		list_for_each_entry(p, &kbp_slots[slot], slot_node)
			if (!kbp_poller_live(p))
				return true;
	return false;
}

static void kbp_reconcile_later(void)
{
	lockdep_assert_held(&kbp_lock);
	if (!kbp_exiting && (!list_empty(&kbp_devs) || kbp_pollers_stopping()))
		queue_delayed_work(kbp_wq(), &kbp_reconcile_work,
				   msecs_to_jiffies(max(reconcile_ms, 10U)));
}

/*
 * A device that is down: the CPUs of NAPIs that no map or default CPU
 * names come from their IRQs when it comes up, and are checked then
 * (kbp_dev_activate()).  Now, what does not depend on the CPU: the request
 * over the class's defaults suits the class, the mode and the caller.
 */
static int kbp_req_check_any_cpu(const struct kbp_knobs *req,
				 const struct kbp_dev *kd,
				 struct netlink_ext_ack *extack)
{
	struct kbp_conf base, want;

	kbp_conf_init(&base, kd->cls, kbp_default_mode);
	kbp_conf_merge_over(&base, req, &want);
	return kbp_conf_check(-1, kd->cls, &want, extack) ?:
	       kbp_check_caller_knobs(-1, &want, kd, extack);
}

/*
 * Every CPU @req would use on its device: the named ones, and for a
 * running device each servable NAPI's (queue map, default, IRQ).
 */
static int kbp_req_check_cpus(struct kbp_attach_req *req, struct kbp_dev *kd,
			      struct netlink_ext_ack *extack)
{
	unsigned int i, nr;
	int cpu, err;

	if (req->cpu >= 0) {
		err = kbp_check_cpu_for(req->cpu, &req->knobs, kd, extack);
		if (err)
			return err;
	}
	for (i = 0; i < req->nr_map; i++) {
		err = kbp_check_cpu_for(req->map[i].cpu, &req->knobs, kd,
					extack);
		if (err)
			return err;
	}
	if (!netif_running(req->dev))
		return kbp_req_check_any_cpu(&req->knobs, kd, extack);
	nr = kbp_napi_count(req->dev);
	for (i = 0; i < nr; i++) {
		struct napi_struct *n;

		rcu_read_lock();
		n = kbp_napi_by_index(req->dev, i);
		cpu = n && kbp_napi_servable(n) ?
		      kbp_napi_cpu(kd, n, extack) : INT_MAX;
		rcu_read_unlock();
		if (cpu == INT_MAX)
			continue;
		if (cpu < 0)
			return cpu;
		err = kbp_check_cpu_for(cpu, &req->knobs, kd, extack);
		if (err)
			return err;
	}
	return 0;
}

/*
 * Every entry of @req's queue map names a NAPI of the running device
 * (kbp_napi_index()): a map that would place no queue where it says is
 * refused, not reported done.  rtnl (and the instance lock) held.
 */
static int kbp_req_check_map(struct kbp_attach_req *req,
			     struct netlink_ext_ack *extack)
{
	struct net_device *dev = req->dev;
	unsigned int i, nr = 0;
	struct napi_struct *n;
	unsigned long *have;
	int err = 0;

	if (!req->nr_map || !netif_running(dev))
		return 0;
	have = bitmap_zalloc(KBP_MAP_MAX, GFP_KERNEL);
	if (!have)
		return -ENOMEM;
	rcu_read_lock();
	list_for_each_entry_rcu(n, &dev->napi_list, dev_list) {
		unsigned int index;

		if (!kbp_napi_servable(n))
			continue;
		nr++;
		index = kbp_napi_index(dev, n);
		if (index < KBP_MAP_MAX)
			set_bit(index, have);
	}
	rcu_read_unlock();
	for (i = 0; i < req->nr_map && !err; i++) {
		if (req->map[i].index < KBP_MAP_MAX &&
		    test_bit(req->map[i].index, have))
			continue;
		kbp_refuse(extack, "queue map names a NAPI the device does not have",
			   "queue map names NAPI #%u but %s has %u RX NAPIs",
			   req->map[i].index, dev->name, nr);
		err = -EINVAL;
	}
	bitmap_free(have);
	return err;
}

/*
 * Undo what a failed attach did to the knobs: the stored ones, and those
 * kbp_poller_get() already gave to idle pollers (a later attach would meet
 * them as a conflict).
 */
static void kbp_conf_restore(const struct kbp_conf *saved)
{
	unsigned int slot;

	memcpy(kbp_conf, saved, kbp_nr_slots() * sizeof(*kbp_conf));
	for (slot = 0; slot < kbp_nr_slots(); slot++)
		if (!kbp_slot_serving(slot))
			kbp_slot_apply(slot);
}

int kbp_dev_bind(struct kbp_attach_req *req, struct netlink_ext_ack *extack)
{
	struct net_device *dev = req->dev;
	struct kbp_conf *saved;
	struct kbp_dev *kd;
	unsigned int nr;
	int err;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	if (kbp_dev_find(dev)) {
		kbp_refuse(extack, "device is already attached",
			   "%s is already attached", dev->name);
		return -EEXIST;
	}
	if (kbp_dev_threaded(dev)) {
		kbp_refuse(extack, "device runs threaded NAPI",
			   "%s runs threaded NAPI: write 0 to /sys/class/net/%s/threaded first",
			   dev->name, dev->name);
		return -EBUSY;
	}
	if (netif_running(dev) && !kbp_napi_count(dev)) {
		kbp_refuse(extack, "device has no NAPI instance",
			   "%s has no NAPI instance", dev->name);
		return -EOPNOTSUPP;
	}
	err = kbp_check_knobs(&req->knobs, extack);
	if (err)
		return err;

	kd = kzalloc(sizeof(*kd), GFP_KERNEL);
	saved = kmemdup(kbp_conf, kbp_nr_slots() * sizeof(*kbp_conf),
			GFP_KERNEL);
	if (!kd || !saved) {
		err = -ENOMEM;
		goto err_free;
	}
	kd->dev = dev;
	kd->cls = req->cls;
	kd->cpu = req->cpu;
	kd->nr_map = req->nr_map;
	kd->map = req->map;
	kd->knobs = req->knobs;
	kd->may_take_cpu = req->caller.may_take_cpu;
	if (req->caller.cpus) {
		kd->cpus = kmemdup(req->caller.cpus, cpumask_size(),
				   GFP_KERNEL);
		if (!kd->cpus) {
			err = -ENOMEM;
			goto err_free;
		}
	}
	INIT_LIST_HEAD(&kd->napis);

	/* after rtnl and kbp_lock: the NAPI list and threaded state hold still */
	kbp_netdev_lock(dev);
	err = kbp_req_check_map(req, extack) ?:
	      kbp_req_check_cpus(req, kd, extack);
	if (err)
		goto err_unlock;

	netdev_hold(dev, &kd->tracker, GFP_KERNEL);
	list_add_tail(&kd->node, &kbp_devs);
	if (netif_running(dev)) {
		err = kbp_dev_activate(kd, extack);
		if (err) {
			kbp_netdev_unlock(dev);
			kd->map = NULL;		/* still the request's */
			kbp_dev_free(kd);
			kbp_conf_restore(saved);
			kbp_pollers_gc();
			kfree(saved);
			return err;
		}
	}
	nr = kbp_dev_served(kd);
	kd->up_pending = !kd->active && kbp_dev_needs_ops_lock(dev);
	kbp_netdev_unlock(dev);
	req->map = NULL;			/* now kd's */
	kfree(saved);
	pr_info("%s: attached (%s, %u NAPIs)\n", dev->name,
		kd->active ? "active" : "standby until up", nr);
	kbp_reconcile_later();
	return 0;

err_unlock:
	kbp_netdev_unlock(dev);
err_free:
	kfree(saved);
	if (kd)
		kfree(kd->cpus);
	kfree(kd);
	return err;
}

int kbp_dev_unbind_by_dev(struct net_device *dev, struct netlink_ext_ack *extack)
{
	struct kbp_dev *kd;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	kd = kbp_dev_find(dev);
	if (!kd) {
		kbp_refuse(extack, "device is not attached",
			   "%s is not attached", dev->name);
		return -ENOENT;
	}
	kbp_dev_unbind(kd);
	return 0;
}

/* --- keeping attachments true ----------------------------------------- */

/*
 * Why @kd's NAPIs must go back to stock NAPI now, or NULL; sets @retry if
 * they come back by themselves (a CPU going offline).  Frees DEAD links and
 * drops links whose NAPI was deleted unseen on the way.  rtnl, kbp_lock and
 * the instance lock held.
 */
static const char *kbp_dev_handback_reason(struct kbp_dev *kd, bool *retry)
{
	struct kbp_napi *kn, *tmp;

	*retry = false;
	if (kbp_dev_threaded(kd->dev))
		return "threaded NAPI was turned on";
	if (kbp_dev_on_inactive_cpu(kd)) {
		*retry = true;
		return "a poller's CPU is going offline";
	}
	list_for_each_entry_safe(kn, tmp, &kd->napis, dev_node) {
		bool busy_poll = false;

		/*
		 * A link not DEAD inside the section has its NAPI until the
		 * section ends: its deleter's grace period waits for us.
		 */
		rcu_read_lock();
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags) &&
		    !test_bit(NAPI_STATE_LISTED, &kn->napi->state))
			kbp_poller_drop_napi(kn);
		if (!test_bit(KBP_NAPI_DEAD, &kn->flags))
			/* netlink "napi-set threaded busy-poll" (7.2) */
			busy_poll = kbp_napi_busy_poll_asked(kn->napi) ||
				    kbp_napi_cfg_busy_poll(&kn->cfg);
		rcu_read_unlock();
		if (test_bit(KBP_NAPI_DEAD, &kn->flags)) {
			if (test_bit(KBP_NAPI_ORPHAN, &kn->flags))
				kd->orphaned++;
			kbp_napi_free(kd, kn);
			continue;
		}
		if (busy_poll)
			return "threaded busy polling was asked for one of its NAPIs";
	}
	return NULL;
}

/*
 * @kd's device came up: attach its NAPIs, or wait in standby for an offline
 * CPU it uses (the reconcile work attaches it once that is online).  rtnl,
 * kbp_lock and the instance lock held.
 */
static void kbp_dev_up(struct kbp_dev *kd)
{
	struct net_device *dev = kd->dev;
	int err;

	if (!kbp_dev_cpus_active(kd)) {
		kd->retry = true;
		pr_info("%s: up; a CPU it uses is offline: standby until it is online\n",
			dev->name);
		return;
	}
	err = kbp_dev_activate(kd, NULL);
	if (err)
		pr_warn("%s: up, but cannot attach its NAPIs (%d); stays in standby\n",
			dev->name, err);
	else
		pr_info("%s: up, %u NAPIs attached\n", dev->name,
			kbp_dev_served(kd));
}

/*
 * What the notifier does at NETDEV_UP and NETDEV_GOING_DOWN, for a device
 * whose driver needs the instance lock for its ops (7.x: queue API, shapers,
 * request_ops_lock), which sends those events with that lock held
 * (kbp_netdev_event()).  Kicked by them, the reconcile work takes the lock
 * after rtnl and kbp_lock, so it sees the device either up or down, never
 * half-way: down, its NAPIs go back to the kernel (standby); up again, they
 * are attached.  Meanwhile, between GOING_DOWN and this, the driver's
 * ndo_stop() may delete NAPIs kbp still holds: each deletion stops the
 * poller, whose respawn drops the link (§8 of docs/design.md), the same as a
 * reset without rtnl.  True if it dealt with @kd's state.  rtnl, kbp_lock
 * and the instance lock held.
 */
static bool kbp_dev_follow_ops_locked(struct kbp_dev *kd)
{
	struct net_device *dev = kd->dev;

	if (!kbp_dev_needs_ops_lock(dev))
		return false;
	if (!netif_running(dev)) {
		if (kd->active) {
			__kbp_dev_deactivate(kd);
			pr_info("%s: down, NAPIs back to the kernel until up\n",
				dev->name);
		}
		kd->up_pending = true;
		return true;
	}
	if (kd->active || !kd->up_pending)
		return false;
	kd->up_pending = false;
	kbp_dev_up(kd);
	return true;
}

/*
 * Keep an attachment true, every reconcile_ms and when kicked:
 *  - hand the device back when threaded NAPI was turned on (sections 5 and 7
 *    of docs/design.md), a poller's CPU goes offline, or (7.2) one of its
 *    NAPIs was given the kernel's threaded busy polling or a kthread of its
 *    own;
 *  - napi_disable() clears NAPI_STATE_THREADED and napi_enable() sets it
 *    back only when dev->threaded is set, which kbp leaves alone; drivers
 *    that disable and enable a NAPI on their own (virtio-net's refill work,
 *    for example) therefore drop it back to softirq until we set the bit
 *    again.  Setting it is safe at any time: napi_disable() clears it in the
 *    same cmpxchg that takes the NAPI, and a disabled NAPI cannot be
 *    scheduled;
 *  - on 7.2 turning threaded NAPI off stops napi->thread, our poller: hook
 *    such a NAPI again;
 *  - hook NAPIs the driver added since.
 * rtnl and kbp_lock held.
 */
static void kbp_dev_reconcile(struct kbp_dev *kd)
{
	struct net_device *dev = kd->dev;
	const char *why = NULL;
	struct kbp_napi *kn;
	struct napi_struct *n;
	unsigned int nr, i;
	bool retry;
	int cpu;

	/* after rtnl and kbp_lock: the NAPIs' threaded state holds still */
	kbp_netdev_lock(dev);
	if (kbp_dev_follow_ops_locked(kd))
		goto out;
	if (!kd->active) {
		if (kd->retry && netif_running(dev) &&
		    kbp_dev_cpus_active(kd) && !kbp_dev_activate(kd, NULL))
			pr_info("%s: its CPUs are online again, %u NAPIs attached\n",
				dev->name, kbp_dev_served(kd));
		goto out;
	}

	why = kbp_dev_handback_reason(kd, &retry);
	list_for_each_entry(kn, &kd->napis, dev_node) {
		enum kbp_napi_check check;

		if (why)
			break;
		rcu_read_lock();	/* as in kbp_dev_handback_reason() */
		check = kbp_poller_check_napi(kn);
		rcu_read_unlock();
		switch (check) {
		case KBP_NAPI_OK:
		case KBP_NAPI_REPAIRED:
			break;
		case KBP_NAPI_REHOOKED:
			pr_info_ratelimited("%s: NAPI #%u lost its poller (threaded NAPI turned off): hooked again\n",
					    dev->name, kn->index);
			break;
		case KBP_NAPI_LOST:
			why = "one of its NAPIs was given a threaded-NAPI kthread";
			break;
		}
	}
	if (why) {
		pr_info("%s: %s: NAPIs back to %s\n", dev->name, why,
			retry ? "softirq until it is back" : "the kernel");
		kd->retry = retry;
		__kbp_dev_deactivate(kd);
		goto out;
	}

	/*
	 * NAPIs the driver added since (re-created after a delete, new
	 * channels, or given up by a respawn: kbp_napi_orphan()); a NAPI with
	 * a kthread that is not a stale one is the kernel's own (7.2 gives a
	 * NAPI one when threaded NAPI is turned on for it).
	 */
	nr = kbp_napi_count(dev);
	for (i = 0; i < nr && !why; i++) {
		struct kbp_napi *nkn;
		unsigned int index = 0;
		bool linked = false;

		rcu_read_lock();
		n = kbp_napi_by_index(dev, i);
		if (n && kbp_napi_servable(n) && !kbp_napi_owned(kd, n) &&
		    READ_ONCE(n->thread) && !kbp_thread_is_stale(dev, n) &&
		    !kbp_napi_ours(READ_ONCE(n->thread)))
			why = "one of its NAPIs was given a threaded-NAPI kthread";
		n = n ? kbp_napi_free_at(kd, i) : NULL;
		if (n) {
			index = kbp_napi_index(dev, n);
			cpu = kbp_napi_cpu(kd, n, NULL);
		}
		rcu_read_unlock();
		if (!n)
			continue;
		/* the same checks as at attach: this CPU may be the IRQ's */
		nkn = cpu >= 0 && cpu_active(cpu) &&
		      !kbp_check_cpu_for(cpu, &kd->knobs, kd, NULL) ?
		      kbp_napi_new(kd, cpu) : NULL;
		if (!IS_ERR_OR_NULL(nkn)) {
			rcu_read_lock();
			n = kbp_napi_free_at(kd, i);
			if (n) {
				kbp_napi_link(kd, nkn, n);
				linked = true;
			}
			rcu_read_unlock();
			if (!linked)
				kfree(nkn);	/* deleted meanwhile */
		}
		if (linked && kd->orphaned) {
			/* the kernel stopped our thread on it (7.2: threaded off) */
			kd->orphaned--;
			atomic64_inc(&nkn->poller->repairs);
			pr_info_ratelimited("%s: NAPI #%u lost its poller (threaded NAPI turned off): hooked again\n",
					    dev->name, index);
		} else if (linked) {
			pr_info_ratelimited("%s: hooked new NAPI #%u to %s\n",
					    dev->name, index, nkn->poller->name);
		} else if (n)
			pr_warn_ratelimited("%s: cannot hook new NAPI #%u\n",
					    dev->name, index);
	}
	kd->orphaned = 0;	/* any not hooked again by now are gone */
	if (why) {
		pr_info("%s: %s: NAPIs back to the kernel\n", dev->name, why);
		kd->retry = false;
		__kbp_dev_deactivate(kd);
	}
out:
	kbp_netdev_unlock(dev);
	if (why)
		kbp_dev_restore_threaded(dev);
}

static void kbp_reconcile_fn(struct work_struct *work)
{
	struct kbp_dev *kd;

	rtnl_lock();
	mutex_lock(&kbp_lock);
	if (!kbp_exiting) {
		list_for_each_entry(kd, &kbp_devs, node)
			kbp_dev_reconcile(kd);
		kbp_pollers_gc();
		kbp_reconcile_later();
	}
	mutex_unlock(&kbp_lock);
	rtnl_unlock();
}

static int kbp_netdev_event(struct notifier_block *nb, unsigned long event,
			    void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);
	struct kbp_dev *kd;

	if (event != NETDEV_GOING_DOWN && event != NETDEV_UP &&
	    event != NETDEV_UNREGISTER)
		return NOTIFY_DONE;
	/*
	 * A device with instance-lock ops (7.x) sends UP and GOING_DOWN with
	 * that lock held, which kbp takes after kbp_lock: do not take kbp_lock
	 * under it.  The reconcile work follows its state instead
	 * (kbp_dev_follow_ops_locked()); its UNREGISTER comes without the lock.
	 */
	if (event != NETDEV_UNREGISTER && kbp_dev_needs_ops_lock(dev)) {
		kbp_reconcile_soon();
		return NOTIFY_DONE;
	}

	mutex_lock(&kbp_lock);
	kd = kbp_dev_find(dev);
	if (!kd)
		goto out;
	switch (event) {
	case NETDEV_GOING_DOWN:
		/* before ndo_stop(), which may delete the NAPIs */
		kbp_dev_deactivate(kd);
		pr_info("%s: down, NAPIs back to softirq until up\n", dev->name);
		break;
	case NETDEV_UP:
		/* rtnl and kbp_lock held, then the instance lock (kbp_priv.h) */
		kbp_netdev_lock(dev);
		kbp_dev_up(kd);
		kbp_netdev_unlock(dev);
		break;
	case NETDEV_UNREGISTER:
		kbp_dev_unbind(kd);
		break;
	}
out:
	mutex_unlock(&kbp_lock);
	return NOTIFY_DONE;
}

static struct notifier_block kbp_netdev_nb = {
	.notifier_call = kbp_netdev_event,
};

/*
 * CPU hotplug.  A poller is bound to its CPU; when that CPU goes offline the
 * scheduler pushes the thread elsewhere, where it must not keep spinning at
 * SCHED_FIFO on someone else's CPU.  The callbacks only kick the reconcile
 * work: taking rtnl here could deadlock against an rtnl holder waiting for
 * cpus_read_lock().  Our state is below CPUHP_AP_ACTIVE, so on the way down
 * cpu_active() is already false when we run: the reconcile work hands the
 * devices with a NAPI there back to softirq (standby, retried) and stops the
 * poller, which meanwhile sleeps instead of spinning (kbp_off_home()); on
 * the way up it attaches them again once the CPU is active.
 */
static enum cpuhp_state kbp_cpuhp_state;

static int kbp_cpu_event(unsigned int cpu)
{
	kbp_reconcile_soon();
	return 0;
}

static int __init kbp_init(void)
{
	const struct kbp_mode_ops *ops = kbp_mode_ops_by_name(default_mode);
	unsigned int slot;
	int err;

	if (!ops) {
		pr_err("default_mode=%s: unknown mode (busy, hybrid or periodic)\n",
		       default_mode);
		return -EINVAL;
	}
	kbp_default_mode = ops->mode;

	kbp_slots = kcalloc(kbp_nr_slots(), sizeof(*kbp_slots), GFP_KERNEL);
	kbp_conf = kcalloc(kbp_nr_slots(), sizeof(*kbp_conf), GFP_KERNEL);
	if (!kbp_slots || !kbp_conf) {
		err = -ENOMEM;
		goto err_free;
	}
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		INIT_LIST_HEAD(&kbp_slots[slot]);
		kbp_conf_init(&kbp_conf[slot], kbp_slot_class(slot),
			      kbp_default_mode);
	}
	err = kbp_freq_init();
	if (err)
		goto err_free;

	/* replays NETDEV_UP, which kicks the work for ops-locked devices */
	err = register_netdevice_notifier(&kbp_netdev_nb);
	if (err)
		goto err_freq;
	err = cpuhp_setup_state_nocalls(CPUHP_AP_ONLINE_DYN, "net/kbp:online",
					kbp_cpu_event, kbp_cpu_event);
	if (err < 0)
		goto err_notifier;
	kbp_cpuhp_state = err;
	err = kbp_genl_init();
	if (err)
		goto err_cpuhp;
	pr_info("loaded (default mode %s)\n", default_mode);
	return 0;

err_cpuhp:
	cpuhp_remove_state_nocalls(kbp_cpuhp_state);
err_notifier:
	unregister_netdevice_notifier(&kbp_netdev_nb);
	/* the last kicker is gone: nothing queues it again */
	cancel_delayed_work_sync(&kbp_reconcile_work);
err_freq:
	kbp_freq_exit();
err_free:
	kfree(kbp_conf);
	kfree(kbp_slots);
	return err;
}

/*
 * Unload, in the order that leaves nothing behind: no new request (genl),
 * every device handed back and every poller told to stop; then no new kick
 * (the CPU hotplug callbacks, the netdevice notifier, whose unregistration
 * replays NETDEV_GOING_DOWN and UNREGISTER for every device: kbp_exiting
 * keeps the ops-locked ones from kicking the work); then every poller
 * thread ever started has left kbp's code (a respawn in flight included:
 * each thread's last act is kthread_complete_and_exit()); only then is the
 * reconcile work cancelled, with nothing left that could queue it.
 */
static void __exit kbp_exit(void)
{
	struct kbp_dev *kd, *tmp;
	unsigned int slot;

	kbp_genl_exit();	/* no new requests */

	rtnl_lock();
	mutex_lock(&kbp_lock);
	WRITE_ONCE(kbp_exiting, true);
	list_for_each_entry_safe(kd, tmp, &kbp_devs, node)
		kbp_dev_unbind(kd);
	kbp_pollers_gc();	/* every poller: stopping, or freed */
	mutex_unlock(&kbp_lock);
	rtnl_unlock();

	cpuhp_remove_state_nocalls(kbp_cpuhp_state);
	unregister_netdevice_notifier(&kbp_netdev_nb);

	/*
	 * A respawn a driver's deletion started may still be running: its
	 * poller is not idle until it is done, and gc stops it then.
	 */
	for (;;) {
		bool left = false;

		rtnl_lock();
		mutex_lock(&kbp_lock);
		kbp_pollers_gc();
		for (slot = 0; slot < kbp_nr_slots(); slot++)
			left |= !list_empty(&kbp_slots[slot]);
		mutex_unlock(&kbp_lock);
		rtnl_unlock();
		if (!left)
			break;
		usleep_range(1000, 2000);
	}
	kbp_threads_wait_all();
	cancel_delayed_work_sync(&kbp_reconcile_work);
	kbp_freq_exit();
	rcu_barrier();		/* kfree_rcu() of our links and pollers */
	kfree(kbp_conf);
	kfree(kbp_slots);
	pr_info("unloaded\n");
}

module_init(kbp_init);
module_exit(kbp_exit);
MODULE_LICENSE("GPL");
MODULE_AUTHOR("kbp developers");
MODULE_DESCRIPTION("Kernel busy poll: per-CPU kthreads poll NAPI instead of NET_RX softirq");
MODULE_VERSION("0.1.0");
