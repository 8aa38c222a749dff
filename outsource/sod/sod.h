/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * kbp-sod: the host side of kbp socket outsourcing (docs/design.md, 11.6).
 *
 * One thread.  Everything below is owned by that thread; the only memory
 * shared with anyone else is the region (struct kbp_so_header and queues)
 * and the guest's RAM, both written by an untrusted guest at any time: the
 * daemon reads a shared word once into a local and checks only the local.
 */
#ifndef KBP_SOD_H
#define KBP_SOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kbp_so_abi.h"

#define SOD_MAX_VMS		16
#define SOD_MAX_RAM_RANGES	4

/* what an epoll event points at */
enum sod_ev_type {
	SOD_EV_LISTEN,		/* a VM's ivshmem server socket */
	SOD_EV_CLIENT,		/* QEMU's connection to it */
	SOD_EV_DOORBELL,	/* a queue's doorbell eventfd */
	SOD_EV_SOCK,		/* a host socket with parked requests */
	SOD_EV_TIMER,
	SOD_EV_SIGNAL,
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
	int doorbell_fd;	/* guest -> host; -1 without QEMU */
	int irq_fd;		/* host -> guest */
	struct sod_ev ev;
};

struct sod_vm {
	char name[64];
	char region_path[256];
	char sock_path[108];
	char ram_path[256];
	char netns[64];
	uint32_t nr_queues;
	uint32_t entries;
	uint32_t max_sockets;

	int region_fd;		/* flock()ed for the daemon's lifetime */
	struct kbp_so_header *hdr;
	size_t region_size;
	uint32_t epoch;
	uint32_t ack_gen;	/* private copy of hdr->host_ack_gen */

	int ram_fd;
	uint8_t *ram;
	size_t ram_size;
	struct sod_ram_range ranges[SOD_MAX_RAM_RANGES];
	uint32_t nr_ranges;

	int netns_fd;		/* -1: the daemon's own netns */
	int listen_fd;
	int client_fd;		/* QEMU (or a test client); -1: none */
	struct sod_ev listen_ev;
	struct sod_ev client_ev;

	struct sod_queue q[KBP_SO_MAX_QUEUES];
	struct sod_sock *socks;	/* max_sockets entries */
};

struct sod {
	int epfd;
	int self_netns_fd;
	bool poll_mode;
	bool stop;
	int nr_vms;
	struct sod_vm vms[SOD_MAX_VMS];
};

extern struct sod sod;

/* vm.c */
int sod_vm_parse(struct sod_vm *vm, const char *spec);
int sod_vm_open(struct sod_vm *vm);
void sod_vm_close(struct sod_vm *vm);
void sod_vm_accept(struct sod_vm *vm);
void sod_vm_client_event(struct sod_vm *vm, uint32_t events);
int sod_epoll_set(int fd, uint32_t events, struct sod_ev *ev, bool add);

/* ring.c */
void sod_vm_service(struct sod_vm *vm);
void sod_queue_run(struct sod_vm *vm, uint32_t qi);
void sod_sock_event(struct sod_vm *vm, uint32_t idx);
void sod_vm_drop_sockets(struct sod_vm *vm, int complete_res);
void sod_vm_reset_queues(struct sod_vm *vm);
void sod_kick(struct sod_vm *vm);
void sod_vm_retry_parked(struct sod_vm *vm);
int sod_ram_iov(const struct sod_vm *vm, const struct kbp_so_sqe *sqe,
		struct iovec *iov, size_t *total);

#define SOD_LOG(fmt, ...) fprintf(stderr, "kbp-sod: " fmt "\n", ##__VA_ARGS__)

#endif /* KBP_SOD_H */
