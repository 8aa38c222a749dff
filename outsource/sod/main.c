// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod: serves the outsourced UDP sockets of guests (docs/design.md, 11).
 *
 *   kbp-sod [OPTIONS] (--vm SPEC | --config FILE) ...
 *   kbp-sod --qemu-args (SPEC | --vm SPEC | --config FILE)
 *
 * One process per VM: with one VM this process is its worker; with several
 * it forks a worker per VM and stays as their supervisor, which keeps none
 * of their files, memory or sockets (issue 37 item 2).  A worker sets up as
 * the user it was started as (root, or systemd's User= with ambient
 * capabilities), then confines itself for good (sandbox.c) before it reads
 * anything a guest wrote.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "sod.h"

#ifndef SOD_VERSION
#define SOD_VERSION "unknown"
#endif

struct sod sod = { .epfd = -1, .stop_fd = -1, .notify_fd = -1 };

static void usage(FILE *f)
{
	fputs("Usage: kbp-sod [OPTION]... (--vm SPEC | --config FILE)...\n"
	      "  or:  kbp-sod --qemu-args (SPEC | --vm SPEC | --config FILE)\n"
	      "Serve the outsourced UDP sockets of VMs (kbp socket outsourcing): one\n"
	      "confined process per VM, in the VM's own network namespace, as an\n"
	      "unprivileged user without capabilities, under a seccomp allowlist.\n"
	      "\n"
	      "Options:\n"
	      "  --vm SPEC           a VM: KEY=VALUE pairs joined by commas (Keys, below)\n"
	      "  --config FILE       a VM: one 'KEY = VALUE' a line, '#' comments\n"
	      "  --poll              spin instead of sleeping (every VM's poll=)\n"
	      "  --rt-prio N         SCHED_FIFO priority N (every VM's rt-prio=)\n"
	      "  --user NAME         serve as NAME when started as root (kbp-sod)\n"
	      "  --allow-host-netns  tests only: a VM without netns= is served in the\n"
	      "                      daemon's own network namespace, even the host's\n"
	      "  --qemu-args         print the QEMU arguments of the VM and exit\n"
	      "  --help              print this and exit\n"
	      "  --version           print the version and exit\n"
	      "\n"
	      "Keys:\n"
	      "  name=NAME           the VM's name (required)\n"
	      "  region=PATH         its ivshmem region, created 0600 (required)\n"
	      "  socket=PATH         its ivshmem server socket for QEMU (required)\n"
	      "  ram=PATH            the guest's RAM file, shared with QEMU (required)\n"
	      "  netns=NAME          its network namespace, /run/netns/NAME (required)\n"
	      "  ram-map=MAP         guest-physical ranges GPA:LEN:OFFSET[+...] of the\n"
	      "                      RAM file (default: all of it from 0)\n"
	      "  ram-size=SIZE       the guest's RAM for --qemu-args (default: the file's)\n"
	      "  queues=N            queues, one per vCPU: the device's vectors= (1)\n"
	      "  entries=N           ring entries, a power of two, 8 to 1024 (64)\n"
	      "  max-sockets=N       host sockets of the VM, at most 1024 (64)\n"
	      "  budget=N            requests of a queue per pass (32)\n"
	      "  poll=yes            spin instead of sleeping\n"
	      "  rt-prio=N           SCHED_FIFO priority N\n"
	      "  user=NAME           serve as NAME when started as root\n"
	      "  bind-low-ports=yes  keep CAP_NET_BIND_SERVICE: ports below 1024\n", f);
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

static int parse_config(struct sod_vm *vm, const char *path)
{
	char line[1024];
	int lineno = 0, ret = 0;
	FILE *f = fopen(path, "re");

	if (!f) {
		SOD_LOG("config %s: %s", path, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *s, *eq;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			SOD_LOG("%s:%d: line too long", path, lineno);
			ret = -1;
			break;
		}
		s = trim(line);
		if (!*s || *s == '#')
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			SOD_LOG("%s:%d: not 'key = value'", path, lineno);
			ret = -1;
			break;
		}
		*eq = 0;
		if (sod_vm_set(vm, trim(s), trim(eq + 1))) {
			SOD_LOG("%s:%d: bad %s", path, lineno, trim(s));
			ret = -1;
			break;
		}
	}
	fclose(f);
	return ret;
}

/* $NOTIFY_SOCKET, connected now: the confined process cannot make sockets */
static void notify_open(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	size_t n;
	int fd;

	if (!path || (path[0] != '/' && path[0] != '@'))
		return;
	n = strlen(path);
	if (n >= sizeof(sun.sun_path))
		return;
	memcpy(sun.sun_path, path, n);
	if (path[0] == '@')
		sun.sun_path[0] = 0;
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (connect(fd, (struct sockaddr *)&sun, (socklen_t)(offsetof(struct sockaddr_un,
							sun_path) + n))) {
		close(fd);
		return;
	}
	sod.notify_fd = fd;
}

