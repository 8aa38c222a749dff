// SPDX-License-Identifier: GPL-2.0
/*
 * kbp: the generic netlink control surface (family "kbp", uapi/kbp.h).
 *
 * Every operation needs CAP_NET_ADMIN.  The family is netns-aware: devices
 * are named in the caller's network namespace, or in the one whose fd
 * KBP_A_NETNS_FD carries.  Errors come back as an errno plus an extack
 * message, and the same problem is logged once to the kernel log.
 *
 * Who may do what (docs/design.md, "Privileges").  GENL_ADMIN_PERM asks for
 * CAP_NET_ADMIN over the initial user namespace, which a container started
 * with NET_ADMIN and no user namespace (the Docker/Kubernetes case) has.
 * Pollers are the host's: one per CPU, class and device, and a CPU's knobs
 * are shared by every namespace's devices on that CPU.  So
 *   - knobs that take a CPU away from other tasks, mode busy and rt_prio > 0
 *     (a never-sleeping or SCHED_FIFO kthread), nice below 0, also need
 *     CAP_SYS_NICE, as sched_setscheduler() and setpriority() would for a
 *     thread of the caller's own; so does joining a CPU whose knobs already
 *     are such (kbp_main.c, kbp_check_caller_knobs());
 *   - a caller that could not already move the host's tasks between CPUs
 *     attaches only to CPUs it may run on itself (its cpuset): a container
 *     cannot put its traffic, or a poller, on the host's isolated or
 *     nohz_full CPUs.  sched_setaffinity()'s own rule says who can:
 *     CAP_SYS_NICE, over tasks it sees, so in the initial pid namespace
 *     (a node agent with the host's pids, or the host's administrator);
 *   - POLLER_SET, which changes a CPU's poller for every namespace, is only
 *     for callers in the initial network namespace;
 *   - outside the initial network namespace, replies show only pollers that
 *     serve one of the caller's devices, and outside the initial pid
 *     namespace they show pids as 0 (a host pid means nothing there).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/file.h>
#include <linux/pid_namespace.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <net/genetlink.h>
#include <net/net_namespace.h>
#include <net/netlink.h>
#include <net/sock.h>

#include "kbp_priv.h"
#include "kbp_compat.h"
#include "kbp_genl_policy.h"	/* generated from netlink/kbp.yaml */

static struct genl_family kbp_genl_family;

/* --- requests ---------------------------------------------------------- */

static void kbp_parse_u32(const struct nlattr *a, bool *has, u32 *v)
{
	if (!a)
		return;
	*has = true;
	*v = nla_get_u32(a);
}

static void kbp_parse_knobs(struct genl_info *info, struct kbp_knobs *k)
{
	struct nlattr **tb = info->attrs;

	memset(k, 0, sizeof(*k));
	if (tb[KBP_A_MODE]) {
		k->has_mode = true;
		k->conf.mode = nla_get_u32(tb[KBP_A_MODE]);
	}
	if (tb[KBP_A_LINGER_US]) {
		k->has_linger = true;
		k->conf.linger_us = nla_get_u32(tb[KBP_A_LINGER_US]);
	}
	if (tb[KBP_A_QUOTA]) {
		k->has_quota = true;
		k->conf.quota = nla_get_u32(tb[KBP_A_QUOTA]);
	}
	if (tb[KBP_A_RT_PRIO]) {
		k->has_rt_prio = true;
		k->conf.rt_prio = nla_get_u32(tb[KBP_A_RT_PRIO]);
	}
	if (tb[KBP_A_FREQ_CTL]) {
		k->has_freq_ctl = true;
		k->conf.freq_ctl = nla_get_u32(tb[KBP_A_FREQ_CTL]);
	}
	if (tb[KBP_A_NICE]) {
		k->has_nice = true;
		k->conf.nice = nla_get_s32(tb[KBP_A_NICE]);
	}
	kbp_parse_u32(tb[KBP_A_INTERVAL_US], &k->has_interval,
		      &k->conf.interval_us);
	kbp_parse_u32(tb[KBP_A_NETAP], &k->has_netap, &k->conf.netap);
	kbp_parse_u32(tb[KBP_A_ROUND_MS], &k->has_round_ms, &k->conf.round_ms);
	kbp_parse_u32(tb[KBP_A_MIN_INTERVAL_US], &k->has_min_interval,
		      &k->conf.np.min_interval_us);
	kbp_parse_u32(tb[KBP_A_MAX_INTERVAL_US], &k->has_max_interval,
		      &k->conf.np.max_interval_us);
	kbp_parse_u32(tb[KBP_A_MIN_CHANGE], &k->has_min_change,
		      &k->conf.np.min_change_pct);
	kbp_parse_u32(tb[KBP_A_MAX_ROUND], &k->has_max_round,
		      &k->conf.np.max_round);
	kbp_parse_u32(tb[KBP_A_OBJECTIVE], &k->has_objective,
		      &k->conf.objective);
}

