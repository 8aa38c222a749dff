/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* Do not edit directly, auto-generated from: */
/*	module/netlink/kbp.yaml */
/* by tools/kbp_spec.py gen */
/*
 * kbp: kernel busy poll - generic netlink control surface.
 *
 * Family "kbp", version 1.  Every command needs CAP_NET_ADMIN
 * (GENL_ADMIN_PERM).  The family is netns-aware: device names and
 * ifindexes are resolved in the caller's network namespace unless
 * KBP_A_NETNS_FD names another one.
 *
 * Vocabulary (shared with kbpctl, docs and benchmark output):
 *   modes:    busy, hybrid, periodic
 *   knobs:    mode, linger_us, quota, rt_prio, freq_ctl, cpu, class, nice,
 *             periodic: interval_us, netap, round_ms, min_interval_us,
 *             max_interval_us, min_change, max_round, objective
 *   objectives (periodic search): bytes, bytes-per-cpu
 *   poller counters: passes, empty_passes, packets, wakeups, sleeps,
 *                    sleep_ns, poll_ns, freq_changes, respawns, repairs,
 *                    yields, handbacks, gave_way, wake_delay_ns,
 *                    wake_delay_max_ns, takeovers
 *   device / napi counters: packets, polls
 */
#ifndef _UAPI_LINUX_KBP_H
#define _UAPI_LINUX_KBP_H

#define KBP_GENL_NAME		"kbp"
#define KBP_GENL_VERSION	1

enum kbp_mode {
	KBP_MODE_BUSY = 1,	/* KBP: spin, never sleep */
	KBP_MODE_HYBRID = 2,	/* EE-KBP: sleep when idle,
				 * woken from hardIRQ
				 */
	KBP_MODE_PERIODIC = 3,	/* NetAP: poll every interval_us with the NAPIs
				 * kept scheduled (IRQ masked); idle NAPIs are
				 * handed back to interrupts
				 */
};

/*
 * What a periodic poller's interval search maximizes per round
 * (KBP_A_OBJECTIVE; docs/netap.md "Objective").
 */
enum kbp_objective {
	KBP_OBJECTIVE_BYTES = 0,	/* bytes its devices received (NetAP) */
	KBP_OBJECTIVE_BYTES_PER_CPU = 1,	/* those bytes per CPU-second of
						 * the poller thread
						 */
};

/*
 * Poller classes (KBP_A_CLASS): a CPU may run one poller of each.  rt: any
 * mode, SCHED_FIFO by default.  non-rt: the outsourcing method's non-RT
 * receive work on the RT CPU itself: hybrid only, SCHED_NORMAL (nice), a
 * small quota, and it gives the CPU to a woken task (the rt poller) after
 * every poll (docs/design.md, "Classes").
 */
enum kbp_class {
	KBP_CLASS_RT = 0,
	KBP_CLASS_NON_RT = 1,
};

/* state of an attached device, or of a poller */
enum kbp_state {
	KBP_STATE_ACTIVE = 1,	/* a device: its NAPIs are served by pollers; a
				 * poller: its thread runs
				 */
	KBP_STATE_STANDBY = 2,	/* device down (or its NAPIs cannot be hooked):
				 * stock NAPI until it comes up
				 */
	KBP_STATE_STOPPING = 3,	/* a poller told to stop (its device detached or
				 * gone): listed until its thread has exited
				 */
	KBP_STATE_STUCK = 4,	/* a poller that did not give a NAPI back in
				 * time (a higher-priority task hogs its CPU):
				 * it takes no new NAPI until it runs again
				 */
};

enum kbp_cmd {
	KBP_CMD_UNSPEC,
	KBP_CMD_POLLER_GET,	/* doit: KBP_A_CPU (and CLASS), and the device
				 * (IFINDEX or IFNAME, NETNS_FD) when the CPU
				 * has a poller for each of several devices;
				 * dumpit: every poller. Pollers are per CPU,
				 * class and device; the reply names the device
				 * (IFINDEX, IFNAME, NETNS_INUM) while it is
				 * attached.
				 */
	KBP_CMD_POLLER_SET,	/* KBP_A_CPU + any of MODE, LINGER_US, QUOTA,
				 * RT_PRIO, FREQ_CTL and the periodic knobs
				 */
	KBP_CMD_DEV_ATTACH,	/* device + CPU and/or QUEUE_MAP (+ poller
				 * knobs)
				 */
	KBP_CMD_DEV_DETACH,	/* device */
	KBP_CMD_DEV_GET,	/* doit: device; dumpit:
				 * every attached device
				 */
	__KBP_CMD_MAX,
};

