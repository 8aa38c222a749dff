// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so: the guest side of kbp socket outsourcing (docs/design.md, section 11).
 *
 * This is the foundation of part 1: it binds the ivshmem-doorbell device
 * that kbp-sod serves, checks the region's header and layout, attaches with
 * the reset handshake, and carries synchronous requests over the per-vCPU
 * rings (doorbell to the host, one MSI-X vector per queue back).  It
 * registers the private protocol (AF_INET, SOCK_DGRAM, KBP_SO_PROTO) whose
 * socket, bind, connect, getsockname/getpeername, sendmsg, recvmsg and close
 * are requests to the host.  sendmsg/recvmsg pin the user buffer and hand
 * the host its guest-physical ranges: the host copies the datagram once,
 * between its socket and the process's pages; poll asks the host with an
 * armed POLL.  Not yet here: the setsockopt subset, shutdown, AF_INET6,
 * buffers that need a bounce page, and re-attaching after a daemon restart
 * (EOPNOTSUPP or ECONNRESET).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/delay.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/net.h>
#include <linux/pci.h>
#include <linux/rwsem.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uio.h>
#include <net/inet_common.h>
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

/*
 * Pages of user buffers lent to the host right now (pinned, or referenced
 * on 6.1).  /sys/module/kbp_so/parameters/pinned_pages; 0 when idle.
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

struct kbp_so_req {
	struct completion done;
	struct kbp_so_cqe cqe;
	/* called before done completes, in the interrupt handler: no sleeping */
	void (*done_fn)(struct kbp_so_req *req);
};

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

struct kbp_so_sock {
	struct inet_sock inet;		/* first: inet_create uses inet_sk() */
	u32 handle;			/* the host's; 0: none */
	u32 attach_id;			/* the attach that made it */
	/*
	 * poll: the host's last answer (KBP_SO_POLL_*), a hint that a receive
	 * or a send that would block clears; the armed POLL request (at most
	 * one, KBP_SO_ARMED set from its submission until its completion's
	 * callback), and where it went.  Lock-free: atomics and one bit owner.
	 */
	atomic_t revents;
	unsigned long pflags;
	struct kbp_so_req poll_req;
	struct kbp_so_queue *poll_q;
	u32 poll_slot;
};

#define KBP_SO_ARMED	0	/* pflags bit */

static struct kbp_so_sock *kbp_so_sk(const struct sock *sk)
{
	return (struct kbp_so_sock *)sk;
}

/* A request's final completion: its callback, then its waiter. */
static void kbp_so_finish(struct kbp_so_req *req)
{
	if (req->done_fn)
		req->done_fn(req);
	complete(&req->done);
}

/* Consumes the queue's new completions and wakes their callers. */
static void kbp_so_reap(struct kbp_so_dev *dev, struct kbp_so_queue *q)
{
	unsigned long flags;
	u32 tail;

	spin_lock_irqsave(&q->lock, flags);
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
		    q->slot_gen[slot] != upper_32_bits(cqe.tag))
			continue;	/* a caller that timed out */
		req = q->slots[slot];
		q->slots[slot] = NULL;
		req->cqe = cqe;
		kbp_so_finish(req);
	}
	/* release: our reads of the slots are done before the host reuses them */
	smp_store_release(&q->ctl->cq_head, q->cq_head);
	spin_unlock_irqrestore(&q->lock, flags);
}

static irqreturn_t kbp_so_irq(int irq, void *data)
{
	struct kbp_so_queue *q = data;

	kbp_so_reap(q->dev, q);
	return IRQ_HANDLED;
}

/*
 * Puts @sqe on @q for @req and rings the doorbell.  The caller holds
 * kbp_so_rwsem for reading (the device stays).  Returns the slot, or
 * -errno when nothing was submitted.  The tag is (generation << 32 | queue
 * << 16 | slot): the queue makes it unique in the VM, for CANCEL.
 */
static int kbp_so_submit(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			 struct kbp_so_sqe *sqe, struct kbp_so_req *req)
{
	unsigned long flags;
	u32 slot, host_head;
	bool polling;

	init_completion(&req->done);
	memset(&req->cqe, 0, sizeof(req->cqe));
	spin_lock_irqsave(&q->lock, flags);
	if (dev->dead || q->broken) {
		spin_unlock_irqrestore(&q->lock, flags);
		return -ENETDOWN;
	}
	host_head = READ_ONCE(q->ctl->sq_head);
	for (slot = 0; slot < dev->entries && q->slots[slot]; slot++)
		;
	if (slot == dev->entries || q->sq_tail - host_head >= dev->entries) {
		spin_unlock_irqrestore(&q->lock, flags);
		return -EAGAIN;
	}
	q->slots[slot] = req;
	q->slot_gen[slot]++;
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
		gone = true;
	}
	spin_unlock_irqrestore(&q->lock, flags);
	return gone;
}

