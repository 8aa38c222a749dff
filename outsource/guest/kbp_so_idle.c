// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so idle path (docs/design.md, 11.11): a cpuidle driver whose state
 * polls the completion rings, then announces in need_irq and halts; the
 * tick-aligned sweep; the idle_poll_us parameter that turns it on.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

DEFINE_PER_CPU(struct kbp_so_cpu, kbp_so_cpu);

/*
 * The idle path (docs/design.md, 11.11): a cpuidle driver of one state,
 * registered while idle_poll_us > 0 and a device is attached.  An idle
 * vCPU polls every queue's completions for idle_poll_us, waking their
 * waiters; then it announces in its queue's need_irq that it halts, a full
 * barrier, looks once more (the host: cq_tail, full barrier, need_irq),
 * and halts.  The host interrupts only a queue whose vCPU announced.
 * Sleeping waiters then set no need_irq of their own: a busy vCPU finds
 * their completions at its next outsourced system call or in the
 * tick-aligned sweep (two ticks at most).
 */
unsigned int kbp_so_idle_poll_us;
/*
 * kbp_so_idle_mutex: the transitions of the idle path (idle_poll_us's
 * writes, probe's end, removal's start), kbp_so_idle_attached and
 * kbp_so_idle_state.  Taken in process context only; inside it
 * cpuidle_register()/cpuidle_unregister() take the cpuidle core's locks.
 */
DEFINE_MUTEX(kbp_so_idle_mutex);
static struct kbp_so_dev *kbp_so_idle_attached;
char kbp_so_idle_state[48] = "off";
/* the device the idle path and the sweeps serve: RCU, NULL when off */
static struct kbp_so_dev __rcu *kbp_so_idle_dev;

#ifndef KBP_SO_HAVE_CT_CPUIDLE
/* 6.1: what 6.3's ct_cpuidle_enter()/exit() wrap */
static __always_inline void ct_cpuidle_enter(void)
{
	trace_hardirqs_on_prepare();
	lockdep_hardirqs_on_prepare();
	ct_idle_enter();
	lockdep_hardirqs_on(_THIS_IP_);
}

static __always_inline void ct_cpuidle_exit(void)
{
	lockdep_hardirqs_off(_THIS_IP_);
	ct_idle_exit();
}
#endif

/* Any request that nobody polls for, in any queue (a racy hint). */
static bool kbp_so_waiting(struct kbp_so_dev *dev)
{
	u32 i;

	for (i = 0; i < dev->nr_used; i++)
		/* data_race: a hint; a late re-arm costs one sweep, a missed one the next call */
		if (data_race(READ_ONCE(dev->q[i].irq_wanted)))
			return true;
	return false;
}

/*
 * New completions that nobody is reaping yet: a queue whose interrupt
 * thread the idle path already woke (PREEMPT_RT) will be reaped by it.
 */
static bool kbp_so_pending(struct kbp_so_dev *dev)
{
	u32 i;

	for (i = 0; i < dev->nr_used; i++)
		if (kbp_so_has_new(&dev->q[i]) && !test_bit(0, &dev->q[i].idle_kick))
			return true;
	return false;
}

/*
 * The idle path's reap.  Without PREEMPT_RT the idle task reaps itself:
 * RCU watches here (CPUIDLE_FLAG_RCU_IDLE) and the queue's lock spins.
 * On PREEMPT_RT that lock sleeps, which the idle task must not: it wakes
 * the queue's interrupt thread instead, which reaps as "idle".
 */
static void kbp_so_idle_sweep(struct kbp_so_dev *dev)
{
	u32 i;

	if (!IS_ENABLED(CONFIG_PREEMPT_RT)) {
		kbp_so_sweep(dev, KBP_SO_BY_IDLE);
		return;
	}
	for (i = 0; i < dev->nr_used; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		if (kbp_so_has_new(q) && !test_and_set_bit(0, &q->idle_kick))
			irq_wake_thread(q->irq, q);
	}
}

static enum hrtimer_restart kbp_so_sweep_fn(struct hrtimer *t)
{
	struct kbp_so_dev *dev;
	bool again = false;

	rcu_read_lock();
	dev = rcu_dereference(kbp_so_idle_dev);
	if (dev) {
		kbp_so_sweep(dev, KBP_SO_BY_TICK);
		again = kbp_so_waiting(dev);
	}
	rcu_read_unlock();
	if (!again)
		return HRTIMER_NORESTART;
	hrtimer_forward_now(t, ns_to_ktime(TICK_NSEC));
	return HRTIMER_RESTART;
}

/*
 * Halts until an interrupt, RCU stopped around the halt only (as
 * default_idle_call() does).  Interrupts off before and after.
 */
static __always_inline void kbp_so_halt(void)
{
	ct_cpuidle_enter();
	raw_safe_halt();
	raw_local_irq_disable();
	ct_cpuidle_exit();
}

/*
 * The state's enter: called with interrupts off and, for a state flagged
 * CPUIDLE_FLAG_RCU_IDLE, with RCU watching; it stops RCU itself around
 * the halt only, as default_idle_call() does.  Returns with interrupts off.
 */