#define KBP_CMD_MAX		(__KBP_CMD_MAX - 1)

/* Every command uses this one attribute space. */
enum kbp_attr {
	KBP_A_UNSPEC,
	KBP_A_PAD,
	KBP_A_CPU,		/* u32 */
	KBP_A_MODE,		/* u32, enum kbp_mode */
	KBP_A_LINGER_US,	/* u32, hybrid: spin this long after the last
				 * packet
				 */
	KBP_A_QUOTA,		/* u32, packets per NAPI per pass (1..NAPI
				 * weight)
				 */
	KBP_A_PID,		/* u32, poller kthread pid (output) */
	KBP_A_IFINDEX,		/* u32 */
	KBP_A_IFNAME,		/* string */
	KBP_A_NETNS_FD,		/* u32, fd of a netns (input) */
	KBP_A_NETNS_INUM,	/* u32, inode number of the device's netns
				 * (output)
				 */
	KBP_A_QUEUE_MAP,	/* nest of KBP_A_MAP_ENTRY (input) */
	KBP_A_MAP_ENTRY,	/* nest of enum kbp_map_attr */
	KBP_A_NAPI,		/* nest of enum kbp_napi_attr, one per NAPI
				 * (output)
				 */
	KBP_A_NAPIS,		/* u32, number of NAPIs (output) */
	KBP_A_PASSES,		/* u64, counter: loop iterations over the
				 * poller's NAPIs (output)
				 */
	KBP_A_EMPTY_PASSES,	/* u64, counter: passes that found no work
				 * (output)
				 */
	KBP_A_PACKETS,		/* u64, counter: packets (work units) returned
				 * by NAPI poll functions (output)
				 */
	KBP_A_WAKEUPS,		/* u64, counter: times the poller was woken from
				 * sleep (hybrid, periodic) (output)
				 */
	KBP_A_SLEEPS,		/* u64, counter: times the poller went to sleep
				 * (hybrid, periodic) (output)
				 */
	KBP_A_SLEEP_NS,		/* u64, counter: time spent asleep (output) */
	KBP_A_POLL_NS,		/* u64, counter: time spent inside NAPI poll
				 * (protocol processing included) (output)
				 */
	KBP_A_POLLS,		/* u64, counter: NAPI polls (output) */
	KBP_A_RESPAWNS,		/* u64, counter: poller threads replaced after a
				 * driver deleted a NAPI under it (output)
				 */
	KBP_A_REPAIRS,		/* u64, counter: NAPIs put back on the poller
				 * after a driver's napi_disable/enable (output)
				 */
	KBP_A_RT_PRIO,		/* u32, 0 = SCHED_NORMAL, 1..99 = SCHED_FIFO
				 * priority
				 */
	KBP_A_STATE,		/* u32, enum kbp_state, devices and pollers
				 * (output)
				 */
	KBP_A_FREQ_CTL,		/* u32, 0/1: hybrid lowers the CPU frequency
				 * while asleep (userspace governor needed)
				 */
	KBP_A_FREQ_CHANGES,	/* u64, counter: CPU frequency changes made by
				 * freq_ctl (hybrid) (output)
				 */
	KBP_A_YIELDS,		/* u64, counter: times a poller that was not
				 * going to sleep gave its CPU to other tasks
				 * (output)
				 */
	KBP_A_INTERVAL_US,	/* u32, periodic: polling interval while the
				 * search is off
				 */
	KBP_A_NETAP,		/* u32, periodic, 0/1: golden-section search of
				 * the interval
				 */
	KBP_A_ROUND_MS,		/* u32, periodic: length of a search round */
	KBP_A_MIN_INTERVAL_US,	/* u32, periodic: search range (MinInterval) */
	KBP_A_MAX_INTERVAL_US,	/* u32, periodic: search range (MaxInterval), a
				 * latency cap
				 */
	KBP_A_MIN_CHANGE,	/* u32, periodic: % change of a round's
				 * objective that restarts a converged search
				 * (MinChange)
				 */
	KBP_A_MAX_ROUND,	/* u32, periodic: rounds after which the search
				 * restarts
				 */
	KBP_A_HANDBACKS,	/* u64, counter, periodic: polls that let the
				 * driver complete the NAPI and unmask its IRQ
				 * (idle, or the NAPI was being taken away)
				 * (output)
				 */
	KBP_A_NETAP_STATE,	/* nest of enum kbp_netap_attr, periodic
				 * (output)
				 */
	KBP_A_OBJECTIVE,	/* u32, enum kbp_objective, what the search
				 * maximizes (periodic knob)
				 */
	KBP_A_CLASS,		/* u32, enum kbp_class, which of a CPU's pollers
				 * (attach, poller-get/set)
				 */
	KBP_A_NICE,		/* s32, non-rt poller's nice (-20..19; below 0
				 * needs CAP_SYS_NICE)
				 */
	KBP_A_GAVE_WAY,		/* u64, counter, non-rt: polls after which it
				 * gave the CPU to a woken task at once (output)
				 */
	KBP_A_WAKE_DELAY_NS,	/* u64, counter: sum of wake-up-to-running
				 * delays of the poller's thread (run_delay)
				 * (output)
				 */
	KBP_A_WAKE_DELAY_MAX_NS,	/* u64, counter, maximum: the longest of
					 * those wake-up-to-running delays
					 * (output)
					 */
	KBP_A_TAKEOVERS,	/* u64, counter: NAPIs a load kept scheduled in
				 * softirq (never idle) that the poller asked to
				 * hand over at attach or reconcile (output)
				 */
	__KBP_A_MAX,
};