static struct kbp_so_queue *kbp_so_this_queue(struct kbp_so_dev *dev)
{
	return &dev->q[raw_smp_processor_id() % dev->nr_used];
}

/*
 * One synchronous request that lends the host no guest memory, on @q.
 * The caller holds kbp_so_rwsem for reading.  Returns 0 with *cqe filled,
 * or -errno.
 */
static int kbp_so_call_on(struct kbp_so_dev *dev, struct kbp_so_queue *q,
			  struct kbp_so_sqe *sqe, struct kbp_so_cqe *cqe)
{
	struct kbp_so_req req = { };
	int slot = kbp_so_submit(dev, q, sqe, &req);

	if (slot < 0)
		return slot;
	if (!wait_for_completion_timeout(&req.done, KBP_SO_CALL_TIMEOUT)) {
		/* no pages are lent: forgetting an unanswered slot is safe */
		if (kbp_so_forget(q, slot, &req))
			return -ETIMEDOUT;
		wait_for_completion(&req.done);
	}
	*cqe = req.cqe;
	return 0;
}

static int kbp_so_call(struct kbp_so_dev *dev, struct kbp_so_sqe *sqe,
		       struct kbp_so_cqe *cqe)
{
	return kbp_so_call_on(dev, kbp_so_this_queue(dev), sqe, cqe);
}

/* The device a socket was made on, still attached; kbp_so_rwsem held. */
static int kbp_so_sock_check(struct kbp_so_sock *ks)
{
	if (!kbp_so_cur || kbp_so_cur->attach_id != ks->attach_id || !ks->handle)
		return -ECONNRESET;	/* its host socket is gone */
	if (READ_ONCE(kbp_so_cur->hdr->epoch) != kbp_so_cur->epoch)
		return -ECONNRESET;	/* the daemon restarted */
	return 0;
}

/* A request by a socket: the device it was made on, still attached. */
static int kbp_so_sock_call(struct sock *sk, struct kbp_so_sqe *sqe,
			    struct kbp_so_cqe *cqe)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	int err;

	sqe->sock = ks->handle;
	down_read(&kbp_so_rwsem);
	err = kbp_so_sock_check(ks);
	if (!err)
		err = kbp_so_call(kbp_so_cur, sqe, cqe);
	up_read(&kbp_so_rwsem);
	if (!err && cqe->res < 0)
		err = cqe->res;
	return err;
}

static int kbp_so_addr_from(const struct sockaddr *uaddr, int len,
			    struct kbp_so_addr *a)
{
	const struct sockaddr_in *sin = (const struct sockaddr_in *)uaddr;

	memset(a, 0, sizeof(*a));
	if (len < (int)sizeof(sa_family_t))
		return -EINVAL;
	if (uaddr->sa_family == AF_UNSPEC)
		return 0;
	if (uaddr->sa_family != AF_INET)
		return -EAFNOSUPPORT;
	if (len < (int)sizeof(*sin))
		return -EINVAL;
	a->family = KBP_SO_AF_INET;
	a->port = (__force u16)sin->sin_port;
	memcpy(a->addr, &sin->sin_addr, 4);
	return 0;
}

static int kbp_so_bind(struct socket *sock, struct kbp_so_uaddr *uaddr, int len)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_BIND };
	struct kbp_so_cqe cqe;
	int err = kbp_so_addr_from((struct sockaddr *)uaddr, len, &sqe.addr);

	if (err)
		return err;
	if (sqe.addr.family != KBP_SO_AF_INET)
		return -EAFNOSUPPORT;
	return kbp_so_sock_call(sock->sk, &sqe, &cqe);
}

static int kbp_so_connect(struct socket *sock, struct kbp_so_uaddr *uaddr, int len,
			  int flags)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CONNECT };
	struct kbp_so_cqe cqe;
	int err = kbp_so_addr_from((struct sockaddr *)uaddr, len, &sqe.addr);

	if (err)
		return err;
	return kbp_so_sock_call(sock->sk, &sqe, &cqe);
}

