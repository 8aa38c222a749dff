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
 *   periodic (NetAP) polls, then sleeps interval_us on an hrtimer with its
 *                    NAPIs still scheduled: the driver's napi_complete_done()
 *                    is made to return false (NAPI_STATE_IN_BUSY_POLL, as
 *                    for a socket's busy poll), so the driver leaves its
 *                    interrupt masked and no packet wakes anyone.  A NAPI
 *                    found empty KBP_PERIODIC_IDLE_POLLS times in a row is
 *                    polled once without the bit: the driver completes it
 *                    and unmasks its interrupt, whose next schedule wakes
 *                    the poller as in hybrid.  With netap on, the interval
 *                    comes from the golden-section search (kbp_netap.c),
 *                    run in rounds of round_ms.
 * Each mode is one entry of kbp_modes[] (struct kbp_mode_ops); the loop
 * calls its entry and tests no mode.
 */
#include <linux/delay.h>
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

/*
 * This thread owns @n: it is scheduled in threaded mode, for this thread.
 * napi->thread is checked as napi_threaded_poll() implies it (one thread per
 * NAPI): on 7.2 the kernel may stop the poller on a NAPI and give it a
 * kthread of its own before the reconcile work drops the link.
 */
static bool kbp_owns(const struct napi_struct *n)
{
	return test_bit(NAPI_STATE_SCHED_THREADED, &n->state) &&
	       READ_ONCE(n->thread) == current;
}

/*
 * The thread is to exit: the kernel stopped it (a NAPI of its device
 * deleted, threaded NAPI turned off: it respawns) or kbp is stopping the
 * poller (kbp_poller_stop_idle(): it does not).
 */
static bool kbp_should_exit(struct kbp_poller *p)
{
	return kthread_should_stop() ||
	       test_bit(KBP_POLLER_STOPPING, &p->flags);
}

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

	if (unlikely(test_bit(KBP_NAPI_DETACHING, &kn->flags) ||
		     kbp_napi_threaded_dropped(n))) {
		/*
		 * Hand the NAPI to the softirq: NAPI_STATE_THREADED is already
		 * clear (by our detach, or on 7.2 by napi_stop_kthread(), which
		 * waits for it), so __napi_schedule() queues it on this CPU's
		 * poll list.  We keep NAPI_STATE_SCHED: ownership moves, it is
		 * not dropped.
		 */
		clear_bit(NAPI_STATE_SCHED_THREADED, &n->state);
		__napi_schedule(n);
		return false;
	}
	return true;
}

/* Off the CPU it is bound to: that CPU is going offline (kbp_cpu_event()). */
static bool kbp_off_home(struct kbp_poller *p)
{
	return raw_smp_processor_id() != p->cpu;
}

/*
 * A mode that holds NAPIs (periodic) may keep @kn's scheduled across its
 * next sleep: not idle for too long, and nobody is taking the NAPI away
 * (napi_disable(), a detach, the kernel's threaded-off on 7.2, hotplug).
 * Those are checked again after the poll (kbp_napi_repoll()).
 */
static bool kbp_may_hold(struct kbp_poller *p, struct kbp_napi *kn,
			 struct napi_struct *n)
{
	return kn->idle < KBP_PERIODIC_IDLE_POLLS &&
	       !test_bit(KBP_NAPI_DETACHING, &kn->flags) &&
	       !kbp_napi_threaded_dropped(n) && !napi_disable_pending(n) &&
	       !napi_prefer_busy_poll(n) && !kbp_off_home(p);
}

/*
 * Poll one NAPI we own and claimed (kbp_pass_next()), bh disabled by the
 * caller, and release the claim with the NAPI's counters final.
 *
 * Holding (periodic): the poll runs with NAPI_STATE_IN_BUSY_POLL set, as
 * napi_busy_loop() runs it for a socket, so the driver's
 * napi_complete_done() returns false and changes nothing: the NAPI keeps
 * NAPI_STATE_SCHED and SCHED_THREADED (still ours) and the driver leaves its
 * interrupt masked (virtio-net: virtqueue_napi_complete() disables the
 * callback again).  The bit is ours to set: we own SCHED, and a socket's
 * busy poll takes a NAPI only with SCHED clear.  It is cleared before the
 * claim is released, so it never outlives the poll.  The tail is then
 * __napi_poll()'s for a full budget (kbp_napi_repoll(): napi_disable()
 * pending, busy-poll preference, detach), after flushing every GRO packet:
 * the NAPI now waits a whole interval.
 */
static int kbp_poll_napi(struct kbp_poller *p, const struct kbp_mode_ops *ops,
			 struct kbp_napi *kn, bool *more, bool *held)
{
	struct napi_struct *n = kn->napi;
	int budget = min_t(int, READ_ONCE(p->quota), n->weight);
	bool hold = false, handback = false, kept = false;
	struct kbp_bpf_ctx bpf_ctx;
	int work = 0;
	void *have;

	if (budget <= 0)
		budget = 1;
	kbp_bpf_ctx_set(&bpf_ctx);
	have = netpoll_poll_lock(n);

	if (test_bit(NAPI_STATE_SCHED, &n->state)) {
		if (ops->holds) {
			hold = kbp_may_hold(p, kn, n);
			handback = !hold;
		}
		if (hold)
			set_bit(NAPI_STATE_IN_BUSY_POLL, &n->state);
		work = n->poll(n, budget);
		if (hold)
			clear_bit(NAPI_STATE_IN_BUSY_POLL, &n->state);
		trace_napi_poll(n, work, budget);
	}
	if (unlikely(work > budget))
		netdev_err_once(n->dev, "kbp: NAPI poll %pS returned %d, over its budget %d\n",
				n->poll, work, budget);
	if (work >= budget) {
		if (kbp_napi_repoll(kn, n, work))
			*more = true;
	} else if (hold) {
		kbp_gro_flush(n, false);
		kept = kbp_napi_repoll(kn, n, work);
		*held |= kept;
	}
	if (ops->holds) {
		/* written only here, by this thread */
		kn->idle = work ? 0 : (hold ? kn->idle + 1 : 0);
		kn->held = kept;
		if (handback)
			kbp_stat_add(p, &p->handbacks, 1);
	}

	netpoll_poll_unlock(have);
	kbp_bpf_ctx_clear(&bpf_ctx);

	u64_stats_update_begin(&kn->syncp);
	u64_stats_add(&kn->packets, work);
	u64_stats_inc(&kn->polls);
	u64_stats_update_end(&kn->syncp);
	clear_bit_unlock(KBP_NAPI_POLLING, &kn->flags);
	return work;
}

/*
 * The next NAPI of this pass to poll, claimed: KBP_NAPI_POLLING set and a
 * reference held, or NULL when every link has been looked at.  The list is
 * walked from its head each time under a short RCU read-side section, and a
 * link is looked at once per pass (@pass): the poll itself runs outside the
 * section, so the walk cannot resume from a link that may have been unlinked
 * meanwhile.  A poller preempted in a poll (7.2's PREEMPT_LAZY default makes
 * local_bh_enable() a preemption point) is then no RCU reader, and a task
 * that hogs its CPU does not stall grace periods nor a detach's
 * synchronize_rcu() (docs/design.md section 7).
 */
static struct kbp_napi *kbp_pass_next(struct kbp_poller *p, unsigned int pass)
{
	struct kbp_napi *kn, *ret = NULL;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (kn->pass == pass)
			continue;
		kn->pass = pass;
		if (!kbp_owns(kn->napi))
			continue;
		if (test_and_set_bit_lock(KBP_NAPI_POLLING, &kn->flags))
			continue;	/* taken back by a detach */
		if (!refcount_inc_not_zero(&kn->ref)) {
			clear_bit_unlock(KBP_NAPI_POLLING, &kn->flags);
			continue;	/* being freed */
		}
		ret = kn;
		break;
	}
	rcu_read_unlock();
	return ret;
}

void kbp_napi_put(struct kbp_napi *kn)
{
	if (refcount_dec_and_test(&kn->ref))
		kfree_rcu(kn, rcu);
}

/*
 * One round-robin pass: each owned NAPI gets up to one quota, with bh
 * disabled around the poll and the protocol processing it drives (the
 * papers' conflict control).  Each poll holds KBP_NAPI_POLLING: a detach that
 * takes a NAPI back from a poller that cannot run (kbp_poller_release())
 * claims the same bit, so the two never poll one NAPI at once, and the
 * counters of a NAPI are final once the bit is seen clear with SCHED_THREADED
 * clear.  The claim is taken and released inside the bh-disabled section:
 * local_bh_enable() is a preemption point under the full and lazy preemption
 * models (7.2's default), and a poller preempted there by a task that then
 * hogs its CPU must hold no claim that keeps a detach waiting.  Outside
 * PREEMPT_RT nothing between the claim and its release can be preempted.
 */
static int kbp_pass(struct kbp_poller *p, const struct kbp_mode_ops *ops,
		    bool *more, bool *held)
{
	const struct kbp_class_ops *cls = p->cls;
	unsigned int pass = ++p->pass;
	struct kbp_napi *kn;
	int work = 0;
	u64 t0;

	if (unlikely(!pass))	/* 0 is a new link's */
		pass = ++p->pass;
	for (;;) {
		t0 = local_clock();
		local_bh_disable();
		kn = kbp_pass_next(p, pass);
		if (kn)
			work += kbp_poll_napi(p, ops, kn, more, held);
		local_bh_enable();
		if (!kn)
			return work;
		kbp_napi_put(kn);
		kbp_stat_add(p, &p->poll_ns, local_clock() - t0);
		cls->after_poll(p);
	}
}

