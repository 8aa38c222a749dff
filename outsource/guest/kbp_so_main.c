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
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bpf-cgroup.h>
#include <linux/cgroup.h>
#include <linux/completion.h>
#include <linux/context_tracking.h>
#include <linux/cpuidle.h>
#include <linux/delay.h>
#include <linux/hrtimer.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/net.h>
#include <linux/pci.h>
#include <linux/panic_notifier.h>
#include <linux/percpu.h>
#include <linux/proc_fs.h>
#include <linux/rcupdate.h>
#include <linux/rwsem.h>
#include <linux/sched/clock.h>
#include <linux/sched/idle.h>
#include <linux/sched/signal.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/sockios.h>
#include <asm/ioctls.h>
#include <linux/sockptr.h>
#include <linux/spinlock.h>
#include <linux/uio.h>
#include <linux/workqueue.h>
#include <linux/in.h>
#include <linux/inetdevice.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <net/addrconf.h>
#include <net/inet_common.h>
#include <net/ip.h>
#include <net/ipv6.h>
#include <net/protocol.h>
#include <net/sock.h>

#include "kbp_so_abi.h"

/* proto_ops.bind/connect take struct sockaddr_unsized from 7.x (Kbuild probe) */
#ifdef KBP_SO_HAVE_SOCKADDR_UNSIZED
#define kbp_so_uaddr sockaddr_unsized
#else
#define kbp_so_uaddr sockaddr
#endif

#define KBP_SO_PROTO		253	/* RFC 3692 experimental */
#define IVSHMEM_REG_IVPOSITION	8
#define IVSHMEM_REG_DOORBELL	12
#define KBP_SO_HOST_PEER	0	/* kbp-sod's ivshmem peer ID */
#define KBP_SO_CALL_TIMEOUT	(2 * HZ)
#define KBP_SO_ATTACH_MS	2000
#define KBP_SO_FINAL_POLL	(HZ / 10)	/* epoch check while waiting */
#define KBP_SO_POLL_US_MAX	1000		/* poll_us range: 0..this */
#define KBP_SO_IDLE_POLL_US_MAX	2000		/* idle_poll_us range: 0..this */
/* need_irq's parts (kbp_so_abi.h): a sleeping waiter; each halted vCPU */
#define KBP_SO_NEED_WAITER	1
#define KBP_SO_NEED_HALTED	2
#define KBP_SO_TIMEOUT_MIN	200		/* host_timeout_ms range */
#define KBP_SO_BACKOFF_MS	64U		/* a slot-less waiter's longest poll */
#define KBP_SO_TIMEOUT_MAX	600000

/*
 * Pages of user buffers lent to a live host right now (pinned).
 * /sys/module/kbp_so/parameters/pinned_pages; 0 when
 * idle.  Pages kept for a dead host are orphan_pages (/proc/kbp_so).
 */
static atomic_t kbp_so_pinned = ATOMIC_INIT(0);

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
static unsigned int kbp_so_host_timeout_ms = 3000;

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
static unsigned int kbp_so_poll_us;

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
static atomic_t kbp_so_orphaned = ATOMIC_INIT(0);

/* socket() refused (no host) plus every socket's fallbacks */
static atomic64_t kbp_so_fallbacks = ATOMIC64_INIT(0);

/*
 * Who found a final completion (/proc/kbp_so's completions_<name>): the
 * queue's interrupt handler; the caller polling for its own request
 * (poll_us); another outsourced system call's sweep; an idle vCPU (the
 * idle path, design.md 11.11); the tick-aligned sweep of a busy vCPU.
 */
enum kbp_so_found {
	KBP_SO_BY_IRQ,
	KBP_SO_BY_POLL,
	KBP_SO_BY_SYSCALL,
	KBP_SO_BY_IDLE,
	KBP_SO_BY_TICK,
	KBP_SO_NR_FOUND
};

static const char * const kbp_so_found_names[KBP_SO_NR_FOUND] = {
	[KBP_SO_BY_IRQ]		= "irq",
	[KBP_SO_BY_POLL]	= "polled",
	[KBP_SO_BY_SYSCALL]	= "syscall",
	[KBP_SO_BY_IDLE]	= "idle",
	[KBP_SO_BY_TICK]	= "tick",
};

struct kbp_so_req {
	struct completion done;
	struct kbp_so_cqe cqe;
	/* called before done completes, in the interrupt handler: no sleeping */
	void (*done_fn)(struct kbp_so_req *req);
	/* set by the submitter before submission, read under the queue's lock */
	bool lends;			/* guest pages are in its segments */
	/* written under the queue's lock before done completes */
	bool from_host;			/* the host posted its final CQE */
	bool orphan;			/* failed for a dead host: pages lent */
	/* under the queue's lock: counted in its irq_wanted */
	bool wants_irq;
	/* set by kbp_so_submit() before the slot is taken: may park, whose */
	bool parks;
	kuid_t uid;
};

/*
 * Which slots of a queue a request may take (fair sharing, design.md
 * 11.13).  SHARED: all but the last KBP_SO_RESERVED; a request that may
 * park on the host (KBP_SO_F_WAIT) also no more than kbp_so_parked_max()
 * of its user's in the queue.  RESERVED: any, for CANCEL and CLOSE: a user
 * who parked a ring full of receives keeps no killed task from cancelling
 * its own and no socket from closing.
 */
enum kbp_so_slots {
	KBP_SO_SLOTS_SHARED,
	KBP_SO_SLOTS_RESERVED,
};

#define KBP_SO_RESERVED		2

struct kbp_so_dev;

struct kbp_so_queue {
	struct kbp_so_dev *dev;
	u32 idx;			/* in a tag: the CANCEL names it */
	/*
	 * lock: the guest's private ring state below and the slot table.  Taken
	 * by submitters (process context, irqsave) and by the queue's interrupt
	 * handler; a threaded handler on PREEMPT_RT, where it sleeps, which is
	 * fine: nothing here is taken from a context that cannot.
	 */
	spinlock_t lock;
	struct kbp_so_queue_ctl *ctl;	/* shared */
	struct kbp_so_sqe *sq;		/* shared */
	struct kbp_so_cqe *cq;		/* shared */
	u32 sq_tail;
	u32 cq_head;
	struct kbp_so_req **slots;	/* ring_entries; a tag's low half */
	u32 *slot_gen;			/* a tag's high half */
	bool broken;			/* host posted an impossible cq_tail */
	/*
	 * Requests in a slot whose waiter sleeps (or that nobody polls): while
	 * any, need_irq's KBP_SO_NEED_WAITER is set (without the idle path).
	 * Under lock, like the slots they count; read racily as a hint by the
	 * tick-aligned sweep.
	 */
	u32 irq_wanted;
	/* final completions by who found them, and handler runs: under lock */
	u64 done[KBP_SO_NR_FOUND];
	u64 irqs;
	int irq;			/* the queue's vector */
	/* PREEMPT_RT: bit 0, the idle path woke the handler's thread */
	unsigned long idle_kick;
};

struct kbp_so_dev {
	struct pci_dev *pdev;
	void __iomem *regs;		/* BAR0 */
	struct kbp_so_header *hdr;	/* BAR2, write-back mapped */
	size_t size;
	u32 nr_queues;			/* laid out by the host */
	u32 nr_used;			/* queues that have an interrupt vector */
	u32 entries;
	u32 epoch;
	u32 attach_id;
	bool dead;			/* under every queue's lock to set */
	/*
	 * host_dead: the heartbeat stood still for host_timeout_ms, or the
	 * epoch moved.  Set under every queue's lock (as dead), read under one
	 * or with READ_ONCE; never cleared (no re-attach yet).
	 */
	bool host_dead;
	/* the host honours need_irq (KBP_SO_FEAT_NEED_IRQ); set at attach */
	bool irq_on_demand;
	/* KBP_SO_FEAT_* the host offers and this module uses; set at attach */
	u64 features;
	/*
	 * idle: the idle path is on (design.md 11.11): sleeping waiters leave
	 * need_irq to the vCPUs that halt.  Set under every queue's lock (by
	 * kbp_so_idle_mode()), read under one.
	 */
	bool idle;
	/* the watchdog's own: only kbp_so_watch() touches them */
	u64 hb;
	unsigned long hb_at;
	bool orphans_freed;
	struct delayed_work watch;
	struct kbp_so_queue *q;
};

/*
 * kbp_so_rwsem: the current device.  Requests hold it for reading for their
 * whole round trip; removal marks the device dead (failing every waiter),
 * then takes it for writing, so the device outlives every caller using it.
 */
static DECLARE_RWSEM(kbp_so_rwsem);
static struct kbp_so_dev *kbp_so_cur;
static u32 kbp_so_attach_ids;	/* under kbp_so_rwsem (write) */

/*
 * Per-socket counters for /proc/kbp_so.  The operations of one socket are
 * not serialized here (no lock_sock: two threads may send and receive on it
 * at once, and the POLL callback runs in the interrupt handler), so they
 * are atomic64_t: uncontended in the common case, one locked add each.
 */
struct kbp_so_stats {
	atomic64_t requests;		/* SQEs submitted for the socket */
	atomic64_t completions;		/* final CQEs the host posted */
	atomic64_t bytes_out;
	atomic64_t bytes_in;
	atomic64_t copies;		/* data requests the host copied for */
	atomic64_t fallbacks;		/* EOPNOTSUPP the module said itself */
	atomic64_t errors;		/* host completions with res < 0 */
};

struct kbp_so_sock {
	struct inet_sock inet;		/* first: inet_create uses inet_sk() */
	u32 handle;			/* the host's; 0: none */
	u32 attach_id;			/* the attach that made it */
	bool rd_shut;			/* SHUT_RD asked: an empty read is EOF */
	/*
	 * used: bound, connected or sent from (the host may have given it a
	 * port); port: its claim on kbp_so_ports (0: none).  Both under
	 * kbp_so_ports_mutex.
	 */
	bool used;
	u16 port;
	/*
	 * cmsg: the receive options of IP/IPv6 level the guest keeps itself
	 * (KBP_SO_CM_*: what recvmsg puts in its control messages, from the
	 * host's struct kbp_so_rxmeta); written by setsockopt, read by recvmsg.
	 */
	unsigned long cmsg;
	/*
	 * err_work: fetches the host socket's SO_ERROR after a POLL said
	 * POLLERR, into sk_err (getsockopt(SO_ERROR), the next send or
	 * receive, as for a local socket).  ERR_FETCH bit of cmsg's
	 * neighbour flags: queued, holding a socket reference.
	 */
	struct work_struct err_work;
	unsigned long flags;
	struct kbp_so_stats st;
	/* on kbp_so_socks from a successful init to close (kbp_so_socks_mutex) */
	struct list_head node;
	/*
	 * name_lock: the cached names shown in /proc/kbp_so, written by bind,
	 * connect and getname, read by the /proc reader; nothing nests in it.
	 */
	spinlock_t name_lock;
	struct kbp_so_addr local;
	struct kbp_so_addr remote;
	/*
	 * revents: the host's last answer (KBP_SO_POLL_*), a hint that a
	 * receive or a send that would block clears.  Atomic: the POLL's
	 * completion callback writes it in the interrupt handler.
	 */
	atomic_t revents;
	/*
	 * poll_lock: the armed POLL request, at most one per socket.  Process
	 * context only (->poll, a receive or send that found nothing, close),
	 * never the interrupt handler, which completes poll_req without it.
	 * poll_armed: poll_req was submitted and its completion not yet taken
	 * back.  The request is ours again only once completion_done() says
	 * so: that waits for complete() to return, the handler's last touch of
	 * this socket, so close can free it and a new POLL can reuse poll_req
	 * (the callback alone is not the end: design.md 11.13).  Nests outside
	 * a queue's lock (kbp_so_submit()).
	 */
	spinlock_t poll_lock;
	bool poll_armed;
	bool poll_closing;		/* no POLL is armed after this */
	u32 poll_want;			/* the armed POLL's events */
	u64 poll_tag;			/* its tag, for a CANCEL */
	struct kbp_so_req poll_req;
	struct kbp_so_queue *poll_q;
	u32 poll_slot;
};

/*
 * kbp_so_socks_mutex: the list of live outsourced sockets and its length,
 * for /proc/kbp_so.  Taken in process context only (init, close, the
 * /proc reader, which holds it across one read of the file); never taken
 * with kbp_so_rwsem held by the same task except in the reader's header
 * (mutex, then the rwsem for reading): nothing takes them the other way.
 */
static DEFINE_MUTEX(kbp_so_socks_mutex);
static LIST_HEAD(kbp_so_socks);
static unsigned int kbp_so_nsocks;

/*
 * kbp_so_orphans_lock: the orphan list only (process context: a waiter
 * that learns its host is dead, the watchdog, removal).
 */
struct kbp_so_orphan;
static DEFINE_SPINLOCK(kbp_so_orphans_lock);
static LIST_HEAD(kbp_so_orphans);

/*
 * Host sockets whose CLOSE did not go through (no slot, no answer in
 * time), and sockets the host made for a SOCKET whose caller had given up
 * (its completion came late): closed again from the watchdog, so a guest
 * leaks no host socket towards max_sockets.  kbp_so_zombies_lock is taken
 * from the interrupt handler too (the late SOCKET), so irqsave.
 */
struct kbp_so_zombie {
	struct list_head node;
	u32 attach_id;
	u32 handle;
};

static DEFINE_SPINLOCK(kbp_so_zombies_lock);
static LIST_HEAD(kbp_so_zombies);
static atomic_t kbp_so_nzombies = ATOMIC_INIT(0);

static void kbp_so_zombie_add(u32 attach_id, u32 handle, gfp_t gfp)
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

static void kbp_so_zombies_take(struct list_head *list)
{
	unsigned long flags;

	spin_lock_irqsave(&kbp_so_zombies_lock, flags);
	list_splice_init(&kbp_so_zombies, list);
	spin_unlock_irqrestore(&kbp_so_zombies_lock, flags);
}

static void kbp_so_zombies_give_back(struct list_head *list)
{
	unsigned long flags;

	spin_lock_irqsave(&kbp_so_zombies_lock, flags);
	list_splice(list, &kbp_so_zombies);
	spin_unlock_irqrestore(&kbp_so_zombies_lock, flags);
}

static void kbp_so_zombie_free(struct kbp_so_zombie *z)
{
	list_del(&z->node);
	kfree(z);
	atomic_dec(&kbp_so_nzombies);
}

static struct kbp_so_sock *kbp_so_sk(const struct sock *sk)
{
	return (struct kbp_so_sock *)sk;
}

static void kbp_so_count_done(struct kbp_so_sock *ks, const struct kbp_so_req *req)
{
	if (!ks || !req->from_host)
		return;
	atomic64_inc(&ks->st.completions);
	if (req->cqe.res < 0)
		atomic64_inc(&ks->st.errors);
}

static int kbp_so_fallback(struct kbp_so_sock *ks)
{
	atomic64_inc(&ks->st.fallbacks);
	atomic64_inc(&kbp_so_fallbacks);
	return -EOPNOTSUPP;
}

/* A request's final completion: its callback, then its waiter. */
static void kbp_so_finish(struct kbp_so_req *req)
{
	if (req->done_fn)
		req->done_fn(req);
	complete(&req->done);
}

/*
 * need_irq, a __u32 of the shared control block that the guest composes
 * only with atomic operations (kbp_so_abi.h): a sleeping waiter's bit
 * under the queue's lock, the halted vCPUs' count from the idle path,
 * which cannot take that lock (PREEMPT_RT: it sleeps).
 */
static atomic_t *kbp_so_need(struct kbp_so_queue *q)
{
	return (atomic_t *)&q->ctl->need_irq;
}

/*
 * The idle path's per-CPU state (design.md 11.11).  sweep: the
 * tick-aligned sweep, pinned to the CPU that armed it.  in_idle: this CPU
 * is inside kbp_so_idle_enter(), which kbp_so_idle_stop() waits out.  The
 * counters are written by this CPU's idle path only, with interrupts off;
 * /proc/kbp_so reads them racily (a u64 on a 64-bit kernel).
 */
struct kbp_so_cpu {
	struct hrtimer sweep;
	bool in_idle;
	u64 poll_ns;			/* idle_poll_ns */
	u64 halts;			/* idle_halts */
	u64 races;			/* idle_races */
};

static DEFINE_PER_CPU(struct kbp_so_cpu, kbp_so_cpu);

/*
 * Arms this CPU's sweep, if it is not queued: soft expiry in one tick,
 * hard expiry one tick later.  While the CPU runs, its tick's interrupt
 * runs every hrtimer past its soft expiry, so the sweep rides the tick
 * and adds no interrupt of its own.  Caller: interrupts off or migration
 * disabled (a queue's lock).
 */
static void kbp_so_sweep_arm(void)
{
	struct hrtimer *t = this_cpu_ptr(&kbp_so_cpu.sweep);

	if (!hrtimer_is_queued(t))
		hrtimer_start_range_ns(t, ns_to_ktime(TICK_NSEC), TICK_NSEC,
				       HRTIMER_MODE_REL_PINNED_SOFT);
}

/*
 * need_irq (docs/design.md, 11.10): set while a request in a slot of @q has
 * no caller polling for it, clear when none.  q->lock held.  The host
 * publishes cq_tail, a full barrier, then reads need_irq; a caller that
 * stops polling sets it, a full barrier, then looks at cq_tail once more
 * (kbp_so_poll_wait()), so a completion is either seen or interrupts.
 */
