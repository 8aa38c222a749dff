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
struct kbp_poller **kbp_pollers;	/* [kbp_nr_slots()]: kbp_slot() */
struct kbp_conf *kbp_conf;		/* [kbp_nr_slots()]: kbp_slot() */
static bool kbp_exiting;		/* under kbp_lock */
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
 * checks, its mode's, then freq_ctl's.
 */
static int kbp_conf_check(int cpu, u32 cls, const struct kbp_conf *c,
			  struct netlink_ext_ack *extack)
{
	const struct kbp_class_ops *cops = kbp_class_ops(cls);
	const struct kbp_mode_ops *ops = kbp_mode_ops(c->mode);
	int err;

	if (cops->check) {
		err = cops->check(cpu, c, extack);
		if (err)
			return err;
	}
	if (c->nice && cls != KBP_CLASS_NON_RT) {
		kbp_refuse(extack, "nice is a non-rt knob",
			   "CPU %d: nice applies to the non-rt poller only", cpu);
		return -EINVAL;
	}
	if (ops && ops->check) {
		err = ops->check(cpu, c, extack);
		if (err)
			return err;
	}
	return kbp_freq_check(cpu, c, extack);
}

/* The configuration @req asks for in @slot, on top of what is there. */
static void kbp_conf_merge(unsigned int slot, const struct kbp_knobs *req,
			   struct kbp_conf *out)
{
	*out = kbp_conf[slot];
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
 * The poller of @cpu for a NAPI of @kd: started with @kd's knobs if none
 * runs, given them if it runs idle; one serving other NAPIs keeps its own
 * (kbp_dev_bind() refused a conflict already).
 */
static struct kbp_poller *kbp_poller_get(int cpu, struct kbp_dev *kd)
{
	unsigned int slot = kbp_slot(cpu, kd->cls);
	struct kbp_poller *p = kbp_pollers[slot];

	lockdep_assert_held(&kbp_lock);
	if (p && test_bit(KBP_POLLER_FAILED, &p->flags)) {
		/* a failed poller has no NAPIs and no thread */
		kbp_pollers[slot] = NULL;
		kbp_poller_destroy(p);
		p = NULL;
	}
	if (p) {
		if (list_empty(&p->napis)) {
			kbp_conf_merge(slot, &kd->knobs, &kbp_conf[slot]);
			kbp_poller_apply(p, &kbp_conf[slot]);
		}
		return p;
	}
	kbp_conf_merge(slot, &kd->knobs, &kbp_conf[slot]);
	p = kbp_poller_create(cpu, kd->cls, &kbp_conf[slot]);
	if (IS_ERR(p))
		return p;
	kbp_pollers[slot] = p;
	pr_info("%s/%d started (pid %d, mode %s)\n", p->cls->prefix, cpu,
		p->pid, p->ops->name);
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
	unsigned int i;

	list_for_each_entry(kd, &kbp_devs, node) {
		if (kd == self || kd->cls != kbp_slot_class(slot))
			continue;
		if (kd->cpu == cpu)
			return true;
		for (i = 0; i < kd->nr_map; i++)
			if (kd->map[i].cpu == cpu)
				return true;
	}
	return false;
}

static bool kbp_slot_named(unsigned int slot)
{
	return kbp_slot_named_by_other(slot, NULL);
}

/*
 * Stop the pollers nothing needs any more.  rtnl and kbp_lock held.  A
 * poller that did not run for seconds (KBP_POLLER_STUCK: starved by a
 * higher-priority task) is left alone: kthread_stop() would wait for it
 * with rtnl held.  It clears the bit and kicks the reconcile work when it
 * runs again; module exit stops it after dropping rtnl.
 */
static void kbp_pollers_gc(void)
{
	unsigned int slot;

	ASSERT_RTNL();
	lockdep_assert_held(&kbp_lock);
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p = kbp_pollers[slot];
		int cpu = kbp_slot_cpu(slot);
		const char *prefix;

		if (!p || !kbp_poller_idle(p) ||
		    test_bit(KBP_POLLER_STUCK, &p->flags))
			continue;
		if (!kbp_exiting && !test_bit(KBP_POLLER_FAILED, &p->flags) &&
		    cpu_active(cpu) && kbp_slot_named(slot))
			continue;
		prefix = p->cls->prefix;
		kbp_pollers[slot] = NULL;
		kbp_poller_destroy(p);
		pr_info("%s/%d stopped\n", prefix, cpu);
		/*
		 * Nothing names the CPU any more: its knobs go back to the
		 * defaults, so the next attach gets what it asks for and not
		 * what an earlier request left (a CPU merely offline keeps
		 * them for its devices' return).
		 */
		if (!kbp_slot_named(slot))
			kbp_conf_init(&kbp_conf[slot], kbp_slot_class(slot),
				      kbp_default_mode);
	}
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
	struct kbp_poller *p = kbp_pollers[slot];
	const char *prefix = kbp_class_ops(cls)->prefix;
	struct kbp_conf want, have;

