// SPDX-License-Identifier: GPL-2.0
/*
 * kbp poller: one kthread per CPU that polls the NAPI instances attached to
 * it, instead of NET_RX_SOFTIRQ.
 *
 * Handoff.  An attached NAPI has napi->thread pointing at the poller and
 * NAPI_STATE_THREADED set, so the kernel's own ____napi_schedule() (hardIRQ
 * path) sets NAPI_STATE_SCHED_THREADED and wakes the poller instead of
 * queueing the NAPI on the softnet poll list and raising NET_RX_SOFTIRQ.
 * SCHED_THREADED is the token of ownership: the poller polls a NAPI if and
 * only if that bit is set, exactly like napi_threaded_poll() in
 * net/core/dev.c, and napi_complete_done() clears it.
 *
 * Modes
 *   busy    (KBP)    never sleeps; checks its NAPIs on every pass.
 *   hybrid  (EE-KBP) sleeps when none of its NAPIs is scheduled and
 *                    linger_us has passed since the last packet; the
 *                    hardIRQ path wakes it.  With freq_ctl it lowers its
 *                    CPU's frequency before sleeping and raises it on
 *                    waking (kbp_freq.c).
 */
#include <linux/kthread.h>
#include <linux/livepatch.h>
#include <linux/netpoll.h>
#include <linux/rcupdate.h>
#include <linux/sched/clock.h>
#include <linux/sched/rt.h>
#include <linux/sched/stat.h>
#include <linux/slab.h>
#include <uapi/linux/sched/types.h>
#include <trace/events/napi.h>

#include "kbp_priv.h"
#include "kbp_compat.h"

/*
 * Sleep state of a hybrid poller.  TASK_FREEZABLE changes nothing for a
 * kthread (kthreads are PF_NOFREEZE) and /proc still shows "S", but it makes
 * the state differ from plain TASK_INTERRUPTIBLE: on 6.1 ____napi_schedule()
 * sets SCHED_THREADED only if the thread's state is not exactly
 * TASK_INTERRUPTIBLE (napi_thread_wait() treats "I was woken" as ownership
 * instead).  A poller serving several NAPIs cannot tell from a wakeup which
 * NAPI it owns, so it must always get the bit.  6.12 always sets it.
 */
#define KBP_SLEEP_STATE	(TASK_INTERRUPTIBLE | TASK_FREEZABLE)

static void kbp_stat_add(struct kbp_poller *p, u64_stats_t *c, u64 v)
{
	u64_stats_update_begin(&p->syncp);
	u64_stats_add(c, v);
	u64_stats_update_end(&p->syncp);
}

/*
 * The tail of __napi_poll() (net/core/dev.c) for a poll that used its whole
 * budget: we still own the NAPI.  Returns true if it should be polled again.
 */
static bool kbp_napi_repoll(struct kbp_napi *kn, struct napi_struct *n,
			    int work)
{
	if (unlikely(napi_disable_pending(n))) {
		napi_complete(n);
		return false;
	}

	if (napi_prefer_busy_poll(n)) {
		if (napi_complete_done(n, work))
			napi_schedule(n);
		return false;
	}

	/* gro_flush_normal(&n->gro, HZ >= 1000) where napi->gro exists */
	kbp_gro_flush_old(n);
	kbp_gro_deliver_rx_list(n);

	if (unlikely(!list_empty(&n->poll_list))) {
		pr_warn_once("kbp: %s: budget exhausted after napi rescheduled\n",
			     n->dev ? n->dev->name : "?");
		return false;
	}

	if (unlikely(test_bit(KBP_NAPI_DETACHING, &kn->flags))) {
		/*
		 * Hand the NAPI to the softirq: NAPI_STATE_THREADED is already
		 * clear, so __napi_schedule() queues it on this CPU's poll list.
		 * We keep NAPI_STATE_SCHED: ownership moves, it is not dropped.
		 */
		clear_bit(NAPI_STATE_SCHED_THREADED, &n->state);
		__napi_schedule(n);
		return false;
	}
	return true;
}

