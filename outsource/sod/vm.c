// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: one VM's region, RAM map and ivshmem server side.
 *
 * The daemon is the ivshmem server for each VM (Debian 12 ships none, and
 * QEMU's example is not for production): QEMU's ivshmem-doorbell connects
 * to vm->sock_path and gets, as 8-byte little-endian numbers with optional
 * SCM_RIGHTS fds (QEMU's docs/specs/ivshmem-spec.txt):
 *   0 (protocol version), 1 (the guest's ID), -1 + the region fd,
 *   0 + doorbell eventfd, once per queue (peer 0 = this daemon: the guest
 *       rings queue q by writing 0 << 16 | q to the doorbell register),
 *   1 + irq eventfd, once per queue (the guest's own vectors).
 * Under KVM QEMU turns these into ioeventfds and irqfds; nothing changes
 * here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "sod.h"

#define SOD_GUEST_ID	1
#define SOD_HOST_ID	0

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 0);
	if (errno || *end)
		return -1;
	return 0;
}

static int copy_str(char *dst, size_t size, const char *src)
{
	size_t n = strlen(src);

	if (!n || n >= size)
		return -1;
	memcpy(dst, src, n + 1);
	return 0;
}

/* "GPA:LEN:OFF" ranges joined by '+' */
static int parse_ram_map(struct sod_vm *vm, char *s)
{
	char *save = NULL, *tok;

	vm->nr_ranges = 0;
	for (tok = strtok_r(s, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
		struct sod_ram_range *r;
		char *a = tok, *b, *c;
		uint64_t v[3];

		if (vm->nr_ranges == SOD_MAX_RAM_RANGES)
			return -1;
		b = strchr(a, ':');
		if (!b)
			return -1;
		*b++ = 0;
		c = strchr(b, ':');
		if (!c)
			return -1;
		*c++ = 0;
		if (parse_u64(a, &v[0]) || parse_u64(b, &v[1]) || parse_u64(c, &v[2]))
			return -1;
		r = &vm->ranges[vm->nr_ranges++];
		r->gpa = v[0];
		r->len = v[1];
		r->off = v[2];
		if (!r->len || r->gpa + r->len < r->gpa || r->off + r->len < r->off)
			return -1;
	}
	return vm->nr_ranges ? 0 : -1;
}

/*
 * name=N,region=PATH,socket=PATH,ram=PATH[,ram-map=GPA:LEN:OFF[+...]]
 * [,queues=N][,entries=N][,netns=NAME][,max-sockets=N]
 */
int sod_vm_parse(struct sod_vm *vm, const char *spec)
{
	char *dup = strdup(spec), *save = NULL, *kv, *map = NULL;
	int ret = -1;

	if (!dup)
		return -1;
	memset(vm, 0, sizeof(*vm));
	vm->nr_queues = 1;
	vm->entries = 64;
	vm->max_sockets = 64;
	for (kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *val = strchr(kv, '=');
		uint64_t n;

		if (!val)
			goto out;
		*val++ = 0;
		if (!strcmp(kv, "name")) {
			if (copy_str(vm->name, sizeof(vm->name), val))
				goto out;
		} else if (!strcmp(kv, "region")) {
			if (copy_str(vm->region_path, sizeof(vm->region_path), val))
				goto out;
		} else if (!strcmp(kv, "socket")) {
			if (copy_str(vm->sock_path, sizeof(vm->sock_path), val))
				goto out;
		} else if (!strcmp(kv, "ram")) {
			if (copy_str(vm->ram_path, sizeof(vm->ram_path), val))
				goto out;
		} else if (!strcmp(kv, "netns")) {
			if (copy_str(vm->netns, sizeof(vm->netns), val) || strchr(val, '/'))
				goto out;
		} else if (!strcmp(kv, "ram-map")) {
			map = val;
		} else if (!strcmp(kv, "queues")) {
			if (parse_u64(val, &n) || !n || n > KBP_SO_MAX_QUEUES)
				goto out;
			vm->nr_queues = (uint32_t)n;
		} else if (!strcmp(kv, "entries")) {
			if (parse_u64(val, &n) || !kbp_so_entries_valid((uint32_t)n) ||
			    n > KBP_SO_MAX_ENTRIES)
				goto out;
			vm->entries = (uint32_t)n;
		} else if (!strcmp(kv, "max-sockets")) {
			if (parse_u64(val, &n) || !n || n > KBP_SO_MAX_SOCKETS)
				goto out;
			vm->max_sockets = (uint32_t)n;
		} else {
			goto out;
		}
	}
	if (!vm->name[0] || !vm->region_path[0] || !vm->sock_path[0] || !vm->ram_path[0])
		goto out;
	if (map && parse_ram_map(vm, map))
		goto out;
	ret = 0;
out:
	free(dup);
	return ret;
}

int sod_epoll_set(int fd, uint32_t events, struct sod_ev *ev, bool add)
{
	struct epoll_event e = { .events = events, .data.ptr = ev };

	return epoll_ctl(sod.epfd, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &e);
}

static size_t region_bytes(const struct sod_vm *vm)
{
	uint64_t n = KBP_SO_HEADER_SIZE +
		     (uint64_t)vm->nr_queues * kbp_so_queue_bytes(vm->entries);
	size_t p = 4096;

	/* ivshmem's BAR2 must be a power of two */
	while (p < n)
		p <<= 1;
	return p;
}

/*
 * Opens (or creates) the region, takes the lock that makes "new epoch" mean
 * "the previous daemon is gone", lays the region out and bumps the epoch.
 */
static int region_open(struct sod_vm *vm)
{
	struct kbp_so_header *h;
	uint32_t old_epoch = 0;
	struct stat st;
	size_t size = region_bytes(vm);
	uint32_t qi;

	vm->region_fd = open(vm->region_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (vm->region_fd < 0) {
		SOD_LOG("%s: region %s: %s", vm->name, vm->region_path, strerror(errno));
		return -1;
	}
	if (flock(vm->region_fd, LOCK_EX | LOCK_NB)) {
		SOD_LOG("%s: region %s is held by another kbp-sod: %s", vm->name,
			vm->region_path, strerror(errno));
		goto err_close;
	}
	if (fstat(vm->region_fd, &st))
		goto err_close;
	if ((size_t)st.st_size >= sizeof(*h)) {
		struct kbp_so_header old;

		if (pread(vm->region_fd, &old, sizeof(old), 0) == (ssize_t)sizeof(old) &&
		    old.magic == KBP_SO_MAGIC)
			old_epoch = old.epoch;
	}
	if ((size_t)st.st_size != size && ftruncate(vm->region_fd, (off_t)size)) {
		SOD_LOG("%s: region size: %s", vm->name, strerror(errno));
		goto err_close;
	}
	h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->region_fd, 0);
	if (h == MAP_FAILED) {
		SOD_LOG("%s: region mmap: %s", vm->name, strerror(errno));
		goto err_close;
	}
	vm->hdr = h;
	vm->region_size = size;
	vm->epoch = old_epoch + 1 ? old_epoch + 1 : 1;

	/* DOWN first: a guest reading during the layout sees "not serving" */
	__atomic_store_n(&h->host_state, KBP_SO_HOST_DOWN, __ATOMIC_RELEASE);
	memset((uint8_t *)h + KBP_SO_HEADER_SIZE, 0, size - KBP_SO_HEADER_SIZE);
	h->magic = KBP_SO_MAGIC;
	h->version_major = KBP_SO_VERSION_MAJOR;
	h->version_minor = KBP_SO_VERSION_MINOR;
	h->header_size = KBP_SO_HEADER_SIZE;
	h->region_size = size;
	h->nr_queues = vm->nr_queues;
	h->ring_entries = vm->entries;
	h->queue_offset = KBP_SO_HEADER_SIZE;
	h->queue_stride = (uint32_t)kbp_so_queue_bytes(vm->entries);
	h->host_features = KBP_SO_FEAT_POLL_ARM | KBP_SO_FEAT_NEED_IRQ |
			   KBP_SO_FEAT_HOST_POLL;
	h->max_sockets = vm->max_sockets;
	h->max_segs = KBP_SO_MAX_SEGS;
	/* the guest must reset against this epoch: its old attach is void */
	vm->ack_gen = h->host_ack_gen;
	h->host_pad0 = 0;
	memset(h->host_pad1, 0, sizeof(h->host_pad1));

	for (qi = 0; qi < vm->nr_queues; qi++) {
		uint8_t *base = (uint8_t *)h + h->queue_offset +
				(size_t)qi * h->queue_stride;
		struct sod_queue *q = &vm->q[qi];

		q->ctl = (struct kbp_so_queue_ctl *)base;
		q->sq = (struct kbp_so_sqe *)(base + KBP_SO_QCTL_SIZE);
		q->cq = (struct kbp_so_cqe *)(base + KBP_SO_QCTL_SIZE +
					      (size_t)vm->entries * sizeof(struct kbp_so_sqe));
		q->doorbell_fd = -1;
		q->irq_fd = -1;
		q->ev.type = SOD_EV_DOORBELL;
		q->ev.vm = vm;
		q->ev.idx = qi;
	}
	__atomic_store_n(&h->epoch, vm->epoch, __ATOMIC_RELEASE);
	__atomic_store_n(&h->host_state, KBP_SO_HOST_UP, __ATOMIC_RELEASE);
	return 0;

err_close:
	close(vm->region_fd);
	vm->region_fd = -1;
	return -1;
}

static int ram_open(struct sod_vm *vm)
{
	struct stat st;
	uint32_t i;

	vm->ram_fd = open(vm->ram_path, O_RDWR | O_CLOEXEC);
	if (vm->ram_fd < 0) {
		SOD_LOG("%s: ram %s: %s", vm->name, vm->ram_path, strerror(errno));
		return -1;
	}
	if (fstat(vm->ram_fd, &st) || st.st_size <= 0) {
		SOD_LOG("%s: ram %s: empty or unreadable", vm->name, vm->ram_path);
		goto err_close;
	}
	vm->ram_size = (size_t)st.st_size;
	if (!vm->nr_ranges) {
		vm->ranges[0].gpa = 0;
		vm->ranges[0].len = vm->ram_size;
		vm->ranges[0].off = 0;
		vm->nr_ranges = 1;
	}
	for (i = 0; i < vm->nr_ranges; i++) {
		const struct sod_ram_range *r = &vm->ranges[i];

		if (r->off > vm->ram_size || r->len > vm->ram_size - r->off) {
			SOD_LOG("%s: ram-map range %u is outside the %zu-byte file", vm->name,
				i, vm->ram_size);
			goto err_close;
		}
	}
	vm->ram = mmap(NULL, vm->ram_size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->ram_fd, 0);
	if (vm->ram == MAP_FAILED) {
		vm->ram = NULL;
		SOD_LOG("%s: ram mmap: %s", vm->name, strerror(errno));
		goto err_close;
	}
	return 0;

err_close:
	close(vm->ram_fd);
	vm->ram_fd = -1;
	return -1;
}

static int listen_open(struct sod_vm *vm)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };

	memcpy(sun.sun_path, vm->sock_path, strlen(vm->sock_path) + 1);
	vm->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (vm->listen_fd < 0)
		return -1;
	unlink(vm->sock_path);
	if (bind(vm->listen_fd, (struct sockaddr *)&sun, sizeof(sun)) ||
	    listen(vm->listen_fd, 4)) {
		SOD_LOG("%s: socket %s: %s", vm->name, vm->sock_path, strerror(errno));
		goto err_close;
	}
	vm->listen_ev.type = SOD_EV_LISTEN;
	vm->listen_ev.vm = vm;
	if (sod_epoll_set(vm->listen_fd, EPOLLIN, &vm->listen_ev, true))
		goto err_unlink;
	return 0;

err_unlink:
	unlink(vm->sock_path);
err_close:
	close(vm->listen_fd);
	vm->listen_fd = -1;
	return -1;
}

int sod_vm_open(struct sod_vm *vm)
{
	uint32_t i;

	vm->region_fd = -1;
	vm->ram_fd = -1;
	vm->listen_fd = -1;
	vm->client_fd = -1;
	vm->netns_fd = -1;
	vm->socks = calloc(vm->max_sockets, sizeof(*vm->socks));
	if (!vm->socks)
		return -1;
	for (i = 0; i < vm->max_sockets; i++) {
		vm->socks[i].fd = -1;
		vm->socks[i].gen = 1;
		vm->socks[i].ev.type = SOD_EV_SOCK;
		vm->socks[i].ev.vm = vm;
		vm->socks[i].ev.idx = i;
	}
	if (vm->netns[0]) {
		char path[128];

		snprintf(path, sizeof(path), "/run/netns/%s", vm->netns);
		vm->netns_fd = open(path, O_RDONLY | O_CLOEXEC);
		if (vm->netns_fd < 0) {
			SOD_LOG("%s: netns %s: %s", vm->name, vm->netns, strerror(errno));
			goto err_free;
		}
	}
	if (ram_open(vm))
		goto err_netns;
	if (region_open(vm))
		goto err_ram;
	if (listen_open(vm))
		goto err_region;
	SOD_LOG("%s: serving, epoch %u, %u queue(s) of %u, region %zu bytes", vm->name,
		vm->epoch, vm->nr_queues, vm->entries, vm->region_size);
	return 0;

err_region:
	__atomic_store_n(&vm->hdr->host_state, KBP_SO_HOST_DOWN, __ATOMIC_RELEASE);
	munmap(vm->hdr, vm->region_size);
	vm->hdr = NULL;
	close(vm->region_fd);
	vm->region_fd = -1;
err_ram:
	munmap(vm->ram, vm->ram_size);
	vm->ram = NULL;
	close(vm->ram_fd);
	vm->ram_fd = -1;
err_netns:
	if (vm->netns_fd >= 0)
		close(vm->netns_fd);
	vm->netns_fd = -1;
err_free:
	free(vm->socks);
	vm->socks = NULL;
	return -1;
}

static void client_drop(struct sod_vm *vm)
{
	uint32_t qi;

	if (vm->client_fd < 0)
		return;
	/* the guest is gone (or its QEMU is): its sockets go, no RAM writes */
	sod_vm_drop_sockets(vm, 0);
	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];

		/*
		 * QEMU holds the same open file (SCM_RIGHTS): closing ours would not
		 * take it out of the epoll set, so say so first.
		 */
		if (q->doorbell_fd >= 0) {
			epoll_ctl(sod.epfd, EPOLL_CTL_DEL, q->doorbell_fd, NULL);
			close(q->doorbell_fd);
		}
		if (q->irq_fd >= 0)
			close(q->irq_fd);
		q->doorbell_fd = -1;
		q->irq_fd = -1;
	}
	close(vm->client_fd);
	vm->client_fd = -1;
	SOD_LOG("%s: client gone", vm->name);
}

