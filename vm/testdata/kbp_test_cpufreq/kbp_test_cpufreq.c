// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only cpufreq driver for the kbp VM suite.  QEMU TCG guests have no
 * frequency control at all, so the suite registers this driver to give every
 * CPU a real cpufreq policy with three operating points.  Nothing changes in
 * the hardware: target_index() only records the chosen point, which the core
 * then reports through the usual sysfs files (scaling_cur_freq, stats/).
 * kbp's freq_ctl and kbpctl's cpufreq report are tested through these files.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpufreq.h>
#include <linux/module.h>
#include <linux/percpu.h>

static struct cpufreq_frequency_table kbp_test_freqs[] = {
	{ .frequency = 800000 },
	{ .frequency = 1600000 },
	{ .frequency = 2400000 },
	{ .frequency = CPUFREQ_TABLE_END },
};

static DEFINE_PER_CPU(unsigned int, kbp_test_cur);

static int kbp_test_cpu_init(struct cpufreq_policy *policy)
{
	policy->freq_table = kbp_test_freqs;
	policy->cpuinfo.transition_latency = 10 * NSEC_PER_USEC;
	per_cpu(kbp_test_cur, policy->cpu) = kbp_test_freqs[2].frequency;
	return 0;
}

static int kbp_test_target_index(struct cpufreq_policy *policy,
				 unsigned int index)
{
	WRITE_ONCE(per_cpu(kbp_test_cur, policy->cpu),
		   kbp_test_freqs[index].frequency);
	return 0;
}

static unsigned int kbp_test_get(unsigned int cpu)
{
	return READ_ONCE(per_cpu(kbp_test_cur, cpu));
}

static struct cpufreq_driver kbp_test_driver = {
	.name		= "kbp-test",
	.init		= kbp_test_cpu_init,
	.verify		= cpufreq_generic_frequency_table_verify,
	.target_index	= kbp_test_target_index,
	.get		= kbp_test_get,
	.attr		= cpufreq_generic_attr,
};

static int __init kbp_test_cpufreq_init(void)
{
	return cpufreq_register_driver(&kbp_test_driver);
}

static void __exit kbp_test_cpufreq_exit(void)
{
	cpufreq_unregister_driver(&kbp_test_driver);
}

module_init(kbp_test_cpufreq_init);
module_exit(kbp_test_cpufreq_exit);
MODULE_DESCRIPTION("kbp test-only cpufreq driver (three fake operating points)");
MODULE_LICENSE("GPL");