static int __cpuidle kbp_so_idle_enter(struct cpuidle_device *cdev,
				       struct cpuidle_driver *drv, int index)
{
	struct kbp_so_cpu *c = this_cpu_ptr(&kbp_so_cpu);
	struct kbp_so_queue *q;
	struct kbp_so_dev *dev;
	bool parked;
	u64 start;

	instrumentation_begin();
	WRITE_ONCE(c->in_idle, true);
	dev = rcu_dereference_sched(kbp_so_idle_dev);
	if (!dev) {
		/* stopping: halt as the kernel's default idle would */
		if (current_clr_polling_and_test())
			goto out;
		goto halt;
	}
	q = &dev->q[cdev->cpu % dev->nr_used];
	start = local_clock();
	local_irq_enable();
	/* polling: a wake-up of this CPU sets need_resched, no IPI */
	if (!current_set_polling_and_test()) {
		u64 limit = (u64)READ_ONCE(kbp_so_idle_poll_us) * NSEC_PER_USEC;

		while (!need_resched()) {
			kbp_so_idle_sweep(dev);
			if (local_clock() - start >= limit)
				break;
			cpu_relax();
		}
	}
	local_irq_disable();
	c->poll_ns += local_clock() - start;
	if (current_clr_polling_and_test())
		goto out;
	/* announce, full barrier, look again: pairs with cq_tail, barrier, need_irq */
	atomic_add(KBP_SO_NEED_HALTED, kbp_so_need(q));
	/* need_irq before cq_tail, as the host orders cq_tail before need_irq */
	smp_mb__after_atomic();
	if (kbp_so_pending(dev)) {
		atomic_sub(KBP_SO_NEED_HALTED, kbp_so_need(q));
		c->races++;
		local_irq_enable();
		kbp_so_idle_sweep(dev);
		local_irq_disable();
		goto out;
	}
	c->halts++;
	/* a halted CPU needs no tick-aligned sweep: the host interrupts it */
	parked = hrtimer_try_to_cancel(&c->sweep) == 1;
	kbp_so_halt();
	atomic_sub(KBP_SO_NEED_HALTED, kbp_so_need(q));
	if (parked && kbp_so_waiting(dev))
		kbp_so_sweep_arm();
	goto out;
halt:
	kbp_so_halt();
out:
	/* release: kbp_so_idle_stop() may free what this used once it reads false */
	smp_store_release(&c->in_idle, false);
	instrumentation_end();
	return index;
}

/*
 * No .owner: cpuidle would hold a reference on this module per registered
 * CPU, so rmmod would need idle_poll_us=0 first.  It is not needed: the
 * driver goes, and every CPU is waited out of kbp_so_idle_enter(), in
 * kbp_so_remove() (kbp_so_idle_detach()), before the module can.
 */
static struct cpuidle_driver kbp_so_idle_driver = {
	.name = "kbp_so",
	.states = {
		{
			.enter			= kbp_so_idle_enter,
			.exit_latency		= 1,
			.target_residency	= 1,
			.power_usage		= -1,
			.flags			= CPUIDLE_FLAG_RCU_IDLE,
			.name			= "KBP_SO",
			.desc			= "poll kbp_so rings, then halt",
		},
	},
	.state_count = 1,
	.safe_state_index = 0,
};

/*
 * Turns sleeping waiters' own need_irq off (@on) or back on, under every
 * queue's lock, then (off) a full barrier and one sweep: a completion
 * posted while neither its waiter's bit nor a halted vCPU asked for an
 * interrupt is found here, so nobody is left asleep.
 */
static void kbp_so_idle_mode(struct kbp_so_dev *dev, bool on)
{
	unsigned long flags;
	u32 i;

	for (i = 0; i < dev->nr_used; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		spin_lock_irqsave(&q->lock, flags);
		dev->idle = on;
		if (on && q->irq_wanted)
			kbp_so_sweep_arm();
		if (on)
			atomic_andnot(KBP_SO_NEED_WAITER, kbp_so_need(q));
		else if (q->irq_wanted)
			atomic_or(KBP_SO_NEED_WAITER, kbp_so_need(q));
		spin_unlock_irqrestore(&q->lock, flags);
	}
	if (on)
		return;
	/* the waiters' bits before cq_tail: pairs with the host's cq_tail, barrier, need_irq */
	smp_mb();
	kbp_so_sweep(dev, KBP_SO_BY_SYSCALL);
}

static void kbp_so_idle_unavailable(const char *why)
{
	snprintf(kbp_so_idle_state, sizeof(kbp_so_idle_state), "unavailable:%s", why);
}