static int kbp_so_getname(struct socket *sock, struct sockaddr *uaddr, int peer)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_GETNAME, .arg0 = !!peer };
	struct sockaddr_in *sin = (struct sockaddr_in *)uaddr;
	struct kbp_so_cqe cqe;
	int err = kbp_so_sock_call(sock->sk, &sqe, &cqe);

	if (err)
		return err;
	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	sin->sin_port = (__force __be16)cqe.addr.port;
	memcpy(&sin->sin_addr, cqe.addr.addr, 4);
	return sizeof(*sin);
}

/*
 * The data path (docs/design.md, 11.2): a user buffer is lent to the host
 * as guest-physical segments for exactly one request, from its submission
 * to its final completion.  On 6.3+ the pages are pinned (FOLL_PIN, as for
 * direct I/O); 6.1 has no iov_iter_extract_pages() and takes a page
 * reference instead (Kbuild probe).  Only user-backed iterators: kernel
 * buffers would need the bounce page, which is not done (EOPNOTSUPP).
 */
struct kbp_so_pin {
	struct page *pages[KBP_SO_MAX_SEGS];
	unsigned int nr;
	bool dirty;			/* the host writes them (receive) */
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
static ssize_t kbp_so_extract(struct iov_iter *it, struct page **pages,
			      size_t max, unsigned int maxpages, size_t *off)
{
	return iov_iter_get_pages2(it, pages, max, maxpages, off);
}

static void kbp_so_release_pages(struct kbp_so_pin *p)
{
	unsigned int i;

	for (i = 0; i < p->nr; i++) {
		if (p->dirty)
			set_page_dirty_lock(p->pages[i]);
		put_page(p->pages[i]);
	}
}
#endif

/* Only after the request's final completion, or when no host can write. */
static void kbp_so_unpin(struct kbp_so_pin *p)
{
	if (!p->nr)
		return;
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
			       u32 slot, struct kbp_so_req *req, u32 sock, u64 tag)
{
	struct kbp_so_sqe c = { .op = KBP_SO_OP_CANCEL, .sock = sock, .arg1 = tag };
	bool asked = false;

	for (;;) {
		struct kbp_so_cqe ccqe;

		if (!asked && !completion_done(&req->done))
			asked = kbp_so_call_on(dev, q, &c, &ccqe) != -EAGAIN;
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
			    struct kbp_so_cqe *cqe, long timeo)
{
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_queue *q;
	struct kbp_so_req req = { };
	long left;
	int err, slot;

	sqe->sock = ks->handle;
	/* read: the device outlives the request (removal fails it first) */
	down_read(&kbp_so_rwsem);
	err = kbp_so_sock_check(ks);
	if (err)
		goto out;
	q = kbp_so_this_queue(kbp_so_cur);
	slot = kbp_so_submit(kbp_so_cur, q, sqe, &req);
	if (slot < 0) {
		err = slot;
		goto out;
	}
	left = wait_for_completion_interruptible_timeout(&req.done, timeo);
	if (left <= 0) {
		kbp_so_cancel_wait(kbp_so_cur, q, slot, &req, sqe->sock, sqe->tag);
		/* data that won the race is returned: it left the host socket */
		if (req.cqe.res == -ECANCELED)
			req.cqe.res = left ? sock_intr_errno(timeo) : -EAGAIN;
	}
	*cqe = req.cqe;
	err = cqe->res < 0 ? cqe->res : 0;
out:
	up_read(&kbp_so_rwsem);
	return err;
}

static int kbp_so_sendmsg(struct socket *sock, struct msghdr *msg, size_t len)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SENDMSG };
	bool noblock = msg->msg_flags & MSG_DONTWAIT;
	struct kbp_so_pin pin = { .dirty = false };
	struct kbp_so_cqe cqe;
	int err;

	if ((msg->msg_flags & (MSG_OOB | MSG_MORE)) || msg->msg_controllen)
		return -EOPNOTSUPP;
	if (len > KBP_SO_MAX_IO)
		return -EMSGSIZE;
	if (msg->msg_name) {
		/* AF_UNSPEC stays family 0: the connected peer, as for UDP */
		err = kbp_so_addr_from(msg->msg_name, msg->msg_namelen, &sqe.addr);
		if (err)
			return err;
	}
	err = kbp_so_pin_iter(&msg->msg_iter, len, &pin, &sqe);
	if (err)
		goto out;
	if (noblock)
		sqe.msg_flags = KBP_SO_MSG_DONTWAIT;
	else
		sqe.flags = KBP_SO_F_WAIT;	/* parks on a full send buffer */
	err = kbp_so_data_call(sock->sk, &sqe, &cqe,
			       noblock ? KBP_SO_CALL_TIMEOUT :
					 sock_sndtimeo(sock->sk, false));
	if (err == -EAGAIN)	/* not writable: the next poll asks the host */
		atomic_andnot(KBP_SO_POLL_OUT, &kbp_so_sk(sock->sk)->revents);
	if (!err)
		err = cqe.res;
out:
	kbp_so_unpin(&pin);
	return err;
}

