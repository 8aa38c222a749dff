// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so: the guest side of kbp socket outsourcing (docs/design.md, section 11).
 *
 * This is part 1: it binds the ivshmem-doorbell device that kbp-sod
 * serves, checks the region's header and layout, attaches with the reset
 * handshake, and carries requests over the per-vCPU rings (doorbell to the
 * host, one MSI-X vector per queue back).  It registers the private
 * protocol (AF_INET and AF_INET6, SOCK_DGRAM, KBP_SO_PROTO) whose socket,
 * bind, connect, getsockname/getpeername, sendmsg, recvmsg, shutdown, the
 * setsockopt/getsockopt allowlist and close are requests to the host.
 * sendmsg/recvmsg pin the user buffer and hand the host its guest-physical
 * ranges: the host copies the datagram once, between its socket and the
 * process's pages; poll asks the host with an armed POLL.  A watchdog on
 * the host's heartbeat declares a dead host (ECONNRESET, ENETDOWN) and keeps
 * the pages it may still write as orphans.  /proc/kbp_so shows the state
 * and each socket's counters.  Not yet here: buffers that need a bounce
 * page (EOPNOTSUPP) and re-attaching after a daemon restart.
 *
 * The module's files, and what each holds: kbp_so.h.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

/*
 * Pages of user buffers lent to a live host right now (pinned).
 * /sys/module/kbp_so/parameters/pinned_pages; 0 when
 * idle.  Pages kept for a dead host are orphan_pages (/proc/kbp_so).
 */
atomic_t kbp_so_pinned = ATOMIC_INIT(0);

static int kbp_so_pinned_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&kbp_so_pinned));
}

static int kbp_so_pinned_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops kbp_so_pinned_ops = {
	.set	= kbp_so_pinned_set,
	.get	= kbp_so_pinned_get,
};
module_param_cb(pinned_pages, &kbp_so_pinned_ops, NULL, 0444);
MODULE_PARM_DESC(pinned_pages, "user pages lent to the host now (read only)");

/*
 * How long the host's heartbeat may stand still before the host is
 * declared dead (docs/design.md, 11.5).  Read with READ_ONCE by the
 * watchdog: a new value applies from its next tick.
 */
unsigned int kbp_so_host_timeout_ms = 3000;

static int kbp_so_timeout_set(const char *val, const struct kernel_param *kp)
{
	unsigned int ms;
	int err = kstrtouint(val, 0, &ms);

	if (err)
		return err;
	if (ms < KBP_SO_TIMEOUT_MIN || ms > KBP_SO_TIMEOUT_MAX)
		return -EINVAL;
	WRITE_ONCE(kbp_so_host_timeout_ms, ms);
	return 0;
}

static const struct kernel_param_ops kbp_so_timeout_ops = {
	.set	= kbp_so_timeout_set,
	.get	= param_get_uint,
};
module_param_cb(host_timeout_ms, &kbp_so_timeout_ops, &kbp_so_host_timeout_ms, 0644);
MODULE_PARM_DESC(host_timeout_ms, "heartbeat silence that declares kbp-sod dead (200..600000)");

/*
 * poll_us: how long a caller polls the completion ring for its own request
 * before it asks for the host's interrupt (need_irq) and sleeps (docs/
 * design.md, 11.10).  0 (the default): it asks at once, and every
 * completion comes with an interrupt.  Read once per request.
 */
unsigned int kbp_so_poll_us;

static int kbp_so_poll_set(const char *val, const struct kernel_param *kp)
{
	unsigned int us;
	int err = kstrtouint(val, 0, &us);

	if (err)
		return err;
	if (us > KBP_SO_POLL_US_MAX)
		return -EINVAL;
	WRITE_ONCE(kbp_so_poll_us, us);
	return 0;
}