static bool kbp_has_work(struct kbp_poller *p)
{
	struct kbp_napi *kn;
	bool ret = false;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (kbp_owns(kn->napi)) {
			ret = true;
			break;
		}
	}
	rcu_read_unlock();
	return ret;
}

/*
 * periodic: a NAPI scheduled after its poll in this pass (owned, not kept
 * scheduled by the poll): its interrupt is unmasked and its schedule's
 * wake-up may have come before the sleep's set_current_state(), so the
 * timed sleep must not wait the interval for it.
 */
static bool kbp_has_unheld_work(struct kbp_poller *p)
{
	struct kbp_napi *kn;
	bool ret = false;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (!kn->held && kbp_owns(kn->napi)) {
			ret = true;
			break;
		}
	}
	rcu_read_unlock();
	return ret;
}

/*
 * The sleep predicate.  Any poller sleeps when it serves no NAPI (device
 * down, standby) or has been pushed off its CPU by hotplug (the reconcile
 * work then hands its NAPIs back); otherwise its mode decides
 * (ops->may_sleep), unless a NAPI used its whole budget.
 */
static bool kbp_may_sleep(struct kbp_poller *p, const struct kbp_mode_ops *ops,
			  bool more, u64 now, u64 last_work)
{
	if (more)
		return false;
	if (list_empty(&p->napis) || kbp_off_home(p))
		return true;
	return ops->may_sleep(p, now, last_work);
}

/* Still nothing to do, checked after set_current_state() (pairs with wakers). */
static bool kbp_still_idle(struct kbp_poller *p)
{
	if (kbp_should_exit(p) || kbp_has_work(p))
		return false;
	/*
	 * Overtaken while it could not run (kbp_poller_wait_released()): the
	 * loop's top clears the bit so kbp_pollers_gc() may stop us.  Under the
	 * full and lazy preemption models the poller is preempted inside a
	 * pass, not at its end, and came here straight from it.
	 */
	if (test_bit(KBP_POLLER_STUCK, &p->flags))
		return false;
	/* a busy poller that kbp_poller_add_napi() gave a NAPI spins again */
	return READ_ONCE(p->ops)->sleeps || list_empty(&p->napis) ||
	       kbp_off_home(p);
}

/*
 * The time this thread has spent runnable but not running, as the scheduler
 * accounts it (sched_info.run_delay, /proc/PID/schedstat's second field;
 * every Debian kernel has CONFIG_SCHED_INFO).  Across a sleep it grows by the
 * wake-up's delay: from the wake-up (enqueue) to running.
 */
static u64 kbp_run_delay(void)
{
#ifdef CONFIG_SCHED_INFO
	return current->sched_info.run_delay;
#else
	return 0;
#endif
}

/* Account a wake-up's delay (@rd0: kbp_run_delay() before the sleep). */
static void kbp_wake_delay(struct kbp_poller *p, u64 rd0)
{
	u64 d = kbp_run_delay() - rd0;

	u64_stats_update_begin(&p->syncp);
	u64_stats_add(&p->wake_delay_ns, d);
	if (d > p->wake_delay_max_ns)
		WRITE_ONCE(p->wake_delay_max_ns, d);
	u64_stats_update_end(&p->syncp);
}

/*
 * Sleep until woken: by the hardIRQ path (____napi_schedule()), a knob
 * change, a new NAPI or kthread_stop().  KBP_SLEEP_STATE: see its comment.
 * @sleeps counts every sleep, @wakeups those that ended with work to do.
 */
static void kbp_sleep(struct kbp_poller *p)
{
	bool woke;
	u64 t0, rd0;

	set_current_state(KBP_SLEEP_STATE);
	/* pairs with set_bit(SCHED_THREADED) + wake_up_process() in ____napi_schedule() */
	if (!kbp_still_idle(p)) {
		__set_current_state(TASK_RUNNING);
		return;
	}
	t0 = local_clock();
	rd0 = kbp_run_delay();
	schedule();
	__set_current_state(TASK_RUNNING);
	kbp_wake_delay(p, rd0);
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
 * a stop ends it early.
 */
static void kbp_sleep_ns(struct kbp_poller *p, u64 ns)
{
	ktime_t t = ns_to_ktime(ns);

	set_current_state(KBP_SLEEP_STATE);
	if (kbp_should_exit(p)) {
		__set_current_state(TASK_RUNNING);
		return;
	}
	schedule_hrtimeout(&t, HRTIMER_MODE_REL);
}

static void kbp_yield(struct kbp_poller *p)
{
	kbp_sleep_ns(p, KBP_YIELD_NS);
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
static void kbp_nap(struct kbp_poller *p)
{
	unsigned long end = jiffies + 2;

	for (;;) {
		set_current_state(KBP_SLEEP_STATE);
		if (kbp_should_exit(p) || !time_before(jiffies, end))
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
	kbp_sleep_ns(p, NSEC_PER_USEC);
#else
	kbp_nap(p);
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

/* --- the modes ---------------------------------------------------------- */

static bool kbp_never(struct kbp_poller *p, u64 now, u64 last_work)
{
	return false;
}

static bool kbp_always(struct kbp_poller *p, u64 now, u64 last_work)
{
	return true;
}

/* hybrid (Algorithm 1 of EE-KBP, plus linger) */
static bool kbp_lingered(struct kbp_poller *p, u64 now, u64 last_work)
{
	u64 linger = (u64)READ_ONCE(p->linger_us) * NSEC_PER_USEC;

	return now - last_work >= linger;
}

static void kbp_wait_woken(struct kbp_poller *p, bool held)
{
	kbp_sleep(p);
}

/*
 * periodic: with a NAPI held, sleep the interval on an hrtimer (zero slack,
 * as kbp_sleep_ns()); a NAPI schedule of an unheld NAPI, a knob change or
 * kthread_stop() end it early.  The held NAPIs stay ours meanwhile (they
 * are "work", so kbp_sleep() would not sleep).  With nothing held, sleep
 * until woken, as hybrid does.  Timed sleeps count in @sleeps and
 * @sleep_ns; @wakeups stays the count of sleeps ended by an interrupt.
 */
static void kbp_wait_interval(struct kbp_poller *p, bool held)
{
	ktime_t t;
	u64 t0, rd0;

	if (!held) {
		kbp_sleep(p);
		return;
	}
	t = ns_to_ktime((u64)p->cur_interval_us * NSEC_PER_USEC);
	set_current_state(KBP_SLEEP_STATE);
	/* pairs with set_bit(SCHED_THREADED) + wake_up_process(), as kbp_sleep() */
	if (kbp_should_exit(p) || test_bit(KBP_POLLER_STUCK, &p->flags) ||
	    kbp_has_unheld_work(p)) {
		__set_current_state(TASK_RUNNING);
		return;
	}
	t0 = local_clock();
	rd0 = kbp_run_delay();
	schedule_hrtimeout(&t, HRTIMER_MODE_REL);
	kbp_wake_delay(p, rd0);
	u64_stats_update_begin(&p->syncp);
	u64_stats_inc(&p->sleeps);
	u64_stats_add(&p->sleep_ns, local_clock() - t0);
	u64_stats_update_end(&p->syncp);
}

/* periodic's merged knobs: the search's range, MinChange and MaxRound */
static int kbp_periodic_check(int cpu, const struct kbp_conf *c,
			      struct netlink_ext_ack *extack)
{
	char where[KBP_CPU_LABEL_LEN];
	const char *why = NULL;
	int err;

	err = kbp_netap_check_params(&c->np, &why);
	if (err)
		kbp_refuse(extack, "bad search parameters",
			   "%s, mode periodic: %s", kbp_cpu_label(cpu, where),
			   why ? why : "?");
	return err;
}

static const struct kbp_mode_ops kbp_modes[] = {
	{
		.mode = KBP_MODE_BUSY,
		.name = "busy",
		.no_freq_ctl = "busy never sleeps",
		.may_sleep = kbp_never,
		.wait = kbp_wait_woken,
	}, {
		.mode = KBP_MODE_HYBRID,
		.name = "hybrid",
		.sleeps = true,
		.may_sleep = kbp_lingered,
		.wait = kbp_wait_woken,
	}, {
		.mode = KBP_MODE_PERIODIC,
		.name = "periodic",
		.sleeps = true,
		.holds = true,
		.no_freq_ctl = "periodic wakes every interval_us",
		.may_sleep = kbp_always,
		.wait = kbp_wait_interval,
		.check = kbp_periodic_check,
	},
};

/* --- the classes ------------------------------------------------------- */

static void kbp_after_poll_rt(struct kbp_poller *p)
{
}

/*
 * non-rt: give the CPU away after every poll as soon as the scheduler wants
 * it back (a task woken meanwhile preempts us: the rt poller woken from the
 * hardIRQ path, or any other SCHED_FIFO task), whatever the preemption
 * model.  Under PREEMPT_NONE and VOLUNTARY nothing else would preempt a
 * kthread between polls: that is what bounds the rt poller's wait to one
 * poll of @quota packets.  Under full and lazy preemption local_bh_enable()
 * has already switched, and need_resched() is clear here.  Not
 * cond_resched(): see kbp_relax().
 */
static void kbp_give_way(struct kbp_poller *p)
{
	if (!need_resched())
		return;
	kbp_stat_add(p, &p->gave_way, 1);
	schedule();
}

/*
 * non-rt: a sleeping poller that gives way, below every rt poller: hybrid
 * only (busy would keep the CPU from SCHED_OTHER tasks for its slice,
 * periodic holds NAPIs with their IRQs masked), SCHED_NORMAL, and no
 * frequency control (the CPU's rt poller owns it).
 */
static int kbp_nonrt_check(int cpu, const struct kbp_conf *c,
			   struct netlink_ext_ack *extack)
{
	char where[KBP_CPU_LABEL_LEN];

	if (c->mode != KBP_MODE_HYBRID) {
		kbp_refuse(extack, "class non-rt is hybrid only",
			   "%s: a non-rt poller is hybrid only (it sleeps when idle and gives way to the rt poller), not %s",
			   kbp_cpu_label(cpu, where),
			   kbp_mode_ops(c->mode)->name);
		return -EINVAL;
	}
	if (c->rt_prio) {
		kbp_refuse(extack, "class non-rt runs SCHED_NORMAL",
			   "%s: a non-rt poller runs SCHED_NORMAL: rt_prio must be 0 (use nice), not %u",
			   kbp_cpu_label(cpu, where), c->rt_prio);
		return -EINVAL;
	}
	if (c->freq_ctl) {
		kbp_refuse(extack, "class non-rt has no freq_ctl",
			   "%s: freq_ctl belongs to the CPU's rt poller, not its non-rt one",
			   kbp_cpu_label(cpu, where));
		return -EINVAL;
	}
	return 0;
}

static const struct kbp_class_ops kbp_classes[KBP_NR_CLASSES] = {
	[KBP_CLASS_RT] = {
		.cls = KBP_CLASS_RT,
		.name = "rt",
		.prefix = "kbp",
		.after_poll = kbp_after_poll_rt,
	},
	[KBP_CLASS_NON_RT] = {
		.cls = KBP_CLASS_NON_RT,
		.name = "non-rt",
		.prefix = "kbpn",
		.after_poll = kbp_give_way,
		.check = kbp_nonrt_check,
	},
};

const struct kbp_class_ops *kbp_class_ops(u32 cls)
{
	return cls < KBP_NR_CLASSES ? &kbp_classes[cls] : NULL;
}

const struct kbp_mode_ops *kbp_mode_ops(u32 mode)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(kbp_modes); i++)
		if (kbp_modes[i].mode == mode)
			return &kbp_modes[i];
	return NULL;
}

const struct kbp_mode_ops *kbp_mode_ops_by_name(const char *name)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(kbp_modes); i++)
		if (!strcmp(kbp_modes[i].name, name))
			return &kbp_modes[i];
	return NULL;
}

