// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: the rings.  Every SQE is copied once out of shared memory and
 * only the copy is checked and used (docs/design.md, 11.5); guest-physical
 * ranges become iovecs into the daemon's mapping of the guest's RAM only
 * after the range check.  Single-threaded: no locks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "sod.h"

static inline __u32 load_acquire(const __u32 *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void store_release(__u32 *p, __u32 v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Counters: only this thread writes them; relaxed is enough. */
static inline void count(__u64 *c, __u64 n)
{
	__atomic_store_n(c, *c + n, __ATOMIC_RELAXED);
}

static bool is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		if (*b++)
			return false;
	return true;
}

/*
 * [gpa, gpa + len) inside one range of the RAM map, overflow-safe: no sum
 * of guest values is ever formed.
 */
static uint8_t *ram_ptr(const struct sod_vm *vm, uint64_t gpa, uint64_t len)
{
	uint32_t i;

	for (i = 0; i < vm->nr_ranges; i++) {
		const struct sod_ram_range *r = &vm->ranges[i];

		if (gpa >= r->gpa && len <= r->len && gpa - r->gpa <= r->len - len)
			return vm->ram + r->off + (gpa - r->gpa);
	}
	return NULL;
}

int sod_ram_iov(const struct sod_vm *vm, const struct kbp_so_sqe *sqe,
		struct iovec *iov, size_t *total)
{
	uint32_t i;
	size_t sum = 0;

	if (sqe->nr_segs > KBP_SO_MAX_SEGS)
		return -EINVAL;
	for (i = 0; i < sqe->nr_segs; i++) {
		const struct kbp_so_seg *s = &sqe->seg[i];
		uint8_t *p;

		if (s->pad || !s->len || s->len > KBP_SO_MAX_IO)
			return -EINVAL;
		sum += s->len;
		if (sum > KBP_SO_MAX_IO)
			return -EMSGSIZE;
		p = ram_ptr(vm, s->gpa, s->len);
		if (!p)
			return -EFAULT;
		iov[i].iov_base = p;
		iov[i].iov_len = s->len;
	}
	*total = sum;
	return 0;
}

static struct sod_sock *sock_lookup(struct sod_vm *vm, uint32_t handle)
{
	uint32_t idx = handle & 0xffff;
	struct sod_sock *s;

	if (idx >= vm->max_sockets)
		return NULL;
	s = &vm->socks[idx];
	if (s->fd < 0 || s->gen != handle >> 16)
		return NULL;
	return s;
}

static uint32_t sock_handle(const struct sod_vm *vm, const struct sod_sock *s)
{
	return (uint32_t)s->gen << 16 | (uint32_t)(s - vm->socks);
}

/* ABI address -> sockaddr, for a socket of @family */
static int addr_in(const struct kbp_so_addr *a, uint16_t family,
		   struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (a->pad)
		return -EINVAL;
	if (a->family == KBP_SO_AF_INET && family == KBP_SO_AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;

		if (a->flowinfo || a->scope_id || !is_zero(a->addr + 4, 12))
			return -EINVAL;
		sin->sin_family = AF_INET;
		sin->sin_port = a->port;
		memcpy(&sin->sin_addr, a->addr, 4);
		*len = sizeof(*sin);
		return 0;
	}
	if (a->family == KBP_SO_AF_INET6 && family == KBP_SO_AF_INET6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;

		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = a->port;
		sin6->sin6_flowinfo = a->flowinfo;
		memcpy(&sin6->sin6_addr, a->addr, 16);
		sin6->sin6_scope_id = a->scope_id;
		*len = sizeof(*sin6);
		return 0;
	}
	return a->family == KBP_SO_AF_INET || a->family == KBP_SO_AF_INET6 ?
	       -EAFNOSUPPORT : -EINVAL;
}

static void addr_out(const struct sockaddr_storage *ss, struct kbp_so_addr *a)
{
	memset(a, 0, sizeof(*a));
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;

		a->family = KBP_SO_AF_INET;
		a->port = sin->sin_port;
		memcpy(a->addr, &sin->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;

		a->family = KBP_SO_AF_INET6;
		a->port = sin6->sin6_port;
		a->flowinfo = sin6->sin6_flowinfo;
		memcpy(a->addr, &sin6->sin6_addr, 16);
		a->scope_id = sin6->sin6_scope_id;
	}
}

/* Posts the final CQE of a consumed SQE; a slot was reserved at consume. */
static void post(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe,
		 struct kbp_so_cqe *cqe)
{
	struct sod_queue *q = &vm->q[qi];

	cqe->tag = sqe->tag;
	cqe->op = sqe->op;
	if (!cqe->sock)
		cqe->sock = sqe->sock;
	cqe->epoch = vm->epoch;
	memcpy(&q->cq[q->cq_tail & (vm->entries - 1)], cqe, sizeof(*cqe));
	store_release(&q->ctl->cq_tail, ++q->cq_tail);
	q->inflight--;
	__atomic_store_n(&q->ctl->inflight, q->inflight, __ATOMIC_RELAXED);
	count(&q->ctl->completions, 1);
	q->kick = true;
}

static void post_res(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe, int res)
{
	struct kbp_so_cqe cqe = { .res = res };

	post(vm, qi, sqe, &cqe);
}

/* Raises the interrupt of every queue with new CQEs whose guest wants one. */
void sod_kick(struct sod_vm *vm)
{
	uint32_t qi;

	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];
		uint64_t one = 1;

		if (!q->kick)
			continue;
		q->kick = false;
		/* cq_tail is published; pairs with the guest's set-then-recheck */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (!__atomic_load_n(&q->ctl->need_irq, __ATOMIC_RELAXED) || q->irq_fd < 0)
			continue;
		if (write(q->irq_fd, &one, sizeof(one)) == sizeof(one))
			count(&q->ctl->irqs, 1);
	}
}

