// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so socket operations: the private protocol (AF_INET and AF_INET6,
 * SOCK_DGRAM, KBP_SO_PROTO) whose operations are requests to the host:
 * socket, bind (ports, the cgroup sock_addr hooks), connect, getname,
 * sendmsg and recvmsg (control messages, timestamps), poll from the armed
 * POLL, shutdown, the setsockopt/getsockopt allowlist, ioctl, close.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

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
		atomic64_add(cqe.res, &ks->st.c[KBP_SO_ST_BYTES_OUT]);
		atomic64_inc(&ks->st.c[KBP_SO_ST_COPIES]);
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
	atomic64_add(min_t(size_t, cqe.msg_len, want), &ks->st.c[KBP_SO_ST_BYTES_IN]);
	if (cqe.msg_len || !READ_ONCE(ks->rd_shut))
		atomic64_inc(&ks->st.c[KBP_SO_ST_COPIES]);
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
 * The armed POLL's completion, in the interrupt handler: the host's
 * revents become the socket's, the POLL completes, then the waiters of
 * sk_sleep() wake with them as the key (as sock_def_readable() does: an
 * EPOLLEXCLUSIVE set wakes one of its waiters, and only for events it
 * asked for) and poll again.  The wake comes after complete(): a waiter
 * it wakes finds the POLL taken back and can arm the next one.  A caller
 * that ran between the new revents and complete() (woken otherwise, or
 * never asleep) found it still out and armed none: its events
 * (poll_missed) join the key.  A cancelled POLL (a wider one is wanted,
 * or the socket closes) changes nothing but wakes: ->poll arms anew.
 */
static void kbp_so_poll_done(struct kbp_so_req *req)
{
	struct kbp_so_sock *ks = container_of(req, struct kbp_so_sock, poll_req);
	struct sock *sk = &ks->inet.sk;
	struct socket_wq *wq;
	__poll_t key;

	kbp_so_count_done(ks, req);
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
		}
	}
	/* close frees the socket once completion_done() and this count say so */
	atomic_inc(&ks->poll_finishing);
	complete(&req->done);
	/* complete() before poll_missed: pairs with kbp_so_poll_arm()'s or, barrier, look */
	smp_mb();
	key |= kbp_so_poll_mask(atomic_xchg(&ks->poll_missed, 0));
	if (key) {
		rcu_read_lock();
		wq = rcu_dereference(sk->sk_wq);
		if (skwq_has_sleeper(wq))
			wake_up_interruptible_poll(&wq->wait, key);
		rcu_read_unlock();
	}
	/* release: the last touch of the socket (kbp_so_poll_disarm()) */
	atomic_dec_return_release(&ks->poll_finishing);
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
		/*
		 * Its answer may cover none of @want, or have set revents and
		 * not yet completed (this caller then drained them): its
		 * callback wakes for @want too.
		 */
		atomic_or(want, &ks->poll_missed);
		/* poll_missed before done: pairs with complete(), barrier, xchg */
		smp_mb__after_atomic();
		if (kbp_so_poll_pending(ks)) {
			if (want & ~ks->poll_want)
				narrow = ks->poll_want;
			goto out;
		}
	}
	/* removal holds it for writing: no arming then, the next poll retries */
	if (!down_read_trylock(&kbp_so_rwsem))
		goto out;
	if (kbp_so_sock_check(ks)) {
		atomic_set(&ks->revents, KBP_SO_POLL_ERR);
		goto out_up;
	}
	q = kbp_so_this_queue(kbp_so_cur);
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
	atomic64_inc(&ks->st.c[KBP_SO_ST_REQUESTS]);
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

	/* a POLL still out for @want: its completion wakes for @want too */
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
 * the host (or the device's failure did), and its callback must have
 * returned before the socket is freed: complete(), then its wake-up.
 */
static void kbp_so_poll_disarm(struct kbp_so_sock *ks)
{
	bool armed;

	spin_lock(&ks->poll_lock);
	ks->poll_closing = true;
	armed = ks->poll_armed;
	spin_unlock(&ks->poll_lock);
	if (armed) {
		down_read(&kbp_so_rwsem);
		/* lends no pages: an unanswered slot may be forgotten */
		if (!wait_for_completion_timeout(&ks->poll_req.done, KBP_SO_CALL_TIMEOUT) &&
		    !kbp_so_forget(ks->poll_q, ks->poll_slot, &ks->poll_req))
			wait_for_completion(&ks->poll_req.done);
		up_read(&kbp_so_rwsem);
	}
	/*
	 * Also when taken back already: the callback may still be waking.
	 * Acquire: pairs with its release, its last touch of the socket.
	 */
	while (atomic_read_acquire(&ks->poll_finishing))
		usleep_range(10, 50);
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
	atomic_set(&ks->poll_finishing, 0);
	atomic_set(&ks->poll_missed, 0);
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

struct proto kbp_so_prot = {
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

struct inet_protosw kbp_so_protosw = {
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

struct proto kbp_so_prot6 = {
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

struct inet_protosw kbp_so_protosw6 = {
	.type		= SOCK_DGRAM,
	.protocol	= KBP_SO_PROTO,
	.prot		= &kbp_so_prot6,
	.ops		= &kbp_so_ops6,
};
