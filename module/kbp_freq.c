// SPDX-License-Identifier: GPL-2.0
/*
 * kbp freq_ctl: EE-KBP's CPU-frequency control (ee-kbp Sect. 4.2,
 * Algorithm 1 lines 2 and 13), per CPU.  With freq_ctl on for a CPU's rt
 * pollers, the CPU goes to its policy's minimum frequency when the last of
 * kbp's poller threads on it goes to sleep, and to the maximum when the
 * first wakes; the frequency kbp found comes back when freq_ctl is turned
 * off or the CPU's last poller stops.  With one poller per CPU that is the
 * paper's algorithm; with several (one per device, and the non-rt class's
 * kbpn/<cpu> beside kbp/<cpu>) no poller lowers the CPU another one is
 * polling on.
 *
 * Mechanism.  As in the paper, the CPU is governed by the "userspace"
 * governor, and kbp goes through that governor's own setspeed: exactly what a
 * write to scaling_setspeed does (policy->rwsem held for writing around
 * governor->store_setspeed()), so the governor's idea of the speed stays
 * true and the limits in scaling_min_freq/scaling_max_freq are honoured.
 * Any other governor owns the frequency: freq_ctl is refused at configure
 * time, and if the governor changes later the pollers leave the frequency
 * alone (store_setspeed is NULL) and forget what they saved.  What kbp saved
 * belongs to the policy it came from: when that policy is freed (its driver
 * unregistered), a policy notifier flags the CPU and kbp forgets it too.
 *
 * Locking.  struct kbp_cpufreq's @lock (a mutex per CPU) orders kbp's own
 * changes of the CPU's frequency and guards @saved and @low; the poller
 * threads take it in process context with nothing else held and bh enabled:
 * cpufreq may sleep (policy->rwsem, the userspace governor's mutex, the
 * driver's transition).  On the wake path (each pass) it and the rwsem are
 * only tried: a sysfs reader of the policy must not stall a poller that has
 * packets to poll, and a failed raise is retried on the next pass.  On the
 * sleep path both are waited for: the thread has nothing to poll, and a
 * lowering skipped there (a reader of scaling_cur_freq holding the rwsem,
 * as a monitoring agent does) would leave the idle CPU at its raised
 * frequency until the next wake-up, which on an idle link may never come;
 * the same wait finishes a put-back that a pass could not (freq_ctl turned
 * off).  A packet that arrives meanwhile waits for that reader's show() and
 * the change itself, as it already waited for the change.  A change of
 * freq_ctl while every poller of the CPU sleeps is made at once by the
 * request (kbp_freq_set_ctl(), under rtnl and kbp_lock), waiting likewise.
 * The restore when the CPU's last poller goes blocks too (the reaper, under
 * kbp_lock), so the operator's frequency always comes back.  No reference
 * to the policy is held between calls (a held policy would block the cpufreq
 * driver's unregistration).  Validation (kbp_freq_check) runs under rtnl and
 * kbp_lock and takes policy->rwsem for reading: order rtnl -> kbp_lock ->
 * kbp_cpufreq.lock -> policy->rwsem; cpufreq never takes the others.
 * @ctl and @pollers are written under kbp_lock; @awake is an atomic count
 * the threads keep; @gone is set by the policy notifier, which takes no
 * lock of ours, and consumed under @lock.
 */
#include <linux/cpufreq.h>
#include <linux/slab.h>

#include "kbp_priv.h"
#include "kbp_compat.h"

struct kbp_cpufreq {
	struct mutex lock;	/* see the top */
	unsigned int saved;	/* kHz before kbp's first change; 0: untouched */
	bool low;		/* lowered for a sleep, not raised since */
	bool ctl;		/* the CPU's rt pollers run freq_ctl (kbp_lock) */
	atomic_t awake;		/* poller threads of the CPU not asleep */
	unsigned int pollers;	/* pollers on the CPU (kbp_lock) */
	atomic_t gone;		/* the policy went away since @saved (notifier) */
};

static struct kbp_cpufreq *kbp_cpufreq;	/* [nr_cpu_ids] */

enum kbp_freq_target { KBP_FREQ_MIN, KBP_FREQ_MAX, KBP_FREQ_SAVED };

