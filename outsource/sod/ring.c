// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: the rings.  Every SQE is copied once out of shared memory and
 * only the copy is checked and used (docs/design.md, 11.5); guest-physical
 * ranges become iovecs into the daemon's mapping of the guest's RAM only
 * after the range check.  Single-threaded: no locks.
 *
 * Nothing is written into guest RAM, and no parked request is served, for a
 * guest that is not ATTACHED at this daemon's epoch: every path that serves
 * (the doorbell's, a host socket's event, the timer's retry) checks first and
 * drops that guest's sockets and parked requests without a completion
 * (issue 37 item 4: a guest rebooted, kexec'd or panicked says ABSENT or
 * RESET; its pages belong to the next kernel).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
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

/*
 * Counters: the daemon's own copy is counted, the shared word only stored
 * (the guest may write it: it is never read back).  Relaxed is enough.
 */
#define COUNT(q, field, n) do { \
		(q)->cnt.field += (n); \
		__atomic_store_n(&(q)->ctl->field, (q)->cnt.field, __ATOMIC_RELAXED); \
	} while (0)

uint64_t sod_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/*
 * The heartbeat: +1 every KBP_SO_HEARTBEAT_MS.  Checked between every
 * queue's budget and after every socket event as well as on the timer, so
 * no batch of request work delays it by more than one budget (design.md
 * 11.6): the guest's watchdog sees a live daemon as live.
 */
void sod_heartbeat(struct sod_vm *vm, bool force)
{
	uint64_t now = sod_now_ns();

	if (!force && now < vm->next_beat_ns)
		return;
	vm->next_beat_ns = now + KBP_SO_HEARTBEAT_MS * 1000000ULL;
	__atomic_store_n(&vm->hdr->heartbeat, ++vm->heartbeat, __ATOMIC_RELEASE);
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
	COUNT(q, completions, 1);
	vm->total_completions++;
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
			COUNT(q, irqs, 1);
	}
}

/*
 * What a RECVMSG with KBP_SO_F_META reports is asked for once, at SOCKET:
 * the kernel records it per datagram as it queues it, so asking later would
 * miss what is queued already.  Failures leave a field invalid, no more.
 */
static void sock_meta_opts(int fd, int domain)
{
	static const int v4[][2] = {
		{ IPPROTO_IP, IP_PKTINFO }, { IPPROTO_IP, IP_RECVTOS }, { IPPROTO_IP, IP_RECVTTL },
	};
	/*
	 * An IPv6 socket's IPv4 datagrams (v4-mapped) report TOS and TTL by the
	 * IPv4 options, their destination (mapped) by IPV6_PKTINFO (udpv6_recvmsg)
	 */
	static const int v6[][2] = {
		{ IPPROTO_IPV6, IPV6_RECVPKTINFO }, { IPPROTO_IPV6, IPV6_RECVTCLASS },
		{ IPPROTO_IPV6, IPV6_RECVHOPLIMIT }, { IPPROTO_IP, IP_RECVTOS },
		{ IPPROTO_IP, IP_RECVTTL },
	};
	static const int both[][2] = {
		{ SOL_SOCKET, SO_TIMESTAMPNS }, { SOL_SOCKET, SO_RXQ_OVFL },
	};
	const int (*fam)[2] = domain == AF_INET ? v4 : v6;
	int one = 1, i, n = domain == AF_INET ? 3 : 5;

	for (i = 0; i < n; i++)
		setsockopt(fd, fam[i][0], fam[i][1], &one, sizeof(one));
	for (i = 0; i < 2; i++)
		setsockopt(fd, both[i][0], both[i][1], &one, sizeof(one));
}