static int kbp_so_recvmsg(struct socket *sock, struct msghdr *msg, size_t len,
			  int flags)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_RECVMSG };
	bool noblock = flags & MSG_DONTWAIT;
	struct kbp_so_pin pin = { .dirty = true };
	struct kbp_so_cqe cqe;
	int err;

	if (flags & (MSG_OOB | MSG_ERRQUEUE))
		return -EOPNOTSUPP;
	/* a UDP payload is at most 65507 bytes: the rest of a buffer stays */
	err = kbp_so_pin_iter(&msg->msg_iter, min_t(size_t, len, KBP_SO_MAX_IO),
			      &pin, &sqe);
	if (err)
		goto out;
	if (flags & MSG_PEEK)
		sqe.msg_flags |= KBP_SO_MSG_PEEK;
	if (flags & MSG_TRUNC)
		sqe.msg_flags |= KBP_SO_MSG_TRUNC;
	if (noblock)
		sqe.msg_flags |= KBP_SO_MSG_DONTWAIT;
	else
		sqe.flags = KBP_SO_F_WAIT;	/* parked until a datagram comes */
	err = kbp_so_data_call(sock->sk, &sqe, &cqe,
			       noblock ? KBP_SO_CALL_TIMEOUT :
					 sock_rcvtimeo(sock->sk, false));
	/* consumed, or nothing there: the next poll asks the host again */
	if (!(flags & MSG_PEEK) || err)
		atomic_andnot(KBP_SO_POLL_IN | KBP_SO_POLL_ERR,
			      &kbp_so_sk(sock->sk)->revents);
	if (err)
		goto out;
	if (msg->msg_name && cqe.addr.family == KBP_SO_AF_INET) {
		DECLARE_SOCKADDR(struct sockaddr_in *, sin, msg->msg_name);

		memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = (__force __be16)cqe.addr.port;
		memcpy(&sin->sin_addr, cqe.addr.addr, 4);
		msg->msg_namelen = sizeof(*sin);
	}
	if (cqe.out_flags & KBP_SO_OUT_TRUNC)
		msg->msg_flags |= MSG_TRUNC;
	err = cqe.res;
out:
	kbp_so_unpin(&pin);
	return err;
}

/*
 * The armed POLL's completion, in the interrupt handler: the host's
 * revents become the socket's, then the waiters of sk_sleep() wake (as
 * sock_def_readable() does) and poll again.  Clearing KBP_SO_ARMED after
 * the store lets the next ->poll() arm again.
 */
static void kbp_so_poll_done(struct kbp_so_req *req)
{
	struct kbp_so_sock *ks = container_of(req, struct kbp_so_sock, poll_req);
	struct sock *sk = &ks->inet.sk;
	struct socket_wq *wq;

	atomic_set(&ks->revents, req->cqe.res < 0 ? KBP_SO_POLL_ERR :
		   req->cqe.out_flags & KBP_SO_POLL_ALL);
	clear_bit_unlock(KBP_SO_ARMED, &ks->pflags);
	rcu_read_lock();
	wq = rcu_dereference(sk->sk_wq);
	if (skwq_has_sleeper(wq))
		wake_up_interruptible_all(&wq->wait);
	rcu_read_unlock();
}

/* Arms one POLL for @want unless one is armed; never sleeps for long. */
static void kbp_so_poll_arm(struct kbp_so_sock *ks, u32 want)
{
	struct kbp_so_sqe sqe = {
		.op = KBP_SO_OP_POLL, .flags = KBP_SO_F_ARM, .arg1 = want,
		.sock = ks->handle,
	};
	struct kbp_so_queue *q;
	int slot;

	if (test_and_set_bit_lock(KBP_SO_ARMED, &ks->pflags))
		return;
	/* removal holds it for writing: no arming then, the next poll retries */
	if (!down_read_trylock(&kbp_so_rwsem)) {
		clear_bit_unlock(KBP_SO_ARMED, &ks->pflags);
		return;
	}
	if (kbp_so_sock_check(ks)) {
		atomic_set(&ks->revents, KBP_SO_POLL_ERR);
		clear_bit_unlock(KBP_SO_ARMED, &ks->pflags);
		goto out;
	}
	q = kbp_so_this_queue(kbp_so_cur);
	ks->poll_req.done_fn = kbp_so_poll_done;
	ks->poll_q = q;
	slot = kbp_so_submit(kbp_so_cur, q, &sqe, &ks->poll_req);
	if (slot < 0) {
		/* a full ring: say ready, the caller's next operation finds out */
		atomic_or(want, &ks->revents);
		clear_bit_unlock(KBP_SO_ARMED, &ks->pflags);
		goto out;
	}
	ks->poll_slot = slot;
out:
	up_read(&kbp_so_rwsem);
}