static int sock_socket(struct sod_vm *vm, int domain)
{
	int fd, err;

	if (vm->netns_fd >= 0 && setns(vm->netns_fd, CLONE_NEWNET))
		return -errno;
	fd = socket(domain, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);
	err = errno;
	if (vm->netns_fd >= 0 && setns(sod.self_netns_fd, CLONE_NEWNET)) {
		/* cannot happen with a valid fd; never make sockets in the wrong netns */
		SOD_LOG("setns back failed: %s", strerror(errno));
		abort();
	}
	return fd < 0 ? -err : fd;
}

/* Keeps the socket's epoll interest equal to what its parked requests wait for. */
static void sock_rearm(struct sod_sock *s)
{
	uint32_t want = 0;
	struct sod_req *r;

	for (r = s->parked; r; r = r->next) {
		if (r->sqe.op == KBP_SO_OP_RECVMSG)
			want |= EPOLLIN;
		else if (r->sqe.op == KBP_SO_OP_SENDMSG)
			want |= EPOLLOUT;
		else if (r->sqe.op == KBP_SO_OP_POLL)
			want |= (r->sqe.arg1 & KBP_SO_POLL_IN ? EPOLLIN : 0) |
				(r->sqe.arg1 & KBP_SO_POLL_OUT ? EPOLLOUT : 0);
	}
	if (want == s->ev_mask)
		return;
	if (!want) {
		epoll_ctl(sod.epfd, EPOLL_CTL_DEL, s->fd, NULL);
	} else if (sod_epoll_set(s->fd, want, &s->ev, !s->ev_mask)) {
		/* no wakeup for now: the requests stay parked, sod_vm_retry_parked retries */
		SOD_LOG("epoll on a host socket: %s", strerror(errno));
		return;
	}
	s->ev_mask = want;
}

static int park(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe,
		struct sod_sock *s)
{
	struct sod_req *r = malloc(sizeof(*r)), **tail;

	(void)vm;
	if (!r)
		return -ENOMEM;
	memcpy(&r->sqe, sqe, sizeof(*sqe));
	r->q = qi;
	r->next = NULL;
	for (tail = &s->parked; *tail; tail = &(*tail)->next)
		;
	*tail = r;
	sock_rearm(s);
	return 0;
}

