// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-sod's confinement (docs/design.md 11.6, "Confinement"): the VM's
 * network namespace entered once and locked, the fd budget, and after the
 * set-up: another user, no capabilities (CAP_NET_BIND_SERVICE only when the
 * VM's spec asks for ports below 1024), no core dumps and no ptrace by the
 * same uid (PR_SET_DUMPABLE 0), no_new_privs, and a seccomp allowlist of the
 * calls serving a guest needs, with their arguments where they matter:
 * socket() only for UDP over IPv4/IPv6, setsockopt()/getsockopt() only the
 * options of the allowlist (the ABI's and the receive metadata's), ioctl()
 * only SIOCINQ/SIOCOUTQ, mmap()/mprotect() never executable.  Anything else
 * kills the process (SECCOMP_RET_KILL_PROCESS).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/nsfs.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "sod.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define SOD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOD_SANITIZER 1
#endif
#endif

/* the static inode number of the initial network namespace (Linux 6.x) */
#define SOD_INIT_NET_INO	0xEFFFFFF9U

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/*
 * Opens the VM's netns (or, with --allow-host-netns and no netns=, the
 * daemon's own), locks it for the daemon's lifetime (flock() on the nsfs
 * inode: a second kbp-sod, or a second VM of this one, for the same netns
 * is refused, whatever path names it), refuses the host's own network
 * namespace, and enters it for good: every host socket of the VM is made
 * there without a setns() per socket, and nothing else of the daemon needs
 * a network.
 */
int sod_enter_netns(struct sod_vm *vm)
{
	const char *name = vm->netns[0] ? vm->netns : "(the daemon's own)";
	struct stat target, self, init;
	bool init_known;
	char path[128];
	int fd;

	if (!vm->netns[0]) {
		if (!sod.allow_host_netns) {
			SOD_LOG("%s: netns=NAME is required: the VM's sockets live in a network "
				"namespace of its own (ip netns add NAME); --allow-host-netns (tests "
				"only) serves it in the daemon's", vm->name);
			return -1;
		}
		snprintf(path, sizeof(path), "/proc/self/ns/net");
	} else {
		snprintf(path, sizeof(path), "/run/netns/%s", vm->netns);
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		SOD_LOG("%s: netns %s: %s: %s", vm->name, name, path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &target) || ioctl(fd, NS_GET_NSTYPE) != CLONE_NEWNET) {
		SOD_LOG("%s: %s is not a network namespace", vm->name, path);
		goto err;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		SOD_LOG("%s: netns %s already serves a VM (another kbp-sod holds it): one VM "
			"per network namespace", vm->name, name);
		goto err;
	}
	init_known = !stat("/proc/1/ns/net", &init);
	if (!sod.allow_host_netns &&
	    ((init_known && same_file(&target, &init)) || target.st_ino == SOD_INIT_NET_INO)) {
		SOD_LOG("%s: netns %s is the host's network namespace: the guest's 127.0.0.1 "
			"would be the host's; give the VM a namespace of its own", vm->name, name);
		goto err;
	}
	if (!init_known && !sod.allow_host_netns)
		SOD_LOG("%s: warning: cannot read /proc/1/ns/net: not checked that netns %s is "
			"not the host's", vm->name, name);
	if (stat("/proc/self/ns/net", &self)) {
		SOD_LOG("%s: /proc/self/ns/net: %s", vm->name, strerror(errno));
		goto err;
	}
	if (!same_file(&target, &self) && setns(fd, CLONE_NEWNET)) {
		SOD_LOG("%s: cannot enter netns %s: %s (start kbp-sod as root, or in that "
			"namespace: systemd's NetworkNamespacePath=)", vm->name, name,
			strerror(errno));
		goto err;
	}
	vm->netns_fd = fd;
	return 0;

err:
	close(fd);
	return -1;
}

/*
 * Every fd the VM may need, counted before anything is served: max-sockets
 * host sockets, two eventfds per queue and a fixed overhead.  The soft
 * RLIMIT_NOFILE is raised up to the hard one; above that the start is
 * refused, so that no guest meets EMFILE from the process rather than from
 * its own max-sockets.
 */
int sod_fd_budget(const struct sod_vm *vm)
{
	rlim_t need = (rlim_t)vm->max_sockets + 2 * (rlim_t)vm->nr_queues + SOD_FD_OVERHEAD;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return -1;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
			SOD_LOG("%s: RLIMIT_NOFILE allows %llu open files, this VM may need %llu "
				"(max-sockets=%u, 2 per queue for %u queues, %d for the daemon): "
				"raise the limit (systemd: LimitNOFILE=, shell: ulimit -n) or lower "
				"max-sockets", vm->name, (unsigned long long)rl.rlim_max,
				(unsigned long long)need, vm->max_sockets, vm->nr_queues,
				SOD_FD_OVERHEAD);
			return -1;
		}
		SOD_LOG("%s: raised the soft RLIMIT_NOFILE from %llu to %llu", vm->name,
			(unsigned long long)rl.rlim_cur, (unsigned long long)need);
		rl.rlim_cur = need;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			return -1;
	}
	return 0;
}