/* The policy's governor takes a speed from us (userspace); policy->rwsem held. */
static bool kbp_freq_settable(struct cpufreq_policy *pol)
{
	return pol->governor && pol->governor->store_setspeed;
}

/*
 * Set @cpu's frequency through the userspace governor; false if not done.
 * @c->lock held.  The change counts in @p's freq_changes (none for NULL).
 */
static bool kbp_freq_set(struct kbp_poller *p, int cpu, struct kbp_cpufreq *c,
			 enum kbp_freq_target to, bool block)
{
	struct cpufreq_policy *pol = cpufreq_cpu_get(cpu);
	unsigned int khz;
	bool done = false;

	lockdep_assert_held(&c->lock);
	if (atomic_xchg(&c->gone, 0)) {
		/* saved from a policy that is gone: not ours to restore */
		WRITE_ONCE(c->saved, 0);
		WRITE_ONCE(c->low, false);
	}
	if (!pol || (to == KBP_FREQ_SAVED && !c->saved))
		goto out;
	if (block)
		down_write(&pol->rwsem);
	else if (!down_write_trylock(&pol->rwsem))
		goto out;

	if (policy_is_inactive(pol) || !kbp_freq_settable(pol)) {
		WRITE_ONCE(c->saved, 0);	/* not ours to restore any more */
		WRITE_ONCE(c->low, false);
		goto unlock;
	}
	if (!c->saved)
		WRITE_ONCE(c->saved, pol->cur);
	khz = to == KBP_FREQ_MIN ? pol->min :
	      to == KBP_FREQ_MAX ? pol->max : c->saved;
	if (pol->cur == khz) {
		done = true;
		goto unlock;
	}
	if (pol->governor->store_setspeed(pol, khz) == 0) {
		done = true;
		if (p) {
			u64_stats_update_begin(&p->syncp);
			u64_stats_inc(&p->freq_changes);
			u64_stats_update_end(&p->syncp);
		}
	}
unlock:
	up_write(&pol->rwsem);
out:
	if (pol)
		cpufreq_cpu_put(pol);
	return done;
}

/* Put back the frequency kbp found; @c->lock held. */
static void kbp_freq_put_back(struct kbp_poller *p, int cpu,
			      struct kbp_cpufreq *c, bool block)
{
	if (c->saved && kbp_freq_set(p, cpu, c, KBP_FREQ_SAVED, block)) {
		WRITE_ONCE(c->saved, 0);
		WRITE_ONCE(c->low, false);
	}
}

/*
 * A policy is freed (its driver unregistered, or its last CPU removed):
 * the frequency kbp saved from it means nothing to the policy a driver
 * registers next, which starts at its own.  Only flagged here, with no lock
 * taken in the cpufreq core's context: the next change under @c->lock
 * forgets @saved and @low (kbp_freq_set()).  Without this, a poller asleep
 * while the driver was replaced "restored" the old policy's frequency at
 * detach, over the operator's new one.
 */
static int kbp_freq_policy_event(struct notifier_block *nb,
				 unsigned long event, void *data)
{
	struct cpufreq_policy *pol = data;
	unsigned int cpu;

	if (event != CPUFREQ_REMOVE_POLICY)
		return NOTIFY_DONE;
	for_each_cpu(cpu, pol->related_cpus)
		if (cpu < nr_cpu_ids)
			atomic_set(&kbp_cpufreq[cpu].gone, 1);
	return NOTIFY_OK;
}

static struct notifier_block kbp_freq_policy_nb = {
	.notifier_call = kbp_freq_policy_event,
};

/* cpufreq.off=1: no policy will ever exist, so none can go away. */
static bool kbp_freq_notified;

int kbp_freq_init(void)
{
	unsigned int cpu;
	int err;

	kbp_cpufreq = kcalloc(nr_cpu_ids, sizeof(*kbp_cpufreq), GFP_KERNEL);
	if (!kbp_cpufreq)
		return -ENOMEM;
	for (cpu = 0; cpu < nr_cpu_ids; cpu++) {
		mutex_init(&kbp_cpufreq[cpu].lock);
		atomic_set(&kbp_cpufreq[cpu].awake, 0);
		atomic_set(&kbp_cpufreq[cpu].gone, 0);
	}
	err = cpufreq_register_notifier(&kbp_freq_policy_nb,
					CPUFREQ_POLICY_NOTIFIER);
	if (err && err != -EINVAL) {	/* -EINVAL: cpufreq disabled */
		kfree(kbp_cpufreq);
		return err;
	}
	kbp_freq_notified = !err;
	return 0;
}