static void kbp_so_want_irq(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			    struct kbp_so_req *req)
{
	if (req->wants_irq)
		return;
	req->wants_irq = true;
	if (dev->idle)
		kbp_so_sweep_arm();
	else if (q->irq_wanted == 0 && dev->irq_on_demand)
		atomic_or(KBP_SO_NEED_WAITER, kbp_so_need(q));
	q->irq_wanted++;
}

/* @req left its slot (completed, forgotten or failed).  q->lock held. */
static void kbp_so_unwant_irq(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			      struct kbp_so_req *req)
{
	if (!req->wants_irq)
		return;
	req->wants_irq = false;
	if (--q->irq_wanted == 0 && dev->irq_on_demand)
		atomic_andnot(KBP_SO_NEED_WAITER, kbp_so_need(q));
}

/* Consumes the queue's new completions and wakes their callers (@by found them). */
static void kbp_so_reap(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			enum kbp_so_found by)
{
	unsigned long flags;
	u32 tail;

	spin_lock_irqsave(&q->lock, flags);
	if (by == KBP_SO_BY_IRQ)
		q->irqs++;
	/* acquire: the CQEs before cq_tail are written (host's release) */
	tail = smp_load_acquire(&q->ctl->cq_tail);
	if (tail - q->cq_head > dev->entries) {
		if (!q->broken)
			pci_err(dev->pdev, "host posted cq_tail %u, head %u: queue stopped\n",
				tail, q->cq_head);
		q->broken = true;
	}
	while (!q->broken && q->cq_head != tail) {
		struct kbp_so_cqe cqe;
		struct kbp_so_req *req;
		u32 slot;

		memcpy(&cqe, &q->cq[q->cq_head & (dev->entries - 1)], sizeof(cqe));
		q->cq_head++;
		slot = lower_32_bits(cqe.tag) & 0xffff;
		if ((lower_32_bits(cqe.tag) >> 16) != q->idx ||
		    slot >= dev->entries || !q->slots[slot] ||
		    q->slot_gen[slot] != upper_32_bits(cqe.tag)) {
			/* a caller that timed out; a socket it made is closed later */
			if (cqe.op == KBP_SO_OP_SOCKET && cqe.res >= 0)
				kbp_so_zombie_add(dev->attach_id, cqe.sock, GFP_ATOMIC);
			continue;
		}
		req = q->slots[slot];
		q->slots[slot] = NULL;
		kbp_so_unwant_irq(dev, q, req);
		q->done[by]++;
		req->cqe = cqe;
		req->from_host = true;
		kbp_so_finish(req);
	}
	/* release: our reads of the slots are done before the host reuses them */
	smp_store_release(&q->ctl->cq_head, q->cq_head);
	spin_unlock_irqrestore(&q->lock, flags);
}

static irqreturn_t kbp_so_irq(int irq, void *data)
{
	struct kbp_so_queue *q = data;

	/* PREEMPT_RT: the idle path may have woken this thread (no interrupt) */
	if (test_and_clear_bit(0, &q->idle_kick)) {
		kbp_so_reap(q->dev, q, KBP_SO_BY_IDLE);
		return IRQ_HANDLED;
	}
	kbp_so_reap(q->dev, q, KBP_SO_BY_IRQ);
	return IRQ_HANDLED;
}

/*
 * @q has completions nobody consumed yet: a hint without the lock.  cq_head
 * only grows under it, so a stale one says "new"; kbp_so_reap() reads both
 * again under the lock.
 */
static bool kbp_so_has_new(struct kbp_so_queue *q)
{
	/* data_race: the hint above; the lock's holder decides */
	return READ_ONCE(q->ctl->cq_tail) != data_race(q->cq_head);
}

/* Reaps every queue that has new completions. */
static void kbp_so_sweep(struct kbp_so_dev *dev, enum kbp_so_found by)
{
	u32 i;

	for (i = 0; i < dev->nr_used; i++)
		if (kbp_so_has_new(&dev->q[i]))
			kbp_so_reap(dev, &dev->q[i], by);
}

/*
 * max_parked_per_user: how many requests that park on the host (blocking
 * receives and sends, armed POLLs) one guest user may have in one queue at
 * a time; 0 (the default): half of the queue's shared slots.  Past it, a
 * blocking call waits in the guest for the socket's readiness instead (its
 * POLL, or a 1 ms poll when that cannot be armed either) and asks without
 * parking: slower, never refused; a POLL that cannot be armed says "ready",
 * and the caller's next operation finds out.
 */
static unsigned int kbp_so_max_parked;
module_param_named(max_parked_per_user, kbp_so_max_parked, uint, 0644);
MODULE_PARM_DESC(max_parked_per_user, "parked blocking calls per user and queue (0: half the queue)");

static u32 kbp_so_parked_max(const struct kbp_so_dev *dev)
{
	u32 max = READ_ONCE(kbp_so_max_parked);
	u32 half = (dev->entries - KBP_SO_RESERVED) / 2;

	return max ? min(max, dev->entries - KBP_SO_RESERVED) : max(half, 1U);
}

/*
 * A free slot of @q that @req may take, or -errno.  q->lock held.  -EUSERS
 * (the caller's user has its share of parked requests here) is the
 * caller's to turn into a wait in the guest: no user sees it.
 */
static int kbp_so_find_slot(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			    struct kbp_so_req *req, enum kbp_so_slots kind)
{
	u32 limit = dev->entries - (kind == KBP_SO_SLOTS_SHARED ? KBP_SO_RESERVED : 0);
	u32 s, used = 0, mine = 0, free = dev->entries;

	for (s = 0; s < dev->entries; s++) {
		struct kbp_so_req *r = q->slots[s];

		if (!r) {
			free = min(free, s);
			continue;
		}
		used++;
		if (r->parks && uid_eq(r->uid, req->uid))
			mine++;
	}
	if (free == dev->entries || used >= limit ||
	    q->sq_tail - READ_ONCE(q->ctl->sq_head) >= limit)
		return -EAGAIN;
	if (req->parks && mine >= kbp_so_parked_max(dev))
		return -EUSERS;
	return free;
}

/*
 * Puts @sqe on @q for @req and rings the doorbell.  The caller holds
 * kbp_so_rwsem for reading (the device stays).  Returns the slot, or
 * -errno when nothing was submitted.  The tag is (generation << 32 | queue
 * << 16 | slot): the queue makes it unique in the VM, for CANCEL.
 */
static int kbp_so_submit(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			 struct kbp_so_sqe *sqe, struct kbp_so_req *req, bool poll,
			 enum kbp_so_slots kind)
{
	unsigned long flags;
	bool polling;
	int slot;

	init_completion(&req->done);
	memset(&req->cqe, 0, sizeof(req->cqe));
	req->from_host = false;
	req->orphan = false;
	req->wants_irq = false;
	/* may stay in its slot indefinitely: a blocking call, or an armed POLL */
	req->parks = ((sqe->flags & KBP_SO_F_WAIT) &&
		      !(sqe->msg_flags & KBP_SO_MSG_DONTWAIT)) ||
		     (sqe->flags & KBP_SO_F_ARM);
	req->uid = current_euid();
	spin_lock_irqsave(&q->lock, flags);
	if (dev->dead || q->broken || dev->host_dead) {
		spin_unlock_irqrestore(&q->lock, flags);
		return dev->host_dead ? -ECONNRESET : -ENETDOWN;
	}
	slot = kbp_so_find_slot(dev, q, req, kind);
	if (slot < 0) {
		spin_unlock_irqrestore(&q->lock, flags);
		return slot;
	}
	q->slots[slot] = req;
	q->slot_gen[slot]++;
	/* before the host can see it (the release below): its completion interrupts */
	if (!poll)
		kbp_so_want_irq(dev, q, req);
	sqe->tag = (u64)q->slot_gen[slot] << 32 | q->idx << 16 | slot;
	memcpy(&q->sq[q->sq_tail & (dev->entries - 1)], sqe, sizeof(*sqe));
	q->sq_tail++;
	/* release: the SQE is written before the host can see the new tail */
	smp_store_release(&q->ctl->sq_tail, q->sq_tail);
	/* sq_tail before host_polling: pairs with the host's clear-then-rescan */
	smp_mb();
	polling = READ_ONCE(q->ctl->host_polling);
	spin_unlock_irqrestore(&q->lock, flags);
	if (!polling)
		writel(KBP_SO_HOST_PEER << 16 | q->idx, dev->regs + IVSHMEM_REG_DOORBELL);
	return slot;
}

/*
 * Takes @req out of its slot if it is still there (q->lock: the interrupt
 * handler empties slots under it).  False: the completion is on its way.
 */
static bool kbp_so_forget(struct kbp_so_queue *q, u32 slot, struct kbp_so_req *req)
{
	unsigned long flags;
	bool gone = false;

	spin_lock_irqsave(&q->lock, flags);
	if (q->slots[slot] == req) {
		q->slots[slot] = NULL;
		kbp_so_unwant_irq(q->dev, q, req);
		gone = true;
	}
	spin_unlock_irqrestore(&q->lock, flags);
	return gone;
}

static struct kbp_so_queue *kbp_so_this_queue(struct kbp_so_dev *dev)
{
	return &dev->q[raw_smp_processor_id() % dev->nr_used];
}

/* Poll for completions on this request, or ask at once (poll_us 0, no need_irq). */
static bool kbp_so_will_poll(struct kbp_so_dev *dev)
{
	return dev->irq_on_demand && READ_ONCE(kbp_so_poll_us);
}

/*
 * For a request submitted with @poll: reap @q's completions for up to
 * poll_us (less if the CPU is wanted or a signal is pending), then, if it
 * is still out, count it for need_irq, a full barrier, and reap once more
 * (the host's side of the pairing: cq_tail, barrier, need_irq).  The caller
 * then waits on req->done as usual, asleep if it must.
 */
static void kbp_so_poll_wait(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			     struct kbp_so_req *req)
{
	u64 end = local_clock() + (u64)READ_ONCE(kbp_so_poll_us) * NSEC_PER_USEC;
	unsigned long flags;

	while (!completion_done(&req->done)) {
		if (kbp_so_has_new(q)) {
			kbp_so_reap(dev, q, KBP_SO_BY_POLL);
			continue;
		}
		if (local_clock() >= end || need_resched() || signal_pending(current))
			break;
		cpu_relax();
	}
	spin_lock_irqsave(&q->lock, flags);
	if (!completion_done(&req->done))
		kbp_so_want_irq(dev, q, req);
	spin_unlock_irqrestore(&q->lock, flags);
	/* need_irq before cq_tail: pairs with the host's cq_tail, barrier, need_irq */
	smp_mb();
	kbp_so_reap(dev, q, KBP_SO_BY_POLL);
}

/*
 * One synchronous request that lends the host no guest memory, on @q.
 * The caller holds kbp_so_rwsem for reading.  Returns 0 with *cqe filled,
 * or -errno.
 */
static int kbp_so_call_on(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			  struct kbp_so_sqe *sqe, struct kbp_so_cqe *cqe,
			  struct kbp_so_sock *ks, enum kbp_so_slots kind)
{
	struct kbp_so_req req = { };
	bool poll = kbp_so_will_poll(dev);
	int slot;

	if (READ_ONCE(dev->idle))
		kbp_so_sweep(dev, KBP_SO_BY_SYSCALL);
	slot = kbp_so_submit(dev, q, sqe, &req, poll, kind);
	if (slot < 0)
		return slot;
	if (ks)
		atomic64_inc(&ks->st.requests);
	if (poll)
		kbp_so_poll_wait(dev, q, &req);
	if (!wait_for_completion_timeout(&req.done, KBP_SO_CALL_TIMEOUT)) {
		/* no pages are lent: forgetting an unanswered slot is safe */
		if (kbp_so_forget(q, slot, &req))
			return -ETIMEDOUT;
		wait_for_completion(&req.done);
	}
	kbp_so_count_done(ks, &req);
	*cqe = req.cqe;
	return 0;
}

static int kbp_so_call(struct kbp_so_dev *dev, struct kbp_so_sqe *sqe,
		       struct kbp_so_cqe *cqe, struct kbp_so_sock *ks,
		       enum kbp_so_slots kind)
{
	return kbp_so_call_on(dev, kbp_so_this_queue(dev), sqe, cqe, ks, kind);
}

/* The device a socket was made on, still attached; kbp_so_rwsem held. */
static int kbp_so_sock_check(struct kbp_so_sock *ks)
{
	if (!kbp_so_cur || kbp_so_cur->attach_id != ks->attach_id || !ks->handle)
		return -ECONNRESET;	/* its host socket is gone */
	if (READ_ONCE(kbp_so_cur->host_dead))
		return -ECONNRESET;	/* and so is its host */
	if (READ_ONCE(kbp_so_cur->hdr->epoch) != kbp_so_cur->epoch)
		return -ECONNRESET;	/* the daemon restarted */
	return 0;
}

/* A request by a socket: the device it was made on, still attached. */
static int kbp_so_sock_call_slots(struct sock *sk, struct kbp_so_sqe *sqe,
				  struct kbp_so_cqe *cqe, enum kbp_so_slots kind)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	int err;

	sqe->sock = ks->handle;
	down_read(&kbp_so_rwsem);
	err = kbp_so_sock_check(ks);
	if (!err)
		err = kbp_so_call(kbp_so_cur, sqe, cqe, ks, kind);
	up_read(&kbp_so_rwsem);
	if (!err && cqe->res < 0)
		err = cqe->res;
	return err;
}

static int kbp_so_sock_call(struct sock *sk, struct kbp_so_sqe *sqe,
			    struct kbp_so_cqe *cqe)
{
	return kbp_so_sock_call_slots(sk, sqe, cqe, KBP_SO_SLOTS_SHARED);
}

/*
 * A user's address for the host.  An AF_INET socket takes sockaddr_in; an
 * AF_INET6 one sockaddr_in6 and, as udpv6 does, sockaddr_in too (the host's
 * AF_INET6 socket decides, v4-mapped).
 */
static int kbp_so_addr_from(const struct sock *sk, const struct sockaddr *uaddr,
			    int len, struct kbp_so_addr *a)
{
	const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)uaddr;
	const struct sockaddr_in *sin = (const struct sockaddr_in *)uaddr;

	memset(a, 0, sizeof(*a));
	if (len < (int)sizeof(sa_family_t))
		return -EINVAL;
	if (uaddr->sa_family == AF_UNSPEC)
		return 0;
	if (uaddr->sa_family == AF_INET6 && sk->sk_family == AF_INET6) {
		if (len < SIN6_LEN_RFC2133)
			return -EINVAL;
		a->family = KBP_SO_AF_INET6;
		a->port = (__force u16)sin6->sin6_port;
		a->flowinfo = (__force u32)sin6->sin6_flowinfo;
		memcpy(a->addr, &sin6->sin6_addr, 16);
		if (len >= (int)sizeof(*sin6))
			a->scope_id = sin6->sin6_scope_id;
		return 0;
	}
	if (uaddr->sa_family != AF_INET)
		return -EAFNOSUPPORT;
	if (len < (int)sizeof(*sin))
		return -EINVAL;
	a->family = KBP_SO_AF_INET;
	a->port = (__force u16)sin->sin_port;
	memcpy(a->addr, &sin->sin_addr, 4);
	return 0;
}

/* The host's address for the user: the length written, 0 for none. */
static int kbp_so_addr_to(const struct kbp_so_addr *a, struct sockaddr *uaddr)
{
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)uaddr;
	struct sockaddr_in *sin = (struct sockaddr_in *)uaddr;

	if (a->family == KBP_SO_AF_INET6) {
		memset(sin6, 0, sizeof(*sin6));
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = (__force __be16)a->port;
		sin6->sin6_flowinfo = (__force __be32)a->flowinfo;
		memcpy(&sin6->sin6_addr, a->addr, 16);
		sin6->sin6_scope_id = a->scope_id;
		return sizeof(*sin6);
	}
	if (a->family == KBP_SO_AF_INET) {
		memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = (__force __be16)a->port;
		memcpy(&sin->sin_addr, a->addr, 4);
		return sizeof(*sin);
	}
	return 0;
}

/* The names /proc/kbp_so shows: what the host said (bind, getname), connect's peer. */
static void kbp_so_set_name(struct kbp_so_sock *ks, struct kbp_so_addr *to,
			    const struct kbp_so_addr *a)
{
	spin_lock(&ks->name_lock);
	*to = *a;
	spin_unlock(&ks->name_lock);
}

/* ks->cmsg bits: the IP/IPv6 receive options kept in the guest */
enum {
	KBP_SO_CM_PKTINFO,		/* IP_PKTINFO */
	KBP_SO_CM_TOS,			/* IP_RECVTOS */
	KBP_SO_CM_TTL,			/* IP_RECVTTL */
	KBP_SO_CM_PKTINFO6,		/* IPV6_RECVPKTINFO */
	KBP_SO_CM_TCLASS,		/* IPV6_RECVTCLASS */
	KBP_SO_CM_HOPLIMIT,		/* IPV6_RECVHOPLIMIT */
	KBP_SO_NR_CM
};