static uint32_t revents_of(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLOUT };
	uint32_t r = 0;

	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & POLLIN)
		r |= KBP_SO_POLL_IN;
	if (p.revents & POLLOUT)
		r |= KBP_SO_POLL_OUT;
	if (p.revents & POLLERR)
		r |= KBP_SO_POLL_ERR;
	if (p.revents & POLLHUP)
		r |= KBP_SO_POLL_HUP;
	return r;
}

/*
 * Tries a data or poll request once, without blocking.  Returns true when
 * it completed (CQE posted), false when it would block.
 */
static bool try_io(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe,
		   struct sod_sock *s)
{
	struct kbp_so_queue_ctl *ctl = vm->q[qi].ctl;
	struct kbp_so_cqe cqe = { 0 };
	struct iovec iov[KBP_SO_MAX_SEGS];
	struct sockaddr_storage ss;
	struct msghdr msg = { 0 };
	size_t total = 0;
	ssize_t n;
	int err;

	if (sqe->op == KBP_SO_OP_POLL) {
		uint32_t rev = revents_of(s->fd);
		uint32_t hit = rev & ((uint32_t)sqe->arg1 | KBP_SO_POLL_ERR | KBP_SO_POLL_HUP);

		if (!hit && (sqe->flags & KBP_SO_F_ARM))
			return false;
		cqe.out_flags = rev;
		post(vm, qi, sqe, &cqe);
		return true;
	}

	/* checked at submission; the RAM map does not change */
	err = sod_ram_iov(vm, sqe, iov, &total);
	if (err) {
		post_res(vm, qi, sqe, err);
		return true;
	}
	msg.msg_iov = iov;
	msg.msg_iovlen = sqe->nr_segs;
	if (sqe->op == KBP_SO_OP_SENDMSG) {
		socklen_t alen;

		if (sqe->addr.family) {
			err = addr_in(&sqe->addr, s->family, &ss, &alen);
			if (err) {
				post_res(vm, qi, sqe, err);
				return true;
			}
			msg.msg_name = &ss;
			msg.msg_namelen = alen;
		}
		n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
		    (sqe->flags & KBP_SO_F_WAIT) && !(sqe->msg_flags & KBP_SO_MSG_DONTWAIT))
			return false;
		if (n >= 0) {
			count(&ctl->bytes_out, (uint64_t)n);
			count(&ctl->copies, 1);
		}
		post_res(vm, qi, sqe, n < 0 ? -errno : (int)n);
		return true;
	}

	/* RECVMSG: always ask for the full length, report it in msg_len */
	msg.msg_name = &ss;
	msg.msg_namelen = sizeof(ss);
	memset(&ss, 0, sizeof(ss));
	n = recvmsg(s->fd, &msg, MSG_DONTWAIT | MSG_TRUNC |
		    (sqe->msg_flags & KBP_SO_MSG_PEEK ? MSG_PEEK : 0));
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
	    (sqe->flags & KBP_SO_F_WAIT) && !(sqe->msg_flags & KBP_SO_MSG_DONTWAIT)) {
		/* after shutdown(SHUT_RD) a blocking local receive returns 0 */
		if (!s->rd_shut)
			return false;
		n = 0;
	}
	if (n < 0) {
		post_res(vm, qi, sqe, -errno);
		return true;
	}
	{
		size_t copied = (size_t)n < total ? (size_t)n : total;

		cqe.msg_len = (uint32_t)n;
		cqe.res = (int)(sqe->msg_flags & KBP_SO_MSG_TRUNC ? (size_t)n : copied);
		if (msg.msg_flags & MSG_TRUNC)
			cqe.out_flags |= KBP_SO_OUT_TRUNC;
		if (msg.msg_namelen)
			addr_out(&ss, &cqe.addr);
		count(&ctl->bytes_in, copied);
		if (!s->rd_shut || n > 0)	/* an end of data is no message */
			count(&ctl->copies, 1);
	}
	post(vm, qi, sqe, &cqe);
	return true;
}