/*
 * The knob of @k that takes a CPU from other tasks, or NULL: a poller that
 * never sleeps, a SCHED_FIFO one, a hybrid one that keeps spinning for
 * more than KBP_LINGER_US_FREE after each packet (1 s would be busy under a
 * trickle), a periodic one woken more often than NetAP's MinInterval.
 */
static const char *kbp_takes_cpu(const struct kbp_knobs *k)
{
	const struct kbp_mode_ops *ops = k->has_mode ?
					 kbp_mode_ops(k->conf.mode) : NULL;

	if (ops && !ops->sleeps)
		return "mode busy";
	if (k->has_rt_prio && k->conf.rt_prio)
		return "rt_prio > 0";
	if (k->has_nice && k->conf.nice < 0)
		return "nice below 0";
	if (k->has_linger && k->conf.linger_us > KBP_LINGER_US_FREE)
		return "linger_us above the limit";
	if (k->has_interval &&
	    k->conf.interval_us < KBP_NETAP_MIN_INTERVAL_US)
		return "interval_us below the limit";
	if (k->has_min_interval &&
	    k->conf.np.min_interval_us < KBP_NETAP_MIN_INTERVAL_US)
		return "min_interval_us below the limit";
	return NULL;
}

/* Knobs that take a CPU from other tasks need CAP_SYS_NICE (see the top). */
static int kbp_may_take_cpu(struct sk_buff *skb, struct genl_info *info,
			    const struct kbp_knobs *k)
{
	const char *what = kbp_takes_cpu(k);

	if (!what || netlink_capable(skb, CAP_SYS_NICE))
		return 0;
	kbp_refuse(info->extack, "knobs that take a CPU need CAP_SYS_NICE",
		   "%s needs CAP_SYS_NICE (busy, rt_prio > 0, nice < 0, linger_us > %u, interval_us < %u take a CPU)",
		   what, KBP_LINGER_US_FREE, (u32)KBP_NETAP_MIN_INTERVAL_US);
	return -EPERM;
}

/*
 * Who asks for an attach: what its pollers may take (kbp_main.c,
 * kbp_check_cpu_for()), also for CPUs its NAPIs get later.  The genl doit
 * runs in the caller's context: current is the caller, and its allowed CPUs
 * lie within its cpuset.
 */
static void kbp_parse_caller(struct sk_buff *skb, struct kbp_caller *c)
{
	c->may_take_cpu = netlink_capable(skb, CAP_SYS_NICE);
	c->cpus = c->may_take_cpu &&
		  task_active_pid_ns(current) == &init_pid_ns ? NULL :
		  current->cpus_ptr;
}

/* The class the request names (KBP_A_CLASS; rt when it names none). */
static int kbp_parse_class(struct genl_info *info, u32 *cls)
{
	struct nlattr *a = info->attrs[KBP_A_CLASS];

	*cls = a ? nla_get_u32(a) : KBP_CLASS_RT;
	if (kbp_class_ops(*cls))
		return 0;
	kbp_refuse(info->extack, "unknown class",
		   "unknown class %u (rt=%d, non-rt=%d)", *cls, KBP_CLASS_RT,
		   KBP_CLASS_NON_RT);
	return -EINVAL;
}

/* A pid as the caller can see it: 0 outside the initial pid namespace. */
static u32 kbp_pid_for_caller(pid_t pid)
{
	return task_active_pid_ns(current) == &init_pid_ns ? pid : 0;
}

/* The netns the request names (a reference the caller puts). */
static struct net *kbp_req_net(struct genl_info *info)
{
	struct nlattr *fd = info->attrs[KBP_A_NETNS_FD];
	struct net *net;