/* The KBP_SO_CM_* bit of an IP/IPv6 level option, or -1. */
static int kbp_so_cmsg_opt(const struct sock *sk, int level, int optname)
{
	if (level == SOL_IP && sk->sk_family == AF_INET) {
		switch (optname) {
		case IP_PKTINFO:
			return KBP_SO_CM_PKTINFO;
		case IP_RECVTOS:
			return KBP_SO_CM_TOS;
		case IP_RECVTTL:
			return KBP_SO_CM_TTL;
		}
	}
	if (level == SOL_IPV6 && sk->sk_family == AF_INET6) {
		switch (optname) {
		case IPV6_RECVPKTINFO:
			return KBP_SO_CM_PKTINFO6;
		case IPV6_RECVTCLASS:
			return KBP_SO_CM_TCLASS;
		case IPV6_RECVHOPLIMIT:
			return KBP_SO_CM_HOPLIMIT;
		}
	}
	return -1;
}

/* The host offers the receive metadata and the send source (ABI 1.1). */
static bool kbp_so_has_meta(void)
{
	bool meta;

	down_read(&kbp_so_rwsem);
	meta = kbp_so_cur && (kbp_so_cur->features & KBP_SO_FEAT_META);
	up_read(&kbp_so_rwsem);
	return meta;
}

/*
 * The kernel's own rules, kept for outsourced sockets (design.md 11.13).
 * The host's socket belongs to kbp-sod, so the host kernel applies none of
 * the guest's: the guest's cgroup BPF sock_addr programs (bind, connect,
 * sendmsg, recvmsg, getsockname/getpeername: they live in inet_bind(),
 * udp_sendmsg()... which an outsourced socket never calls), the privileged
 * port rule, and SO_REUSEPORT's "same user" rule, all run here.
 */
static kuid_t kbp_so_owner(struct sock *sk)
{
#ifdef KBP_SO_HAVE_SK_UID
	return sk_uid(sk);
#else
	return sock_i_uid(sk);
#endif
}

/*
 * Runs the cgroup BPF sock_addr programs of @atype on @uaddr (a kernel
 * copy the programs may rewrite, *@len its length), as the kernel's
 * BPF_CGROUP_RUN_*_LOCK macros do.  @t_ctx: the source address a UDP
 * sendmsg program may set; @flags: bind's.  0 or -EPERM.
 */
static int kbp_so_sa_hook(struct sock *sk, struct sockaddr *uaddr, int *len,
			  enum cgroup_bpf_attach_type atype, void *t_ctx, u32 *flags)
{
#ifdef CONFIG_CGROUP_BPF
	int err;

	/* cgroup_bpf_enabled() with a constant only: its static branch is asm */
	if (!static_key_enabled(&cgroup_bpf_enabled_key[atype]))
		return 0;
	lock_sock(sk);
#ifdef KBP_SO_HAVE_SA_UADDRLEN
	err = __cgroup_bpf_run_filter_sock_addr(sk, (void *)uaddr, len, atype, t_ctx,
						flags);
#else
	err = __cgroup_bpf_run_filter_sock_addr(sk, uaddr, atype, t_ctx, flags);
#endif
	release_sock(sk);
	return err;
#else
	return 0;
#endif
}

/* The hook of @v4 or @v6 for the family of @uaddr. */
static enum cgroup_bpf_attach_type kbp_so_sa_type(const struct sockaddr *uaddr,
						  enum cgroup_bpf_attach_type v4,
						  enum cgroup_bpf_attach_type v6)
{
	return uaddr->sa_family == AF_INET6 ? v6 : v4;
}

/*
 * SO_REUSEPORT's rule: a socket joins a port's group only if the same user
 * made every socket of the group (udp_lib_lport_inuse()).  On the host
 * every socket of a VM is kbp-sod's, so the rule is kept here: one entry
 * per port a reuseport socket of this guest holds, with its user and its
 * sockets.  By port alone (any address, either family): stricter than the
 * kernel, never looser.  kbp_so_ports_mutex: the list and each socket's
 * used/port; process context; a socket's requests to the host are made
 * under it when they may give it a port, so two binds cannot both pass.
 */
struct kbp_so_port {
	struct list_head node;
	u16 port;
	kuid_t uid;
	u32 refs;
};

static DEFINE_MUTEX(kbp_so_ports_mutex);
static LIST_HEAD(kbp_so_ports);

/* Port @port (host order) for @ks's owner.  kbp_so_ports_mutex held. */
static int kbp_so_port_claim(struct kbp_so_sock *ks, u16 port)
{
	kuid_t uid = kbp_so_owner(&ks->inet.sk);
	struct kbp_so_port *p;

	lockdep_assert_held(&kbp_so_ports_mutex);
	if (ks->port == port)
		return 0;
	list_for_each_entry(p, &kbp_so_ports, node) {
		if (p->port != port)
			continue;
		if (!uid_eq(p->uid, uid))
			return -EADDRINUSE;	/* another user's group */
		p->refs++;
		ks->port = port;
		return 0;
	}
	p = kmalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	p->port = port;
	p->uid = uid;
	p->refs = 1;
	list_add(&p->node, &kbp_so_ports);
	ks->port = port;
	return 0;
}

static void kbp_so_port_release(struct kbp_so_sock *ks)
{
	struct kbp_so_port *p;

	lockdep_assert_held(&kbp_so_ports_mutex);
	if (!ks->port)
		return;
	list_for_each_entry(p, &kbp_so_ports, node) {
		if (p->port != ks->port)
			continue;
		if (!--p->refs) {
			list_del(&p->node);
			kfree(p);
		}
		break;
	}
	ks->port = 0;
}

/* The guest's copy of SO_REUSEPORT: what the host's socket has too (6.7+). */
static bool kbp_so_reuseport(const struct sock *sk)
{
#ifdef KBP_SO_HAVE_CUSTOM_SOCKOPT
	return sk->sk_reuseport;	/* a bit-field: a racy read is fine, setsockopt decides */
#else
	return false;	/* SOL_SOCKET options never reach the host */
#endif
}

static int kbp_so_host_getopt(struct sock *sk, int opt, int *val)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_GETSOCKOPT, .arg0 = opt };
	struct kbp_so_cqe cqe;
	int err = kbp_so_sock_call(sk, &sqe, &cqe);

	if (!err)
		*val = cqe.res;
	return err;
}

static int kbp_so_host_setopt(struct sock *sk, int opt, int val)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SETSOCKOPT, .arg0 = opt };
	struct kbp_so_cqe cqe;

	memcpy(sqe.opt, &val, sizeof(val));
	return kbp_so_sock_call(sk, &sqe, &cqe);
}

/*
 * BIND of a reuseport socket, kbp_so_ports_mutex held.  A given port is
 * claimed first (another user's group: EADDRINUSE, as the kernel says).
 * Port 0 is chosen by the host with SO_REUSEPORT off (a fresh port, never
 * a group's), turned on again after, and then claimed.
 */
static int kbp_so_bind_reuse(struct sock *sk, struct kbp_so_sqe *sqe,
			     struct kbp_so_cqe *cqe)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	u16 port = ntohs((__force __be16)sqe->addr.port);
	int err;

	if (port) {
		err = kbp_so_port_claim(ks, port);
		if (err)
			return err;
		err = kbp_so_sock_call(sk, sqe, cqe);
		if (err)
			kbp_so_port_release(ks);
		return err;
	}
	err = kbp_so_host_setopt(sk, KBP_SO_OPT_REUSEPORT, 0);
	if (err)
		return err;
	err = kbp_so_sock_call(sk, sqe, cqe);
	if (!err)
		err = kbp_so_port_claim(ks, ntohs((__force __be16)cqe->addr.port));
	/* the host's socket as the guest's says, whatever happened */
	return kbp_so_host_setopt(sk, KBP_SO_OPT_REUSEPORT, 1) ?: err;
}

/*
 * A reuseport socket's first connect or send without a bind: the host
 * would choose its port then, possibly another user's group's.  Bind it to
 * port 0 the reuseport way first.
 */
static int kbp_so_autobind(struct sock *sk)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_BIND };
	struct kbp_so_cqe cqe;
	int err = 0;

	if (!kbp_so_reuseport(sk) || READ_ONCE(ks->used))
		return 0;
	mutex_lock(&kbp_so_ports_mutex);
	if (!ks->used) {
		sqe.addr.family = sk->sk_family == AF_INET6 ? KBP_SO_AF_INET6 :
				  KBP_SO_AF_INET;
		err = kbp_so_bind_reuse(sk, &sqe, &cqe);
		if (!err) {
			kbp_so_set_name(ks, &ks->local, &cqe.addr);
			WRITE_ONCE(ks->used, true);
		}
	}
	mutex_unlock(&kbp_so_ports_mutex);
	return err;
}

/* inet_bind()'s rule: a port below ip_unprivileged_port_start needs the capability. */
static int kbp_so_bind_allowed(struct sock *sk, u16 port, u32 flags)
{
	struct net *net = sock_net(sk);

	if (!port || (flags & BPF_RET_BIND_NO_CAP_NET_BIND_SERVICE))
		return 0;
	if (inet_port_requires_bind_service(net, port) &&
	    !ns_capable(net->user_ns, CAP_NET_BIND_SERVICE))
		return -EACCES;
	return 0;
}

static int kbp_so_bind(struct socket *sock, struct kbp_so_uaddr *uaddr, int len)
{
	struct sockaddr *sa = (struct sockaddr *)uaddr;
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_BIND };
	struct sock *sk = sock->sk;
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_cqe cqe;
	u32 flags = 0;
	int err;

	if (len < (int)sizeof(sa_family_t))
		return -EINVAL;
	/* as inet_bind()/inet6_bind(): the socket's own family only */
	if (sa->sa_family != sk->sk_family)
		return -EAFNOSUPPORT;
	/* checked, then the programs (which may rewrite it), then taken */
	err = kbp_so_addr_from(sk, sa, len, &sqe.addr) ?:
	      kbp_so_sa_hook(sk, sa, &len,
			     kbp_so_sa_type(sa, CGROUP_INET4_BIND, CGROUP_INET6_BIND),
			     NULL, &flags) ?:
	      kbp_so_addr_from(sk, sa, len, &sqe.addr);
	if (err)
		return err;
	err = kbp_so_bind_allowed(sk, ntohs((__force __be16)sqe.addr.port), flags);
	if (err)
		return err;
	mutex_lock(&kbp_so_ports_mutex);
	if (kbp_so_reuseport(sk))
		err = kbp_so_bind_reuse(sk, &sqe, &cqe);
	else
		err = kbp_so_sock_call(sk, &sqe, &cqe);
	if (!err) {
		kbp_so_set_name(ks, &ks->local, &cqe.addr);
		WRITE_ONCE(ks->used, true);
	}
	mutex_unlock(&kbp_so_ports_mutex);
	return err;
}

static int kbp_so_connect(struct socket *sock, struct kbp_so_uaddr *uaddr, int len,
			  int flags)
{
	struct sockaddr *sa = (struct sockaddr *)uaddr;
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CONNECT };
	struct sock *sk = sock->sk;
	struct kbp_so_cqe cqe;
	int err;

	err = kbp_so_addr_from(sk, sa, len, &sqe.addr);
	if (err)
		return err;
	if (sa->sa_family != AF_UNSPEC) {
		err = kbp_so_sa_hook(sk, sa, &len,
				     kbp_so_sa_type(sa, CGROUP_INET4_CONNECT,
						    CGROUP_INET6_CONNECT), NULL, NULL) ?:
		      kbp_so_addr_from(sk, sa, len, &sqe.addr) ?:
		      kbp_so_autobind(sk);
		if (err)
			return err;
	}
	err = kbp_so_sock_call(sk, &sqe, &cqe);
	if (!err) {
		kbp_so_set_name(kbp_so_sk(sk), &kbp_so_sk(sk)->remote, &sqe.addr);
		WRITE_ONCE(kbp_so_sk(sk)->used, true);
	}
	return err;
}

static int kbp_so_getname(struct socket *sock, struct sockaddr *uaddr, int peer)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_GETNAME, .arg0 = !!peer };
	struct sock *sk = sock->sk;
	struct kbp_so_cqe cqe;
	int err = kbp_so_sock_call(sk, &sqe, &cqe);
	int len;

	if (err)
		return err;
	kbp_so_set_name(kbp_so_sk(sk), peer ? &kbp_so_sk(sk)->remote :
			&kbp_so_sk(sk)->local, &cqe.addr);
	if (!cqe.addr.family) {
		/* unbound: the family's wildcard, as the host would say */
		cqe.addr.family = sk->sk_family == AF_INET6 ? KBP_SO_AF_INET6 :
				  KBP_SO_AF_INET;
	}
	len = kbp_so_addr_to(&cqe.addr, uaddr);
	/* inet_getname(): the programs may rewrite what the user sees */
	if (peer)
		kbp_so_sa_hook(sk, uaddr, &len,
			       kbp_so_sa_type(uaddr, CGROUP_INET4_GETPEERNAME,
					      CGROUP_INET6_GETPEERNAME), NULL, NULL);
	else
		kbp_so_sa_hook(sk, uaddr, &len,
			       kbp_so_sa_type(uaddr, CGROUP_INET4_GETSOCKNAME,
					      CGROUP_INET6_GETSOCKNAME), NULL, NULL);
	return len;
}

/*
 * The data path (docs/design.md, 11.2): a user buffer is lent to the host
 * as guest-physical segments for exactly one request, from its submission
 * to its final completion.  The pages are pinned (FOLL_PIN, as for direct
 * I/O): by iov_iter_extract_pages() on 6.3+, by hand on 6.1 (Kbuild probe).
 * Only user-backed iterators: kernel buffers would need the bounce page,
 * which is not done (EOPNOTSUPP).
 */
struct kbp_so_pin {
	struct page *pages[KBP_SO_MAX_SEGS];
	unsigned int nr;
	bool dirty;			/* the host writes them (receive) */
	bool orphan;			/* the host died with them: keep them */
};

struct kbp_so_orphan {
	struct list_head node;		/* on kbp_so_orphans */
	struct kbp_so_pin pin;
};

#ifdef KBP_SO_HAVE_EXTRACT_PAGES
static ssize_t kbp_so_extract(struct iov_iter *it, struct page **pages,
			      size_t max, unsigned int maxpages, size_t *off)
{
	/* user-backed: pins, FOLL_WRITE for a destination iterator */
	return iov_iter_extract_pages(it, &pages, max, maxpages, 0, off);
}

static void kbp_so_release_pages(struct kbp_so_pin *p)
{
	unpin_user_pages_dirty_lock(p->pages, p->nr, p->dirty);
}
#else
/*
 * 6.1 has no iov_iter_extract_pages(), and iov_iter_get_pages2() takes page
 * references, not pins: a fork() during a parked receive would then leave
 * the datagram in the child's copy-on-write copy of the page.  Pin the
 * current segment's pages ourselves, as direct I/O does (FOLL_PIN: fork
 * copies pinned anonymous pages for the child, the parent keeps them).
 */
static ssize_t kbp_so_extract(struct iov_iter *it, struct page **pages,
			      size_t max, unsigned int maxpages, size_t *off)
{
	unsigned int gup = iov_iter_rw(it) == READ ? FOLL_WRITE : 0;
	unsigned long addr;
	size_t len;
	int n, got;

	if (iter_is_ubuf(it)) {
		addr = (unsigned long)it->ubuf + it->iov_offset;
		len = it->count;
	} else if (iter_is_iovec(it)) {
		addr = (unsigned long)it->iov->iov_base + it->iov_offset;
		len = it->iov->iov_len - it->iov_offset;
	} else {
		return -EOPNOTSUPP;
	}
	len = min(len, max);
	if (!len)
		return -EOPNOTSUPP;	/* an empty iovec in the middle: not served */
	*off = offset_in_page(addr);
	n = min_t(size_t, DIV_ROUND_UP(*off + len, PAGE_SIZE), maxpages);
	len = min_t(size_t, len, (size_t)n * PAGE_SIZE - *off);
	got = pin_user_pages_fast(addr & PAGE_MASK, n, gup, pages);
	if (got <= 0)
		return got ? got : -EFAULT;
	if (got < n)
		len = (size_t)got * PAGE_SIZE - *off;
	iov_iter_advance(it, len);
	return len;
}

static void kbp_so_release_pages(struct kbp_so_pin *p)
{
	unpin_user_pages_dirty_lock(p->pages, p->nr, p->dirty);
}
#endif

/*
 * A dead host may still write the pages (a stopped daemon resumes): they
 * move to the orphan list, still pinned, until kbp_so_release_orphans().
 * The record is small; __GFP_NOFAIL because failing here would leave the
 * choice between a leak of the pins and freeing pages a host may write.
 */
static void kbp_so_orphan_pin(struct kbp_so_pin *p)
{
	struct kbp_so_orphan *o = kmalloc(sizeof(*o), GFP_KERNEL | __GFP_NOFAIL);

	o->pin = *p;
	atomic_sub(p->nr, &kbp_so_pinned);
	atomic_add(p->nr, &kbp_so_orphaned);
	spin_lock(&kbp_so_orphans_lock);
	list_add_tail(&o->node, &kbp_so_orphans);
	spin_unlock(&kbp_so_orphans_lock);
	p->nr = 0;
}