	if (p && test_bit(KBP_POLLER_STUCK, &p->flags)) {
		kbp_refuse(extack, "poller is starved",
			   "%s/%d has not run for seconds (a higher-priority task hogs CPU %d): try again once it runs",
			   prefix, cpu, cpu);
		return -EBUSY;
	}
	kbp_conf_merge(slot, req, &want);
	if (!p || list_empty(&p->napis)) {
		if (!kbp_slot_named_by_other(slot, self) ||
		    kbp_conf_equal(&want, &kbp_conf[slot]))
			return 0;
		kbp_refuse(extack, "CPU's knobs belong to another attachment",
			   "CPU %d's %s poller knobs belong to another attached device (mode=%s linger_us=%u rt_prio=%u nice=%d): ask for the same, or change them with poller-set",
			   cpu, kbp_class_ops(cls)->name,
			   kbp_mode_ops(kbp_conf[slot].mode)->name,
			   kbp_conf[slot].linger_us, kbp_conf[slot].rt_prio,
			   kbp_conf[slot].nice);
		return -EBUSY;
	}
	kbp_poller_conf(p, &have);
	if (kbp_conf_equal(&want, &have))
		return 0;
	kbp_refuse(extack, "poller serves other devices with other knobs",
		   "%s/%d serves other devices with mode=%s linger_us=%u quota=%u rt_prio=%u nice=%d freq_ctl=%u interval_us=%u netap=%u objective=%u; change them with poller-set",
		   prefix, cpu, p->ops->name, p->linger_us, p->quota,
		   p->rt_prio, p->nice, p->freq_ctl, p->interval_us, p->netap,
		   p->objective);
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
	struct kbp_poller *p;
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
	p = kbp_pollers[slot];
	if (p)
		kbp_poller_apply(p, &kbp_conf[slot]);
	return 0;
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
	unsigned int slot;

	for (slot = 0; slot < kbp_nr_slots(); slot++)
		if (kbp_pollers[slot] &&
		    READ_ONCE(kbp_pollers[slot]->task) == t)
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
 * A NAPI's index, what queue maps and replies call "NAPI #i": the RX queue
 * it serves, where the driver says so (netif_queue_set_napi(), 6.10+: ice,
 * mlx5, bnxt, virtio-net...), under rtnl or (7.x) the instance lock, both
 * held here.  That survives what list positions do not: a driver that adds
 * its NAPIs in another order than its queues, a channel change that deletes
 * and adds them again, and 6.18+ keeping dev->napi_list sorted by NAPI id.
 * Else, and before 6.10, @pos: the NAPI's place in the order the driver
 * added them (kbp_napi_by_index()).
 */
static unsigned int kbp_napi_index(struct net_device *dev,
				   struct napi_struct *n, unsigned int pos)
{
#ifdef KBP_HAVE_RXQ_NAPI
	unsigned int i;

