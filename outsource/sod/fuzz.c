// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod-fuzz: the concurrent-mutation fuzzer of kbp-sod (issue 37).
 *
 * One process, three threads, one VM of the daemon's own code (vm.c,
 * ring.c; built with ASan and UBSan at -O0 and at -O2):
 *   - the daemon thread serves the VM as a worker does (poll mode: every
 *     queue every pass, host sockets' events, the timer's retry), and every
 *     ~50 ms lays the region out again as a restarted daemon does, checking
 *     that every queue pointer is where its own constants say (item 6);
 *   - a guest thread attaches (the reset handshake) and submits plausible
 *     requests on both queues: sockets, binds, sends to its own ports,
 *     parked receives (with rxmeta), polls, cancels, closes, options;
 *   - a mutator thread rewrites, at full speed and at the same time,
 *     submission entries (the slots being copied too), the header (the
 *     layout words, guest_state, guest_epoch, guest_gen, the host's words),
 *     the queues' control blocks and completions, and guest RAM.
 * The RAM map has holes (file ranges no guest-physical address reaches),
 * filled with a pattern that must survive: a write outside the map is a
 * finding as much as a sanitizer report or a moved pointer.
 *
 * It runs in a network namespace of its own (only lo: whatever address a
 * mutated entry names, nothing leaves the machine).
 *
 *   kbp-sod-fuzz [--seconds N] [--seed N]
 * Exit 0 with a line of counts; 1 and the reason on a finding.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "sod.h"

struct sod sod = { .epfd = -1, .stop_fd = -1, .notify_fd = -1, .allow_host_netns = true };

#ifdef __OPTIMIZE__
#define OPT_NAME "-O2"
#else
#define OPT_NAME "-O0"
#endif

#define QUEUES		2
#define ENTRIES		32
#define RAM_BYTES	(2u << 20)
#define GUARD		0xC5
/* guest-physical [0, 512K) and [1M, 1.5M); file [512K, 1M) and [1.5M, 2M) unreachable */
#define RAM_MAP		"0:0x80000:0+0x100000:0x80000:0x100000"

static atomic_bool stop;
static uint8_t *g_region;	/* the guest's (and mutator's) mapping of the region */
static size_t g_region_size;
static uint8_t *g_ram;		/* theirs of the RAM file */
static atomic_ulong mutations, submissions, datagrams, acks;
/* the daemon is about to lay the region out: the mutator hammers the layout words */
static atomic_int layout_phase, hammering;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static uint32_t rnd(uint64_t *s, uint32_t n)
{
	return n ? (uint32_t)(rng_next(s) % n) : 0;
}

static void die(const char *fmt, const char *what)
{
	printf("kbp-sod-fuzz %s: FINDING: ", OPT_NAME);
	printf(fmt, what);
	printf("\n");
	fflush(stdout);
	exit(1);
}

/* ---- the guest ---------------------------------------------------------------- */

static struct kbp_so_header *gh(void)
{
	return (struct kbp_so_header *)g_region;
}

/* the guest's layout: the ABI's, from its own constants (as the module checks them) */
static uint8_t *gq(uint32_t q)
{
	return g_region + KBP_SO_HEADER_SIZE + (size_t)q * kbp_so_queue_bytes(ENTRIES);
}

static struct kbp_so_queue_ctl *gctl(uint32_t q)
{
	return (struct kbp_so_queue_ctl *)gq(q);
}

static struct kbp_so_sqe *gsq(uint32_t q)
{
	return (struct kbp_so_sqe *)(gq(q) + KBP_SO_QCTL_SIZE);
}

static struct kbp_so_cqe *gcq(uint32_t q)
{
	return (struct kbp_so_cqe *)(gq(q) + KBP_SO_QCTL_SIZE +
				     ENTRIES * sizeof(struct kbp_so_sqe));
}

struct guest {
	uint64_t rng;
	uint32_t sq_tail[QUEUES], cq_head[QUEUES];
	uint32_t handles[32];
	uint16_t ports[32];
	uint32_t nh, np;
	uint64_t tag;
	uint32_t epoch;
	int udp;		/* sends datagrams to the VM's bound ports */
};

static bool attach(struct guest *g)
{
	struct kbp_so_header *h = gh();
	uint32_t gen = __atomic_load_n(&h->guest_gen, __ATOMIC_RELAXED) + 1;
	int i;

	__atomic_store_n(&h->guest_state, KBP_SO_GUEST_RESET, __ATOMIC_RELEASE);
	__atomic_store_n(&h->guest_gen, gen, __ATOMIC_RELEASE);
	for (i = 0; i < 2000 && !stop; i++) {
		if (__atomic_load_n(&h->host_ack_gen, __ATOMIC_ACQUIRE) == gen)
			break;
		usleep(25);
	}
	if (__atomic_load_n(&h->host_ack_gen, __ATOMIC_ACQUIRE) != gen)
		return false;
	acks++;
	memset(g->sq_tail, 0, sizeof(g->sq_tail));
	memset(g->cq_head, 0, sizeof(g->cq_head));
	g->nh = g->np = 0;
	g->epoch = __atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE);
	__atomic_store_n(&h->guest_epoch, g->epoch, __ATOMIC_RELEASE);
	__atomic_store_n(&h->guest_state, KBP_SO_GUEST_ATTACHED, __ATOMIC_RELEASE);
	return true;
}