/* The worker lives in the VM's netns (sandbox.c): no setns() here. */
static int sock_socket(int domain)
{
	int fd = socket(domain, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);

	if (fd < 0)
		return -errno;
	sock_meta_opts(fd, domain);
	return fd;
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

/* A cmsg's payload, when it is at least @n bytes. */
static bool cmsg_get(const struct cmsghdr *c, void *out, size_t n)
{
	if (c->cmsg_len < CMSG_LEN(n))
		return false;
	memcpy(out, CMSG_DATA(c), n);
	return true;
}

/* The datagram's metadata from recvmsg()'s control messages. */
static void meta_parse(struct msghdr *msg, struct kbp_so_rxmeta *m)
{
	struct cmsghdr *c;

	memset(m, 0, sizeof(*m));
	for (c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		int v;

		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
			struct timespec ts;

			if (cmsg_get(c, &ts, sizeof(ts)) && ts.tv_sec >= 0) {
				m->tstamp_ns = (uint64_t)ts.tv_sec * 1000000000ULL +
					       (uint64_t)ts.tv_nsec;
				m->valid |= KBP_SO_META_TSTAMP;
			}
		} else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
			uint32_t d;

			if (cmsg_get(c, &d, sizeof(d))) {
				m->drops = d;
				m->valid |= KBP_SO_META_DROPS;
			}
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;

			if (cmsg_get(c, &pi, sizeof(pi))) {
				m->dst.family = KBP_SO_AF_INET;
				memcpy(m->dst.addr, &pi.ipi_addr, 4);
				m->valid |= KBP_SO_META_DST;
			}
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
			uint8_t tos;

			if (cmsg_get(c, &tos, sizeof(tos))) {
				m->tos = tos;
				m->valid |= KBP_SO_META_TOS;
			}
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
			if (cmsg_get(c, &v, sizeof(v)) && v >= 0 && v <= 255) {
				m->ttl = (uint8_t)v;
				m->valid |= KBP_SO_META_TTL;
			}
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo pi;

			if (cmsg_get(c, &pi, sizeof(pi))) {
				m->dst.family = KBP_SO_AF_INET6;
				memcpy(m->dst.addr, &pi.ipi6_addr, 16);
				m->valid |= KBP_SO_META_DST;
			}
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
			if (cmsg_get(c, &v, sizeof(v)) && v >= 0 && v <= 255) {
				m->tos = (uint8_t)v;
				m->valid |= KBP_SO_META_TOS;
			}
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
			if (cmsg_get(c, &v, sizeof(v)) && v >= 0 && v <= 255) {
				m->ttl = (uint8_t)v;
				m->valid |= KBP_SO_META_TTL;
			}
		}
	}
}

/* room for every control message sock_meta_opts() asks for, with margin */
union sod_cbuf {
	char buf[512];
	struct cmsghdr align;
};

/* SENDMSG's KBP_SO_MSG_SRC and KBP_SO_MSG_TOS as control messages */
static void send_cmsgs(const struct kbp_so_sqe *sqe, const struct sod_sock *s,
		       struct msghdr *msg, union sod_cbuf *cb)
{
	struct cmsghdr *c;
	size_t len = 0;

	if (!(sqe->msg_flags & (KBP_SO_MSG_SRC | KBP_SO_MSG_TOS)))
		return;
	memset(cb, 0, sizeof(*cb));
	msg->msg_control = cb->buf;
	msg->msg_controllen = sizeof(cb->buf);
	c = CMSG_FIRSTHDR(msg);
	if (sqe->msg_flags & KBP_SO_MSG_SRC) {
		if (s->family == KBP_SO_AF_INET) {
			struct in_pktinfo pi = { .ipi_ifindex = 0 };

			memcpy(&pi.ipi_spec_dst, sqe->opt, 4);
			c->cmsg_level = IPPROTO_IP;
			c->cmsg_type = IP_PKTINFO;
			c->cmsg_len = CMSG_LEN(sizeof(pi));
			memcpy(CMSG_DATA(c), &pi, sizeof(pi));
			len += CMSG_SPACE(sizeof(pi));
		} else {
			struct in6_pktinfo pi = { .ipi6_ifindex = 0 };

			memcpy(&pi.ipi6_addr, sqe->opt, 16);
			c->cmsg_level = IPPROTO_IPV6;
			c->cmsg_type = IPV6_PKTINFO;
			c->cmsg_len = CMSG_LEN(sizeof(pi));
			memcpy(CMSG_DATA(c), &pi, sizeof(pi));
			len += CMSG_SPACE(sizeof(pi));
		}
		c = CMSG_NXTHDR(msg, c);
	}
	if (sqe->msg_flags & KBP_SO_MSG_TOS) {
		int v = (int)sqe->arg0;

		/* as Linux: an IPv6 socket's TCLASS, IPv4's TOS */
		c->cmsg_level = s->family == KBP_SO_AF_INET ? IPPROTO_IP : IPPROTO_IPV6;
		c->cmsg_type = s->family == KBP_SO_AF_INET ? IP_TOS : IPV6_TCLASS;
		c->cmsg_len = CMSG_LEN(sizeof(v));
		memcpy(CMSG_DATA(c), &v, sizeof(v));
		len += CMSG_SPACE(sizeof(v));
	}
	msg->msg_controllen = len;
}