/* Poll one NAPI we own, with bh disabled around the poll and the protocol
 * processing it drives (the papers' conflict control).
 */
static int kbp_poll_napi(struct kbp_poller *p, struct kbp_napi *kn,
			 bool *more)
{
	struct napi_struct *n = kn->napi;
	int budget = min_t(int, READ_ONCE(p->quota), n->weight);
	struct kbp_bpf_ctx bpf_ctx;
	int work = 0;
	u64 t0;
	void *have;

	if (budget <= 0)
		budget = 1;
	t0 = local_clock();
	local_bh_disable();
	kbp_bpf_ctx_set(&bpf_ctx);
	have = netpoll_poll_lock(n);

	if (test_bit(NAPI_STATE_SCHED, &n->state)) {
		work = n->poll(n, budget);
		trace_napi_poll(n, work, budget);
	}
	if (unlikely(work > budget))
		netdev_err_once(n->dev, "kbp: NAPI poll %pS returned %d, over its budget %d\n",
				n->poll, work, budget);
	if (work >= budget && kbp_napi_repoll(kn, n, work))
		*more = true;

	netpoll_poll_unlock(have);
	kbp_bpf_ctx_clear(&bpf_ctx);
	local_bh_enable();

	u64_stats_update_begin(&kn->syncp);
	u64_stats_add(&kn->packets, work);
	u64_stats_inc(&kn->polls);
	u64_stats_update_end(&kn->syncp);
	kbp_stat_add(p, &p->poll_ns, local_clock() - t0);
	return work;
}

/*
 * One round-robin pass: each owned NAPI gets up to one quota.  Each poll
 * holds KBP_NAPI_POLLING: a detach that takes a NAPI back from a poller that
 * cannot run (kbp_poller_release()) claims the same bit, so the two never
 * poll one NAPI at once, and the counters of a NAPI are final once the bit
 * is seen clear with SCHED_THREADED clear.
 */
static int kbp_pass(struct kbp_poller *p, bool *more)
{
	struct kbp_napi *kn;
	int work = 0;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (!test_bit(NAPI_STATE_SCHED_THREADED, &kn->napi->state))
			continue;
		if (test_and_set_bit_lock(KBP_NAPI_POLLING, &kn->flags))
			continue;	/* taken back by a detach */
		work += kbp_poll_napi(p, kn, more);
		clear_bit_unlock(KBP_NAPI_POLLING, &kn->flags);
	}
	rcu_read_unlock();
	return work;
}

static bool kbp_has_work(struct kbp_poller *p)
{
	struct kbp_napi *kn;
	bool ret = false;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (test_bit(NAPI_STATE_SCHED_THREADED, &kn->napi->state)) {
			ret = true;
			break;
		}
	}
	rcu_read_unlock();
	return ret;
}

/* Off the CPU it is bound to: that CPU is going offline (kbp_cpu_event()). */
static bool kbp_off_home(struct kbp_poller *p)
{
	return raw_smp_processor_id() != p->cpu;
}

/*
 * The sleep predicates.  Any poller sleeps when it serves no NAPI (device
 * down, standby) or has been pushed off its CPU by hotplug (the reconcile
 * work then hands its NAPIs back); a hybrid poller (Algorithm 1 of EE-KBP,
 * plus linger) also when linger_us has passed since the last packet.
 */
static bool kbp_may_sleep(struct kbp_poller *p, bool more, u64 now,
			  u64 last_work)
{
	u64 linger = (u64)READ_ONCE(p->linger_us) * NSEC_PER_USEC;

	if (more)
		return false;
	if (list_empty(&p->napis) || kbp_off_home(p))
		return true;
	if (READ_ONCE(p->mode) != KBP_MODE_HYBRID)
		return false;
	return now - last_work >= linger;
}

/* Still nothing to do, checked after set_current_state() (pairs with wakers). */
static bool kbp_still_idle(struct kbp_poller *p)
{
	if (kthread_should_stop() || kbp_has_work(p))
		return false;
	/* a busy poller that kbp_poller_add_napi() gave a NAPI spins again */
	return READ_ONCE(p->mode) == KBP_MODE_HYBRID ||
	       list_empty(&p->napis) || kbp_off_home(p);
}