static uint64_t gpa_rand(struct guest *g, uint32_t len)
{
	/* mostly inside the map, sometimes in a hole or past it */
	switch (rnd(&g->rng, 8)) {
	case 0:
		return 0x80000 - rnd(&g->rng, 64);	/* across the first hole */
	case 1:
		return 0x100000 + 0x80000 - rnd(&g->rng, 64);
	case 2:
		return rng_next(&g->rng);
	default:
		return (rnd(&g->rng, 2) ? 0x100000 : 0) + rnd(&g->rng, 0x80000 - len);
	}
}

static void fill(struct guest *g, struct kbp_so_sqe *e)
{
	uint32_t pick = rnd(&g->rng, 16), h = g->nh ? g->handles[rnd(&g->rng, g->nh)] : 0;
	uint32_t i, n;

	memset(e, 0, sizeof(*e));
	e->tag = ++g->tag;
	e->sock = h;
	switch (pick) {
	case 0: case 1:
		e->op = KBP_SO_OP_SOCKET;
		e->sock = 0;
		e->arg0 = rnd(&g->rng, 2) ? KBP_SO_AF_INET : KBP_SO_AF_INET6;
		break;
	case 2:
		e->op = KBP_SO_OP_BIND;
		e->addr.family = KBP_SO_AF_INET;
		e->addr.addr[0] = 127;
		e->addr.addr[3] = 1;
		break;
	case 3: case 4: {
		uint32_t len = 1 + rnd(&g->rng, 2000);

		e->op = KBP_SO_OP_SENDMSG;
		e->nr_segs = 1;
		e->seg[0].gpa = gpa_rand(g, len);
		e->seg[0].len = len;
		e->addr.family = KBP_SO_AF_INET;
		e->addr.addr[0] = 127;
		e->addr.addr[3] = 1;
		e->addr.port = g->np ? htons(g->ports[rnd(&g->rng, g->np)]) : htons(9);
		if (rnd(&g->rng, 4) == 0) {
			e->msg_flags |= KBP_SO_MSG_TOS;
			e->arg0 = rnd(&g->rng, 300);
		}
		if (rnd(&g->rng, 4) == 0) {
			e->msg_flags |= KBP_SO_MSG_SRC;
			e->opt[0] = 127;
			e->opt[3] = (uint8_t)(1 + rnd(&g->rng, 3));
		}
		break;
	}
	case 5: case 6: case 7:
		e->op = KBP_SO_OP_RECVMSG;
		e->flags = rnd(&g->rng, 3) ? KBP_SO_F_WAIT : 0;
		n = 1 + rnd(&g->rng, 4);
		e->nr_segs = (uint8_t)n;
		for (i = 0; i < n; i++) {
			e->seg[i].len = 1 + rnd(&g->rng, 3000);
			e->seg[i].gpa = gpa_rand(g, e->seg[i].len);
		}
		if (rnd(&g->rng, 2)) {
			e->flags |= KBP_SO_F_META;
			e->arg1 = gpa_rand(g, 64);
		}
		if (rnd(&g->rng, 5) == 0)
			e->msg_flags = KBP_SO_MSG_PEEK | KBP_SO_MSG_TRUNC;
		break;
	case 8:
		e->op = KBP_SO_OP_POLL;
		e->flags = rnd(&g->rng, 2) ? KBP_SO_F_ARM : 0;
		e->arg1 = 1 + rnd(&g->rng, 15);
		break;
	case 9:
		e->op = KBP_SO_OP_CANCEL;
		e->arg1 = g->tag - 1 - rnd(&g->rng, 8);
		break;
	case 10:
		e->op = KBP_SO_OP_CLOSE;
		break;
	case 11:
		e->op = rnd(&g->rng, 2) ? KBP_SO_OP_GETSOCKOPT : KBP_SO_OP_SETSOCKOPT;
		e->arg0 = rnd(&g->rng, KBP_SO_OPT_MAX + 2);
		e->opt[0] = (uint8_t)rnd(&g->rng, 8);
		if (e->op == KBP_SO_OP_GETSOCKOPT)
			e->opt[0] = 0;
		break;
	case 12:
		e->op = KBP_SO_OP_SHUTDOWN;
		e->arg0 = rnd(&g->rng, 3);
		break;
	case 13:
		e->op = KBP_SO_OP_GETNAME;
		e->arg0 = rnd(&g->rng, 2);
		break;
	case 14:
		e->op = KBP_SO_OP_CONNECT;
		e->addr.family = rnd(&g->rng, 3) ? KBP_SO_AF_INET : 0;
		if (e->addr.family) {
			e->addr.addr[0] = 127;
			e->addr.addr[3] = 1;
			e->addr.port = g->np ? htons(g->ports[rnd(&g->rng, g->np)]) : htons(7);
		}
		break;
	default: {	/* junk */
		uint8_t *b = (uint8_t *)e;

		for (i = 0; i < sizeof(*e); i += 8) {
			uint64_t v = rng_next(&g->rng);

			memcpy(b + i, &v, 8);
		}
		e->addr.family = 0;	/* no address at all: never off the lo anyway */
		break;
	}
	}
}

