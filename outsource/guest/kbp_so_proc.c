// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so /proc/kbp_so: the state (device, queues, completions by who
 * found them, the idle path, the policy's refusals), then one line per
 * outsourced socket with its names and counters.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

/* Who found a completion: its completions_<who> key. */
static const enum kbp_so_key kbp_so_found_key[KBP_SO_NR_FOUND] = {
	[KBP_SO_BY_IRQ]		= KBP_SO_K_COMPLETIONS_IRQ,
	[KBP_SO_BY_POLL]	= KBP_SO_K_COMPLETIONS_POLLED,
	[KBP_SO_BY_SYSCALL]	= KBP_SO_K_COMPLETIONS_SYSCALL,
	[KBP_SO_BY_IDLE]	= KBP_SO_K_COMPLETIONS_IDLE,
	[KBP_SO_BY_TICK]	= KBP_SO_K_COMPLETIONS_TICK,
};

/*
 * One line's values by key: a number or a word each; a key left unset is
 * not written (kbpctl reads a missing key as "this module does not say").
 */
struct kbp_so_line {
	s64 num[KBP_SO_NR_KEYS];
	const char *text[KBP_SO_NR_KEYS];
	DECLARE_BITMAP(set, KBP_SO_NR_KEYS);
};

static void kbp_so_put(struct kbp_so_line *l, enum kbp_so_key k, s64 v)
{
	l->num[k] = v;
	__set_bit(k, l->set);
}

static void kbp_so_put_text(struct kbp_so_line *l, enum kbp_so_key k,
			    const char *v)
{
	l->text[k] = v;
	__set_bit(k, l->set);
}

static void kbp_so_show_line(struct seq_file *m, const struct kbp_so_line *l)
{
	unsigned int k;

	seq_puts(m, "kbp_so");
	for_each_set_bit(k, l->set, KBP_SO_NR_KEYS) {
		if (kbp_so_keys[k].text)
			seq_printf(m, " %s=%s", kbp_so_keys[k].key, l->text[k]);
		else
			seq_printf(m, " %s=%lld", kbp_so_keys[k].key, l->num[k]);
	}
	seq_putc(m, '\n');
}

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

static int kbp_so_show_head(struct seq_file *m)
{
	const char *state = "detached";
	u64 done[KBP_SO_NR_FOUND] = { }, irqs = 0, sent = 0, poll_ns = 0, halts = 0, races = 0;
	u32 epoch = 0, queues = 0, i, f;
	char idle[sizeof(kbp_so_idle_state)];
	struct kbp_so_line *l;
	unsigned long flags;
	int cpu;

	l = kzalloc(sizeof(*l), GFP_KERNEL);	/* ~450 bytes: not on the stack */
	if (!l)
		return -ENOMEM;
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
	kbp_so_put_text(l, KBP_SO_K_STATE, state);
	kbp_so_put(l, KBP_SO_K_EPOCH, epoch);
	kbp_so_put(l, KBP_SO_K_QUEUES, queues);
	kbp_so_put(l, KBP_SO_K_SOCKETS, kbp_so_nsocks);
	kbp_so_put(l, KBP_SO_K_PINNED_PAGES, atomic_read(&kbp_so_pinned));
	kbp_so_put(l, KBP_SO_K_ORPHAN_PAGES, atomic_read(&kbp_so_orphaned));
	kbp_so_put(l, KBP_SO_K_FALLBACKS, atomic64_read(&kbp_so_fallbacks));
	kbp_so_put(l, KBP_SO_K_HOST_TIMEOUT_MS, READ_ONCE(kbp_so_host_timeout_ms));
	kbp_so_put(l, KBP_SO_K_POLL_US, READ_ONCE(kbp_so_poll_us));
	kbp_so_put_text(l, KBP_SO_K_IDLE, idle);
	kbp_so_put(l, KBP_SO_K_IDLE_POLL_US, READ_ONCE(kbp_so_idle_poll_us));
	kbp_so_put(l, KBP_SO_K_IRQS, irqs);
	kbp_so_put(l, KBP_SO_K_IRQS_SENT, sent);
	for (f = 0; f < KBP_SO_NR_FOUND; f++)
		kbp_so_put(l, kbp_so_found_key[f], done[f]);
	kbp_so_put(l, KBP_SO_K_IDLE_POLL_NS, poll_ns);
	kbp_so_put(l, KBP_SO_K_IDLE_HALTS, halts);
	kbp_so_put(l, KBP_SO_K_IDLE_RACES, races);
	kbp_so_put(l, KBP_SO_K_REFUSED_NETNS, atomic64_read(&kbp_so_refused_netns));
	kbp_so_put(l, KBP_SO_K_REFUSED_USER, atomic64_read(&kbp_so_refused_user));
	kbp_so_put(l, KBP_SO_K_CLOSES_PENDING, atomic_read(&kbp_so_nzombies));
	kbp_so_show_line(m, l);
	kfree(l);
	return 0;
}

static int kbp_so_seq_show(struct seq_file *m, void *v)
{
	struct kbp_so_sock *ks;
	struct kbp_so_addr local, remote;
	struct sock *sk;
	unsigned int i;
	kuid_t uid;

	if (v == &kbp_so_socks)
		return kbp_so_show_head(m);
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
	for (i = 0; i < KBP_SO_NR_STATS; i++)
		seq_printf(m, " %s=%lld", kbp_so_stat_keys[i],
			   atomic64_read(&ks->st.c[i]));
	seq_putc(m, '\n');
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