int sod_resolve_user(const struct sod_vm *vm, uid_t *uid, gid_t *gid)
{
	struct passwd *pw;

	if (geteuid() != 0) {
		*uid = geteuid();
		*gid = getegid();
		return 0;
	}
	errno = 0;
	pw = getpwnam(vm->user);
	if (!pw) {
		SOD_LOG("%s: no user %s to serve as (the kbp-sod package creates it; or pass "
			"--user NAME / user=NAME): not serving as root", vm->name, vm->user);
		return -1;
	}
	if (pw->pw_uid == 0 || pw->pw_gid == 0) {
		SOD_LOG("%s: user %s is root (or in its group): kbp-sod does not serve guests as "
			"root", vm->name, vm->user);
		return -1;
	}
	*uid = pw->pw_uid;
	*gid = pw->pw_gid;
	return 0;
}

static int caps_set(bool keep_bind)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[2];
	uint32_t bit = 1U << CAP_NET_BIND_SERVICE;

	memset(data, 0, sizeof(data));
	if (keep_bind) {
		data[0].effective = bit;
		data[0].permitted = bit;
	}
	if (syscall(SYS_capset, &hdr, data))
		return -1;
	return prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

/* the bounding set: what no later exec could get back (there is no exec) */
static void bounding_drop(bool keep_bind)
{
	int cap;

	for (cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++) {
		if (keep_bind && cap == CAP_NET_BIND_SERVICE)
			continue;
		/* EPERM without CAP_SETPCAP (started unprivileged): systemd's bounding set holds */
		prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
	}
}

#define ALLOW(call, ...) \
	do { \
		if (seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(call), __VA_ARGS__)) \
			goto fail; \
	} while (0)

static void sockopt_rules(scmp_filter_ctx ctx, int *err, bool set)
{
	static const int opts[][2] = {
		{ SOL_SOCKET, SO_RCVBUF }, { SOL_SOCKET, SO_SNDBUF },
		{ SOL_SOCKET, SO_REUSEADDR }, { SOL_SOCKET, SO_REUSEPORT },
		{ SOL_SOCKET, SO_PRIORITY }, { SOL_SOCKET, SO_TIMESTAMPNS },
		{ SOL_SOCKET, SO_RXQ_OVFL }, { SOL_SOCKET, SO_ERROR },
		{ IPPROTO_IP, IP_TOS }, { IPPROTO_IP, IP_TTL }, { IPPROTO_IP, IP_PKTINFO },
		{ IPPROTO_IP, IP_RECVTOS }, { IPPROTO_IP, IP_RECVTTL },
		{ IPPROTO_IPV6, IPV6_V6ONLY }, { IPPROTO_IPV6, IPV6_TCLASS },
		{ IPPROTO_IPV6, IPV6_UNICAST_HOPS }, { IPPROTO_IPV6, IPV6_RECVPKTINFO },
		{ IPPROTO_IPV6, IPV6_RECVTCLASS }, { IPPROTO_IPV6, IPV6_RECVHOPLIMIT },
	};
	size_t i;

	for (i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		if (set && opts[i][0] == SOL_SOCKET && opts[i][1] == SO_ERROR)
			continue;
		*err |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW,
					 set ? SCMP_SYS(setsockopt) : SCMP_SYS(getsockopt), 2,
					 SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)opts[i][0]),
					 SCMP_A2(SCMP_CMP_EQ, (scmp_datum_t)opts[i][1]));
	}
}

/*
 * The allowlist.  A worker serves one VM; the supervisor of several
 * (worker = false) only waits for them.
 */