/*
 * The objective of the periodic search (docs/design.md, "Periodic mode",
 * "The objective").  Bytes are the devices' own rx_bytes (dev_get_stats()),
 * read by the thread at the end of each round: the poller sees what a NAPI
 * poll returns (frames), never their length.  Each device the poller serves
 * counts once, whichever of its NAPIs the poller has; a device whose NAPIs
 * are split over pollers counts whole for each of them.
 *
 * The next link of @p not yet looked at in round count @gen whose device's
 * bytes are to be read, with a reference on it and on its device (@dev,
 * tracked by @tracker); NULL when none is left.  Walked from the head under
 * a short RCU read-side section, as kbp_pass_next() does (the driver's
 * ndo_get_stats64 runs in one of its own, kbp_round_bytes()).  A link's NAPI and its
 * device are valid inside the section (the driver frees a NAPI only after a
 * grace period, netif_napi_del(); the device outlives its NAPIs), and the
 * device reference keeps it for dev_get_stats() after the section.
 */
static struct kbp_napi *kbp_round_next(struct kbp_poller *p, unsigned int gen,
				       struct net_device **dev,
				       netdevice_tracker *tracker)
{
	struct kbp_napi *kn, *ret = NULL;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (kn->round_gen == gen || test_bit(KBP_NAPI_DEAD, &kn->flags))
			continue;
		if (!refcount_inc_not_zero(&kn->ref))
			continue;	/* being freed */
		*dev = READ_ONCE(kn->napi)->dev;
		netdev_hold(*dev, tracker, GFP_ATOMIC);
		ret = kn;
		break;
	}
	rcu_read_unlock();
	return ret;
}

/*
 * Every link of @dev on @p now has the baseline @rx of round count @gen: the
 * device was counted once, through @first.  When @first goes, another link
 * of the device carries the baseline on.  @dev is held by the caller, so a
 * link that names it names this device.
 */
static void kbp_round_share(struct kbp_poller *p, struct kbp_napi *first,
			    struct net_device *dev, unsigned int gen, u64 rx)
{
	struct kbp_napi *kn;

	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node) {
		if (kn == first || kn->round_gen == gen ||
		    test_bit(KBP_NAPI_DEAD, &kn->flags) ||
		    READ_ONCE(kn->napi)->dev != dev)
			continue;
		kn->round_gen = gen;
		kn->round_rx_bytes = rx;
	}
	rcu_read_unlock();
}

/*
 * Bytes @kn's device received since the last round's count (@prev): 0 the
 * first time a link is counted (it has no baseline: a device appears in the
 * round after the one it came in), or when the counter went back (a driver
 * that reset its statistics).  The counters are u64 in struct
 * rtnl_link_stats64, but a driver that keeps them in net_device_stats
 * (unsigned long) wraps them at 2^32 on a 32-bit kernel: there a counter
 * that went back from a 32-bit value is taken to have wrapped once.
 */
static u64 kbp_round_delta(struct kbp_napi *kn, unsigned int prev, u64 rx)
{
	u64 base = kn->round_rx_bytes;

	if (!kn->round_gen || kn->round_gen != prev)
		return 0;
	if (rx >= base)
		return rx - base;
	if (BITS_PER_LONG == 32 && base <= U32_MAX)
		return (u32)((u32)rx - (u32)base);
	return 0;
}

/*
 * The bytes @p's devices received since the last call (the last round's
 * end), each device counted once; every link then holds its device's
 * rx_bytes as the next round's baseline.  Thread only, process context,
 * nothing held.
 */
static u64 kbp_round_bytes(struct kbp_poller *p)
{
	unsigned int prev = p->round_gen, gen = prev + 1;
	struct rtnl_link_stats64 st;
	netdevice_tracker tracker;
	struct net_device *dev;
	struct kbp_napi *kn;
	u64 bytes = 0;

	if (!gen)		/* 0 is a new link's */
		gen = 1;
	p->round_gen = gen;
	while ((kn = kbp_round_next(p, gen, &dev, &tracker))) {
		/*
		 * Not once unregistering has begun: the driver's stats may be
		 * gone after its ndo_uninit().  unregister_netdevice_many()
		 * marks the device, then waits for a grace period, then calls
		 * ndo_uninit(): a reader that saw it registered inside this
		 * section is done by then.  /proc/net/dev calls
		 * ndo_get_stats64() inside an RCU section too.
		 */
		memset(&st, 0, sizeof(st));
		rcu_read_lock();
		if (READ_ONCE(dev->reg_state) == NETREG_REGISTERED)
			dev_get_stats(dev, &st);
		else
			st.rx_bytes = kn->round_rx_bytes;	/* no change */
		rcu_read_unlock();
		bytes += kbp_round_delta(kn, prev, st.rx_bytes);
		kn->round_gen = gen;
		kn->round_rx_bytes = st.rx_bytes;
		kbp_round_share(p, kn, dev, gen, st.rx_bytes);
		netdev_put(dev, &tracker);
		kbp_napi_put(kn);
	}
	return bytes;
}

/*
 * CPU time of the calling thread (the poller), ns.  sum_exec_runtime is
 * brought up to date at every context switch and tick; the thread reads its
 * own at the end of a pass, right after a wakeup, so the part of the current
 * slice not yet added is one pass at most, and it is counted in the next
 * round.  A u64 load may tear on a 32-bit kernel while the tick (or a remote
 * task_sched_runtime()) updates it: read until two loads agree.
 */
static u64 kbp_thread_cpu_ns(void)
{
	const u64 *rt = &current->se.sum_exec_runtime;
	u64 a, b = READ_ONCE(*rt);

	if (BITS_PER_LONG == 64)
		return b;
	do {
		a = b;
		b = READ_ONCE(*rt);
	} while (a != b);
	return a;
}

/*
 * @bytes per second of @cpu_ns: bytes * NSEC_PER_SEC / cpu_ns without
 * overflow, in integers (div64_u64(): no 64-bit division helper on 32-bit
 * kernels).  0 without CPU time (cannot happen: the round's own pass ran);
 * U64_MAX where the quotient does not fit.
 */
static u64 kbp_per_cpu_sec(u64 bytes, u64 cpu_ns)
{
	u64 q, r;

	if (!cpu_ns)
		return 0;
	q = div64_u64_rem(bytes, cpu_ns, &r);
	if (q > U64_MAX / NSEC_PER_SEC)
		return U64_MAX;
	q *= NSEC_PER_SEC;
	/* r < cpu_ns: r * NSEC_PER_SEC fits unless the round used > 18 s */
	if (r <= U64_MAX / NSEC_PER_SEC)
		r = div64_u64(r * NSEC_PER_SEC, cpu_ns);
	else
		r = div64_u64(r, div64_u64(cpu_ns, NSEC_PER_SEC));
	return q > U64_MAX - r ? U64_MAX : q + r;
}

