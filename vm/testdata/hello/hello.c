// SPDX-License-Identifier: GPL-2.0
/*
 * hello: a tiny out-of-tree module the VM rig builds and loads to prove the
 * build -> boot -> insmod path works, and to check the rig's kernel-splat scan:
 * "insmod hello.ko warn=1" logs a WARNING (and the module still loads).
 */
#include <linux/bug.h>
#include <linux/init.h>
#include <linux/module.h>
#include <linux/printk.h>

static bool warn;
module_param(warn, bool, 0444);
MODULE_PARM_DESC(warn, "WARN() once at load time (tests the rig's splat scan)");

static int __init hello_init(void)
{
	pr_info("kbp-vm hello: loaded\n");
	WARN(warn, "kbp-vm hello: warning on request (warn=1)\n");
	return 0;
}

static void __exit hello_exit(void)
{
	pr_info("kbp-vm hello: unloaded\n");
}

module_init(hello_init);
module_exit(hello_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kbp VM rig smoke-test module");