	if (!fd)
		return get_net(genl_info_net(info));
	net = get_net_ns_by_fd(nla_get_u32(fd));
	if (IS_ERR(net)) {
		kbp_refuse(info->extack, "not a network namespace fd",
			   "fd %u is not a network namespace", nla_get_u32(fd));
	}
	return net;
}

/* The device the request names, in @net.  rtnl held. */
static struct net_device *kbp_req_dev(struct net *net, struct genl_info *info)
{
	struct nlattr **tb = info->attrs;
	struct net_device *dev = NULL;
	char name[IFNAMSIZ];

	ASSERT_RTNL();
	if (tb[KBP_A_IFINDEX]) {
		u32 ifindex = nla_get_u32(tb[KBP_A_IFINDEX]);

		dev = __dev_get_by_index(net, ifindex);
		if (!dev) {
			kbp_refuse(info->extack, "no device of that name or index in this netns",
				   "no device with ifindex %u in this netns", ifindex);
			return ERR_PTR(-ENODEV);
		}
	} else if (tb[KBP_A_IFNAME]) {
		nla_strscpy(name, tb[KBP_A_IFNAME], sizeof(name));
		dev = __dev_get_by_name(net, name);
		if (!dev) {
			kbp_refuse(info->extack, "no device of that name or index in this netns",
				   "no device %s in this netns", name);
			return ERR_PTR(-ENODEV);
		}
	} else {
		NL_SET_ERR_MSG_MOD(info->extack, "give KBP_A_IFNAME or KBP_A_IFINDEX");
		return ERR_PTR(-EINVAL);
	}
	return dev;
}

static int kbp_parse_map(struct genl_info *info, struct kbp_attach_req *req)
{
	struct nlattr *mt[KBP_MAP_A_MAX + 1], *entry;
	struct nlattr *map = info->attrs[KBP_A_QUEUE_MAP];
	unsigned int i;
	int rem, err;

	if (!map)
		return 0;
	req->map = kcalloc(KBP_MAP_MAX, sizeof(*req->map), GFP_KERNEL);
	if (!req->map)
		return -ENOMEM;
	nla_for_each_nested(entry, map, rem) {
		if (nla_type(entry) != KBP_A_MAP_ENTRY ||
		    req->nr_map == KBP_MAP_MAX) {
			NL_SET_ERR_MSG_ATTR(info->extack, entry,
					    "bad queue map entry (or more than 256)");
			return -EINVAL;
		}
		err = nla_parse_nested(mt, KBP_MAP_A_MAX, entry, kbp_map_policy,
				       info->extack);
		if (err)
			return err;
		if (!mt[KBP_MAP_A_NAPI_INDEX] || !mt[KBP_MAP_A_CPU]) {
			NL_SET_ERR_MSG_ATTR(info->extack, entry,
					    "queue map entry needs a NAPI index and a CPU");
			return -EINVAL;
		}
		req->map[req->nr_map].index = nla_get_u32(mt[KBP_MAP_A_NAPI_INDEX]);
		req->map[req->nr_map].cpu = nla_get_u32(mt[KBP_MAP_A_CPU]);
		for (i = 0; i < req->nr_map; i++) {
			if (req->map[i].index == req->map[req->nr_map].index) {
				NL_SET_ERR_MSG_ATTR(info->extack, entry,
						    "queue map names a NAPI twice");
				return -EINVAL;
			}
		}
		req->nr_map++;
	}
	return 0;
}

typedef int (*kbp_dev_op)(struct net_device *dev, struct genl_info *info,
			  void *arg);

/* Run @op on the request's device, resolved and used under rtnl and kbp_lock. */
static int kbp_on_dev(struct genl_info *info, kbp_dev_op op, void *arg)
{
	struct net_device *dev;
	struct net *net;
	int err;

	net = kbp_req_net(info);
	if (IS_ERR(net))
		return PTR_ERR(net);
	rtnl_lock();
	mutex_lock(&kbp_lock);
	dev = kbp_req_dev(net, info);
	err = IS_ERR(dev) ? PTR_ERR(dev) : op(dev, info, arg);
	mutex_unlock(&kbp_lock);
	rtnl_unlock();
	put_net(net);
	return err;
}

static int kbp_attach_op(struct net_device *dev, struct genl_info *info,
			 void *arg)
{
	struct kbp_attach_req *req = arg;

	req->dev = dev;
	return kbp_dev_bind(req, info->extack);
}