/* A new round begins at @now: the baselines of its bytes and CPU time. */
static void kbp_round_begin(struct kbp_poller *p, u64 now)
{
	p->round_start = now;
	kbp_round_bytes(p);
	p->round_cpu_ns = kbp_thread_cpu_ns();
}

/*
 * The interval of the next periodic sleep, and the search's rounds (thread
 * only; @netap_lock for what replies read).  Called after every pass of a
 * mode that holds NAPIs: a round ends at the first pass after round_ms, with
 * the search's objective (bytes, or bytes per CPU-second) of the round as
 * its value (docs/netap.md).  The search (re)starts when netap is turned on,
 * the mode becomes periodic, or its parameters or objective change
 * (kbp_poller_apply() sets @search_restart).
 */
static void kbp_search_start(struct kbp_poller *p, u64 now)
{
	struct kbp_netap_params np;

	spin_lock(&p->netap_lock);
	np = p->np;
	p->search_restart = false;
	/* validated under kbp_lock; the defaults if that ever failed */
	if (kbp_netap_init(&p->search, &np)) {
		kbp_netap_default_params(&np);
		kbp_netap_init(&p->search, &np);
	}
	p->search_on = true;
	p->search_rounds = 0;
	p->search_objective = p->objective;
	p->search_last = 0;
	p->search_last_bytes = 0;
	p->search_last_cpu_ns = 0;
	p->cur_interval_us = p->search.interval_us;
	spin_unlock(&p->netap_lock);
	kbp_round_begin(p, now);
}

static void kbp_periodic_account(struct kbp_poller *p, u64 now)
{
	u64 len, bytes, cpu, cpu_ns, value;

	if (!READ_ONCE(p->netap)) {
		if (p->search_on) {
			spin_lock(&p->netap_lock);
			p->search_on = false;
			spin_unlock(&p->netap_lock);
		}
		p->cur_interval_us = READ_ONCE(p->interval_us);
		return;
	}
	if (!p->search_on || READ_ONCE(p->search_restart)) {
		kbp_search_start(p, now);
		return;
	}
	len = (u64)READ_ONCE(p->round_ms) * NSEC_PER_MSEC;
	if (now - p->round_start < len)
		return;
	bytes = kbp_round_bytes(p);
	cpu = kbp_thread_cpu_ns();
	/* the same task since kbp_round_begin(): a respawn begins a round */
	cpu_ns = cpu - p->round_cpu_ns;
	p->round_cpu_ns = cpu;
	/* written by this thread only, in kbp_search_start() */
	if (p->search_objective == KBP_OBJECTIVE_BYTES_PER_CPU)
		value = kbp_per_cpu_sec(bytes, cpu_ns);
	else
		value = bytes;
	spin_lock(&p->netap_lock);
	p->search_last = value;
	p->search_last_bytes = bytes;
	p->search_last_cpu_ns = cpu_ns;
	p->cur_interval_us = kbp_netap_round(&p->search, value);
	p->search_rounds++;
	spin_unlock(&p->netap_lock);
	p->round_start = now;
}

static bool kbp_poller_respawn(struct kbp_poller *p);

/* Until kbp_poller_add_napi() gives us a NAPI (it wakes us after adding). */
static void kbp_wait_first_napi(struct kbp_poller *p)
{
	for (;;) {
		set_current_state(KBP_SLEEP_STATE);
		if (kbp_should_exit(p) || !list_empty(&p->napis))
			break;
		schedule();
	}
	__set_current_state(TASK_RUNNING);
}

/*
 * Another poller of this CPU and class, another device's, owns a scheduled
 * NAPI: it is runnable at our priority.  The pollers of one CPU and class
 * take turns pass by pass (kbp_take_turns()), as one poller serving both
 * devices did.  A hint: read under RCU as kbp_has_work() reads our own list
 * (links and pollers are freed after a grace period).
 */
static bool kbp_sibling_has_work(struct kbp_poller *p)
{
	struct list_head *slot = &kbp_slots[kbp_slot(p->cpu, p->cls->cls)];
	struct kbp_poller *q;
	struct kbp_napi *kn;
	bool ret = false;

	rcu_read_lock();
	list_for_each_entry_rcu(q, slot, slot_node) {
		struct task_struct *t = READ_ONCE(q->task);

		if (q == p || !t)
			continue;
		list_for_each_entry_rcu(kn, &q->napis, poll_node) {
			struct napi_struct *n = kn->napi;

			if (test_bit(NAPI_STATE_SCHED_THREADED, &n->state) &&
			    READ_ONCE(n->thread) == t) {
				ret = true;
				goto out;
			}
		}
	}
out:
	rcu_read_unlock();
	return ret;
}

/*
 * After a pass with work: let a sibling with work run its pass before our
 * next one.  A SCHED_FIFO thread is not preempted by an equal-priority one,
 * and ours do not sleep while they have work, so without this a loaded
 * device would keep its CPU from another's for up to KBP_SLICE_NS.  The
 * poller sleeps until the sibling's pass is over (kbp_end_turn() wakes it),
 * at most KBP_YIELD_NS; its own NAPIs stay scheduled, and it polls them
 * right after.  TURN is set after the sleep state, so the sibling's
 * wake-up cannot be lost.
 */
static void kbp_take_turns(struct kbp_poller *p)
{
	ktime_t t = ns_to_ktime(KBP_YIELD_NS);

	if (!kbp_sibling_has_work(p))
		return;
	set_current_state(KBP_SLEEP_STATE);
	set_bit(KBP_POLLER_TURN, &p->flags);
	smp_mb__after_atomic();	/* TURN before the look; pairs with kbp_end_turn() */
	if (!kbp_should_exit(p) && kbp_sibling_has_work(p)) {
		kbp_stat_add(p, &p->yields, 1);
		schedule_hrtimeout(&t, HRTIMER_MODE_REL);
	}
	__set_current_state(TASK_RUNNING);
	clear_bit(KBP_POLLER_TURN, &p->flags);
}

/*
 * A pass is over: wake the siblings waiting for their turn.  Their
 * threads' task_structs are freed a grace period after the reaper lets go
 * of them (kbp_threads_reap()), so reading ->task under RCU is safe.
 */
static void kbp_end_turn(struct kbp_poller *p)
{
	struct list_head *slot = &kbp_slots[kbp_slot(p->cpu, p->cls->cls)];
	struct kbp_poller *q;
	bool first = true;

	rcu_read_lock();
	list_for_each_entry_rcu(q, slot, slot_node) {
		struct task_struct *t;

		if (q == p)
			continue;
		if (first) {	/* the pass's work before the looks at TURN */
			smp_mb();
			first = false;
		}
		if (!test_bit(KBP_POLLER_TURN, &q->flags))
			continue;
		t = READ_ONCE(q->task);
		if (t)
			wake_up_process(t);
	}
	rcu_read_unlock();
}

/* The poller thread: small loop, every decision a named predicate above. */
static int kbp_poller_fn(void *data)
{
	struct kbp_thread *thr = data;
	struct kbp_freq freq = {};
	struct kbp_poller *p;
	u64 last_work, contended = 0;

	/*
	 * Given up by kbp_thread_spawn() before it ran: nothing knows this
	 * thread, and its poller may be gone.
	 */
	if (atomic_cmpxchg(&thr->state, KBP_THREAD_NEW,
			   KBP_THREAD_RUNNING) != KBP_THREAD_NEW)
		kthread_complete_and_exit(&thr->exited, 0);
	p = thr->poller;
	complete(&thr->started);	/* kbp_thread_spawn() may publish us now */
	kbp_freq_thread_start(p, &freq);
	/* a new poller: no NAPI yet (a respawned one has them), not a sleep */
	kbp_wait_first_napi(p);

	last_work = local_clock();
	/* a respawned thread: its CPU time starts from 0, so does a round */
	if (p->search_on)
		kbp_round_begin(p, last_work);

	while (!kbp_should_exit(p)) {
		const struct kbp_mode_ops *ops = READ_ONCE(p->ops);
		bool more = false, held = false;
		int work;
		u64 now;

		if (unlikely(test_bit(KBP_POLLER_STUCK, &p->flags))) {
			/* running again: it may take NAPIs again */
			clear_bit(KBP_POLLER_STUCK, &p->flags);
			kbp_reconcile_soon();
		}
		kbp_freq_pass(p, &freq);
		work = kbp_pass(p, ops, &more, &held);
		now = local_clock();
		if (ops->holds)
			kbp_periodic_account(p, now);

		u64_stats_update_begin(&p->syncp);
		u64_stats_inc(&p->passes);
		if (work)
			u64_stats_add(&p->packets, work);
		else
			u64_stats_inc(&p->empty_passes);
		u64_stats_update_end(&p->syncp);

		kbp_end_turn(p);
		if (work) {
			last_work = now;
			kbp_take_turns(p);
		}
		if (kbp_may_sleep(p, ops, more, now, last_work)) {
			/* the last look before paying for a frequency change */
			if (!kbp_has_work(p))
				kbp_freq_sleep(p, &freq);
			ops->wait(p, held);
			contended = 0;
		} else if (kbp_should_yield(work || more, now, &contended)) {
			kbp_yield(p);
			contended = 0;
		} else {
			kbp_relax(p);
		}
	}

	kbp_freq_thread_exit(p, &freq);
	/*
	 * Stopped by the kernel (not by kbp: no STOPPING): start a thread to
	 * take over.  Either way, no code of kbp's runs on this thread after
	 * @exited completes: module exit and the reaper wait for it.
	 */
	if (kbp_poller_respawn(p))
		synchronize_rcu();	/* no hardIRQ path still wakes us */
	kbp_reconcile_soon();		/* the reaper: our exit, our poller */
	kthread_complete_and_exit(&thr->exited, 0);
}

