// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so ring transport: requests over the per-vCPU queues of the shared
 * region.  Submission into a slot (fair sharing of the slots, parked
 * requests per user), the doorbell, the completions reaped by the queue's
 * interrupt handler, by the caller polling for its own request (poll_us),
 * by another system call's sweep or by the idle path; need_irq; the calls
 * a socket makes (control requests and the data requests that lend pages,
 * with their CANCEL).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

void kbp_so_count_done(struct kbp_so_sock *ks, const struct kbp_so_req *req)
{
	if (!ks || !req->from_host)
		return;
	atomic64_inc(&ks->st.c[KBP_SO_ST_COMPLETIONS]);
	if (req->cqe.res < 0)
		atomic64_inc(&ks->st.c[KBP_SO_ST_ERRORS]);
}

int kbp_so_fallback(struct kbp_so_sock *ks)
{
	atomic64_inc(&ks->st.c[KBP_SO_ST_FALLBACKS]);
	atomic64_inc(&kbp_so_fallbacks);
	return -EOPNOTSUPP;
}

/* A request's final completion: its callback (which completes it), or its waiter. */
void kbp_so_finish(struct kbp_so_req *req)
{
	if (req->done_fn)
		req->done_fn(req);
	else
		complete(&req->done);
}

/*
 * Arms this CPU's sweep, if it is not queued: soft expiry in one tick,
 * hard expiry one tick later.  While the CPU runs, its tick's interrupt
 * runs every hrtimer past its soft expiry, so the sweep rides the tick
 * and adds no interrupt of its own.  Caller: interrupts off or migration
 * disabled (a queue's lock).
 */
void kbp_so_sweep_arm(void)
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
void kbp_so_unwant_irq(struct kbp_so_dev *dev, struct kbp_so_queue *q,
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

irqreturn_t kbp_so_irq(int irq, void *data)
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

/* Reaps every queue that has new completions. */
void kbp_so_sweep(struct kbp_so_dev *dev, enum kbp_so_found by)
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
int kbp_so_submit(struct kbp_so_dev *dev, struct kbp_so_queue *q,
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
bool kbp_so_forget(struct kbp_so_queue *q, u32 slot, struct kbp_so_req *req)
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

struct kbp_so_queue *kbp_so_this_queue(struct kbp_so_dev *dev)
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
		atomic64_inc(&ks->st.c[KBP_SO_ST_REQUESTS]);
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

int kbp_so_call(struct kbp_so_dev *dev, struct kbp_so_sqe *sqe,
		struct kbp_so_cqe *cqe, struct kbp_so_sock *ks,
		enum kbp_so_slots kind)
{
	return kbp_so_call_on(dev, kbp_so_this_queue(dev), sqe, cqe, ks, kind);
}

/* The device a socket was made on, still attached; kbp_so_rwsem held. */
int kbp_so_sock_check(struct kbp_so_sock *ks)
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
int kbp_so_sock_call_slots(struct sock *sk, struct kbp_so_sqe *sqe,
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

int kbp_so_sock_call(struct sock *sk, struct kbp_so_sqe *sqe,
		     struct kbp_so_cqe *cqe)
{
	return kbp_so_sock_call_slots(sk, sqe, cqe, KBP_SO_SLOTS_SHARED);
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
int kbp_so_data_call(struct sock *sk, struct kbp_so_sqe *sqe,
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
	atomic64_inc(&ks->st.c[KBP_SO_ST_REQUESTS]);
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