static int kbp_nl_dev_attach(struct sk_buff *skb, struct genl_info *info)
{
	struct kbp_attach_req req = { .cpu = -1 };
	int err;

	kbp_parse_knobs(info, &req.knobs);
	kbp_parse_caller(skb, &req.caller);
	err = kbp_parse_class(info, &req.cls) ?:
	      kbp_may_take_cpu(skb, info, &req.knobs);
	if (err)
		return err;
	if (info->attrs[KBP_A_CPU])	/* kbp_check_cpu() refuses it if too big */
		req.cpu = min_t(u32, nla_get_u32(info->attrs[KBP_A_CPU]), INT_MAX);
	err = kbp_parse_map(info, &req);
	if (!err)
		err = kbp_on_dev(info, kbp_attach_op, &req);
	kfree(req.map);		/* NULL once bound */
	return err;
}

static int kbp_detach_op(struct net_device *dev, struct genl_info *info,
			 void *arg)
{
	return kbp_dev_unbind_by_dev(dev, info->extack);
}

static int kbp_nl_dev_detach(struct sk_buff *skb, struct genl_info *info)
{
	return kbp_on_dev(info, kbp_detach_op, NULL);
}

static int kbp_nl_poller_set(struct sk_buff *skb, struct genl_info *info)
{
	struct kbp_knobs knobs;
	u32 cls;
	int err;

	if (GENL_REQ_ATTR_CHECK(info, KBP_A_CPU))
		return -EINVAL;
	if (!net_eq(genl_info_net(info), &init_net)) {
		kbp_refuse(info->extack, "poller-set is only for the initial network namespace",
			   "poller-set is only for the initial network namespace");
		return -EPERM;
	}
	kbp_parse_knobs(info, &knobs);
	err = kbp_parse_class(info, &cls) ?:
	      kbp_may_take_cpu(skb, info, &knobs);
	if (err)
		return err;
	rtnl_lock();
	mutex_lock(&kbp_lock);
	err = kbp_poller_configure(nla_get_u32(info->attrs[KBP_A_CPU]), cls,
				   &knobs, info->extack);
	mutex_unlock(&kbp_lock);
	rtnl_unlock();
	return err;
}

/* --- replies ----------------------------------------------------------- */

static int kbp_put_u64(struct sk_buff *skb, int type, u64 v)
{
	return nla_put_u64_64bit(skb, type, v, KBP_A_PAD);
}

/* The search state of a periodic poller with netap on.  kbp_lock held. */
static int kbp_fill_netap(struct sk_buff *skb, struct kbp_poller *p)
{
	struct kbp_netap_snapshot ns;
	struct nlattr *nest;

	kbp_poller_read_netap(p, &ns);
	if (!ns.on)
		return 0;
	nest = nla_nest_start(skb, KBP_A_NETAP_STATE);
	if (!nest ||
	    nla_put_u32(skb, KBP_NETAP_A_ROUND, ns.s.round) ||
	    nla_put_u64_64bit(skb, KBP_NETAP_A_ROUNDS, ns.rounds,
			      KBP_NETAP_A_PAD) ||
	    nla_put_u32(skb, KBP_NETAP_A_INTERVAL_US, ns.s.interval_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_LOW_US, ns.s.low_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_HIGH_US, ns.s.high_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_RANGE_LO_US, ns.s.range_lo_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_RANGE_HI_US, ns.s.range_hi_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_DISTANCE_US, ns.s.distance_us) ||
	    nla_put_u32(skb, KBP_NETAP_A_CONVERGED, ns.s.converged) ||
	    nla_put_u32(skb, KBP_NETAP_A_RESTARTS, ns.s.restarts) ||
	    nla_put_u64_64bit(skb, KBP_NETAP_A_LAST_OBJECTIVE, ns.last,
			      KBP_NETAP_A_PAD) ||
	    nla_put_u32(skb, KBP_NETAP_A_OBJECTIVE, ns.objective) ||
	    nla_put_u64_64bit(skb, KBP_NETAP_A_LAST_BYTES, ns.last_bytes,
			      KBP_NETAP_A_PAD) ||
	    nla_put_u64_64bit(skb, KBP_NETAP_A_LAST_CPU_NS, ns.last_cpu_ns,
			      KBP_NETAP_A_PAD))
		return -EMSGSIZE;
	nla_nest_end(skb, nest);
	return 0;
}