/*
 * One VM, start to end, in this process.  @ready_fd: the supervisor's pipe
 * (-1: this is the only process, it says "ready" itself).
 */
static int run_worker(struct sod_vm *vm, int ready_fd)
{
	uid_t uid;
	gid_t gid;
	int ret = 1;

	umask(077);
	if (sod_resolve_user(vm, &uid, &gid) || sod_fd_budget(vm))
		return 1;
	if (vm->rt_prio) {
		struct sched_param sp = { .sched_priority = vm->rt_prio };

		if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
			SOD_LOG("%s: SCHED_FIFO %d: %s", vm->name, vm->rt_prio, strerror(errno));
			return 1;
		}
	}
	sod.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sod.epfd < 0) {
		SOD_LOG("%s: epoll: %s", vm->name, strerror(errno));
		return 1;
	}
	if (sod_vm_open(vm))
		goto out_ep;
	sod_vm_reset_queues(vm);
	if (sod_loop_init(vm)) {
		SOD_LOG("%s: timer/signal: %s", vm->name, strerror(errno));
		goto out_vm;
	}
	if (sod_confine(vm, uid, gid, true))
		goto out_vm;
	SOD_LOG("%s: confined: uid %u, seccomp on%s", vm->name, (unsigned int)uid,
		vm->bind_low_ports ? ", CAP_NET_BIND_SERVICE kept" : ", no capabilities");
	if (ready_fd >= 0) {
		(void)!write(ready_fd, "1", 1);
		close(ready_fd);
	} else {
		SOD_LOG("ready");
		sod_notify("READY=1");
	}
	ret = sod_serve(vm) ? 1 : 0;
	sod_notify("STOPPING=1");
out_vm:
	sod_vm_close(vm);
	sod_loop_fini();
	SOD_LOG("%s: stopped", vm->name);
out_ep:
	close(sod.epfd);
	return ret;
}

struct worker {
	pid_t pid;
	int ready_fd;		/* read end: a byte when confined and serving, EOF if it died */
	int stop_fd;		/* write end: closing it stops the worker */
	bool ready, exited;
	int status;
};

static void stop_all(struct worker *w, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (w[i].stop_fd >= 0) {
			close(w[i].stop_fd);
			w[i].stop_fd = -1;
		}
}