static void complete_parked(struct sod_vm *vm, struct sod_sock *s, int res)
{
	struct sod_req *r = s->parked, *next;

	s->parked = NULL;
	for (; r; r = next) {
		next = r->next;
		if (res)
			post_res(vm, r->q, &r->sqe, res);
		else
			vm->q[r->q].inflight--;	/* dropped with the guest */
		free(r);
	}
	sock_rearm(s);
}

static void sock_close(struct sod_vm *vm, struct sod_sock *s, int res)
{
	complete_parked(vm, s, res);
	close(s->fd);
	s->fd = -1;
	s->gen = s->gen == 0xffff ? 1 : s->gen + 1;
}

/*
 * res < 0: every parked request completes with res (daemon stopping);
 * res == 0: the guest is gone or reset, nothing is written to its RAM.
 */
void sod_vm_drop_sockets(struct sod_vm *vm, int complete_res)
{
	uint32_t i;

	for (i = 0; i < vm->max_sockets; i++)
		if (vm->socks[i].fd >= 0)
			sock_close(vm, &vm->socks[i], complete_res);
}

void sod_sock_event(struct sod_vm *vm, uint32_t idx)
{
	struct sod_sock *s = &vm->socks[idx];
	struct sod_req **pp = &s->parked;
	bool recv_blocked = false, send_blocked = false;

	if (s->fd < 0)
		return;
	/* FIFO per direction: once one receive would block, so would the rest */
	while (*pp) {
		struct sod_req *r = *pp;
		bool blocked_dir = (r->sqe.op == KBP_SO_OP_RECVMSG && recv_blocked) ||
				   (r->sqe.op == KBP_SO_OP_SENDMSG && send_blocked);

		if (!blocked_dir && try_io(vm, r->q, &r->sqe, s)) {
			*pp = r->next;
			free(r);
			continue;
		}
		if (r->sqe.op == KBP_SO_OP_RECVMSG)
			recv_blocked = true;
		else if (r->sqe.op == KBP_SO_OP_SENDMSG)
			send_blocked = true;
		pp = &r->next;
	}
	sock_rearm(s);
}

static int opt_map(uint32_t opt, int *level, int *name)
{
	static const int map[][2] = {
		[KBP_SO_OPT_RCVBUF] = { SOL_SOCKET, SO_RCVBUF },
		[KBP_SO_OPT_SNDBUF] = { SOL_SOCKET, SO_SNDBUF },
		[KBP_SO_OPT_REUSEADDR] = { SOL_SOCKET, SO_REUSEADDR },
		[KBP_SO_OPT_REUSEPORT] = { SOL_SOCKET, SO_REUSEPORT },
		[KBP_SO_OPT_PRIORITY] = { SOL_SOCKET, SO_PRIORITY },
		[KBP_SO_OPT_IP_TOS] = { IPPROTO_IP, IP_TOS },
		[KBP_SO_OPT_IP_TTL] = { IPPROTO_IP, IP_TTL },
		[KBP_SO_OPT_V6ONLY] = { IPPROTO_IPV6, IPV6_V6ONLY },
		[KBP_SO_OPT_TCLASS] = { IPPROTO_IPV6, IPV6_TCLASS },
		[KBP_SO_OPT_HOPS] = { IPPROTO_IPV6, IPV6_UNICAST_HOPS },
		[KBP_SO_OPT_ERROR] = { SOL_SOCKET, SO_ERROR },
	};

	if (!opt || opt > KBP_SO_OPT_MAX)
		return -ENOPROTOOPT;
	*level = map[opt][0];
	*name = map[opt][1];
	return 0;
}

static int do_sockopt(struct sod_sock *s, const struct kbp_so_sqe *sqe)
{
	int level, name, val, err = opt_map(sqe->arg0, &level, &name);
	socklen_t len = sizeof(val);

	if (err)
		return err;
	if (sqe->op == KBP_SO_OP_GETSOCKOPT) {
		if (getsockopt(s->fd, level, name, &val, &len))
			return -errno;
		return val < 0 ? -ERANGE : val;
	}
	if (sqe->arg0 == KBP_SO_OPT_ERROR || !is_zero(sqe->opt + 4, KBP_SO_OPT_INLINE - 4))
		return -EINVAL;
	memcpy(&val, sqe->opt, sizeof(val));
	/* above 6 needs CAP_NET_ADMIN, which the daemon must not lend */
	if (sqe->arg0 == KBP_SO_OPT_PRIORITY && (val < 0 || val > 6))
		return -EPERM;
	return setsockopt(s->fd, level, name, &val, sizeof(val)) ? -errno : 0;
}

