// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: a worker's event loop, for its one VM (docs/design.md 11.6).
 *
 * One epoll set: the VM's server socket and QEMU connection, the doorbell
 * eventfds, the host sockets with parked requests, a 100 ms timerfd, a
 * signalfd (SIGTERM/SIGINT: clean stop) and, under a supervisor, its pipe.
 * Request work is served in passes: every queue gets at most `budget` SQEs
 * per pass, then the loop looks at its other events (epoll_wait with a
 * zero timeout while SQEs are left) and the heartbeat is written between
 * any two budgets, so neither a flooded queue nor a flooded socket delays
 * the other queues, the sockets or the heartbeat by more than one budget.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include "sod.h"

static int timer_fd = -1, sig_fd = -1;
static struct sod_ev timer_ev = { .type = SOD_EV_TIMER };
static struct sod_ev sig_ev = { .type = SOD_EV_SIGNAL };
static struct sod_ev stop_ev = { .type = SOD_EV_STOP };

/* systemd's sd_notify(), on the socket main.c connected before the sandbox */
void sod_notify(const char *msg)
{
	if (sod.notify_fd >= 0)
		(void)!send(sod.notify_fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void drain(int fd)
{
	uint64_t v;

	while (read(fd, &v, sizeof(v)) == sizeof(v))
		;
}

/* The loop's own fds; made before the worker confines itself (no timerfd_create after). */
int sod_loop_init(struct sod_vm *vm)
{
	struct itimerspec its = {
		.it_interval = { 0, KBP_SO_HEARTBEAT_MS * 1000000L },
		.it_value = { 0, KBP_SO_HEARTBEAT_MS * 1000000L },
	};
	sigset_t set;

	timer_ev.vm = sig_ev.vm = stop_ev.vm = vm;
	timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (timer_fd < 0 || timerfd_settime(timer_fd, 0, &its, NULL) ||
	    sod_epoll_set(timer_fd, EPOLLIN, &timer_ev, true))
		return -1;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (sigprocmask(SIG_BLOCK, &set, NULL))
		return -1;
	sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0 || sod_epoll_set(sig_fd, EPOLLIN, &sig_ev, true))
		return -1;
	if (sod.stop_fd >= 0 && sod_epoll_set(sod.stop_fd, EPOLLIN, &stop_ev, true))
		return -1;
	return 0;
}

void sod_loop_fini(void)
{
	if (timer_fd >= 0)
		close(timer_fd);
	if (sig_fd >= 0)
		close(sig_fd);
	timer_fd = sig_fd = -1;
}

/* returns true when the VM's queues want a pass */
static bool dispatch(struct epoll_event *e)
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
	case SOD_EV_DOORBELL: {
		struct sod_queue *q = &vm->q[ev->idx];

		drain(q->doorbell_fd);
		q->cnt.doorbells++;
		__atomic_store_n(&q->ctl->doorbells, q->cnt.doorbells, __ATOMIC_RELAXED);
		return true;
	}
	case SOD_EV_SOCK:
		sod_sock_event(vm, ev->idx);
		sod_kick(vm);
		break;
	case SOD_EV_TIMER:
		drain(timer_fd);
		sod_heartbeat(vm, false);
		/* a lost doorbell or socket wakeup costs at most one tick */
		sod_vm_retry_parked(vm);
		return true;
	case SOD_EV_SIGNAL: {
		struct signalfd_siginfo si;

		while (read(sig_fd, &si, sizeof(si)) == sizeof(si))
			sod.stop = true;
		break;
	}
	case SOD_EV_STOP:
		/* the supervisor asked (or died): its pipe is readable or closed */
		sod.stop = true;
		break;
	}
	return false;
}

/* Serves the VM until SIGTERM/SIGINT or the supervisor says stop; 0 on a clean stop. */
int sod_serve(struct sod_vm *vm)
{
	struct epoll_event evs[64];
	bool pending = true;	/* the first pass: a reset asked before we came */

	vm->next_beat_ns = 0;
	sod_heartbeat(vm, true);
	while (!sod.stop) {
		int n = epoll_wait(sod.epfd, evs, 64, pending || vm->poll_mode ? 0 : -1);
		int i;

		if (n < 0 && errno != EINTR) {
			SOD_LOG("%s: epoll_wait: %s", vm->name, strerror(errno));
			return -1;
		}
		for (i = 0; i < n; i++)
			pending |= dispatch(&evs[i]);
		if (pending || vm->poll_mode)
			pending = sod_vm_service(vm);
		sod_heartbeat(vm, false);
		/* SCHED_FIFO spinning: give the CPU to the next worker of the same priority */
		if (vm->poll_mode && vm->rt_prio)
			sched_yield();
	}
	return 0;
}