void sod_vm_close(struct sod_vm *vm)
{
	if (!vm->socks)
		return;
	if (vm->hdr)
		__atomic_store_n(&vm->hdr->host_state, KBP_SO_HOST_STOPPING, __ATOMIC_RELEASE);
	/* parked requests get their final completion, then the sockets close */
	sod_vm_drop_sockets(vm, -ESHUTDOWN);
	sod_kick(vm);
	client_drop(vm);
	if (vm->listen_fd >= 0) {
		close(vm->listen_fd);
		unlink(vm->sock_path);
	}
	if (vm->hdr) {
		uint32_t qi;

		for (qi = 0; qi < vm->nr_queues; qi++)
			__atomic_store_n(&vm->q[qi].ctl->host_polling, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&vm->hdr->host_state, KBP_SO_HOST_DOWN, __ATOMIC_RELEASE);
		munmap(vm->hdr, vm->region_size);
	}
	if (vm->region_fd >= 0)
		close(vm->region_fd);	/* releases the flock */
	if (vm->ram)
		munmap(vm->ram, vm->ram_size);
	if (vm->ram_fd >= 0)
		close(vm->ram_fd);
	if (vm->netns_fd >= 0)
		close(vm->netns_fd);
	free(vm->socks);
	vm->socks = NULL;
}