static int do_name(struct sod_sock *s, bool peer, struct kbp_so_cqe *cqe)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	memset(&ss, 0, sizeof(ss));
	if ((peer ? getpeername : getsockname)(s->fd, (struct sockaddr *)&ss, &len))
		return -errno;
	addr_out(&ss, &cqe->addr);
	return 0;
}

/* Checks common to every op, on the private copy. */
static int sqe_check(const struct kbp_so_sqe *sqe)
{
	bool data = sqe->op == KBP_SO_OP_SENDMSG || sqe->op == KBP_SO_OP_RECVMSG;

	if (sqe->op > KBP_SO_OP_MAX || (sqe->flags & ~KBP_SO_F_ALL) ||
	    (sqe->msg_flags & ~KBP_SO_MSG_ALL) || sqe->reserved[0] || sqe->reserved[1] ||
	    sqe->addr.pad)
		return -EINVAL;
	if (!data && (sqe->nr_segs || sqe->msg_flags))
		return -EINVAL;
	if (sqe->op != KBP_SO_OP_SETSOCKOPT && !is_zero(sqe->opt, sizeof(sqe->opt)))
		return -EINVAL;
	if ((sqe->flags & KBP_SO_F_ARM) && sqe->op != KBP_SO_OP_POLL)
		return -EINVAL;
	if ((sqe->flags & KBP_SO_F_WAIT) && !data)
		return -EINVAL;
	return 0;
}