static int kbp_apply_prio(struct task_struct *t, u32 rt_prio, s32 nice)
{
	struct sched_attr attr = {
		.size = sizeof(attr),
		.sched_policy = rt_prio ? SCHED_FIFO : SCHED_NORMAL,
		.sched_priority = rt_prio,
		.sched_nice = rt_prio ? 0 : nice,
	};

	return sched_setattr_nocheck(t, &attr);
}

#define KBP_START_WAIT	HZ

/* Every thread record; see struct kbp_thread. */
static LIST_HEAD(kbp_threads);
static DEFINE_SPINLOCK(kbp_threads_lock);

/*
 * A new thread for @p, running: it is published (in napi->thread or
 * p->task) only once it has run, since kthread() skips the thread function
 * of a thread stopped before its first run, and such a thread would neither
 * poll, nor respawn, nor complete its exit, and a driver deleting a NAPI
 * without rtnl may kthread_stop() whatever napi->thread says at any time.
 * Bounded: a CPU that a higher-priority task hogs may not run it soon, and
 * the caller may hold rtnl.  A thread that has not run within KBP_START_WAIT
 * is given up (-EBUSY): when it runs at last it sees KBP_THREAD_ABANDONED
 * and exits without touching @p.
 */
static struct kbp_thread *kbp_thread_spawn(struct kbp_poller *p)
{
	struct kbp_thread *thr;
	struct task_struct *t;
	int err;

	thr = kzalloc(sizeof(*thr), GFP_KERNEL);
	if (!thr)
		return ERR_PTR(-ENOMEM);
	thr->poller = p;
	atomic_set(&thr->state, KBP_THREAD_NEW);
	init_completion(&thr->started);
	init_completion(&thr->exited);
	t = kthread_create_on_node(kbp_poller_fn, thr, cpu_to_node(p->cpu),
				   "%s", p->name);
	if (IS_ERR(t)) {
		kfree(thr);
		return ERR_CAST(t);
	}
	kthread_bind(t, p->cpu);
	err = kbp_apply_prio(t, READ_ONCE(p->rt_prio), READ_ONCE(p->nice));
	if (err)
		pr_warn("kbp: %s: cannot set rt_prio %u nice %d: %d\n", t->comm,
			READ_ONCE(p->rt_prio), READ_ONCE(p->nice), err);
	get_task_struct(t);
	thr->task = t;
	spin_lock(&kbp_threads_lock);
	list_add_tail(&thr->node, &kbp_threads);
	spin_unlock(&kbp_threads_lock);

	wake_up_process(t);
	if (!wait_for_completion_timeout(&thr->started, KBP_START_WAIT) &&
	    atomic_cmpxchg(&thr->state, KBP_THREAD_NEW,
			   KBP_THREAD_ABANDONED) == KBP_THREAD_NEW) {
		pr_warn("kbp: %s: new thread (pid %d) has not run within %u ms (CPU starved?): given up\n",
			p->name, t->pid,
			jiffies_to_msecs(KBP_START_WAIT));
		return ERR_PTR(-EBUSY);
	}
	return thr;
}

/*
 * A finished thread's record, if nothing may still kthread_stop() it (@all:
 * module exit, when every NAPI is back with the kernel): drop our task
 * reference.  No hardIRQ path still wakes it: its NAPIs were unhooked and a
 * grace period passed (detach), or it waited for one before exiting
 * (respawn).
 */
static bool kbp_thread_reapable(struct kbp_thread *thr, bool all)
{
	return (all || !thr->pinned) && completion_done(&thr->exited);
}

/*
 * A poller still names @thr (p->thr): the record stays, kbp_poller_exited()
 * reads it.  Its thread may finish between the reaper's look at the poller
 * (not exited: kept) and its look at the record (exited): the record then
 * goes in a later pass, after the poller.  kbp_lock held (the slot lists
 * and p->thr change under it, or under p->lock within it).
 */
static bool kbp_thread_named(struct kbp_thread *thr)
{
	struct kbp_poller *p;
	unsigned int slot;

	for (slot = 0; slot < kbp_nr_slots(); slot++)
		list_for_each_entry(p, &kbp_slots[slot], slot_node)
			if (READ_ONCE(p->thr) == thr)
				return true;
	return false;
}

static void kbp_thread_free_rcu(struct rcu_head *head)
{
	struct kbp_thread *thr = container_of(head, struct kbp_thread, rcu);

	put_task_struct(thr->task);
	kfree(thr);
}

/*
 * Free the records of threads that have exited, a grace period from now:
 * pollers of the same CPU read each other's ->task under RCU
 * (kbp_end_turn()).  Any context that sleeps.
 */
void kbp_threads_reap(bool all)
{
	struct kbp_thread *thr, *tmp;
	LIST_HEAD(done);

	spin_lock(&kbp_threads_lock);
	list_for_each_entry_safe(thr, tmp, &kbp_threads, node)
		if (kbp_thread_reapable(thr, all) && !kbp_thread_named(thr))
			list_move(&thr->node, &done);
	spin_unlock(&kbp_threads_lock);
	list_for_each_entry_safe(thr, tmp, &done, node)
		call_rcu(&thr->rcu, kbp_thread_free_rcu);
}

/*
 * Module exit: every thread ever started has left kbp's code.  Pollers are
 * all stopping by now; a thread that cannot run (a starved CPU) is waited
 * for, as kthread_stop() would.
 */
void kbp_threads_wait_all(void)
{
	struct kbp_thread *thr;

	for (;;) {
		spin_lock(&kbp_threads_lock);
		thr = list_first_entry_or_null(&kbp_threads, struct kbp_thread,
					       node);
		spin_unlock(&kbp_threads_lock);
		if (!thr)
			return;
		/*
		 * Not wait_for_completion(): it would consume the one
		 * complete(), and the reaper's completion_done() would never
		 * see this record done.
		 */
		while (!completion_done(&thr->exited))
			usleep_range(1000, 2000);
		kbp_threads_reap(true);
	}
}

/*
 * A poller for @kd's NAPIs on @cpu (class @cls), its thread running and
 * waiting for the first NAPI.  Caller holds rtnl and kbp_lock.
 */
struct kbp_poller *kbp_poller_create(int cpu, u32 cls, struct kbp_dev *kd,
				     const struct kbp_conf *conf)
{
	struct kbp_thread *thr;
	struct kbp_poller *p;

	p = kzalloc_node(sizeof(*p), GFP_KERNEL, cpu_to_node(cpu));
	if (!p)
		return ERR_PTR(-ENOMEM);
	p->cpu = cpu;
	p->cls = kbp_class_ops(cls);
	p->kd = kd;
	spin_lock_init(&p->lock);
	spin_lock_init(&p->netap_lock);
	INIT_LIST_HEAD(&p->napis);
	INIT_LIST_HEAD(&p->slot_node);
	u64_stats_init(&p->syncp);
	p->mode = conf->mode;
	p->ops = kbp_mode_ops(conf->mode);
	p->linger_us = conf->linger_us;
	p->quota = conf->quota;
	p->rt_prio = conf->rt_prio;
	p->nice = conf->nice;
	p->freq_ctl = conf->freq_ctl;
	p->interval_us = conf->interval_us;
	p->cur_interval_us = conf->interval_us;
	p->netap = conf->netap;
	p->round_ms = conf->round_ms;
	p->objective = conf->objective;
	p->np = conf->np;
	if (WARN_ON_ONCE(!p->ops || !p->cls)) {	/* validated by kbp_check_knobs() */
		kfree(p);
		return ERR_PTR(-EINVAL);
	}

	snprintf(p->name, sizeof(p->name), "%s/%d:%s", p->cls->prefix, cpu,
		 kd->dev->name);
	thr = kbp_thread_spawn(p);
	if (IS_ERR(thr)) {
		/* a given-up thread never touches @p */
		kfree(p);
		return ERR_CAST(thr);
	}
	p->thr = thr;
	p->task = thr->task;
	WRITE_ONCE(p->pid, thr->task->pid);
	kbp_freq_poller_add(cpu);
	return p;
}

/*
 * The poller's thread, with a reference (put_task_struct()), or NULL.  A
 * respawn may replace it (and drop the old one) while we look: read it
 * under p->lock.
 */
static struct task_struct *kbp_poller_task(struct kbp_poller *p)
{
	struct task_struct *t;

	spin_lock(&p->lock);
	t = p->task;
	if (t)
		get_task_struct(t);
	spin_unlock(&p->lock);
	return t;
}