/*
 * Tries a data or poll request once, without blocking.  Returns true when
 * it completed (CQE posted), false when it would block.  The caller has
 * checked that the guest is attached.
 */
static bool try_io(struct sod_vm *vm, uint32_t qi, const struct kbp_so_sqe *sqe,
		   struct sod_sock *s)
{
	struct sod_queue *q = &vm->q[qi];
	struct kbp_so_cqe cqe = { 0 };
	struct iovec iov[KBP_SO_MAX_SEGS];
	struct sockaddr_storage ss;
	struct msghdr msg = { 0 };
	union sod_cbuf cb;
	size_t total = 0;
	bool meta = false;
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
		send_cmsgs(sqe, s, &msg, &cb);
		n = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
		    (sqe->flags & KBP_SO_F_WAIT) && !(sqe->msg_flags & KBP_SO_MSG_DONTWAIT))
			return false;
		if (n >= 0) {
			COUNT(q, bytes_out, (uint64_t)n);
			COUNT(q, copies, 1);
		}
		post_res(vm, qi, sqe, n < 0 ? -errno : (int)n);
		return true;
	}

	/* RECVMSG: always ask for the full length, report it in msg_len */
	msg.msg_name = &ss;
	msg.msg_namelen = sizeof(ss);
	memset(&ss, 0, sizeof(ss));
	if (sqe->flags & KBP_SO_F_META) {
		msg.msg_control = cb.buf;
		msg.msg_controllen = sizeof(cb.buf);
	}
	n = recvmsg(s->fd, &msg, MSG_DONTWAIT | MSG_TRUNC |
		    (sqe->msg_flags & KBP_SO_MSG_PEEK ? MSG_PEEK : 0));
	if (n >= 0)
		meta = sqe->flags & KBP_SO_F_META;	/* a datagram was delivered */
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
		COUNT(q, bytes_in, copied);
		if (!s->rd_shut || n > 0)	/* an end of data is no message */
			COUNT(q, copies, 1);
	}
	if (meta) {
		/* checked at submission (one range, 64 bytes, apart from the segments) */
		uint8_t *p = ram_ptr(vm, sqe->arg1, sizeof(struct kbp_so_rxmeta));
		struct kbp_so_rxmeta m;

		meta_parse(&msg, &m);
		if (p)
			memcpy(p, &m, sizeof(m));
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
		if (res) {
			post_res(vm, r->q, &r->sqe, res);
		} else {
			vm->q[r->q].inflight--;	/* dropped with the guest */
			vm->total_drops++;
		}
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
	vm->nr_socks--;
}

/*
 * res < 0: every parked request completes with res (daemon stopping);
 * res == 0: the guest is gone or reset, nothing is written to its RAM.
 */
void sod_vm_drop_sockets(struct sod_vm *vm, int complete_res)
{
	uint32_t i, qi;

	for (i = 0; i < vm->max_sockets; i++)
		if (vm->socks[i].fd >= 0)
			sock_close(vm, &vm->socks[i], complete_res);
	vm->cap_logged = false;
	if (vm->hdr)
		for (qi = 0; qi < vm->nr_queues; qi++)
			__atomic_store_n(&vm->q[qi].ctl->inflight, vm->q[qi].inflight,
					 __ATOMIC_RELAXED);
}

