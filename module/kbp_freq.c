// SPDX-License-Identifier: GPL-2.0
/*
 * kbp freq_ctl: EE-KBP's CPU-frequency control (ee-kbp Sect. 4.2,
 * Algorithm 1 lines 2 and 13).  A hybrid poller with freq_ctl on sets its
 * CPU to the policy's minimum frequency just before it sleeps and to the
 * policy's maximum when it wakes, and puts back the frequency it found when
 * freq_ctl is turned off or the poller stops.
 *
 * Mechanism.  As in the paper, the CPU is governed by the "userspace"
 * governor, and kbp goes through that governor's own setspeed: exactly what a
 * write to scaling_setspeed does (policy->rwsem held for writing around
 * governor->store_setspeed()), so the governor's idea of the speed stays
 * true and the limits in scaling_min_freq/scaling_max_freq are honoured.
 * Any other governor owns the frequency: freq_ctl is refused at configure
 * time, and if the governor changes later the poller leaves the frequency
 * alone (store_setspeed is NULL) and forgets what it saved.
 *
 * Locking.  Only the poller thread calls the three functions below, in
 * process context with no lock held and bh enabled: cpufreq may sleep
 * (policy->rwsem, the userspace governor's mutex, the driver's transition).
 * On the wake and sleep paths the rwsem is only tried: a sysfs reader of the
 * policy must not stall the data path; a failed raise is retried on the
 * next pass, a failed lowering is simply skipped.  Restoring at the end
 * blocks, so the operator's frequency always comes back.  The thread holds
 * no reference to the policy between calls (a held policy would block the
 * cpufreq driver's unregistration).  Validation (kbp_freq_check) runs under
 * rtnl and kbp_lock and takes policy->rwsem for reading: order rtnl ->
 * kbp_lock -> policy->rwsem; cpufreq never takes rtnl or kbp_lock.
 */
#include <linux/cpufreq.h>

#include "kbp_priv.h"
#include "kbp_compat.h"

enum kbp_freq_target { KBP_FREQ_MIN, KBP_FREQ_MAX, KBP_FREQ_SAVED };

/* The policy's governor takes a speed from us (userspace); policy->rwsem held. */
static bool kbp_freq_settable(struct cpufreq_policy *pol)
{
	return pol->governor && pol->governor->store_setspeed;
}

/* Set @cpu's frequency through the userspace governor; false if not done. */
static bool kbp_freq_set(struct kbp_poller *p, struct kbp_freq *f,
			 enum kbp_freq_target to, bool block)
{
	struct cpufreq_policy *pol = cpufreq_cpu_get(p->cpu);
	unsigned int khz;
	bool done = false;

	if (!pol)
		return false;
	if (block)
		down_write(&pol->rwsem);
	else if (!down_write_trylock(&pol->rwsem))
		goto out;

	if (policy_is_inactive(pol) || !kbp_freq_settable(pol)) {
		f->saved = 0;		/* not ours to restore any more */
		f->low = false;
		goto unlock;
	}
	if (!f->saved)
		f->saved = pol->cur;
	khz = to == KBP_FREQ_MIN ? pol->min :
	      to == KBP_FREQ_MAX ? pol->max : f->saved;
	if (pol->cur == khz) {
		done = true;
		goto unlock;
	}
	if (pol->governor->store_setspeed(pol, khz) == 0) {
		done = true;
		u64_stats_update_begin(&p->syncp);
		u64_stats_inc(&p->freq_changes);
		u64_stats_update_end(&p->syncp);
	}
unlock:
	up_write(&pol->rwsem);
out:
	cpufreq_cpu_put(pol);
	return done;
}

/* About to sleep (Algorithm 1 line 13): lower the frequency. */
void kbp_freq_sleep(struct kbp_poller *p, struct kbp_freq *f)
{
	if (!READ_ONCE(p->freq_ctl) || f->low)
		return;
	if (kbp_freq_set(p, f, KBP_FREQ_MIN, false))
		f->low = true;
}

/*
 * At the top of every pass (Algorithm 1 line 2 after a wakeup): raise the
 * frequency if we lowered it, or restore the saved one if freq_ctl was
 * turned off.  Nothing to do, and nothing touched, in the common case.
 */
void kbp_freq_wake(struct kbp_poller *p, struct kbp_freq *f)
{
	if (likely(!f->low && !f->saved))
		return;
	if (!READ_ONCE(p->freq_ctl) || READ_ONCE(p->ops)->no_freq_ctl) {
		if (kbp_freq_set(p, f, KBP_FREQ_SAVED, false)) {
			f->saved = 0;
			f->low = false;
		}
		return;
	}
	if (f->low && kbp_freq_set(p, f, KBP_FREQ_MAX, false))
		f->low = false;
}

/* The poller is stopping: give the CPU back the frequency it had. */
void kbp_freq_restore(struct kbp_poller *p, struct kbp_freq *f)
{
	if (f->saved)
		kbp_freq_set(p, f, KBP_FREQ_SAVED, true);
	f->saved = 0;
	f->low = false;
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
