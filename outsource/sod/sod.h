/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * kbp-sod: the host side of kbp socket outsourcing (docs/design.md, 11.6).
 *
 * One process per VM (a worker), one thread.  Everything below is owned by
 * that thread; the only memory shared with anyone else is the region
 * (struct kbp_so_header and queues) and the guest's RAM, both written by an
 * untrusted guest at any time: the daemon reads a shared word once into a
 * local and checks only the local, and never reads back a word it wrote
 * (its own copies are here, the shared ones are outputs).
 */
#ifndef KBP_SOD_H
#define KBP_SOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "kbp_so_abi.h"

#define SOD_MAX_VMS		16
#define SOD_MAX_RAM_RANGES	4
/* requests served from one queue before the next queue, socket or timer */
#define SOD_DEFAULT_BUDGET	32
/* fds a worker needs besides its VM's sockets (and 2 per queue) */
#define SOD_FD_OVERHEAD		32

/* what an epoll event points at */
enum sod_ev_type {
	SOD_EV_LISTEN,		/* a VM's ivshmem server socket */
	SOD_EV_CLIENT,		/* QEMU's connection to it */
	SOD_EV_DOORBELL,	/* a queue's doorbell eventfd */
	SOD_EV_SOCK,		/* a host socket with parked requests */
	SOD_EV_TIMER,
	SOD_EV_SIGNAL,
	SOD_EV_STOP,		/* the supervisor's pipe: closed or written = stop */
};

struct sod_vm;

struct sod_ev {
	enum sod_ev_type type;
	struct sod_vm *vm;
	uint32_t idx;		/* queue or socket index */
};

/* a request parked on a host socket (a copy of its checked SQE) */
struct sod_req {
	struct kbp_so_sqe sqe;
	uint32_t q;
	struct sod_req *next;
};

struct sod_sock {
	int fd;			/* -1: free slot */
	uint16_t gen;		/* handle generation, moves on at close */
	uint16_t family;	/* KBP_SO_AF_INET or _INET6 */
	bool rd_shut;		/* shut down for reading: EAGAIN means end */
	uint32_t ev_mask;	/* EPOLL* registered; 0: not in epoll */
	struct sod_req *parked;	/* FIFO */
	struct sod_ev ev;
};

struct sod_ram_range {
	uint64_t gpa;
	uint64_t len;
	uint64_t off;		/* offset in the RAM file */
};

/* the daemon's own counts of a queue: stored to the shared ones, never read back */
struct sod_counts {
	uint64_t requests, completions, rejects, bytes_in, bytes_out, copies, irqs, doorbells;
};

struct sod_queue {
	struct kbp_so_queue_ctl *ctl;	/* shared */
	struct kbp_so_sqe *sq;		/* shared */
	struct kbp_so_cqe *cq;		/* shared */
	/* private copies: the shared ones are outputs, never read back */
	uint32_t sq_head;
	uint32_t cq_tail;
	uint32_t inflight;	/* consumed, final CQE not posted */
	uint32_t error;		/* enum kbp_so_queue_error */
	bool kick;		/* CQEs posted since the last interrupt check */
	bool more;		/* its budget ran out with SQEs left */
	struct sod_counts cnt;
	int doorbell_fd;	/* guest -> host; -1 without QEMU */
	int irq_fd;		/* host -> guest */
	struct sod_ev ev;
};

struct sod_vm {
	/* the spec (command line or config file) */
	char name[64];
	char region_path[256];
	char sock_path[108];
	char ram_path[256];
	char netns[64];		/* "": only with --allow-host-netns (the daemon's own) */
	char user[64];		/* drop to this user when started as root */
	uint32_t nr_queues;
	uint32_t entries;
	uint32_t max_sockets;
	uint32_t budget;	/* SQEs per queue per pass */
	uint64_t ram_size_spec;	/* ram-size= (for --qemu-args); 0: the file's */
	bool poll_mode;
	int rt_prio;
	bool bind_low_ports;	/* keep CAP_NET_BIND_SERVICE */