static const struct kernel_param_ops kbp_so_poll_ops = {
	.set	= kbp_so_poll_set,
	.get	= param_get_uint,
};
module_param_cb(poll_us, &kbp_so_poll_ops, &kbp_so_poll_us, 0644);
MODULE_PARM_DESC(poll_us, "poll for a completion this long before asking for an interrupt (0..1000)");

/*
 * Pages lent to a host that was declared dead while they were lent: a
 * stopped (not dead) daemon could resume and write them, so they are not
 * given back to the allocator until a new epoch proves the old daemon gone
 * (its flock) or the device goes away.  Counted apart from pinned_pages.
 */
atomic_t kbp_so_orphaned = ATOMIC_INIT(0);

/* socket() refused (no host) plus every socket's fallbacks */
atomic64_t kbp_so_fallbacks = ATOMIC64_INIT(0);

/*
 * kbp_so_rwsem: the current device.  Requests hold it for reading for their
 * whole round trip; removal marks the device dead (failing every waiter),
 * then takes it for writing, so the device outlives every caller using it.
 */
DECLARE_RWSEM(kbp_so_rwsem);
struct kbp_so_dev *kbp_so_cur;
u32 kbp_so_attach_ids;	/* under kbp_so_rwsem (write) */

/*
 * kbp_so_socks_mutex: the list of live outsourced sockets and its length,
 * for /proc/kbp_so.  Taken in process context only (init, close, the
 * /proc reader, which holds it across one read of the file); never taken
 * with kbp_so_rwsem held by the same task except in the reader's header
 * (mutex, then the rwsem for reading): nothing takes them the other way.
 */
DEFINE_MUTEX(kbp_so_socks_mutex);
LIST_HEAD(kbp_so_socks);
unsigned int kbp_so_nsocks;

/*
 * Host sockets whose CLOSE did not go through (no slot, no answer in
 * time), and sockets the host made for a SOCKET whose caller had given up
 * (its completion came late): closed again from the watchdog, so a guest
 * leaks no host socket towards max_sockets.  kbp_so_zombies_lock is taken
 * from the interrupt handler too (the late SOCKET), so irqsave.
 */
static DEFINE_SPINLOCK(kbp_so_zombies_lock);
static LIST_HEAD(kbp_so_zombies);
atomic_t kbp_so_nzombies = ATOMIC_INIT(0);

void kbp_so_zombie_add(u32 attach_id, u32 handle, gfp_t gfp)
{
	struct kbp_so_zombie *z = kmalloc(sizeof(*z), gfp);
	unsigned long flags;

	if (!z) {
		pr_warn_ratelimited("host socket %#x not closed: no memory\n", handle);
		return;
	}
	z->attach_id = attach_id;
	z->handle = handle;
	spin_lock_irqsave(&kbp_so_zombies_lock, flags);
	list_add_tail(&z->node, &kbp_so_zombies);
	spin_unlock_irqrestore(&kbp_so_zombies_lock, flags);
	atomic_inc(&kbp_so_nzombies);
}

void kbp_so_zombies_take(struct list_head *list)
{
	unsigned long flags;

	spin_lock_irqsave(&kbp_so_zombies_lock, flags);
	list_splice_init(&kbp_so_zombies, list);
	spin_unlock_irqrestore(&kbp_so_zombies_lock, flags);
}

void kbp_so_zombies_give_back(struct list_head *list)
{
	unsigned long flags;

	spin_lock_irqsave(&kbp_so_zombies_lock, flags);
	list_splice(list, &kbp_so_zombies);
	spin_unlock_irqrestore(&kbp_so_zombies_lock, flags);
}

void kbp_so_zombie_free(struct kbp_so_zombie *z)
{
	list_del(&z->node);
	kfree(z);
	atomic_dec(&kbp_so_nzombies);
}