/* Module exit, every poller thread gone: whatever kbp changed goes back. */
void kbp_freq_exit(void)
{
	unsigned int cpu;

	if (kbp_freq_notified)
		cpufreq_unregister_notifier(&kbp_freq_policy_nb,
					    CPUFREQ_POLICY_NOTIFIER);
	for (cpu = 0; cpu < nr_cpu_ids; cpu++) {
		struct kbp_cpufreq *c = &kbp_cpufreq[cpu];

		mutex_lock(&c->lock);
		kbp_freq_put_back(NULL, cpu, c, true);
		mutex_unlock(&c->lock);
	}
	kfree(kbp_cpufreq);
}

/*
 * No poller thread of @cpu awake (or @p, the last, going to sleep): lower
 * the CPU (freq_ctl on) or put back the frequency kbp found (off), waiting
 * for the locks.  Process context, nothing held but maybe kbp_lock.
 */
static void kbp_freq_settle(struct kbp_poller *p, int cpu,
			    struct kbp_cpufreq *c)
{
	mutex_lock(&c->lock);
	if (!c->ctl)
		kbp_freq_put_back(p, cpu, c, true);
	else if (!c->low && !atomic_read(&c->awake) &&
		 kbp_freq_set(p, cpu, c, KBP_FREQ_MIN, true))
		WRITE_ONCE(c->low, true);
	mutex_unlock(&c->lock);
}

/* Nothing to change: lowered under freq_ctl, or nothing saved without. */
static bool kbp_freq_settled(struct kbp_cpufreq *c)
{
	return READ_ONCE(c->ctl) ? READ_ONCE(c->low) : !READ_ONCE(c->saved);
}

/*
 * freq_ctl of @cpu's rt pollers (kbp_lock held).  An awake poller thread
 * acts on it when it goes to sleep; with all of them asleep, this does it
 * now.  Waking them for it instead lost the change whenever a woken thread
 * ran its pass before the write (the thread is on another CPU) or was
 * already past its look at @ctl: it then slept on the old setting, the CPU
 * left at its maximum under freq_ctl, or at its minimum with freq_ctl off.
 * The write, then the look at @awake, against kbp_freq_sleep()'s decrement,
 * then its look at @ctl: at least one of the two sees the other.
 */
void kbp_freq_set_ctl(int cpu, bool on)
{
	struct kbp_cpufreq *c = &kbp_cpufreq[cpu];

	lockdep_assert_held(&kbp_lock);
	if (READ_ONCE(c->ctl) == on)
		return;
	WRITE_ONCE(c->ctl, on);
	smp_mb();	/* pairs with kbp_freq_sleep()'s atomic_dec_return() */
	if (!atomic_read(&c->awake) && !kbp_freq_settled(c))
		kbp_freq_settle(NULL, cpu, c);
}

void kbp_freq_poller_add(int cpu)
{
	lockdep_assert_held(&kbp_lock);
	kbp_cpufreq[cpu].pollers++;
}

/*
 * A poller of @cpu is freed, its thread gone (kbp_lock held): the last one
 * gives the CPU back the frequency kbp found there.
 */
void kbp_freq_poller_del(int cpu)
{
	struct kbp_cpufreq *c = &kbp_cpufreq[cpu];

	lockdep_assert_held(&kbp_lock);
	if (WARN_ON_ONCE(!c->pollers) || --c->pollers)
		return;
	mutex_lock(&c->lock);
	kbp_freq_put_back(NULL, cpu, c, true);
	mutex_unlock(&c->lock);
}

/* A poller thread starts: it is awake. */
void kbp_freq_thread_start(struct kbp_poller *p, struct kbp_freq *f)
{
	f->asleep = false;
	atomic_inc(&kbp_cpufreq[p->cpu].awake);
}

/*
 * About to sleep (Algorithm 1 line 13), in process context with nothing
 * held: the last awake poller thread of a CPU with freq_ctl lowers its
 * frequency, waiting for the locks (see the top); with freq_ctl off it puts
 * back the frequency kbp found if a pass could not.  A thread waking
 * meanwhile either counts as awake before we look (and we do not lower), or
 * finds @low set at its next pass and raises it again (kbp_freq_pass()).
 */