/*
 * Stop @p if it is idle (no NAPI linked, no respawn running; false if
 * not): its thread exits at its next look (it never respawns once STOPPING
 * is set) and the reaper frees the poller once it has (kbp_poller_exited()).
 * Nothing waits here: a thread that cannot run must not hold up rtnl.
 * Caller holds rtnl and kbp_lock.  A thread
 * that a driver's deletion is stopping at the same time (it read the
 * thread from a NAPI kbp has just unlinked, kbp_poller_add_napi()) exits
 * once for both: the kernel's kthread_stop() waits on the thread's own exit,
 * not on ours.
 */
bool kbp_poller_stop_idle(struct kbp_poller *p)
{
	struct task_struct *t;

	/*
	 * The look at idleness and STOPPING in one section: a respawn starting
	 * between the two (the kernel stopped our thread) would otherwise meet
	 * STOPPING in the thread it starts, which exits at once and may be
	 * reaped before the respawn names it in p->thr (a use after free).
	 */
	spin_lock(&p->lock);
	if (!list_empty(&p->napis) || p->respawning) {
		spin_unlock(&p->lock);
		return false;
	}
	set_bit(KBP_POLLER_STOPPING, &p->flags);
	t = p->task;
	if (t)
		get_task_struct(t);
	spin_unlock(&p->lock);
	if (t) {
		wake_up_process(t);	/* pairs with the sleeps' looks at STOPPING */
		put_task_struct(t);
	}
	return true;
}

/* A stopping poller's thread has left kbp's code (or it had none).  kbp_lock. */
bool kbp_poller_exited(struct kbp_poller *p)
{
	return !p->thr || completion_done(&p->thr->exited);
}

/*
 * Caller holds rtnl and kbp_lock.  The thread reads the knobs locklessly
 * (READ_ONCE) and p->ops once per pass: a pass that started with the old
 * mode ends with it.  The search parameters change under p->netap_lock, with
 * a restart of the search when they, the objective, netap or the mode
 * change (the thread
 * starts it over before its next round, kbp_periodic_account()).
 */
void kbp_poller_apply(struct kbp_poller *p, const struct kbp_conf *conf)
{
	const struct kbp_mode_ops *ops = kbp_mode_ops(conf->mode);
	struct task_struct *t;

	if (WARN_ON_ONCE(!ops))		/* validated by kbp_check_knobs() */
		return;
	WRITE_ONCE(p->linger_us, conf->linger_us);
	WRITE_ONCE(p->quota, conf->quota);
	spin_lock(&p->netap_lock);
	if (conf->mode != p->mode || conf->netap != p->netap ||
	    conf->objective != p->objective ||
	    memcmp(&conf->np, &p->np, sizeof(p->np)))
		p->search_restart = true;
	p->np = conf->np;
	/* under the lock: the thread reads it with the restart (start()) */
	p->objective = conf->objective;
	spin_unlock(&p->netap_lock);
	WRITE_ONCE(p->interval_us, conf->interval_us);
	WRITE_ONCE(p->netap, conf->netap);
	WRITE_ONCE(p->round_ms, conf->round_ms);
	WRITE_ONCE(p->mode, conf->mode);
	WRITE_ONCE(p->ops, ops);
	WRITE_ONCE(p->freq_ctl, conf->freq_ctl);
	t = kbp_poller_task(p);
	if (p->rt_prio != conf->rt_prio || p->nice != conf->nice) {
		WRITE_ONCE(p->rt_prio, conf->rt_prio);
		WRITE_ONCE(p->nice, conf->nice);
		if (t)
			kbp_apply_prio(t, conf->rt_prio, conf->nice);
	}
	if (t) {
		wake_up_process(t);
		put_task_struct(t);
	}
}

/* The knobs @p runs with.  Caller holds kbp_lock (their only writer). */
void kbp_poller_conf(struct kbp_poller *p, struct kbp_conf *conf)
{
	lockdep_assert_held(&kbp_lock);
	memset(conf, 0, sizeof(*conf));
	conf->mode = p->mode;
	conf->linger_us = p->linger_us;
	conf->quota = p->quota;
	conf->rt_prio = p->rt_prio;
	conf->nice = p->nice;
	conf->freq_ctl = p->freq_ctl;
	conf->interval_us = p->interval_us;
	conf->netap = p->netap;
	conf->round_ms = p->round_ms;
	conf->objective = p->objective;
	conf->np = p->np;
}

/*
 * Point @n at @p's thread, then set THREADED (7.2: and claim the NAPI's
 * persistent config, kbp_compat.h).  p->lock held: a respawn moves
 * napi->thread of every NAPI on the list and p->task together.
 */
static void kbp_napi_point_at(struct kbp_poller *p, struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;

	lockdep_assert_held(&p->lock);
	kbp_napi_cfg_claim(&kn->cfg, n);
	WRITE_ONCE(n->thread, p->task);
	/* napi->thread before THREADED, as in dev_set_threaded() */
	smp_mb__before_atomic();
	set_bit(NAPI_STATE_THREADED, &n->state);
}

/*
 * A NAPI hooked while the softirq owns it (SCHED set, SCHED_THREADED clear:
 * it is on a softnet poll list) comes to the poller at its next
 * napi_schedule().  A load that keeps every poll at its whole budget never
 * lets it complete, so that schedule never comes and the softirq keeps the
 * NAPI for as long as the load lasts.  Ask it to let go the way the kernel's
 * busy polling does: with PREFER_BUSY_POLL set, __napi_poll() ends the next
 * full-budget poll with napi_complete_done() and napi_schedule(), which
 * (THREADED and napi->thread set) wakes the poller with SCHED_THREADED.
 * napi_complete_done() clears the bit again, whoever completes the NAPI.
 * Not while a busy-poll or netpoll user owns it (they hand it back through
 * __napi_schedule() themselves) nor while napi_disable() waits for it.  A
 * schedule between napi_schedule_prep() and ____napi_schedule() looks the
 * same for an instant: the poller then finds the bit on its own full-budget
 * poll and completes and schedules the NAPI once more (kbp_napi_repoll()),
 * which costs one wake-up.  Caller holds p->lock, under which napi->thread
 * is the poller's (kbp_napi_point_at()).
 */
static void kbp_napi_claim_from_softirq(struct kbp_poller *p,
					struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;
	unsigned long st = READ_ONCE(n->state);

	lockdep_assert_held(&p->lock);
	if (!(st & NAPIF_STATE_SCHED) || !(st & NAPIF_STATE_THREADED) ||
	    (st & (NAPIF_STATE_SCHED_THREADED | NAPIF_STATE_IN_BUSY_POLL |
		   NAPIF_STATE_NPSVC | NAPIF_STATE_PREFER_BUSY_POLL |
		   NAPIF_STATE_DISABLE)) ||
	    test_bit(KBP_NAPI_DETACHING, &kn->flags) ||
	    READ_ONCE(n->thread) != p->task)
		return;
	set_bit(NAPI_STATE_PREFER_BUSY_POLL, &n->state);
	atomic64_inc(&p->takeovers);
}

static void kbp_napi_unlink_dead(struct kbp_napi *kn);

/*
 * Caller holds rtnl, kbp_lock, the NAPI's instance lock (6.14+) and
 * rcu_read_lock(), inside which it found @kn's NAPI on dev->napi_list.  Once
 * napi->thread and THREADED are set the next napi_schedule() of this NAPI
 * wakes the poller; a schedule already queued on a softnet poll list is
 * finished by the softirq, as with dev_set_threaded(), and a NAPI a load
 * keeps there for good is asked out (kbp_napi_claim_from_softirq()).
 *
 * Before 6.14 a driver may delete the NAPI meanwhile without rtnl (a reset
 * from its own work, ice's for example).  __netif_napi_del() clears LISTED (a
 * fully ordered RMW), then reads napi->thread to stop it; we write
 * napi->thread, then read LISTED: either the deleter stops the poller, whose
 * respawn drops the link, or we see LISTED clear and drop it here, or both.
 * In that last case the deleter may stop our thread at any later time, from
 * what it read: napi->thread is left as it is (a NULL written now could meet
 * the deleter between its test of napi->thread and its use of it), the
 * thread's task_struct is kept until module exit (kbp_thread->pinned), and
 * should the poller be stopped meanwhile, its thread's one exit serves both
 * stoppers (kbp_poller_stop_idle()).  False if the NAPI is going (the link is
 * DEAD, freed by the reconcile work).
 */
bool kbp_poller_add_napi(struct kbp_poller *p, struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;
	bool ok = true;

	kn->poller = p;
	spin_lock(&p->lock);
	list_add_tail_rcu(&kn->poll_node, &p->napis);
	kbp_napi_point_at(p, kn);
	smp_mb();	/* napi->thread before LISTED; see above */
	if (!test_bit(NAPI_STATE_LISTED, &n->state)) {
		kbp_napi_clear_threaded(n);
		kbp_napi_unlink_dead(kn);
		if (p->thr)
			p->thr->pinned = true;
		ok = false;
	} else {
		kbp_napi_claim_from_softirq(p, kn);
	}
	if (p->task)
		wake_up_process(p->task);
	spin_unlock(&p->lock);
	return ok;
}

/*
 * The poller serves nothing and is not replacing its thread: kbp_pollers_gc()
 * may stop it and free it.  Caller holds rtnl and kbp_lock.
 */
