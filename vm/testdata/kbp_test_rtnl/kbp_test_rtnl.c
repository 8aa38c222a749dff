// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only module for the kbp VM suite: holds rtnl while it loads, and in
 * the middle of that turns GRO off on a veth (which deletes the veth's NAPIs
 * while the device stays up, so kbp's poller is stopped and respawned).
 * Loading it opens a window on purpose: whatever waits for rtnl meanwhile
 * (an "rmmod kbp" started during before_ms, for example) runs right after
 * the NAPI deletion and before kbp's reconcile work, which queued behind it.
 *
 *   insmod kbp_test_rtnl.ko gro_off=vethX before_ms=3000 after_ms=500
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <net/net_namespace.h>

static char *gro_off = "";
module_param(gro_off, charp, 0444);
MODULE_PARM_DESC(gro_off, "device (init netns) whose GRO is turned off while rtnl is held");

static unsigned int before_ms = 1000;
module_param(before_ms, uint, 0444);
MODULE_PARM_DESC(before_ms, "hold rtnl this long before turning GRO off (default 1000)");

static unsigned int after_ms = 200;
module_param(after_ms, uint, 0444);
MODULE_PARM_DESC(after_ms, "and this long after (default 200)");

static int __init kbp_test_rtnl_init(void)
{
	struct net_device *dev;

	rtnl_lock();
	pr_info("holding rtnl\n");
	msleep(before_ms);
	dev = gro_off[0] ? __dev_get_by_name(&init_net, gro_off) : NULL;
	if (dev) {
		dev->wanted_features &= ~NETIF_F_GRO;
		netdev_update_features(dev);
		pr_info("%s: GRO off\n", dev->name);
	}
	msleep(after_ms);
	rtnl_unlock();
	pr_info("released rtnl\n");
	return 0;
}

static void __exit kbp_test_rtnl_exit(void)
{
}

module_init(kbp_test_rtnl_init);
module_exit(kbp_test_rtnl_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kbp test: hold rtnl, delete a veth's NAPIs meanwhile");