/* kbp_so_idle_mutex held.  Refuses with the reason in /proc/kbp_so. */
static int kbp_so_idle_start(struct kbp_so_dev *dev)
{
	struct cpuidle_driver *cur;
	int err;

	if (!dev->irq_on_demand) {
		kbp_so_idle_unavailable("host-without-need_irq");
		return -EOPNOTSUPP;
	}
	/* idle=poll/halt/nomwait: the kernel's idle loop never asks cpuidle */
	if (boot_option_idle_override != IDLE_NO_OVERRIDE) {
		kbp_so_idle_unavailable("idle=-boot-option");
		return -EBUSY;
	}
	cur = cpuidle_get_driver();
	if (cur) {
		kbp_so_idle_unavailable(cur->name);
		return -EBUSY;
	}
	rcu_assign_pointer(kbp_so_idle_dev, dev);
	err = cpuidle_register(&kbp_so_idle_driver, NULL);
	if (err) {
		RCU_INIT_POINTER(kbp_so_idle_dev, NULL);
		synchronize_rcu();
		/* cpuidle.off=1 (or no cpuidle): -ENODEV; another driver: -EBUSY */
		kbp_so_idle_unavailable(err == -ENODEV ? "cpuidle.off" : "cpuidle-busy");
		return err;
	}
	kbp_so_idle_mode(dev, true);
	strscpy(kbp_so_idle_state, "on", sizeof(kbp_so_idle_state));
	return 0;
}

static bool kbp_so_idle_busy(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		/* acquire: pairs with kbp_so_idle_enter()'s release of in_idle */
		if (smp_load_acquire(&per_cpu(kbp_so_cpu, cpu).in_idle))
			return true;
	return false;
}

/*
 * kbp_so_idle_mutex held.  Sleeping waiters get their own need_irq back
 * first, then no CPU enters, none is left inside (a halted one is woken),
 * and no sweep is left queued: the device may go after this.
 */
static void kbp_so_idle_stop(struct kbp_so_dev *dev)
{
	int cpu;

	kbp_so_idle_mode(dev, false);
	RCU_INIT_POINTER(kbp_so_idle_dev, NULL);
	cpuidle_unregister(&kbp_so_idle_driver);
	synchronize_rcu();
	while (kbp_so_idle_busy()) {
		wake_up_all_idle_cpus();
		usleep_range(100, 200);
	}
	/*
	 * A CPU that just cleared in_idle still runs the last instructions of
	 * kbp_so_idle_enter(), with interrupts off and RCU watching: one more
	 * grace period and it has returned to the cpuidle core.
	 */
	synchronize_rcu();
	for_each_possible_cpu(cpu)
		hrtimer_cancel(&per_cpu(kbp_so_cpu, cpu).sweep);
	strscpy(kbp_so_idle_state, "off", sizeof(kbp_so_idle_state));
}

static bool kbp_so_idle_on(void)
{
	return rcu_access_pointer(kbp_so_idle_dev);
}

static int kbp_so_idle_set(const char *val, const struct kernel_param *kp)
{
	unsigned int us, old;
	int err = kstrtouint(val, 0, &us);

	if (err)
		return err;
	if (us > KBP_SO_IDLE_POLL_US_MAX)
		return -EINVAL;
	mutex_lock(&kbp_so_idle_mutex);
	old = kbp_so_idle_poll_us;
	WRITE_ONCE(kbp_so_idle_poll_us, us);
	if (kbp_so_idle_attached && us && !kbp_so_idle_on())
		err = kbp_so_idle_start(kbp_so_idle_attached);
	else if (kbp_so_idle_attached && !us && kbp_so_idle_on())
		kbp_so_idle_stop(kbp_so_idle_attached);
	if (err)
		WRITE_ONCE(kbp_so_idle_poll_us, old);
	mutex_unlock(&kbp_so_idle_mutex);
	return err;
}

static const struct kernel_param_ops kbp_so_idle_ops = {
	.set	= kbp_so_idle_set,
	.get	= param_get_uint,
};
module_param_cb(idle_poll_us, &kbp_so_idle_ops, &kbp_so_idle_poll_us, 0644);
MODULE_PARM_DESC(idle_poll_us, "idle vCPUs poll completions this long, then announce and halt (0: off, ..2000)");

/* The end of a successful probe: the idle path, if asked for, starts. */
void kbp_so_idle_attach(struct kbp_so_dev *dev)
{
	mutex_lock(&kbp_so_idle_mutex);
	kbp_so_idle_attached = dev;
	if (kbp_so_idle_poll_us && kbp_so_idle_start(dev))
		pci_warn(dev->pdev, "idle path not started: %s\n", kbp_so_idle_state);
	mutex_unlock(&kbp_so_idle_mutex);
}

/* The start of removal: the idle path stops before the device goes. */
void kbp_so_idle_detach(struct kbp_so_dev *dev)
{
	mutex_lock(&kbp_so_idle_mutex);
	if (kbp_so_idle_on())
		kbp_so_idle_stop(dev);
	kbp_so_idle_attached = NULL;
	strscpy(kbp_so_idle_state, "off", sizeof(kbp_so_idle_state));
	mutex_unlock(&kbp_so_idle_mutex);
}

void kbp_so_idle_init(void)
{
	int cpu;

	for_each_possible_cpu(cpu) {
		struct hrtimer *t = &per_cpu(kbp_so_cpu, cpu).sweep;

#ifdef KBP_SO_HAVE_HRTIMER_SETUP
		hrtimer_setup(t, kbp_so_sweep_fn, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED_SOFT);
#else
		hrtimer_init(t, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED_SOFT);
		t->function = kbp_so_sweep_fn;
#endif
	}
}