bool kbp_poller_idle(struct kbp_poller *p)
{
	bool idle;

	spin_lock(&p->lock);
	idle = list_empty(&p->napis) && !p->respawning;
	spin_unlock(&p->lock);
	return idle;
}

/*
 * The reconcile work's look at a NAPI of an active device.  Caller holds
 * rtnl, kbp_lock and the NAPI's instance lock (so the kernel changes neither
 * napi->thread nor THREADED meanwhile); @kn is not DEAD.
 *  - napi->thread is the poller's, THREADED clear: a driver's
 *    napi_disable()/napi_enable() cycle cleared it (napi_enable() sets it
 *    only for dev->threaded): set it again.
 *  - napi->thread is NULL (7.2: sysfs "threaded" 0 or netlink "napi-set
 *    threaded disabled" stopped the poller on this NAPI, which respawned,
 *    and cleared napi->thread): hook it again, config claimed again.
 *  - napi->thread is another task: the kernel gave the NAPI its own
 *    kthread after stopping ours (threaded turned off, then on again).  The
 *    caller hands the device back.
 */
enum kbp_napi_check kbp_poller_check_napi(struct kbp_napi *kn)
{
	struct kbp_poller *p = kn->poller;
	struct napi_struct *n = kn->napi;
	enum kbp_napi_check ret = KBP_NAPI_OK;
	struct task_struct *t;

	spin_lock(&p->lock);
	if (test_bit(KBP_NAPI_DEAD, &kn->flags) || !p->task) {
		/* a respawn unlinked it meanwhile */
		spin_unlock(&p->lock);
		return KBP_NAPI_OK;
	}
	t = READ_ONCE(n->thread);
	if (t && t != p->task) {
		ret = KBP_NAPI_LOST;
	} else if (!t) {
		kbp_napi_point_at(p, kn);
		ret = KBP_NAPI_REHOOKED;
	} else if (!test_bit(NAPI_STATE_THREADED, &n->state)) {
		set_bit(NAPI_STATE_THREADED, &n->state);
		ret = KBP_NAPI_REPAIRED;
	}
	if (ret == KBP_NAPI_REPAIRED || ret == KBP_NAPI_REHOOKED) {
		atomic64_inc(&p->repairs);
		wake_up_process(p->task);
	}
	if (ret != KBP_NAPI_LOST)
		kbp_napi_claim_from_softirq(p, kn);
	spin_unlock(&p->lock);
	return ret;
}

/*
 * First step of a detach: no new schedule of @kn's NAPI may reach the
 * poller.  Caller holds rtnl, kbp_lock and the instance lock; @kn is not
 * DEAD.  Returns false (and marks it FOREIGN) if napi->thread is not the
 * poller's (7.2, kbp_poller_check_napi()): then its THREADED bits and its
 * thread are not ours to clear, and the poller does not poll it.
 */
bool kbp_poller_unhook_napi(struct kbp_napi *kn)
{
	struct kbp_poller *p = kn->poller;
	struct napi_struct *n = kn->napi;
	bool hooked;

	set_bit(KBP_NAPI_DETACHING, &kn->flags);
	spin_lock(&p->lock);
	hooked = !test_bit(KBP_NAPI_DEAD, &kn->flags) &&
		 READ_ONCE(n->thread) == p->task;
	if (hooked)
		kbp_napi_clear_threaded(n);
	else
		set_bit(KBP_NAPI_FOREIGN, &kn->flags);
	spin_unlock(&p->lock);
	return hooked;
}

/*
 * Caller holds rtnl, kbp_lock and the instance lock, has cleared THREADED
 * (kbp_poller_unhook_napi()), waited for an RCU grace period (no hardIRQ
 * path can still be about to wake us for this NAPI) and for the poller to
 * release the NAPI (kbp_poller_wait_released()).  Puts back the NAPI's
 * persistent config (7.2), then clears napi->thread: napi_enable() cannot run
 * in between (instance lock).  A DEAD link was unlinked by
 * kbp_poller_respawn() or kbp_poller_drop_napi() already, and its poller may
 * be gone: kbp_pollers_gc() frees a poller whose list is empty.  A link seen
 * not DEAD under kbp_lock has a live poller (gc needs kbp_lock and frees
 * only pollers with empty lists); a respawn may mark it DEAD until we hold
 * p->lock, so look again there.
 */
void kbp_poller_del_napi(struct kbp_napi *kn)
{
	struct kbp_poller *p = kn->poller;
	struct napi_struct *n = kn->napi;
	struct task_struct *t;

	if (test_bit(KBP_NAPI_DEAD, &kn->flags))
		return;
	spin_lock(&p->lock);
	if (!test_bit(KBP_NAPI_DEAD, &kn->flags)) {
		list_del_rcu(&kn->poll_node);
		t = READ_ONCE(n->thread);
		/* not a kthread the kernel gave the NAPI after stopping ours */
		if (!t || t == p->task)
			kbp_napi_cfg_release(&kn->cfg);
		/*
		 * Being deleted without rtnl (before 6.14): the deleter read,
		 * or will read, our thread; keep it (kbp_poller_add_napi()).
		 */
		if (t && t == p->task) {
			if (test_bit(NAPI_STATE_LISTED, &n->state))
				WRITE_ONCE(n->thread, NULL);
			else if (p->thr)
				p->thr->pinned = true;
		}
	}
	spin_unlock(&p->lock);
}

/* Unlink a deleted NAPI's link: DEAD, freed by the reconcile work. */
static void kbp_napi_unlink_dead(struct kbp_napi *kn)
{
	set_bit(KBP_NAPI_DEAD, &kn->flags);
	list_del_rcu(&kn->poll_node);
	/*
	 * The config array lives with the device: a NAPI the driver adds again
	 * with that config must not find kbp's "enabled" there, or
	 * napi_enable() would give it a kthread of its own.
	 */
	kbp_napi_cfg_release(&kn->cfg);
}

/*
 * @kn's NAPI was deleted (NAPI_STATE_LISTED clear) while its napi->thread was
 * not the poller, so no respawn saw it.  Caller holds rtnl, kbp_lock and
 * rcu_read_lock(), and saw @kn not DEAD inside that section.  A NAPI whose
 * napi->thread is still the poller is being deleted by a driver that does
 * it without rtnl: the deleter stops the poller, and the respawn drops the
 * link; dropping it here would empty the poller's list under a thread the
 * deleter is stopping, and kbp_pollers_gc() would stop it a second time and
 * free the poller under its respawn.
 */
void kbp_poller_drop_napi(struct kbp_napi *kn)
{
	struct kbp_poller *p = kn->poller;

	if (test_bit(KBP_NAPI_DEAD, &kn->flags))
		return;
	spin_lock(&p->lock);
	if (!test_bit(KBP_NAPI_DEAD, &kn->flags) &&
	    READ_ONCE(kn->napi->thread) != p->task)
		kbp_napi_unlink_dead(kn);
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
	if (test_and_set_bit_lock(KBP_NAPI_POLLING, &kn->flags))
		return false;
	rcu_read_lock();	/* a DEAD link's NAPI may be freed */
	if (!test_bit(KBP_NAPI_DEAD, &kn->flags) &&
	    test_and_clear_bit(NAPI_STATE_SCHED_THREADED, &kn->napi->state)) {
		local_bh_disable();
		__napi_schedule(kn->napi);
		local_bh_enable();
	}
	rcu_read_unlock();
	return true;
}

/* The poller still owns the NAPI, or is finishing a poll of it. */
static bool kbp_napi_held(struct kbp_napi *kn)
{
	bool held;

	/*
	 * A driver that deletes NAPIs without rtnl may delete this one
	 * meanwhile: its deletion stops the poller, whose respawn marks the
	 * link DEAD (and hands the NAPI on) before the driver's grace period
	 * and kfree().
	 */
	rcu_read_lock();
	held = !test_bit(KBP_NAPI_DEAD, &kn->flags) &&
	       test_bit(NAPI_STATE_SCHED_THREADED, &kn->napi->state);
	rcu_read_unlock();
	if (held)
		return true;
	smp_rmb();	/* pairs with clear_bit_unlock() in kbp_pass() */
	return test_bit(KBP_NAPI_POLLING, &kn->flags) &&
	       !test_bit(KBP_NAPI_DEAD, &kn->flags);
}

/*
 * Wait until the poller has given @kn's NAPI back (completed it, or handed it
 * to the softirq in kbp_napi_repoll()) and finished counting its last poll.
 * Caller holds rtnl and kbp_lock and has set KBP_NAPI_DETACHING, cleared
 * THREADED and waited for a grace period.  Bounded: a poller that cannot run
 * (a higher-priority task hogs its CPU) must not hang rtnl.  After
 * @deadline, one for the whole device (KBP_RELEASE_WAIT from the detach's
 * start: a NIC with 64 queues on starved pollers must not hold rtnl for
 * 64 times that), the NAPI is taken back between two polls; a poller stuck
 * inside a poll (only possible where bh-disabled code is preemptible, i.e.
 * PREEMPT_RT) is raised to the highest RT priority to finish it.
 */