/* Only when no host of the old epoch can write any more.  Returns pages. */
static unsigned int kbp_so_release_orphans(void)
{
	struct kbp_so_orphan *o, *tmp;
	unsigned int n = 0;
	LIST_HEAD(list);

	spin_lock(&kbp_so_orphans_lock);
	list_splice_init(&kbp_so_orphans, &list);
	spin_unlock(&kbp_so_orphans_lock);
	list_for_each_entry_safe(o, tmp, &list, node) {
		kbp_so_release_pages(&o->pin);
		atomic_sub(o->pin.nr, &kbp_so_orphaned);
		n += o->pin.nr;
		list_del(&o->node);
		kfree(o);
	}
	return n;
}

/* Only after the request's final completion, or when no host can write. */
static void kbp_so_unpin(struct kbp_so_pin *p)
{
	if (!p->nr)
		return;
	if (p->orphan) {
		kbp_so_orphan_pin(p);
		return;
	}
	kbp_so_release_pages(p);
	atomic_sub(p->nr, &kbp_so_pinned);
	p->nr = 0;
}

/*
 * Pins @len bytes of the buffer behind @it (advancing it) and describes
 * them in @sqe's segments, physically adjacent pages merged.  On error the
 * caller unpins what was pinned.
 */
static int kbp_so_pin_iter(struct iov_iter *it, size_t len, struct kbp_so_pin *p,
			   struct kbp_so_sqe *sqe)
{
	if (!user_backed_iter(it))
		return -EOPNOTSUPP;
	while (len) {
		struct page **pages = &p->pages[p->nr];
		unsigned int n, i;
		size_t off;
		ssize_t got;

		if (p->nr == KBP_SO_MAX_SEGS)
			return -EOPNOTSUPP;	/* needs the bounce page */
		got = kbp_so_extract(it, pages, len, KBP_SO_MAX_SEGS - p->nr, &off);
		if (got <= 0)
			return got ? (int)got : -EFAULT;
		n = DIV_ROUND_UP(off + got, PAGE_SIZE);
		p->nr += n;
		atomic_add(n, &kbp_so_pinned);
		len -= got;
		for (i = 0; i < n; i++) {
			size_t chunk = min_t(size_t, got, PAGE_SIZE - off);
			u64 gpa = page_to_phys(pages[i]) + off;
			struct kbp_so_seg *s = NULL;

			if (sqe->nr_segs)
				s = &sqe->seg[sqe->nr_segs - 1];
			if (s && s->gpa + s->len == gpa) {
				s->len += chunk;
			} else {
				s = &sqe->seg[sqe->nr_segs++];
				s->gpa = gpa;
				s->len = chunk;
			}
			got -= chunk;
			off = 0;
		}
	}
	return 0;
}

/*
 * After a timeout or a signal: CANCEL on the request's own queue (the host
 * consumes a queue in order, so it has parked or completed the request by
 * the time it reads the CANCEL), then the request's final completion.
 * Until that completion the host may still write the pages, so this wait
 * cannot be interrupted; it ends early only when the epoch moved (the
 * flock: the old daemon is gone) or the device is removed (fail_all, after
 * the host acked a reset).
 */
static void kbp_so_cancel_wait(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			       u32 slot, struct kbp_so_req *req, u32 sock, u64 tag,
			       struct kbp_so_sock *ks)
{
	struct kbp_so_sqe c = { .op = KBP_SO_OP_CANCEL, .sock = sock, .arg1 = tag };
	bool asked = false;

	for (;;) {
		struct kbp_so_cqe ccqe;

		if (!asked && !completion_done(&req->done))
			asked = kbp_so_call_on(dev, q, &c, &ccqe, ks,
					       KBP_SO_SLOTS_RESERVED) != -EAGAIN;
		if (wait_for_completion_timeout(&req->done, KBP_SO_FINAL_POLL))
			return;
		if (READ_ONCE(dev->hdr->epoch) != dev->epoch &&
		    kbp_so_forget(q, slot, req)) {
			req->cqe.res = -ECONNRESET;
			return;
		}
	}
}

/*
 * A request that lends the host the pages in @sqe's segments.  @timeo:
 * how long the caller blocks (MAX_SCHEDULE_TIMEOUT: no limit).  Returns
 * the CQE's result (or -errno) only after the final completion: the
 * caller may then unpin.
 */
static int kbp_so_data_call(struct sock *sk, struct kbp_so_sqe *sqe,
			    struct kbp_so_cqe *cqe, long timeo, struct kbp_so_pin *pin)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_queue *q;
	struct kbp_so_req req = { };
	bool poll;
	long left;
	int err, slot;

	sqe->sock = ks->handle;
	/* read: the device outlives the request (removal fails it first) */
	down_read(&kbp_so_rwsem);
	err = kbp_so_sock_check(ks);
	if (err)
		goto out;
	q = kbp_so_this_queue(kbp_so_cur);
	if (READ_ONCE(kbp_so_cur->idle))
		kbp_so_sweep(kbp_so_cur, KBP_SO_BY_SYSCALL);
	req.lends = pin->nr;
	poll = kbp_so_will_poll(kbp_so_cur);
	slot = kbp_so_submit(kbp_so_cur, q, sqe, &req, poll, KBP_SO_SLOTS_SHARED);
	if (slot < 0) {
		err = slot;
		goto out;
	}
	atomic64_inc(&ks->st.requests);
	if (poll)
		kbp_so_poll_wait(kbp_so_cur, q, &req);
	left = wait_for_completion_interruptible_timeout(&req.done, timeo);
	if (left <= 0) {
		kbp_so_cancel_wait(kbp_so_cur, q, slot, &req, sqe->sock, sqe->tag, ks);
		/* data that won the race is returned: it left the host socket */
		if (req.cqe.res == -ECANCELED)
			req.cqe.res = left ? sock_intr_errno(timeo) : -EAGAIN;
	}
	/* failed for a dead host with pages lent: they become orphans */
	pin->orphan = req.orphan;
	kbp_so_count_done(ks, &req);
	*cqe = req.cqe;
	err = cqe->res < 0 ? cqe->res : 0;
out:
	up_read(&kbp_so_rwsem);
	return err;
}

static void kbp_so_poll_rearm(struct kbp_so_sock *ks, u32 want);

/* The socket's POLL is not out (never armed, or answered): a hint. */
static bool kbp_so_poll_idle(struct kbp_so_sock *ks)
{
	/* data_race: a hint for a wait's condition; kbp_so_poll_arm() decides */
	return !data_race(READ_ONCE(ks->poll_armed)) ||
	       completion_done(&ks->poll_req.done);
}

/*
 * Waits in the guest until the host said @ev (or an error) for the
 * socket, through its one POLL, for up to *@timeo.  A POLL answered with
 * other events is armed again.
 */
static int kbp_so_wait_ready(struct kbp_so_sock *ks, u32 ev, long *timeo)
{
	struct sock *sk = &ks->inet.sk;
	u32 any = ev | KBP_SO_POLL_ERR | KBP_SO_POLL_HUP;
	long left;

	for (;;) {
		if (atomic_read(&ks->revents) & any)
			return 0;
		kbp_so_poll_rearm(ks, ev);
		if (kbp_so_poll_idle(ks) && !(atomic_read(&ks->revents) & any)) {
			/* not armed: the device is going, or a ring is full */
			if (msleep_interruptible(1) && signal_pending(current))
				return sock_intr_errno(*timeo);
			continue;
		}
		left = wait_event_interruptible_timeout(*sk_sleep(sk),
							(atomic_read(&ks->revents) & any) ||
							kbp_so_poll_idle(ks), *timeo);
		if (left < 0)
			return sock_intr_errno(*timeo);
		if (!left)
			return -EAGAIN;
		*timeo = left;
	}
}

/*
 * A blocking call past its user's share of parked slots (-EUSERS from
 * kbp_so_submit()): waits in the guest for the socket's readiness @ev,
 * then asks without parking; again while the host says EAGAIN.
 */
static int kbp_so_data_call_waiting(struct sock *sk, struct kbp_so_sqe *sqe,
				    struct kbp_so_cqe *cqe, long timeo,
				    struct kbp_so_pin *pin, u32 ev)
{
	bool forever = timeo == MAX_SCHEDULE_TIMEOUT;
	unsigned long end = jiffies + (forever ? 0 : timeo);
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	unsigned int backoff = 1;
	int err;

	sqe->flags &= ~KBP_SO_F_WAIT;
	sqe->msg_flags |= KBP_SO_MSG_DONTWAIT;
	for (;;) {
		err = kbp_so_wait_ready(ks, ev, &timeo);
		if (err)
			return err;
		err = kbp_so_data_call(sk, sqe, cqe, KBP_SO_CALL_TIMEOUT, pin);
		if (err != -EAGAIN)
			return err;
		atomic_andnot(ev, &ks->revents);
		if (!kbp_so_poll_idle(ks))
			continue;	/* a POLL is out: the next wait sleeps on it */
		/*
		 * No POLL could be armed either (the user's share, a full ring):
		 * look again, backing off to KBP_SO_BACKOFF_MS, within the
		 * caller's timeout; not a spin.
		 */
		if (!forever && time_after_eq(jiffies, end))
			return -EAGAIN;
		if (msleep_interruptible(backoff) && signal_pending(current))
			return sock_intr_errno(timeo);
		backoff = min(backoff * 2, KBP_SO_BACKOFF_MS);
	}
}

/*
 * What a send's control messages ask for (design.md 11.12): the source
 * address (IP_PKTINFO's ipi_spec_dst, IPV6_PKTINFO's ipi6_addr; the
 * interface index is the guest's and is not sent) and the TOS / traffic
 * class.  Anything else: EINVAL, as ip_cmsg_send() says of what it does
 * not know.
 */
struct kbp_so_txmeta {
	/* in the socket's family; zero: none.  A UDP sendmsg program's t_ctx */
	u8 src[16] __aligned(8);
	bool has_src;
	int tos;			/* -1: the socket's */
};

static int kbp_so_cmsg_int(struct cmsghdr *c, int *val)
{
	if (c->cmsg_len == CMSG_LEN(sizeof(int)))
		*val = *(int *)CMSG_DATA(c);
	else if (c->cmsg_len == CMSG_LEN(sizeof(u8)))
		*val = *(u8 *)CMSG_DATA(c);
	else
		return -EINVAL;
	return 0;
}