/* Is the guest ATTACHED at this daemon's epoch?  Two shared words, read once each. */
bool sod_guest_live(struct sod_vm *vm)
{
	const struct kbp_so_header *h = vm->hdr;
	uint32_t state, epoch;

	if (!h)
		return false;
	state = __atomic_load_n(&h->guest_state, __ATOMIC_ACQUIRE);
	epoch = __atomic_load_n(&h->guest_epoch, __ATOMIC_ACQUIRE);
	return state == KBP_SO_GUEST_ATTACHED && epoch == vm->epoch;
}

/*
 * The check before anything is served: a guest that is not attached at
 * this epoch loses its sockets and parked requests, without a completion.
 */
static bool guest_gate(struct sod_vm *vm)
{
	if (sod_guest_live(vm)) {
		vm->absent_logged = false;
		return true;
	}
	if (vm->nr_socks) {
		uint64_t before = vm->total_drops;

		sod_vm_drop_sockets(vm, 0);
		if (!vm->absent_logged)
			SOD_LOG("%s: the guest is not attached (state %u): dropped its sockets and "
				"%llu parked request(s), nothing written", vm->name,
				__atomic_load_n(&vm->hdr->guest_state, __ATOMIC_RELAXED),
				(unsigned long long)(vm->total_drops - before));
		vm->absent_logged = true;
	}
	return false;
}

void sod_sock_event(struct sod_vm *vm, uint32_t idx)
{
	struct sod_sock *s = &vm->socks[idx];
	struct sod_req **pp = &s->parked;
	bool recv_blocked = false, send_blocked = false;
	uint32_t done = 0;

	if (s->fd < 0)
		return;
	if (!guest_gate(vm))
		return;
	/* FIFO per direction: once one receive would block, so would the rest */
	while (*pp && done < vm->budget) {
		struct sod_req *r = *pp;
		bool blocked_dir = (r->sqe.op == KBP_SO_OP_RECVMSG && recv_blocked) ||
				   (r->sqe.op == KBP_SO_OP_SENDMSG && send_blocked);

		if (!blocked_dir) {
			/* before every write into guest RAM: the guest may have left meanwhile */
			if (!guest_gate(vm))
				return;		/* s->parked is gone with the sockets */
			if (try_io(vm, r->q, &r->sqe, s)) {
				*pp = r->next;
				free(r);
				done++;
				continue;
			}
		}
		if (r->sqe.op == KBP_SO_OP_RECVMSG)
			recv_blocked = true;
		else if (r->sqe.op == KBP_SO_OP_SENDMSG)
			send_blocked = true;
		pp = &r->next;
	}
	/* what the budget left stays parked: the socket is level-triggered */
	sock_rearm(s);
	sod_heartbeat(vm, false);
}

static int opt_map(uint32_t opt, int *level, int *name)
{
	static const int map[KBP_SO_OPT_MAX + 1][2] = {
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
		/* INQ and OUTQ are ioctls (do_sockopt) */
	};

	if (!opt || opt > KBP_SO_OPT_MAX || !map[opt][1])	/* IPPROTO_IP is 0 */
		return -ENOPROTOOPT;
	*level = map[opt][0];
	*name = map[opt][1];
	return 0;
}

static int do_sockopt(struct sod_sock *s, const struct kbp_so_sqe *sqe)
{
	int level, name, val, err;
	socklen_t len = sizeof(val);

	if (sqe->arg0 == KBP_SO_OPT_INQ || sqe->arg0 == KBP_SO_OPT_OUTQ) {
		/* get only: the next datagram's bytes, the bytes not yet sent */
		if (sqe->op == KBP_SO_OP_SETSOCKOPT)
			return -EINVAL;
		if (ioctl(s->fd, sqe->arg0 == KBP_SO_OPT_INQ ? SIOCINQ : SIOCOUTQ, &val))
			return -errno;
		return val < 0 ? -ERANGE : val;
	}
	err = opt_map(sqe->arg0, &level, &name);
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
	bool src = sqe->op == KBP_SO_OP_SENDMSG && (sqe->msg_flags & KBP_SO_MSG_SRC);

	if (sqe->op > KBP_SO_OP_MAX || (sqe->flags & ~KBP_SO_F_ALL) ||
	    (sqe->msg_flags & ~KBP_SO_MSG_ALL) || sqe->reserved[0] || sqe->reserved[1] ||
	    sqe->addr.pad)
		return -EINVAL;
	if (!data && (sqe->nr_segs || sqe->msg_flags))
		return -EINVAL;
	if (sqe->op != KBP_SO_OP_SETSOCKOPT && !src && !is_zero(sqe->opt, sizeof(sqe->opt)))
		return -EINVAL;
	if ((sqe->flags & KBP_SO_F_ARM) && sqe->op != KBP_SO_OP_POLL)
		return -EINVAL;
	if ((sqe->flags & KBP_SO_F_WAIT) && !data)
		return -EINVAL;
	if ((sqe->flags & KBP_SO_F_META) && sqe->op != KBP_SO_OP_RECVMSG)
		return -EINVAL;
	if ((sqe->msg_flags & (KBP_SO_MSG_SRC | KBP_SO_MSG_TOS)) && sqe->op != KBP_SO_OP_SENDMSG)
		return -EINVAL;
	return 0;
}