/* The CLOSE completed the armed POLL on the host: wait for it here too. */
static void kbp_so_poll_disarm(struct kbp_so_sock *ks)
{
	down_read(&kbp_so_rwsem);
	if (test_bit(KBP_SO_ARMED, &ks->pflags) &&
	    !wait_for_completion_timeout(&ks->poll_req.done, KBP_SO_CALL_TIMEOUT) &&
	    !kbp_so_forget(ks->poll_q, ks->poll_slot, &ks->poll_req))
		wait_for_completion(&ks->poll_req.done);	/* lends no pages */
	up_read(&kbp_so_rwsem);
}

static __poll_t kbp_so_poll(struct file *file, struct socket *sock,
			    poll_table *wait)
{
	struct kbp_so_sock *ks = kbp_so_sk(sock->sk);
	__poll_t mask = 0;
	u32 rev, want;

	sock_poll_wait(file, sock, wait);
	rev = atomic_read(&ks->revents);
	want = (KBP_SO_POLL_IN | KBP_SO_POLL_OUT) & ~rev;
	if (want && !(rev & KBP_SO_POLL_ERR))
		kbp_so_poll_arm(ks, want);
	rev = atomic_read(&ks->revents);	/* the host may have answered */
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

/* proto.init: the host socket is made with the guest's. */
static int kbp_so_init_sock(struct sock *sk)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_SOCKET, .arg0 = KBP_SO_AF_INET };
	struct kbp_so_sock *ks = kbp_so_sk(sk);
	struct kbp_so_cqe cqe;
	int err;

	ks->handle = 0;
	atomic_set(&ks->revents, 0);
	ks->pflags = 0;
	init_completion(&ks->poll_req.done);
	down_read(&kbp_so_rwsem);
	if (!kbp_so_cur) {
		err = -ENETDOWN;	/* no daemon: the policy's "error" fallback */
	} else {
		ks->attach_id = kbp_so_cur->attach_id;
		err = kbp_so_call(kbp_so_cur, &sqe, &cqe);
	}
	up_read(&kbp_so_rwsem);
	if (!err && cqe.res < 0)
		err = cqe.res;
	if (err)
		return err;
	ks->handle = cqe.sock;
	/* SO_PROTOCOL and security labels see UDP (docs/design.md, 11.1) */
	sk->sk_protocol = IPPROTO_UDP;
	return 0;
}

static void kbp_so_close(struct sock *sk, long timeout)
{
	struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CLOSE };
	struct kbp_so_cqe cqe;

	if (kbp_so_sk(sk)->handle)
		kbp_so_sock_call(sk, &sqe, &cqe);	/* gone either way */
	kbp_so_poll_disarm(kbp_so_sk(sk));
	kbp_so_sk(sk)->handle = 0;
	sk_common_release(sk);
}

static void kbp_so_unhash(struct sock *sk)
{
	/* nothing hashed in this kernel: the host owns the port */
}