static int kbp_so_tx_cmsgs(struct sock *sk, struct msghdr *msg, struct kbp_so_txmeta *tx)
{
	bool v6 = sk->sk_family == AF_INET6;
	struct cmsghdr *c;

	for_each_cmsghdr(c, msg) {
		if (!CMSG_OK(msg, c))
			return -EINVAL;
		if (!v6 && c->cmsg_level == SOL_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo *pi = (struct in_pktinfo *)CMSG_DATA(c);

			if (c->cmsg_len != CMSG_LEN(sizeof(*pi)))
				return -EINVAL;
			memcpy(tx->src, &pi->ipi_spec_dst, 4);
			tx->has_src = pi->ipi_spec_dst.s_addr != 0;
		} else if (v6 && c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo *pi = (struct in6_pktinfo *)CMSG_DATA(c);

			if (c->cmsg_len != CMSG_LEN(sizeof(*pi)))
				return -EINVAL;
			memcpy(tx->src, &pi->ipi6_addr, 16);
			tx->has_src = !ipv6_addr_any(&pi->ipi6_addr);
		} else if ((!v6 && c->cmsg_level == SOL_IP && c->cmsg_type == IP_TOS) ||
			   (v6 && c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_TCLASS)) {
			if (kbp_so_cmsg_int(c, &tx->tos) || tx->tos < -1 || tx->tos > 255)
				return -EINVAL;
		} else {
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * A pending error (sk_err: the host's SO_ERROR after a POLLERR,
 * kbp_so_err_work()) is the next send's or receive's result, as
 * sock_error() makes it for a local socket.
 */
static int kbp_so_pending_error(struct sock *sk)
{
	return READ_ONCE(sk->sk_err) ? sock_error(sk) : 0;
}

static int kbp_so_sendmsg(struct socket *sock, struct msghdr *msg, size_t len)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SENDMSG };
	struct sock *sk = sock->sk;
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	bool noblock = msg->msg_flags & MSG_DONTWAIT;
	struct kbp_so_pin pin = { .dirty = false };
	struct kbp_so_txmeta tx = { .tos = -1 };
	struct kbp_so_cqe cqe;
	long timeo;
	int err;

	if (msg->msg_flags & MSG_OOB)
		return -EOPNOTSUPP;		/* as udp_sendmsg() */
	if (msg->msg_flags & MSG_MORE)
		return kbp_so_fallback(ks);	/* corking: not served */
	if (len > KBP_SO_MAX_IO)
		return -EMSGSIZE;
	err = kbp_so_pending_error(sk);
	if (err)
		return err;
	if (msg->msg_controllen) {
		err = kbp_so_tx_cmsgs(sk, msg, &tx);
		if (err)
			return err;
	}
	if (msg->msg_name) {
		struct sockaddr *sa = msg->msg_name;

		/* AF_UNSPEC stays family 0: the connected peer, as for UDP */
		err = kbp_so_addr_from(sk, sa, msg->msg_namelen, &sqe.addr);
		if (!err && sqe.addr.family) {
			/* udp_sendmsg(): the programs may rewrite the peer and the source */
			err = kbp_so_sa_hook(sk, sa, &msg->msg_namelen,
					     kbp_so_sa_type(sa, CGROUP_UDP4_SENDMSG,
							    CGROUP_UDP6_SENDMSG),
					     tx.src, NULL) ?:
			      kbp_so_addr_from(sk, sa, msg->msg_namelen, &sqe.addr);
			if (!err && !sqe.addr.port)
				err = -EINVAL;	/* a program set port 0 */
			/* the other family's source on a dual-stack socket: not sent */
			if (sa->sa_family != sk->sk_family)
				memset(tx.src, 0, sizeof(tx.src));
			tx.has_src = memchr_inv(tx.src, 0, sizeof(tx.src));
		}
		if (err)
			return err;
	}
	if (tx.has_src || tx.tos >= 0) {
		if (!kbp_so_has_meta())
			return kbp_so_fallback(ks);
		if (tx.has_src) {
			sqe.msg_flags |= KBP_SO_MSG_SRC;
			memcpy(sqe.opt, tx.src, sizeof(tx.src));
		}
		if (tx.tos >= 0) {
			sqe.msg_flags |= KBP_SO_MSG_TOS;
			sqe.arg0 = tx.tos;
		}
	}
	err = kbp_so_autobind(sk);
	if (err)
		return err;
	err = kbp_so_pin_iter(&msg->msg_iter, len, &pin, &sqe);
	if (err == -EOPNOTSUPP)
		kbp_so_fallback(ks);
	if (err)
		goto out;
	if (noblock)
		sqe.msg_flags |= KBP_SO_MSG_DONTWAIT;
	else
		sqe.flags = KBP_SO_F_WAIT;	/* parks on a full send buffer */
	timeo = noblock ? KBP_SO_CALL_TIMEOUT : sock_sndtimeo(sk, false);
	err = kbp_so_data_call(sk, &sqe, &cqe, timeo, &pin);
	if (err == -EUSERS)
		err = kbp_so_data_call_waiting(sk, &sqe, &cqe, timeo, &pin,
					       KBP_SO_POLL_OUT);
	if (err == -EAGAIN) {
		/* not writable: an edge-triggered waiter needs the host's word */
		atomic_andnot(KBP_SO_POLL_OUT, &ks->revents);
		kbp_so_poll_rearm(ks, KBP_SO_POLL_OUT);
	}
	if (!err) {
		WRITE_ONCE(ks->used, true);
		err = cqe.res;
		atomic64_add(cqe.res, &ks->st.bytes_out);
		atomic64_inc(&ks->st.copies);
	}
out:
	kbp_so_unpin(&pin);
	return err;
}

/*
 * The guest interface a datagram for @dst came in on, as the user can
 * name it (SIOCGIFNAME): the one holding the address, the loopback for a
 * loopback address, else 0.  The host's interface means nothing here.
 */
static int kbp_so_dst_ifindex(struct sock *sk, const struct kbp_so_addr *dst)
{
	struct net *net = sock_net(sk);
	struct net_device *dev;
	int ifindex = 0;

	rcu_read_lock();
	if (dst->family == KBP_SO_AF_INET) {
		__be32 a;

		memcpy(&a, dst->addr, 4);
		dev = ipv4_is_loopback(a) ? NULL : __ip_dev_find(net, a, false);
		if (ipv4_is_loopback(a))
			ifindex = LOOPBACK_IFINDEX;
		else if (dev)
			ifindex = dev->ifindex;
	} else if (dst->family == KBP_SO_AF_INET6) {
		const struct in6_addr *a = (const struct in6_addr *)dst->addr;

		dev = ipv6_addr_loopback(a) ? NULL : ipv6_dev_find(net, a, NULL);
		if (ipv6_addr_loopback(a))
			ifindex = LOOPBACK_IFINDEX;
		else if (dev)
			ifindex = dev->ifindex;
	}
	rcu_read_unlock();
	return ifindex;
}

/* SO_TIMESTAMP* as __sock_recv_timestamp() puts them, from the host's time. */
static void kbp_so_put_tstamp(struct msghdr *msg, struct sock *sk, u64 ns)
{
	bool new = sock_flag(sk, SOCK_TSTAMP_NEW);
	struct timespec64 ts = ns_to_timespec64(ns);

	if (!sock_flag(sk, SOCK_RCVTSTAMPNS)) {
		if (new) {
			struct __kernel_sock_timeval tv = {
				.tv_sec = ts.tv_sec, .tv_usec = ts.tv_nsec / NSEC_PER_USEC,
			};

			put_cmsg(msg, SOL_SOCKET, SO_TIMESTAMP_NEW, sizeof(tv), &tv);
		} else {
			struct __kernel_old_timeval tv = {
				.tv_sec = ts.tv_sec, .tv_usec = ts.tv_nsec / NSEC_PER_USEC,
			};

			put_cmsg(msg, SOL_SOCKET, SO_TIMESTAMP_OLD, sizeof(tv), &tv);
		}
	} else if (new) {
		struct __kernel_timespec t = { .tv_sec = ts.tv_sec, .tv_nsec = ts.tv_nsec };

		put_cmsg(msg, SOL_SOCKET, SO_TIMESTAMPNS_NEW, sizeof(t), &t);
	} else {
		struct __kernel_old_timespec t = { .tv_sec = ts.tv_sec, .tv_nsec = ts.tv_nsec };

		put_cmsg(msg, SOL_SOCKET, SO_TIMESTAMPNS_OLD, sizeof(t), &t);
	}
}

/* The control messages the socket asked for, from the host's metadata @m. */
static void kbp_so_rx_cmsgs(struct msghdr *msg, struct sock *sk,
			    const struct kbp_so_rxmeta *m)
{
	unsigned long cm = READ_ONCE(kbp_so_sk(sk)->cmsg);
	u16 valid = m->valid;

	if ((valid & KBP_SO_META_TSTAMP) && sock_flag(sk, SOCK_RCVTSTAMP))
		kbp_so_put_tstamp(msg, sk, m->tstamp_ns);
	if ((valid & KBP_SO_META_DROPS) && m->drops && sock_flag(sk, SOCK_RXQ_OVFL))
		put_cmsg(msg, SOL_SOCKET, SO_RXQ_OVFL, sizeof(m->drops), (void *)&m->drops);
	if (sk->sk_family == AF_INET) {
		if ((valid & KBP_SO_META_DST) && m->dst.family == KBP_SO_AF_INET &&
		    test_bit(KBP_SO_CM_PKTINFO, &cm)) {
			struct in_pktinfo pi = { .ipi_ifindex = kbp_so_dst_ifindex(sk, &m->dst) };

			memcpy(&pi.ipi_addr, m->dst.addr, 4);
			pi.ipi_spec_dst = pi.ipi_addr;
			put_cmsg(msg, SOL_IP, IP_PKTINFO, sizeof(pi), &pi);
		}
		if ((valid & KBP_SO_META_TTL) && test_bit(KBP_SO_CM_TTL, &cm)) {
			int ttl = m->ttl;

			put_cmsg(msg, SOL_IP, IP_TTL, sizeof(ttl), &ttl);
		}
		if ((valid & KBP_SO_META_TOS) && test_bit(KBP_SO_CM_TOS, &cm))
			put_cmsg(msg, SOL_IP, IP_TOS, 1, (void *)&m->tos);
		return;
	}
	if ((valid & KBP_SO_META_DST) && m->dst.family && test_bit(KBP_SO_CM_PKTINFO6, &cm)) {
		struct in6_pktinfo pi = { .ipi6_ifindex = kbp_so_dst_ifindex(sk, &m->dst) };

		if (m->dst.family == KBP_SO_AF_INET6)
			memcpy(&pi.ipi6_addr, m->dst.addr, 16);
		else	/* a v4 datagram on a dual-stack socket: v4-mapped */
			ipv6_addr_set_v4mapped(*(__be32 *)m->dst.addr, &pi.ipi6_addr);
		put_cmsg(msg, SOL_IPV6, IPV6_PKTINFO, sizeof(pi), &pi);
	}
	if ((valid & KBP_SO_META_TTL) && test_bit(KBP_SO_CM_HOPLIMIT, &cm)) {
		int hops = m->ttl;

		put_cmsg(msg, SOL_IPV6, IPV6_HOPLIMIT, sizeof(hops), &hops);
	}
	if ((valid & KBP_SO_META_TOS) && test_bit(KBP_SO_CM_TCLASS, &cm)) {
		int tclass = m->tos;

		put_cmsg(msg, SOL_IPV6, IPV6_TCLASS, sizeof(tclass), &tclass);
	}
}

/* recvmsg wants control messages: the host's metadata is needed. */
static bool kbp_so_wants_meta(struct sock *sk)
{
	return READ_ONCE(kbp_so_sk(sk)->cmsg) || sock_flag(sk, SOCK_RCVTSTAMP) ||
	       sock_flag(sk, SOCK_RXQ_OVFL);
}

static int kbp_so_recvmsg(struct socket *sock, struct msghdr *msg, size_t len,
			  int flags)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_RECVMSG };
	struct sock *sk = sock->sk;
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	size_t want = min_t(size_t, len, KBP_SO_MAX_IO);
	bool noblock = flags & MSG_DONTWAIT;
	struct kbp_so_pin pin = { .dirty = true };
	struct kbp_so_rxmeta *meta = NULL;
	struct kbp_so_cqe cqe;
	long timeo;
	int err;

	if (flags & MSG_OOB)
		return -EOPNOTSUPP;		/* as udp_recvmsg() */
	if (flags & MSG_ERRQUEUE)
		return -EAGAIN;			/* no IP_RECVERR: an empty error queue */
	err = kbp_so_pending_error(sk);
	if (err)
		return err;
	if (kbp_so_wants_meta(sk) && kbp_so_has_meta()) {
		/* kmalloc: physically contiguous, 64-byte aligned, in one page */
		meta = kzalloc(sizeof(*meta), GFP_KERNEL);
		if (!meta)
			return -ENOMEM;
		sqe.flags |= KBP_SO_F_META;
		sqe.arg1 = virt_to_phys(meta);
	}
	/* a UDP payload is at most 65507 bytes: the rest of a buffer stays */
	err = kbp_so_pin_iter(&msg->msg_iter, want, &pin, &sqe);
	if (err == -EOPNOTSUPP)
		kbp_so_fallback(ks);
	if (err)
		goto out;
	if (flags & MSG_PEEK)
		sqe.msg_flags |= KBP_SO_MSG_PEEK;
	if (flags & MSG_TRUNC)
		sqe.msg_flags |= KBP_SO_MSG_TRUNC;
	if (noblock)
		sqe.msg_flags |= KBP_SO_MSG_DONTWAIT;
	else
		sqe.flags |= KBP_SO_F_WAIT;	/* parked until a datagram comes */
	timeo = noblock ? KBP_SO_CALL_TIMEOUT : sock_rcvtimeo(sk, false);
	err = kbp_so_data_call(sk, &sqe, &cqe, timeo, &pin);
	if (err == -EUSERS)
		err = kbp_so_data_call_waiting(sk, &sqe, &cqe, timeo, &pin,
					       KBP_SO_POLL_IN);
	/* consumed, or nothing there: the next poll asks the host again */
	if (!(flags & MSG_PEEK) || err)
		atomic_andnot(KBP_SO_POLL_IN | KBP_SO_POLL_ERR, &ks->revents);
	/* nothing there: an edge-triggered waiter needs the host's word */
	if (err == -EAGAIN)
		kbp_so_poll_rearm(ks, KBP_SO_POLL_IN);
	if (err)
		goto out;
	/* as the host counts: bytes written into our pages; an EOF is no copy */
	atomic64_add(min_t(size_t, cqe.msg_len, want), &ks->st.bytes_in);
	if (cqe.msg_len || !READ_ONCE(ks->rd_shut))
		atomic64_inc(&ks->st.copies);
	if (msg->msg_name && cqe.addr.family) {
		DECLARE_SOCKADDR(struct sockaddr *, sa, msg->msg_name);

		msg->msg_namelen = kbp_so_addr_to(&cqe.addr, sa);
		/* udp_recvmsg(): the programs may rewrite the peer shown */
		kbp_so_sa_hook(sk, sa, &msg->msg_namelen,
			       kbp_so_sa_type(sa, CGROUP_UDP4_RECVMSG, CGROUP_UDP6_RECVMSG),
			       NULL, NULL);
	}
	if (meta)
		kbp_so_rx_cmsgs(msg, sk, meta);
	if (cqe.out_flags & KBP_SO_OUT_TRUNC)
		msg->msg_flags |= MSG_TRUNC;
	err = cqe.res;
out:
	/* a dead host may still write it, as the pages: kept (64 bytes) */
	if (!pin.orphan)
		kfree(meta);
	kbp_so_unpin(&pin);
	return err;
}

#define KBP_SO_ERR_FETCH	0	/* ks->flags: err_work queued */
#define KBP_SO_POLL_ANSWERED	1	/* ks->flags: the POLL's done_fn has run */

/*
 * After a POLL said POLLERR: the host socket's SO_ERROR (which reading
 * clears there) becomes the guest's sk_err, and POLLERR now follows
 * sk_err, as for a local socket: getsockopt(SO_ERROR) reads and clears it,
 * the next send or receive returns it.  Holds a reference on the socket
 * from kbp_so_poll_done(); a closed socket's handle is 0, nothing asked.
 */
static void kbp_so_err_work(struct work_struct *work)
{
	struct kbp_so_sock *ks = container_of(work, struct kbp_so_sock, err_work);
	struct sock *sk = &ks->inet.sk;
	int val = 0;

	if (READ_ONCE(ks->handle) && !kbp_so_host_getopt(sk, KBP_SO_OPT_ERROR, &val) &&
	    val > 0) {
		WRITE_ONCE(sk->sk_err, val);
		sk_error_report(sk);
	}
	atomic_andnot(KBP_SO_POLL_ERR, &ks->revents);
	clear_bit(KBP_SO_ERR_FETCH, &ks->flags);
	sock_put(sk);
}

/* The KBP_SO_POLL_* a caller interested in @events waits for (IN, OUT). */
static u32 kbp_so_poll_want(__poll_t events)
{
	u32 want = 0;

	if (events & (EPOLLIN | EPOLLRDNORM))
		want |= KBP_SO_POLL_IN;
	if (events & (EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND))
		want |= KBP_SO_POLL_OUT;
	return want;
}

/* The epoll events of KBP_SO_POLL_* bits. */
static __poll_t kbp_so_poll_mask(u32 rev)
{
	__poll_t mask = 0;

	if (rev & KBP_SO_POLL_IN)
		mask |= EPOLLIN | EPOLLRDNORM;
	if (rev & KBP_SO_POLL_OUT)
		mask |= EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND;
	if (rev & KBP_SO_POLL_ERR)
		mask |= EPOLLERR;
	if (rev & KBP_SO_POLL_HUP)
		mask |= EPOLLHUP;
	return mask;
}

/*
 * The armed POLL's completion, in the interrupt handler, before its
 * complete(): the host's revents become the socket's, then the waiters of
 * sk_sleep() wake with them as the key (as sock_def_readable() does: an
 * EPOLLEXCLUSIVE set wakes one of its waiters, and only for events it
 * asked for) and poll again.  A cancelled POLL (a wider one is wanted, or
 * the socket closes) changes nothing but wakes: the next ->poll arms anew.
 */
static void kbp_so_poll_done(struct kbp_so_req *req)
{
	struct kbp_so_sock *ks = container_of(req, struct kbp_so_sock, poll_req);
	struct sock *sk = &ks->inet.sk;
	struct socket_wq *wq;
	__poll_t key;

	kbp_so_count_done(ks, req);
	/* before the wake: kbp_so_poll_rearm() must see it (see there) */
	set_bit(KBP_SO_POLL_ANSWERED, &ks->flags);
	if (req->cqe.res == -ECANCELED) {
		key = EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM;
	} else {
		u32 rev = req->cqe.res < 0 ? KBP_SO_POLL_ERR :
			  req->cqe.out_flags & KBP_SO_POLL_ALL;

		atomic_set(&ks->revents, rev);
		key = kbp_so_poll_mask(rev);
		/*
		 * The host's error (ECONNREFUSED...) becomes sk_err, off this
		 * context.  Until it has, POLLERR is not shown (SO_ERROR would
		 * read 0): err_work's sk_error_report() wakes with it.
		 */
		if (req->cqe.res >= 0 && (rev & KBP_SO_POLL_ERR)) {
			key &= ~EPOLLERR;
			if (!test_and_set_bit(KBP_SO_ERR_FETCH, &ks->flags)) {
				sock_hold(sk);
				queue_work(system_wq, &ks->err_work);
			}
			if (!key)
				return;
		}
	}
	rcu_read_lock();
	wq = rcu_dereference(sk->sk_wq);
	if (skwq_has_sleeper(wq))
		wake_up_interruptible_poll(&wq->wait, key);
	rcu_read_unlock();
}

/*
 * ks->poll_lock held: the armed POLL, if any, is still out.  A finished
 * one is taken back here (its complete() has returned).
 */
static bool kbp_so_poll_pending(struct kbp_so_sock *ks)
{
	if (ks->poll_armed && completion_done(&ks->poll_req.done))
		ks->poll_armed = false;
	return ks->poll_armed;
}

/*
 * Arms one POLL for @want unless one is out; never sleeps (->poll calls
 * it).  Returns the events of a POLL still out that @want exceeds (the
 * caller may cancel it, kbp_so_poll_widen()), else 0.
 */
static u32 kbp_so_poll_arm(struct kbp_so_sock *ks, u32 want)
{
	struct kbp_so_sqe sqe = {
		.op = KBP_SO_OP_POLL, .flags = KBP_SO_F_ARM, .arg1 = want,
		.sock = ks->handle,
	};
	struct kbp_so_queue *q;
	u32 narrow = 0;
	int slot;

	spin_lock(&ks->poll_lock);
	if (ks->poll_closing)
		goto out;
	if (kbp_so_poll_pending(ks)) {
		if (want & ~ks->poll_want)
			narrow = ks->poll_want;
		goto out;
	}
	/* removal holds it for writing: no arming then, the next poll retries */
	if (!down_read_trylock(&kbp_so_rwsem))
		goto out;
	if (kbp_so_sock_check(ks)) {
		atomic_set(&ks->revents, KBP_SO_POLL_ERR);
		goto out_up;
	}
	q = kbp_so_this_queue(kbp_so_cur);
	clear_bit(KBP_SO_POLL_ANSWERED, &ks->flags);
	ks->poll_req.done_fn = kbp_so_poll_done;
	slot = kbp_so_submit(kbp_so_cur, q, &sqe, &ks->poll_req, false,
			     KBP_SO_SLOTS_SHARED);
	if (slot < 0) {
		/* a full ring: say ready, the caller's next operation finds out */
		atomic_or(want, &ks->revents);
		goto out_up;
	}
	ks->poll_armed = true;
	ks->poll_want = want;
	ks->poll_tag = sqe.tag;
	ks->poll_q = q;
	ks->poll_slot = slot;
	atomic64_inc(&ks->st.requests);
out_up:
	up_read(&kbp_so_rwsem);
out:
	spin_unlock(&ks->poll_lock);
	return narrow;
}

/*
 * A receive or send found nothing (EAGAIN): an edge-triggered epoll set
 * calls ->poll no more until an event, so the event must come from a POLL
 * armed now, for @want.  A POLL still out for other events only is
 * cancelled (its completion wakes the waiters, whose ->poll arms the wider
 * one).  Process context.
 */
static void kbp_so_poll_rearm(struct kbp_so_sock *ks, u32 want)
{
	struct kbp_so_sqe c = { .op = KBP_SO_OP_CANCEL };
	struct kbp_so_cqe cqe;

	/*
	 * The POLL is answered (its done_fn set revents and woke the waiters)
	 * but its complete(), which follows in the interrupt handler, has not
	 * returned: it still counts as out, and arming now would do nothing.
	 * A waiter woken by that answer that drained the socket to EAGAIN in
	 * the window would go back to its edge-triggered epoll with no POLL
	 * out, and hang.  Wait for the complete() (at once, or when a
	 * threaded handler runs again), then arm anew.  Not
	 * wait_for_completion(): it would consume the done count that
	 * kbp_so_poll_pending() and kbp_so_poll_disarm() read.
	 */
	while (test_bit(KBP_SO_POLL_ANSWERED, &ks->flags) &&
	       !completion_done(&ks->poll_req.done))
		usleep_range(10, 50);
	if (!kbp_so_poll_arm(ks, want))
		return;
	spin_lock(&ks->poll_lock);
	c.sock = ks->handle;
	c.arg1 = ks->poll_tag;
	spin_unlock(&ks->poll_lock);
	down_read(&kbp_so_rwsem);
	if (!kbp_so_sock_check(ks))
		kbp_so_call(kbp_so_cur, &c, &cqe, ks, KBP_SO_SLOTS_RESERVED);
	up_read(&kbp_so_rwsem);
	kbp_so_poll_arm(ks, want);	/* if the cancel is through already */
}

/*
 * Close: no POLL is armed from now on; the CLOSE completed the one out on
 * the host (or the device's failure did), and its complete() must have
 * returned before the socket is freed.
 */
