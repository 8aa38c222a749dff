// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so /proc/kbp_so: the state (device, queues, completions by who
 * found them, the idle path, the policy's refusals), then one line per
 * outsourced socket with its names and counters.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

static const char * const kbp_so_found_names[KBP_SO_NR_FOUND] = {
	[KBP_SO_BY_IRQ]		= "irq",
	[KBP_SO_BY_POLL]	= "polled",
	[KBP_SO_BY_SYSCALL]	= "syscall",
	[KBP_SO_BY_IDLE]	= "idle",
	[KBP_SO_BY_TICK]	= "tick",
};

/* /proc/kbp_so: the state, then one line per outsourced socket. */
static void kbp_so_show_addr(struct seq_file *m, const char *name,
			     const struct kbp_so_addr *a)
{
	u16 port = ntohs((__force __be16)a->port);

	if (a->family == KBP_SO_AF_INET)
		seq_printf(m, " %s=%pI4:%u", name, a->addr, port);
	else if (a->family == KBP_SO_AF_INET6)
		seq_printf(m, " %s=[%pI6c]:%u", name, a->addr, port);
	else
		seq_printf(m, " %s=-", name);
}

static void kbp_so_show_head(struct seq_file *m)
{
	const char *state = "detached";
	u64 done[KBP_SO_NR_FOUND] = { }, irqs = 0, sent = 0, poll_ns = 0, halts = 0, races = 0;
	u32 epoch = 0, queues = 0, i, f;
	char idle[sizeof(kbp_so_idle_state)];
	unsigned long flags;
	int cpu;

	mutex_lock(&kbp_so_idle_mutex);
	strscpy(idle, kbp_so_idle_state, sizeof(idle));
	mutex_unlock(&kbp_so_idle_mutex);
	down_read(&kbp_so_rwsem);
	if (kbp_so_cur) {
		state = READ_ONCE(kbp_so_cur->host_dead) ? "host-dead" : "attached";
		epoch = kbp_so_cur->epoch;
		queues = kbp_so_cur->nr_used;
		for (i = 0; i < kbp_so_cur->nr_queues; i++) {
			struct kbp_so_queue *q = &kbp_so_cur->q[i];

			spin_lock_irqsave(&q->lock, flags);
			for (f = 0; f < KBP_SO_NR_FOUND; f++)
				done[f] += q->done[f];
			irqs += q->irqs;
			spin_unlock_irqrestore(&q->lock, flags);
			/* the host's own count of the interrupts it raised (since its reset) */
			sent += READ_ONCE(q->ctl->irqs);
		}
	}
	up_read(&kbp_so_rwsem);
	for_each_possible_cpu(cpu) {
		struct kbp_so_cpu *c = per_cpu_ptr(&kbp_so_cpu, cpu);

		/* data_race: each CPU writes its own; a report may be one event late */
		poll_ns += data_race(READ_ONCE(c->poll_ns));
		halts += data_race(READ_ONCE(c->halts));	/* the same */
		races += data_race(READ_ONCE(c->races));	/* the same */
	}
	seq_printf(m, "kbp_so state=%s epoch=%u queues=%u sockets=%u pinned_pages=%d orphan_pages=%d fallbacks=%lld host_timeout_ms=%u poll_us=%u idle=%s idle_poll_us=%u irqs=%llu irqs_sent=%llu",
		   state, epoch, queues, kbp_so_nsocks, atomic_read(&kbp_so_pinned),
		   atomic_read(&kbp_so_orphaned), atomic64_read(&kbp_so_fallbacks),
		   READ_ONCE(kbp_so_host_timeout_ms), READ_ONCE(kbp_so_poll_us), idle,
		   READ_ONCE(kbp_so_idle_poll_us), irqs, sent);
	for (f = 0; f < KBP_SO_NR_FOUND; f++)
		seq_printf(m, " completions_%s=%llu", kbp_so_found_names[f], done[f]);
	seq_printf(m, " idle_poll_ns=%llu idle_halts=%llu idle_races=%llu",
		   poll_ns, halts, races);
	seq_printf(m, " refused_netns=%lld refused_user=%lld closes_pending=%d\n",
		   atomic64_read(&kbp_so_refused_netns), atomic64_read(&kbp_so_refused_user),
		   atomic_read(&kbp_so_nzombies));
}

static int kbp_so_seq_show(struct seq_file *m, void *v)
{
	struct kbp_so_sock *ks;
	struct kbp_so_addr local, remote;
	struct sock *sk;
	kuid_t uid;

	if (v == &kbp_so_socks) {
		kbp_so_show_head(m);
		return 0;
	}
	ks = list_entry(v, struct kbp_so_sock, node);
	sk = &ks->inet.sk;
	/* as /proc/net/udp: the reader's network namespace's sockets only */
	if (!net_eq(sock_net(sk), current->nsproxy->net_ns))
		return 0;
	spin_lock(&ks->name_lock);
	local = ks->local;
	remote = ks->remote;
	spin_unlock(&ks->name_lock);
#ifdef KBP_SO_HAVE_SK_UID
	uid = sk_uid(sk);
#else
	uid = sock_i_uid(sk);
#endif
	/* on the list: not closed yet, so sk_socket and its inode are alive */
	seq_printf(m, "sock ino=%lu uid=%u family=%s",
		   sk->sk_socket ? (unsigned long)SOCK_INODE(sk->sk_socket)->i_ino : 0UL,
		   from_kuid_munged(seq_user_ns(m), uid),
		   sk->sk_family == AF_INET6 ? "inet6" : "inet");
	kbp_so_show_addr(m, "local", &local);
	kbp_so_show_addr(m, "remote", &remote);
	seq_printf(m, " requests=%lld completions=%lld bytes_out=%lld bytes_in=%lld copies=%lld fallbacks=%lld errors=%lld\n",
		   atomic64_read(&ks->st.requests), atomic64_read(&ks->st.completions),
		   atomic64_read(&ks->st.bytes_out), atomic64_read(&ks->st.bytes_in),
		   atomic64_read(&ks->st.copies), atomic64_read(&ks->st.fallbacks),
		   atomic64_read(&ks->st.errors));
	return 0;
}

static void *kbp_so_seq_start(struct seq_file *m, loff_t *pos)
{
	mutex_lock(&kbp_so_socks_mutex);
	return seq_list_start_head(&kbp_so_socks, *pos);
}

static void *kbp_so_seq_next(struct seq_file *m, void *v, loff_t *pos)
{
	return seq_list_next(v, &kbp_so_socks, pos);
}

static void kbp_so_seq_stop(struct seq_file *m, void *v)
{
	mutex_unlock(&kbp_so_socks_mutex);
}

const struct seq_operations kbp_so_seq_ops = {
	.start	= kbp_so_seq_start,
	.next	= kbp_so_seq_next,
	.stop	= kbp_so_seq_stop,
	.show	= kbp_so_seq_show,
};