/*
 * The policy (design.md 11.13): which sockets of this guest become the
 * host's.  Protocol 253 reaches kbp_so from the BPF program kbpctl loads
 * (a convenience: it rewrites the protocol of a policy cgroup's UDP
 * sockets) or from anyone who asks for it; the module decides:
 *   - the socket's network namespace is one the operator allowed: by
 *     default the initial one only (a process after `unshare -n`, a
 *     container, systemd's PrivateNetwork= keep their own stack);
 *   - and its creator is in the policy's cgroup (a descendant counts), or
 *     asked for protocol 253 itself holding CAP_NET_ADMIN, or has a uid the
 *     operator listed (allow_uids).
 * Everything else: EPERM, counted, said once in a while.  kbp_so_policy_mutex
 * guards the three (process context: parameter writes, socket creation);
 * the cgroup is held with a reference.
 */
#define KBP_SO_MAX_NETNS	8
#define KBP_SO_MAX_UIDS		16

static DEFINE_MUTEX(kbp_so_policy_mutex);
static struct cgroup *kbp_so_policy_cg;
static char kbp_so_policy_cg_path[256];
static u64 kbp_so_netns[KBP_SO_MAX_NETNS];	/* net_cookie; none: init_net */
static unsigned int kbp_so_nnetns;
static u32 kbp_so_uids[KBP_SO_MAX_UIDS];
static unsigned int kbp_so_nuids;
atomic64_t kbp_so_refused_netns = ATOMIC64_INIT(0);
atomic64_t kbp_so_refused_user = ATOMIC64_INIT(0);

/* A copy of @val without the trailing newline sysfs writes bring. */
static char *kbp_so_param_dup(const char *val)
{
	char *v = kstrdup(val, GFP_KERNEL);

	if (v)
		strim(v);
	return v;
}

static int kbp_so_cgroup_set(const char *val, const struct kernel_param *kp)
{
	struct cgroup *cg = NULL, *old;
	char *path = kbp_so_param_dup(val);
	int err = 0;

	if (!path)
		return -ENOMEM;
	if (strlen(path) >= sizeof(kbp_so_policy_cg_path)) {
		err = -ENAMETOOLONG;
		goto out;
	}
	if (*path) {
		/* a path in the cgroup v2 hierarchy, from its root: /kbp.slice/app */
		cg = cgroup_get_from_path(path);
		if (IS_ERR(cg)) {
			err = PTR_ERR(cg);
			goto out;
		}
	}
	mutex_lock(&kbp_so_policy_mutex);
	old = kbp_so_policy_cg;
	kbp_so_policy_cg = cg;
	strscpy(kbp_so_policy_cg_path, path, sizeof(kbp_so_policy_cg_path));
	mutex_unlock(&kbp_so_policy_mutex);
	if (old)
		cgroup_put(old);
out:
	kfree(path);
	return err;
}

static int kbp_so_cgroup_get(char *buf, const struct kernel_param *kp)
{
	int n;

	mutex_lock(&kbp_so_policy_mutex);
	n = sysfs_emit(buf, "%s\n", kbp_so_policy_cg_path);
	mutex_unlock(&kbp_so_policy_mutex);
	return n;
}

static const struct kernel_param_ops kbp_so_cgroup_ops = {
	.set	= kbp_so_cgroup_set,
	.get	= kbp_so_cgroup_get,
};
module_param_cb(cgroup, &kbp_so_cgroup_ops, NULL, 0644);
MODULE_PARM_DESC(cgroup, "cgroup v2 path whose tasks' sockets may be outsourced (empty: none)");

/*
 * A list of numbers ("1,2,3"; "" for none) into @out, all or nothing.
 * @max entries of @shift-bit values (32 or 64).
 */
static int kbp_so_parse_list(const char *val, u64 *out, unsigned int max,
			     unsigned int *n)
{
	char *copy = kbp_so_param_dup(val), *p, *tok;
	unsigned int i = 0;
	int err = 0;

	if (!copy)
		return -ENOMEM;
	p = copy;
	while ((tok = strsep(&p, ",")) != NULL) {
		if (!*tok)
			continue;
		if (i == max) {
			err = -E2BIG;
			break;
		}
		err = kstrtou64(tok, 0, &out[i++]);
		if (err)
			break;
	}
	kfree(copy);
	*n = i;
	return err;
}