static void kbp_so_poll_disarm(struct kbp_so_sock *ks)
{
	bool armed;

	spin_lock(&ks->poll_lock);
	ks->poll_closing = true;
	armed = ks->poll_armed;
	spin_unlock(&ks->poll_lock);
	if (!armed)
		return;
	down_read(&kbp_so_rwsem);
	/* lends no pages: an unanswered slot may be forgotten */
	if (!wait_for_completion_timeout(&ks->poll_req.done, KBP_SO_CALL_TIMEOUT) &&
	    !kbp_so_forget(ks->poll_q, ks->poll_slot, &ks->poll_req))
		wait_for_completion(&ks->poll_req.done);
	up_read(&kbp_so_rwsem);
}

static __poll_t kbp_so_poll(struct file *file, struct socket *sock,
			    poll_table *wait)
{
	struct kbp_so_sock *ks = kbp_so_sk(sock->sk);
	__poll_t mask;
	u32 rev, want;

	sock_poll_wait(file, sock, wait);
	rev = atomic_read(&ks->revents);
	/*
	 * Only what the caller waits for: a POLL armed for OUT too would
	 * complete at once (a UDP socket is writable) and, its key being
	 * EPOLLOUT, wake no EPOLLIN-only waiter, whose edge-triggered set
	 * would then never call ->poll again to arm one for IN.
	 */
	want = kbp_so_poll_want(poll_requested_events(wait)) & ~rev;
	if (want && !(rev & KBP_SO_POLL_ERR))
		kbp_so_poll_arm(ks, want);
	rev = atomic_read(&ks->revents);	/* the host may have answered */
	mask = kbp_so_poll_mask(rev);
	if (test_bit(KBP_SO_ERR_FETCH, &ks->flags))
		mask &= ~EPOLLERR;	/* not yet in sk_err: kbp_so_poll_done() */
	return mask | (READ_ONCE(sock->sk->sk_err) ? EPOLLERR : 0);
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
static atomic64_t kbp_so_refused_netns = ATOMIC64_INIT(0);
static atomic64_t kbp_so_refused_user = ATOMIC64_INIT(0);

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

static int kbp_so_policy_check(struct sock *sk)
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

/* proto.init: the host socket is made with the guest's. */
static int kbp_so_init_sock(struct sock *sk)
{
	struct kbp_so_sqe sqe = {
		.op = KBP_SO_OP_SOCKET,
		.arg0 = sk->sk_family == AF_INET6 ? KBP_SO_AF_INET6 : KBP_SO_AF_INET,
	};
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_cqe cqe;
	int err;

	ks->handle = 0;
	ks->rd_shut = false;
	atomic_set(&ks->revents, 0);
	spin_lock_init(&ks->poll_lock);
	ks->poll_armed = false;
	ks->poll_closing = false;
	init_completion(&ks->poll_req.done);
	ks->poll_req.lends = false;
	INIT_LIST_HEAD(&ks->node);
	spin_lock_init(&ks->name_lock);
	memset(&ks->local, 0, sizeof(ks->local));
	memset(&ks->remote, 0, sizeof(ks->remote));
	memset(&ks->st, 0, sizeof(ks->st));
	ks->used = false;
	ks->port = 0;
	ks->cmsg = 0;
	ks->flags = 0;
	INIT_WORK(&ks->err_work, kbp_so_err_work);
	err = kbp_so_policy_check(sk);
	if (err)
		return err;
	down_read(&kbp_so_rwsem);
	if (!kbp_so_cur || READ_ONCE(kbp_so_cur->host_dead)) {
		err = -ENETDOWN;	/* no daemon: the policy's "error" fallback */
		atomic64_inc(&kbp_so_fallbacks);
	} else {
		ks->attach_id = kbp_so_cur->attach_id;
		err = kbp_so_call(kbp_so_cur, &sqe, &cqe, ks, KBP_SO_SLOTS_SHARED);
	}
	up_read(&kbp_so_rwsem);
	if (!err && cqe.res < 0)
		err = cqe.res;
	if (err)
		return err;
	ks->handle = cqe.sock;
	/* SO_PROTOCOL and security labels see UDP (docs/design.md, 11.1) */
	sk->sk_protocol = IPPROTO_UDP;
#ifdef KBP_SO_HAVE_CUSTOM_SOCKOPT
	/* SOL_SOCKET options reach kbp_so_setsockopt() (as for MPTCP) */
	if (sk->sk_socket)
		set_bit(SOCK_CUSTOM_SOCKOPT, &sk->sk_socket->flags);
#endif
	mutex_lock(&kbp_so_socks_mutex);
	list_add_tail(&ks->node, &kbp_so_socks);
	kbp_so_nsocks++;
	mutex_unlock(&kbp_so_socks_mutex);
	return 0;
}

static void kbp_so_close(struct sock *sk, long timeout)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CLOSE };
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_cqe cqe;

	mutex_lock(&kbp_so_socks_mutex);
	if (!list_empty(&ks->node)) {
		list_del_init(&ks->node);
		kbp_so_nsocks--;
	}
	mutex_unlock(&kbp_so_socks_mutex);
	if (ks->handle) {
		int err = kbp_so_sock_call_slots(sk, &sqe, &cqe, KBP_SO_SLOTS_RESERVED);

		/* not through: the watchdog closes it (kbp_so_zombies_close()) */
		if (err == -ETIMEDOUT || err == -EAGAIN)
			kbp_so_zombie_add(ks->attach_id, ks->handle, GFP_KERNEL);
	}
	kbp_so_poll_disarm(ks);
	/* a queued error fetch holds a reference: no module code after the last */
	if (cancel_work_sync(&ks->err_work)) {
		clear_bit(KBP_SO_ERR_FETCH, &ks->flags);
		sock_put(sk);
	}
	mutex_lock(&kbp_so_ports_mutex);
	kbp_so_port_release(ks);
	mutex_unlock(&kbp_so_ports_mutex);
	ks->handle = 0;
	sk_common_release(sk);
}

/*
 * shutdown: the host's socket is shut down; a receive it has parked
 * completes with 0 after SHUT_RD, as a local UDP receive returns 0.  An
 * unconnected socket says ENOTCONN and is marked all the same (Linux).
 */
static int kbp_so_shutdown(struct socket *sock, int how)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SHUTDOWN, .arg0 = how };
	struct kbp_so_cqe cqe;
	int err;

	if (how < SHUT_RD || how > SHUT_RDWR)
		return -EINVAL;
	err = kbp_so_sock_call(sock->sk, &sqe, &cqe);
	if ((!err || err == -ENOTCONN) && how != SHUT_WR)
		WRITE_ONCE(kbp_so_sk(sock->sk)->rd_shut, true);
	return err;
}

/*
 * The options the host serves (the ABI's allowlist, design.md 11.2): each
 * an int.  SOL_SOCKET ones reach us only where SOCK_CUSTOM_SOCKOPT exists
 * (6.7+); on 6.1 they stay with the guest's own socket.
 */
static int kbp_so_opt_of(int level, int optname)
{
	static const struct { int level, name, opt; } map[] = {
		{ SOL_SOCKET, SO_RCVBUF, KBP_SO_OPT_RCVBUF },
		{ SOL_SOCKET, SO_SNDBUF, KBP_SO_OPT_SNDBUF },
		{ SOL_SOCKET, SO_REUSEADDR, KBP_SO_OPT_REUSEADDR },
		{ SOL_SOCKET, SO_REUSEPORT, KBP_SO_OPT_REUSEPORT },
		{ SOL_SOCKET, SO_PRIORITY, KBP_SO_OPT_PRIORITY },
		{ SOL_IP, IP_TOS, KBP_SO_OPT_IP_TOS },
		{ SOL_IP, IP_TTL, KBP_SO_OPT_IP_TTL },
		{ SOL_IPV6, IPV6_V6ONLY, KBP_SO_OPT_V6ONLY },
		{ SOL_IPV6, IPV6_TCLASS, KBP_SO_OPT_TCLASS },
		{ SOL_IPV6, IPV6_UNICAST_HOPS, KBP_SO_OPT_HOPS },
	};
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(map); i++)
		if (map[i].level == level && map[i].name == optname)
			return map[i].opt;
	return 0;
}

/*
 * SOL_SOCKET options that only concern the guest's side of the socket;
 * with the host's receive metadata (FEAT_META) also those that ask for
 * control messages, which recvmsg builds from it.
 */
static bool kbp_so_local_opt(int optname, bool meta)
{
	switch (optname) {
	case SO_RCVTIMEO_OLD:
	case SO_RCVTIMEO_NEW:
	case SO_SNDTIMEO_OLD:
	case SO_SNDTIMEO_NEW:
		return true;
	case SO_TIMESTAMP_OLD:
	case SO_TIMESTAMP_NEW:
	case SO_TIMESTAMPNS_OLD:
	case SO_TIMESTAMPNS_NEW:
	case SO_RXQ_OVFL:
		return meta;
	}
	return false;
}

static int kbp_so_setsockopt(struct socket *sock, int level, int optname,
			     sockptr_t optval, unsigned int optlen)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SETSOCKOPT };
	int opt = kbp_so_opt_of(level, optname);
	struct sock *sk = sock->sk;
	struct kbp_so_cqe cqe;
	int val, err;

	int cm = kbp_so_cmsg_opt(sk, level, optname);

	if (!opt && cm < 0) {
		if (level == SOL_SOCKET && kbp_so_local_opt(optname, kbp_so_has_meta()))
			return sock_setsockopt(sock, level, optname, optval, optlen);
		return -ENOPROTOOPT;	/* not served: design.md 11.12's table */
	}
	if (optlen < sizeof(int))
		return -EINVAL;
	if (copy_from_sockptr(&val, optval, sizeof(val)))
		return -EFAULT;
	if (cm >= 0) {
		/* built by recvmsg from the host's metadata */
		if (!kbp_so_has_meta())
			return -ENOPROTOOPT;
		assign_bit(cm, &kbp_so_sk(sk)->cmsg, val);
		return 0;
	}
	/*
	 * SO_REUSEPORT once the host may have given the socket a port: the
	 * port was not claimed for its user (kbp_so_port_claim()), so no.
	 */
	if (opt == KBP_SO_OPT_REUSEPORT && val && READ_ONCE(kbp_so_sk(sk)->used))
		return -EISCONN;
	sqe.arg0 = opt;
	memcpy(sqe.opt, &val, sizeof(val));
	err = kbp_so_sock_call(sk, &sqe, &cqe);
	if (err || level != SOL_SOCKET)
		return err;
	/*
	 * getsockopt(SOL_SOCKET) is always the guest's sk_getsockopt(): keep
	 * the guest's copy equal to the host's (the buffer sizes as the host
	 * kernel doubled and clamped them).  Best effort: the host has it.
	 */
	if (opt == KBP_SO_OPT_RCVBUF || opt == KBP_SO_OPT_SNDBUF) {
		if (!kbp_so_host_getopt(sk, opt, &val)) {
			if (opt == KBP_SO_OPT_RCVBUF)
				WRITE_ONCE(sk->sk_rcvbuf, val);
			else
				WRITE_ONCE(sk->sk_sndbuf, val);
		}
	} else {
		sock_setsockopt(sock, level, optname, optval, optlen);
	}
	return 0;
}

/* Only levels other than SOL_SOCKET come here (SOL_SOCKET is the guest's). */
static int kbp_so_getsockopt(struct socket *sock, int level, int optname,
			     char __user *optval, int __user *optlen)
{
	int opt = kbp_so_opt_of(level, optname);
	int cm = kbp_so_cmsg_opt(sock->sk, level, optname);
	int len, val, err;

	if ((!opt && cm < 0) || level == SOL_SOCKET)
		return -ENOPROTOOPT;
	if (get_user(len, optlen))
		return -EFAULT;
	if (len < (int)sizeof(int))
		return -EINVAL;
	if (cm >= 0) {
		val = test_bit(cm, &kbp_so_sk(sock->sk)->cmsg);
	} else {
		err = kbp_so_host_getopt(sock->sk, opt, &val);
		if (err)
			return err;
	}
	len = sizeof(int);
	if (put_user(len, optlen) || copy_to_user(optval, &val, len))
		return -EFAULT;
	return 0;
}

/*
 * ioctl: the queue sizes are the host socket's (ABI 1.1's INQ/OUTQ); the
 * rest is the guest's, as for the kernel's UDP: inet_ioctl()/inet6_ioctl()
 * answer the interface and routing ones from the socket's (guest) network
 * namespace, and what they do not know (-ENOIOCTLCMD) sock_do_ioctl()
 * hands to dev_ioctl() and dev_ifconf(): SIOCGIFNAME, SIOCGIFINDEX,
 * SIOCGIFFLAGS, SIOCGIFCONF... name the guest's own interfaces.
 */
static int kbp_so_ioctl(struct socket *sock, unsigned int cmd, unsigned long arg)
{
	struct sock *sk = sock->sk;
	int val, err;

	switch (cmd) {
	case SIOCINQ:
	case SIOCOUTQ:
		down_read(&kbp_so_rwsem);
		err = kbp_so_cur && (kbp_so_cur->features & KBP_SO_FEAT_QUEUE_OPTS) ?
		      0 : -ENOIOCTLCMD;
		up_read(&kbp_so_rwsem);
		if (!err)
			err = kbp_so_host_getopt(sk, cmd == SIOCINQ ? KBP_SO_OPT_INQ :
						 KBP_SO_OPT_OUTQ, &val);
		if (err)
			return err;
		return put_user(val, (int __user *)arg);
	}
	if (sk->sk_family == AF_INET6)
		return inet6_ioctl(sock, cmd, arg);
	return inet_ioctl(sock, cmd, arg);
}

static void kbp_so_unhash(struct sock *sk)
{
	/* nothing hashed in this kernel: the host owns the port */
}

/*
 * No port of this kernel's: a cgroup BPF program calling bpf_bind() on an
 * outsourced socket (__inet_bind() asks ->get_port()) gets an error, not a
 * NULL call.
 */
static int kbp_so_get_port(struct sock *sk, unsigned short snum)
{
	return -EOPNOTSUPP;
}

static struct proto kbp_so_prot = {
	.name		= "KBP_SO",
	.owner		= THIS_MODULE,
	.obj_size	= sizeof(struct kbp_so_sock),
	.init		= kbp_so_init_sock,
	.close		= kbp_so_close,
	.unhash		= kbp_so_unhash,
	.get_port	= kbp_so_get_port,
};

static const struct proto_ops kbp_so_ops = {
	.family		= PF_INET,
	.owner		= THIS_MODULE,
	.release	= inet_release,
	.bind		= kbp_so_bind,
	.connect	= kbp_so_connect,
	.socketpair	= sock_no_socketpair,
	.accept		= sock_no_accept,
	.getname	= kbp_so_getname,
	.poll		= kbp_so_poll,
	.ioctl		= kbp_so_ioctl,
	.listen		= sock_no_listen,
	.shutdown	= kbp_so_shutdown,
	.setsockopt	= kbp_so_setsockopt,
	.getsockopt	= kbp_so_getsockopt,
	.sendmsg	= kbp_so_sendmsg,
	.recvmsg	= kbp_so_recvmsg,
	.mmap		= sock_no_mmap,
};

static struct inet_protosw kbp_so_protosw = {
	.type		= SOCK_DGRAM,
	.protocol	= KBP_SO_PROTO,
	.prot		= &kbp_so_prot,
	.ops		= &kbp_so_ops,
};

/*
 * AF_INET6: the same socket with a struct ipv6_pinfo for inet6_create(),
 * last (6.1 finds it at obj_size - sizeof(struct ipv6_pinfo); 6.5+ at
 * proto.ipv6_pinfo_offset, a Kbuild probe).  Nothing of it is used: the
 * IPv6 options are the host's.
 */
struct kbp_so_sock6 {
	struct kbp_so_sock ks;
	struct ipv6_pinfo inet6;
};

static struct proto kbp_so_prot6 = {
	.name		= "KBP_SO6",
	.owner		= THIS_MODULE,
	.obj_size	= sizeof(struct kbp_so_sock6),
#ifdef KBP_SO_HAVE_IPV6_PINFO_OFFSET
	.ipv6_pinfo_offset = offsetof(struct kbp_so_sock6, inet6),
#endif
	.init		= kbp_so_init_sock,
	.close		= kbp_so_close,
	.unhash		= kbp_so_unhash,
	.get_port	= kbp_so_get_port,
};

static const struct proto_ops kbp_so_ops6 = {
	.family		= PF_INET6,
	.owner		= THIS_MODULE,
	.release	= inet6_release,
	.bind		= kbp_so_bind,
	.connect	= kbp_so_connect,
	.socketpair	= sock_no_socketpair,
	.accept		= sock_no_accept,
	.getname	= kbp_so_getname,
	.poll		= kbp_so_poll,
	.ioctl		= kbp_so_ioctl,
	.listen		= sock_no_listen,
	.shutdown	= kbp_so_shutdown,
	.setsockopt	= kbp_so_setsockopt,
	.getsockopt	= kbp_so_getsockopt,
	.sendmsg	= kbp_so_sendmsg,
	.recvmsg	= kbp_so_recvmsg,
	.mmap		= sock_no_mmap,
};

static struct inet_protosw kbp_so_protosw6 = {
	.type		= SOCK_DGRAM,
	.protocol	= KBP_SO_PROTO,
	.prot		= &kbp_so_prot6,
	.ops		= &kbp_so_ops6,
};