	int region_fd;		/* flock()ed for the daemon's lifetime */
	int qemu_fd;		/* another open file of the region: what QEMU gets */
	struct kbp_so_header *hdr;
	size_t region_size;
	uint32_t old_epoch;	/* the region's epoch before this daemon */
	uint32_t epoch;
	uint32_t ack_gen;	/* private copy of hdr->host_ack_gen */
	uint64_t heartbeat;	/* private copy of hdr->heartbeat */
	uint64_t next_beat_ns;	/* CLOCK_MONOTONIC */

	int ram_fd;
	uint8_t *ram;
	size_t ram_size;
	struct sod_ram_range ranges[SOD_MAX_RAM_RANGES];
	uint32_t nr_ranges;

	int netns_fd;		/* the VM's netns, flock()ed: one VM per netns */
	int listen_fd;
	int client_fd;		/* QEMU (or a test client); -1: none */
	struct sod_ev listen_ev;
	struct sod_ev client_ev;

	struct sod_queue q[KBP_SO_MAX_QUEUES];
	struct sod_sock *socks;	/* max_sockets entries */
	uint32_t nr_socks;	/* open */
	bool cap_logged;	/* max-sockets reached, said once per reset */
	bool absent_logged;	/* dropped for a guest that is not attached */
	/* totals since start (kept over resets; the fuzzer and the log read them) */
	uint64_t total_requests, total_rejects, total_completions, total_drops;
};

struct sod {
	int epfd;
	bool stop;
	bool sandboxed;		/* seccomp is on: no unlink, no open */
	bool allow_host_netns;
	bool quiet;		/* no log lines (the fuzzer) */
	int stop_fd;		/* the supervisor's pipe (-1: none) */
	int notify_fd;		/* $NOTIFY_SOCKET, connected (-1: none) */
	int nr_vms;
	struct sod_vm vms[SOD_MAX_VMS];
};

extern struct sod sod;

/* vm.c */
void sod_vm_defaults(struct sod_vm *vm);
int sod_vm_set(struct sod_vm *vm, const char *key, const char *val);
int sod_vm_parse(struct sod_vm *vm, const char *spec);
int sod_vm_check(struct sod_vm *vm);
int sod_vm_open(struct sod_vm *vm);
int sod_vm_layout(struct sod_vm *vm);
void sod_vm_close(struct sod_vm *vm);
void sod_vm_accept(struct sod_vm *vm);
void sod_vm_client_event(struct sod_vm *vm, uint32_t events);
int sod_epoll_set(int fd, uint32_t events, struct sod_ev *ev, bool add);
int sod_qemu_args(const struct sod_vm *vm, char *buf, size_t size);

/* ring.c */
bool sod_vm_service(struct sod_vm *vm);
bool sod_queue_run(struct sod_vm *vm, uint32_t qi);
void sod_sock_event(struct sod_vm *vm, uint32_t idx);
void sod_vm_drop_sockets(struct sod_vm *vm, int complete_res);
void sod_vm_reset_queues(struct sod_vm *vm);
void sod_kick(struct sod_vm *vm);
void sod_vm_retry_parked(struct sod_vm *vm);
bool sod_guest_live(struct sod_vm *vm);
int sod_ram_iov(const struct sod_vm *vm, const struct kbp_so_sqe *sqe,
		struct iovec *iov, size_t *total);
void sod_heartbeat(struct sod_vm *vm, bool force);
uint64_t sod_now_ns(void);

/* loop.c */
int sod_loop_init(struct sod_vm *vm);
void sod_loop_fini(void);
int sod_serve(struct sod_vm *vm);
void sod_notify(const char *msg);

/* sandbox.c */
int sod_enter_netns(struct sod_vm *vm);
int sod_fd_budget(const struct sod_vm *vm);
int sod_resolve_user(const struct sod_vm *vm, uid_t *uid, gid_t *gid);
int sod_confine(const struct sod_vm *vm, uid_t uid, gid_t gid, bool worker);

#define SOD_LOG(fmt, ...) \
	do { \
		if (!sod.quiet) \
			fprintf(stderr, "kbp-sod: " fmt "\n", ##__VA_ARGS__); \
	} while (0)

#endif /* KBP_SOD_H */