/* The device a poller serves (kbp_lock held): none once it is detached. */
static int kbp_fill_poller_dev(struct sk_buff *skb, struct kbp_poller *p)
{
	struct net_device *dev = p->kd ? p->kd->dev : NULL;

	if (!dev)
		return 0;
	if (nla_put_u32(skb, KBP_A_IFINDEX, dev->ifindex) ||
	    nla_put_string(skb, KBP_A_IFNAME, dev->name) ||
	    nla_put_u32(skb, KBP_A_NETNS_INUM, dev_net(dev)->ns.inum))
		return -EMSGSIZE;
	return 0;
}

/* What a poller's thread is doing, as far as an operator cares. */
static u32 kbp_poller_state(const struct kbp_poller *p)
{
	if (test_bit(KBP_POLLER_STUCK, &p->flags))
		return KBP_STATE_STUCK;
	if (test_bit(KBP_POLLER_STOPPING, &p->flags))
		return KBP_STATE_STOPPING;
	return KBP_STATE_ACTIVE;
}

static int kbp_fill_poller(struct sk_buff *skb, struct kbp_poller *p)
{
	struct kbp_poller_snapshot s;
	struct kbp_napi *kn;
	u32 nr = 0;

	kbp_poller_read(p, &s);
	rcu_read_lock();
	list_for_each_entry_rcu(kn, &p->napis, poll_node)
		nr++;
	rcu_read_unlock();

	if (kbp_fill_poller_dev(skb, p) ||
	    nla_put_u32(skb, KBP_A_STATE, kbp_poller_state(p)) ||
	    nla_put_u32(skb, KBP_A_CPU, p->cpu) ||
	    nla_put_u32(skb, KBP_A_CLASS, p->cls->cls) ||
	    nla_put_s32(skb, KBP_A_NICE, READ_ONCE(p->nice)) ||
	    nla_put_u32(skb, KBP_A_PID, kbp_pid_for_caller(READ_ONCE(p->pid))) ||
	    nla_put_u32(skb, KBP_A_MODE, READ_ONCE(p->mode)) ||
	    nla_put_u32(skb, KBP_A_LINGER_US, READ_ONCE(p->linger_us)) ||
	    nla_put_u32(skb, KBP_A_QUOTA, READ_ONCE(p->quota)) ||
	    nla_put_u32(skb, KBP_A_RT_PRIO, READ_ONCE(p->rt_prio)) ||
	    nla_put_u32(skb, KBP_A_FREQ_CTL, READ_ONCE(p->freq_ctl)) ||
	    nla_put_u32(skb, KBP_A_NAPIS, nr) ||
	    kbp_put_u64(skb, KBP_A_PASSES, s.passes) ||
	    kbp_put_u64(skb, KBP_A_EMPTY_PASSES, s.empty_passes) ||
	    kbp_put_u64(skb, KBP_A_PACKETS, s.packets) ||
	    kbp_put_u64(skb, KBP_A_WAKEUPS, s.wakeups) ||
	    kbp_put_u64(skb, KBP_A_SLEEPS, s.sleeps) ||
	    kbp_put_u64(skb, KBP_A_SLEEP_NS, s.sleep_ns) ||
	    kbp_put_u64(skb, KBP_A_POLL_NS, s.poll_ns) ||
	    kbp_put_u64(skb, KBP_A_FREQ_CHANGES, s.freq_changes) ||
	    kbp_put_u64(skb, KBP_A_YIELDS, s.yields) ||
	    kbp_put_u64(skb, KBP_A_RESPAWNS, s.respawns) ||
	    kbp_put_u64(skb, KBP_A_REPAIRS, s.repairs) ||
	    kbp_put_u64(skb, KBP_A_HANDBACKS, s.handbacks) ||
	    kbp_put_u64(skb, KBP_A_GAVE_WAY, s.gave_way) ||
	    kbp_put_u64(skb, KBP_A_WAKE_DELAY_NS, s.wake_delay_ns) ||
	    kbp_put_u64(skb, KBP_A_WAKE_DELAY_MAX_NS, s.wake_delay_max_ns) ||
	    kbp_put_u64(skb, KBP_A_TAKEOVERS, s.takeovers) ||
	    nla_put_u32(skb, KBP_A_INTERVAL_US, READ_ONCE(p->interval_us)) ||
	    nla_put_u32(skb, KBP_A_NETAP, READ_ONCE(p->netap)) ||
	    nla_put_u32(skb, KBP_A_ROUND_MS, READ_ONCE(p->round_ms)) ||
	    nla_put_u32(skb, KBP_A_MIN_INTERVAL_US, p->np.min_interval_us) ||
	    nla_put_u32(skb, KBP_A_MAX_INTERVAL_US, p->np.max_interval_us) ||
	    nla_put_u32(skb, KBP_A_MIN_CHANGE, p->np.min_change_pct) ||
	    nla_put_u32(skb, KBP_A_MAX_ROUND, p->np.max_round) ||
	    nla_put_u32(skb, KBP_A_OBJECTIVE, p->objective))
		return -EMSGSIZE;
	return kbp_fill_netap(skb, p);
}