static int send_msg(int fd, int64_t val, int passfd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = &val, .iov_len = sizeof(val) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	/* the protocol is little-endian; so is every host this builds for */
	_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian host");
	if (passfd >= 0) {
		struct cmsghdr *c;

		memset(cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf;
		msg.msg_controllen = sizeof(cbuf);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &passfd, sizeof(int));
	}
	return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(val) ? 0 : -1;
}

static int client_setup(struct sod_vm *vm, int fd)
{
	uint32_t qi;
	int shm_fd, err;

	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];

		q->doorbell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		q->irq_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (q->doorbell_fd < 0 || q->irq_fd < 0)
			return -1;
		if (sod_epoll_set(q->doorbell_fd, EPOLLIN, &q->ev, true))
			return -1;
	}
	/*
	 * QEMU gets its own open file of the region, not ours: the flock belongs
	 * to an open file, and QEMU keeps the fd it is passed for as long as it
	 * lives, so passing ours would keep the lock after we die and a
	 * restarted daemon could not take the region (design.md 11.3, 11.5).
	 */
	shm_fd = open(vm->region_path, O_RDWR | O_CLOEXEC);
	if (shm_fd < 0)
		return -1;
	err = send_msg(fd, 0, -1) || send_msg(fd, SOD_GUEST_ID, -1) ||
	      send_msg(fd, -1, shm_fd);
	close(shm_fd);
	if (err)
		return -1;
	for (qi = 0; qi < vm->nr_queues; qi++)
		if (send_msg(fd, SOD_HOST_ID, vm->q[qi].doorbell_fd))
			return -1;
	for (qi = 0; qi < vm->nr_queues; qi++)
		if (send_msg(fd, SOD_GUEST_ID, vm->q[qi].irq_fd))
			return -1;
	return 0;
}

void sod_vm_accept(struct sod_vm *vm)
{
	int fd = accept4(vm->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (vm->client_fd >= 0) {
		/* one QEMU per VM: a second one would share the guest's rings */
		SOD_LOG("%s: refusing a second client", vm->name);
		close(fd);
		return;
	}
	vm->client_fd = fd;
	vm->client_ev.type = SOD_EV_CLIENT;
	vm->client_ev.vm = vm;
	if (sod_epoll_set(fd, EPOLLIN | EPOLLRDHUP, &vm->client_ev, true) ||
	    client_setup(vm, fd)) {
		SOD_LOG("%s: client setup failed: %s", vm->name, strerror(errno));
		client_drop(vm);	/* closes the eventfds made so far */
		return;
	}
	SOD_LOG("%s: client connected", vm->name);
}

void sod_vm_client_event(struct sod_vm *vm, uint32_t events)
{
	char buf[64];
	ssize_t n;

	/* QEMU never sends; anything readable is EOF or noise */
	n = recv(vm->client_fd, buf, sizeof(buf), MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) ||
	    (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)))
		client_drop(vm);
}