void kbp_poller_wait_released(struct kbp_napi *kn, unsigned long deadline)
{
	struct kbp_poller *p = kn->poller;
	const char *name = kn->kdev->dev->name;
	struct task_struct *t = NULL;
	bool boosted = false;

	while (kbp_napi_held(kn)) {
		if (t)
			put_task_struct(t);
		t = kbp_poller_task(p);
		if (t)
			wake_up_process(t);
		if (time_after(jiffies, deadline)) {
			if (kbp_poller_release(kn)) {
				pr_warn("kbp: %s: NAPI #%u taken back from %s, which did not release it within %u ms (starved?)\n",
					name, kn->index, p->name,
					jiffies_to_msecs(KBP_RELEASE_WAIT));
				/* it takes no new NAPI until it runs again */
				set_bit(KBP_POLLER_STUCK, &p->flags);
				/* pairs with kbp_sleep()'s look at it */
				if (t)
					wake_up_process(t);
				break;
			}
			if (!boosted && t) {
				pr_warn("kbp: %s: %s is stuck in a poll of NAPI #%u; raising it to finish\n",
					name, p->name, kn->index);
				kbp_apply_prio(t, KBP_RT_PRIO_MAX, 0);
				boosted = true;
			}
		}
		usleep_range(50, 200);
	}
	if (t) {
		if (boosted)
			kbp_apply_prio(t, READ_ONCE(p->rt_prio),
				       READ_ONCE(p->nice));
		put_task_struct(t);
	}
}

/*
 * No new thread: every NAPI of the poller falls back to softirq, its links
 * DEAD; the reconcile work hooks the NAPIs again with a new poller.
 */
static void kbp_poller_respawn_failed(struct kbp_poller *p, long err)
{
	struct kbp_napi *kn, *tmp;

	pr_err("kbp: %s stopped by the kernel and cannot respawn (%ld); its NAPIs fall back to softirq\n",
	       p->name, err);
	spin_lock(&p->lock);
	list_for_each_entry(kn, &p->napis, poll_node)
		if (READ_ONCE(kn->napi->thread) == current)
			kbp_napi_clear_threaded(kn->napi);
	spin_unlock(&p->lock);
	synchronize_rcu();
	spin_lock(&p->lock);
	list_for_each_entry_safe(kn, tmp, &p->napis, poll_node) {
		struct napi_struct *n = kn->napi;

		if (READ_ONCE(n->thread) == current) {
			if (test_and_clear_bit(NAPI_STATE_SCHED_THREADED,
					       &n->state)) {
				local_bh_disable();
				__napi_schedule(n);
				local_bh_enable();
			}
			/* not one being deleted: its deleter is stopping us */
			if (test_bit(NAPI_STATE_LISTED, &n->state))
				WRITE_ONCE(n->thread, NULL);
		}
		kbp_napi_unlink_dead(kn);
	}
	set_bit(KBP_POLLER_FAILED, &p->flags);
	p->task = NULL;
	p->thr = NULL;
	WRITE_ONCE(p->pid, 0);
	spin_unlock(&p->lock);
}

/*
 * The kernel stopped our thread on @n: THREADED is clear on a NAPI that
 * still pointed at the thread, is still listed (not being deleted) and not
 * disabled.  7.2's napi_stop_kthread() (sysfs "threaded" 0, netlink
 * "napi-set threaded disabled") clears THREADED, waits for the NAPI to be
 * idle or ours, stops the thread, then clears napi->thread itself.  A NAPI
 * that napi_disable() holds (SCHED and NPSVC set, THREADED cleared; ring
 * resizes, virtio-net's refill work) is not: it keeps its link and is
 * moved to the new thread, and the reconcile work sets THREADED again once
 * napi_enable() has run (kbp_poller_check_napi()).  Nor is a NAPI being
 * deleted (LISTED clear): its link is dropped as DEAD.  On 6.x only kbp's
 * own detach clears THREADED of a listed, enabled NAPI.
 */
static bool kbp_napi_stopped_by_kernel(const struct napi_struct *n)
{
	unsigned long st = READ_ONCE(n->state);

	return !(st & NAPIF_STATE_THREADED) && (st & NAPIF_STATE_LISTED) &&
	       !(st & NAPIF_STATE_NPSVC);
}

/*
 * The kernel stopped the thread on @kn's NAPI (kbp_napi_stopped_by_kernel()),
 * or kbp's own detach cleared THREADED: no later deletion of the NAPI would
 * stop our thread, so the link must not stay on the list: drop it (the
 * reconcile work hooks the NAPI again, as a new one, and counts a repair)
 * and give a NAPI we still own to the softirq.  p->lock held.
 */
static void kbp_napi_orphan(struct kbp_napi *kn)
{
	struct napi_struct *n = kn->napi;

	if (test_and_clear_bit(NAPI_STATE_SCHED_THREADED, &n->state)) {
		local_bh_disable();
		__napi_schedule(n);
		local_bh_enable();
	}
	WRITE_ONCE(n->thread, NULL);
	if (!test_bit(KBP_NAPI_DETACHING, &kn->flags))
		set_bit(KBP_NAPI_ORPHAN, &kn->flags);
	kbp_napi_unlink_dead(kn);
}

/*
 * The thread leaves its loop.  Stopped by kbp (STOPPING): false, nothing to
 * do.  Stopped by the kernel: kthread_stop(napi->thread) from
 * __netif_napi_del() for a NAPI of our device that a driver deletes while
 * the device stays up (veth on "ethtool -K gro off", a channel change, a
 * reset; with rtnl held, or before 6.14 from a driver's own reset work
 * without it), or on 7.2 from napi_stop_kthread() (threaded NAPI turned off
 * by sysfs or netlink "napi-set") under the device's instance lock.  The
 * stopper waits for us to exit with its locks held, so take none of ours
 * that can sleep: only p->lock, which orders us against kbp's hooks and
 * unhooks (they hold it to change the list, napi->thread and p->task).
 * Start a new thread, move the NAPIs that point at us to it, drop the ones
 * that lost NAPI_STATE_LISTED, orphan the ones the kernel took
 * (kbp_napi_orphan()), and return true: the caller then exits.  Every NAPI
 * on the list is the device's own (one poller per device), and every
 * stopper of this thread holds that device's locks (rtnl, its instance
 * lock, or its driver's own reset serialisation), so no second stopper can
 * have read our thread from another NAPI meanwhile.
 */
static bool kbp_poller_respawn(struct kbp_poller *p)
{
	struct task_struct *old = current;
	struct kbp_napi *kn, *tmp;
	struct kbp_thread *thr;

	/* gc may not stop the poller meanwhile: a stopper of ours may lack rtnl */
	spin_lock(&p->lock);
	if (test_bit(KBP_POLLER_STOPPING, &p->flags)) {
		spin_unlock(&p->lock);
		return false;
	}
	p->respawning++;
	spin_unlock(&p->lock);

	thr = kbp_thread_spawn(p);
	if (IS_ERR(thr)) {
		kbp_poller_respawn_failed(p, PTR_ERR(thr));
	} else {
		spin_lock(&p->lock);
		list_for_each_entry_safe(kn, tmp, &p->napis, poll_node) {
			struct napi_struct *n = kn->napi;

			if (READ_ONCE(n->thread) == old) {
				if (kbp_napi_stopped_by_kernel(n)) {
					kbp_napi_orphan(kn);
					continue;
				}
				WRITE_ONCE(n->thread, thr->task);
			}
			/*
			 * napi->thread before LISTED; __netif_napi_del_locked()
			 * clears LISTED (a full barrier), then reads
			 * napi->thread to stop it: either we see the deletion
			 * here, or the deleter stops the new thread, whose
			 * respawn sees it.
			 */
			smp_mb();
			if (!test_bit(NAPI_STATE_LISTED, &n->state))
				kbp_napi_unlink_dead(kn);
		}
		p->thr = thr;
		p->task = thr->task;
		WRITE_ONCE(p->pid, thr->task->pid);	/* with the task it names */
		spin_unlock(&p->lock);
		atomic64_inc(&p->respawns);
		wake_up_process(thr->task);
		pr_info_ratelimited("kbp: %s replaced (pid %d -> %d) after the kernel stopped it (NAPI deleted or threaded NAPI turned off)\n",
				    p->name, old->pid, thr->task->pid);
	}
	/* the last touch of @p: gc may stop and free it from here on */
	spin_lock(&p->lock);
	p->respawning--;
	spin_unlock(&p->lock);
	return true;
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
		s->handbacks = u64_stats_read(&p->handbacks);
		s->gave_way = u64_stats_read(&p->gave_way);
		s->wake_delay_ns = u64_stats_read(&p->wake_delay_ns);
		s->wake_delay_max_ns = READ_ONCE(p->wake_delay_max_ns);
	} while (u64_stats_fetch_retry(&p->syncp, start));
	s->respawns = atomic64_read(&p->respawns);
	s->repairs = atomic64_read(&p->repairs);
	s->takeovers = atomic64_read(&p->takeovers);
}

/* A consistent copy of the search state (process context). */
void kbp_poller_read_netap(struct kbp_poller *p, struct kbp_netap_snapshot *s)
{
	spin_lock(&p->netap_lock);
	s->on = p->search_on && READ_ONCE(p->netap) &&
		READ_ONCE(p->ops)->holds;
	s->s = p->search;
	s->rounds = p->search_rounds;
	s->objective = p->search_objective;
	s->last = p->search_last;
	s->last_bytes = p->search_last_bytes;
	s->last_cpu_ns = p->search_last_cpu_ns;
	spin_unlock(&p->netap_lock);
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