static void reap(struct guest *g, uint32_t q)
{
	struct kbp_so_queue_ctl *c = gctl(q);
	uint32_t tail = __atomic_load_n(&c->cq_tail, __ATOMIC_ACQUIRE);
	uint32_t n = 0;

	while (g->cq_head[q] != tail && n++ < ENTRIES) {
		struct kbp_so_cqe e;

		memcpy(&e, &gcq(q)[g->cq_head[q] & (ENTRIES - 1)], sizeof(e));
		g->cq_head[q]++;
		if (e.op == KBP_SO_OP_SOCKET && e.res == 0 && g->nh < 32)
			g->handles[g->nh++] = e.sock;
		if (e.op == KBP_SO_OP_BIND && e.res == 0 && e.addr.family == KBP_SO_AF_INET &&
		    g->np < 32)
			g->ports[g->np++] = ntohs(e.addr.port);
	}
	__atomic_store_n(&c->cq_head, g->cq_head[q], __ATOMIC_RELEASE);
}

static void *guest_main(void *arg)
{
	struct guest *g = arg;
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
	char payload[1500];

	memset(payload, 0x42, sizeof(payload));
	while (!stop) {
		struct kbp_so_header *h = gh();
		uint32_t q, k;

		if (__atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE) != g->epoch ||
		    __atomic_load_n(&h->guest_state, __ATOMIC_RELAXED) != KBP_SO_GUEST_ATTACHED ||
		    __atomic_load_n(&h->guest_epoch, __ATOMIC_RELAXED) != g->epoch ||
		    __atomic_load_n(&gctl(0)->host_error, __ATOMIC_RELAXED) ||
		    __atomic_load_n(&gctl(1)->host_error, __ATOMIC_RELAXED) ||
		    rnd(&g->rng, 400) == 0 || g->nh >= 32) {
			if (!attach(g)) {
				usleep(200);
				continue;
			}
		}
		for (q = 0; q < QUEUES; q++) {
			struct kbp_so_queue_ctl *c = gctl(q);
			uint32_t head = __atomic_load_n(&c->sq_head, __ATOMIC_ACQUIRE);

			reap(g, q);
			for (k = rnd(&g->rng, 6); k && g->sq_tail[q] - head < ENTRIES; k--) {
				struct kbp_so_sqe e;

				fill(g, &e);
				memcpy(&gsq(q)[g->sq_tail[q] & (ENTRIES - 1)], &e, sizeof(e));
				g->sq_tail[q]++;
				submissions++;
			}
			__atomic_store_n(&c->sq_tail, g->sq_tail[q], __ATOMIC_RELEASE);
			__atomic_store_n(&c->need_irq, rnd(&g->rng, 4), __ATOMIC_RELAXED);
		}
		if (g->np && g->udp >= 0) {
			to.sin_port = htons(g->ports[rnd(&g->rng, g->np)]);
			if (sendto(g->udp, payload, 1 + rnd(&g->rng, sizeof(payload)), MSG_DONTWAIT,
				   (struct sockaddr *)&to, sizeof(to)) >= 0)
				datagrams++;
		}
		sched_yield();
	}
	return NULL;
}