/* The region is the host's: check everything the guest will index with. */
static int kbp_so_check_header(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	u64 end;

	if (READ_ONCE(h->magic) != KBP_SO_MAGIC) {
		pci_info(dev->pdev, "not a kbp-sod region (magic %#llx)\n",
			 READ_ONCE(h->magic));
		return -ENODEV;
	}
	if (READ_ONCE(h->version_major) != KBP_SO_VERSION_MAJOR ||
	    READ_ONCE(h->header_size) != KBP_SO_HEADER_SIZE) {
		pci_err(dev->pdev, "ABI %u.%u, this module speaks %u.x\n",
			READ_ONCE(h->version_major), READ_ONCE(h->version_minor),
			KBP_SO_VERSION_MAJOR);
		return -EPROTONOSUPPORT;
	}
	/* acquire: the host fills the header before it says UP */
	if (smp_load_acquire(&h->host_state) != KBP_SO_HOST_UP) {
		pci_err(dev->pdev, "kbp-sod is not serving this region\n");
		return -ENODEV;
	}
	dev->nr_queues = READ_ONCE(h->nr_queues);
	dev->entries = READ_ONCE(h->ring_entries);
	end = READ_ONCE(h->queue_offset) +
	      (u64)dev->nr_queues * READ_ONCE(h->queue_stride);
	if (!dev->nr_queues || dev->nr_queues > KBP_SO_MAX_QUEUES ||
	    !kbp_so_entries_valid(dev->entries) ||
	    READ_ONCE(h->queue_offset) < KBP_SO_HEADER_SIZE ||
	    READ_ONCE(h->queue_stride) < kbp_so_queue_bytes(dev->entries) ||
	    end > dev->size) {
		pci_err(dev->pdev, "bad layout: %u queues of %u, offset %u stride %u, %zu bytes\n",
			dev->nr_queues, dev->entries, READ_ONCE(h->queue_offset),
			READ_ONCE(h->queue_stride), dev->size);
		return -EINVAL;
	}
	return 0;
}

static int kbp_so_alloc_queues(struct kbp_so_dev *dev)
{
	struct device *d = &dev->pdev->dev;
	u32 i;

	dev->q = devm_kcalloc(d, dev->nr_queues, sizeof(*dev->q), GFP_KERNEL);
	if (!dev->q)
		return -ENOMEM;
	for (i = 0; i < dev->nr_queues; i++) {
		struct kbp_so_queue *q = &dev->q[i];
		u8 *base = (u8 *)dev->hdr + dev->hdr->queue_offset +
			   (size_t)i * dev->hdr->queue_stride;

		spin_lock_init(&q->lock);
		q->dev = dev;
		q->idx = i;
		q->ctl = (struct kbp_so_queue_ctl *)base;
		q->sq = (struct kbp_so_sqe *)(base + KBP_SO_QCTL_SIZE);
		q->cq = (struct kbp_so_cqe *)(base + KBP_SO_QCTL_SIZE +
					      (size_t)dev->entries * sizeof(*q->sq));
		q->slots = devm_kcalloc(d, dev->entries, sizeof(*q->slots), GFP_KERNEL);
		q->slot_gen = devm_kcalloc(d, dev->entries, sizeof(*q->slot_gen),
					   GFP_KERNEL);
		if (!q->slots || !q->slot_gen)
			return -ENOMEM;
	}
	return 0;
}

/*
 * The reset handshake's first half (docs/design.md, 11.5): once the host
 * acks, it has dropped every socket and parked request of this guest and
 * writes nothing more into its RAM; it serves nothing until ATTACHED.
 * Asks; returns the generation the ack will name.  Any context.
 */
static u32 kbp_so_reset_ask(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	u32 gen = READ_ONCE(h->guest_gen) + 1;

	WRITE_ONCE(h->guest_state, KBP_SO_GUEST_RESET);
	smp_wmb();	/* RESET before the generation the host acts on */
	WRITE_ONCE(h->guest_gen, gen);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
	return gen;
}

static bool kbp_so_reset_acked(struct kbp_so_dev *dev, u32 gen)
{
	/* acquire: the host's reset of the queues is visible once it acks */
	return smp_load_acquire(&dev->hdr->host_ack_gen) == gen;
}

/* The handshake, waiting (asleep) up to KBP_SO_ATTACH_MS for the ack. */
static int kbp_so_reset_host(struct kbp_so_dev *dev)
{
	u32 gen = kbp_so_reset_ask(dev);
	unsigned long end = jiffies + msecs_to_jiffies(KBP_SO_ATTACH_MS);

	while (!kbp_so_reset_acked(dev, gen)) {
		if (time_after(jiffies, end)) {
			pci_err(dev->pdev, "kbp-sod did not answer the reset\n");
			return -ETIMEDOUT;
		}
		usleep_range(1000, 2000);
	}
	return 0;
}

/*
 * A panic: the next kernel (panic=N's reboot, a crash kernel's kexec) may
 * own this RAM soon, and a parked receive would write into it.  The same
 * handshake, its wait busy and bounded (nothing sleeps here), then ABSENT.
 * No lock is taken: other CPUs are stopped, and one of them may hold any.
 * kbp_so_panic_dev: the attached device, set at probe's end, cleared
 * before removal (kbp_so_panic_forget()).
 */
#define KBP_SO_PANIC_WAIT_MS	500

static struct kbp_so_dev *kbp_so_panic_dev;

static int kbp_so_panic(struct notifier_block *nb, unsigned long event, void *unused)
{
	struct kbp_so_dev *dev = READ_ONCE(kbp_so_panic_dev);
	unsigned int ms;
	u32 gen;

	if (!dev)
		return NOTIFY_DONE;
	gen = kbp_so_reset_ask(dev);
	for (ms = 0; ms < KBP_SO_PANIC_WAIT_MS && !kbp_so_reset_acked(dev, gen); ms++)
		mdelay(1);
	/* release: nothing of ours follows; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
	return NOTIFY_DONE;
}

static struct notifier_block kbp_so_panic_nb = {
	.notifier_call = kbp_so_panic,
};

static void kbp_so_panic_forget(struct kbp_so_dev *dev)
{
	WRITE_ONCE(kbp_so_panic_dev, NULL);
	/* a panic on another CPU now runs on with its copy: stops all others */
}

/* The reset handshake, then ATTACHED at this epoch. */
static int kbp_so_attach(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	int err = kbp_so_reset_host(dev);
	u32 i;

	if (err)
		return err;
	/* need_irq on demand where the host honours it, else always set */
	dev->features = READ_ONCE(h->host_features) &
			(KBP_SO_FEAT_NEED_IRQ | KBP_SO_FEAT_META | KBP_SO_FEAT_QUEUE_OPTS);
	dev->irq_on_demand = dev->features & KBP_SO_FEAT_NEED_IRQ;
	for (i = 0; i < dev->nr_queues; i++) {
		dev->q[i].sq_tail = 0;
		dev->q[i].cq_head = 0;
		dev->q[i].irq_wanted = 0;
		/* before any atomic of ours on it: the guest is not attached yet */
		WRITE_ONCE(dev->q[i].ctl->need_irq, !dev->irq_on_demand);
	}
	dev->epoch = READ_ONCE(h->epoch);
	WRITE_ONCE(h->guest_epoch, dev->epoch);
	WRITE_ONCE(h->guest_features, dev->features);
	/* release: need_irq and guest_epoch before the host starts serving */
	smp_store_release(&h->guest_state, KBP_SO_GUEST_ATTACHED);
	return 0;
}

/*
 * Fails every request in flight with @res and refuses new ones: at removal
 * (@host_dead false, after the host's reset ack: nothing of it writes any
 * more) or because the host is dead (@host_dead: the requests that lent
 * pages make them orphans, their waiters keep them pinned).
 */
static void kbp_so_fail_slots(struct kbp_so_dev *dev, int res, bool host_dead)
{
	unsigned long flags;
	u32 i, s;

	for (i = 0; i < dev->nr_queues; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		spin_lock_irqsave(&q->lock, flags);
		if (host_dead)
			WRITE_ONCE(dev->host_dead, true);
		else
			dev->dead = true;
		for (s = 0; s < dev->entries; s++) {
			struct kbp_so_req *req = q->slots[s];

			if (!req)
				continue;
			req->orphan = host_dead && req->lends;
			req->cqe.res = res;
			kbp_so_unwant_irq(dev, q, req);
			kbp_so_finish(req);
			q->slots[s] = NULL;
		}
		spin_unlock_irqrestore(&q->lock, flags);
	}
}

static void kbp_so_fail_all(struct kbp_so_dev *dev)
{
	kbp_so_fail_slots(dev, -ENETDOWN, false);
}

/*
 * The watchdog (docs/design.md, 11.5), every heartbeat period on an
 * unbound worker (kbp_so_watch_again()): a heartbeat
 * that stood still for host_timeout_ms, or a new epoch (the daemon
 * restarted: its predecessor's sockets and parked requests are gone, and
 * QEMU cannot give us the new one's doorbells), declares the host dead:
 * every waiter returns ECONNRESET, new sockets ENETDOWN.  Pages lent then
 * are orphans until a new epoch proves the old daemon gone (its flock).
 */
static void kbp_so_watch_again(struct kbp_so_dev *dev)
{
	/* unbound: a CPU that an RT task keeps busy does not stall the watchdog */
	queue_delayed_work(system_unbound_wq, &dev->watch,
			   msecs_to_jiffies(KBP_SO_HEARTBEAT_MS));
}

/*
 * The watchdog's: CLOSE the host sockets of kbp_so_zombies that belong to
 * this attach and host; those of a gone device or host are gone with it.
 * Takes kbp_so_rwsem for reading if it can (removal holds it for writing
 * only after it cancelled the watchdog).
 */
static void kbp_so_zombies_close(struct kbp_so_dev *dev)
{
	struct kbp_so_zombie *z, *tmp;
	LIST_HEAD(list);

	if (!atomic_read(&kbp_so_nzombies) || !down_read_trylock(&kbp_so_rwsem))
		return;
	kbp_so_zombies_take(&list);
	list_for_each_entry_safe(z, tmp, &list, node) {
		struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CLOSE, .sock = z->handle };
		struct kbp_so_cqe cqe;
		int err = 0;

		if (z->attach_id == dev->attach_id && !READ_ONCE(dev->host_dead) &&
		    READ_ONCE(dev->hdr->epoch) == dev->epoch)
			err = kbp_so_call(dev, &sqe, &cqe, NULL, KBP_SO_SLOTS_RESERVED);
		if (err != -ETIMEDOUT && err != -EAGAIN)
			kbp_so_zombie_free(z);
	}
	kbp_so_zombies_give_back(&list);
	up_read(&kbp_so_rwsem);
}

static void kbp_so_watch(struct work_struct *work)
{
	struct kbp_so_dev *dev = container_of(to_delayed_work(work), struct kbp_so_dev,
					      watch);
	unsigned long limit = msecs_to_jiffies(READ_ONCE(kbp_so_host_timeout_ms));
	bool new_epoch = READ_ONCE(dev->hdr->epoch) != dev->epoch;
	u64 hb = READ_ONCE(dev->hdr->heartbeat);

	/* first: a late tick (a busy vCPU) must not mistake a live host */
	if (hb != dev->hb) {
		dev->hb = hb;
		dev->hb_at = jiffies;
	}
	if (!dev->host_dead && (new_epoch || time_after(jiffies, dev->hb_at + limit))) {
		kbp_so_fail_slots(dev, -ECONNRESET, true);
		pci_err(dev->pdev, "kbp-sod is dead (%s): its sockets are reset\n",
			new_epoch ? "new epoch" : "no heartbeat");
	}
	/* orphans made after the failure (waiters wake later) are caught too */
	if (dev->host_dead && new_epoch && atomic_read(&kbp_so_orphaned)) {
		unsigned int n = kbp_so_release_orphans();

		pci_info(dev->pdev, "new epoch: released %u orphaned page(s)\n", n);
	}
	kbp_so_zombies_close(dev);
	kbp_so_watch_again(dev);
}

/*
 * The idle path (docs/design.md, 11.11): a cpuidle driver of one state,
 * registered while idle_poll_us > 0 and a device is attached.  An idle
 * vCPU polls every queue's completions for idle_poll_us, waking their
 * waiters; then it announces in its queue's need_irq that it halts, a full
 * barrier, looks once more (the host: cq_tail, full barrier, need_irq),
 * and halts.  The host interrupts only a queue whose vCPU announced.
 * Sleeping waiters then set no need_irq of their own: a busy vCPU finds
 * their completions at its next outsourced system call or in the
 * tick-aligned sweep (two ticks at most).
 */
static unsigned int kbp_so_idle_poll_us;
/*
 * kbp_so_idle_mutex: the transitions of the idle path (idle_poll_us's
 * writes, probe's end, removal's start), kbp_so_idle_attached and
 * kbp_so_idle_state.  Taken in process context only; inside it
 * cpuidle_register()/cpuidle_unregister() take the cpuidle core's locks.
 */
static DEFINE_MUTEX(kbp_so_idle_mutex);
static struct kbp_so_dev *kbp_so_idle_attached;
static char kbp_so_idle_state[48] = "off";
/* the device the idle path and the sweeps serve: RCU, NULL when off */
static struct kbp_so_dev __rcu *kbp_so_idle_dev;

#ifndef KBP_SO_HAVE_CT_CPUIDLE
/* 6.1: what 6.3's ct_cpuidle_enter()/exit() wrap */
static __always_inline void ct_cpuidle_enter(void)
{
	trace_hardirqs_on_prepare();
	lockdep_hardirqs_on_prepare();
	ct_idle_enter();
	lockdep_hardirqs_on(_THIS_IP_);
}

static __always_inline void ct_cpuidle_exit(void)
{
	lockdep_hardirqs_off(_THIS_IP_);
	ct_idle_exit();
}
#endif

/* Any request that nobody polls for, in any queue (a racy hint). */
static bool kbp_so_waiting(struct kbp_so_dev *dev)
{
	u32 i;

	for (i = 0; i < dev->nr_used; i++)
		/* data_race: a hint; a late re-arm costs one sweep, a missed one the next call */
		if (data_race(READ_ONCE(dev->q[i].irq_wanted)))
			return true;
	return false;
}

/*
 * New completions that nobody is reaping yet: a queue whose interrupt
 * thread the idle path already woke (PREEMPT_RT) will be reaped by it.
 */
static bool kbp_so_pending(struct kbp_so_dev *dev)
{
	u32 i;

	for (i = 0; i < dev->nr_used; i++)
		if (kbp_so_has_new(&dev->q[i]) && !test_bit(0, &dev->q[i].idle_kick))
			return true;
	return false;
}

/*
 * The idle path's reap.  Without PREEMPT_RT the idle task reaps itself:
 * RCU watches here (CPUIDLE_FLAG_RCU_IDLE) and the queue's lock spins.
 * On PREEMPT_RT that lock sleeps, which the idle task must not: it wakes
 * the queue's interrupt thread instead, which reaps as "idle".
 */
static void kbp_so_idle_sweep(struct kbp_so_dev *dev)
{
	u32 i;

	if (!IS_ENABLED(CONFIG_PREEMPT_RT)) {
		kbp_so_sweep(dev, KBP_SO_BY_IDLE);
		return;
	}
	for (i = 0; i < dev->nr_used; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		if (kbp_so_has_new(q) && !test_and_set_bit(0, &q->idle_kick))
			irq_wake_thread(q->irq, q);
	}
}

static enum hrtimer_restart kbp_so_sweep_fn(struct hrtimer *t)
{
	struct kbp_so_dev *dev;
	bool again = false;

	rcu_read_lock();
	dev = rcu_dereference(kbp_so_idle_dev);
	if (dev) {
		kbp_so_sweep(dev, KBP_SO_BY_TICK);
		again = kbp_so_waiting(dev);
	}
	rcu_read_unlock();
	if (!again)
		return HRTIMER_NORESTART;
	hrtimer_forward_now(t, ns_to_ktime(TICK_NSEC));
	return HRTIMER_RESTART;
}

/*
 * Halts until an interrupt, RCU stopped around the halt only (as
 * default_idle_call() does).  Interrupts off before and after.
 */
static __always_inline void kbp_so_halt(void)
{
	ct_cpuidle_enter();
	raw_safe_halt();
	raw_local_irq_disable();
	ct_cpuidle_exit();
}

/*
 * The state's enter: called with interrupts off and, for a state flagged
 * CPUIDLE_FLAG_RCU_IDLE, with RCU watching; it stops RCU itself around
 * the halt only, as default_idle_call() does.  Returns with interrupts off.
 */
static int __cpuidle kbp_so_idle_enter(struct cpuidle_device *cdev,
				       struct cpuidle_driver *drv, int index)
{
	struct kbp_so_cpu *c = this_cpu_ptr(&kbp_so_cpu);
	struct kbp_so_queue *q;
	struct kbp_so_dev *dev;
	bool parked;
	u64 start;