static struct proto kbp_so_prot = {
	.name		= "KBP_SO",
	.owner		= THIS_MODULE,
	.obj_size	= sizeof(struct kbp_so_sock),
	.init		= kbp_so_init_sock,
	.close		= kbp_so_close,
	.unhash		= kbp_so_unhash,
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
	.ioctl		= sock_no_ioctl,
	.listen		= sock_no_listen,
	.shutdown	= sock_no_shutdown,
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
 */
static int kbp_so_reset_host(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	u32 gen = READ_ONCE(h->guest_gen) + 1;
	unsigned long end;

	WRITE_ONCE(h->guest_state, KBP_SO_GUEST_RESET);
	smp_wmb();	/* RESET before the generation the host acts on */
	WRITE_ONCE(h->guest_gen, gen);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
	end = jiffies + msecs_to_jiffies(KBP_SO_ATTACH_MS);
	/* acquire: the host's reset of the queues is visible once it acks */
	while (smp_load_acquire(&h->host_ack_gen) != gen) {
		if (time_after(jiffies, end)) {
			pci_err(dev->pdev, "kbp-sod did not answer the reset\n");
			return -ETIMEDOUT;
		}
		usleep_range(1000, 2000);
	}
	return 0;
}

/* The reset handshake, then ATTACHED at this epoch. */
static int kbp_so_attach(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	int err = kbp_so_reset_host(dev);
	u32 i;

	if (err)
		return err;
	for (i = 0; i < dev->nr_queues; i++) {
		dev->q[i].sq_tail = 0;
		dev->q[i].cq_head = 0;
		WRITE_ONCE(dev->q[i].ctl->need_irq, 1);	/* part 1: always */
	}
	dev->epoch = READ_ONCE(h->epoch);
	WRITE_ONCE(h->guest_epoch, dev->epoch);
	WRITE_ONCE(h->guest_features, 0);
	/* release: need_irq and guest_epoch before the host starts serving */
	smp_store_release(&h->guest_state, KBP_SO_GUEST_ATTACHED);
	return 0;
}

static void kbp_so_fail_all(struct kbp_so_dev *dev)
{
	unsigned long flags;
	u32 i, s;

	for (i = 0; i < dev->nr_queues; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		spin_lock_irqsave(&q->lock, flags);
		dev->dead = true;
		for (s = 0; s < dev->entries; s++) {
			if (!q->slots[s])
				continue;
			q->slots[s]->cqe.res = -ENETDOWN;
			kbp_so_finish(q->slots[s]);
			q->slots[s] = NULL;
		}
		spin_unlock_irqrestore(&q->lock, flags);
	}
}

static void kbp_so_free_irqs(struct kbp_so_dev *dev, u32 n)
{
	while (n--)
		free_irq(pci_irq_vector(dev->pdev, n), &dev->q[n]);
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
		err = request_irq(pci_irq_vector(pdev, i), kbp_so_irq, 0, KBUILD_MODNAME,
				  &dev->q[i]);
		if (err) {
			kbp_so_free_irqs(dev, i);
			goto err_clear_master;
		}
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
	err = kbp_so_call(dev, &nop, &cqe);
	up_read(&kbp_so_rwsem);
	if (err || cqe.res) {
		pci_err(pdev, "NOP round trip failed: %d/%d\n", err, err ? 0 : cqe.res);
		err = err ? err : -EIO;
		goto err_unpublish;
	}
	pci_set_drvdata(pdev, dev);
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

static void kbp_so_remove(struct pci_dev *pdev)
{
	struct kbp_so_dev *dev = pci_get_drvdata(pdev);

	/*
	 * The host drops every parked request first (it serves nothing while
	 * we are in RESET), so the pages of the waiters woken below are no
	 * longer written.  A host that does not ack is gone or stuck: said.
	 */
	if (kbp_so_reset_host(dev))
		pci_warn(pdev, "no reset ack: pages of blocked requests are released anyway\n");
	/* every waiter wakes with ENETDOWN, then no caller is left inside */
	kbp_so_fail_all(dev);
	down_write(&kbp_so_rwsem);
	WRITE_ONCE(kbp_so_cur, NULL);
	up_write(&kbp_so_rwsem);
	/* release: no request of ours is left; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
	kbp_so_free_irqs(dev, dev->nr_used);
	pci_clear_master(pdev);
	memunmap(dev->hdr);
	pci_iounmap(pdev, dev->regs);
	pci_release_regions(pdev);
	pci_disable_device(pdev);
}

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
};

static int __init kbp_so_init(void)
{
	int err = proto_register(&kbp_so_prot, 1);

	if (err)
		return err;
	inet_register_protosw(&kbp_so_protosw);
	err = pci_register_driver(&kbp_so_driver);
	if (err)
		goto err_protosw;
	return 0;

err_protosw:
	inet_unregister_protosw(&kbp_so_protosw);
	proto_unregister(&kbp_so_prot);
	return err;
}

static void __exit kbp_so_exit(void)
{
	/* no socket is left: each holds a reference on this module */
	pci_unregister_driver(&kbp_so_driver);
	inet_unregister_protosw(&kbp_so_protosw);
	proto_unregister(&kbp_so_prot);
}

module_init(kbp_so_init);
module_exit(kbp_so_exit);
MODULE_DESCRIPTION("kbp socket outsourcing: guest UDP sockets served by the host");
MODULE_LICENSE("GPL");