/* ---- the mutator ---------------------------------------------------------------- */

static void *mutator_main(void *arg)
{
	uint64_t rng = *(uint64_t *)arg;
	const uint32_t words[] = {
		offsetof(struct kbp_so_header, queue_offset),
		offsetof(struct kbp_so_header, queue_stride),
		offsetof(struct kbp_so_header, nr_queues),
		offsetof(struct kbp_so_header, ring_entries),
		offsetof(struct kbp_so_header, guest_state),
		offsetof(struct kbp_so_header, guest_epoch),
		offsetof(struct kbp_so_header, guest_gen),
		offsetof(struct kbp_so_header, host_ack_gen),
		offsetof(struct kbp_so_header, heartbeat),
		offsetof(struct kbp_so_header, max_sockets),
		offsetof(struct kbp_so_header, region_size),
	};
	const uint32_t vals[] = { 0, 1, 2, 3, KBP_SO_HEADER_SIZE, 0x7ffff000, 0xfffff000,
				  0x80000000, 0xffffffff, 64, 1024 };

	while (!stop) {
		uint32_t what = rnd(&rng, 100), q = rnd(&rng, QUEUES), v;
		uint8_t *p;

		if (layout_phase) {
			uint32_t *off = (uint32_t *)(g_region +
						     offsetof(struct kbp_so_header, queue_offset));
			uint32_t *stride = (uint32_t *)(g_region +
							offsetof(struct kbp_so_header, queue_stride));

			hammering = 1;
			while (layout_phase) {
				__atomic_store_n(off, 0x7ffff000u, __ATOMIC_RELAXED);
				__atomic_store_n(stride, 0xfffff000u, __ATOMIC_RELAXED);
				mutations += 2;
			}
			hammering = 0;
			continue;
		}
		/* bursts, then a pause: the guest gets some requests through */
		if (rnd(&rng, 16) == 0) {
			struct timespec ts = { 0, 1000 * (long)rnd(&rng, 40) };

			nanosleep(&ts, NULL);
		}
		if (what < 60) {
			/* an SQ slot, often the one the daemon copies next */
			struct kbp_so_queue_ctl *c = gctl(q);
			uint32_t slot = rnd(&rng, 2) ? __atomic_load_n(&c->sq_head, __ATOMIC_RELAXED)
						     : rnd(&rng, ENTRIES);
			uint32_t off = rnd(&rng, sizeof(struct kbp_so_sqe) - 8);

			p = (uint8_t *)&gsq(q)[slot & (ENTRIES - 1)] + off;
			v = rnd(&rng, 4) ? vals[rnd(&rng, sizeof(vals) / 4)] : (uint32_t)rng_next(&rng);
			switch (rnd(&rng, 3)) {
			case 0:
				__atomic_store_n(p, (uint8_t)v, __ATOMIC_RELAXED);
				break;
			default: {
				uint64_t w = rnd(&rng, 2) ? v : rng_next(&rng);

				memcpy(p, &w, 8);
				break;
			}
			}
		} else if (what < 65) {
			/* the layout words mostly: what a restarting daemon must not read */
			uint32_t off = words[rnd(&rng, 3) ? rnd(&rng, 4) : rnd(&rng, sizeof(words) / 4)];

			v = rnd(&rng, 3) ? vals[rnd(&rng, sizeof(vals) / 4)] : (uint32_t)rng_next(&rng);
			if (off == offsetof(struct kbp_so_header, guest_state) && rnd(&rng, 4))
				v = rnd(&rng, 3);	/* mostly ABSENT, RESET, ATTACHED */
			__atomic_store_n((uint32_t *)(g_region + off), v, __ATOMIC_RELAXED);
		} else if (what < 75) {
			/* the control block: both halves (the guest may write the host's too) */
			uint32_t off = rnd(&rng, sizeof(struct kbp_so_queue_ctl) / 4) * 4;
			uint32_t cur = __atomic_load_n((uint32_t *)((uint8_t *)gctl(q) + off),
						       __ATOMIC_RELAXED);

			v = rnd(&rng, 2) ? cur + rnd(&rng, 3) - 1 : (uint32_t)rng_next(&rng);
			/* rarely the guest's indices: those stop a queue until the next reset */
			if (off < 8 && rnd(&rng, 8))
				continue;
			__atomic_store_n((uint32_t *)((uint8_t *)gctl(q) + off), v, __ATOMIC_RELAXED);
		} else if (what < 85) {
			uint32_t off = rnd(&rng, ENTRIES * sizeof(struct kbp_so_cqe) - 8);
			uint64_t w = rng_next(&rng);

			memcpy((uint8_t *)gcq(q) + off, &w, 8);
		} else {
			/* guest RAM inside the map (the holes are the daemon's to leave alone) */
			uint32_t off = (rnd(&rng, 2) ? 0x100000 : 0) + rnd(&rng, 0x80000 - 8);
			uint64_t w = rng_next(&rng);

			memcpy(g_ram + off, &w, 8);
		}
		mutations++;
	}
	return NULL;
}