static int reap(struct worker *w, int n, bool block)
{
	int status, i, left = 0;
	pid_t pid;

	while ((pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
		for (i = 0; i < n; i++) {
			if (w[i].pid != pid)
				continue;
			w[i].exited = true;
			w[i].status = status;
			if (!WIFEXITED(status) || WEXITSTATUS(status))
				SOD_LOG("%s: worker %d ended (%s %d)", sod.vms[i].name, (int)pid,
					WIFEXITED(status) ? "status" : "signal",
					WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		}
		block = false;
	}
	for (i = 0; i < n; i++)
		left += !w[i].exited;
	return left;
}

/*
 * Several VMs: a worker each.  The supervisor keeps nothing of theirs; it
 * waits until each says it serves, then for them to end, and stops them all
 * (closing their pipes) on SIGTERM/SIGINT.  A worker that dies leaves the
 * others serving (one systemd unit per VM restarts VMs one by one).
 */
static int supervise(void)
{
	struct worker w[SOD_MAX_VMS];
	struct pollfd pfd[SOD_MAX_VMS + 1];
	struct sod_vm *vm0 = &sod.vms[0];
	int sig_fd, i, n = sod.nr_vms, rc = 0, waiting = n;
	sigset_t set;
	uid_t uid;
	gid_t gid;

	if (sod_resolve_user(vm0, &uid, &gid))
		return 1;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &set, NULL))
		return 1;
	for (i = 0; i < n; i++) {
		int rp[2], sp[2], j;

		if (pipe2(rp, O_CLOEXEC) || pipe2(sp, O_CLOEXEC)) {
			SOD_LOG("pipe: %s", strerror(errno));
			stop_all(w, i);
			reap(w, i, true);
			return 1;
		}
		fflush(stderr);
		w[i].pid = fork();
		if (w[i].pid == 0) {
			sigset_t none;

			for (j = 0; j < i; j++) {
				close(w[j].ready_fd);
				close(w[j].stop_fd);
			}
			close(rp[0]);
			close(sp[1]);
			sod.stop_fd = sp[0];
			if (sod.notify_fd >= 0)
				close(sod.notify_fd);
			sod.notify_fd = -1;
			sigemptyset(&none);
			sigprocmask(SIG_SETMASK, &none, NULL);
			_exit(run_worker(&sod.vms[i], rp[1]));
		}
		close(rp[1]);
		close(sp[0]);
		w[i].ready_fd = rp[0];
		w[i].stop_fd = sp[1];
		w[i].ready = w[i].exited = false;
		if (w[i].pid < 0) {
			SOD_LOG("fork: %s", strerror(errno));
			w[i].exited = true;
			stop_all(w, i + 1);
			reap(w, i, true);
			return 1;
		}
	}
	sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0 || sod_confine(NULL, uid, gid, false)) {
		stop_all(w, n);
		reap(w, n, true);
		return 1;
	}
	while (reap(w, n, false)) {
		int k = 0;

		pfd[k++] = (struct pollfd){ .fd = sig_fd, .events = POLLIN };
		for (i = 0; i < n; i++)
			/* a worker's end is SIGCHLD's news; its pipe only says "serving" */
			pfd[k++] = (struct pollfd){ .fd = w[i].ready ? -1 : w[i].ready_fd,
						    .events = POLLIN };
		if (poll(pfd, (nfds_t)k, -1) < 0 && errno != EINTR)
			break;
		if (pfd[0].revents) {
			struct signalfd_siginfo si;

			while (read(sig_fd, &si, sizeof(si)) == sizeof(si))
				if (si.ssi_signo != SIGCHLD)
					stop_all(w, n);
		}
		for (i = 0; i < n; i++) {
			char c;

			if (w[i].ready || !pfd[i + 1].revents)
				continue;
			if (read(w[i].ready_fd, &c, 1) == 1) {
				w[i].ready = true;
				if (!--waiting) {
					SOD_LOG("ready");
					sod_notify("READY=1");
				}
			} else {
				/* died before it served: the whole start fails */
				w[i].ready = true;
				SOD_LOG("%s: did not start; stopping the others", sod.vms[i].name);
				rc = 1;
				stop_all(w, n);
			}
		}
	}
	for (i = 0; i < n; i++) {
		if (!WIFEXITED(w[i].status) || WEXITSTATUS(w[i].status))
			rc = 1;
		close(w[i].ready_fd);
		if (w[i].stop_fd >= 0)
			close(w[i].stop_fd);
	}
	SOD_LOG("stopped");
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "vm", required_argument, NULL, 'v' },
		{ "config", required_argument, NULL, 'c' },
		{ "poll", no_argument, NULL, 'p' },
		{ "rt-prio", required_argument, NULL, 'r' },
		{ "user", required_argument, NULL, 'u' },
		{ "allow-host-netns", no_argument, NULL, 'A' },
		{ "qemu-args", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	const char *src[SOD_MAX_VMS];
	bool is_config[SOD_MAX_VMS], poll_mode = false, qemu_args = false;
	const char *user = NULL;
	int rt_prio = 0, nsrc = 0, c, i;

	signal(SIGPIPE, SIG_IGN);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'v':
		case 'c':
			if (nsrc == SOD_MAX_VMS) {
				SOD_LOG("at most %d VMs", SOD_MAX_VMS);
				return 2;
			}
			is_config[nsrc] = c == 'c';
			src[nsrc++] = optarg;
			break;
		case 'p':
			poll_mode = true;
			break;
		case 'r':
			rt_prio = atoi(optarg);
			if (rt_prio < 1 || rt_prio > 99) {
				usage(stderr);
				return 2;
			}
			break;
		case 'u':
			user = optarg;
			break;
		case 'A':
			sod.allow_host_netns = true;
			break;
		case 'q':
			qemu_args = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("kbp-sod %s (ABI %d.%d)\n", SOD_VERSION, KBP_SO_VERSION_MAJOR,
			       KBP_SO_VERSION_MINOR);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	/* kbp-sod --qemu-args SPEC: the spec without --vm */
	if (qemu_args && !nsrc && optind == argc - 1) {
		is_config[0] = false;
		src[nsrc++] = argv[optind++];
	}
	if (!nsrc || optind != argc || (qemu_args && nsrc != 1)) {
		usage(stderr);
		return 2;
	}
	for (i = 0; i < nsrc; i++) {
		struct sod_vm *vm = &sod.vms[i];
		int j;

		sod_vm_defaults(vm);
		vm->poll_mode = poll_mode;
		vm->rt_prio = rt_prio;
		if (user && sod_vm_set(vm, "user", user)) {
			usage(stderr);
			return 2;
		}
		if ((is_config[i] ? parse_config(vm, src[i]) : sod_vm_parse(vm, src[i])) ||
		    sod_vm_check(vm)) {
			SOD_LOG("bad %s %s", is_config[i] ? "--config" : "--vm", src[i]);
			usage(stderr);
			return 2;
		}
		for (j = 0; j < i; j++)
			if (!strcmp(sod.vms[j].name, vm->name)) {
				SOD_LOG("two VMs named %s", vm->name);
				return 2;
			}
		sod.nr_vms++;
	}
	if (qemu_args) {
		char buf[4096];

		if (sod_qemu_args(&sod.vms[0], buf, sizeof(buf)))
			return 1;
		fputs(buf, stdout);
		return 0;
	}
	notify_open();
	if (sod.nr_vms == 1) {
		c = run_worker(&sod.vms[0], -1);
		if (!c)
			SOD_LOG("stopped");
		return c;
	}
	return supervise();
}