/* Performs one checked request, or parks it.  Exactly one CQE, now or later. */
static void handle(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe)
{
	struct kbp_so_cqe cqe = { 0 };
	struct sod_sock *s = NULL;
	struct iovec iov[KBP_SO_MAX_SEGS];
	struct sockaddr_storage ss;
	socklen_t alen;
	size_t total;
	int res = sqe_check(sqe);

	if (res)
		goto reject;
	if (sqe->op != KBP_SO_OP_NOP && sqe->op != KBP_SO_OP_SOCKET) {
		s = sock_lookup(vm, sqe->sock);
		if (!s) {
			res = -EBADF;
			goto reject;
		}
	}

	switch (sqe->op) {
	case KBP_SO_OP_NOP:
		break;
	case KBP_SO_OP_SOCKET: {
		uint32_t i;
		int fd;

		if (sqe->sock || sqe->arg1 || sqe->addr.family ||
		    (sqe->arg0 != KBP_SO_AF_INET && sqe->arg0 != KBP_SO_AF_INET6)) {
			res = -EINVAL;
			goto reject;
		}
		for (i = 0; i < vm->max_sockets && vm->socks[i].fd >= 0; i++)
			;
		if (i == vm->max_sockets) {
			res = -EMFILE;
			break;
		}
		fd = sock_socket(vm, sqe->arg0 == KBP_SO_AF_INET ? AF_INET : AF_INET6);
		if (fd < 0) {
			res = fd;
			break;
		}
		s = &vm->socks[i];
		s->fd = fd;
		s->family = (uint16_t)sqe->arg0;
		s->ev_mask = 0;
		s->rd_shut = false;
		s->parked = NULL;
		cqe.sock = sock_handle(vm, s);
		break;
	}
	case KBP_SO_OP_BIND:
		res = addr_in(&sqe->addr, s->family, &ss, &alen);
		if (res)
			goto reject;
		if (bind(s->fd, (struct sockaddr *)&ss, alen))
			res = -errno;
		else
			res = do_name(s, false, &cqe);
		break;
	case KBP_SO_OP_CONNECT:
		if (sqe->addr.family == KBP_SO_AF_UNSPEC) {
			if (!is_zero(&sqe->addr, sizeof(sqe->addr))) {
				res = -EINVAL;
				goto reject;
			}
			memset(&ss, 0, sizeof(ss));
			ss.ss_family = AF_UNSPEC;
			alen = sizeof(ss.ss_family);
		} else {
			res = addr_in(&sqe->addr, s->family, &ss, &alen);
			if (res)
				goto reject;
		}
		res = connect(s->fd, (struct sockaddr *)&ss, alen) ? -errno : 0;
		break;
	case KBP_SO_OP_SENDMSG:
	case KBP_SO_OP_RECVMSG:
		if (sqe->arg0 || sqe->arg1 ||
		    (sqe->op == KBP_SO_OP_RECVMSG && sqe->addr.family)) {
			res = -EINVAL;
			goto reject;
		}
		/* every segment checked now, before any I/O */
		res = sod_ram_iov(vm, sqe, iov, &total);
		if (res)
			goto reject;
		if (try_io(vm, qi, sqe, s))
			return;
		res = park(vm, qi, sqe, s);
		if (!res)
			return;
		break;
	case KBP_SO_OP_POLL:
		if (sqe->arg0 || !sqe->arg1 || (sqe->arg1 & ~(uint64_t)KBP_SO_POLL_ALL)) {
			res = -EINVAL;
			goto reject;
		}
		if (try_io(vm, qi, sqe, s))
			return;
		res = park(vm, qi, sqe, s);
		if (!res)
			return;
		break;
	case KBP_SO_OP_SETSOCKOPT:
	case KBP_SO_OP_GETSOCKOPT:
		if (sqe->arg1) {
			res = -EINVAL;
			goto reject;
		}
		res = do_sockopt(s, sqe);
		break;
	case KBP_SO_OP_SHUTDOWN:
		if (sqe->arg0 > 2 || sqe->arg1) {
			res = -EINVAL;
			goto reject;
		}
		res = shutdown(s->fd, (int)sqe->arg0) ? -errno : 0;
		/* Linux marks the socket even when it says ENOTCONN (unconnected UDP) */
		if (sqe->arg0 != SHUT_WR && (!res || res == -ENOTCONN))
			s->rd_shut = true;
		/* a parked receive sees the shutdown as an end of data */
		sod_sock_event(vm, (uint32_t)(s - vm->socks));
		break;
	case KBP_SO_OP_CLOSE:
		sock_close(vm, s, -ECANCELED);
		break;
	case KBP_SO_OP_CANCEL: {
		struct sod_req **pp;

		res = -ENOENT;
		for (pp = &s->parked; *pp; pp = &(*pp)->next) {
			struct sod_req *r = *pp;

			if (r->sqe.tag != sqe->arg1)
				continue;
			*pp = r->next;
			post_res(vm, r->q, &r->sqe, -ECANCELED);
			free(r);
			sock_rearm(s);
			res = 0;
			break;
		}
		break;
	}
	case KBP_SO_OP_GETNAME:
		if (sqe->arg0 > 1 || sqe->arg1) {
			res = -EINVAL;
			goto reject;
		}
		res = do_name(s, sqe->arg0 == 1, &cqe);
		break;
	}
	cqe.res = res;
	post(vm, qi, sqe, &cqe);
	return;

reject:
	count(&vm->q[qi].ctl->rejects, 1);
	post_res(vm, qi, sqe, res);
}

static void queue_fail(struct sod_vm *vm, uint32_t qi, uint32_t why)
{
	struct sod_queue *q = &vm->q[qi];

	if (q->error)
		return;
	q->error = why;
	__atomic_store_n(&q->ctl->host_error, why, __ATOMIC_RELEASE);
	SOD_LOG("%s: queue %u stopped: %s", vm->name, qi,
		why == KBP_SO_QERR_SQ_INDEX ? "bad sq_tail" : "bad cq_head");
}