	for (i = 0; i < dev->real_num_rx_queues; i++)
		if (READ_ONCE(__netif_get_rx_queue(dev, i)->napi) == n)
			return i;
#endif
	return pos;
}

/*
 * The CPU that serves @n, NAPI #@pos of @kd in add order: queue map (by
 * kbp_napi_index()), default, IRQ.
 */
static int kbp_napi_cpu(struct kbp_dev *kd, struct napi_struct *n,
			unsigned int pos, struct netlink_ext_ack *extack)
{
	unsigned int i, index = kbp_napi_index(kd->dev, n, pos);
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
 * Hook @n (NAPI #@index of @kd, found on the device's list in the caller's
 * rcu_read_lock() section) with @kn.  A NAPI a driver is deleting meanwhile
 * leaves a DEAD link (kbp_poller_add_napi()).
 */
static void kbp_napi_link(struct kbp_dev *kd, struct kbp_napi *kn,
			  struct napi_struct *n, unsigned int pos)
{
	kn->napi = n;
	kn->index = kbp_napi_index(kd->dev, n, pos);
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
		cpu = kbp_napi_cpu(kd, n, i, NULL);
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
	for (i = 0; i < kd->nr_map; i++) {
		if (kd->map[i].index >= max(nr, dev->real_num_rx_queues)) {
			kbp_refuse(extack, "queue map names a NAPI the device does not have",
				   "queue map names NAPI #%u but %s has %u",
				   kd->map[i].index, dev->name, nr);
			return -EINVAL;
		}
	}
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
				   dev->name, i);
			err = -EBUSY;
			break;
		}
		cpus[i] = kbp_napi_cpu(kd, n, i, extack);
		if (cpus[i] < 0)
			err = cpus[i];
		served++;
	}
	rcu_read_unlock();
	if (!err && !served)
		err = kbp_refuse_unservable(dev, extack);
	/* up again, or retried: the knobs may have changed meanwhile */
	for (i = 0; i < nr && !err; i++)
		if (cpus[i] >= 0)
			err = kbp_check_cpu(cpus[i], extack) ?:
			      kbp_check_conflict(cpus[i], kd->cls, &kd->knobs, kd,
						 extack);
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
			kbp_napi_link(kd, kns[i], n, i);
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

static void kbp_dev_free(struct kbp_dev *kd)
{
	list_del(&kd->node);
	netdev_put(kd->dev, &kd->tracker);
	kfree(kd->map);
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

void kbp_reconcile_soon(void)
{
	mod_delayed_work(kbp_wq(), &kbp_reconcile_work, 0);
}

static void kbp_reconcile_later(void)
{
	lockdep_assert_held(&kbp_lock);
	if (!kbp_exiting && !list_empty(&kbp_devs))
		queue_delayed_work(kbp_wq(), &kbp_reconcile_work,
				   msecs_to_jiffies(max(reconcile_ms, 10U)));
}

/* @cpu exists and its poller of @kd's class can run the knobs @req asks for. */
static int kbp_req_check_cpu(int cpu, const struct kbp_knobs *req,
			     const struct kbp_dev *kd,
			     struct netlink_ext_ack *extack)
{
	struct kbp_conf want;
	int err;

	err = kbp_check_cpu(cpu, extack);
	if (err)
		return err;
	kbp_conf_merge(kbp_slot(cpu, kd->cls), req, &want);
	return kbp_conf_check(cpu, kd->cls, &want, extack);
}

/* The same, and no conflict with what that poller runs or stores. */
static int kbp_req_check_cpu_conflict(int cpu, const struct kbp_knobs *req,
				      const struct kbp_dev *kd,
				      struct netlink_ext_ack *extack)
{
	return kbp_req_check_cpu(cpu, req, kd, extack) ?:
	       kbp_check_conflict(cpu, kd->cls, req, kd, extack);
}

/* Every CPU @req would use on its device, for conflict checks. */
static int kbp_req_check_cpus(struct kbp_attach_req *req, struct kbp_dev *kd,
			      struct netlink_ext_ack *extack)
{
	unsigned int i, nr;
	int cpu, err;

	if (req->cpu >= 0) {
		err = kbp_req_check_cpu_conflict(req->cpu, &req->knobs, kd,
						 extack);
		if (err)
			return err;
	}
	for (i = 0; i < req->nr_map; i++) {
		err = kbp_req_check_cpu_conflict(req->map[i].cpu, &req->knobs,
						 kd, extack);
		if (err)
			return err;
	}
	if (!netif_running(req->dev))
		return 0;
	nr = kbp_napi_count(req->dev);
	for (i = 0; i < nr; i++) {
		struct napi_struct *n;

		rcu_read_lock();
		n = kbp_napi_by_index(req->dev, i);
		cpu = n && kbp_napi_servable(n) ?
		      kbp_napi_cpu(kd, n, i, extack) : INT_MAX;
		rcu_read_unlock();
		if (cpu == INT_MAX)
			continue;
		if (cpu < 0)
			return cpu;
		err = kbp_req_check_cpu_conflict(cpu, &req->knobs, kd, extack);
		if (err)
			return err;
	}
	return 0;
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
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p = kbp_pollers[slot];

		if (p && list_empty(&p->napis))
			kbp_poller_apply(p, &kbp_conf[slot]);
	}
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
	INIT_LIST_HEAD(&kd->napis);

	/* after rtnl and kbp_lock: the NAPI list and threaded state hold still */
	kbp_netdev_lock(dev);
	err = kbp_req_check_cpus(req, kd, extack);
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
		bool linked = false;

		rcu_read_lock();
		n = kbp_napi_by_index(dev, i);
		if (n && kbp_napi_servable(n) && !kbp_napi_owned(kd, n) &&
		    READ_ONCE(n->thread) && !kbp_thread_is_stale(dev, n) &&
		    !kbp_napi_ours(READ_ONCE(n->thread)))
			why = "one of its NAPIs was given a threaded-NAPI kthread";
		n = n ? kbp_napi_free_at(kd, i) : NULL;
		cpu = n ? kbp_napi_cpu(kd, n, i, NULL) : -1;
		rcu_read_unlock();
		if (!n)
			continue;
		nkn = cpu >= 0 && cpu_active(cpu) &&
		      !kbp_check_conflict(cpu, kd->cls, &kd->knobs, kd, NULL) ?
		      kbp_napi_new(kd, cpu) : NULL;
		if (!IS_ERR_OR_NULL(nkn)) {
			rcu_read_lock();
			n = kbp_napi_free_at(kd, i);
			if (n) {
				kbp_napi_link(kd, nkn, n, i);
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
					    dev->name, i);
		} else if (linked) {
			pr_info_ratelimited("%s: hooked new NAPI #%u to %s/%d\n",
					    dev->name, i,
					    kbp_class_ops(kd->cls)->prefix, cpu);
		} else if (n)
			pr_warn_ratelimited("%s: cannot hook new NAPI #%u\n",
					    dev->name, i);
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

	kbp_pollers = kcalloc(kbp_nr_slots(), sizeof(*kbp_pollers), GFP_KERNEL);
	kbp_conf = kcalloc(kbp_nr_slots(), sizeof(*kbp_conf), GFP_KERNEL);
	if (!kbp_pollers || !kbp_conf) {
		err = -ENOMEM;
		goto err_free;
	}
	for (slot = 0; slot < kbp_nr_slots(); slot++)
		kbp_conf_init(&kbp_conf[slot], kbp_slot_class(slot),
			      kbp_default_mode);

	err = register_netdevice_notifier(&kbp_netdev_nb);
	if (err)
		goto err_free;
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
err_free:
	kfree(kbp_conf);
	kfree(kbp_pollers);
	return err;
}

