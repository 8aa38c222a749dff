// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only cpufreq driver for the kbp VM suite.  QEMU TCG guests have no
 * frequency control at all, so the suite registers this driver to give every
 * CPU a real cpufreq policy with three operating points.  Nothing changes in
 * the hardware: target_index() only records the chosen point, which the core
 * then reports through the usual sysfs files (scaling_cur_freq, stats/).
 * kbp's freq_ctl and kbpctl's cpufreq report are tested through these files.
 *
 * The transitions are fake, so no other part of the kernel may act on them:
 * a transition notifier registered ahead of all others ends the chain for
 * every transition while this driver is loaded (the core records the
 * transition in stats/ and the cpu_frequency tracepoint either way).  Without
 * it, x86's TSC notifier (time_cpufreq_notifier, registered on CPUs without
 * constant_tsc, e.g. QEMU's TCG "max" CPU) marks the TSC unstable on the
 * first change on SMP: sched_clock's static key is rewritten under the feet
 * of both vCPUs, the clocksource is switched with stop_machine to the HPET,
 * and a 6.1 guest under TCG hung silently right there.  The TSC of a TCG
 * guest runs at a constant rate whatever this driver "sets".
 *
 * Parameters:
 *   shared_policy=1  one policy shared by all possible CPUs (policy->cpus =
 *                    cpu_possible_mask), as on hardware where the CPUs share
 *                    a clock; default 0: one policy per CPU.
 *   get_delay_us=N   ->get() busy-waits N us (0-1000, default 0; writable at
 *                    run time), as drivers that read the frequency from the
 *                    CPU through an IPI do: a reader of cpuinfo_cur_freq then
 *                    holds the policy's rwsem for that long, which is what
 *                    the freq_ctl tests race kbp's poller against.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpufreq.h>
#include <linux/cpumask.h>
#include <linux/delay.h>
#include <linux/limits.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/notifier.h>
#include <linux/percpu.h>

static bool shared_policy;
module_param(shared_policy, bool, 0444);
MODULE_PARM_DESC(shared_policy,
		 "one policy for all possible CPUs instead of one per CPU");

static unsigned int get_delay_us;
module_param(get_delay_us, uint, 0644);
MODULE_PARM_DESC(get_delay_us,
		 "busy-wait in ->get(), in us (0-1000): a slow reader of the policy");

static struct cpufreq_frequency_table kbp_test_freqs[] = {
	{ .frequency = 800000 },
	{ .frequency = 1600000 },
	{ .frequency = 2400000 },
	{ .frequency = CPUFREQ_TABLE_END },
};

static DEFINE_PER_CPU(unsigned int, kbp_test_cur);

static void kbp_test_record(const struct cpumask *cpus, unsigned int khz)
{
	unsigned int cpu;

	for_each_cpu(cpu, cpus)
		WRITE_ONCE(per_cpu(kbp_test_cur, cpu), khz);
}

static int kbp_test_cpu_init(struct cpufreq_policy *policy)
{
	if (shared_policy)
		cpumask_copy(policy->cpus, cpu_possible_mask);
	policy->freq_table = kbp_test_freqs;
	policy->cpuinfo.transition_latency = 10 * NSEC_PER_USEC;
	kbp_test_record(policy->cpus, kbp_test_freqs[2].frequency);
	return 0;
}

static int kbp_test_target_index(struct cpufreq_policy *policy,
				 unsigned int index)
{
	kbp_test_record(policy->related_cpus, kbp_test_freqs[index].frequency);
	return 0;
}

static unsigned int kbp_test_get(unsigned int cpu)
{
	udelay(min(READ_ONCE(get_delay_us), 1000U));
	return READ_ONCE(per_cpu(kbp_test_cur, cpu));
}

static struct cpufreq_driver kbp_test_driver = {
	.name		= "kbp-test",
	.init		= kbp_test_cpu_init,
	.verify		= cpufreq_generic_frequency_table_verify,
	.target_index	= kbp_test_target_index,
	.get		= kbp_test_get,
#ifdef KBP_HAVE_GENERIC_ATTR
	.attr		= cpufreq_generic_attr,
#endif
};

/* Ends the transition notifier chain: the hardware did not change. */
static int kbp_test_transition(struct notifier_block *nb, unsigned long val,
			       void *data)
{
	return NOTIFY_STOP;
}

static struct notifier_block kbp_test_transition_nb = {
	.notifier_call	= kbp_test_transition,
	.priority	= INT_MAX,
};

static int __init kbp_test_cpufreq_init(void)
{
	int err;

	err = cpufreq_register_notifier(&kbp_test_transition_nb,
					CPUFREQ_TRANSITION_NOTIFIER);
	if (err)
		return err;
	err = cpufreq_register_driver(&kbp_test_driver);
	if (err)
		cpufreq_unregister_notifier(&kbp_test_transition_nb,
					    CPUFREQ_TRANSITION_NOTIFIER);
	return err;
}

static void __exit kbp_test_cpufreq_exit(void)
{
	cpufreq_unregister_driver(&kbp_test_driver);
	cpufreq_unregister_notifier(&kbp_test_transition_nb,
				    CPUFREQ_TRANSITION_NOTIFIER);
}

module_init(kbp_test_cpufreq_init);
module_exit(kbp_test_cpufreq_exit);
MODULE_DESCRIPTION("kbp test-only cpufreq driver (three fake operating points)");
MODULE_LICENSE("GPL");