static int kbp_fill_dev(struct sk_buff *skb, struct kbp_dev *kd)
{
	u64 packets = kd->packets_gone, polls = kd->polls_gone, pk, pl;
	struct kbp_napi *kn;
	struct nlattr *nest;
	u32 nr = 0;

	if (nla_put_u32(skb, KBP_A_IFINDEX, kd->dev->ifindex) ||
	    nla_put_string(skb, KBP_A_IFNAME, kd->dev->name) ||
	    nla_put_u32(skb, KBP_A_NETNS_INUM, dev_net(kd->dev)->ns.inum) ||
	    nla_put_u32(skb, KBP_A_STATE, kd->active ? KBP_STATE_ACTIVE :
						       KBP_STATE_STANDBY) ||
	    nla_put_u32(skb, KBP_A_CLASS, kd->cls) ||
	    (kd->cpu >= 0 && nla_put_u32(skb, KBP_A_CPU, kd->cpu)))
		return -EMSGSIZE;
	if (kd->knobs.has_mode &&
	    nla_put_u32(skb, KBP_A_MODE, kd->knobs.conf.mode))
		return -EMSGSIZE;

	list_for_each_entry(kn, &kd->napis, dev_node) {
		kbp_napi_read(kn, &pk, &pl);
		packets += pk;
		polls += pl;
		if (test_bit(KBP_NAPI_DEAD, &kn->flags))
			continue;
		nr++;
		nest = nla_nest_start(skb, KBP_A_NAPI);
		if (!nest ||
		    nla_put_u32(skb, KBP_NAPI_A_INDEX, kn->index) ||
		    nla_put_u32(skb, KBP_NAPI_A_ID, kn->napi_id) ||
		    nla_put_u32(skb, KBP_NAPI_A_CPU, kn->poller->cpu) ||
		    nla_put_u32(skb, KBP_NAPI_A_PID,
				kbp_pid_for_caller(READ_ONCE(kn->poller->pid))) ||
		    nla_put_u64_64bit(skb, KBP_NAPI_A_PACKETS, pk, KBP_NAPI_A_PAD) ||
		    nla_put_u64_64bit(skb, KBP_NAPI_A_POLLS, pl, KBP_NAPI_A_PAD))
			return -EMSGSIZE;
		nla_nest_end(skb, nest);
	}
	if (nla_put_u32(skb, KBP_A_NAPIS, nr) ||
	    kbp_put_u64(skb, KBP_A_PACKETS, packets) ||
	    kbp_put_u64(skb, KBP_A_POLLS, polls))
		return -EMSGSIZE;
	return 0;
}

typedef int (*kbp_fill_fn)(struct sk_buff *skb, void *obj);

/* Upper bound of kbp_fill_dev()'s attributes: NICs have hundreds of NAPIs. */
static size_t kbp_dev_msg_size(struct kbp_dev *kd)
{
	size_t napi = nla_total_size(0) + 4 * nla_total_size(sizeof(u32)) +
		      2 * nla_total_size_64bit(sizeof(u64));
	size_t nr = 0;
	struct kbp_napi *kn;

	list_for_each_entry(kn, &kd->napis, dev_node)
		nr++;
	return 7 * nla_total_size(sizeof(u32)) + nla_total_size(IFNAMSIZ) +
	       2 * nla_total_size_64bit(sizeof(u64)) + nr * napi;
}