/*
 * Sleep until woken: by the hardIRQ path (____napi_schedule()), a knob
 * change, a new NAPI or kthread_stop().  KBP_SLEEP_STATE: see its comment.
 * @sleeps counts every sleep, @wakeups those that ended with work to do.
 */
static void kbp_sleep(struct kbp_poller *p)
{
	bool woke;
	u64 t0;

	set_current_state(KBP_SLEEP_STATE);
	/* pairs with set_bit(SCHED_THREADED) + wake_up_process() in ____napi_schedule() */
	if (!kbp_still_idle(p)) {
		__set_current_state(TASK_RUNNING);
		return;
	}
	t0 = local_clock();
	schedule();
	__set_current_state(TASK_RUNNING);
	woke = kbp_has_work(p);

	u64_stats_update_begin(&p->syncp);
	u64_stats_inc(&p->sleeps);
	if (woke)
		u64_stats_inc(&p->wakeups);
	u64_stats_add(&p->sleep_ns, local_clock() - t0);
	u64_stats_update_end(&p->syncp);
}

/*
 * Giving the CPU to others.  A poller that does not sleep (busy, or hybrid
 * under sustained load) runs at SCHED_FIFO by default, and a FIFO task is
 * not preempted by the wakeup of an equal- or lower-priority task.  Left
 * alone it starves its CPU's per-CPU kernel threads (rcuc/N and the NIC's
 * own irq/N-* thread on PREEMPT_RT: an RCU stall, a synchronize_rcu() that
 * never returns, a NAPI that is never scheduled; ksoftirqd/N, kworkers) and
 * any application pinned there, all of which get only the RT-throttling
 * window.  So a polling thread yields: when another task is runnable on its
 * CPU it sleeps up to KBP_YIELD_NS, at once if its pass found no work, else
 * once it has held the CPU KBP_SLICE_NS while others waited.  A NAPI
 * schedule (hardIRQ path) ends the sleep early, so an idle device loses
 * nothing; a NAPI the poller owns under load waits at most KBP_YIELD_NS.
 * The others get at least KBP_YIELD_NS of every KBP_SLICE_NS (5%) under
 * load, and all of the CPU the poller does not need when idle.
 * single_task_running() is the scheduler's own cheap test, the one vhost-net
 * and KVM halt polling use for the same purpose.
 */
#define KBP_SLICE_NS	(1 * NSEC_PER_MSEC)
#define KBP_YIELD_NS	(50 * NSEC_PER_USEC)

static bool kbp_should_yield(bool work, u64 now, u64 *contended_since)
{
	if (single_task_running()) {
		*contended_since = 0;
		return false;
	}
	if (!*contended_since)
		*contended_since = now;
	return !work || now - *contended_since >= KBP_SLICE_NS;
}

/*
 * Sleep up to @ns in KBP_SLEEP_STATE: a NAPI schedule, a knob change or
 * kthread_stop() ends it early.
 */
static void kbp_sleep_ns(u64 ns)
{
	ktime_t t = ns_to_ktime(ns);

	set_current_state(KBP_SLEEP_STATE);
	if (kthread_should_stop()) {
		__set_current_state(TASK_RUNNING);
		return;
	}
	schedule_hrtimeout(&t, HRTIMER_MODE_REL);
}

static void kbp_yield(struct kbp_poller *p)
{
	kbp_sleep_ns(KBP_YIELD_NS);
	kbp_stat_add(p, &p->yields, 1);
}

/*
 * Let a livepatch transition switch this task.  Since 6.4 the task can do it
 * itself while running (what klp_cond_resched() does); before, the transition
 * switches a task only while it is off the CPU, so nap: even with work
 * pending (a poller under sustained load always has some) and even if a
 * NAPI schedule wakes us, or the transition never completes.
 */
