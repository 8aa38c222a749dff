// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-echo: the benchmark's epoll UDP echo server (part of kbp; built by `kbp.bench.tester`
 * at setup time, like kbp-rtt).
 *
 * The RT application of the benchmark mode irq-suspend: the kernel's IRQ suspension
 * (Linux 6.13, Documentation/networking/napi.rst "IRQ suspension") only takes effect for an
 * application that asks for it, through the busy-poll parameters of its epoll context
 * (EPIOCSPARAMS, Linux 6.9: prefer_busy_poll), which sockperf cannot do.  The structure follows
 * the kernel's own example, tools/testing/selftests/net/busy_poller.c: one non-blocking socket
 * in one epoll context, epoll_wait() drives the NAPI polling, each wake-up drains the socket.
 *
 * It binds IP:PORT, echoes every datagram back to its sender unchanged (recvmmsg/sendmmsg, so
 * sockperf's 14-byte header with the be64 sequence that kbp-rtt matches comes back as sent),
 * prints "ready" on stdout once bound and configured, and on SIGTERM or SIGINT exits 0 after a
 * one-line JSON summary.  The signals are blocked except inside epoll_pwait(), so one that
 * arrives between two waits is not lost.
 *
 * Options
 *   -i/--ip, -p/--port            where to listen
 *   -u/--busy-poll-usecs N        struct epoll_params.busy_poll_usecs
 *   -b/--busy-poll-budget N       struct epoll_params.busy_poll_budget (0: the kernel's 8)
 *   -P/--prefer-busy-poll 0|1     struct epoll_params.prefer_busy_poll
 *   -m/--max-events N             epoll_wait()'s maxevents
 *   -c/--cpu CPU, -f/--fifo PRIO  pin to CPU, run SCHED_FIFO PRIO (the benchmark places the
 *                                 server from outside instead, as it does sockperf)
 * The ioctl is made when any of -u, -b, -P is non-zero; a kernel without it is an error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * sys/epoll.h has no EPIOCSPARAMS on older glibc and linux/eventpoll.h cannot be included
 * with it (busy_poller.c does the same).
 */
#ifndef EPIOCSPARAMS
struct epoll_params {
	uint32_t busy_poll_usecs;
	uint16_t busy_poll_budget;
	uint8_t prefer_busy_poll;
	uint8_t __pad;		/* must be zero */
};

#define EPOLL_IOC_TYPE 0x8A
#define EPIOCSPARAMS _IOW(EPOLL_IOC_TYPE, 0x01, struct epoll_params)
#endif

#define BATCH 64
#define MAX_MSG 65536
#define MAX_EVENTS 64

struct opts {
	const char *ip;
	int port;
	unsigned long busy_poll_usecs;
	unsigned long busy_poll_budget;
	unsigned long prefer_busy_poll;
	int max_events;
	int cpu;
	int fifo;
};

static volatile sig_atomic_t stop_now;

static void on_signal(int sig)
{
	(void)sig;
	stop_now = 1;
}

static void die(const char *what)
{
	fprintf(stderr, "kbp-echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void usage(void)
{
	fprintf(stderr,
		"Usage: kbp-echo --ip IP --port PORT [--busy-poll-usecs N] [--busy-poll-budget N]\n"
		"                [--prefer-busy-poll 0|1] [--max-events N] [--cpu CPU] [--fifo PRIO]\n");
	exit(2);
}

static unsigned long number(const char *s, unsigned long max)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || end == s || *end || v > max)
		usage();
	return v;
}

static void place_self(const struct opts *o)
{
	if (o->cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(o->cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) < 0)
			die("sched_setaffinity");
	}
	if (o->fifo > 0) {
		struct sched_param sp = { .sched_priority = o->fifo };

		if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
			die("sched_setscheduler(SCHED_FIFO)");
	}
}

static int open_socket(const struct opts *o)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(o->port) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		die("socket");
	if (inet_pton(AF_INET, o->ip, &a.sin_addr) != 1) {
		fprintf(stderr, "kbp-echo: bad IPv4 address %s\n", o->ip);
		exit(2);
	}
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("bind");
	return fd;
}

static int open_epoll(const struct opts *o, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	int epfd = epoll_create1(EPOLL_CLOEXEC);

	if (epfd < 0)
		die("epoll_create1");
	if (o->busy_poll_usecs || o->busy_poll_budget || o->prefer_busy_poll) {
		struct epoll_params p = {
			.busy_poll_usecs = o->busy_poll_usecs,
			.busy_poll_budget = o->busy_poll_budget,
			.prefer_busy_poll = o->prefer_busy_poll,
		};

		if (ioctl(epfd, EPIOCSPARAMS, &p) < 0)
			die("ioctl(EPIOCSPARAMS) (needs Linux 6.9 and CONFIG_NET_RX_BUSY_POLL)");
	}
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll_ctl");
	return epfd;
}

