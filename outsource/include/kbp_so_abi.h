/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * kbp socket outsourcing: the shared-memory ABI between the guest module
 * (kbp_so.ko) and the host daemon (kbp-sod).  docs/design.md, section 11.
 *
 * The region is the ivshmem-doorbell BAR2 (guest) and the daemon's shared
 * file (host).  Layout, from offset 0:
 *
 *   struct kbp_so_header                         KBP_SO_HEADER_SIZE bytes
 *   queue 0 .. nr_queues-1, each queue_stride bytes at
 *     queue_offset + q * queue_stride:
 *       struct kbp_so_queue_ctl                  KBP_SO_QCTL_SIZE bytes
 *       struct kbp_so_sqe sq[ring_entries]
 *       struct kbp_so_cqe cq[ring_entries]
 *
 * Rules (the versioning rules are in docs/design.md, 11.4):
 * - Fixed-width little-endian integers only, no pointers, no bitfields, no
 *   implicit padding (every pad is a named field, sizes are asserted below).
 * - Each word has exactly one writer, named in its comment ("G:" guest,
 *   "H:" host).  The only exception is the reset handshake (11.5), during
 *   which the guest has stopped writing.
 * - Ring indices are free-running u32; an entry is ring[idx & (entries-1)].
 *   A producer writes the entry, then publishes the index with a release
 *   store; the consumer loads the index with acquire, then copies the entry
 *   once and checks only its copy.
 * - Guest memory is named by guest-physical address (gpa) and length; the
 *   host checks every range against that guest's RAM map.
 * - Results are a byte count or a negative Linux errno (guest and host are
 *   both Linux; errno values are part of the Linux ABI).
 *
 * This header is included by kernel code (kbp_so.ko) and by user space
 * (kbp-sod, tests); it uses only the types below.
 */
#ifndef KBP_SO_ABI_H
#define KBP_SO_ABI_H

#ifdef __KERNEL__
#include <linux/build_bug.h>
#else
#include <assert.h>		/* static_assert (C11) */
#endif
#include <linux/const.h>	/* _BITUL, _BITULL: uapi, kernel and user space */
#include <linux/types.h>	/* __u8 .. __u64, __s32: the uapi types */
#define KBP_SO_STATIC_ASSERT(c, m) static_assert(c, m)

/* "KBPSOABI" read as a little-endian u64 */
#define KBP_SO_MAGIC		0x4942414f5350424bULL
/* major: incompatible layout change; minor: additions only (11.4) */
#define KBP_SO_VERSION_MAJOR	1
#define KBP_SO_VERSION_MINOR	1	/* 1: FEAT_META, FEAT_QUEUE_OPTS */

#define KBP_SO_HEADER_SIZE	4096
#define KBP_SO_QCTL_SIZE	256
#define KBP_SO_MAX_QUEUES	64	/* per VM; one per vCPU */
#define KBP_SO_MIN_ENTRIES	8
#define KBP_SO_MAX_ENTRIES	1024	/* power of two in between */
#define KBP_SO_MAX_SEGS		18	/* 64 KiB unaligned: 17 pages, +1 */
#define KBP_SO_MAX_IO		65535	/* bytes per send/recv, all segments */
#define KBP_SO_MAX_SOCKETS	1024	/* per VM */
#define KBP_SO_OPT_INLINE	16	/* setsockopt value bytes */

/* header.host_state (H) */
enum kbp_so_host_state {
	KBP_SO_HOST_DOWN = 0,	/* no daemon (initial, or clean exit) */
	KBP_SO_HOST_UP = 1,	/* serving; epoch is current */
	KBP_SO_HOST_STOPPING = 2,	/* completing what is parked, then DOWN */
};

/* header.guest_state (G) */
enum kbp_so_guest_state {
	KBP_SO_GUEST_ABSENT = 0,
	KBP_SO_GUEST_RESET = 1,	/* asks the host to reset (11.5), waits */
	KBP_SO_GUEST_ATTACHED = 2,	/* uses the rings of host_ack_gen */
};

/*
 * The header, at offset 0.  The host fills every H field before it sets
 * host_state to UP; the guest reads magic and version before anything else.
 */