/* ---- the daemon ------------------------------------------------------------------ */

static void check_layout(struct sod_vm *vm)
{
	uint32_t qi;

	for (qi = 0; qi < vm->nr_queues; qi++) {
		uint8_t *base = (uint8_t *)vm->hdr + KBP_SO_HEADER_SIZE +
				(size_t)qi * kbp_so_queue_bytes(vm->entries);

		if ((uint8_t *)vm->q[qi].ctl != base ||
		    (uint8_t *)vm->q[qi].sq != base + KBP_SO_QCTL_SIZE ||
		    (uint8_t *)vm->q[qi].cq != base + KBP_SO_QCTL_SIZE +
					       vm->entries * sizeof(struct kbp_so_sqe))
			die("%s", "a queue pointer moved at layout (the header was re-read)");
	}
}

static void check_state(struct sod_vm *vm)
{
	uint32_t qi;

	for (qi = 0; qi < vm->nr_queues; qi++)
		if (vm->q[qi].inflight > vm->entries)
			die("%s", "a queue's in-flight count is out of range");
	if (vm->nr_socks > vm->max_sockets)
		die("%s", "more sockets than max-sockets");
}

static void check_guard(const uint8_t *ram)
{
	size_t i;

	for (i = 0x80000; i < 0x100000; i++)
		if (ram[i] != GUARD)
			die("%s", "a write into the RAM file outside the RAM map (first hole)");
	for (i = 0x180000; i < RAM_BYTES; i++)
		if (ram[i] != GUARD)
			die("%s", "a write into the RAM file outside the RAM map (second hole)");
}

static int own_netns(void)
{
	struct ifreq ifr;
	int fd;

	if (unshare(CLONE_NEWNET) && unshare(CLONE_NEWUSER | CLONE_NEWNET)) {
		fprintf(stderr, "kbp-sod-fuzz: needs a network namespace of its own "
			"(root, or unprivileged user namespaces): %s\n", strerror(errno));
		return -1;
	}
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
		ifr.ifr_flags |= IFF_UP;
		ioctl(fd, SIOCSIFFLAGS, &ifr);
	}
	close(fd);
	return 0;
}