	instrumentation_begin();
	WRITE_ONCE(c->in_idle, true);
	dev = rcu_dereference_sched(kbp_so_idle_dev);
	if (!dev) {
		/* stopping: halt as the kernel's default idle would */
		if (current_clr_polling_and_test())
			goto out;
		goto halt;
	}
	q = &dev->q[cdev->cpu % dev->nr_used];
	start = local_clock();
	local_irq_enable();
	/* polling: a wake-up of this CPU sets need_resched, no IPI */
	if (!current_set_polling_and_test()) {
		u64 limit = (u64)READ_ONCE(kbp_so_idle_poll_us) * NSEC_PER_USEC;

		while (!need_resched()) {
			kbp_so_idle_sweep(dev);
			if (local_clock() - start >= limit)
				break;
			cpu_relax();
		}
	}
	local_irq_disable();
	c->poll_ns += local_clock() - start;
	if (current_clr_polling_and_test())
		goto out;
	/* announce, full barrier, look again: pairs with cq_tail, barrier, need_irq */
	atomic_add(KBP_SO_NEED_HALTED, kbp_so_need(q));
	/* need_irq before cq_tail, as the host orders cq_tail before need_irq */
	smp_mb__after_atomic();
	if (kbp_so_pending(dev)) {
		atomic_sub(KBP_SO_NEED_HALTED, kbp_so_need(q));
		c->races++;
		local_irq_enable();
		kbp_so_idle_sweep(dev);
		local_irq_disable();
		goto out;
	}
	c->halts++;
	/* a halted CPU needs no tick-aligned sweep: the host interrupts it */
	parked = hrtimer_try_to_cancel(&c->sweep) == 1;
	kbp_so_halt();
	atomic_sub(KBP_SO_NEED_HALTED, kbp_so_need(q));
	if (parked && kbp_so_waiting(dev))
		kbp_so_sweep_arm();
	goto out;
halt:
	kbp_so_halt();
out:
	/* release: kbp_so_idle_stop() may free what this used once it reads false */
	smp_store_release(&c->in_idle, false);
	instrumentation_end();
	return index;
}

/*
 * No .owner: cpuidle would hold a reference on this module per registered
 * CPU, so rmmod would need idle_poll_us=0 first.  It is not needed: the
 * driver goes, and every CPU is waited out of kbp_so_idle_enter(), in
 * kbp_so_remove() (kbp_so_idle_detach()), before the module can.
 */
static struct cpuidle_driver kbp_so_idle_driver = {
	.name = "kbp_so",
	.states = {
		{
			.enter			= kbp_so_idle_enter,
			.exit_latency		= 1,
			.target_residency	= 1,
			.power_usage		= -1,
			.flags			= CPUIDLE_FLAG_RCU_IDLE,
			.name			= "KBP_SO",
			.desc			= "poll kbp_so rings, then halt",
		},
	},
	.state_count = 1,
	.safe_state_index = 0,
};

/*
 * Turns sleeping waiters' own need_irq off (@on) or back on, under every
 * queue's lock, then (off) a full barrier and one sweep: a completion
 * posted while neither its waiter's bit nor a halted vCPU asked for an
 * interrupt is found here, so nobody is left asleep.
 */
static void kbp_so_idle_mode(struct kbp_so_dev *dev, bool on)
{
	unsigned long flags;
	u32 i;

	for (i = 0; i < dev->nr_used; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		spin_lock_irqsave(&q->lock, flags);
		dev->idle = on;
		if (on && q->irq_wanted)
			kbp_so_sweep_arm();
		if (on)
			atomic_andnot(KBP_SO_NEED_WAITER, kbp_so_need(q));
		else if (q->irq_wanted)
			atomic_or(KBP_SO_NEED_WAITER, kbp_so_need(q));
		spin_unlock_irqrestore(&q->lock, flags);
	}
	if (on)
		return;
	/* the waiters' bits before cq_tail: pairs with the host's cq_tail, barrier, need_irq */
	smp_mb();
	kbp_so_sweep(dev, KBP_SO_BY_SYSCALL);
}

static void kbp_so_idle_unavailable(const char *why)
{
	snprintf(kbp_so_idle_state, sizeof(kbp_so_idle_state), "unavailable:%s", why);
}

/* kbp_so_idle_mutex held.  Refuses with the reason in /proc/kbp_so. */
static int kbp_so_idle_start(struct kbp_so_dev *dev)
{
	struct cpuidle_driver *cur;
	int err;

	if (!dev->irq_on_demand) {
		kbp_so_idle_unavailable("host-without-need_irq");
		return -EOPNOTSUPP;
	}
	/* idle=poll/halt/nomwait: the kernel's idle loop never asks cpuidle */
	if (boot_option_idle_override != IDLE_NO_OVERRIDE) {
		kbp_so_idle_unavailable("idle=-boot-option");
		return -EBUSY;
	}
	cur = cpuidle_get_driver();
	if (cur) {
		kbp_so_idle_unavailable(cur->name);
		return -EBUSY;
	}
	rcu_assign_pointer(kbp_so_idle_dev, dev);
	err = cpuidle_register(&kbp_so_idle_driver, NULL);
	if (err) {
		RCU_INIT_POINTER(kbp_so_idle_dev, NULL);
		synchronize_rcu();
		/* cpuidle.off=1 (or no cpuidle): -ENODEV; another driver: -EBUSY */
		kbp_so_idle_unavailable(err == -ENODEV ? "cpuidle.off" : "cpuidle-busy");
		return err;
	}
	kbp_so_idle_mode(dev, true);
	strscpy(kbp_so_idle_state, "on", sizeof(kbp_so_idle_state));
	return 0;
}

static bool kbp_so_idle_busy(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		/* acquire: pairs with kbp_so_idle_enter()'s release of in_idle */
		if (smp_load_acquire(&per_cpu(kbp_so_cpu, cpu).in_idle))
			return true;
	return false;
}

/*
 * kbp_so_idle_mutex held.  Sleeping waiters get their own need_irq back
 * first, then no CPU enters, none is left inside (a halted one is woken),
 * and no sweep is left queued: the device may go after this.
 */
static void kbp_so_idle_stop(struct kbp_so_dev *dev)
{
	int cpu;

	kbp_so_idle_mode(dev, false);
	RCU_INIT_POINTER(kbp_so_idle_dev, NULL);
	cpuidle_unregister(&kbp_so_idle_driver);
	synchronize_rcu();
	while (kbp_so_idle_busy()) {
		wake_up_all_idle_cpus();
		usleep_range(100, 200);
	}
	/*
	 * A CPU that just cleared in_idle still runs the last instructions of
	 * kbp_so_idle_enter(), with interrupts off and RCU watching: one more
	 * grace period and it has returned to the cpuidle core.
	 */
	synchronize_rcu();
	for_each_possible_cpu(cpu)
		hrtimer_cancel(&per_cpu(kbp_so_cpu, cpu).sweep);
	strscpy(kbp_so_idle_state, "off", sizeof(kbp_so_idle_state));
}

static bool kbp_so_idle_on(void)
{
	return rcu_access_pointer(kbp_so_idle_dev);
}

static int kbp_so_idle_set(const char *val, const struct kernel_param *kp)
{
	unsigned int us, old;
	int err = kstrtouint(val, 0, &us);

	if (err)
		return err;
	if (us > KBP_SO_IDLE_POLL_US_MAX)
		return -EINVAL;
	mutex_lock(&kbp_so_idle_mutex);
	old = kbp_so_idle_poll_us;
	WRITE_ONCE(kbp_so_idle_poll_us, us);
	if (kbp_so_idle_attached && us && !kbp_so_idle_on())
		err = kbp_so_idle_start(kbp_so_idle_attached);
	else if (kbp_so_idle_attached && !us && kbp_so_idle_on())
		kbp_so_idle_stop(kbp_so_idle_attached);
	if (err)
		WRITE_ONCE(kbp_so_idle_poll_us, old);
	mutex_unlock(&kbp_so_idle_mutex);
	return err;
}

static const struct kernel_param_ops kbp_so_idle_ops = {
	.set	= kbp_so_idle_set,
	.get	= param_get_uint,
};
module_param_cb(idle_poll_us, &kbp_so_idle_ops, &kbp_so_idle_poll_us, 0644);
MODULE_PARM_DESC(idle_poll_us, "idle vCPUs poll completions this long, then announce and halt (0: off, ..2000)");

/* The end of a successful probe: the idle path, if asked for, starts. */
static void kbp_so_idle_attach(struct kbp_so_dev *dev)
{
	mutex_lock(&kbp_so_idle_mutex);
	kbp_so_idle_attached = dev;
	if (kbp_so_idle_poll_us && kbp_so_idle_start(dev))
		pci_warn(dev->pdev, "idle path not started: %s\n", kbp_so_idle_state);
	mutex_unlock(&kbp_so_idle_mutex);
}

/* The start of removal: the idle path stops before the device goes. */
static void kbp_so_idle_detach(struct kbp_so_dev *dev)
{
	mutex_lock(&kbp_so_idle_mutex);
	if (kbp_so_idle_on())
		kbp_so_idle_stop(dev);
	kbp_so_idle_attached = NULL;
	strscpy(kbp_so_idle_state, "off", sizeof(kbp_so_idle_state));
	mutex_unlock(&kbp_so_idle_mutex);
}

static void kbp_so_idle_init(void)
{
	int cpu;

	for_each_possible_cpu(cpu) {
		struct hrtimer *t = &per_cpu(kbp_so_cpu, cpu).sweep;

#ifdef KBP_SO_HAVE_HRTIMER_SETUP
		hrtimer_setup(t, kbp_so_sweep_fn, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED_SOFT);
#else
		hrtimer_init(t, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED_SOFT);
		t->function = kbp_so_sweep_fn;
#endif
	}
}

static void kbp_so_free_irqs(struct kbp_so_dev *dev, u32 n)
{
	while (n--) {
		irq_update_affinity_hint(dev->q[n].irq, NULL);
		free_irq(dev->q[n].irq, &dev->q[n]);
	}
	pci_free_irq_vectors(dev->pdev);
}

static int kbp_so_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct kbp_so_sqe nop = { .op = KBP_SO_OP_NOP };
	struct kbp_so_cqe cqe;
	struct kbp_so_dev *dev;
	int err, nvec;
	u32 i;

	dev = devm_kzalloc(&pdev->dev, sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->pdev = pdev;
	err = pci_enable_device(pdev);
	if (err)
		return err;
	err = pci_request_regions(pdev, KBUILD_MODNAME);
	if (err)
		goto err_disable;
	dev->regs = pci_iomap(pdev, 0, 0);
	if (!dev->regs) {
		err = -ENOMEM;
		goto err_regions;
	}
	dev->size = pci_resource_len(pdev, 2);
	if (dev->size < KBP_SO_HEADER_SIZE) {
		err = -ENODEV;
		goto err_unmap_regs;
	}
	/* RAM on the host side: cacheable, like any memory shared with a peer */
	dev->hdr = memremap(pci_resource_start(pdev, 2), dev->size, MEMREMAP_WB);
	if (!dev->hdr) {
		err = -ENOMEM;
		goto err_unmap_regs;
	}
	err = kbp_so_check_header(dev);
	if (err)
		goto err_unmap_region;
	err = kbp_so_alloc_queues(dev);
	if (err)
		goto err_unmap_region;
	pci_set_master(pdev);
	nvec = pci_alloc_irq_vectors(pdev, 1, dev->nr_queues, PCI_IRQ_MSIX);
	if (nvec < 0) {
		err = nvec;
		pci_err(pdev, "no MSI-X vectors: %d\n", err);
		goto err_clear_master;
	}
	dev->nr_used = nvec;	/* queues past the vectors stay unused */
	for (i = 0; i < dev->nr_used; i++) {
		dev->q[i].irq = pci_irq_vector(pdev, i);
		err = request_irq(dev->q[i].irq, kbp_so_irq, 0, KBUILD_MODNAME, &dev->q[i]);
		if (err) {
			kbp_so_free_irqs(dev, i);
			goto err_clear_master;
		}
		/*
		 * queue i is CPU i's (kbp_so_this_queue()): its interrupt goes to
		 * that CPU, the one that announces a halt in its need_irq
		 */
		irq_set_affinity_and_hint(dev->q[i].irq,
					  cpumask_of(cpumask_local_spread(i, NUMA_NO_NODE)));
	}
	err = kbp_so_attach(dev);
	if (err)
		goto err_irqs;

	down_write(&kbp_so_rwsem);
	if (kbp_so_cur) {
		up_write(&kbp_so_rwsem);
		pci_err(pdev, "another kbp-sod device is attached already\n");
		err = -EBUSY;
		goto err_detach;
	}
	dev->attach_id = ++kbp_so_attach_ids;
	WRITE_ONCE(kbp_so_cur, dev);
	downgrade_write(&kbp_so_rwsem);
	/* one round trip: the doorbell, the host, the interrupt */
	err = kbp_so_call(dev, &nop, &cqe, NULL, KBP_SO_SLOTS_RESERVED);
	up_read(&kbp_so_rwsem);
	if (err || cqe.res) {
		pci_err(pdev, "NOP round trip failed: %d/%d\n", err, err ? 0 : cqe.res);
		err = err ? err : -EIO;
		goto err_unpublish;
	}
	pci_set_drvdata(pdev, dev);
	dev->hb = READ_ONCE(dev->hdr->heartbeat);
	dev->hb_at = jiffies;
	INIT_DELAYED_WORK(&dev->watch, kbp_so_watch);
	kbp_so_watch_again(dev);
	kbp_so_idle_attach(dev);
	WRITE_ONCE(kbp_so_panic_dev, dev);
	pci_info(pdev, "attached: ivshmem ID %u, epoch %u, %u of %u queue(s) of %u, NOP round trip ok\n",
		 readl(dev->regs + IVSHMEM_REG_IVPOSITION), dev->epoch, dev->nr_used,
		 dev->nr_queues, dev->entries);
	return 0;

err_unpublish:
	kbp_so_fail_all(dev);
	down_write(&kbp_so_rwsem);
	WRITE_ONCE(kbp_so_cur, NULL);
	up_write(&kbp_so_rwsem);
err_detach:
	/* release: nothing more of ours follows; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
err_irqs:
	kbp_so_free_irqs(dev, dev->nr_used);
err_clear_master:
	pci_clear_master(pdev);
err_unmap_region:
	memunmap(dev->hdr);
err_unmap_regs:
	pci_iounmap(pdev, dev->regs);
err_regions:
	pci_release_regions(pdev);
err_disable:
	pci_disable_device(pdev);
	return err;
}

/*
 * The device goes (rmmod, unbind, shutdown): every waiter wakes with
 * ENETDOWN, then no caller is left inside.  Only a host that acked the
 * reset (it dropped every parked request of ours, design.md 11.5) gets
 * the lent pages back into the allocator; a host that did not, or a dead
 * one (a stopped daemon may resume), may still write them: they stay
 * pinned as orphans for good, said with their count.
 */
static void kbp_so_quiesce(struct kbp_so_dev *dev)
{
	struct pci_dev *pdev = dev->pdev;
	bool acked;
	unsigned int n;

	/* first: no idle vCPU or sweep touches the device after this */
	kbp_so_idle_detach(dev);
	cancel_delayed_work_sync(&dev->watch);	/* host_dead is stable now */
	acked = !dev->host_dead && !kbp_so_reset_host(dev);
	kbp_so_fail_slots(dev, -ENETDOWN, !acked);
	down_write(&kbp_so_rwsem);
	WRITE_ONCE(kbp_so_cur, NULL);
	up_write(&kbp_so_rwsem);
	if (acked) {
		n = kbp_so_release_orphans();
		if (n)
			pci_info(pdev, "released %u orphaned page(s) of a previous kbp-sod\n", n);
	} else if (atomic_read(&kbp_so_orphaned)) {
		pci_warn(pdev, "kbp-sod did not ack the reset: %d page(s) it may still write stay pinned\n",
			 atomic_read(&kbp_so_orphaned));
	}
	/* release: no request of ours is left; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
}

static void kbp_so_teardown(struct pci_dev *pdev, struct kbp_so_dev *dev)
{
	kbp_so_free_irqs(dev, dev->nr_used);
	pci_clear_master(pdev);
	memunmap(dev->hdr);
	pci_iounmap(pdev, dev->regs);
	pci_release_regions(pdev);
	pci_disable_device(pdev);
}

static void kbp_so_remove(struct pci_dev *pdev)
{
	struct kbp_so_dev *dev = pci_get_drvdata(pdev);

	if (!dev)	/* shut down already */
		return;
	kbp_so_panic_forget(dev);
	kbp_so_quiesce(dev);
	kbp_so_teardown(pdev, dev);
	pci_set_drvdata(pdev, NULL);
}

/*
 * Reboot, kexec, power-off: the host drops every parked request before the
 * next kernel owns this RAM (a parked receive would write into it, at the
 * old addresses, whatever reached the port).  The processes that still
 * run see ECONNRESET.
 */
static void kbp_so_pci_shutdown(struct pci_dev *pdev)
{
	kbp_so_remove(pdev);
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

static const struct seq_operations kbp_so_seq_ops = {
	.start	= kbp_so_seq_start,
	.next	= kbp_so_seq_next,
	.stop	= kbp_so_seq_stop,
	.show	= kbp_so_seq_show,
};

static const struct pci_device_id kbp_so_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },	/* ivshmem (doorbell) */
	{ }
};
MODULE_DEVICE_TABLE(pci, kbp_so_ids);

static struct pci_driver kbp_so_driver = {
	.name		= KBUILD_MODNAME,
	.id_table	= kbp_so_ids,
	.probe		= kbp_so_probe,
	.remove		= kbp_so_remove,
	.shutdown	= kbp_so_pci_shutdown,
};

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
