// SPDX-License-Identifier: GPL-2.0
/*
 * hello: a tiny out-of-tree module the VM rig builds and loads to prove the
 * build -> boot -> insmod path works before the real kbp module exists.
 */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/printk.h>

static int __init hello_init(void)
{
	pr_info("kbp-vm hello: loaded\n");
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
