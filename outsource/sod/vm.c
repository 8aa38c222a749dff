// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: one VM's spec, region, RAM map and ivshmem server side.
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
 *
 * Everything that opens or creates a file runs before the worker confines
 * itself (sandbox.c): afterwards it has no open(), unlink() or socket() of
 * any family but UDP.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

/* a size with an optional K, M or G suffix (binary) */
static int parse_size(const char *s, uint64_t *out)
{
	char buf[32];
	size_t n = strlen(s);
	unsigned int shift = 0;

	if (!n || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n + 1);
	switch (buf[n - 1]) {
	case 'K': case 'k': shift = 10; break;
	case 'M': case 'm': shift = 20; break;
	case 'G': case 'g': shift = 30; break;
	}
	if (shift)
		buf[n - 1] = 0;
	if (parse_u64(buf, out) || (shift && (*out >> (64 - shift)) != 0))
		return -1;
	*out <<= shift;
	return 0;
}

static int parse_bool(const char *s, bool *out)
{
	if (!strcmp(s, "yes") || !strcmp(s, "1") || !strcmp(s, "true")) {
		*out = true;
		return 0;
	}
	if (!strcmp(s, "no") || !strcmp(s, "0") || !strcmp(s, "false")) {
		*out = false;
		return 0;
	}
	return -1;
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
static int parse_ram_map(struct sod_vm *vm, const char *spec)
{
	char *s = strdup(spec), *save = NULL, *tok;
	int ret = -1;

	if (!s)
		return -1;
	vm->nr_ranges = 0;
	for (tok = strtok_r(s, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
		struct sod_ram_range *r;
		char *a = tok, *b, *c;
		uint64_t v[3];

		if (vm->nr_ranges == SOD_MAX_RAM_RANGES)
			goto out;
		b = strchr(a, ':');
		if (!b)
			goto out;
		*b++ = 0;
		c = strchr(b, ':');
		if (!c)
			goto out;
		*c++ = 0;
		if (parse_u64(a, &v[0]) || parse_u64(b, &v[1]) || parse_u64(c, &v[2]))
			goto out;
		r = &vm->ranges[vm->nr_ranges++];
		r->gpa = v[0];
		r->len = v[1];
		r->off = v[2];
		if (!r->len || r->gpa + r->len < r->gpa || r->off + r->len < r->off)
			goto out;
	}
	ret = vm->nr_ranges ? 0 : -1;
out:
	free(s);
	return ret;
}

void sod_vm_defaults(struct sod_vm *vm)
{
	memset(vm, 0, sizeof(*vm));
	vm->nr_queues = 1;
	vm->entries = 64;
	vm->max_sockets = 64;
	vm->budget = SOD_DEFAULT_BUDGET;
	snprintf(vm->user, sizeof(vm->user), "kbp-sod");
	vm->region_fd = vm->qemu_fd = vm->ram_fd = vm->netns_fd = -1;
	vm->listen_fd = vm->client_fd = -1;
}

/* One key of a spec or of a config file.  0, or -1 with nothing said. */
int sod_vm_set(struct sod_vm *vm, const char *key, const char *val)
{
	uint64_t n;

	if (!strcmp(key, "name"))
		return copy_str(vm->name, sizeof(vm->name), val) || strchr(val, '/') ? -1 : 0;
	if (!strcmp(key, "region"))
		return copy_str(vm->region_path, sizeof(vm->region_path), val);
	if (!strcmp(key, "socket"))
		return copy_str(vm->sock_path, sizeof(vm->sock_path), val);
	if (!strcmp(key, "ram"))
		return copy_str(vm->ram_path, sizeof(vm->ram_path), val);
	if (!strcmp(key, "netns"))
		return copy_str(vm->netns, sizeof(vm->netns), val) || strchr(val, '/') ||
		       !strcmp(val, ".") || !strcmp(val, "..") ? -1 : 0;
	if (!strcmp(key, "user"))
		return copy_str(vm->user, sizeof(vm->user), val);
	if (!strcmp(key, "ram-map"))
		return parse_ram_map(vm, val);
	if (!strcmp(key, "ram-size"))
		return parse_size(val, &vm->ram_size_spec) || !vm->ram_size_spec ? -1 : 0;
	if (!strcmp(key, "poll"))
		return parse_bool(val, &vm->poll_mode);
	if (!strcmp(key, "bind-low-ports"))
		return parse_bool(val, &vm->bind_low_ports);
	if (parse_u64(val, &n))
		return -1;
	if (!strcmp(key, "queues")) {
		if (!n || n > KBP_SO_MAX_QUEUES)
			return -1;
		vm->nr_queues = (uint32_t)n;
	} else if (!strcmp(key, "entries")) {
		if (n > KBP_SO_MAX_ENTRIES || !kbp_so_entries_valid((uint32_t)n))
			return -1;
		vm->entries = (uint32_t)n;
	} else if (!strcmp(key, "max-sockets")) {
		if (!n || n > KBP_SO_MAX_SOCKETS)
			return -1;
		vm->max_sockets = (uint32_t)n;
	} else if (!strcmp(key, "budget")) {
		if (!n || n > KBP_SO_MAX_ENTRIES)
			return -1;
		vm->budget = (uint32_t)n;
	} else if (!strcmp(key, "rt-prio")) {
		if (n > 99)
			return -1;
		vm->rt_prio = (int)n;
	} else {
		return -1;
	}
	return 0;
}

/*
 * name=N,region=PATH,socket=PATH,ram=PATH,netns=NAME[,ram-map=GPA:LEN:OFF[+...]]
 * [,ram-size=SIZE][,queues=N][,entries=N][,max-sockets=N][,budget=N][,poll=yes]
 * [,rt-prio=N][,user=NAME][,bind-low-ports=yes]
 */
int sod_vm_parse(struct sod_vm *vm, const char *spec)
{
	char *dup = strdup(spec), *save = NULL, *kv;
	int ret = -1;

	if (!dup)
		return -1;
	for (kv = strtok_r(dup, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *val = strchr(kv, '=');

		if (!val)
			goto out;
		*val++ = 0;
		if (sod_vm_set(vm, kv, val)) {
			SOD_LOG("bad %s=%s", kv, val);
			goto out;
		}
	}
	ret = 0;
out:
	free(dup);
	return ret;
}

int sod_vm_check(struct sod_vm *vm)
{
	if (!vm->name[0] || !vm->region_path[0] || !vm->sock_path[0] || !vm->ram_path[0]) {
		SOD_LOG("%s: name, region, socket and ram are required", vm->name[0] ? vm->name : "?");
		return -1;
	}
	/* a budget above the ring is the ring */
	if (vm->budget > vm->entries)
		vm->budget = vm->entries;
	return 0;
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
 * Opens (or creates) the region and takes the lock that makes "new epoch"
 * mean "the previous daemon is gone"; maps it.  The layout comes later
 * (sod_vm_layout), when everything else is in place.
 */
static int region_open(struct sod_vm *vm)
{
	struct stat st;
	size_t size = region_bytes(vm);
	void *h;

	vm->region_fd = open(vm->region_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (vm->region_fd < 0) {
		SOD_LOG("%s: region %s: %s", vm->name, vm->region_path, strerror(errno));
		return -1;
	}
	if (flock(vm->region_fd, LOCK_EX | LOCK_NB)) {
		SOD_LOG("%s: region %s is held by another kbp-sod: %s", vm->name,
			vm->region_path, strerror(errno));
		goto err_close;
	}
	if (fstat(vm->region_fd, &st) || !S_ISREG(st.st_mode)) {
		SOD_LOG("%s: region %s: not a regular file", vm->name, vm->region_path);
		goto err_close;
	}
	if ((st.st_mode & 077) && fchmod(vm->region_fd, 0600))
		SOD_LOG("%s: region %s: chmod 0600: %s", vm->name, vm->region_path, strerror(errno));
	vm->old_epoch = 0;
	if ((size_t)st.st_size >= sizeof(struct kbp_so_header)) {
		struct kbp_so_header old;

		if (pread(vm->region_fd, &old, sizeof(old), 0) == (ssize_t)sizeof(old) &&
		    old.magic == KBP_SO_MAGIC)
			vm->old_epoch = old.epoch;
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
	/*
	 * QEMU gets its own open file of the region, not ours: the flock belongs
	 * to an open file, and QEMU keeps the fd it is passed for as long as it
	 * lives, so passing ours would keep the lock after we die and a
	 * restarted daemon could not take the region (design.md 11.3, 11.5).
	 * Opened now: the confined worker cannot open files.
	 */
	vm->qemu_fd = open(vm->region_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (vm->qemu_fd < 0) {
		SOD_LOG("%s: region %s: %s", vm->name, vm->region_path, strerror(errno));
		munmap(h, size);
		goto err_close;
	}
	vm->hdr = h;
	vm->region_size = size;
	return 0;

err_close:
	close(vm->region_fd);
	vm->region_fd = -1;
	return -1;
}

/*
 * Lays the region out and bumps the epoch.  Every pointer comes from this
 * daemon's own constants (the header is guest-writable: what it says about
 * the layout is written here and never read back), so a guest rewriting
 * queue_offset or queue_stride meanwhile moves nothing (issue 37 item 6).
 */
int sod_vm_layout(struct sod_vm *vm)
{
	struct kbp_so_header *h = vm->hdr;
	const size_t stride = (size_t)kbp_so_queue_bytes(vm->entries);
	const size_t sq_bytes = (size_t)vm->entries * sizeof(struct kbp_so_sqe);
	uint32_t qi;

	if (KBP_SO_HEADER_SIZE + (uint64_t)vm->nr_queues * stride > vm->region_size)
		return -1;	/* cannot happen: region_bytes() */
	vm->epoch = vm->old_epoch + 1 ? vm->old_epoch + 1 : 1;

	/* DOWN first: a guest reading during the layout sees "not serving" */
	__atomic_store_n(&h->host_state, KBP_SO_HOST_DOWN, __ATOMIC_RELEASE);
	memset((uint8_t *)h + KBP_SO_HEADER_SIZE, 0, vm->region_size - KBP_SO_HEADER_SIZE);
	h->magic = KBP_SO_MAGIC;
	h->version_major = KBP_SO_VERSION_MAJOR;
	h->version_minor = KBP_SO_VERSION_MINOR;
	h->header_size = KBP_SO_HEADER_SIZE;
	h->region_size = vm->region_size;
	h->nr_queues = vm->nr_queues;
	h->ring_entries = vm->entries;
	h->queue_offset = KBP_SO_HEADER_SIZE;
	h->queue_stride = (uint32_t)stride;
	h->host_features = KBP_SO_FEAT_POLL_ARM | KBP_SO_FEAT_NEED_IRQ | KBP_SO_FEAT_HOST_POLL |
			   KBP_SO_FEAT_META | KBP_SO_FEAT_QUEUE_OPTS;
	h->max_sockets = vm->max_sockets;
	h->max_segs = KBP_SO_MAX_SEGS;
	/* the guest must reset against this epoch: its old attach is void */
	vm->ack_gen = __atomic_load_n(&h->host_ack_gen, __ATOMIC_RELAXED);
	__atomic_store_n(&h->host_ack_gen, vm->ack_gen, __ATOMIC_RELAXED);
	vm->heartbeat = 0;
	__atomic_store_n(&h->heartbeat, 0, __ATOMIC_RELAXED);
	h->host_pad0 = 0;
	memset(h->host_pad1, 0, sizeof(h->host_pad1));

	for (qi = 0; qi < vm->nr_queues; qi++) {
		uint8_t *base = (uint8_t *)h + KBP_SO_HEADER_SIZE + (size_t)qi * stride;
		struct sod_queue *q = &vm->q[qi];

		q->ctl = (struct kbp_so_queue_ctl *)base;
		q->sq = (struct kbp_so_sqe *)(base + KBP_SO_QCTL_SIZE);
		q->cq = (struct kbp_so_cqe *)(base + KBP_SO_QCTL_SIZE + sq_bytes);
		q->ev.type = SOD_EV_DOORBELL;
		q->ev.vm = vm;
		q->ev.idx = qi;
	}
	__atomic_store_n(&h->epoch, vm->epoch, __ATOMIC_RELEASE);
	__atomic_store_n(&h->host_state, KBP_SO_HOST_UP, __ATOMIC_RELEASE);
	return 0;
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
	if (st.st_mode & 077)
		SOD_LOG("%s: warning: ram %s is accessible to others (mode %04o): the guest's "
			"memory should be 0600", vm->name, vm->ram_path, st.st_mode & 07777);
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
	/* the umask is 077: only the daemon's starting user (QEMU's: root) connects */
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

static void unmap_all(struct sod_vm *vm)
{
	if (vm->hdr)
		munmap(vm->hdr, vm->region_size);
	vm->hdr = NULL;
	if (vm->qemu_fd >= 0)
		close(vm->qemu_fd);
	if (vm->region_fd >= 0)
		close(vm->region_fd);	/* releases the flock */
	vm->qemu_fd = vm->region_fd = -1;
	if (vm->ram)
		munmap(vm->ram, vm->ram_size);
	vm->ram = NULL;
	if (vm->ram_fd >= 0)
		close(vm->ram_fd);
	vm->ram_fd = -1;
	if (vm->netns_fd >= 0)
		close(vm->netns_fd);	/* releases the netns lock */
	vm->netns_fd = -1;
}

/*
 * Everything a VM needs, in the order that refuses early: the RAM file, the
 * region's lock, the network namespace (entered for good, and locked: one
 * VM per netns), the server socket, then the layout (a new epoch).
 */
int sod_vm_open(struct sod_vm *vm)
{
	uint32_t i;

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
	for (i = 0; i < vm->nr_queues; i++)
		vm->q[i].doorbell_fd = vm->q[i].irq_fd = -1;
	if (ram_open(vm) || region_open(vm) || sod_enter_netns(vm) || listen_open(vm))
		goto err;
	if (sod_vm_layout(vm)) {
		unlink(vm->sock_path);
		goto err;
	}
	SOD_LOG("%s: serving, epoch %u, %u queue(s) of %u, region %zu bytes, netns %s", vm->name,
		vm->epoch, vm->nr_queues, vm->entries, vm->region_size,
		vm->netns[0] ? vm->netns : "(the daemon's own)");
	return 0;

err:
	if (vm->listen_fd >= 0)
		close(vm->listen_fd);
	vm->listen_fd = -1;
	unmap_all(vm);
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
	epoll_ctl(sod.epfd, EPOLL_CTL_DEL, vm->client_fd, NULL);
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
	/*
	 * Parked requests get their final completion, then the sockets close;
	 * a guest that is not attached any more gets nothing written.
	 */
	sod_vm_drop_sockets(vm, sod_guest_live(vm) ? -ESHUTDOWN : 0);
	sod_kick(vm);
	client_drop(vm);
	if (vm->listen_fd >= 0) {
		close(vm->listen_fd);
		/*
		 * The confined worker may not unlink (its seccomp filter): the stale
		 * name refuses connections and the next start replaces it.
		 */
		if (!sod.sandboxed)
			unlink(vm->sock_path);
	}
	vm->listen_fd = -1;
	if (vm->hdr) {
		uint32_t qi;

		for (qi = 0; qi < vm->nr_queues; qi++)
			__atomic_store_n(&vm->q[qi].ctl->host_polling, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&vm->hdr->host_state, KBP_SO_HOST_DOWN, __ATOMIC_RELEASE);
	}
	unmap_all(vm);
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

	for (qi = 0; qi < vm->nr_queues; qi++) {
		struct sod_queue *q = &vm->q[qi];

		q->doorbell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		q->irq_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (q->doorbell_fd < 0 || q->irq_fd < 0)
			return -1;
		if (sod_epoll_set(q->doorbell_fd, EPOLLIN, &q->ev, true))
			return -1;
	}
	if (send_msg(fd, 0, -1) || send_msg(fd, SOD_GUEST_ID, -1) || send_msg(fd, -1, vm->qemu_fd))
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

/* QEMU's option values double a comma */
static int qemu_val(char *dst, size_t size, const char *prefix, const char *path,
		    const char *suffix)
{
	size_t n = 0;
	const char *s;
	int k = snprintf(dst, size, "%s", prefix);

	if (k < 0 || (size_t)k >= size)
		return -1;
	n = (size_t)k;
	for (s = path; *s; s++) {
		if (n + 3 >= size)
			return -1;
		dst[n++] = *s;
		if (*s == ',')
			dst[n++] = ',';
	}
	dst[n] = 0;
	k = snprintf(dst + n, size - n, "%s", suffix);
	return k < 0 || (size_t)k >= size - n ? -1 : 0;
}

/* one word of a shell command line, single-quoted when it needs to be */
static int shell_word(char **p, char *end, const char *arg)
{
	bool quote = !*arg;
	const char *s;
	int n;

	for (s = arg; *s; s++) {
		if (*s == '\'')
			return -1;
		if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
			    "0123456789_,.=/:+@%-", *s))
			quote = true;
	}
	n = snprintf(*p, (size_t)(end - *p), "%s%s%s ", quote ? "'" : "", arg, quote ? "'" : "");
	if (n < 0 || n >= end - *p)
		return -1;
	*p += n;
	return 0;
}

/* The QEMU arguments this VM needs, one line (--qemu-args). */
int sod_qemu_args(const struct sod_vm *vm, char *buf, size_t size)
{
	char *p = buf, *end = buf + size, tail[64], mem[1024], chardev[600], dev[64];
	uint64_t bytes = vm->ram_size_spec;
	struct stat st;

	if (!bytes) {
		if (stat(vm->ram_path, &st) || st.st_size <= 0) {
			SOD_LOG("%s: --qemu-args: no ram-size= and no RAM file %s to take the size "
				"from", vm->name, vm->ram_path);
			return -1;
		}
		bytes = (uint64_t)st.st_size;
	}
	if (bytes % (1 << 20) == 0)
		snprintf(tail, sizeof(tail), ",share=on,size=%" PRIu64 "M", bytes >> 20);
	else
		snprintf(tail, sizeof(tail), ",share=on,size=%" PRIu64, bytes);
	snprintf(dev, sizeof(dev), "ivshmem-doorbell,chardev=kbpso,vectors=%u", vm->nr_queues);
	if (qemu_val(mem, sizeof(mem), "memory-backend-file,id=kbpram,mem-path=", vm->ram_path,
		     tail) ||
	    qemu_val(chardev, sizeof(chardev), "socket,path=", vm->sock_path, ",id=kbpso") ||
	    shell_word(&p, end, "-object") || shell_word(&p, end, mem) ||
	    shell_word(&p, end, "-machine") || shell_word(&p, end, "memory-backend=kbpram") ||
	    shell_word(&p, end, "-chardev") || shell_word(&p, end, chardev) ||
	    shell_word(&p, end, "-device") || shell_word(&p, end, dev)) {
		SOD_LOG("%s: --qemu-args: a path QEMU or the shell cannot take", vm->name);
		return -1;
	}
	p[-1] = '\n';
	return 0;
}