static int kbp_so_netns_set(const char *val, const struct kernel_param *kp)
{
	u64 v[KBP_SO_MAX_NETNS];
	unsigned int n;
	int err = kbp_so_parse_list(val, v, KBP_SO_MAX_NETNS, &n);

	if (err)
		return err;
	mutex_lock(&kbp_so_policy_mutex);
	memcpy(kbp_so_netns, v, n * sizeof(v[0]));
	kbp_so_nnetns = n;
	mutex_unlock(&kbp_so_policy_mutex);
	return 0;
}

static int kbp_so_netns_get(char *buf, const struct kernel_param *kp)
{
	unsigned int i;
	int n = 0;

	mutex_lock(&kbp_so_policy_mutex);
	for (i = 0; i < kbp_so_nnetns; i++)
		n += sysfs_emit_at(buf, n, "%s%llu", i ? "," : "", kbp_so_netns[i]);
	n += sysfs_emit_at(buf, n, "%s\n", kbp_so_nnetns ? "" : "init");
	mutex_unlock(&kbp_so_policy_mutex);
	return n;
}

static const struct kernel_param_ops kbp_so_netns_ops = {
	.set	= kbp_so_netns_set,
	.get	= kbp_so_netns_get,
};
module_param_cb(netns, &kbp_so_netns_ops, NULL, 0644);
MODULE_PARM_DESC(netns, "network namespaces (cookies, SO_NETNS_COOKIE) whose sockets may be outsourced (empty: the initial one)");

static int kbp_so_uids_set(const char *val, const struct kernel_param *kp)
{
	u64 v[KBP_SO_MAX_UIDS];
	unsigned int n, i;
	int err = kbp_so_parse_list(val, v, KBP_SO_MAX_UIDS, &n);

	if (err)
		return err;
	for (i = 0; i < n; i++)
		if (v[i] > U32_MAX - 1)
			return -ERANGE;
	mutex_lock(&kbp_so_policy_mutex);
	for (i = 0; i < n; i++)
		kbp_so_uids[i] = v[i];
	kbp_so_nuids = n;
	mutex_unlock(&kbp_so_policy_mutex);
	return 0;
}

static int kbp_so_uids_get(char *buf, const struct kernel_param *kp)
{
	unsigned int i;
	int n = 0;

	mutex_lock(&kbp_so_policy_mutex);
	for (i = 0; i < kbp_so_nuids; i++)
		n += sysfs_emit_at(buf, n, "%s%u", i ? "," : "", kbp_so_uids[i]);
	n += sysfs_emit_at(buf, n, "\n");
	mutex_unlock(&kbp_so_policy_mutex);
	return n;
}

static const struct kernel_param_ops kbp_so_uids_ops = {
	.set	= kbp_so_uids_set,
	.get	= kbp_so_uids_get,
};
module_param_cb(allow_uids, &kbp_so_uids_ops, NULL, 0644);
MODULE_PARM_DESC(allow_uids, "uids (initial user namespace) that may ask for protocol 253 themselves");

/* kbp_so_policy_mutex held */
static bool kbp_so_netns_allowed(const struct net *net)
{
	unsigned int i;

	if (!kbp_so_nnetns)
		return net_eq(net, &init_net);
	for (i = 0; i < kbp_so_nnetns; i++)
		if (kbp_so_netns[i] == net->net_cookie)
			return true;
	return false;
}

/* kbp_so_policy_mutex held */
static bool kbp_so_user_allowed(void)
{
	uid_t uid = from_kuid(&init_user_ns, current_euid());
	bool in = false;
	unsigned int i;

	if (kbp_so_policy_cg) {
		rcu_read_lock();	/* task_css_set() */
		in = task_under_cgroup_hierarchy(current, kbp_so_policy_cg);
		rcu_read_unlock();
	}
	if (in || capable(CAP_NET_ADMIN))
		return true;
	for (i = 0; i < kbp_so_nuids; i++)
		if (kbp_so_uids[i] == uid)
			return true;
	return false;
}