#if !defined(KBP_HAVE_KLP_COND_RESCHED) && !defined(KBP_HAVE_KLP_SCHED_SWITCH)
/*
 * Be off the CPU for at least one full jiffy, whatever wakes us meanwhile
 * (a busy poller letting a livepatch transition switch it, before 6.4).
 */
static void kbp_nap(void)
{
	unsigned long end = jiffies + 2;

	for (;;) {
		set_current_state(KBP_SLEEP_STATE);
		if (kthread_should_stop() || !time_before(jiffies, end))
			break;
		schedule_timeout(end - jiffies);
	}
	__set_current_state(TASK_RUNNING);
}
#endif

static void kbp_klp_switch(struct kbp_poller *p)
{
#if defined(KBP_HAVE_KLP_COND_RESCHED)
	__klp_sched_try_switch();
#elif defined(KBP_HAVE_KLP_SCHED_SWITCH)
	/*
	 * __schedule() switches a task that enters a freezable sleep: sleep
	 * a microsecond (a NAPI schedule may end it before schedule(); then
	 * the next pass tries again).
	 */
	kbp_sleep_ns(NSEC_PER_USEC);
#else
	kbp_nap();
#endif
}

/*
 * What a poller that does not sleep owes the rest of the system: a
 * preemption point, an RCU-tasks quiescent state and a chance for a pending
 * livepatch transition to switch it.  Plain RCU needs nothing more: Debian
 * kernels use preemptible RCU, whose tick sees this thread outside any
 * read-side section between passes.  Lower-priority tasks get their turn in
 * kbp_yield().
 *
 * Out-of-line calls only, not cond_resched(): that is a static call (and the
 * livepatch switch a static key) which the kernel rewrites with
 * text_poke_bp() when the preemption mode changes or a transition starts, and
 * a CPU spinning on the rewritten instruction is the worst case for that
 * protocol (the 6.12-rt guest under QEMU TCG died on the int3 of exactly this
 * site).  The spin loop keeps no patchable instruction of its own.
 */
static void kbp_relax(struct kbp_poller *p)
{
	rcu_tasks_qs(current, false);
	kbp_cond_resched();
	if (unlikely(klp_patch_pending(current)))
		kbp_klp_switch(p);
}

static void kbp_poller_respawn(struct kbp_poller *p);

/* The poller thread: small loop, every decision a named predicate above. */
static int kbp_poller_fn(void *data)
{
	struct kbp_poller *p = data;
	u64 last_work = local_clock(), contended = 0;
	struct kbp_freq freq = {};

	while (!kthread_should_stop()) {
		bool more = false;
		int work;
		u64 now;

		if (unlikely(test_bit(KBP_POLLER_STUCK, &p->flags))) {
			/* running again: kbp_pollers_gc() may stop us now */
			clear_bit(KBP_POLLER_STUCK, &p->flags);
			kbp_reconcile_soon();
		}
		kbp_freq_wake(p, &freq);
		work = kbp_pass(p, &more);
		now = local_clock();

		u64_stats_update_begin(&p->syncp);
		u64_stats_inc(&p->passes);
		if (work)
			u64_stats_add(&p->packets, work);
		else
			u64_stats_inc(&p->empty_passes);
		u64_stats_update_end(&p->syncp);

		if (work)
			last_work = now;
		if (kbp_may_sleep(p, more, now, last_work)) {
			/* the last look before paying for a frequency change */
			if (!kbp_has_work(p))
				kbp_freq_sleep(p, &freq);
			kbp_sleep(p);
			contended = 0;
		} else if (kbp_should_yield(work || more, now, &contended)) {
			kbp_yield(p);
			contended = 0;
		} else {
			kbp_relax(p);
		}
	}

	kbp_freq_restore(p, &freq);

	if (!test_bit(KBP_POLLER_STOPPING, &p->flags))
		kbp_poller_respawn(p);
	return 0;
}

static int kbp_apply_prio(struct task_struct *t, u32 rt_prio)
{
	struct sched_attr attr = {
		.size = sizeof(attr),
		.sched_policy = rt_prio ? SCHED_FIFO : SCHED_NORMAL,
		.sched_priority = rt_prio,
	};

	return sched_setattr_nocheck(t, &attr);
}