void kbp_freq_sleep(struct kbp_poller *p, struct kbp_freq *f)
{
	struct kbp_cpufreq *c = &kbp_cpufreq[p->cpu];

	if (f->asleep)
		return;
	f->asleep = true;
	/*
	 * a full barrier: pairs with kbp_freq_pass()'s, and with
	 * kbp_freq_set_ctl()'s smp_mb() before it looks at @awake
	 */
	if (atomic_dec_return(&c->awake) > 0 || kbp_freq_settled(c))
		return;		/* the common case */
	kbp_freq_settle(p, p->cpu, c);
}

/*
 * The thread exits (its poller stopped, or it was replaced): as for a sleep,
 * the last of the CPU's poller threads to stop or sleep lowers it.
 */
void kbp_freq_thread_exit(struct kbp_poller *p, struct kbp_freq *f)
{
	kbp_freq_sleep(p, f);
}

/*
 * At the top of every pass (Algorithm 1 line 2 after a wakeup): count as
 * awake again; raise the frequency if it was lowered, or put back the saved
 * one if freq_ctl was turned off.  Nothing to do, and nothing touched, in
 * the common case.
 */
void kbp_freq_pass(struct kbp_poller *p, struct kbp_freq *f)
{
	struct kbp_cpufreq *c = &kbp_cpufreq[p->cpu];

	if (f->asleep) {
		f->asleep = false;
		atomic_inc(&c->awake);
		smp_mb__after_atomic();	/* awake, then look at @low */
	}
	if (likely(!READ_ONCE(c->low) &&
		   !(READ_ONCE(c->saved) && !READ_ONCE(c->ctl))))
		return;
	if (!mutex_trylock(&c->lock))
		return;
	if (!c->ctl)
		kbp_freq_put_back(p, p->cpu, c, false);
	else if (c->low && kbp_freq_set(p, p->cpu, c, KBP_FREQ_MAX, false))
		WRITE_ONCE(c->low, false);
	mutex_unlock(&c->lock);
}

/* Can @c run on @cpu?  rtnl and kbp_lock held. */
int kbp_freq_check(int cpu, const struct kbp_conf *c,
		   struct netlink_ext_ack *extack)
{
	const struct kbp_mode_ops *ops;
	struct cpufreq_policy *pol;
	const char *gov = "none";
	bool setspeed = false;

	if (!c->freq_ctl)
		return 0;
	ops = kbp_mode_ops(c->mode);
	if (!ops || ops->no_freq_ctl) {
		kbp_refuse(extack, "freq_ctl needs mode hybrid",
			   "freq_ctl on CPU %d needs mode hybrid (%s)", cpu,
			   ops ? ops->no_freq_ctl : "unknown mode");
		return -EINVAL;
	}
	pol = cpufreq_cpu_get(cpu);
	if (!pol) {
		kbp_refuse(extack, "no cpufreq policy on this CPU",
			   "freq_ctl: CPU %d has no cpufreq policy (no cpufreq driver)",
			   cpu);
		return -EOPNOTSUPP;
	}
	/*
	 * One frequency for several CPUs (acpi-cpufreq with _PSD, cpufreq-dt
	 * clusters): a sleeping poller would slow a sibling that is polling
	 * and every application CPU of the policy, and two pollers' save and
	 * restore would interleave.  Only per-CPU policies are ours to drive.
	 */
	if (cpumask_weight(pol->related_cpus) > 1) {
		kbp_refuse(extack, "freq_ctl: the CPU shares its cpufreq policy with others",
			   "freq_ctl: CPU %d shares its cpufreq policy (CPUs %*pbl)",
			   cpu, cpumask_pr_args(pol->related_cpus));
		cpufreq_cpu_put(pol);
		return -EOPNOTSUPP;
	}
	down_read(&pol->rwsem);
	setspeed = kbp_freq_settable(pol);
	if (pol->governor)
		gov = pol->governor->name;
	if (!setspeed)
		kbp_refuse(extack, "freq_ctl needs governor userspace",
			   "freq_ctl needs governor userspace on CPU %d, not %s",
			   cpu, gov);
	up_read(&pol->rwsem);
	cpufreq_cpu_put(pol);
	return setspeed ? 0 : -EOPNOTSUPP;
}