static uint8_t bufs[BATCH][MAX_MSG];
static struct sockaddr_in peers[BATCH];
static struct iovec iovs[BATCH];
static struct mmsghdr msgs[BATCH];
static uint64_t n_rx, n_tx, n_wakeups, n_send_errors;

/* Echo what the socket holds now: each datagram back to its sender, unchanged. */
static void echo_all(int fd)
{
	for (;;) {
		int i, n, sent, done;

		for (i = 0; i < BATCH; i++) {
			iovs[i].iov_base = bufs[i];
			iovs[i].iov_len = MAX_MSG;
			memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
			msgs[i].msg_hdr.msg_name = &peers[i];
			msgs[i].msg_hdr.msg_namelen = sizeof(peers[i]);
			msgs[i].msg_hdr.msg_iov = &iovs[i];
			msgs[i].msg_hdr.msg_iovlen = 1;
		}
		n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
		if (n <= 0)
			return;		/* EAGAIN: drained */
		n_rx += n;
		for (i = 0; i < n; i++)
			iovs[i].iov_len = msgs[i].msg_len;
		for (done = 0; done < n; done += sent) {
			sent = sendmmsg(fd, msgs + done, n - done, 0);
			if (sent <= 0) {
				/* a full send buffer or an unreachable peer: drop the rest */
				n_send_errors += n - done;
				break;
			}
			n_tx += sent;
		}
		if (n < BATCH)
			return;
	}
}

static void serve(const struct opts *o, int fd, int epfd)
{
	struct epoll_event ev[MAX_EVENTS];
	sigset_t none;

	sigemptyset(&none);
	while (!stop_now) {
		int i, n = epoll_pwait(epfd, ev, o->max_events, -1, &none);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_pwait");
		}
		n_wakeups++;
		for (i = 0; i < n; i++)
			if (ev[i].data.fd == fd && (ev[i].events & EPOLLIN))
				echo_all(fd);
	}
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "ip", required_argument, 0, 'i' },
		{ "port", required_argument, 0, 'p' },
		{ "busy-poll-usecs", required_argument, 0, 'u' },
		{ "busy-poll-budget", required_argument, 0, 'b' },
		{ "prefer-busy-poll", required_argument, 0, 'P' },
		{ "max-events", required_argument, 0, 'm' },
		{ "cpu", required_argument, 0, 'c' },
		{ "fifo", required_argument, 0, 'f' },
		{ 0, 0, 0, 0 },
	};
	struct opts o = { .port = 11111, .max_events = 8, .cpu = -1 };
	struct sigaction sa = { .sa_handler = on_signal };
	sigset_t block;
	int c, fd, epfd;

	while ((c = getopt_long(argc, argv, "i:p:u:b:P:m:c:f:", lo, NULL)) != -1) {
		switch (c) {
		case 'i':
			o.ip = optarg;
			break;
		case 'p':
			o.port = number(optarg, 65535);
			break;
		case 'u':
			o.busy_poll_usecs = number(optarg, INT32_MAX);
			break;
		case 'b':
			o.busy_poll_budget = number(optarg, UINT16_MAX);
			break;
		case 'P':
			o.prefer_busy_poll = number(optarg, 1);
			break;
		case 'm':
			o.max_events = number(optarg, MAX_EVENTS);
			break;
		case 'c':
			o.cpu = number(optarg, CPU_SETSIZE - 1);
			break;
		case 'f':
			o.fifo = number(optarg, 99);
			break;
		default:
			usage();
		}
	}
	if (!o.ip || optind != argc || o.max_events < 1)
		usage();

	/* blocked except inside epoll_pwait(): a stop request is never missed */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	if (sigprocmask(SIG_BLOCK, &block, NULL) < 0)
		die("sigprocmask");
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	place_self(&o);
	fd = open_socket(&o);
	epfd = open_epoll(&o, fd);
	printf("ready\n");
	fflush(stdout);

	serve(&o, fd, epfd);

	printf("{\"received\": %llu, \"echoed\": %llu, \"send_errors\": %llu, ",
	       (unsigned long long)n_rx, (unsigned long long)n_tx,
	       (unsigned long long)n_send_errors);
	printf("\"wakeups\": %llu, \"busy_poll_usecs\": %lu, \"busy_poll_budget\": %lu, ",
	       (unsigned long long)n_wakeups, o.busy_poll_usecs, o.busy_poll_budget);
	printf("\"prefer_busy_poll\": %lu}\n", o.prefer_busy_poll);
	close(epfd);
	close(fd);
	return 0;
}