static struct task_struct *kbp_poller_spawn(struct kbp_poller *p)
{
	struct task_struct *t;
	int err;

	t = kthread_create_on_cpu(kbp_poller_fn, p, p->cpu, "kbp/%u");
	if (IS_ERR(t))
		return t;
	err = kbp_apply_prio(t, READ_ONCE(p->rt_prio));
	if (err)
		pr_warn("kbp: kbp/%d: cannot set rt_prio %u: %d\n", p->cpu,
			READ_ONCE(p->rt_prio), err);
	get_task_struct(t);
	return t;
}

struct kbp_poller *kbp_poller_create(int cpu, const struct kbp_conf *conf)
{
	struct kbp_poller *p;
	struct task_struct *t;

	p = kzalloc_node(sizeof(*p), GFP_KERNEL, cpu_to_node(cpu));
	if (!p)
		return ERR_PTR(-ENOMEM);
	p->cpu = cpu;
	spin_lock_init(&p->lock);
	INIT_LIST_HEAD(&p->napis);
	u64_stats_init(&p->syncp);
	p->mode = conf->mode;
	p->linger_us = conf->linger_us;
	p->quota = conf->quota;
	p->rt_prio = conf->rt_prio;
	p->freq_ctl = conf->freq_ctl;

	t = kbp_poller_spawn(p);
	if (IS_ERR(t)) {
		kfree(p);
		return ERR_CAST(t);
	}
	/* first woken by kbp_poller_add_napi(): it starts with work */
	p->task = t;
	WRITE_ONCE(p->pid, t->pid);
	return p;
}

/* Caller holds rtnl and kbp_lock; the poller has no NAPIs left. */
void kbp_poller_destroy(struct kbp_poller *p)
{
	WARN_ON_ONCE(!list_empty(&p->napis));
	if (p->task) {
		set_bit(KBP_POLLER_STOPPING, &p->flags);
		kthread_stop(p->task);
		put_task_struct(p->task);
	}
	kfree(p);
}

/* Caller holds rtnl and kbp_lock. */
void kbp_poller_apply(struct kbp_poller *p, const struct kbp_conf *conf)
{
	WRITE_ONCE(p->linger_us, conf->linger_us);
	WRITE_ONCE(p->quota, conf->quota);
	WRITE_ONCE(p->mode, conf->mode);
	WRITE_ONCE(p->freq_ctl, conf->freq_ctl);
	if (p->rt_prio != conf->rt_prio) {
		WRITE_ONCE(p->rt_prio, conf->rt_prio);
		if (p->task)
			kbp_apply_prio(p->task, conf->rt_prio);
	}
	if (p->task)
		wake_up_process(p->task);
}

/*
 * Caller holds rtnl and kbp_lock.  Once napi->thread and THREADED are set
 * the next napi_schedule() of this NAPI wakes the poller; a schedule already
 * queued on a softnet poll list is finished by the softirq, as with
 * dev_set_threaded().
 */
void kbp_poller_add_napi(struct kbp_poller *p, struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;

	kn->poller = p;
	spin_lock(&p->lock);
	list_add_tail_rcu(&kn->poll_node, &p->napis);
	spin_unlock(&p->lock);

	WRITE_ONCE(n->thread, p->task);
	/* napi->thread before THREADED, as in dev_set_threaded() */
	smp_mb__before_atomic();
	set_bit(NAPI_STATE_THREADED, &n->state);
	if (p->task)
		wake_up_process(p->task);
}

/*
 * Caller holds rtnl and kbp_lock, has cleared THREADED, waited for an RCU
 * grace period (no hardIRQ path can still be about to wake us for this NAPI)
 * and for the poller to release the NAPI (kbp_poller_wait_released()).
 * A DEAD link was unlinked by kbp_poller_respawn() already, and its poller
 * may be gone: kbp_pollers_gc() frees a poller whose list is empty.  DEAD
 * is stable here: it is set only by the respawn, which runs while the
 * driver deleting the NAPI holds rtnl, as we do.
 */