static int kbp_reply(struct genl_info *info, u8 cmd, kbp_fill_fn fill,
		     void *obj, size_t size)
{
	struct sk_buff *msg;
	void *hdr;
	int err;

	msg = genlmsg_new(size, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &kbp_genl_family, 0, cmd);
	if (!hdr) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	err = fill(msg, obj);
	if (err) {
		nlmsg_free(msg);
		return err;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

/* Append one object to a dump; -EMSGSIZE when the skb is full. */
static int kbp_dump_one(struct sk_buff *skb, struct netlink_callback *cb,
			u8 cmd, kbp_fill_fn fill, void *obj)
{
	void *hdr;

	hdr = genlmsg_put(skb, NETLINK_CB(cb->skb).portid, cb->nlh->nlmsg_seq,
			  &kbp_genl_family, NLM_F_MULTI, cmd);
	if (!hdr)
		return -EMSGSIZE;
	if (fill(skb, obj)) {
		genlmsg_cancel(skb, hdr);
		return -EMSGSIZE;
	}
	genlmsg_end(skb, hdr);
	return 0;
}

static int kbp_fill_poller_any(struct sk_buff *skb, void *obj)
{
	return kbp_fill_poller(skb, obj);
}

static int kbp_fill_dev_any(struct sk_buff *skb, void *obj)
{
	return kbp_fill_dev(skb, obj);
}

/*
 * Pollers a caller in @net may see: all from init_net, else those of its
 * devices.  kbp_lock held.
 */
static bool kbp_poller_visible(struct kbp_poller *p, struct net *net)
{
	return net_eq(net, &init_net) ||
	       (p->kd && net_eq(dev_net(p->kd->dev), net));
}

/*
 * POLLER_GET's poller of @slot: the one serving @dev if the request names
 * a device, else the slot's only live one.  kbp_lock held.
 */
static struct kbp_poller *kbp_find_poller(unsigned int slot,
					  struct net_device *dev,
					  struct net *net, unsigned int *nr)
{
	struct kbp_poller *p, *found = NULL;

	*nr = 0;
	list_for_each_entry(p, &kbp_slots[slot], slot_node) {
		if (test_bit(KBP_POLLER_STOPPING, &p->flags) ||
		    !kbp_poller_visible(p, net) ||
		    (dev && (!p->kd || p->kd->dev != dev)))
			continue;
		(*nr)++;
		found = p;
	}
	return *nr == 1 ? found : NULL;
}

static int kbp_poller_get_op(struct net_device *dev, struct genl_info *info,
			     void *arg)
{
	u32 cpu = nla_get_u32(info->attrs[KBP_A_CPU]), cls = *(u32 *)arg;
	struct kbp_poller *p = NULL;
	unsigned int nr = 0;

	if (cpu < nr_cpu_ids)
		p = kbp_find_poller(kbp_slot(cpu, cls), dev,
				    genl_info_net(info), &nr);
	if (nr > 1) {
		kbp_tell(info->extack, "several pollers on that CPU: name the device",
			 "%u %s pollers on CPU %u (one per device): name the device",
			 nr, kbp_class_ops(cls)->name, cpu);
		return -EINVAL;
	}
	if (!p) {
		kbp_tell(info->extack, "no poller on that CPU",
			 "no %s poller on CPU %u%s%s", kbp_class_ops(cls)->name,
			 cpu, dev ? " for " : "", dev ? dev->name : "");
		return -ENOENT;
	}
	return kbp_reply(info, KBP_CMD_POLLER_GET, kbp_fill_poller_any, p,
			 NLMSG_GOODSIZE);
}

/* doit: KBP_A_CPU (and KBP_A_CLASS), and a device when the CPU has several */
static int kbp_nl_poller_get(struct sk_buff *skb, struct genl_info *info)
{
	u32 cls;
	int err;

	if (GENL_REQ_ATTR_CHECK(info, KBP_A_CPU))
		return -EINVAL;
	err = kbp_parse_class(info, &cls);
	if (err)
		return err;
	if (info->attrs[KBP_A_IFINDEX] || info->attrs[KBP_A_IFNAME])
		return kbp_on_dev(info, kbp_poller_get_op, &cls);
	mutex_lock(&kbp_lock);
	err = kbp_poller_get_op(NULL, info, &cls);
	mutex_unlock(&kbp_lock);
	return err;
}

/*
 * Every poller the caller may see, a stopping one until its thread has
 * exited: every CPU's rt pollers, then every CPU's non-rt ones
 * (kbp_slot()), in the order they started.  cb->args: the slot, and how
 * many of its pollers were sent.
 */
static int kbp_nl_poller_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct net *net = sock_net(skb->sk);
	unsigned long slot;
	long i = 0;

	mutex_lock(&kbp_lock);
	for (slot = cb->args[0]; slot < kbp_nr_slots(); slot++) {
		struct kbp_poller *p;

		i = 0;
		list_for_each_entry(p, &kbp_slots[slot], slot_node) {
			if (!kbp_poller_visible(p, net))
				continue;
			if (i++ < cb->args[1])
				continue;
			if (kbp_dump_one(skb, cb, KBP_CMD_POLLER_GET,
					 kbp_fill_poller_any, p)) {
				i--;
				goto out;
			}
		}
		cb->args[1] = 0;
	}
out:
	mutex_unlock(&kbp_lock);
	cb->args[0] = slot;
	if (slot < kbp_nr_slots())
		cb->args[1] = i;
	return skb->len;
}

static int kbp_dev_get_op(struct net_device *dev, struct genl_info *info,
			  void *arg)
{
	struct kbp_dev *kd = kbp_dev_find(dev);

	if (!kd) {
		kbp_tell(info->extack, "device is not attached",
			 "%s is not attached", dev->name);
		return -ENOENT;
	}
	return kbp_reply(info, KBP_CMD_DEV_GET, kbp_fill_dev_any, kd,
			 kbp_dev_msg_size(kd));
}

static int kbp_nl_dev_get(struct sk_buff *skb, struct genl_info *info)
{
	return kbp_on_dev(info, kbp_dev_get_op, NULL);
}

/* Devices in the caller's netns; from the initial netns, all of them. */
static int kbp_nl_dev_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct net *net = sock_net(skb->sk);
	struct kbp_dev *kd;
	bool full = false;
	long i = 0;

	rtnl_lock();
	mutex_lock(&kbp_lock);
	list_for_each_entry(kd, &kbp_devs, node) {
		if (!net_eq(net, &init_net) && !net_eq(net, dev_net(kd->dev)))
			continue;
		if (i++ < cb->args[0])
			continue;
		if (kbp_dump_one(skb, cb, KBP_CMD_DEV_GET, kbp_fill_dev_any, kd)) {
			full = true;
			i--;
			break;
		}
	}
	mutex_unlock(&kbp_lock);
	rtnl_unlock();
	cb->args[0] = i;
	/* a device too big for an empty message: an error, not the end */
	if (full && !skb->len)
		return -EMSGSIZE;
	return skb->len;
}