#define KBP_A_MAX		(__KBP_A_MAX - 1)

/* One NAPI index -> CPU pair of a queue map (input). */
enum kbp_map_attr {
	KBP_MAP_A_UNSPEC,
	KBP_MAP_A_NAPI_INDEX,	/* u32, position of the NAPI in the device (0 =
				 * first added)
				 */
	KBP_MAP_A_CPU,		/* u32 */
	__KBP_MAP_A_MAX,
};

#define KBP_MAP_A_MAX		(__KBP_MAP_A_MAX - 1)

/* One NAPI of an attached device (KBP_A_NAPI, output). */
enum kbp_napi_attr {
	KBP_NAPI_A_UNSPEC,
	KBP_NAPI_A_PAD,
	KBP_NAPI_A_INDEX,	/* u32 */
	KBP_NAPI_A_ID,		/* u32, napi_id (0 when the kernel gave none) */
	KBP_NAPI_A_CPU,		/* u32 */
	KBP_NAPI_A_PID,		/* u32, pid of the poller serving it */
	KBP_NAPI_A_PACKETS,	/* u64, counter: the device's packets
				 * (KBP_A_PACKETS), this NAPI's share
				 */
	KBP_NAPI_A_POLLS,	/* u64, counter: the device's polls
				 * (KBP_A_POLLS), this NAPI's share
				 */
	__KBP_NAPI_A_MAX,
};

#define KBP_NAPI_A_MAX		(__KBP_NAPI_A_MAX - 1)

/* The interval search of a periodic poller (KBP_A_NETAP_STATE, output). */
enum kbp_netap_attr {
	KBP_NETAP_A_UNSPEC,
	KBP_NETAP_A_PAD,
	KBP_NETAP_A_ROUND,	/* u32, rounds since the (re)start */
	KBP_NETAP_A_ROUNDS,	/* u64, rounds since the poller went periodic */
	KBP_NETAP_A_INTERVAL_US,	/* u32, interval of the running round */
	KBP_NETAP_A_LOW_US,	/* u32, probe interval_low (the longer one) */
	KBP_NETAP_A_HIGH_US,	/* u32, probe interval_high */
	KBP_NETAP_A_RANGE_LO_US,	/* u32, bracket of the search */
	KBP_NETAP_A_RANGE_HI_US,	/* u32 */
	KBP_NETAP_A_DISTANCE_US,	/* u32 */
	KBP_NETAP_A_CONVERGED,	/* u32, 0/1 */
	KBP_NETAP_A_RESTARTS,	/* u32 */
	KBP_NETAP_A_LAST_OBJECTIVE,	/* u64, the objective's value in the
					 * last round (bytes, or bytes per
					 * CPU-second)
					 */
	KBP_NETAP_A_OBJECTIVE,	/* u32, enum kbp_objective, of the search */
	KBP_NETAP_A_LAST_BYTES,	/* u64, bytes of the last round */
	KBP_NETAP_A_LAST_CPU_NS,	/* u64, CPU time of the poller thread in
					 * the last round
					 */
	__KBP_NETAP_A_MAX,
};

#define KBP_NETAP_A_MAX		(__KBP_NETAP_A_MAX - 1)

/* the name of KBP_NETAP_A_LAST_OBJECTIVE when it counted packets */
#define KBP_NETAP_A_LAST_WORK	12

#endif /* _UAPI_LINUX_KBP_H */