void kbp_poller_del_napi(struct kbp_napi *kn)
{
	struct kbp_poller *p = kn->poller;

	if (test_bit(KBP_NAPI_DEAD, &kn->flags))
		return;
	spin_lock(&p->lock);
	list_del_rcu(&kn->poll_node);
	WRITE_ONCE(kn->napi->thread, NULL);
	spin_unlock(&p->lock);
}

/*
 * Take @kn's NAPI back from a poller that has not released it in time.  Safe
 * only between two of its polls: KBP_NAPI_POLLING, claimed here and left
 * set, says the poller is not in one and keeps it out of this NAPI for good
 * (the link is unlinked and freed after a grace period).  The NAPI then goes
 * to this CPU's softirq with NAPI_STATE_SCHED kept, as kbp_napi_repoll()
 * hands it over.  False if the poller is in the middle of a poll.
 */
static bool kbp_poller_release(struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;

	if (test_and_set_bit_lock(KBP_NAPI_POLLING, &kn->flags))
		return false;
	if (test_and_clear_bit(NAPI_STATE_SCHED_THREADED, &n->state)) {
		local_bh_disable();
		__napi_schedule(n);
		local_bh_enable();
	}
	return true;
}

/* The poller still owns the NAPI, or is finishing a poll of it. */
static bool kbp_napi_held(struct kbp_napi *kn)
{
	if (test_bit(NAPI_STATE_SCHED_THREADED, &kn->napi->state))
		return true;
	smp_rmb();	/* pairs with clear_bit_unlock() in kbp_pass() */
	return test_bit(KBP_NAPI_POLLING, &kn->flags);
}

/*
 * Wait until the poller has given @kn's NAPI back (completed it, or handed it
 * to the softirq in kbp_napi_repoll()) and finished counting its last poll.
 * Caller holds rtnl and kbp_lock and has set KBP_NAPI_DETACHING, cleared
 * THREADED and waited for a grace period.  Bounded: a poller that cannot run
 * (a higher-priority task hogs its CPU) must not hang rtnl.  After
 * KBP_RELEASE_WAIT the NAPI is taken back between two polls; a poller stuck
 * inside a poll (only possible where bh-disabled code is preemptible, i.e.
 * PREEMPT_RT) is raised to the highest RT priority to finish it.
 */
#define KBP_RELEASE_WAIT	(5 * HZ)

void kbp_poller_wait_released(struct kbp_napi *kn)
{
	unsigned long deadline = jiffies + KBP_RELEASE_WAIT;
	struct kbp_poller *p = kn->poller;
	const char *name = kn->kdev->dev->name;
	bool boosted = false;

	while (kbp_napi_held(kn)) {
		if (p->task)
			wake_up_process(p->task);
		if (time_after(jiffies, deadline)) {
			if (kbp_poller_release(kn)) {
				pr_warn("kbp: %s: NAPI #%u taken back from kbp/%d, which did not release it within %u ms (starved?)\n",
					name, kn->index, p->cpu,
					jiffies_to_msecs(KBP_RELEASE_WAIT));
				/* nor would it stop: kthread_stop() waits for it */
				set_bit(KBP_POLLER_STUCK, &p->flags);
				break;
			}
			if (!boosted && p->task) {
				pr_warn("kbp: %s: kbp/%d is stuck in a poll of NAPI #%u; raising it to finish\n",
					name, p->cpu, kn->index);
				kbp_apply_prio(p->task, KBP_RT_PRIO_MAX);
				boosted = true;
			}
		}
		usleep_range(50, 200);
	}
	if (boosted && p->task)
		kbp_apply_prio(p->task, READ_ONCE(p->rt_prio));
}

/*
 * The poller was stopped by someone else: __netif_napi_del() calls
 * kthread_stop(napi->thread) for a NAPI that a driver deletes while its
 * device stays up (veth on "ethtool -K gro off" or a channel change, for
 * example).  The deleter holds rtnl and waits for us to exit, so nothing of
 * ours can run concurrently.  Drop the NAPIs that lost NAPI_STATE_LISTED,
 * move the others to a new thread, and exit.
 */