/*
 * RECVMSG's rxmeta (KBP_SO_F_META): 64 bytes inside one range of the RAM
 * map, apart from every segment (the payload never lands on it).
 */
static int meta_check(const struct sod_vm *vm, const struct kbp_so_sqe *sqe)
{
	const uint64_t a = sqe->arg1, n = sizeof(struct kbp_so_rxmeta);
	uint32_t i;

	if (!ram_ptr(vm, a, n))
		return -EFAULT;
	/* both ranges are inside the map: no sum below overflows */
	for (i = 0; i < sqe->nr_segs; i++)
		if (a < sqe->seg[i].gpa + sqe->seg[i].len && sqe->seg[i].gpa < a + n)
			return -EINVAL;
	return 0;
}

/* SENDMSG's source address (KBP_SO_MSG_SRC) in opt[], TOS (KBP_SO_MSG_TOS) in arg0 */
static int send_check(const struct kbp_so_sqe *sqe, const struct sod_sock *s)
{
	if (sqe->arg1 || (sqe->msg_flags & KBP_SO_MSG_TOS ? sqe->arg0 > 255 : sqe->arg0 != 0))
		return -EINVAL;
	if ((sqe->msg_flags & KBP_SO_MSG_SRC) && s->family == KBP_SO_AF_INET &&
	    !is_zero(sqe->opt + 4, KBP_SO_OPT_INLINE - 4))
		return -EINVAL;
	return 0;
}

static void sock_cap_reached(struct sod_vm *vm)
{
	if (vm->cap_logged)
		return;
	vm->cap_logged = true;
	SOD_LOG("%s: max-sockets=%u reached: SOCKET answers EMFILE until one closes", vm->name,
		vm->max_sockets);
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
			sock_cap_reached(vm);
			res = -EMFILE;
			break;
		}
		fd = sock_socket(sqe->arg0 == KBP_SO_AF_INET ? AF_INET : AF_INET6);
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
		vm->nr_socks++;
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
		if (sqe->op == KBP_SO_OP_SENDMSG) {
			res = send_check(sqe, s);
		} else if (sqe->arg0 || sqe->addr.family ||
			   (!(sqe->flags & KBP_SO_F_META) && sqe->arg1)) {
			res = -EINVAL;
		}
		if (res)
			goto reject;
		/* every segment checked now, before any I/O */
		res = sod_ram_iov(vm, sqe, iov, &total);
		if (!res && (sqe->flags & KBP_SO_F_META))
			res = meta_check(vm, sqe);
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
	COUNT(&vm->q[qi], rejects, 1);
	vm->total_rejects++;
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

/*
 * Serves up to the VM's budget of one queue's SQEs.  Returns true when SQEs
 * are left (the caller comes back after the other queues, sockets, timer).
 */