static int seccomp_load_policy(bool worker)
{
	static const int common[] = {
		SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(close), SCMP_SYS(exit),
		SCMP_SYS(exit_group), SCMP_SYS(rt_sigreturn), SCMP_SYS(rt_sigprocmask),
		SCMP_SYS(restart_syscall), SCMP_SYS(brk), SCMP_SYS(munmap), SCMP_SYS(madvise),
		SCMP_SYS(futex), SCMP_SYS(getpid), SCMP_SYS(gettid), SCMP_SYS(getrandom),
		SCMP_SYS(clock_gettime), SCMP_SYS(gettimeofday), SCMP_SYS(poll),
		SCMP_SYS(ppoll), SCMP_SYS(sendto), SCMP_SYS(sched_yield),
	};
	static const int serving[] = {
		SCMP_SYS(epoll_wait), SCMP_SYS(epoll_pwait), SCMP_SYS(epoll_ctl),
		SCMP_SYS(recvfrom), SCMP_SYS(recvmsg), SCMP_SYS(sendmsg), SCMP_SYS(accept4),
		SCMP_SYS(bind), SCMP_SYS(connect), SCMP_SYS(getsockname), SCMP_SYS(getpeername),
		SCMP_SYS(shutdown), SCMP_SYS(eventfd2),
	};
#ifdef SOD_SANITIZER
	/* what AddressSanitizer's and UBSan's reports need (test builds only) */
	static const int sanitizer[] = {
		SCMP_SYS(openat), SCMP_SYS(open), SCMP_SYS(readlink), SCMP_SYS(readlinkat),
		SCMP_SYS(getdents64), SCMP_SYS(getdents), SCMP_SYS(fstat), SCMP_SYS(newfstatat), SCMP_SYS(lseek),
		SCMP_SYS(pread64), SCMP_SYS(prctl), SCMP_SYS(sched_getaffinity),
		SCMP_SYS(sigaltstack), SCMP_SYS(rt_sigaction), SCMP_SYS(mprotect),
		SCMP_SYS(mmap), SCMP_SYS(getppid), SCMP_SYS(uname), SCMP_SYS(prlimit64),
		SCMP_SYS(getrlimit), SCMP_SYS(tgkill), SCMP_SYS(kill), SCMP_SYS(nanosleep),
		SCMP_SYS(clone), SCMP_SYS(clone3), SCMP_SYS(wait4), SCMP_SYS(ptrace),
		SCMP_SYS(pipe2), SCMP_SYS(dup2), SCMP_SYS(dup3), SCMP_SYS(execve),
		SCMP_SYS(munmap), SCMP_SYS(writev),
	};
#endif
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
	int err = 0;
	size_t i;

	if (!ctx)
		return -1;
	for (i = 0; i < sizeof(common) / sizeof(common[0]); i++)
		err |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, common[i], 0);
	/* memory, never executable */
	ALLOW(mmap, 1, SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	ALLOW(mprotect, 1, SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	/* abort() signals itself */
	ALLOW(tgkill, 1, SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)getpid()));
	if (worker) {
		for (i = 0; i < sizeof(serving) / sizeof(serving[0]); i++)
			err |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, serving[i], 0);
		/* host sockets: UDP over IPv4 and IPv6, made as ring.c makes them */
		ALLOW(socket, 3, SCMP_A0(SCMP_CMP_EQ, AF_INET),
		      SCMP_A1(SCMP_CMP_EQ, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC),
		      SCMP_A2(SCMP_CMP_EQ, IPPROTO_UDP));
		ALLOW(socket, 3, SCMP_A0(SCMP_CMP_EQ, AF_INET6),
		      SCMP_A1(SCMP_CMP_EQ, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC),
		      SCMP_A2(SCMP_CMP_EQ, IPPROTO_UDP));
		sockopt_rules(ctx, &err, true);
		sockopt_rules(ctx, &err, false);
		ALLOW(ioctl, 1, SCMP_A1(SCMP_CMP_EQ, SIOCINQ));
		ALLOW(ioctl, 1, SCMP_A1(SCMP_CMP_EQ, SIOCOUTQ));
	} else {
		ALLOW(wait4, 0);
		ALLOW(waitid, 0);
	}
#ifdef SOD_SANITIZER
	for (i = 0; i < sizeof(sanitizer) / sizeof(sanitizer[0]); i++)
		seccomp_rule_add(ctx, SCMP_ACT_ALLOW, sanitizer[i], 0);
#endif
	if (err)
		goto fail;
	if (seccomp_load(ctx))
		goto fail;
	seccomp_release(ctx);
	return 0;

fail:
	seccomp_release(ctx);
	return -1;
}

/*
 * After the set-up: the user (when started as root), the capabilities, no
 * core dumps nor ptrace by the same uid, no_new_privs, the seccomp filter.
 * Any failure is fatal: a worker never serves unconfined.
 */
int sod_confine(const struct sod_vm *vm, uid_t uid, gid_t gid, bool worker)
{
	bool keep_bind = worker && vm && vm->bind_low_ports;
	const char *who = vm ? vm->name : "supervisor";
	struct rlimit zero = { 0, 0 }, core;

	bounding_drop(keep_bind);
	if (geteuid() == 0) {
		if (keep_bind && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0))
			goto fail;
		if (setgroups(1, &gid) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
			goto fail;
		if (keep_bind && prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0))
			goto fail;
	}
	if (geteuid() == 0 || getuid() == 0) {
		errno = EPERM;
		goto fail;
	}
	if (caps_set(keep_bind))
		goto fail;
	/* no core dumps of guest memory (systemd: LimitCORE=0 already, and no setrlimit()) */
	if (getrlimit(RLIMIT_CORE, &core) || ((core.rlim_cur || core.rlim_max) &&
					       setrlimit(RLIMIT_CORE, &zero)))
		goto fail;
#ifndef SOD_SANITIZER
	/* another process of this uid (another VM's worker) cannot ptrace or read us */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		goto fail;
#endif
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		goto fail;
	if (seccomp_load_policy(worker)) {
		SOD_LOG("%s: seccomp filter: refused", who);
		errno = EPERM;
		goto fail;
	}
	sod.sandboxed = true;
	return 0;

fail:
	SOD_LOG("%s: confinement failed: %s: not serving", who, strerror(errno));
	return -1;
}