static void kbp_poller_respawn(struct kbp_poller *p)
{
	struct task_struct *old = current, *t;
	struct kbp_napi *kn, *tmp;

	spin_lock(&p->lock);
	list_for_each_entry_safe(kn, tmp, &p->napis, poll_node) {
		if (!test_bit(NAPI_STATE_LISTED, &kn->napi->state)) {
			set_bit(KBP_NAPI_DEAD, &kn->flags);
			list_del_rcu(&kn->poll_node);
			kn->poller = NULL;
		}
	}
	spin_unlock(&p->lock);

	t = kbp_poller_spawn(p);
	if (IS_ERR(t)) {
		pr_err("kbp: kbp/%d stopped by a NAPI deletion and cannot respawn (%ld); its NAPIs fall back to softirq\n",
		       p->cpu, PTR_ERR(t));
		spin_lock(&p->lock);
		list_for_each_entry(kn, &p->napis, poll_node)
			clear_bit(NAPI_STATE_THREADED, &kn->napi->state);
		spin_unlock(&p->lock);
		synchronize_rcu();
		spin_lock(&p->lock);
		list_for_each_entry_safe(kn, tmp, &p->napis, poll_node) {
			struct napi_struct *n = kn->napi;

			if (test_and_clear_bit(NAPI_STATE_SCHED_THREADED, &n->state)) {
				local_bh_disable();
				__napi_schedule(n);
				local_bh_enable();
			}
			WRITE_ONCE(n->thread, NULL);
			set_bit(KBP_NAPI_DEAD, &kn->flags);
			list_del_rcu(&kn->poll_node);
			kn->poller = NULL;
		}
		spin_unlock(&p->lock);
		set_bit(KBP_POLLER_FAILED, &p->flags);
		p->task = NULL;
		WRITE_ONCE(p->pid, 0);
	} else {
		spin_lock(&p->lock);
		list_for_each_entry(kn, &p->napis, poll_node)
			WRITE_ONCE(kn->napi->thread, t);
		spin_unlock(&p->lock);
		p->task = t;
		WRITE_ONCE(p->pid, t->pid);
		atomic64_inc(&p->respawns);
		wake_up_process(t);
		pr_info("kbp: kbp/%d replaced (pid %d -> %d) after a driver deleted one of its NAPIs\n",
			p->cpu, old->pid, t->pid);
	}
	/* no hardIRQ path still holds the old task from napi->thread */
	synchronize_rcu();
	kbp_reconcile_soon();
	put_task_struct(old);
}

void kbp_poller_read(struct kbp_poller *p, struct kbp_poller_snapshot *s)
{
	unsigned int start;

	do {
		start = u64_stats_fetch_begin(&p->syncp);
		s->passes = u64_stats_read(&p->passes);
		s->empty_passes = u64_stats_read(&p->empty_passes);
		s->packets = u64_stats_read(&p->packets);
		s->wakeups = u64_stats_read(&p->wakeups);
		s->sleeps = u64_stats_read(&p->sleeps);
		s->sleep_ns = u64_stats_read(&p->sleep_ns);
		s->poll_ns = u64_stats_read(&p->poll_ns);
		s->freq_changes = u64_stats_read(&p->freq_changes);
		s->yields = u64_stats_read(&p->yields);
	} while (u64_stats_fetch_retry(&p->syncp, start));
	s->respawns = atomic64_read(&p->respawns);
	s->repairs = atomic64_read(&p->repairs);
}

void kbp_napi_read(struct kbp_napi *kn, u64 *packets, u64 *polls)
{
	unsigned int start;

	do {
		start = u64_stats_fetch_begin(&kn->syncp);
		*packets = u64_stats_read(&kn->packets);
		*polls = u64_stats_read(&kn->polls);
	} while (u64_stats_fetch_retry(&kn->syncp, start));
}
