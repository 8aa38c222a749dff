// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only livepatch for the kbp VM suite: replaces cmdline_proc_show() so
 * that /proc/cmdline reads "kbp test livepatch".  The suite loads it while a
 * busy poller runs and checks that the transition completes (a kthread that
 * never lets the transition switch it would block every later livepatch).
 * Taken from samples/livepatch/livepatch-sample.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/livepatch.h>
#include <linux/module.h>
#include <linux/seq_file.h>

static int kbp_test_cmdline_proc_show(struct seq_file *m, void *v)
{
	seq_puts(m, "kbp test livepatch\n");
	return 0;
}

static struct klp_func funcs[] = {
	{
		.old_name = "cmdline_proc_show",
		.new_func = kbp_test_cmdline_proc_show,
	}, { }
};

static struct klp_object objs[] = {
	{
		/* name being NULL means vmlinux */
		.funcs = funcs,
	}, { }
};

static struct klp_patch patch = {
	.mod = THIS_MODULE,
	.objs = objs,
};

static int __init kbp_test_klp_init(void)
{
	return klp_enable_patch(&patch);
}

static void __exit kbp_test_klp_exit(void)
{
}

module_init(kbp_test_klp_init);
module_exit(kbp_test_klp_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kbp VM suite: test livepatch of cmdline_proc_show");
MODULE_INFO(livepatch, "Y");
