// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: serves the outsourced UDP sockets of guests (docs/design.md, 11).
 *
 *   kbp-sod [--poll] [--rt-prio N] --vm SPEC [--vm SPEC ...]
 *
 * SPEC: name=N,region=PATH,socket=PATH,ram=PATH[,ram-map=GPA:LEN:OFF[+...]]
 *       [,queues=N][,entries=N][,netns=NAME][,max-sockets=N]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>

#include "sod.h"

struct sod sod;

static void usage(void)
{
	fprintf(stderr,
		"usage: kbp-sod [--poll] [--rt-prio N] --vm SPEC [--vm SPEC ...]\n"
		"SPEC: name=N,region=PATH,socket=PATH,ram=PATH"
		"[,ram-map=GPA:LEN:OFF[+...]][,queues=N][,entries=N]"
		"[,netns=NAME][,max-sockets=N]\n");
}

static int timer_open(struct sod_ev *ev)
{
	struct itimerspec its = {
		.it_interval = { 0, KBP_SO_HEARTBEAT_MS * 1000000L },
		.it_value = { 0, KBP_SO_HEARTBEAT_MS * 1000000L },
	};
	int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);

	if (fd < 0)
		return -1;
	if (timerfd_settime(fd, 0, &its, NULL) || sod_epoll_set(fd, EPOLLIN, ev, true)) {
		close(fd);
		return -1;
	}
	return fd;
}

static int signal_open(struct sod_ev *ev)
{
	sigset_t set;
	int fd;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (sigprocmask(SIG_BLOCK, &set, NULL))
		return -1;
	fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (fd < 0)
		return -1;
	if (sod_epoll_set(fd, EPOLLIN, ev, true)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void drain(int fd)
{
	uint64_t v;

	while (read(fd, &v, sizeof(v)) == sizeof(v))
		;
}

static void tick(void)
{
	int i;

	for (i = 0; i < sod.nr_vms; i++) {
		struct sod_vm *vm = &sod.vms[i];

		__atomic_store_n(&vm->hdr->heartbeat, vm->hdr->heartbeat + 1, __ATOMIC_RELEASE);
		/* a lost doorbell or socket wakeup costs at most one tick */
		sod_vm_service(vm);
		sod_vm_retry_parked(vm);
	}
}

static void dispatch(struct epoll_event *e, int timer_fd, int sig_fd)
{
	struct sod_ev *ev = e->data.ptr;
	struct sod_vm *vm = ev->vm;

	switch (ev->type) {
	case SOD_EV_LISTEN:
		sod_vm_accept(vm);
		break;
	case SOD_EV_CLIENT:
		sod_vm_client_event(vm, e->events);
		break;
	case SOD_EV_DOORBELL:
		drain(vm->q[ev->idx].doorbell_fd);
		__atomic_store_n(&vm->q[ev->idx].ctl->doorbells,
				 vm->q[ev->idx].ctl->doorbells + 1, __ATOMIC_RELAXED);
		sod_vm_service(vm);
		break;
	case SOD_EV_SOCK:
		sod_sock_event(vm, ev->idx);
		sod_kick(vm);
		break;
	case SOD_EV_TIMER:
		drain(timer_fd);
		tick();
		break;
	case SOD_EV_SIGNAL: {
		struct signalfd_siginfo si;

		while (read(sig_fd, &si, sizeof(si)) == sizeof(si))
			sod.stop = true;
		break;
	}
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "vm", required_argument, NULL, 'v' },
		{ "poll", no_argument, NULL, 'p' },
		{ "rt-prio", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	struct sod_ev timer_ev = { .type = SOD_EV_TIMER };
	struct sod_ev sig_ev = { .type = SOD_EV_SIGNAL };
	struct epoll_event evs[64];
	int rt_prio = 0, timer_fd, sig_fd, c, i, ret = 1;

	signal(SIGPIPE, SIG_IGN);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'v':
			if (sod.nr_vms == SOD_MAX_VMS ||
			    sod_vm_parse(&sod.vms[sod.nr_vms], optarg)) {
				fprintf(stderr, "kbp-sod: bad --vm %s\n", optarg);
				usage();
				return 2;
			}
			sod.nr_vms++;
			break;
		case 'p':
			sod.poll_mode = true;
			break;
		case 'r':
			rt_prio = atoi(optarg);
			if (rt_prio < 1 || rt_prio > 99) {
				usage();
				return 2;
			}
			break;
		default:
			usage();
			return c == 'h' ? 0 : 2;
		}
	}
	if (!sod.nr_vms || optind != argc) {
		usage();
		return 2;
	}
	if (rt_prio) {
		struct sched_param sp = { .sched_priority = rt_prio };

		if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
			fprintf(stderr, "kbp-sod: SCHED_FIFO %d: %s\n", rt_prio, strerror(errno));
			return 1;
		}
	}
	sod.self_netns_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	sod.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sod.self_netns_fd < 0 || sod.epfd < 0) {
		perror("kbp-sod");
		return 1;
	}
	sig_fd = signal_open(&sig_ev);
	timer_fd = timer_open(&timer_ev);
	if (sig_fd < 0 || timer_fd < 0) {
		perror("kbp-sod: timer/signal");
		goto out_fds;
	}
	for (i = 0; i < sod.nr_vms; i++) {
		if (sod_vm_open(&sod.vms[i])) {
			while (--i >= 0)
				sod_vm_close(&sod.vms[i]);
			goto out_fds;
		}
		sod_vm_reset_queues(&sod.vms[i]);
	}
	SOD_LOG("ready");
	fflush(stderr);

	while (!sod.stop) {
		int n = epoll_wait(sod.epfd, evs, 64, sod.poll_mode ? 0 : -1);

		if (n < 0 && errno != EINTR) {
			perror("kbp-sod: epoll_wait");
			break;
		}
		for (c = 0; c < n; c++)
			dispatch(&evs[c], timer_fd, sig_fd);
		if (sod.poll_mode)
			for (i = 0; i < sod.nr_vms; i++)
				sod_vm_service(&sod.vms[i]);
	}
	ret = sod.stop ? 0 : 1;
	for (i = 0; i < sod.nr_vms; i++)
		sod_vm_close(&sod.vms[i]);
	SOD_LOG("stopped");
out_fds:
	if (timer_fd >= 0)
		close(timer_fd);
	if (sig_fd >= 0)
		close(sig_fd);
	close(sod.epfd);
	close(sod.self_netns_fd);
	return ret;
}