static const struct genl_small_ops kbp_genl_ops[] = {
	{
		.cmd	= KBP_CMD_POLLER_GET,
		.doit	= kbp_nl_poller_get,
		.dumpit	= kbp_nl_poller_dump,
		.flags	= GENL_ADMIN_PERM,
	},
	{
		.cmd	= KBP_CMD_POLLER_SET,
		.doit	= kbp_nl_poller_set,
		.flags	= GENL_ADMIN_PERM,
	},
	{
		.cmd	= KBP_CMD_DEV_ATTACH,
		.doit	= kbp_nl_dev_attach,
		.flags	= GENL_ADMIN_PERM,
	},
	{
		.cmd	= KBP_CMD_DEV_DETACH,
		.doit	= kbp_nl_dev_detach,
		.flags	= GENL_ADMIN_PERM,
	},
	{
		.cmd	= KBP_CMD_DEV_GET,
		.doit	= kbp_nl_dev_get,
		.dumpit	= kbp_nl_dev_dump,
		.flags	= GENL_ADMIN_PERM,
	},
};

static struct genl_family kbp_genl_family = {
	.name		= KBP_GENL_NAME,
	.version	= KBP_GENL_VERSION,
	.maxattr	= KBP_A_MAX,
	.policy		= kbp_policy,
	.netnsok	= true,
	.module		= THIS_MODULE,
	.small_ops	= kbp_genl_ops,
	.n_small_ops	= ARRAY_SIZE(kbp_genl_ops),
	.resv_start_op	= KBP_CMD_DEV_GET + 1,
};

int kbp_genl_init(void)
{
	return genl_register_family(&kbp_genl_family);
}

void kbp_genl_exit(void)
{
	genl_unregister_family(&kbp_genl_family);
}