bool sod_queue_run(struct sod_vm *vm, uint32_t qi)
{
	struct sod_queue *q = &vm->q[qi];
	uint32_t tail, budget = vm->budget;

	q->more = false;
	if (q->error)
		return false;
	tail = load_acquire(&q->ctl->sq_tail);
	if (tail - q->sq_head > vm->entries) {
		queue_fail(vm, qi, KBP_SO_QERR_SQ_INDEX);
		return false;
	}
	while (q->sq_head != tail) {
		uint32_t cq_head = load_acquire(&q->ctl->cq_head);
		struct kbp_so_sqe sqe;

		if (!budget--) {
			q->more = true;
			break;
		}
		if (q->cq_tail - cq_head > vm->entries) {
			queue_fail(vm, qi, KBP_SO_QERR_CQ_INDEX);
			return false;
		}
		/* a CQE slot for this SQE whenever it completes */
		if (q->inflight + (q->cq_tail - cq_head) >= vm->entries)
			break;
		/* the guest may have left since the last request */
		if (!sod_guest_live(vm))
			break;
		memcpy(&sqe, &q->sq[q->sq_head & (vm->entries - 1)], sizeof(sqe));
		/*
		 * A compiler barrier: every later read of the request is of the
		 * local copy, never a second read of the shared slot.
		 */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		store_release(&q->ctl->sq_head, ++q->sq_head);
		q->inflight++;
		COUNT(q, requests, 1);
		vm->total_requests++;
		handle(vm, qi, &sqe);
	}
	__atomic_store_n(&q->ctl->inflight, q->inflight, __ATOMIC_RELAXED);
	return q->more;
}

/* Zeroes every queue: the guest asked for it and is not writing meanwhile. */
void sod_vm_reset_queues(struct sod_vm *vm)
{
	struct sod_counts sum = { 0 };
	uint32_t qi;

	sod_vm_drop_sockets(vm, 0);
	/* the counters are zeroed below: the log keeps them (tests read it) */
	for (qi = 0; qi < vm->nr_queues; qi++) {
		const struct sod_counts *c = &vm->q[qi].cnt;

		sum.requests += c->requests;
		sum.completions += c->completions;
		sum.copies += c->copies;
		sum.bytes_in += c->bytes_in;
		sum.bytes_out += c->bytes_out;
		sum.rejects += c->rejects;
	}
	SOD_LOG("%s: reset: counters requests=%llu completions=%llu copies=%llu bytes_in=%llu bytes_out=%llu rejects=%llu",
		vm->name, (unsigned long long)sum.requests, (unsigned long long)sum.completions,
		(unsigned long long)sum.copies, (unsigned long long)sum.bytes_in,
		(unsigned long long)sum.bytes_out, (unsigned long long)sum.rejects);
	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];

		memset(q->ctl, 0, sizeof(*q->ctl));
		memset(&q->cnt, 0, sizeof(q->cnt));
		q->sq_head = 0;
		q->cq_tail = 0;
		q->inflight = 0;
		q->error = 0;
		q->kick = false;
		q->more = false;
		__atomic_store_n(&q->ctl->host_polling, vm->poll_mode, __ATOMIC_RELAXED);
	}
}

/*
 * Handles a reset request, then serves one budget of every queue if the
 * guest is attached.  Returns true when a queue has SQEs left.
 */
bool sod_vm_service(struct sod_vm *vm)
{
	struct kbp_so_header *h = vm->hdr;
	uint32_t state = __atomic_load_n(&h->guest_state, __ATOMIC_ACQUIRE);
	bool more = false;
	uint32_t qi;

	if (state == KBP_SO_GUEST_RESET) {
		uint32_t gen = __atomic_load_n(&h->guest_gen, __ATOMIC_ACQUIRE);

		if (gen != vm->ack_gen) {
			sod_vm_reset_queues(vm);
			vm->ack_gen = gen;
			store_release(&h->host_ack_gen, gen);
		}
	}
	if (!guest_gate(vm))
		return false;
	for (qi = 0; qi < vm->nr_queues; qi++) {
		more |= sod_queue_run(vm, qi);
		sod_heartbeat(vm, false);
	}
	sod_kick(vm);
	return more;
}

/* Every heartbeat: retry what is parked (a wakeup lost to an epoll error). */
void sod_vm_retry_parked(struct sod_vm *vm)
{
	uint32_t i;

	if (!guest_gate(vm))
		return;
	for (i = 0; i < vm->max_sockets; i++)
		if (vm->socks[i].fd >= 0 && vm->socks[i].parked)
			sod_sock_event(vm, i);
	sod_kick(vm);
}
