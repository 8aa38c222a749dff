/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * kbp_so: the guest side of kbp socket outsourcing.  Internal interfaces
 * of the module, shared by its files:
 *   kbp_so_main.c  the parameters, the shared state (the current device,
 *                  the list of sockets, the zombies), the policy, init and
 *                  exit
 *   kbp_so_ring.c  the transport: slots, submission, completions, the
 *                  interrupt handler and the sweeps, a socket's requests
 *   kbp_so_pin.c   user pages lent to the host: pinning, orphans
 *   kbp_so_sock.c  the protocol's socket operations
 *   kbp_so_dev.c   the ivshmem device: attach, the reset handshake, panic,
 *                  the dead-host watchdog, probe and removal
 *   kbp_so_idle.c  the idle path: the cpuidle driver, the tick-aligned sweep
 *   kbp_so_proc.c  /proc/kbp_so
 */
#ifndef _KBP_SO_H
#define _KBP_SO_H

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
#include "kbp_so_spec.h"	/* /proc/kbp_so's keys, the parameters' ranges */

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
/* need_irq's parts (kbp_so_abi.h): a sleeping waiter; each halted vCPU */
#define KBP_SO_NEED_WAITER	1
#define KBP_SO_NEED_HALTED	2
#define KBP_SO_BACKOFF_MS	64U		/* a slot-less waiter's longest poll */

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