struct kbp_so_header {
	__u64 magic;		/* H: KBP_SO_MAGIC */
	__u16 version_major;	/* H */
	__u16 version_minor;	/* H */
	__u32 header_size;	/* H: KBP_SO_HEADER_SIZE */
	__u64 region_size;	/* H: bytes of the whole region */
	__u32 epoch;		/* H: +1 at every daemon start; 0: never */
	__u32 host_state;	/* H: enum kbp_so_host_state */
	__u32 nr_queues;	/* H: queues laid out (<= KBP_SO_MAX_QUEUES) */
	__u32 ring_entries;	/* H: entries per SQ and per CQ */
	__u32 queue_offset;	/* H: offset of queue 0 */
	__u32 queue_stride;	/* H: bytes per queue, page aligned */
	__u64 host_features;	/* H: KBP_SO_FEAT_* the host offers */
	__u64 heartbeat;	/* H: +1 every KBP_SO_HEARTBEAT_MS while UP */
	__u32 max_sockets;	/* H: sockets this VM may hold */
	__u32 max_segs;		/* H: KBP_SO_MAX_SEGS */
	__u32 host_ack_gen;	/* H: last guest_gen the host reset for */
	__u32 host_pad0;
	__u64 host_pad1[6];	/* H: reserved, zero */

	/* guest-written, own cache line */
	__u64 guest_features;	/* G: subset of host_features it uses */
	__u32 guest_state;	/* G: enum kbp_so_guest_state */
	__u32 guest_gen;	/* G: +1 per reset request */
	__u32 guest_epoch;	/* G: epoch it attached to */
	__u32 guest_pad0;
	__u64 guest_pad1[5];
	__u8 reserved[KBP_SO_HEADER_SIZE - 192];
};

#define KBP_SO_HEARTBEAT_MS	100

/* host_features / guest_features */
#define KBP_SO_FEAT_POLL_ARM	_BITULL(0)	/* POLL with KBP_SO_F_ARM */
#define KBP_SO_FEAT_NEED_IRQ	_BITULL(1)	/* host honours need_irq */
#define KBP_SO_FEAT_HOST_POLL	_BITULL(2)	/* host_polling may be set */
/*
 * 1.1: RECVMSG with KBP_SO_F_META (struct kbp_so_rxmeta), SENDMSG with
 * KBP_SO_MSG_SRC / KBP_SO_MSG_TOS: the ancillary data of IP_PKTINFO,
 * IPV6_PKTINFO, IP_TOS/IPV6_TCLASS, IP_TTL/IPV6_HOPLIMIT, SO_TIMESTAMP*,
 * SO_RXQ_OVFL (design.md 11.12).
 */
#define KBP_SO_FEAT_META	_BITULL(3)
/* 1.1: GETSOCKOPT KBP_SO_OPT_INQ and KBP_SO_OPT_OUTQ */
#define KBP_SO_FEAT_QUEUE_OPTS	_BITULL(4)

/* queue_ctl.host_error (H): why the host stopped serving a queue */
enum kbp_so_queue_error {
	KBP_SO_QERR_NONE = 0,
	KBP_SO_QERR_SQ_INDEX = 1,	/* sq_tail - sq_head > ring_entries */
	KBP_SO_QERR_CQ_INDEX = 2,	/* cq_tail - cq_head > ring_entries */
};

/*
 * Per-queue control block (one queue per guest vCPU).  Guest-written and
 * host-written words live on separate cache lines.  Reset (11.5) zeroes all.
 */
struct kbp_so_queue_ctl {
	/* line 0: guest-written */
	__u32 sq_tail;		/* G: next SQE the guest will fill */
	__u32 cq_head;		/* G: next CQE the guest will read */
	/*
	 * G: nonzero: raise this queue's interrupt after publishing CQEs.
	 * The guest composes it with atomic operations: bit 0 while a waiter
	 * nobody polls for sleeps (without the idle path), plus 2 for every
	 * vCPU of the queue that announced it halts (the idle path: add,
	 * full barrier, re-check cq_tail, halt; design.md 11.11).  The host
	 * publishes cq_tail, full barrier, then reads it.
	 */
	__u32 need_irq;
	__u32 guest_pad0;
	__u64 guest_pad1[6];

	/* line 1: host-written indices and state */
	__u32 sq_head;		/* H: next SQE the host will consume */
	__u32 cq_tail;		/* H: next CQE the host will write */
	/* H: nonzero while a host thread polls sq_tail: no doorbell needed */
	__u32 host_polling;
	__u32 host_error;	/* H: enum kbp_so_queue_error; 0: serving */
	__u32 inflight;		/* H: consumed, final CQE not yet posted */
	__u32 host_pad0;
	__u64 host_pad1[5];

