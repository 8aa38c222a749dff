/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kbp: kernel busy poll.  Internal interfaces of the module.
 *
 * Objects
 *   struct kbp_poller  one per CPU, class and attached device in use: a
 *                      kthread bound to that CPU ("kbp/<cpu>:<dev>" of class
 *                      rt, "kbpn/<cpu>:<dev>" of class non-rt) and the list of
 *                      that device's NAPIs it serves.  Per device, because the
 *                      kernel stops napi->thread (kthread_stop()) from
 *                      paths that only that device's own locks serialise: two
 *                      devices' NAPIs sharing a thread could have it stopped
 *                      twice (docs/design.md, "One thread per device").  The
 *                      pollers of one CPU and class share that CPU's knobs
 *                      (kbp_conf[]) and take turns pass by pass.
 *   struct kbp_thread  one per poller kthread ever started: the task and its
 *                      exit, which kbp waits for (kbp never kthread_stop()s
 *                      its own threads).
 *   struct kbp_dev     one per attached device (the operator's request; it
 *                      survives the device going down and up).
 *   struct kbp_napi    one per NAPI instance of an attached device while the
 *                      device is up: the link between a napi_struct and its
 *                      poller.
 *
 * Locks, outermost first (see docs/design.md, "Locking")
 *   rtnl_lock          every change of attachment state: genl writes, the
 *                      netdevice notifier and the reconcile work.  Drivers
 *                      add, enable, disable and delete NAPIs of a registered
 *                      device under it, so holding it freezes dev->napi_list
 *                      and the NAPI_STATE_LISTED bits we depend on.
 *   kbp_lock (mutex)   the registries: kbp_devs, kbp_slots[], kbp_conf[]
 *                      (both indexed by kbp_slot(cpu, class)),
 *                      every kbp_dev and its napis list.  Taken after rtnl;
 *                      never taken by a poller thread.
 *   dev->lock          the device's instance lock (kbp_netdev_lock(), 6.14+;
 *                      nothing before).  On 7.2 sysfs "threaded" and netlink
 *                      "napi-set" change napi->thread, the THREADED bits and
 *                      napi->config under it without rtnl.  Taken after
 *                      kbp_lock, one device at a time, around kbp's walks of
 *                      dev->napi_list and its writes of those fields; never
 *                      by a poller thread.  Devices whose driver needs it for
 *                      its ops (netdev_need_ops_lock()) send NETDEV_UP and
 *                      GOING_DOWN with it held: kbp does not take kbp_lock
 *                      there, the reconcile work follows their state.
 *   kbp_cpufreq.lock   (mutex, per CPU, kbp_freq.c) kbp's changes of a
 *                      CPU's frequency: taken by that CPU's poller threads
 *                      with nothing else held (trylock on the data path).
 *   poller->lock       (spinlock, process context only) poller->napis,
 *                      poller->task, poller->thr and napi->thread of the
 *                      NAPIs on the list change only under it, and the
 *                      STOPPING bit and the respawning count change under
 *                      it: the two exclude each other.  Taken
 *                      under kbp_lock (and the NAPI's instance lock), or
 *                      alone by the poller thread itself when it respawns.
 *                      The poller thread reads the list under
 *                      rcu_read_lock(); so do the other pollers of its CPU
 *                      and class (kbp_sibling_has_work()).
 *   poller->netap_lock (spinlock, process context only) the periodic search:
 *                      its state (written by the thread once per round) and
 *                      its parameters and objective (written under
 *                      kbp_lock).  Innermost: nothing is taken inside it.
 *   kbp_threads_lock   (spinlock, kbp_poller.c) the list of thread records.
 *                      Innermost.
 */
#ifndef _KBP_PRIV_H
#define _KBP_PRIV_H

#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/refcount.h>
#include <linux/netdevice.h>
#include <linux/sched.h>
#include <linux/spinlock.h>
#include <linux/u64_stats_sync.h>

#include "uapi/kbp.h"
#include "kbp_compat.h"
#include "kbp_netap.h"
/*
 * The knobs' ranges and defaults (KBP_QUOTA_MAX, KBP_LINGER_US_MAX, ...,
 * KBP_NETAP_INTERVAL_US_LO, ...): generated from netlink/kbp.yaml, with the
 * uapi header (docs/design.md, section 4, "The spec").
 */
#include "kbp_spec.h"

#define KBP_NR_CLASSES		(KBP_CLASS_NON_RT + 1)
#define KBP_OBJECTIVE_MAX	KBP_OBJECTIVE_BYTES_PER_CPU
/*
 * periodic: a NAPI kept scheduled is handed back to interrupts after this
 * many consecutive empty polls (docs/design.md, "Periodic mode").
 */
#define KBP_PERIODIC_IDLE_POLLS	8U

/* Knobs of one CPU's poller; kept even while no poller runs there. */
struct kbp_conf {
	u32 mode;
	u32 linger_us;
	u32 quota;
	u32 rt_prio;
	s32 nice;		/* non-rt: the thread's nice */
	u32 freq_ctl;		/* 0/1: EE-KBP CPU-frequency control */
	/* periodic (NetAP) */
	u32 interval_us;	/* the interval while the search is off */
	u32 netap;		/* 0/1: search the interval */
	u32 round_ms;		/* search round */
	u32 objective;		/* enum kbp_objective: what the search maximizes */
	struct kbp_netap_params np;	/* range, MinChange, MaxRound */
};

struct kbp_poller;
struct kbp_dev;

/* kbp_thread->state: a new thread runs, or was given up before it ran */
enum kbp_thread_state {
	KBP_THREAD_NEW,
	KBP_THREAD_RUNNING,
	KBP_THREAD_ABANDONED,
};

/*
 * What differs between modes, chosen once when a poller's mode is set
 * (kbp_mode_ops()), so the poll loop tests no mode: the model is DPDK's
 * rte_power_pmd_mgmt.c, which picks one Rx callback per power-management
 * mode when it is enabled.  The table is const; the poller reads its entry
 * through p->ops (READ_ONCE, written with the mode under kbp_lock).
 */
struct kbp_mode_ops {
	u32 mode;
	const char *name;
	/* may sleep while it serves NAPIs (else it spins: CAP_SYS_NICE) */
	bool sleeps;
	/* keeps NAPIs scheduled across its sleeps (the device's IRQ masked) */
	bool holds;
	/* NULL: freq_ctl applies; else why it does not */
	const char *no_freq_ctl;
	/*
	 * Poller thread, after a pass that left no NAPI to repoll at once:
	 * go to sleep now?  @last_work: local_clock() of the last packet.
	 */
	bool (*may_sleep)(struct kbp_poller *p, u64 now, u64 last_work);
	/* Poller thread: the sleep; @held: a NAPI is kept scheduled */
	void (*wait)(struct kbp_poller *p, bool held);
	/* Control (kbp_lock held): the merged knobs @c suit this mode? */
	int (*check)(int cpu, const struct kbp_conf *c,
		     struct netlink_ext_ack *extack);
};

const struct kbp_mode_ops *kbp_mode_ops(u32 mode);
const struct kbp_mode_ops *kbp_mode_ops_by_name(const char *name);

/*
 * What differs between the classes of pollers (enum kbp_class), chosen when
 * the poller is created (a poller never changes class), as the modes are.
 */
struct kbp_class_ops {
	u32 cls;
	const char *name;
	const char *prefix;		/* of its threads' names, for messages */
	/*
	 * Poller thread, after each poll (bh enabled again): the rt class
	 * does nothing; the non-rt class gives the CPU to a task the poll's
	 * interrupts woke (the rt poller) before it polls again.
	 */
	void (*after_poll)(struct kbp_poller *p);
	/* Control (kbp_lock held): the merged knobs @c suit this class? */
	int (*check)(int cpu, const struct kbp_conf *c,
		     struct netlink_ext_ack *extack);
};

const struct kbp_class_ops *kbp_class_ops(u32 cls);

/*
 * "CPU <n>" for a message, or "its CPUs" when they are not known yet (-1:
 * a device that is down gets its CPUs from its NAPIs' IRQs when it comes
 * up).  @buf: KBP_CPU_LABEL_LEN bytes.
 */
#define KBP_CPU_LABEL_LEN	16
static inline const char *kbp_cpu_label(int cpu, char *buf)
{
	if (cpu < 0)
		return "its CPUs";
	snprintf(buf, KBP_CPU_LABEL_LEN, "CPU %d", cpu);
	return buf;
}

/* A poller's slot in kbp_slots[] and kbp_conf[]: class-major. */
static inline unsigned int kbp_slot(int cpu, u32 cls)
{
	return cls * nr_cpu_ids + cpu;
}

static inline int kbp_slot_cpu(unsigned int slot)
{
	return slot % nr_cpu_ids;
}

static inline u32 kbp_slot_class(unsigned int slot)
{
	return slot / nr_cpu_ids;
}

#define kbp_nr_slots()	(KBP_NR_CLASSES * nr_cpu_ids)

/* poller->flags */
enum {
	KBP_POLLER_STOPPING,	/* kbp is stopping the poller: its thread exits
				 * and does not respawn; the reaper frees the
				 * poller once it has (set under @lock)
				 */
	KBP_POLLER_FAILED,	/* respawn failed: no thread, NAPIs handed back */
	KBP_POLLER_STUCK,	/* did not give a NAPI back in time (starved) */
	KBP_POLLER_TURN,	/* its thread waits for a sibling's pass
				 * (kbp_take_turns()); set and cleared by it
				 */
};

/*
 * A poller kthread (kbp_poller.c).  Every thread ends in
 * kthread_complete_and_exit(&@exited): kbp waits for that, never
 * kthread_stop()s it, so the kernel's stop of napi->thread (a NAPI deleted,
 * threaded NAPI turned off) is the only kthread_stop() a poller thread ever
 * gets, and module exit knows when no thread runs its code any more.
 */
struct kbp_thread {
	struct list_head node;		/* kbp_threads (kbp_threads_lock) */
	struct task_struct *task;	/* referenced until the record is freed */
	struct kbp_poller *poller;	/* read by the thread only once RUNNING */
	atomic_t state;			/* enum kbp_thread_state */
	struct completion started;	/* it runs: kbp_thread_spawn() may publish it */
	struct completion exited;	/* its last instruction in kbp's code */
	/*
	 * A driver deleting a NAPI without rtnl (before 6.14) may have read
	 * this task from napi->thread and kthread_stop() it at any time: its
	 * task_struct is kept until module exit (kbp_poller_add_napi()).
	 * Written under the poller's lock.
	 */
	bool pinned;
	struct rcu_head rcu;		/* other pollers read ->task under RCU */
};

struct kbp_poller {
	int cpu;
	const struct kbp_class_ops *cls;	/* never changes */
	/*
	 * The device whose NAPIs it serves; NULL once that device is detached
	 * (a poller still stopping then).  Under kbp_lock.
	 */
	struct kbp_dev *kd;
	struct list_head slot_node;	/* kbp_slots[kbp_slot(cpu, class)], RCU */
	struct rcu_head rcu;
	/*
	 * The running thread and its record.  Written by kbp_poller_create()
	 * and, under @lock, by the thread itself when it respawns (which on
	 * 7.2 may run without rtnl: sysfs "threaded" 0 and netlink "napi-set"
	 * stop it under the device's instance lock only).
	 */
	struct task_struct *task;
	struct kbp_thread *thr;
	pid_t pid;			/* for reporting; READ_ONCE */
	char name[32];			/* its threads' ("kbp/<cpu>:<dev>") */
	unsigned long flags;
	/*
	 * Threads the kernel stopped that are replacing themselves (a new
	 * thread's own respawn may start before its predecessor's ends).
	 * Under @lock: a respawn starts only while STOPPING is clear, and
	 * kbp_pollers_gc() stops the poller only while this is 0
	 * (kbp_poller_stop_idle()), in one section each.
	 */
	unsigned int respawning;

	spinlock_t lock;		/* writers of @napis */
	struct list_head napis;		/* struct kbp_napi, RCU */

	/* knobs: written under kbp_lock, read locklessly by the thread */
	u32 mode;
	const struct kbp_mode_ops *ops;	/* of @mode */
	u32 linger_us;
	u32 quota;
	u32 rt_prio;
	s32 nice;
	u32 freq_ctl;
	u32 interval_us;
	u32 netap;
	u32 round_ms;
	/*
	 * periodic search parameters and objective: written under kbp_lock
	 * and @netap_lock, which the thread takes to (re)start the search
	 * with them
	 */
	struct kbp_netap_params np;
	u32 objective;			/* enum kbp_objective */
	bool search_restart;		/* set under @netap_lock: (re)start it */

	/*
	 * The search state (kbp_netap.c): the thread runs it; @netap_lock
	 * makes a reader's copy consistent (kbp_poller_read_netap()).  Taken
	 * by the thread once per round and by replies, never with another
	 * lock held inside it.
	 */
	spinlock_t netap_lock;
	struct kbp_netap search;
	bool search_on;			/* @search runs: periodic with netap */
	u64 search_rounds;		/* rounds since the search was started */
	u32 search_objective;		/* @objective the search runs with */
	u64 search_last;		/* the objective's value in the last round */
	u64 search_last_bytes;		/* bytes of the last round */
	u64 search_last_cpu_ns;		/* thread CPU time in the last round */
	/* periodic, written only by the thread */
	u32 cur_interval_us;		/* of the next timed sleep */
	u64 round_start;		/* local_clock() when the round began */
	u64 round_cpu_ns;		/* kbp_thread_cpu_ns() then */
	unsigned int round_gen;		/* rounds counted (kbp_round_bytes()) */

	unsigned int pass;		/* the thread's pass number (kbp_pass()) */

	/* counters written only by the thread */
	struct u64_stats_sync syncp;
	u64_stats_t passes;
	u64_stats_t empty_passes;
	u64_stats_t packets;
	u64_stats_t wakeups;
	u64_stats_t sleeps;
	u64_stats_t sleep_ns;
	u64_stats_t poll_ns;
	u64_stats_t freq_changes;
	u64_stats_t yields;
	u64_stats_t handbacks;
	u64_stats_t gave_way;		/* non-rt: polls it gave way after */
	u64_stats_t wake_delay_ns;	/* woken to running, summed */
	u64 wake_delay_max_ns;		/* and the longest (same syncp) */
	/* rare events, written from several contexts */
	atomic64_t respawns;
	atomic64_t repairs;
	atomic64_t takeovers;	/* NAPIs asked out of a softnet poll list */
};

/* kbp_napi->flags */
enum {
	KBP_NAPI_DETACHING,	/* being handed back to stock NAPI */
	KBP_NAPI_DEAD,		/* its napi_struct was deleted; never touch ->napi
				 * nor ->poller (the poller may be gone too).
				 * Set under poller->lock with the unlinking
				 */
	KBP_NAPI_POLLING,	/* claimed for a poll: by the poller around each
				 * poll, for good by a detach that takes the NAPI
				 * back from a poller that cannot run
				 */
	KBP_NAPI_ORPHAN,	/* DEAD because a respawn found THREADED clear
				 * (kbp_napi_orphan()): the reconcile work
				 * hooks the NAPI again, as a repair
				 */
	KBP_NAPI_FOREIGN,	/* at detach napi->thread was not the poller's
				 * (7.2: the kernel stopped it, maybe gave the
				 * NAPI its own kthread): nothing to hand back
				 */
};

struct kbp_napi {
	struct list_head poll_node;	/* poller->napis */
	struct list_head dev_node;	/* kdev->napis */
	struct napi_struct *napi;
	struct kbp_poller *poller;
	struct kbp_dev *kdev;
	unsigned int index;
	unsigned int napi_id;
	unsigned long flags;
	struct kbp_napi_cfg cfg;	/* 7.2: the NAPI's persistent config */
	/*
	 * One reference for the device's list (dropped by kbp_napi_free()),
	 * one by the poller for each poll (kbp_pass()): the poller polls
	 * outside any RCU read-side section, so a link unlinked meanwhile must
	 * outlive the poll.  The last reference frees it after a grace period.
	 */
	refcount_t ref;
	/* written only by the poller thread */
	unsigned int pass;		/* the last pass that looked at it */
	bool held;			/* periodic: kept scheduled by the last poll */
	unsigned int idle;		/* periodic: empty polls in a row */
	/*
	 * periodic search: the device's rx_bytes when the last round ended
	 * (valid once @round_gen is not 0), kept by every link of the device
	 * on the poller; kbp_round_bytes()
	 */
	unsigned int round_gen;
	u64 round_rx_bytes;
	struct u64_stats_sync syncp;
	u64_stats_t packets;
	u64_stats_t polls;
	struct rcu_head rcu;
};

/* Knobs given by a request; only the ones it has change anything. */
struct kbp_knobs {
	bool has_mode, has_linger, has_quota, has_rt_prio, has_freq_ctl, has_nice;
	bool has_interval, has_netap, has_round_ms, has_min_interval;
	bool has_max_interval, has_min_change, has_max_round, has_objective;
	struct kbp_conf conf;
};

struct kbp_map_entry {
	u32 index;
	u32 cpu;
};

struct kbp_dev {
	struct list_head node;		/* kbp_devs */
	struct net_device *dev;
	netdevice_tracker tracker;
	u32 cls;			/* enum kbp_class of its pollers */
	int cpu;			/* default CPU; -1: the NAPI's IRQ's */
	unsigned int nr_map;
	struct kbp_map_entry *map;
	struct kbp_knobs knobs;		/* for the pollers it starts */
	struct list_head napis;		/* struct kbp_napi while active */
	bool active;
	bool retry;			/* standby because a CPU it uses is
					 * offline: the reconcile work attaches
					 * it again once it is back
					 */
	bool up_pending;		/* instance-lock ops (7.x): seen down,
					 * the reconcile work attaches it when
					 * it is up (kbp_dev_follow_ops_locked())
					 */
	/* orphaned links freed, not yet hooked again (kbp_dev_reconcile()) */
	unsigned int orphaned;
	/*
	 * What the caller of the attach may take (docs/design.md,
	 * "Privileges"), for the CPUs its NAPIs are given later too (at
	 * NETDEV_UP, by IRQ affinity, new NAPIs): @may_take_cpu, the caller
	 * had CAP_SYS_NICE; @cpus, the CPUs it may run on (its cpuset), or
	 * NULL for any (a host administrator).
	 */
	bool may_take_cpu;
	struct cpumask *cpus;
	/* counters of this device's NAPIs that are gone */
	u64 packets_gone;
	u64 polls_gone;
};

/* An attach request's caller, as kbp_genl.c found it. */
struct kbp_caller {
	bool may_take_cpu;		/* CAP_SYS_NICE */
	const struct cpumask *cpus;	/* NULL: any CPU */
};

/* An attach request, validated by kbp_genl.c. */
struct kbp_attach_req {
	struct net_device *dev;
	u32 cls;			/* enum kbp_class */
	int cpu;			/* -1: not given */
	unsigned int nr_map;
	struct kbp_map_entry *map;	/* owned by the request until bound */
	struct kbp_knobs knobs;
	struct kbp_caller caller;
};

extern struct mutex kbp_lock;
extern struct list_head kbp_devs;
extern struct list_head *kbp_slots;	/* [kbp_nr_slots()]: struct kbp_poller */
extern struct kbp_conf *kbp_conf;

/* kbp_main.c */
int kbp_dev_bind(struct kbp_attach_req *req, struct netlink_ext_ack *extack);
int kbp_dev_unbind_by_dev(struct net_device *dev, struct netlink_ext_ack *extack);
struct kbp_dev *kbp_dev_find(const struct net_device *dev);
int kbp_poller_configure(int cpu, u32 cls, const struct kbp_knobs *knobs,
			 struct netlink_ext_ack *extack);
int kbp_check_cpu(int cpu, struct netlink_ext_ack *extack);
int kbp_check_knobs(const struct kbp_knobs *knobs,
		    struct netlink_ext_ack *extack);
void kbp_reconcile_soon(void);

/* kbp_poller.c */
struct kbp_poller *kbp_poller_create(int cpu, u32 cls, struct kbp_dev *kd,
				     const struct kbp_conf *conf);
bool kbp_poller_stop_idle(struct kbp_poller *p);
bool kbp_poller_exited(struct kbp_poller *p);
void kbp_threads_reap(bool all);
void kbp_threads_wait_all(void);
void kbp_poller_apply(struct kbp_poller *p, const struct kbp_conf *conf);
void kbp_poller_conf(struct kbp_poller *p, struct kbp_conf *conf);
bool kbp_poller_add_napi(struct kbp_poller *p, struct kbp_napi *kn);
bool kbp_poller_idle(struct kbp_poller *p);
bool kbp_poller_unhook_napi(struct kbp_napi *kn);
void kbp_poller_del_napi(struct kbp_napi *kn);
void kbp_poller_drop_napi(struct kbp_napi *kn);
void kbp_poller_wait_released(struct kbp_napi *kn, unsigned long deadline);

/* the bound of a detach's wait for its pollers, per device (jiffies) */
#define KBP_RELEASE_WAIT	(5 * HZ)

/* what kbp_poller_check_napi() found (and did) */
enum kbp_napi_check {
	KBP_NAPI_OK,		/* hooked as it should be */
	KBP_NAPI_REPAIRED,	/* THREADED set again */
	KBP_NAPI_REHOOKED,	/* napi->thread was NULL: hooked again */
	KBP_NAPI_LOST,		/* napi->thread is someone else's kthread */
};

enum kbp_napi_check kbp_poller_check_napi(struct kbp_napi *kn);

struct kbp_poller_snapshot {
	u64 passes, empty_passes, packets, wakeups, sleeps, sleep_ns, poll_ns;
	u64 freq_changes, yields, respawns, repairs, handbacks;
	u64 gave_way, wake_delay_ns, wake_delay_max_ns, takeovers;
};

/* what a reply shows of a periodic poller's search */
struct kbp_netap_snapshot {
	bool on;
	struct kbp_netap s;
	u64 rounds;
	u32 objective;
	u64 last;		/* the objective's value in the last round */
	u64 last_bytes;
	u64 last_cpu_ns;
};

void kbp_poller_read(struct kbp_poller *p, struct kbp_poller_snapshot *s);
void kbp_poller_read_netap(struct kbp_poller *p, struct kbp_netap_snapshot *s);
void kbp_napi_put(struct kbp_napi *kn);
void kbp_napi_read(struct kbp_napi *kn, u64 *packets, u64 *polls);

/*
 * kbp_freq.c: EE-KBP's frequency control, per CPU.  A poller thread's own
 * part: whether it counts as awake on its CPU.
 */
struct kbp_freq {
	bool asleep;		/* went to sleep (kbp_freq_sleep()), not back yet */
};

int kbp_freq_init(void);
void kbp_freq_exit(void);
void kbp_freq_set_ctl(int cpu, bool on);
void kbp_freq_poller_add(int cpu);
void kbp_freq_poller_del(int cpu);
void kbp_freq_thread_start(struct kbp_poller *p, struct kbp_freq *f);
void kbp_freq_sleep(struct kbp_poller *p, struct kbp_freq *f);
void kbp_freq_pass(struct kbp_poller *p, struct kbp_freq *f);
void kbp_freq_thread_exit(struct kbp_poller *p, struct kbp_freq *f);
int kbp_freq_check(int cpu, const struct kbp_conf *c,
		   struct netlink_ext_ack *extack);

/* kbp_genl.c */
int kbp_genl_init(void);
void kbp_genl_exit(void);

#endif /* _KBP_PRIV_H */