struct kbp_so_req {
	struct completion done;
	struct kbp_so_cqe cqe;
	/*
	 * called instead of complete(), under the queue's lock in the
	 * interrupt handler (no sleeping): it must complete done itself
	 */
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
 * Per-socket counters for /proc/kbp_so.  The operations of one socket are
 * not serialized here (no lock_sock: two threads may send and receive on it
 * at once, and the POLL callback runs in the interrupt handler), so they
 * are atomic64_t: uncontended in the common case, one locked add each.
 */
struct kbp_so_stats {
	atomic64_t c[KBP_SO_NR_STATS];	/* enum kbp_so_stat (kbp_so_spec.h) */
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
	 * so: that waits for complete() to return, so a new POLL can reuse
	 * poll_req.  The callback wakes the waiters after that complete()
	 * (design.md 11.13), so close also waits for poll_finishing to fall to
	 * 0: the callback's last touch of this socket.  Nests outside a
	 * queue's lock (kbp_so_submit()).
	 * poll_missed: the events of callers that found a POLL out and armed
	 * none (KBP_SO_POLL_*); its callback wakes with them too.
	 */
	spinlock_t poll_lock;
	atomic_t poll_finishing;
	atomic_t poll_missed;
	bool poll_armed;
	bool poll_closing;		/* no POLL is armed after this */
	u32 poll_want;			/* the armed POLL's events */
	u64 poll_tag;			/* its tag, for a CANCEL */
	struct kbp_so_req poll_req;
	struct kbp_so_queue *poll_q;
	u32 poll_slot;
};

/* A host socket to close again (kbp_so_main.c: kbp_so_zombies). */
struct kbp_so_zombie {
	struct list_head node;
	u32 attach_id;
	u32 handle;
};

static inline struct kbp_so_sock *kbp_so_sk(const struct sock *sk)
{
	return (struct kbp_so_sock *)sk;
}

/*
 * need_irq, a __u32 of the shared control block that the guest composes
 * only with atomic operations (kbp_so_abi.h): a sleeping waiter's bit
 * under the queue's lock, the halted vCPUs' count from the idle path,
 * which cannot take that lock (PREEMPT_RT: it sleeps).
 */
static inline atomic_t *kbp_so_need(struct kbp_so_queue *q)
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

/*
 * @q has completions nobody consumed yet: a hint without the lock.  cq_head
 * only grows under it, so a stale one says "new"; kbp_so_reap() reads both
 * again under the lock.
 */
static inline bool kbp_so_has_new(struct kbp_so_queue *q)
{
	/* data_race: the hint above; the lock's holder decides */
	return READ_ONCE(q->ctl->cq_tail) != data_race(q->cq_head);
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

/* kbp_so_main.c */
extern atomic_t kbp_so_pinned;
extern unsigned int kbp_so_host_timeout_ms;
extern unsigned int kbp_so_poll_us;
extern atomic_t kbp_so_orphaned;
extern atomic64_t kbp_so_fallbacks;
extern struct rw_semaphore kbp_so_rwsem;
extern struct kbp_so_dev *kbp_so_cur;
extern u32 kbp_so_attach_ids;
extern struct mutex kbp_so_socks_mutex;
extern struct list_head kbp_so_socks;
extern unsigned int kbp_so_nsocks;
extern atomic_t kbp_so_nzombies;
void kbp_so_zombie_add(u32 attach_id, u32 handle, gfp_t gfp);
void kbp_so_zombies_take(struct list_head *list);
void kbp_so_zombies_give_back(struct list_head *list);
void kbp_so_zombie_free(struct kbp_so_zombie *z);
extern atomic64_t kbp_so_refused_netns;
extern atomic64_t kbp_so_refused_user;
int kbp_so_policy_check(struct sock *sk);

/* kbp_so_ring.c */
void kbp_so_count_done(struct kbp_so_sock *ks, const struct kbp_so_req *req);
int kbp_so_fallback(struct kbp_so_sock *ks);
void kbp_so_finish(struct kbp_so_req *req);
void kbp_so_sweep_arm(void);
void kbp_so_unwant_irq(struct kbp_so_dev *dev, struct kbp_so_queue *q,
		       struct kbp_so_req *req);
irqreturn_t kbp_so_irq(int irq, void *data);
void kbp_so_sweep(struct kbp_so_dev *dev, enum kbp_so_found by);
int kbp_so_submit(struct kbp_so_dev *dev, struct kbp_so_queue *q,
		  struct kbp_so_sqe *sqe, struct kbp_so_req *req, bool poll,
		  enum kbp_so_slots kind);
bool kbp_so_forget(struct kbp_so_queue *q, u32 slot, struct kbp_so_req *req);
struct kbp_so_queue *kbp_so_this_queue(struct kbp_so_dev *dev);
int kbp_so_call(struct kbp_so_dev *dev, struct kbp_so_sqe *sqe,
		struct kbp_so_cqe *cqe, struct kbp_so_sock *ks,
		enum kbp_so_slots kind);
int kbp_so_sock_check(struct kbp_so_sock *ks);
int kbp_so_sock_call_slots(struct sock *sk, struct kbp_so_sqe *sqe,
			   struct kbp_so_cqe *cqe, enum kbp_so_slots kind);
int kbp_so_sock_call(struct sock *sk, struct kbp_so_sqe *sqe,
		     struct kbp_so_cqe *cqe);
int kbp_so_data_call(struct sock *sk, struct kbp_so_sqe *sqe,
		     struct kbp_so_cqe *cqe, long timeo, struct kbp_so_pin *pin);

/* kbp_so_pin.c */
unsigned int kbp_so_release_orphans(void);
void kbp_so_unpin(struct kbp_so_pin *p);
int kbp_so_pin_iter(struct iov_iter *it, size_t len, struct kbp_so_pin *p,
		    struct kbp_so_sqe *sqe);

/* kbp_so_sock.c */
extern struct proto kbp_so_prot;
extern struct inet_protosw kbp_so_protosw;
extern struct proto kbp_so_prot6;
extern struct inet_protosw kbp_so_protosw6;

/* kbp_so_dev.c */
extern struct notifier_block kbp_so_panic_nb;
extern struct pci_driver kbp_so_driver;

/* kbp_so_idle.c */
DECLARE_PER_CPU(struct kbp_so_cpu, kbp_so_cpu);
extern unsigned int kbp_so_idle_poll_us;
extern struct mutex kbp_so_idle_mutex;
extern char kbp_so_idle_state[48];
void kbp_so_idle_attach(struct kbp_so_dev *dev);
void kbp_so_idle_detach(struct kbp_so_dev *dev);
void kbp_so_idle_init(void);

/* kbp_so_proc.c */
extern const struct seq_operations kbp_so_seq_ops;

#endif /* _KBP_SO_H */