int kbp_so_policy_check(struct sock *sk)
{
	bool net_ok, user_ok = false;

	mutex_lock(&kbp_so_policy_mutex);
	net_ok = kbp_so_netns_allowed(sock_net(sk));
	if (net_ok)
		user_ok = kbp_so_user_allowed();
	mutex_unlock(&kbp_so_policy_mutex);
	if (net_ok && user_ok)
		return 0;
	atomic64_inc(net_ok ? &kbp_so_refused_user : &kbp_so_refused_netns);
	pr_info_ratelimited("refused protocol %d to %s[%d] uid %u: %s\n", KBP_SO_PROTO,
			    current->comm, task_pid_nr(current),
			    from_kuid(&init_user_ns, current_euid()),
			    net_ok ? "not in its cgroup, no CAP_NET_ADMIN, not in allow_uids" :
				     "network namespace not in the policy (netns=)");
	return -EPERM;
}

static int __init kbp_so_init(void)
{
	int err;

	kbp_so_idle_init();
	err = proto_register(&kbp_so_prot, 1);
	if (err)
		return err;
	err = proto_register(&kbp_so_prot6, 1);
	if (err)
		goto err_prot;
	inet_register_protosw(&kbp_so_protosw);
	err = inet6_register_protosw(&kbp_so_protosw6);
	if (err)
		goto err_protosw;
	if (!proc_create_seq("kbp_so", 0400, NULL, &kbp_so_seq_ops)) {
		err = -ENOMEM;
		goto err_protosw6;
	}
	atomic_notifier_chain_register(&panic_notifier_list, &kbp_so_panic_nb);
	err = pci_register_driver(&kbp_so_driver);
	if (err)
		goto err_panic;
	return 0;

err_panic:
	atomic_notifier_chain_unregister(&panic_notifier_list, &kbp_so_panic_nb);
	remove_proc_entry("kbp_so", NULL);
err_protosw6:
	inet6_unregister_protosw(&kbp_so_protosw6);
err_protosw:
	inet_unregister_protosw(&kbp_so_protosw);
	proto_unregister(&kbp_so_prot6);
err_prot:
	proto_unregister(&kbp_so_prot);
	return err;
}

static void __exit kbp_so_exit(void)
{
	struct kbp_so_zombie *z, *tmp;
	LIST_HEAD(zombies);

	/* no socket is left: each holds a reference on this module */
	pci_unregister_driver(&kbp_so_driver);
	atomic_notifier_chain_unregister(&panic_notifier_list, &kbp_so_panic_nb);
	/* their host sockets went with the device */
	kbp_so_zombies_take(&zombies);
	list_for_each_entry_safe(z, tmp, &zombies, node)
		kbp_so_zombie_free(z);
	if (kbp_so_policy_cg)
		cgroup_put(kbp_so_policy_cg);
	/* pages a host that never acked may write: never given back */
	if (atomic_read(&kbp_so_orphaned))
		pr_warn("unloading with %d page(s) pinned for good (a kbp-sod that did not ack)\n",
			atomic_read(&kbp_so_orphaned));
	remove_proc_entry("kbp_so", NULL);
	inet6_unregister_protosw(&kbp_so_protosw6);
	inet_unregister_protosw(&kbp_so_protosw);
	proto_unregister(&kbp_so_prot6);
	proto_unregister(&kbp_so_prot);
}

module_init(kbp_so_init);
module_exit(kbp_so_exit);
MODULE_DESCRIPTION("kbp socket outsourcing: guest UDP sockets served by the host");
MODULE_LICENSE("GPL");
MODULE_VERSION("0.1.0");