static double now_s(void)
{
	return (double)sod_now_ns() / 1e9;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seconds", required_argument, NULL, 's' },
		{ "seed", required_argument, NULL, 'S' },
		{ "no-mutator", no_argument, NULL, 'n' },
		{ 0 }
	};
	double seconds = 5, t0, next_layout, next_retry, next_guard;
	uint64_t seed = 0x4b4250534f44ULL, passes = 0, relayouts = 0;
	char dir[] = "/tmp/kbp-sod-fuzz.XXXXXX", spec[1024], path[300];
	struct sod_vm *vm = &sod.vms[0];
	struct guest g = { .udp = -1 };
	pthread_t gt, mt;
	bool mutate = true;
	int c, fd;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 's')
			seconds = atof(argv[optind - 1]);
		else if (c == 'S')
			seed = strtoull(argv[optind - 1], NULL, 0) | 1;
		else if (c == 'n')
			mutate = false;
		else
			return 2;
	}
	if (seconds <= 0 || own_netns() || !mkdtemp(dir))
		return 2;
	snprintf(path, sizeof(path), "%s/ram", dir);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, RAM_BYTES))
		return 2;
	g_ram = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (g_ram == MAP_FAILED)
		return 2;
	memset(g_ram, GUARD, RAM_BYTES);
	close(fd);

	snprintf(spec, sizeof(spec), "name=fuzz,region=%s/region,socket=%s/sock,ram=%s,ram-map="
		 RAM_MAP ",queues=%d,entries=%d,max-sockets=16,budget=8", dir, dir, path,
		 QUEUES, ENTRIES);
	sod_vm_defaults(vm);
	vm->poll_mode = true;
	if (sod_vm_parse(vm, spec) || sod_vm_check(vm))
		return 2;
	sod.quiet = !getenv("KBP_SOD_FUZZ_LOG");
	sod.nr_vms = 1;
	sod.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sod.epfd < 0 || sod_vm_open(vm))
		return 2;
	sod_vm_reset_queues(vm);
	snprintf(path, sizeof(path), "%s/region", dir);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 2;
	g_region_size = vm->region_size;
	g_region = mmap(NULL, g_region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (g_region == MAP_FAILED)
		return 2;
	g.rng = seed * 3 + 1;
	g.udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (pthread_create(&gt, NULL, guest_main, &g) ||
	    (mutate && pthread_create(&mt, NULL, mutator_main, &seed)))
		return 2;

	t0 = now_s();
	next_layout = t0 + 0.05;
	next_retry = t0 + 0.1;
	next_guard = t0 + 0.5;
	while (now_s() - t0 < seconds) {
		struct epoll_event evs[16];
		int i, n = epoll_wait(sod.epfd, evs, 16, 0);
		double t;

		for (i = 0; i < n; i++) {
			struct sod_ev *ev = evs[i].data.ptr;

			if (ev->type == SOD_EV_SOCK) {
				sod_sock_event(ev->vm, ev->idx);
				sod_kick(ev->vm);
			}
		}
		sod_vm_service(vm);
		sod_heartbeat(vm, false);
		check_state(vm);
		passes++;
		t = now_s();
		if (t >= next_retry) {
			sod_vm_retry_parked(vm);
			next_retry = t + 0.1;
		}
		if (t >= next_layout) {
			/* a restarted daemon: every socket gone, a new epoch, the queues zeroed */
			sod_vm_drop_sockets(vm, 0);
			vm->old_epoch = vm->epoch;
			if (mutate) {
				double until = now_s() + 0.002;

				layout_phase = 1;
				while (!hammering && now_s() < until)
					;
			}
			if (sod_vm_layout(vm))
				die("%s", "layout failed");
			layout_phase = 0;
			check_layout(vm);
			sod_vm_reset_queues(vm);
			relayouts++;
			next_layout = t + 0.05;
		}
		if (t >= next_guard) {
			check_guard(g_ram);
			next_guard = t + 0.5;
		}
	}
	stop = true;
	pthread_join(gt, NULL);
	if (mutate)
		pthread_join(mt, NULL);
	sod_vm_close(vm);
	check_guard(g_ram);
	close(sod.epfd);
	if (g.udp >= 0)
		close(g.udp);
	munmap(g_region, g_region_size);
	munmap(g_ram, RAM_BYTES);
	snprintf(path, sizeof(path), "%s/ram", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/region", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/sock", dir);
	unlink(path);
	rmdir(dir);
	printf("kbp-sod-fuzz %s: %.1f s, seed %#llx: mutator writes %lu, daemon passes %llu, "
	       "requests %llu (rejected %llu, completed %llu, dropped %llu), relayouts %llu, "
	       "guest resets acked %lu, guest submissions %lu, datagrams %lu: no finding\n",
	       OPT_NAME, now_s() - t0, (unsigned long long)seed, (unsigned long)mutations,
	       (unsigned long long)passes, (unsigned long long)vm->total_requests,
	       (unsigned long long)vm->total_rejects, (unsigned long long)vm->total_completions,
	       (unsigned long long)vm->total_drops, (unsigned long long)relayouts,
	       (unsigned long)acks, (unsigned long)submissions, (unsigned long)datagrams);
	return 0;
}