static void __exit kbp_exit(void)
{
	struct kbp_dev *kd, *tmp;
	unsigned int slot;

	kbp_genl_exit();	/* no new requests */

	rtnl_lock();
	mutex_lock(&kbp_lock);
	kbp_exiting = true;
	list_for_each_entry_safe(kd, tmp, &kbp_devs, node)
		kbp_dev_unbind(kd);
	kbp_pollers_gc();
	mutex_unlock(&kbp_lock);
	rtnl_unlock();

	/*
	 * Stuck pollers, which gc left: no NAPIs, nothing else refers to them.
	 * And any whose respawn was still running (gc leaves those too): no
	 * NAPI points at them any more, so it finishes on its own.
	 */
	for (slot = 0; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p = kbp_pollers[slot];

		if (!p)
			continue;
		while (!kbp_poller_idle(p))
			usleep_range(1000, 2000);
		kbp_poller_destroy(p);
		kbp_pollers[slot] = NULL;
	}

	cpuhp_remove_state_nocalls(kbp_cpuhp_state);
	cancel_delayed_work_sync(&kbp_reconcile_work);
	unregister_netdevice_notifier(&kbp_netdev_nb);
	rcu_barrier();		/* kfree_rcu() of our NAPI links (pollers are gone) */
	kfree(kbp_conf);
	kfree(kbp_pollers);
	pr_info("unloaded\n");
}

module_init(kbp_init);
module_exit(kbp_exit);
MODULE_LICENSE("GPL");
MODULE_AUTHOR("kbp developers");
MODULE_DESCRIPTION("Kernel busy poll: per-CPU kthreads poll NAPI instead of NET_RX softirq");
MODULE_VERSION("0.1.0");