	/* line 2: host-written counters (monotonic since reset) */
	__u64 requests;		/* SQEs consumed */
	__u64 completions;	/* CQEs posted */
	__u64 rejects;		/* SQEs completed -EINVAL/-EFAULT by checks */
	__u64 bytes_in;		/* recvmsg bytes written into guest RAM */
	__u64 bytes_out;	/* sendmsg bytes read from guest RAM */
	__u64 copies;		/* guest-RAM copies: one per recv/send */
	__u64 irqs;		/* interrupts raised */
	__u64 doorbells;	/* doorbells received */
};

/* A socket address: AF_INET or AF_INET6, or family 0 for "none". */
struct kbp_so_addr {
	__u16 family;		/* KBP_SO_AF_* */
	__u16 port;		/* network byte order */
	__u32 flowinfo;		/* IPv6, network byte order */
	__u8 addr[16];		/* IPv4 in the first 4 bytes */
	__u32 scope_id;		/* IPv6 */
	__u32 pad;
};

#define KBP_SO_AF_UNSPEC	0
#define KBP_SO_AF_INET		2
#define KBP_SO_AF_INET6		10

/* One guest-physical range of a pinned user buffer. */
struct kbp_so_seg {
	__u64 gpa;
	__u32 len;
	__u32 pad;
};

/* sqe.op */
enum kbp_so_op {
	KBP_SO_OP_NOP = 0,	/* completes with 0: liveness, tests */
	KBP_SO_OP_SOCKET = 1,	/* arg0 = family; cqe.sock = handle */
	KBP_SO_OP_BIND = 2,	/* addr; cqe.addr = bound name */
	KBP_SO_OP_CONNECT = 3,	/* addr; family UNSPEC dissolves */
	KBP_SO_OP_SENDMSG = 4,	/* segs, addr (optional), msg_flags */
	KBP_SO_OP_RECVMSG = 5,	/* segs, msg_flags; cqe.addr = source */
	KBP_SO_OP_POLL = 6,	/* arg1 = KBP_SO_POLL_* wanted */
	KBP_SO_OP_SETSOCKOPT = 7,	/* arg0 = KBP_SO_OPT_*, opt[] */
	KBP_SO_OP_GETSOCKOPT = 8,	/* arg0 = KBP_SO_OPT_*; cqe.res */
	KBP_SO_OP_SHUTDOWN = 9,	/* arg0 = SHUT_RD/WR/RDWR (0/1/2) */
	KBP_SO_OP_CLOSE = 10,	/* parked requests complete -ECANCELED */
	KBP_SO_OP_CANCEL = 11,	/* arg1 = tag of a parked request */
	KBP_SO_OP_GETNAME = 12,	/* arg0 = 0 local, 1 peer; cqe.addr */
	KBP_SO_OP_MAX = 12,
};

/* sqe.flags */
#define KBP_SO_F_WAIT		_BITUL(0)	/* park until done (blocking) */
#define KBP_SO_F_ARM		_BITUL(1)	/* POLL: park until an event */
/* RECVMSG: arg1 = gpa of a struct kbp_so_rxmeta the host fills (FEAT_META) */
#define KBP_SO_F_META		_BITUL(2)
#define KBP_SO_F_ALL		(KBP_SO_F_WAIT | KBP_SO_F_ARM | KBP_SO_F_META)

/* sqe.msg_flags (the guest maps MSG_* to these) */
#define KBP_SO_MSG_PEEK		_BITUL(0)
#define KBP_SO_MSG_TRUNC	_BITUL(1)	/* res = datagram length */
#define KBP_SO_MSG_DONTWAIT	_BITUL(2)	/* never park, even with WAIT */
/*
 * SENDMSG (FEAT_META): opt[] holds the source address to send from, in the
 * socket's family (IPv4 in opt[0..3]), as IP_PKTINFO's ipi_spec_dst or
 * IPV6_PKTINFO's ipi6_addr; the guest's interface index is not sent.
 * (kbp-sod: IPv4's opt[4..15] must be zero; an address the VM's netns does
 * not have is refused by the host kernel, -EINVAL or -ENETUNREACH.)
 */