void sod_queue_run(struct sod_vm *vm, uint32_t qi)
{
	struct sod_queue *q = &vm->q[qi];
	uint32_t tail, budget = vm->entries;

	if (q->error)
		return;
	tail = load_acquire(&q->ctl->sq_tail);
	if (tail - q->sq_head > vm->entries) {
		queue_fail(vm, qi, KBP_SO_QERR_SQ_INDEX);
		return;
	}
	while (q->sq_head != tail && budget--) {
		uint32_t cq_head = load_acquire(&q->ctl->cq_head);
		struct kbp_so_sqe sqe;

		if (q->cq_tail - cq_head > vm->entries) {
			queue_fail(vm, qi, KBP_SO_QERR_CQ_INDEX);
			return;
		}
		/* a CQE slot for this SQE whenever it completes */
		if (q->inflight + (q->cq_tail - cq_head) >= vm->entries)
			break;
		memcpy(&sqe, &q->sq[q->sq_head & (vm->entries - 1)], sizeof(sqe));
		/*
		 * A compiler barrier: every later read of the request is of the
		 * local copy, never a second read of the shared slot.
		 */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		store_release(&q->ctl->sq_head, ++q->sq_head);
		q->inflight++;
		count(&q->ctl->requests, 1);
		handle(vm, qi, &sqe);
	}
	__atomic_store_n(&q->ctl->inflight, q->inflight, __ATOMIC_RELAXED);
}

/* Zeroes every queue: the guest asked for it and is not writing meanwhile. */
void sod_vm_reset_queues(struct sod_vm *vm)
{
	uint64_t req = 0, cpl = 0, copies = 0, in = 0, out = 0, rej = 0;
	uint32_t qi;

	sod_vm_drop_sockets(vm, 0);
	/* the counters are zeroed below: the log keeps them (tests read it) */
	for (qi = 0; qi < vm->nr_queues; qi++) {
		const struct kbp_so_queue_ctl *c = vm->q[qi].ctl;

		req += c->requests;
		cpl += c->completions;
		copies += c->copies;
		in += c->bytes_in;
		out += c->bytes_out;
		rej += c->rejects;
	}
	SOD_LOG("%s: reset: counters requests=%llu completions=%llu copies=%llu bytes_in=%llu bytes_out=%llu rejects=%llu",
		vm->name, (unsigned long long)req, (unsigned long long)cpl,
		(unsigned long long)copies, (unsigned long long)in,
		(unsigned long long)out, (unsigned long long)rej);
	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];

		memset(q->ctl, 0, sizeof(*q->ctl));
		q->sq_head = 0;
		q->cq_tail = 0;
		q->inflight = 0;
		q->error = 0;
		q->kick = false;
		__atomic_store_n(&q->ctl->host_polling, sod.poll_mode, __ATOMIC_RELAXED);
	}
}

/* Handles a reset request, then serves the queues if the guest is attached. */
void sod_vm_service(struct sod_vm *vm)
{
	struct kbp_so_header *h = vm->hdr;
	uint32_t state = __atomic_load_n(&h->guest_state, __ATOMIC_ACQUIRE);
	uint32_t qi;

	if (state == KBP_SO_GUEST_RESET) {
		uint32_t gen = __atomic_load_n(&h->guest_gen, __ATOMIC_ACQUIRE);

		if (gen != vm->ack_gen) {
			sod_vm_reset_queues(vm);
			vm->ack_gen = gen;
			store_release(&h->host_ack_gen, gen);
		}
		return;
	}
	if (state != KBP_SO_GUEST_ATTACHED ||
	    __atomic_load_n(&h->guest_epoch, __ATOMIC_ACQUIRE) != vm->epoch)
		return;
	for (qi = 0; qi < vm->nr_queues; qi++)
		sod_queue_run(vm, qi);
	sod_kick(vm);
}

/* Every heartbeat: retry what is parked (a wakeup lost to an epoll error). */
void sod_vm_retry_parked(struct sod_vm *vm)
{
	uint32_t i;

	for (i = 0; i < vm->max_sockets; i++)
		if (vm->socks[i].fd >= 0 && vm->socks[i].parked)
			sod_sock_event(vm, i);
	sod_kick(vm);
}