#define KBP_SO_MSG_SRC		_BITUL(3)
/*
 * SENDMSG (FEAT_META): arg0 = the datagram's TOS / traffic class (0..255;
 * kbp-sod: above is -EINVAL, and arg0 without this flag too).  An IPv6
 * socket's is IPV6_TCLASS, which Linux ignores for v4-mapped destinations.
 */
#define KBP_SO_MSG_TOS		_BITUL(4)
#define KBP_SO_MSG_ALL		(KBP_SO_MSG_PEEK | KBP_SO_MSG_TRUNC | \
				 KBP_SO_MSG_DONTWAIT | KBP_SO_MSG_SRC | \
				 KBP_SO_MSG_TOS)

/* cqe.out_flags for SENDMSG/RECVMSG */
#define KBP_SO_OUT_TRUNC	_BITUL(0)	/* datagram longer than buffer */

/* POLL events (arg1) and revents (cqe.out_flags) */
#define KBP_SO_POLL_IN		_BITUL(0)
#define KBP_SO_POLL_OUT		_BITUL(1)
#define KBP_SO_POLL_ERR		_BITUL(2)
#define KBP_SO_POLL_HUP		_BITUL(3)
#define KBP_SO_POLL_ALL		0xfU

/* setsockopt/getsockopt options: an allowlist, each an int value */
enum kbp_so_opt {
	KBP_SO_OPT_RCVBUF = 1,		/* SOL_SOCKET SO_RCVBUF */
	KBP_SO_OPT_SNDBUF = 2,		/* SOL_SOCKET SO_SNDBUF */
	KBP_SO_OPT_REUSEADDR = 3,	/* SOL_SOCKET SO_REUSEADDR */
	KBP_SO_OPT_REUSEPORT = 4,	/* SOL_SOCKET SO_REUSEPORT */
	KBP_SO_OPT_PRIORITY = 5,	/* SOL_SOCKET SO_PRIORITY (0..6) */
	KBP_SO_OPT_IP_TOS = 6,		/* IPPROTO_IP IP_TOS */
	KBP_SO_OPT_IP_TTL = 7,		/* IPPROTO_IP IP_TTL */
	KBP_SO_OPT_V6ONLY = 8,		/* IPPROTO_IPV6 IPV6_V6ONLY */
	KBP_SO_OPT_TCLASS = 9,		/* IPPROTO_IPV6 IPV6_TCLASS */
	KBP_SO_OPT_HOPS = 10,		/* IPPROTO_IPV6 IPV6_UNICAST_HOPS */
	KBP_SO_OPT_ERROR = 11,		/* SOL_SOCKET SO_ERROR, get only */
	KBP_SO_OPT_INQ = 12,		/* SIOCINQ: next datagram's bytes, get only */
	KBP_SO_OPT_OUTQ = 13,		/* SIOCOUTQ: bytes not yet sent, get only */
	KBP_SO_OPT_MAX = 13,
};

/*
 * What a RECVMSG with KBP_SO_F_META learns besides the payload: 64 bytes
 * in guest RAM (one range, checked like a segment, at sqe.arg1) that the
 * host writes before the final CQE, only for a datagram it delivered
 * (res >= 0).  valid says which fields hold something.
 *
 * As kbp-sod fills it (design.md 11.6): arg1 outside the RAM map is
 * -EFAULT, overlapping a segment -EINVAL; nothing is written for EAGAIN,
 * an error, the end of data after SHUT_RD, a cancel or a close (MSG_PEEK
 * is a delivery).  dst.port is 0 (PKTINFO carries no port); an IPv6
 * socket's IPv4 datagram has a v4-mapped dst and its IPv4 TOS and TTL.
 * DROPS is valid only when the host kernel reported SO_RXQ_OVFL, which it
 * does once the count is nonzero: the guest can emit the cmsg exactly when
 * the bit is set, as the kernel would.
 */
struct kbp_so_rxmeta {
	struct kbp_so_addr dst;	/* the datagram's destination (PKTINFO) */
	__u64 tstamp_ns;	/* host receive time, CLOCK_REALTIME */
	__u32 drops;		/* the host socket's drop count (RXQ_OVFL) */
	__u8 tos;		/* IP_TOS / IPv6 traffic class */
	__u8 ttl;		/* IP_TTL / IPv6 hop limit */
	__u16 valid;		/* KBP_SO_META_* */
	__u64 reserved[2];	/* zero */
};

#define KBP_SO_META_DST		_BITUL(0)
#define KBP_SO_META_TSTAMP	_BITUL(1)
#define KBP_SO_META_DROPS	_BITUL(2)
#define KBP_SO_META_TOS		_BITUL(3)
#define KBP_SO_META_TTL		_BITUL(4)

/*
 * A submission: 384 bytes.  The host copies it once, then checks the copy:
 * op, flags, msg_flags against their masks, nr_segs <= KBP_SO_MAX_SEGS,
 * every segment inside guest RAM, the sum of lengths <= KBP_SO_MAX_IO,
 * sock against the VM's handle table (index and generation), every pad
 * and reserved word zero (so a later minor version may give them meaning).
 */
struct kbp_so_sqe {
	__u64 tag;		/* guest cookie, echoed in every CQE */
	__u8 op;		/* enum kbp_so_op */
	__u8 nr_segs;
	__u16 flags;		/* KBP_SO_F_* */
	__u32 sock;		/* handle from SOCKET (generation << 16 | idx) */
	__u32 msg_flags;	/* KBP_SO_MSG_* */
	__u32 arg0;
	__u64 arg1;
	struct kbp_so_addr addr;
	__u8 opt[KBP_SO_OPT_INLINE];
	__u64 reserved[2];
	struct kbp_so_seg seg[KBP_SO_MAX_SEGS];
};

/*
 * A completion: 64 bytes.  Exactly one final CQE per consumed SQE (a
 * parked one too, when it completes, is cancelled, or its socket closes);
 * only after it may the guest unpin the request's pages.
 */
struct kbp_so_cqe {
	__u64 tag;		/* the SQE's tag */
	__s32 res;		/* bytes, handle, 0, or -errno */
	__u32 sock;		/* the SQE's handle (SOCKET: the new one) */
	__u32 msg_len;		/* RECVMSG: the datagram's full length */
	__u32 out_flags;	/* KBP_SO_OUT_* or KBP_SO_POLL_* revents */
	__u32 epoch;		/* header.epoch of the host that posted it */
	__u8 op;		/* the SQE's op */
	__u8 pad[3];
	struct kbp_so_addr addr;	/* RECVMSG source, BIND/GETNAME name */
};

KBP_SO_STATIC_ASSERT(__builtin_offsetof(struct kbp_so_header, guest_features) ==
		     128, "guest half of the header on its own cache line");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_header) == KBP_SO_HEADER_SIZE,
		     "kbp_so_header size");
KBP_SO_STATIC_ASSERT(__builtin_offsetof(struct kbp_so_queue_ctl, sq_head) == 64,
		     "host half of the queue control on its own cache line");
KBP_SO_STATIC_ASSERT(__builtin_offsetof(struct kbp_so_queue_ctl, requests) == 128,
		     "counters on their own cache line");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_queue_ctl) == 192,
		     "kbp_so_queue_ctl size");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_queue_ctl) <= KBP_SO_QCTL_SIZE,
		     "kbp_so_queue_ctl fits its slot");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_addr) == 32, "kbp_so_addr size");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_seg) == 16, "kbp_so_seg size");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_sqe) == 384, "kbp_so_sqe size");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_cqe) == 64, "kbp_so_cqe size");
KBP_SO_STATIC_ASSERT(KBP_SO_MAX_SEGS < 256, "nr_segs is a u8");
KBP_SO_STATIC_ASSERT(sizeof(struct kbp_so_rxmeta) == 64, "kbp_so_rxmeta size");

/* Bytes of one queue (control block, SQ, CQ), rounded up to 4 KiB. */
static inline __u64 kbp_so_queue_bytes(__u32 entries)
{
	__u64 n = KBP_SO_QCTL_SIZE +
		  (__u64)entries * (sizeof(struct kbp_so_sqe) +
				    sizeof(struct kbp_so_cqe));

	return (n + 4095) & ~4095ULL;
}

static inline int kbp_so_entries_valid(__u32 entries)
{
	return entries >= KBP_SO_MIN_ENTRIES && entries <= KBP_SO_MAX_ENTRIES &&
	       (entries & (entries - 1)) == 0;
}

#endif /* KBP_SO_ABI_H */
